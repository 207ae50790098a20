// The CUDA backend: the Backend primitives on NVIDIA GPUs (Note [The CUDA backend] in
// cuda_backend.cpp). This header names no CUDA type, so the registry includes it freely; the
// methods live in cuda_backend.cpp (memory, transfers), matmul.cpp and matmul_lt.cpp (cuBLAS and
// cuBLASLt) and, for every other primitive, the .cu file of its kernels, where it unpacks its
// tensors for them (host.h).
#pragma once

#include "backend/backend.h"

namespace braid::detail {

class CudaBackend final : public Backend, public FusedKernels {
 public:
  FusedKernels& fused() override { return *this; }  // Note [Fused kernels]: the entries below that return bool
  // Note [Autocast]: the kernels read and write float16/bfloat16 directly.
  static constexpr bool kAutocastHalfActivations = true;
  bool autocast_half_activations() const override { return kAutocastHalfActivations; }
  // Note [cuDNN convolutions]: half operands run on the tensor cores, whose kernels are NHWC ones, in
  // inference and training alike (conv2d_prefers_channels_last where cuDNN is built in; the shadow
  // device's "cuda" capability set answers with it too).
  static bool channels_last_rule(const Tensor& x, const Tensor& w) {
    return x.dim() == 4 && is_half(x.dtype()) && is_half(w.dtype());
  }
  // cuda_backend.cpp: memory, transfers, ordering
  void* allocate(Device device, int64_t nbytes) override;
  void deallocate(Device device, void* p, int64_t nbytes) override;
  int64_t cached_bytes(Device device) override;
  void empty_cache(Device device) override;
  void* allocate_pinned(Device device, int64_t nbytes) override;
  void deallocate_pinned(Device device, void* p, int64_t nbytes) override;
  void copy_from_host(Device device, const void* host, void* dev, int64_t nbytes) override;
  void copy_to_host(Device device, const void* dev, void* host, int64_t nbytes) override;
  void synchronize(Device device) override;
  int device_count() override;
  std::shared_ptr<BackendEvent> record_event(Device device) override;
  bool event_ready(const BackendEvent& event) override;
  void event_synchronize(const BackendEvent& event) override;
  double event_elapsed_ms(const BackendEvent& start, const BackendEvent& end) override;

  // copy.cu
  void copy(const Tensor& src, const Tensor& dst) override;
  void fill(const Tensor& dst, double value) override;
  void iota(const Tensor& dst, double start, double step) override;
  // unary.cu
  void unary(UnaryOp op, const Tensor& x, const Tensor& out, double p0, double p1) override;
  // binary.cu
  void binary(BinaryOp op, const Tensor& a, const Tensor& b, const Tensor& out) override;
  void where(const Tensor& cond, const Tensor& a, const Tensor& b, const Tensor& out) override;
  // reduce.cu
  void reduce(ReduceOp op, const Tensor& x, const std::vector<int64_t>& axes, const Tensor& out) override;
  // index.cu
  void gather(const Tensor& x, int64_t axis, const Tensor& index, const Tensor& out) override;
  void scatter_add(const Tensor& out, int64_t axis, const Tensor& index, const Tensor& src) override;
  // random.cu
  void random(RandomKind kind, const Tensor& out, uint64_t seed, uint64_t counter, double a, double b) override;
  // conv.cu
  void im2col(const Tensor& x, const Window2d& win, const Tensor& cols) override;
  void col2im(const Tensor& cols, const Window2d& win, const Tensor& x) override;
  void depthwise_conv2d(const Tensor& x, const Tensor& w, const Tensor& bias, const Window2d& win,
                        const Tensor& y) override;
  // pool.cu
  void max_pool2d(const Tensor& x, const Window2d& win, const Tensor& out, const Tensor& indices) override;
  void avg_pool2d(const Tensor& x, const Window2d& win, bool count_include_pad, const Tensor& out) override;
  void avg_pool2d_backward(const Tensor& grad, const Window2d& win, bool count_include_pad,
                           const Tensor& grad_x) override;
  bool max_pool2d_channels_last(const Tensor& x, const Window2d& win, const Tensor& out,
                                const Tensor& indices) override;

  // attention.cu
  bool attention_forward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& mask, bool causal,
                         double scale, const Tensor& out, const Tensor& lse) override;
  bool attention_backward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& mask, bool causal,
                          double scale, const Tensor& out, const Tensor& lse, const Tensor& grad_out, const Tensor& gq,
                          const Tensor& gk, const Tensor& gv) override;

  // matmul.cpp
  void matmul(const Tensor& a, const Tensor& b, const Tensor& out) override;

  // fused.cu: the fused kernels a training step runs (Note [Fused kernels])
  bool channel_moments(const Tensor& x, const Tensor& mean, const Tensor& var) override;
  bool channel_grad_sums(const Tensor& g, const Tensor& x, const Tensor& mean, const Tensor& sum_g,
                         const Tensor& sum_gxc) override;
  bool channel_affine(const Tensor& a, const Tensor& sa, const Tensor& shift, const Tensor& b, const Tensor& b_mean,
                      const Tensor& sb, const Tensor& out) override;
  bool adam_step(const Tensor& p, const Tensor& g, const Tensor& m, const Tensor& v, const Tensor& max_v,
                 const AdamStep& s) override;
  bool adam_steps(const std::vector<AdamTensors>& params, const AdamStep& s) override;
  bool sgd_steps(const std::vector<SgdTensors>& params, const SgdStep& s) override;  // sgd.cu
  bool softmax_rows(const Tensor& x, const Tensor& out) override;
  bool log_softmax_rows(const Tensor& x, const Tensor& out) override;
  bool log_softmax_backward_rows(const Tensor& g, const Tensor& y, const Tensor& gx) override;
  bool layer_norm_rows(const Tensor& x, int64_t n, const Tensor& weight, const Tensor& bias, double eps,
                       const Tensor& out, const Tensor& mean, const Tensor& inv) override;

  // matmul_lt.cpp (cuBLASLt; the steps' pass in epilogue.cu)
  bool linear_bias(const Tensor& x, const Tensor& w, const Tensor& bias, const Tensor& out) override;
  bool matmul_epilogue(const Tensor& a, const Tensor& b, const std::vector<EpilogueStep>& epilogue,
                       const Tensor& out) override;

  // cudnn_conv.cpp: cuDNN's convolutions (Note [cuDNN convolutions]); where the build has no cuDNN, entries that decline
  bool conv2d(const Tensor& x, const Tensor& w, const Tensor& bias, const Window2d& win, int64_t groups,
              const Epilogue& epilogue, const Tensor& y) override;
  bool conv2d_prefers_channels_last(const Tensor& x, const Tensor& w, const Window2d& win, int64_t groups,
                                    bool training) override;
  bool conv2d_backward_input(const Tensor& gy, const Tensor& w, const Window2d& win, int64_t groups,
                             const Tensor& gx) override;
  bool conv2d_backward_weight(const Tensor& x, const Tensor& gy, const Window2d& win, int64_t groups,
                              const Tensor& gw) override;
};

/// The process's one CUDA backend (its device_count is 0 where no driver or GPU is present).
Backend& cuda_backend();

}  // namespace braid::detail
