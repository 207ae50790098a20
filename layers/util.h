// Helpers the layer files share: PyTorch-style printing of size tuples for describe(), and the
// argument checks whose messages name the layer.
#pragma once

#include <cstdint>
#include <sstream>
#include <string>
#include <vector>

#include "braid/error.h"

namespace braid::detail {

/// "(3, 3)", or "(3,)" for one value, as Python prints a tuple.
inline std::string tuple(const std::vector<int64_t>& v) {
  std::ostringstream os;
  os << "(";
  for (size_t i = 0; i < v.size(); ++i) os << (i ? ", " : "") << v[i];
  os << (v.size() == 1 ? ",)" : ")");
  return os.str();
}

inline void check_at_least(const std::string& layer, const char* arg, const std::vector<int64_t>& v, int64_t low) {
  for (int64_t x : v) BRAID_CHECK(x >= low, layer, ": ", arg, " must be >= ", low, ", got ", tuple(v));
}

inline const char* py_bool(bool b) { return b ? "True" : "False"; }

}  // namespace braid::detail
