// The shadow device: a second backend for tests that runs every primitive with the CPU kernels on
// storage of its own. The primitives come from one forwarding list (Note [The shadow device's
// forwarding list]); memory and transfers are written out below.
#include "backend/shadow/shadow_backend.h"

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <string>
#include <tuple>
#include <type_traits>

#include "backend/cpu/cpu_backend.h"
#include "backend/cuda/cuda_backend.h"  // names no CUDA type: only which primitives CudaBackend declares
#include "core/internal.h"
#include "core/knob_read.h"

namespace braid::detail {

// Note [The shadow device]
// CI has no GPU, yet a GPU backend breaks on any op that reads device memory on the host, mixes a
// tensor with a constant made on the CPU, or forgets a to(). The shadow device makes those mistakes
// fail on the CPU: its memory is ordinary host memory, but Tensor::data/raw_data refuse it as they
// refuse GPU memory, the ops' front doors refuse device mixes, and this backend checks once more
// that every operand of every primitive lives on one device (naming the primitive and both
// devices). The kernels themselves are the CPU backend's, run on host aliases of the operands, so
// results equal the CPU's bit for bit and the suite's expected values hold unchanged. Two devices
// (shadow:0, shadow:1) exist so that a mix of two devices of one type, as on a two-GPU machine, is
// caught too.

// Note [The shadow device's capability set]
// A GPU runs the composites of every optional primitive its backend lacks, so a shadow device that
// forwarded all of them to the CPU's kernels would leave exactly the GPU's paths untested in CI.
// BRAID_SHADOW_CAPS chooses what the shadow backend offers: "cuda" (CI's shadow pass) the optional
// primitives that CudaBackend declares, and it declines the others, so their ops fall back to their
// composites as on a GPU; "cpu" (the default) every one the CPU has, bit for bit the CPU's results.
// The set is read from CudaBackend's class at compile time (a method it does not declare has
// Backend's member type), so it follows the CUDA backend as kernels are added, with no list to keep.

// Note [The shadow device's forwarding list]
// Every primitive is forwarded the same way: each tensor operand (and each tensor inside an
// Epilogue, an EpilogueStep or a ChainStep) is checked to live on the device of the call's first
// defined tensor operand and replaced by a CPU alias of its memory; every other argument passes
// through unchanged; the CPU backend's method of the same name runs on the result. An optional
// primitive (one that returns bool) first asks the capability set. So the forwarding is written
// once, below, and a primitive is one entry of BRAID_SHADOW_REQUIRED or BRAID_SHADOW_OPTIONAL: its
// name, its parameter list and the names to pass on (backend.h's signature, copied). A line whose signature drifts from backend.h fails to
// build (override); a required primitive left out leaves the class abstract, and fails too.

// clang-format off
#define BRAID_SHADOW_REQUIRED(X)                                                                                       \
  X(copy, (const Tensor& src, const Tensor& dst), (src, dst))                                                          \
  X(fill, (const Tensor& dst, double value), (dst, value))                                                             \
  X(iota, (const Tensor& dst, double start, double step), (dst, start, step))                                          \
  X(unary, (UnaryOp op, const Tensor& x, const Tensor& out, double p0, double p1), (op, x, out, p0, p1))               \
  X(binary, (BinaryOp op, const Tensor& a, const Tensor& b, const Tensor& out), (op, a, b, out))                       \
  X(where, (const Tensor& cond, const Tensor& a, const Tensor& b, const Tensor& out), (cond, a, b, out))                \
  X(reduce, (ReduceOp op, const Tensor& x, const std::vector<int64_t>& axes, const Tensor& out), (op, x, axes, out))   \
  X(matmul, (const Tensor& a, const Tensor& b, const Tensor& out), (a, b, out))                                        \
  X(gather, (const Tensor& x, int64_t axis, const Tensor& index, const Tensor& out), (x, axis, index, out))            \
  X(scatter_add, (const Tensor& out, int64_t axis, const Tensor& index, const Tensor& src), (out, axis, index, src))    \
  X(random, (RandomKind kind, const Tensor& out, uint64_t seed, uint64_t counter, double a, double b),                 \
    (kind, out, seed, counter, a, b))                                                                                  \
  X(im2col, (const Tensor& x, const Window2d& win, const Tensor& cols), (x, win, cols))                                \
  X(col2im, (const Tensor& cols, const Window2d& win, const Tensor& x), (cols, win, x))                                \
  X(depthwise_conv2d, (const Tensor& x, const Tensor& w, const Tensor& bias, const Window2d& win, const Tensor& y),     \
    (x, w, bias, win, y))                                                                                              \
  X(max_pool2d, (const Tensor& x, const Window2d& win, const Tensor& out, const Tensor& indices),                      \
    (x, win, out, indices))                                                                                            \
  X(avg_pool2d, (const Tensor& x, const Window2d& win, bool count_include_pad, const Tensor& out),                     \
    (x, win, count_include_pad, out))                                                                                  \
  X(avg_pool2d_backward, (const Tensor& grad, const Window2d& win, bool count_include_pad, const Tensor& grad_x),      \
    (grad, win, count_include_pad, grad_x))

#define BRAID_SHADOW_OPTIONAL(X)                                                                                       \
  X(conv2d, (const Tensor& x, const Tensor& w, const Tensor& bias, const Window2d& win, int64_t groups,                \
             const Epilogue& epilogue, const Tensor& y), (x, w, bias, win, groups, epilogue, y))                       \
  X(max_pool2d_channels_last, (const Tensor& x, const Window2d& win, const Tensor& out, const Tensor& indices),      \
    (x, win, out, indices))                                                                                            \
  X(conv2d_backward_input, (const Tensor& gy, const Tensor& w, const Window2d& win, int64_t groups, const Tensor& gx), \
    (gy, w, win, groups, gx))                                                                                          \
  X(conv2d_backward_weight, (const Tensor& x, const Tensor& gy, const Window2d& win, int64_t groups, const Tensor& gw), \
    (x, gy, win, groups, gw))                                                                                          \
  X(matmul_int8, (const Tensor& a, int64_t a_zero, const Tensor& b, int64_t b_zero, const Tensor& out),                \
    (a, a_zero, b, b_zero, out))                                                                                       \
  X(matmul_int8_epilogue, (const Tensor& a, int64_t a_zero, const Tensor& b, int64_t b_zero,                           \
                           const std::vector<EpilogueStep>& epilogue, const Tensor& out),                              \
    (a, a_zero, b, b_zero, epilogue, out))                                                                             \
  X(linear_bias, (const Tensor& x, const Tensor& w, const Tensor& bias, const Tensor& out), (x, w, bias, out))         \
  X(matmul_epilogue, (const Tensor& a, const Tensor& b, const std::vector<EpilogueStep>& epilogue, const Tensor& out), \
    (a, b, epilogue, out))                                                                                             \
  X(dequantize, (const Tensor& x, double scale, int64_t zero, const Tensor& out), (x, scale, zero, out))               \
  X(aminmax, (const Tensor& x, const Tensor& lo, const Tensor& hi), (x, lo, hi))                                       \
  X(dynamic_quantize, (const Tensor& x, const Tensor& out, float& scale, int64_t& zero), (x, out, scale, zero))        \
  X(softmax_rows, (const Tensor& x, const Tensor& out), (x, out))                                                      \
  X(log_softmax_rows, (const Tensor& x, const Tensor& out), (x, out))                                                  \
  X(log_softmax_backward_rows, (const Tensor& g, const Tensor& y, const Tensor& gx), (g, y, gx))                       \
  X(layer_norm_rows, (const Tensor& x, int64_t n, const Tensor& weight, const Tensor& bias, double eps,                \
                      const Tensor& out, const Tensor& mean, const Tensor& inv),                                       \
    (x, n, weight, bias, eps, out, mean, inv))                                                                         \
  X(fake_quantize, (const Tensor& x, double scale, int64_t zero, DType qtype, const Tensor& out),                      \
    (x, scale, zero, qtype, out))                                                                                      \
  X(elementwise_chain, (const Tensor& x, const std::vector<ChainStep>& steps, int64_t channels, int64_t inner,         \
                        const Tensor& out), (x, steps, channels, inner, out))                                          \
  X(channel_gate, (const Tensor& x, bool channels_last, const Tensor& w1, const Tensor& b1, const Epilogue& e1,      \
                     const Tensor& w2, const Tensor& b2, const Epilogue& e2, const Tensor& gate, const Tensor& out),   \
    (x, channels_last, w1, b1, e1, w2, b2, e2, gate, out))                                                             \
  X(quantize, (const Tensor& x, double scale, int64_t zero, const Tensor& out), (x, scale, zero, out))                 \
  X(adam_step, (const Tensor& p, const Tensor& g, const Tensor& m, const Tensor& v, const Tensor& max_v,               \
                const AdamStep& s), (p, g, m, v, max_v, s))                                                            \
  X(adam_steps, (const std::vector<AdamTensors>& params, const AdamStep& s), (params, s))                              \
  X(sgd_steps, (const std::vector<SgdTensors>& params, const SgdStep& s), (params, s))                                \
  X(channel_moments, (const Tensor& x, const Tensor& mean, const Tensor& var), (x, mean, var))                         \
  X(channel_grad_sums, (const Tensor& g, const Tensor& x, const Tensor& mean, const Tensor& sum_g,                     \
                        const Tensor& sum_gxc), (g, x, mean, sum_g, sum_gxc))                                          \
  X(channel_affine, (const Tensor& a, const Tensor& sa, const Tensor& shift, const Tensor& b, const Tensor& b_mean,    \
                     const Tensor& sb, const Tensor& out), (a, sa, shift, b, b_mean, sb, out))               \
  X(attention_forward, (const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& mask, bool causal,            \
                        double scale, const Tensor& out, const Tensor& lse), (q, k, v, mask, causal, scale, out, lse)) \
  X(attention_backward, (const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& mask, bool causal,           \
                         double scale, const Tensor& out, const Tensor& lse, const Tensor& grad_out, const Tensor& gq, \
                         const Tensor& gk, const Tensor& gv),                                                          \
    (q, k, v, mask, causal, scale, out, lse, grad_out, gq, gk, gv))
// clang-format on

namespace {

bool offers_all() {
  static const bool all = [] {
    const std::string mode = detail::knob_text("BRAID_SHADOW_CAPS");
    if (mode == "cpu") return true;
    if (mode == "cuda") return false;
    throw ValueError(cat("BRAID_SHADOW_CAPS: expected 'cpu' or 'cuda', got '", mode, "'"));
  }();
  return all;
}

bool offered(bool cuda_declares) { return offers_all() || cuda_declares; }

constexpr int kShadowDevices = 2;
std::atomic<int64_t> g_pinned_allocations{0};
std::atomic<int64_t> g_pinned_live{0};

// One call's operands moved to the host: the primitive's name and the device of its first defined
// tensor operand, which every other one must share.
struct Call {
  const char* primitive;
  const Tensor* anchor = nullptr;

