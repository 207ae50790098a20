// Sets the device under test (tests/test_device.h) before main runs, for every test program.
#include "test_device.h"

namespace {
const braid::Device kUnderTest = braid::test::test_device();
}  // namespace
