// Internal-error reporting: a failed BRAID_ASSERT is a bug in braid, raised as braid::Error with
// its location so that it reaches the user (and Python) instead of aborting the process.
#include "braid/error.h"

namespace braid::detail {

void internal_error(const char* file, int line, const std::string& what) {
  throw Error(cat("braid internal error at ", file, ":", line, ": ", what,
                  " (this is a bug in braid; please report it)"));
}

}  // namespace braid::detail
