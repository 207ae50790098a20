// Multi-tensor SGD on CUDA (FusedKernels::sgd_steps; the composite is SGD::update in
// src/optim/sgd.cpp).
//
// Note [Multi-tensor SGD]
// SGD with momentum and weight decay is five or six elementwise launches per parameter as ops, and a
// ResNet-50 has 161 parameters: about 900 launches a step, most of them over a few hundred values.
// sgd_steps takes up to kSgdList parameters per launch, their pointers passed by value as
// adam_steps passes Adam's (Note [Multi-tensor Adam] in fused.cu), PyTorch's foreach SGD's packing,
// and each element runs the composite's operations in its order, each rounded to the parameter's
// dtype (nvcc's -fmad=false keeps a * b + c two roundings), so the result is the composite's bit for
// bit. Only the steps after the first: the first step of a momentum run makes the buffers (copies of
// the gradient), which the composite does.
#include <algorithm>
#include <cstdint>

#include "backend/cuda/common.cuh"
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/host.h"

namespace braid::detail::cuda {
namespace {

constexpr int kSgdList = 32;

template <typename T>
struct SgdList {
  T* p[kSgdList];
  const T* g[kSgdList];
  T* buf[kSgdList];          // null without momentum
  int64_t end[kSgdList];     // the prefix sums of the parameters' sizes
  int count;
};

// The step's numbers in the parameters' dtype, as the composite's scalar operands are.
template <typename T>
struct SgdNumbers {
  T neg_lr, momentum, one_minus_dampening, weight_decay;
  bool decay, maximize, momentum_on, dampening_on, nesterov;
};

template <typename T>
__global__ void __launch_bounds__(kThreads) sgd_list_kernel(SgdList<T> list, SgdNumbers<T> s) {
  const int64_t total = list.end[list.count - 1];
  int k = 0;
  for (int64_t i = global_index(); i < total; i += grid_stride()) {
    while (i >= list.end[k]) ++k;
    const int64_t j = i - (k == 0 ? 0 : list.end[k - 1]);
    T* p = list.p[k];
    const T gi = list.g[k][j];
    // effective_grad: -g when maximizing, plus weight_decay * p
    T d = gi;
    if (s.decay) {
      const T wd = p[j] * s.weight_decay;
      d = s.maximize ? wd - gi : wd + gi;
    } else if (s.maximize) {
      d = -gi;
    }
    if (s.momentum_on) {
      T* buf = list.buf[k];
      T b = buf[j] * s.momentum;
      b = s.dampening_on ? b + d * s.one_minus_dampening : b + d;
      buf[j] = b;
      d = s.nesterov ? b * s.momentum + d : b;
    }
    p[j] = p[j] + d * s.neg_lr;
  }
}

template <typename T>
T* at(const Tensor& t) {
  return static_cast<T*>(ptr(t));
}

template <typename T>
void run_sgd(const std::vector<SgdTensors>& params, const SgdStep& st, cudaStream_t stream) {
  const SgdNumbers<T> s{static_cast<T>(-st.lr),         static_cast<T>(st.momentum),
                        static_cast<T>(1 - st.dampening), static_cast<T>(st.weight_decay),
                        st.weight_decay != 0,            st.maximize,
                        st.momentum != 0,                st.dampening != 0,
                        st.nesterov};
  for (size_t first = 0; first < params.size(); first += kSgdList) {
    SgdList<T> list{};
    int64_t total = 0;
    for (size_t k = first; k < std::min(params.size(), first + kSgdList); ++k) {
      const int c = list.count++;
      list.p[c] = at<T>(params[k].p);
      list.g[c] = at<T>(params[k].g);
      list.buf[c] = at<T>(params[k].buf);
      list.end[c] = total += params[k].p.numel();
    }
    if (total == 0) continue;
    sgd_list_kernel<T><<<grid_for(total), kThreads, 0, stream>>>(list, s);
    check_launch("sgd_steps", "sgd_list_kernel");
  }
}

}  // namespace
}  // namespace braid::detail::cuda

namespace braid::detail {

bool CudaBackend::sgd_steps(const std::vector<SgdTensors>& params, const SgdStep& s) {
  if (params.empty()) return true;
  const Tensor& p0 = params[0].p;
  const DType t = p0.dtype();
  if (t != kFloat32 && t != kFloat64) return false;
  for (const SgdTensors& q : params) {
    if (q.buf.defined() != (s.momentum != 0)) return false;
    for (const Tensor* u : {&q.p, &q.g, &q.buf}) {
      if (!u->defined()) continue;
      if (u->shape() != q.p.shape() || u->dtype() != t || !u->is_contiguous()) return false;
      BRAID_CHECK_T(TypeError, u->device() == p0.device(), "sgd_steps: operands on different devices (",
                    u->device().str(), " and ", p0.device().str(), "); move them with .to(device) first");
    }
  }
  cuda::Launch l("sgd_steps", p0, {});
  if (t == kFloat32)
    cuda::run_sgd<float>(params, s, l.stream);
  else
    cuda::run_sgd<double>(params, s, l.stream);
  return true;
}

}  // namespace braid::detail
