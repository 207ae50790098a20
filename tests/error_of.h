// error_of: the message of the exception a statement throws, for tests that check what an error
// says. Shared by the test files that assert on messages.
#pragma once

#include <gtest/gtest.h>

#include <string>

#include "braid/error.h"

namespace braid {

/// The message of the E that f throws (a test failure if it throws nothing).
template <typename E = Error, typename F>
std::string error_of(F f) {
  try {
    f();
  } catch (const E& e) {
    return e.what();
  }
  ADD_FAILURE() << "expected an exception";
  return "";
}

}  // namespace braid
