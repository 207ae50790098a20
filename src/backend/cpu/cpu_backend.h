// The CPU backend: the Backend primitives run with OpenMP threads over strided loops, OpenBLAS for
// floating matmul and Philox for random numbers. Each primitive lives in the .cpp file named after
// its kind (memory.cpp, copy.cpp, elementwise.cpp, reduce.cpp, matmul.cpp, index.cpp, random.cpp,
// conv.cpp, pool.cpp); fused.cpp holds the fused optimizer step and BatchNorm passes, chain.cpp the
// elementwise chains and conv.cpp the convolutions oneDNN runs, when it is built in.
#pragma once

#include <csignal>

#include "backend/backend.h"
#include "braid/config.h"

namespace braid::detail {

/// Whether the fused primitives run (fused.cpp; BRAID_CPU_FUSED=0 turns them off, and so does a
/// CompositeOnly guard on its thread while it lives).
bool fused_on();
bool composite_only_active();  // a CompositeOnly guard lives on this thread
struct CompositeOnly {
  CompositeOnly();
  ~CompositeOnly();
  CompositeOnly(const CompositeOnly&) = delete;
  CompositeOnly& operator=(const CompositeOnly&) = delete;
};

/// t (float16 or bfloat16) as float32 scratch of t's shape, its broadcast (stride-0) axes kept
/// broadcast (matmul.cpp): the CPU runs half operands through its float32 kernels (Note [Half
/// arithmetic] in src/backend/backend.h).
Tensor widen_to_float32(const Tensor& t);

class CpuBackend final : public Backend, public FusedKernels {
 public:
  FusedKernels& fused() override { return *this; }  // Note [Fused kernels]: the entries below that return bool
  // memory.cpp
  void* allocate(Device device, int64_t nbytes) override;
  void deallocate(Device device, void* p, int64_t nbytes) override;
  int64_t cached_bytes(Device device) override;
  void empty_cache(Device device) override;
  void copy_from_host(Device device, const void* host, void* dev, int64_t nbytes) override;
  void copy_to_host(Device device, const void* dev, void* host, int64_t nbytes) override;
  void synchronize(Device) override {}
  int device_count() override { return 1; }

