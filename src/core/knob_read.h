// Reading braid's knobs inside the library (Note [Knobs] in knobs.cpp): typed, validated, read once.
#pragma once

#include <cstdint>
#include <string>

namespace braid::detail {

/// The knob's environment value, or nullptr when unset or empty. Read once per process.
const std::string* knob_env(const char* name);
/// A flag: 0/false/off/no or 1/true/on/yes; its default when unset; anything else is a ValueError
/// naming the knob and its value.
bool knob_flag(const char* name);
/// A positive integer (BRAID_NUM_THREADS); 0 when unset.
int64_t knob_count(const char* name);
/// A positive number (seconds, a threshold); its default when unset.
double knob_number(const char* name);
/// A size in bytes, with an optional K, M or G suffix (powers of 1024); 0 when unset.
int64_t knob_bytes(const char* name);
/// Text or a path, as knob_value gives it.
std::string knob_text(const char* name);

}  // namespace braid::detail
