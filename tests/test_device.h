// The device a test run puts its tensors on: BRAID_TEST_DEVICE ("cpu" when unset, "shadow" in the
// suite's second pass, "cuda" on a GPU machine). Linked into every test program, it makes that device
// the default of creation functions before any test runs, so the same tests check each device.
#pragma once

#include <cstdlib>
#include <string>

#include "braid/device.h"

namespace braid::test {

/// The device under test.
inline Device test_device() {
  static const Device d = [] {
    const char* s = std::getenv("BRAID_TEST_DEVICE");
    Device dev = s && *s ? Device::parse(s) : Device::cpu();
    set_default_device(dev);
    return dev;
  }();
  return d;
}

/// Whether ops on device d run the CPU backend's optional (fused) kernels, whose layouts some tests
/// check: on the CPU, and on the shadow device unless it offers the CUDA backend's set instead
/// (BRAID_SHADOW_CAPS=cuda, Note [The shadow device's capability set]).
inline bool runs_cpu_fused_kernels(const Device& d) {
  if (d.is_cpu()) return true;
  if (d.type != DeviceType::Shadow) return false;
  const char* caps = std::getenv("BRAID_SHADOW_CAPS");
  return !(caps && std::string(caps) == "cuda");
}

/// Whether autocast keeps activations in half precision on device d (Note [Autocast] in
/// src/ops/autocast.cpp), as PyTorch's CUDA autocast does: a GPU, and the shadow device offering the
/// CUDA backend's capabilities (BRAID_SHADOW_CAPS=cuda); the CPU's products return float32.
inline bool autocast_keeps_half(const Device& d) {
  if (d.type == DeviceType::CUDA) return true;
  const char* caps = std::getenv("BRAID_SHADOW_CAPS");
  return d.type == DeviceType::Shadow && caps && std::string(caps) == "cuda";
}

/// Whether convolutions on device d run the CPU backend's kernels (oneDNN's, which prefer
/// channels-last): on the CPU, and on the shadow device in either capability set, since the CUDA
/// backend has convolution entries too (cuDNN's) and the shadow device forwards them to the CPU's.
inline bool runs_cpu_conv_kernels(const Device& d) { return d.is_cpu() || d.type == DeviceType::Shadow; }

}  // namespace braid::test