  void copy(const Tensor& src, const Tensor& dst) override;
  void fill(const Tensor& dst, double value) override;
  void iota(const Tensor& dst, double start, double step) override;
  void unary(UnaryOp op, const Tensor& x, const Tensor& out, double p0, double p1) override;
  void binary(BinaryOp op, const Tensor& a, const Tensor& b, const Tensor& out) override;
  void where(const Tensor& cond, const Tensor& a, const Tensor& b, const Tensor& out) override;
  void reduce(ReduceOp op, const Tensor& x, const std::vector<int64_t>& axes, const Tensor& out) override;
  void matmul(const Tensor& a, const Tensor& b, const Tensor& out) override;
  void gather(const Tensor& x, int64_t axis, const Tensor& index, const Tensor& out) override;
  void scatter_add(const Tensor& out, int64_t axis, const Tensor& index, const Tensor& src) override;
  void random(RandomKind kind, const Tensor& out, uint64_t seed, uint64_t counter, double a, double b) override;
  void im2col(const Tensor& x, const Window2d& win, const Tensor& cols) override;
  void col2im(const Tensor& cols, const Window2d& win, const Tensor& x) override;
  void depthwise_conv2d(const Tensor& x, const Tensor& w, const Tensor& bias, const Window2d& win,
                        const Tensor& y) override;
  void max_pool2d(const Tensor& x, const Window2d& win, const Tensor& out, const Tensor& indices) override;
  bool max_pool2d_channels_last(const Tensor& x, const Window2d& win, const Tensor& out,
                                const Tensor& indices) override;
  void avg_pool2d(const Tensor& x, const Window2d& win, bool count_include_pad, const Tensor& out) override;
  void avg_pool2d_backward(const Tensor& grad, const Window2d& win, bool count_include_pad,
                           const Tensor& grad_x) override;
  // fused.cpp: whole composites in one pass (Note [Fused kernels])
  bool quantize(const Tensor& x, double scale, int64_t zero, const Tensor& out) override;
  bool aminmax(const Tensor& x, const Tensor& lo, const Tensor& hi) override;
  bool dynamic_quantize(const Tensor& x, const Tensor& out, float& scale, int64_t& zero) override;
  bool softmax_rows(const Tensor& x, const Tensor& out) override;
  bool log_softmax_rows(const Tensor& x, const Tensor& out) override;
  bool log_softmax_backward_rows(const Tensor& g, const Tensor& y, const Tensor& gx) override;
  bool layer_norm_rows(const Tensor& x, int64_t n, const Tensor& weight, const Tensor& bias, double eps,
                       const Tensor& out, const Tensor& mean, const Tensor& inv) override;
  bool dequantize(const Tensor& x, double scale, int64_t zero, const Tensor& out) override;
  bool fake_quantize(const Tensor& x, double scale, int64_t zero, DType qtype, const Tensor& out) override;
  bool elementwise_chain(const Tensor& x, const std::vector<ChainStep>& steps, int64_t channels, int64_t inner,
                         const Tensor& out) override;
  bool adam_steps(const std::vector<AdamTensors>& params, const AdamStep& s) override;
  bool adam_step(const Tensor& p, const Tensor& g, const Tensor& m, const Tensor& v, const Tensor& max_v,
                 const AdamStep& s) override;
  // gate.cpp (Note [Channel gates as one op])
  bool channel_gate(const Tensor& x, bool channels_last, const Tensor& w1, const Tensor& b1, const Epilogue& e1,
                      const Tensor& w2, const Tensor& b2, const Epilogue& e2, const Tensor& gate,
                      const Tensor& out) override;
  bool channel_moments(const Tensor& x, const Tensor& mean, const Tensor& var) override;
  bool channel_grad_sums(const Tensor& g, const Tensor& x, const Tensor& mean, const Tensor& sum_g,
                         const Tensor& sum_gxc) override;
  bool channel_affine(const Tensor& a, const Tensor& sa, const Tensor& shift, const Tensor& b, const Tensor& b_mean,
                      const Tensor& sb, const Tensor& out) override;
  // conv.cpp: a 1x1 convolution as a GEMM with its bias and epilogue in one pass (Note [Small
  // pointwise convolutions]); conv2d's path for those under oneDNN's threshold.
  bool pointwise_conv2d(const Tensor& x, const Tensor& w, const Tensor& bias, const Window2d& win, int64_t groups,
                        const Epilogue& epilogue, const Tensor& y);
#ifdef BRAID_HAVE_DNNL
  // conv.cpp: float32 convolutions through oneDNN (Note [oneDNN convolutions])
  bool conv2d(const Tensor& x, const Tensor& w, const Tensor& bias, const Window2d& win, int64_t groups,
              const Epilogue& epilogue, const Tensor& y) override;
  bool conv2d_prefers_channels_last(const Tensor& x, const Tensor& w, const Window2d& win, int64_t groups,
                                    bool training) override;
  bool conv2d_backward_input(const Tensor& gy, const Tensor& w, const Window2d& win, int64_t groups,
                             const Tensor& gx) override;
  bool conv2d_backward_weight(const Tensor& x, const Tensor& gy, const Window2d& win, int64_t groups,
                              const Tensor& gw) override;
  // matmul_int8.cpp: int8 GEMM (Note [int8 GEMM through oneDNN])
  bool matmul_int8(const Tensor& a, int64_t a_zero, const Tensor& b, int64_t b_zero, const Tensor& out) override;
  bool matmul_int8_epilogue(const Tensor& a, int64_t a_zero, const Tensor& b, int64_t b_zero,
                            const std::vector<EpilogueStep>& epilogue, const Tensor& out) override;
  // matmul_weight.cpp: a float32 product by a kept weight with its epilogue (Note [float32 epilogues])
  bool matmul_epilogue(const Tensor& a, const Tensor& b, const std::vector<EpilogueStep>& epilogue,
                       const Tensor& out) override;
#endif
};

/// quantize's values of x[0, n) into out as uint8 (fused.cpp; a vector clone).
void quantize_u8(const float* x, uint8_t* out, int64_t n, float scale, float zero);

/// The process's one CPU backend.
Backend& cpu_backend();

#ifdef BRAID_HAVE_DNNL
/// Whether oneDNN runs what it can (convolutions, float32 GEMM): not when BRAID_ONEDNN=0, which
/// leaves braid's own kernels and OpenBLAS for a comparison (dnnl_common.cpp).
bool onednn_enabled();

/// C (M, N) = A (M, K, row stride lda) times B (K, N; b's memory, row stride ldb, or its transpose
/// when tb) through oneDNN's matmul primitive, on B reordered once and kept with b's storage from
/// its second product at a version on (Note [Products by a weight through oneDNN's matmul],
/// matmul_weight.cpp); false, computing nothing, where oneDNN has no such kernel for the shape.
bool weight_sgemm(const Tensor& b, bool tb, int64_t m, int64_t n, int64_t k, const float* a, int64_t lda, int64_t ldb,
                  float* c);

/// Blocks asynchronous signals on this thread while it lives, and for good on the OpenMP workers
/// (Note [Signals and oneDNN's kernels]): held around every call that runs oneDNN's kernels.
class OneDnnSignalGuard {
 public:
  OneDnnSignalGuard();
  ~OneDnnSignalGuard();
  OneDnnSignalGuard(const OneDnnSignalGuard&) = delete;
  OneDnnSignalGuard& operator=(const OneDnnSignalGuard&) = delete;

 private:
  sigset_t old_;
};
#endif

}  // namespace braid::detail
