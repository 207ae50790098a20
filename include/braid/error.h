// Typed exceptions for braid. Every user-facing failure throws one of these; library code never
// calls exit or abort. The subclasses map onto Python's exception types in the bindings.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>

namespace braid {

/// Base of every error braid throws.
class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what) : std::runtime_error(what) {}
};

/// A bad argument value or shape (Python: ValueError).
class ValueError : public Error {
 public:
  using Error::Error;
};

/// An axis or element index out of range (Python: IndexError).
class IndexError : public Error {
 public:
  using Error::Error;
};

/// A dtype or device the operation does not accept (Python: TypeError).
class TypeError : public Error {
 public:
  using Error::Error;
};

/// A feature braid does not provide in this build or for this input (Python: NotImplementedError).
class NotImplementedError : public Error {
 public:
  using Error::Error;
};

/// A failure of the distributed runtime: a collective, a peer rank, the launcher (Python: RuntimeError).
class DistributedError : public Error {
 public:
  using Error::Error;
};

namespace detail {

inline void append_all(std::ostringstream&) {}
template <typename T, typename... Rest>
void append_all(std::ostringstream& os, const T& first, const Rest&... rest) {
  os << first;
  append_all(os, rest...);
}

/// Concatenates the streamable arguments into one message.
template <typename... Args>
std::string cat(const Args&... args) {
  std::ostringstream os;
  append_all(os, args...);
  return os.str();
}

[[noreturn]] void internal_error(const char* file, int line, const std::string& what);

}  // namespace detail
}  // namespace braid

/// User-facing check: throws ErrorType with the concatenated message when cond is false.
#define BRAID_CHECK_T(ErrorType, cond, ...)                  \
  do {                                                       \
    if (!(cond)) throw ErrorType(::braid::detail::cat(__VA_ARGS__)); \
  } while (0)

/// User-facing value check (ValueError).
#define BRAID_CHECK(cond, ...) BRAID_CHECK_T(::braid::ValueError, cond, __VA_ARGS__)

/// Internal invariant: a failure is a bug in braid, reported as Error with file and line.
#define BRAID_ASSERT(cond, ...)                                                          \
  do {                                                                                   \
    if (!(cond))                                                                         \
      ::braid::detail::internal_error(__FILE__, __LINE__,                                \
                                      ::braid::detail::cat("assertion '" #cond "' failed: ", \
                                                           ##__VA_ARGS__));              \
  } while (0)
