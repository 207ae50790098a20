// libFuzzer target for the ONNX loader: any bytes must load or throw braid::Error, never crash,
// hang or allocate without bound. scripts/fuzz_onnx.sh builds it with clang (the loader itself
// instrumented) and runs it; the test suite runs a short, fixed number of executions.
#include <cstddef>
#include <cstdint>

#include "braid/error.h"
#include "braid/onnx/model.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  braid::onnx::LoadOptions o;
  o.max_tensor_bytes = int64_t{64} << 20;  // keep each run's allocations small
  try {
    braid::onnx::parse_model(data, size, "fuzz-input", "", o);
  } catch (const braid::Error&) {
  }
  return 0;
}
