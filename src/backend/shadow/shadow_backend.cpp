// The shadow device: a second backend for tests that runs every primitive with the CPU kernels on
// storage of its own.
#include "backend/shadow/shadow_backend.h"

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <string>
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
// that every operand of every primitive lives on the device the call was dispatched for (naming
// the primitive and both devices). The kernels themselves are the CPU backend's, run on host
// aliases of the operands, so results equal the CPU's bit for bit and the suite's expected values
// hold unchanged. Two devices (shadow:0, shadow:1) exist so that a mix of two devices of one type,
// as on a two-GPU machine, is caught too.

// Note [The shadow device's capability set]
// A GPU runs the composites of every optional primitive its backend lacks, so a shadow device that
// forwarded all of them to the CPU's kernels would leave exactly the GPU's paths untested in CI.
// BRAID_SHADOW_CAPS chooses what the shadow backend offers: "cuda" (CI's shadow pass) the optional
// primitives that CudaBackend declares, and it declines the others, so their ops fall back to their
// composites as on a GPU; "cpu" (the default) every one the CPU has, bit for bit the CPU's results.
// The set is read from CudaBackend's class at compile time (a method it does not declare has
// Backend's member type), so it follows the CUDA backend as kernels are added, with no list to keep.

namespace {

#define BRAID_CUDA_DECLARES(name) (!std::is_same_v<decltype(&CudaBackend::name), decltype(&Backend::name)>)

struct Caps {
  bool conv2d, max_pool2d_channels_last, conv2d_prefers_channels_last, conv2d_backward_input, conv2d_backward_weight,
      matmul_int8, matmul_int8_epilogue, matmul_epilogue, dequantize, aminmax, dynamic_quantize, softmax_rows,
      layer_norm_rows, fake_quantize, elementwise_chain, squeeze_excite, quantize, adam_step, channel_moments,
      channel_grad_sums, channel_affine;
};

constexpr Caps kCpuCaps{true, true, true, true, true, true, true, true, true, true, true,
                        true, true, true, true, true, true, true, true, true, true};
constexpr Caps kCudaCaps{BRAID_CUDA_DECLARES(conv2d), BRAID_CUDA_DECLARES(max_pool2d_channels_last),
                         BRAID_CUDA_DECLARES(conv2d_prefers_channels_last), BRAID_CUDA_DECLARES(conv2d_backward_input),
                         BRAID_CUDA_DECLARES(conv2d_backward_weight), BRAID_CUDA_DECLARES(matmul_int8),
                         BRAID_CUDA_DECLARES(matmul_int8_epilogue), BRAID_CUDA_DECLARES(matmul_epilogue),
                         BRAID_CUDA_DECLARES(dequantize), BRAID_CUDA_DECLARES(aminmax),
                         BRAID_CUDA_DECLARES(dynamic_quantize), BRAID_CUDA_DECLARES(softmax_rows),
                         BRAID_CUDA_DECLARES(layer_norm_rows), BRAID_CUDA_DECLARES(fake_quantize),
                         BRAID_CUDA_DECLARES(elementwise_chain), BRAID_CUDA_DECLARES(squeeze_excite),
                         BRAID_CUDA_DECLARES(quantize), BRAID_CUDA_DECLARES(adam_step),
                         BRAID_CUDA_DECLARES(channel_moments), BRAID_CUDA_DECLARES(channel_grad_sums),
                         BRAID_CUDA_DECLARES(channel_affine)};
#undef BRAID_CUDA_DECLARES

const Caps& shadow_caps() {
  static const Caps caps = [] {
    const std::string mode = detail::knob_text("BRAID_SHADOW_CAPS");
    if (mode == "cpu") return kCpuCaps;
    if (mode == "cuda") return kCudaCaps;
    throw ValueError(cat("BRAID_SHADOW_CAPS: expected 'cpu' or 'cuda', got '", mode, "'"));
  }();
  return caps;
}

constexpr int kShadowDevices = 2;
std::atomic<int64_t> g_pinned_allocations{0};
std::atomic<int64_t> g_pinned_live{0};

class ShadowBackend final : public Backend {
 public:
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