  void find_anchor(const Tensor& t) {
    if (!anchor && t.defined()) anchor = &t;
  }
  void find_anchor(const std::vector<AdamTensors>& params) {
    for (const AdamTensors& t : params) find_anchor(t.p);
  }
  void find_anchor(const std::vector<SgdTensors>& params) {
    for (const SgdTensors& t : params) find_anchor(t.p);
  }
  template <typename A>
  void find_anchor(const A&) {}

  // t as a CPU tensor over the same memory, after checking its device. Undefined tensors (an absent
  // bias) pass through.
  Tensor host(const Tensor& t) const {
    if (!t.defined()) return t;
    BRAID_CHECK_T(TypeError, t.device() == anchor->device(), primitive, ": operands on different devices (",
                  t.device().str(), " and ", anchor->device().str(), "); move them with .to(device) first");
    const std::shared_ptr<Storage>& s = t.storage();
    return make_tensor(Storage::wrap(s->data(), s->nbytes(), Device::cpu()), t.shape(), t.strides(), t.offset(),
                       t.dtype());
  }
  Tensor on_host(const Tensor& t) const { return host(t); }
  Epilogue on_host(const Epilogue& e) const {
    Epilogue h = e;
    h.residual = host(e.residual);
    return h;
  }
  std::vector<FusedKernels::EpilogueStep> on_host(const std::vector<FusedKernels::EpilogueStep>& steps) const {
    std::vector<FusedKernels::EpilogueStep> h;
    for (const FusedKernels::EpilogueStep& s : steps) h.push_back({s.kind, host(s.operand), s.k});
    return h;
  }
  std::vector<ChainStep> on_host(const std::vector<ChainStep>& steps) const {
    std::vector<ChainStep> h = steps;
    for (ChainStep& s : h) {
      if (s.kind == ChainStep::Kind::ChannelAffine) {
        s.channel_scale = host(s.channel_scale);
        s.channel_shift = host(s.channel_shift);
      }
      s.operand = host(s.operand);
    }
    return h;
  }
  std::vector<AdamTensors> on_host(const std::vector<AdamTensors>& params) const {
    std::vector<AdamTensors> h;
    for (const AdamTensors& t : params) h.push_back({host(t.p), host(t.g), host(t.m), host(t.v), host(t.max_v)});
    return h;
  }
  std::vector<SgdTensors> on_host(const std::vector<SgdTensors>& params) const {
    std::vector<SgdTensors> h;
    for (const SgdTensors& t : params) h.push_back({host(t.p), host(t.g), host(t.buf)});
    return h;
  }
  template <typename A>
    requires(!std::is_same_v<std::remove_cvref_t<A>, Tensor> && !std::is_same_v<std::remove_cvref_t<A>, Epilogue> &&
             !std::is_same_v<std::remove_cvref_t<A>, std::vector<AdamTensors>> &&
             !std::is_same_v<std::remove_cvref_t<A>, std::vector<SgdTensors>> &&
             !std::is_same_v<std::remove_cvref_t<A>, std::vector<FusedKernels::EpilogueStep>> &&
             !std::is_same_v<std::remove_cvref_t<A>, std::vector<ChainStep>>)
  A&& on_host(A&& a) const {  // numbers, enums, windows, axes, the out-parameters of dynamic_quantize
    return std::forward<A>(a);
  }
};

// The CPU backend's method run on args moved to the host.
template <typename Method, typename... Args>
auto forward(const char* primitive, Method method, Args&&... args) {
  Call call{primitive};
  (call.find_anchor(args), ...);
  return (cpu_backend().*method)(call.on_host(std::forward<Args>(args))...);
}

// The CPU backend's fused kernel run on args moved to the host (Note [Fused kernels]).
template <typename Method, typename... Args>
bool forward_fused(const char* primitive, Method method, Args&&... args) {
  Call call{primitive};
  (call.find_anchor(args), ...);
  return (cpu_backend().fused().*method)(call.on_host(std::forward<Args>(args))...);
}

#define BRAID_CUDA_DECLARES(name) (!std::is_same_v<decltype(&CudaBackend::name), decltype(&FusedKernels::name)>)

class ShadowBackend final : public Backend, public FusedKernels {
 public:
  FusedKernels& fused() override { return *this; }  // Note [Fused kernels]
  // As the CUDA backend under "cuda" capabilities, as the CPU otherwise (Note [The shadow device's
  // capability set]).
  bool autocast_half_activations() const override {
    return offers_all() ? cpu_backend().autocast_half_activations() : CudaBackend::kAutocastHalfActivations;
  }
  // Likewise the layout a training convolution prefers: CUDA's rule (half operands channels-last,
  // Note [Channels-last training] in src/ops/conv.cpp), whose passes then run on the CPU's kernels
  // or their composites; the CPU never trains channels-last, so its answer would leave that path
  // untested. Inference keeps the CPU's answer, whose channels-last kernels the shadow pass checks.
  bool conv2d_prefers_channels_last(const Tensor& x, const Tensor& w, const Window2d& win, int64_t groups,
                                    bool training) override {
    if (!offers_all() && training) return CudaBackend::channels_last_rule(x, w);
    return forward_fused("conv2d_prefers_channels_last", &FusedKernels::conv2d_prefers_channels_last, x, w, win, groups,
                         training);
  }
  void* allocate(Device device, int64_t nbytes) override {
    void* p = std::aligned_alloc(64, static_cast<size_t>(nbytes));
    if (!p) throw Error(cat("out of memory allocating ", nbytes, " bytes on ", device.str()));
    return p;
  }
  void deallocate(Device, void* p, int64_t) override { std::free(p); }
  void* allocate_pinned(Device, int64_t nbytes) override {
    void* p = std::aligned_alloc(64, static_cast<size_t>((nbytes + 63) / 64 * 64));
    if (p) ++g_pinned_allocations, ++g_pinned_live;
    return p;
  }
  void deallocate_pinned(Device, void* p, int64_t) override {
    --g_pinned_live;
    std::free(p);
  }
  int64_t cached_bytes(Device) override { return 0; }
  void empty_cache(Device) override {}
  void copy_from_host(Device, const void* host, void* dev, int64_t nbytes) override {
    if (nbytes > 0) std::memcpy(dev, host, static_cast<size_t>(nbytes));
  }
  void copy_to_host(Device, const void* dev, void* host, int64_t nbytes) override {
    if (nbytes > 0) std::memcpy(host, dev, static_cast<size_t>(nbytes));
  }
  void synchronize(Device) override {}
  int device_count() override { return kShadowDevices; }

#define BRAID_SHADOW_FORWARD(name, params, args) \
  void name params override { forward(#name, &Backend::name, BRAID_SHADOW_UNPAREN args); }
#define BRAID_SHADOW_FORWARD_OPTIONAL(name, params, args)                                    \
  bool name params override {                                                                \
    return offered(BRAID_CUDA_DECLARES(name)) &&                                             \
           forward_fused(#name, &FusedKernels::name, BRAID_SHADOW_UNPAREN args);             \
  }
#define BRAID_SHADOW_UNPAREN(...) __VA_ARGS__
  BRAID_SHADOW_REQUIRED(BRAID_SHADOW_FORWARD)
  BRAID_SHADOW_OPTIONAL(BRAID_SHADOW_FORWARD_OPTIONAL)
#undef BRAID_SHADOW_UNPAREN
#undef BRAID_SHADOW_FORWARD_OPTIONAL
#undef BRAID_SHADOW_FORWARD
};

#undef BRAID_CUDA_DECLARES

}  // namespace

int64_t shadow_pinned_allocations() { return g_pinned_allocations.load(); }
int64_t shadow_pinned_live() { return g_pinned_live.load(); }

Backend& shadow_backend() {
  static ShadowBackend backend;
  return backend;
}

}  // namespace braid::detail
