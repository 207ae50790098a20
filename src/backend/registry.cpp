// The one dispatch point from a tensor's device to the backend that implements its primitives, and
// the defaults of the optional ones.
#include <dlfcn.h>

#include <string>

#include "backend/backend.h"
#include "backend/cudnn_settings.h"
#include "backend/cpu/cpu_backend.h"
#include "backend/shadow/shadow_backend.h"
#include "braid/config.h"
#include "braid/device.h"
#include "core/knob_read.h"

namespace braid {

namespace {

// The CUDA backend, from libbraid_cuda.so beside this library (Note [The CUDA backend as a module]
// in meson.build), opened on first use; nullptr, with the loader's reason in cuda_missing, when it
// cannot be. A process whose libbraid.so has the backend linked in (the host emulation of
// tools/cuda_emu) uses that one.
std::string cuda_missing;

detail::Backend* cuda_module() {
#ifdef BRAID_HAVE_CUDA
  static detail::Backend* backend = []() -> detail::Backend* {
    using Entry = detail::Backend* (*)();
    if (auto linked = reinterpret_cast<Entry>(dlsym(RTLD_DEFAULT, "braid_cuda_backend"))) return linked();
    std::string path = "libbraid_cuda.so";
    Dl_info self{};
    if (dladdr(reinterpret_cast<void*>(&cuda_module), &self) && self.dli_fname) {
      const std::string lib = self.dli_fname;
      const size_t slash = lib.rfind('/');
      if (slash != std::string::npos) path = lib.substr(0, slash + 1) + path;
    }
    void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (!handle) handle = dlopen("libbraid_cuda.so", RTLD_NOW | RTLD_LOCAL);  // the loader's search path
    if (!handle) {
      const char* why = dlerror();
      cuda_missing = why ? why : "dlopen failed";
      return nullptr;
    }
    auto entry = reinterpret_cast<Entry>(dlsym(handle, "braid_cuda_backend"));
    if (!entry) {
      cuda_missing = path + " has no braid_cuda_backend";
      return nullptr;
    }
    return entry();
  }();
  return backend;
#else
  return nullptr;
#endif
}

detail::Backend* find_backend(DeviceType type) {
  switch (type) {
    case DeviceType::CPU: return &detail::cpu_backend();
    case DeviceType::Shadow: return &detail::shadow_backend();
    case DeviceType::CUDA: return cuda_module();
  }
  return nullptr;
}
}  // namespace

int device_count(DeviceType type) {
  detail::Backend* b = find_backend(type);
  return b ? b->device_count() : 0;
}

bool device_available(Device device) { return device.index >= 0 && device.index < device_count(device.type); }

namespace detail {

// The default table of fused kernels has none: every op runs its composite (Note [Fused kernels]).
FusedKernels& Backend::fused() {
  static FusedKernels none;
  return none;
}
bool FusedKernels::conv2d(const Tensor&, const Tensor&, const Tensor&, const Window2d&, int64_t, const Epilogue&,
                     const Tensor&) {
  return false;
}
void* Backend::allocate_pinned(Device, int64_t) { return nullptr; }
void Backend::deallocate_pinned(Device, void*, int64_t) {}
bool FusedKernels::max_pool2d_channels_last(const Tensor&, const Window2d&, const Tensor&, const Tensor&) {
  return false;
}
bool FusedKernels::conv2d_prefers_channels_last(const Tensor&, const Tensor&, const Window2d&, int64_t, bool) {
  return false;
}
bool FusedKernels::conv2d_backward_input(const Tensor&, const Tensor&, const Window2d&, int64_t, const Tensor&) {
  return false;
}
bool FusedKernels::conv2d_backward_weight(const Tensor&, const Tensor&, const Window2d&, int64_t, const Tensor&) {
  return false;
}
bool FusedKernels::matmul_int8(const Tensor&, int64_t, const Tensor&, int64_t, const Tensor&) { return false; }
bool FusedKernels::sgd_steps(const std::vector<SgdTensors>&, const SgdStep&) { return false; }
bool FusedKernels::linear_bias(const Tensor&, const Tensor&, const Tensor&, const Tensor&) { return false; }
bool FusedKernels::matmul_epilogue(const Tensor&, const Tensor&, const std::vector<EpilogueStep>&, const Tensor&) {
  return false;
}
bool FusedKernels::matmul_int8_epilogue(const Tensor&, int64_t, const Tensor&, int64_t, const std::vector<EpilogueStep>&,
                                   const Tensor&) {
  return false;
}
bool FusedKernels::quantize(const Tensor&, double, int64_t, const Tensor&) { return false; }
bool FusedKernels::aminmax(const Tensor&, const Tensor&, const Tensor&) { return false; }
bool FusedKernels::dynamic_quantize(const Tensor&, const Tensor&, float&, int64_t&) { return false; }
bool FusedKernels::channel_gate(const Tensor&, bool, const Tensor&, const Tensor&, const Epilogue&, const Tensor&,
                             const Tensor&, const Epilogue&, const Tensor&, const Tensor&) {
  return false;
}
bool FusedKernels::softmax_rows(const Tensor&, const Tensor&) { return false; }
bool FusedKernels::log_softmax_rows(const Tensor&, const Tensor&) { return false; }
bool FusedKernels::log_softmax_backward_rows(const Tensor&, const Tensor&, const Tensor&) { return false; }
bool FusedKernels::attention_forward(const Tensor&, const Tensor&, const Tensor&, const Tensor&, bool, double,
                                     const Tensor&, const Tensor&) {
  return false;
}
bool FusedKernels::attention_backward(const Tensor&, const Tensor&, const Tensor&, const Tensor&, bool, double,
                                      const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                                      const Tensor&) {
  return false;
}
bool FusedKernels::layer_norm_rows(const Tensor&, int64_t, const Tensor&, const Tensor&, double, const Tensor&,
                              const Tensor&, const Tensor&) {
  return false;
}
bool FusedKernels::dequantize(const Tensor&, double, int64_t, const Tensor&) { return false; }
bool FusedKernels::fake_quantize(const Tensor&, double, int64_t, DType, const Tensor&) { return false; }
bool FusedKernels::elementwise_chain(const Tensor&, const std::vector<ChainStep>&, int64_t, int64_t, const Tensor&) {
  return false;
}
bool FusedKernels::adam_step(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&, const AdamStep&) {
  return false;
}
bool FusedKernels::adam_steps(const std::vector<AdamTensors>&, const AdamStep&) { return false; }
bool FusedKernels::channel_moments(const Tensor&, const Tensor&, const Tensor&) { return false; }
bool FusedKernels::channel_grad_sums(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&) {
  return false;
}
bool FusedKernels::channel_affine(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                             const Tensor&) {
  return false;
}

namespace {
std::atomic<int> cudnn_benchmark_setting{-1};  // -1: the knob's value, read on first use
}  // namespace

bool cudnn_benchmark_on() {
  int v = cudnn_benchmark_setting.load();
  if (v < 0) {
    static const bool knob = knob_flag("BRAID_CUDNN_BENCHMARK");
    int unset = -1;
    cudnn_benchmark_setting.compare_exchange_strong(unset, knob ? 1 : 0);
    v = cudnn_benchmark_setting.load();
  }
  return v == 1;
}

CudnnConvCounts& cudnn_conv_counts() {
  static CudnnConvCounts counts;
  return counts;
}

Backend& backend_for(Device device) {
  Backend* b = find_backend(device.type);
  if (b && device.index >= 0 && device.index < b->device_count()) return *b;
  if (!b)
    throw NotImplementedError(cat("no backend for device ", device.str(), " in this process of braid",
                                  device.type != DeviceType::CUDA ? std::string()
                                  : cuda_missing.empty()           ? ": this build has no CUDA backend (-Dcuda)"
                                                                   : ": " + cuda_missing));
  throw NotImplementedError(cat("device ", device.str(), " is not available: this process has ", b->device_count(),
                                " device(s) of its type"));
}

}  // namespace detail

void set_cudnn_benchmark(bool on) { detail::cudnn_benchmark_setting.store(on ? 1 : 0); }
bool cudnn_benchmark() { return detail::cudnn_benchmark_on(); }

}  // namespace braid