  void copy(const Tensor& src, const Tensor& dst) override { cpu().copy(host("copy", dst, src), host("copy", dst, dst)); }
  void fill(const Tensor& dst, double value) override { cpu().fill(host("fill", dst, dst), value); }
  void iota(const Tensor& dst, double start, double step) override { cpu().iota(host("iota", dst, dst), start, step); }
  void unary(UnaryOp op, const Tensor& x, const Tensor& out, double p0, double p1) override {
    cpu().unary(op, host("unary", out, x), host("unary", out, out), p0, p1);
  }
  void binary(BinaryOp op, const Tensor& a, const Tensor& b, const Tensor& out) override {
    cpu().binary(op, host("binary", out, a), host("binary", out, b), host("binary", out, out));
  }
  void where(const Tensor& cond, const Tensor& a, const Tensor& b, const Tensor& out) override {
    cpu().where(host("where", out, cond), host("where", out, a), host("where", out, b), host("where", out, out));
  }
  void reduce(ReduceOp op, const Tensor& x, const std::vector<int64_t>& axes, const Tensor& out) override {
    cpu().reduce(op, host("reduce", out, x), axes, host("reduce", out, out));
  }
  void matmul(const Tensor& a, const Tensor& b, const Tensor& out) override {
    cpu().matmul(host("matmul", out, a), host("matmul", out, b), host("matmul", out, out));
  }
  void gather(const Tensor& x, int64_t axis, const Tensor& index, const Tensor& out) override {
    cpu().gather(host("gather", out, x), axis, host("gather", out, index), host("gather", out, out));
  }
  void scatter_add(const Tensor& out, int64_t axis, const Tensor& index, const Tensor& src) override {
    cpu().scatter_add(host("scatter_add", out, out), axis, host("scatter_add", out, index),
                      host("scatter_add", out, src));
  }
  void random(RandomKind kind, const Tensor& out, uint64_t seed, uint64_t counter, double a, double b) override {
    cpu().random(kind, host("random", out, out), seed, counter, a, b);
  }
  void im2col(const Tensor& x, const Window2d& win, const Tensor& cols) override {
    cpu().im2col(host("im2col", cols, x), win, host("im2col", cols, cols));
  }
  void col2im(const Tensor& cols, const Window2d& win, const Tensor& x) override {
    cpu().col2im(host("col2im", x, cols), win, host("col2im", x, x));
  }
  void depthwise_conv2d(const Tensor& x, const Tensor& w, const Tensor& bias, const Window2d& win,
                        const Tensor& y) override {
    const char* op = "depthwise_conv2d";
    cpu().depthwise_conv2d(host(op, y, x), host(op, y, w), host(op, y, bias), win, host(op, y, y));
  }
  bool max_pool2d_channels_last(const Tensor& x, const Window2d& win, const Tensor& out) override {
    if (!shadow_caps().max_pool2d_channels_last) return false;
    const char* op = "max_pool2d";
    return cpu().max_pool2d_channels_last(host(op, out, x), win, host(op, out, out));
  }
  void max_pool2d(const Tensor& x, const Window2d& win, const Tensor& out, const Tensor& indices) override {
    const char* op = "max_pool2d";
    cpu().max_pool2d(host(op, out, x), win, host(op, out, out), indices.defined() ? host(op, out, indices) : Tensor());
  }
  void avg_pool2d(const Tensor& x, const Window2d& win, bool count_include_pad, const Tensor& out) override {
    cpu().avg_pool2d(host("avg_pool2d", out, x), win, count_include_pad, host("avg_pool2d", out, out));
  }
  void avg_pool2d_backward(const Tensor& grad, const Window2d& win, bool count_include_pad,
                           const Tensor& grad_x) override {
    const char* op = "avg_pool2d_backward";
    cpu().avg_pool2d_backward(host(op, grad_x, grad), win, count_include_pad, host(op, grad_x, grad_x));
  }
  // The optional primitives too, so that the shadow device computes what the CPU does, bit for bit.
  bool conv2d(const Tensor& x, const Tensor& w, const Tensor& bias, const Window2d& win, int64_t groups,
              const Epilogue& epilogue, const Tensor& y) override {
    if (!shadow_caps().conv2d) return false;
    const char* op = "conv2d";
    Epilogue e = epilogue;
    if (e.residual.defined()) e.residual = host(op, y, e.residual);
    return cpu().conv2d(host(op, y, x), host(op, y, w), host(op, y, bias), win, groups, e, host(op, y, y));
  }
  bool conv2d_prefers_channels_last(const Tensor& x, const Tensor& w, const Window2d& win, int64_t groups) override {
    if (!shadow_caps().conv2d_prefers_channels_last) return false;
    const char* op = "conv2d";
    return cpu().conv2d_prefers_channels_last(host(op, x, x), host(op, x, w), win, groups);
  }
  bool conv2d_backward_input(const Tensor& gy, const Tensor& w, const Window2d& win, int64_t groups,
                             const Tensor& gx) override {
    if (!shadow_caps().conv2d_backward_input) return false;
    const char* op = "conv2d_backward_input";
    return cpu().conv2d_backward_input(host(op, gx, gy), host(op, gx, w), win, groups, host(op, gx, gx));
  }
  bool conv2d_backward_weight(const Tensor& x, const Tensor& gy, const Window2d& win, int64_t groups,
                              const Tensor& gw) override {
    if (!shadow_caps().conv2d_backward_weight) return false;
    const char* op = "conv2d_backward_weight";
    return cpu().conv2d_backward_weight(host(op, gw, x), host(op, gw, gy), win, groups, host(op, gw, gw));
  }
  bool matmul_int8(const Tensor& a, int64_t a_zero, const Tensor& b, int64_t b_zero, const Tensor& out) override {
    if (!shadow_caps().matmul_int8) return false;
    const char* op = "matmul_int8";
    return cpu().matmul_int8(host(op, out, a), a_zero, host(op, out, b), b_zero, host(op, out, out));
  }
  bool matmul_int8_epilogue(const Tensor& a, int64_t a_zero, const Tensor& b, int64_t b_zero,
                            const std::vector<EpilogueStep>& epilogue, const Tensor& out) override {
    if (!shadow_caps().matmul_int8_epilogue) return false;
    const char* op = "matmul_int8_epilogue";
    std::vector<EpilogueStep> on_host;
    for (const EpilogueStep& s : epilogue) on_host.push_back({s.kind, host(op, out, s.operand), s.k});
    return cpu().matmul_int8_epilogue(host(op, out, a), a_zero, host(op, out, b), b_zero, on_host, host(op, out, out));
  }
  bool matmul_epilogue(const Tensor& a, const Tensor& b, const std::vector<EpilogueStep>& epilogue,
                       const Tensor& out) override {
    if (!shadow_caps().matmul_epilogue) return false;
    const char* op = "matmul_epilogue";
    std::vector<EpilogueStep> on_host;
    for (const EpilogueStep& s : epilogue) on_host.push_back({s.kind, host(op, out, s.operand), s.k});
    return cpu().matmul_epilogue(host(op, out, a), host(op, out, b), on_host, host(op, out, out));
  }
  bool dequantize(const Tensor& x, double scale, int64_t zero, const Tensor& out) override {
    if (!shadow_caps().dequantize) return false;
    const char* op = "dequantize";
    return cpu().dequantize(host(op, out, x), scale, zero, host(op, out, out));
  }
  bool fake_quantize(const Tensor& x, double scale, int64_t zero, DType qtype, const Tensor& out) override {
    if (!shadow_caps().fake_quantize) return false;
    const char* op = "fake_quantize";
    return cpu().fake_quantize(host(op, out, x), scale, zero, qtype, host(op, out, out));
  }
  bool elementwise_chain(const Tensor& x, const std::vector<ChainStep>& steps, int64_t channels, int64_t inner,
                         const Tensor& out) override {
    if (!shadow_caps().elementwise_chain) return false;
    const char* op = "elementwise_chain";
    std::vector<ChainStep> on_host = steps;
    for (ChainStep& s : on_host) {
      if (s.kind == ChainStep::Kind::ChannelAffine) {
        s.channel_scale = host(op, out, s.channel_scale);
        s.channel_shift = host(op, out, s.channel_shift);
      }
      if (s.operand.defined()) s.operand = host(op, out, s.operand);
    }
    return cpu().elementwise_chain(host(op, out, x), on_host, channels, inner, host(op, out, out));
  }
  bool squeeze_excite(const Tensor& x, bool channels_last, const Tensor& w1, const Tensor& b1, const Epilogue& e1,
                      const Tensor& w2, const Tensor& b2, const Epilogue& e2, const Tensor& gate,
                      const Tensor& out) override {
    if (!shadow_caps().squeeze_excite) return false;
    const char* op = "squeeze_excite";
    return cpu().squeeze_excite(host(op, gate, x), channels_last, host(op, gate, w1), host(op, gate, b1), e1,
                                host(op, gate, w2), host(op, gate, b2), e2, host(op, gate, gate), host(op, gate, out));
  }
  bool dynamic_quantize(const Tensor& x, const Tensor& out, float& scale, int64_t& zero) override {
    if (!shadow_caps().dynamic_quantize) return false;
    const char* op = "dynamic_quantize";
    return cpu().dynamic_quantize(host(op, out, x), host(op, out, out), scale, zero);
  }
  bool aminmax(const Tensor& x, const Tensor& lo, const Tensor& hi) override {
    if (!shadow_caps().aminmax) return false;
    const char* op = "aminmax";
    return cpu().aminmax(host(op, lo, x), host(op, lo, lo), host(op, lo, hi));
  }
  bool softmax_rows(const Tensor& x, const Tensor& out) override {
    if (!shadow_caps().softmax_rows) return false;
    const char* op = "softmax_rows";
    return cpu().softmax_rows(host(op, out, x), host(op, out, out));
  }
  bool layer_norm_rows(const Tensor& x, int64_t n, const Tensor& weight, const Tensor& bias, double eps,
                       const Tensor& out, const Tensor& mean, const Tensor& inv) override {
    if (!shadow_caps().layer_norm_rows) return false;
    const char* op = "layer_norm_rows";
    auto h = [&](const Tensor& t) { return t.defined() ? host(op, out, t) : Tensor(); };
    return cpu().layer_norm_rows(h(x), n, h(weight), h(bias), eps, h(out), h(mean), h(inv));
  }
  bool quantize(const Tensor& x, double scale, int64_t zero, const Tensor& out) override {
    if (!shadow_caps().quantize) return false;
    const char* op = "quantize";
    return cpu().quantize(host(op, out, x), scale, zero, host(op, out, out));
  }
  bool adam_step(const Tensor& p, const Tensor& g, const Tensor& m, const Tensor& v, const Tensor& max_v,
                 const AdamStep& s) override {
    if (!shadow_caps().adam_step) return false;
    const char* op = "adam_step";
    return cpu().adam_step(host(op, p, p), host(op, p, g), host(op, p, m), host(op, p, v), host(op, p, max_v), s);
  }
  bool channel_moments(const Tensor& x, const Tensor& mean, const Tensor& var) override {
    if (!shadow_caps().channel_moments) return false;
    const char* op = "channel_moments";
    return cpu().channel_moments(host(op, mean, x), host(op, mean, mean), host(op, mean, var));
  }
  bool channel_grad_sums(const Tensor& g, const Tensor& x, const Tensor& mean, const Tensor& sum_g,
                         const Tensor& sum_gxc) override {
    if (!shadow_caps().channel_grad_sums) return false;
    const char* op = "channel_grad_sums";
    return cpu().channel_grad_sums(host(op, sum_g, g), host(op, sum_g, x), host(op, sum_g, mean),
                                   host(op, sum_g, sum_g), host(op, sum_g, sum_gxc));
  }
  bool channel_affine(const Tensor& a, const Tensor& sa, const Tensor& shift, const Tensor& b, const Tensor& b_mean,
                      const Tensor& sb, const Tensor& out) override {
    if (!shadow_caps().channel_affine) return false;
    const char* op = "channel_affine";
    return cpu().channel_affine(host(op, out, a), host(op, out, sa), host(op, out, shift), host(op, out, b),
                                host(op, out, b_mean), host(op, out, sb), host(op, out, out));
  }

 private:
  static Backend& cpu() { return cpu_backend(); }

  // t as a CPU tensor over the same memory, after checking that it lives on anchor's device (the
  // device this call was dispatched for). Undefined tensors (an absent bias) pass through.
  static Tensor host(const char* primitive, const Tensor& anchor, const Tensor& t) {
    if (!t.defined()) return t;
    BRAID_CHECK_T(TypeError, t.device() == anchor.device(), primitive, ": operands on different devices (",
                  t.device().str(), " and ", anchor.device().str(), "); move them with .to(device) first");
    const std::shared_ptr<Storage>& s = t.storage();
    return make_tensor(Storage::wrap(s->data(), s->nbytes(), Device::cpu()), t.shape(), t.strides(), t.offset(),
                       t.dtype());
  }
};

}  // namespace

int64_t shadow_pinned_allocations() { return g_pinned_allocations.load(); }
int64_t shadow_pinned_live() { return g_pinned_live.load(); }

Backend& shadow_backend() {
  static ShadowBackend backend;
  return backend;
}

}  // namespace braid::detail
