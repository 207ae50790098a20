// Knobs: every environment variable braid reads, declared once (Note [Knobs] in src/core/knobs.cpp).
#pragma once

#include <iosfwd>
#include <string>
#include <vector>

namespace braid {

/// One environment variable braid reads: its name, the kind of value it takes, the value in effect
/// when it is unset, and one line of meaning. for_tests marks the hooks the test suite sets, which
/// no user needs.
struct Knob {
  const char* name;
  const char* type;           // "flag" (0 or 1), "integer", "seconds", "number", "path" or "text"
  const char* default_value;  // as the table prints it
  const char* meaning;
  bool for_tests;
};

/// Every knob, in the order of the README's table.
const std::vector<Knob>& knobs();

/// The value in effect: the environment's when set and not empty, else the default (a path with
/// its ~ expanded). Each variable is read once, at its first use in the process. Throws ValueError
/// for a name that is not a knob.
std::string knob_value(const std::string& name);

/// Every knob with its value in effect and whether the environment set it, one per line.
std::string config_string();
void print_config(std::ostream& out);
void print_config();  // to standard output
/// The README's table of knobs (Markdown), which tests/tools checks against README.md.
std::string knob_table_markdown();

}  // namespace braid
