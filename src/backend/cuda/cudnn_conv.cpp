// The CUDA backend's convolutions on cuDNN: the FusedKernels entries conv2d (bias, residual and
// activation included), conv2d_backward_input, conv2d_backward_weight and
// conv2d_prefers_channels_last. Each declines where cuDNN refuses the case or the build has no
// cuDNN, and the op then runs its composite (im2col + cuBLAS, src/ops/conv.cpp).
#include "backend/cuda/cuda_backend.h"
#include "braid/config.h"

#ifdef BRAID_HAVE_CUDNN
#include <cudnn.h>

#include <array>
#include <climits>
#include <map>
#include <mutex>
#include <string>

#include "backend/cuda/runtime.h"
#include "backend/cudnn_settings.h"
#include "core/internal.h"
#endif

namespace braid::detail {

// Note [cuDNN convolutions]
// The three passes of a 2-d convolution run through cuDNN's convolution API (cudnnConvolution*,
// deprecated in cuDNN 9 in favour of the graph API but complete for these three passes, and the
// API whose algorithm choice PyTorch's benchmark mode made familiar).
//
// Dtypes. cuDNN reads float32 and float64 as they are; float32 runs on FMA kernels only
// (CUDNN_FMA_MATH), so that results are float32 sums like the composite's, never TF32's.
// Half operands with a half output (Note [Half outputs] in src/ops/conv.cpp: autocast's half
// activations on a GPU, their half gradients in backward) run as PyTorch runs them, in cuDNN's
// PSEUDO_HALF_CONFIG / PSEUDO_BFLOAT16_CONFIG: x, w and y described as CUDNN_DATA_HALF or
// CUDNN_DATA_BFLOAT16, the convolution's compute type CUDNN_DATA_FLOAT, tensor-op math
// (CUDNN_TENSOR_OP_MATH): the tensor cores at the half rate, float32 accumulation, one rounding
// into y, with no widening pass and no float32 intermediate. cudnnAddTensor wants the bias of y's
// dtype (its two descriptors of one data type), so a float32 bias (autocast's) is rounded to it
// first, C_out values, and added to the rounded product: a second rounding, PyTorch's arithmetic
// (its autocast rounds the bias too). A residual is blended in by the pass (beta = 1, in float32).
// Half operands with a float32 output (conv_transpose2d with a bias under autocast, or half
// operands whose result is wanted in float32) are widened to float32 scratch first and run with
// TF32 tensor cores allowed (CUDNN_DEFAULT_MATH): every float16 and bfloat16 value is exact in TF32
// (10 mantissa bits, float32's exponent range), so the tensor cores multiply the rounded operands
// exactly and accumulate in float32, which is the composite's arithmetic; the price is the
// widening pass, and TF32's rate. A product with one half and one float32 operand stays on FMA.
//
// Layouts. cuDNN's NHWC kernels want the filter in KRSC order too: a convolution whose output is
// channels-last runs in NHWC, its input and filter copied into that layout where they are not (the
// filter of a depthwise or 1x1 convolution already is); otherwise in NCHW. In backward (Note
// [Channels-last training] in src/ops/conv.cpp) the data pass runs in gx's layout, and the filter
// pass in NHWC where x or gy is channels-last, its KRSC filter gradient copied into the contiguous
// gw. The entries' inputs never mix layouts inside one cuDNN call. conv2d_prefers_channels_last is
// true for half operands, which run on tensor cores, whose kernels are NHWC ones, in inference and
// training alike.
//
// Plans. The algorithm of each geometry (pass, shapes, window, groups, dtype, layout, math type) is
// chosen once per device and kept in a table: by default cuDNN's heuristics' first choice that it
// says it supports (cudnnGet*Algorithm_v7), with its workspace size; with BRAID_CUDNN_BENCHMARK=1
// or braid::set_cudnn_benchmark(true), every algorithm is timed on that first call
// (cudnnFind*AlgorithmEx, on a scratch output, with a workspace as large as the largest candidate
// asks for, up to kMaxFindWorkspace) and the fastest kept. A case cuDNN refuses is kept as refused.
// Counts of each outcome are in libbraid (cudnn_conv_counts, backend/cudnn_settings.h) for tests.
//
// Memory. Workspaces and scratch operands are tensors on the device, so they come from braid's
// caching allocator (the device's stream-ordered pool) and show in the memory statistics; nothing
// here calls cudaMalloc.
//
// Epilogue. A residual is the output's starting value, copied in unless it is the output itself,
// and cuDNN adds the product to it (beta = 1); the bias follows (cudnnAddTensor), then the
// activation runs in place with the backend's own unary kernel, the one the composite would run.
// So the sums are (conv + residual) + bias where the composite adds (conv + bias) + residual: equal
// up to rounding. On a half y each of the three steps rounds to y's dtype (the residual, of y's
// dtype, blended in float32 by the pass; the bias rounded to y's dtype; the activation's half
// arithmetic, Note [Half arithmetic]) where the composite rounds once at the end, as PyTorch's half
// convolutions do. An epilogue's scale or shift declines.
//
// Handles and errors. One cuDNN handle per device, made on first use and bound to the device's
// stream (runtime.cpp), as cuBLAS's in matmul.cpp. A status in cuDNN's NOT_SUPPORTED family
// declines; every other status other than success is a braid::Error naming the op, the cuDNN call
// and status, and the tensors' shapes, dtypes and layouts.

#ifndef BRAID_HAVE_CUDNN

bool CudaBackend::conv2d(const Tensor&, const Tensor&, const Tensor&, const Window2d&, int64_t, const Epilogue&,
                         const Tensor&) {
  return false;
}
bool CudaBackend::conv2d_prefers_channels_last(const Tensor&, const Tensor&, const Window2d&, int64_t, bool) {
  return false;
}
bool CudaBackend::conv2d_backward_input(const Tensor&, const Tensor&, const Window2d&, int64_t, const Tensor&) {
  return false;
}
bool CudaBackend::conv2d_backward_weight(const Tensor&, const Tensor&, const Window2d&, int64_t, const Tensor&) {
  return false;
}

#else

namespace {

enum class Pass { Forward, BackwardData, BackwardFilter };

constexpr size_t kMaxFindWorkspace = size_t{1} << 31;  // bytes a timed candidate may ask for

bool channels_last(const Tensor& t) { return t.dim() == 4 && !t.is_contiguous() && t.is_channels_last(); }

// One call of an entry: what its errors name.
class Call {
 public:
  Call(const char* op, std::initializer_list<std::pair<const char*, const Tensor*>> tensors, const Window2d& win,
       int64_t groups)
      : op_(op), win_(win), groups_(groups) {
    for (const auto& [name, t] : tensors)
      if (t->defined())
        what_ += cat(what_.empty() ? "" : ", ", name, " ", shape_str(t->shape()), " ", dtype_name(t->dtype()),
                     channels_last(*t) ? " channels-last" : "");
  }
  // True on success, false where cuDNN does not support the case; throws on any other status.
  bool ok(cudnnStatus_t s, const char* call) const {
    if (s == CUDNN_STATUS_SUCCESS) return true;
    if (s >= CUDNN_STATUS_NOT_SUPPORTED && s < CUDNN_STATUS_INTERNAL_ERROR) return false;
    fail(s, call);
  }
  [[noreturn]] void fail(cudnnStatus_t s, const char* call) const {
    throw Error(cat(op_, ": cuDNN's ", call, " returned ", cudnnGetErrorString(s), " (", static_cast<int>(s),
                    ") for ", what_, "; kernel ", win_.kh, "x", win_.kw, ", stride (", win_.sh, ", ", win_.sw,
                    "), padding (", win_.ph, ", ", win_.pw, "), dilation (", win_.dh, ", ", win_.dw, "), groups ",
                    groups_));
  }
  void check(cudnnStatus_t s, const char* call) const {
    if (s != CUDNN_STATUS_SUCCESS) fail(s, call);
  }

 private:
  const char* op_;
  Window2d win_;
  int64_t groups_;
  std::string what_;
};

// One handle per device, bound to the device's stream; made on first use and kept for the process.
cudnnHandle_t handle(int device, const Call& c) {
  static std::array<std::once_flag, cuda::kMaxDevices> once;
  static std::array<cudnnHandle_t, cuda::kMaxDevices> handles{};
  std::call_once(once[static_cast<size_t>(device)], [&] {
    cudnnHandle_t h = nullptr;
    c.check(cudnnCreate(&h), "cudnnCreate");
    c.check(cudnnSetStream(h, cuda::stream(device)), "cudnnSetStream");
    handles[static_cast<size_t>(device)] = h;
  });
  return handles[static_cast<size_t>(device)];
}

// Descriptors, destroyed with the call.
template <typename T, cudnnStatus_t (*Destroy)(T)>
struct Desc {
  T d = nullptr;
  Desc() = default;
  Desc(const Desc&) = delete;
  Desc& operator=(const Desc&) = delete;
  ~Desc() {
    if (d) Destroy(d);
  }
};
using TensorDesc = Desc<cudnnTensorDescriptor_t, cudnnDestroyTensorDescriptor>;
using FilterDesc = Desc<cudnnFilterDescriptor_t, cudnnDestroyFilterDescriptor>;
using ConvDesc = Desc<cudnnConvolutionDescriptor_t, cudnnDestroyConvolutionDescriptor>;

cudnnDataType_t data_type(DType t) {
  return t == kFloat64 ? CUDNN_DATA_DOUBLE : t == kFloat16 ? CUDNN_DATA_HALF : t == kBFloat16 ? CUDNN_DATA_BFLOAT16
                                                                                              : CUDNN_DATA_FLOAT;
}

// An NCHW-shaped tensor as cuDNN reads it, its strides those of its layout (dense in either).
void describe(TensorDesc& desc, const Tensor& t, bool nhwc, const Call& c) {
  const Shape& s = t.shape();
  const int n = static_cast<int>(s[0]), ch = static_cast<int>(s[1]), h = static_cast<int>(s[2]),
            w = static_cast<int>(s[3]);
  c.check(cudnnCreateTensorDescriptor(&desc.d), "cudnnCreateTensorDescriptor");
  const cudnnStatus_t st = nhwc ? cudnnSetTensor4dDescriptorEx(desc.d, data_type(t.dtype()), n, ch, h, w, h * w * ch, 1,
                                                                w * ch, ch)
                                : cudnnSetTensor4dDescriptorEx(desc.d, data_type(t.dtype()), n, ch, h, w, ch * h * w,
                                                                h * w, w, 1);
  c.check(st, "cudnnSetTensor4dDescriptorEx");
}

// The three passes' shared description: activations x and y (y the convolution's output), filter
// w, the convolution, and their memory (each pass writes one of them).
struct Problem {
  TensorDesc x, y;
  FilterDesc w;
  ConvDesc conv;
  void *xp = nullptr, *wp = nullptr, *yp = nullptr;
  int64_t out_bytes = 0;  // the size of what the pass writes, for a timing run's scratch output
};

// The convolution API of each pass.
template <Pass P>
struct Api;
template <>
struct Api<Pass::Forward> {
  using Perf = cudnnConvolutionFwdAlgoPerf_t;
  using Algo = cudnnConvolutionFwdAlgo_t;
  static constexpr int kCount = CUDNN_CONVOLUTION_FWD_ALGO_COUNT;
  static constexpr const char* kNames[4] = {"cudnnGetConvolutionForwardAlgorithm_v7",
                                            "cudnnFindConvolutionForwardAlgorithmEx",
                                            "cudnnGetConvolutionForwardWorkspaceSize", "cudnnConvolutionForward"};
  static cudnnStatus_t heuristics(cudnnHandle_t h, const Problem& p, int* got, Perf* perf) {
    return cudnnGetConvolutionForwardAlgorithm_v7(h, p.x.d, p.w.d, p.conv.d, p.y.d, kCount, got, perf);
  }
  static cudnnStatus_t find(cudnnHandle_t h, const Problem& p, void* out, int* got, Perf* perf, void* ws, size_t n) {
    return cudnnFindConvolutionForwardAlgorithmEx(h, p.x.d, p.xp, p.w.d, p.wp, p.conv.d, p.y.d, out, kCount, got, perf,
                                                  ws, n);
  }
  static cudnnStatus_t workspace(cudnnHandle_t h, const Problem& p, Algo a, size_t* n) {
    return cudnnGetConvolutionForwardWorkspaceSize(h, p.x.d, p.w.d, p.conv.d, p.y.d, a, n);
  }
  static cudnnStatus_t run(cudnnHandle_t h, const Problem& p, Algo a, void* ws, size_t n, const void* alpha,
                           const void* beta) {
    return cudnnConvolutionForward(h, alpha, p.x.d, p.xp, p.w.d, p.wp, p.conv.d, a, ws, n, beta, p.y.d, p.yp);
  }
};
template <>
struct Api<Pass::BackwardData> {
  using Perf = cudnnConvolutionBwdDataAlgoPerf_t;
  using Algo = cudnnConvolutionBwdDataAlgo_t;
  static constexpr int kCount = CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT;
  static constexpr const char* kNames[4] = {
      "cudnnGetConvolutionBackwardDataAlgorithm_v7", "cudnnFindConvolutionBackwardDataAlgorithmEx",
      "cudnnGetConvolutionBackwardDataWorkspaceSize", "cudnnConvolutionBackwardData"};
  static cudnnStatus_t heuristics(cudnnHandle_t h, const Problem& p, int* got, Perf* perf) {
    return cudnnGetConvolutionBackwardDataAlgorithm_v7(h, p.w.d, p.y.d, p.conv.d, p.x.d, kCount, got, perf);
  }
  static cudnnStatus_t find(cudnnHandle_t h, const Problem& p, void* out, int* got, Perf* perf, void* ws, size_t n) {
    return cudnnFindConvolutionBackwardDataAlgorithmEx(h, p.w.d, p.wp, p.y.d, p.yp, p.conv.d, p.x.d, out, kCount, got,
                                                       perf, ws, n);
  }
  static cudnnStatus_t workspace(cudnnHandle_t h, const Problem& p, Algo a, size_t* n) {
    return cudnnGetConvolutionBackwardDataWorkspaceSize(h, p.w.d, p.y.d, p.conv.d, p.x.d, a, n);
  }
  static cudnnStatus_t run(cudnnHandle_t h, const Problem& p, Algo a, void* ws, size_t n, const void* alpha,
                           const void* beta) {
    return cudnnConvolutionBackwardData(h, alpha, p.w.d, p.wp, p.y.d, p.yp, p.conv.d, a, ws, n, beta, p.x.d, p.xp);
  }
};
template <>
struct Api<Pass::BackwardFilter> {
  using Perf = cudnnConvolutionBwdFilterAlgoPerf_t;
  using Algo = cudnnConvolutionBwdFilterAlgo_t;
  static constexpr int kCount = CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT;
  static constexpr const char* kNames[4] = {
      "cudnnGetConvolutionBackwardFilterAlgorithm_v7", "cudnnFindConvolutionBackwardFilterAlgorithmEx",
      "cudnnGetConvolutionBackwardFilterWorkspaceSize", "cudnnConvolutionBackwardFilter"};
  static cudnnStatus_t heuristics(cudnnHandle_t h, const Problem& p, int* got, Perf* perf) {
    return cudnnGetConvolutionBackwardFilterAlgorithm_v7(h, p.x.d, p.y.d, p.conv.d, p.w.d, kCount, got, perf);
  }
  static cudnnStatus_t find(cudnnHandle_t h, const Problem& p, void* out, int* got, Perf* perf, void* ws, size_t n) {
    return cudnnFindConvolutionBackwardFilterAlgorithmEx(h, p.x.d, p.xp, p.y.d, p.yp, p.conv.d, p.w.d, out, kCount, got,
                                                         perf, ws, n);
  }
  static cudnnStatus_t workspace(cudnnHandle_t h, const Problem& p, Algo a, size_t* n) {
    return cudnnGetConvolutionBackwardFilterWorkspaceSize(h, p.x.d, p.y.d, p.conv.d, p.w.d, a, n);
  }
  static cudnnStatus_t run(cudnnHandle_t h, const Problem& p, Algo a, void* ws, size_t n, const void* alpha,
                           const void* beta) {
    return cudnnConvolutionBackwardFilter(h, alpha, p.x.d, p.xp, p.y.d, p.yp, p.conv.d, a, ws, n, beta, p.w.d, p.wp);
  }
};

// A geometry's algorithm and workspace, or refused.
struct Plan {
  bool supported = false;
  int algo = 0;
  size_t workspace = 0;
};
using Key = std::array<int64_t, 21>;

struct PlanTable {
  std::mutex mu;
  std::map<Key, Plan> plans;
};
PlanTable& plan_table(int device) {
  static std::array<PlanTable, cuda::kMaxDevices> tables;
  return tables[static_cast<size_t>(device)];
}

// Device memory of nbytes from the pool, as a tensor (counted in the memory statistics).
Tensor device_bytes(int device, int64_t nbytes) {
  return new_tensor({std::max<int64_t>(nbytes, 1)}, kUInt8, Device::cuda(device));
}

template <Pass P>
Plan heuristic_plan(cudnnHandle_t h, const Problem& p, const Call& c) {
  using A = Api<P>;
  std::array<typename A::Perf, A::kCount> perf{};
  int got = 0;
  if (!c.ok(A::heuristics(h, p, &got, perf.data()), A::kNames[0])) return {};
  for (int i = 0; i < got; ++i) {
    size_t bytes = 0;
    if (perf[i].status != CUDNN_STATUS_SUCCESS || !c.ok(A::workspace(h, p, perf[i].algo, &bytes), A::kNames[2]))
      continue;
    return {true, static_cast<int>(perf[i].algo), bytes};
  }
  return {};
}

template <Pass P>
Plan timed_plan(cudnnHandle_t h, const Problem& p, const Call& c, int device) {
  using A = Api<P>;
  size_t most = 0;
  for (int a = 0; a < A::kCount; ++a) {
    size_t bytes = 0;
    if (A::workspace(h, p, static_cast<typename A::Algo>(a), &bytes) == CUDNN_STATUS_SUCCESS && bytes <= kMaxFindWorkspace)
      most = std::max(most, bytes);
  }
  // The timing runs write a scratch output: the pass's own may hold a residual still to be read.
  const Tensor out = device_bytes(device, p.out_bytes), ws = device_bytes(device, static_cast<int64_t>(most));
  std::array<typename A::Perf, A::kCount> perf{};
  int got = 0;
  if (!c.ok(A::find(h, p, device_data(out), &got, perf.data(), device_data(ws), most), A::kNames[1])) return {};
  for (int i = 0; i < got; ++i)
    if (perf[i].status == CUDNN_STATUS_SUCCESS && perf[i].memory <= most)
      return {true, static_cast<int>(perf[i].algo), perf[i].memory};
  return {};
}

// The plan of key on device: from the table, or made now and kept.
template <Pass P>
Plan plan_for(cudnnHandle_t h, const Problem& p, const Call& c, int device, const Key& key) {
  PlanTable& table = plan_table(device);
  CudnnConvCounts& counts = cudnn_conv_counts();
  {
    std::lock_guard<std::mutex> lock(table.mu);
    if (auto it = table.plans.find(key); it != table.plans.end()) {
      ++counts.reused;
      if (!it->second.supported) ++counts.declined;
      return it->second;
    }
  }
  const bool timed = cudnn_benchmark_on();
  const Plan plan = timed ? timed_plan<P>(h, p, c, device) : heuristic_plan<P>(h, p, c);
  ++(!plan.supported ? counts.declined : timed ? counts.benchmarked : counts.heuristic);
  std::lock_guard<std::mutex> lock(table.mu);
  table.plans.emplace(key, plan);
  return plan;
}

// Everything a pass needs, from the tensors it reads and writes (x, w and y of the forward
// convolution, whichever of them the pass writes): operands widened and laid out as cuDNN takes
// them, descriptors, the plan. Returns false to decline. t is the dtype of all three descriptors:
// float32 or float64 (half operands widened to float32), or a half dtype (the PSEUDO configs).
class Pass2d {
 public:
  Pass2d(CudaBackend& b, const Call& c, const Tensor& x, const Tensor& w, const Tensor& y, const Window2d& win,
         int64_t groups, bool nhwc, DType t)
      : b_(b), c_(c), win_(win), groups_(groups), nhwc_(nhwc), t_(t), x_(x), w_(w), y_(y) {}

  // The operands as read: dtype t (half widened) in the pass's layout; for a written tensor its
  // own memory, which must be of that dtype and layout already.
  Tensor operand(const Tensor& v, bool filter) const {
    const bool filter_same = filter && (v.shape()[1] == 1 || (v.shape()[2] == 1 && v.shape()[3] == 1));
    const bool laid = !nhwc_ ? v.is_contiguous() : filter_same ? v.is_contiguous() || v.is_channels_last()
                                                               : v.is_channels_last();
    if (v.dtype() == t_ && laid) return v;
    Tensor out = nhwc_ && !filter_same ? new_channels_last(v.shape(), t_, v.device()) : new_tensor(v.shape(), t_, v.device());
    b_.copy(v, out);
    return out;
  }

  template <Pass P>
  bool prepare(const Tensor& xs, const Tensor& ws, const Tensor& ys) {
    const Shape &xs_shape = x_.shape(), &w_shape = w_.shape();
    for (const Tensor* v : {&x_, &w_, &y_})
      if (v->numel() == 0 || v->numel() > INT_MAX) return false;
    // cuDNN pads both sides alike: an output of another size had uneven padding.
    const auto out_size = [](int64_t in, int64_t pad, int64_t d, int64_t k, int64_t s) {
      return (in + 2 * pad - d * (k - 1) - 1) / s + 1;
    };
    if (out_size(win_.h, win_.ph, win_.dh, win_.kh, win_.sh) != win_.oh ||
        out_size(win_.w, win_.pw, win_.dw, win_.kw, win_.sw) != win_.ow)
      return false;
    // TF32 only where both operands of the product are half (the note's dtypes).
    const bool tf32 = P == Pass::Forward        ? is_half(x_.dtype()) && is_half(w_.dtype())
                      : P == Pass::BackwardData ? is_half(y_.dtype()) && is_half(w_.dtype())
                                                : is_half(x_.dtype()) && is_half(y_.dtype());
    device_ = x_.device().index;
    h_ = handle(device_, c_);
    describe(p_.x, xs, nhwc_, c_);
    describe(p_.y, ys, nhwc_, c_);
    c_.check(cudnnCreateFilterDescriptor(&p_.w.d), "cudnnCreateFilterDescriptor");
    c_.check(cudnnSetFilter4dDescriptor(p_.w.d, data_type(t_), nhwc_ ? CUDNN_TENSOR_NHWC : CUDNN_TENSOR_NCHW,
                                        static_cast<int>(w_shape[0]), static_cast<int>(w_shape[1]),
                                        static_cast<int>(w_shape[2]), static_cast<int>(w_shape[3])),
             "cudnnSetFilter4dDescriptor");
    c_.check(cudnnCreateConvolutionDescriptor(&p_.conv.d), "cudnnCreateConvolutionDescriptor");
    c_.check(cudnnSetConvolution2dDescriptor(p_.conv.d, static_cast<int>(win_.ph), static_cast<int>(win_.pw),
                                             static_cast<int>(win_.sh), static_cast<int>(win_.sw),
                                             static_cast<int>(win_.dh), static_cast<int>(win_.dw),
                                             CUDNN_CROSS_CORRELATION,
                                             is_half(t_) ? CUDNN_DATA_FLOAT : data_type(t_)),
             "cudnnSetConvolution2dDescriptor");
    c_.check(cudnnSetConvolutionGroupCount(p_.conv.d, static_cast<int>(groups_)), "cudnnSetConvolutionGroupCount");
    const cudnnMathType_t math = t_ == kFloat64 ? CUDNN_DEFAULT_MATH
                                 : is_half(t_)  ? CUDNN_TENSOR_OP_MATH
                                 : tf32         ? CUDNN_DEFAULT_MATH
                                                : CUDNN_FMA_MATH;
    c_.check(cudnnSetConvolutionMathType(p_.conv.d, math), "cudnnSetConvolutionMathType");
    p_.xp = device_data(xs);
    p_.wp = device_data(ws);
    p_.yp = device_data(ys);
    const Tensor& out = P == Pass::Forward ? ys : P == Pass::BackwardData ? xs : ws;
    p_.out_bytes = out.numel() * dtype_size(t_);
    const Key key{static_cast<int64_t>(P), xs_shape[0], xs_shape[1], win_.h,  win_.w,  w_shape[0], win_.kh,
                  win_.kw,                 win_.oh,     win_.ow,     win_.sh, win_.sw, win_.ph,    win_.pw,
                  win_.dh,                 win_.dw,     groups_,     static_cast<int64_t>(t_), nhwc_ ? 1 : 0,
                  static_cast<int64_t>(math), 0};
    plan_ = plan_for<P>(h_, p_, c_, device_, key);
    return plan_.supported;
  }

  // Runs the pass into its output (beta = 1: added to what the output holds); false where cuDNN
  // refuses it now (may_decline) or throws.
  template <Pass P>
  bool run(double beta, bool may_decline) {
    const Tensor ws = plan_.workspace ? device_bytes(device_, static_cast<int64_t>(plan_.workspace)) : Tensor();
    const double one = 1;
    const float onef = 1, betaf = static_cast<float>(beta);
    const void* alpha = t_ == kFloat64 ? static_cast<const void*>(&one) : &onef;
    const void* b = t_ == kFloat64 ? static_cast<const void*>(&beta) : &betaf;
    const cudnnStatus_t s = Api<P>::run(h_, p_, static_cast<typename Api<P>::Algo>(plan_.algo),
                                        ws.defined() ? device_data(ws) : nullptr, plan_.workspace, alpha, b);
    if (!c_.ok(s, Api<P>::kNames[3]) && !may_decline) c_.fail(s, Api<P>::kNames[3]);
    if (s == CUDNN_STATUS_SUCCESS) ++cudnn_conv_counts().ran;
    return s == CUDNN_STATUS_SUCCESS;
  }

  cudnnHandle_t handle_() const { return h_; }
  const Problem& problem() const { return p_; }

 private:
  CudaBackend& b_;
  const Call& c_;
  Window2d win_;
  int64_t groups_;
  bool nhwc_;
  DType t_;
  const Tensor &x_, &w_, &y_;
  Problem p_;
  Plan plan_;
  int device_ = 0;
  cudnnHandle_t h_ = nullptr;
};

// The dtype of cuDNN's descriptors for operands a and b and the output out: out's, where it is
// float32 or float64 and each operand is of it or (for float32) a half type, or where out and both
// operands are of one half type (the PSEUDO configs); kInt8 (decline) otherwise.
DType compute_dtype(const Tensor& a, const Tensor& b, const Tensor& out) {
  const DType t = out.dtype();
  if (is_half(t)) return a.dtype() == t && b.dtype() == t ? t : kInt8;
  if (t != kFloat32 && t != kFloat64) return kInt8;
  for (const Tensor* v : {&a, &b})
    if (v->dtype() != t && !(t == kFloat32 && is_half(v->dtype()))) return kInt8;
  return t;
}

}  // namespace

bool CudaBackend::conv2d(const Tensor& x, const Tensor& w, const Tensor& bias, const Window2d& win, int64_t groups,
                         const Epilogue& epilogue, const Tensor& y) {
  const DType t = compute_dtype(x, w, y);
  const Tensor& r = epilogue.residual;
  const bool nhwc = channels_last(y);
  // A half y takes a bias of its dtype or float32 (rounded to y's below).
  if (t == kInt8 || x.dim() != 4 || epilogue.scale != 1 || epilogue.shift != 0 ||
      (bias.defined() && ((bias.dtype() != t && !(is_half(t) && bias.dtype() == kFloat32)) || !bias.is_contiguous())) ||
      (r.defined() && (r.dtype() != t || r.shape() != y.shape() || (nhwc ? !channels_last(r) : !r.is_contiguous()))) ||
      (!nhwc && !y.is_contiguous()) || (is_half(t) ? x.dtype() != t : compute_type(x.dtype()) != t))
    return false;
  const Call c("conv2d", {{"x", &x}, {"w", &w}, {"bias", &bias}, {"y", &y}}, win, groups);
  cuda::DeviceGuard guard(x.device().index);
  Pass2d pass(*this, c, x, w, y, win, groups, nhwc, t);
  const Tensor xs = pass.operand(x, false), ws = pass.operand(w, true);
  if (!pass.prepare<Pass::Forward>(xs, ws, y)) return false;
  const bool in_place = r.defined() && device_data(r) == device_data(y);
  if (r.defined() && !in_place) copy(r, y);
  if (!pass.run<Pass::Forward>(r.defined() ? 1.0 : 0.0, !in_place)) return false;
  if (bias.defined()) {
    // cudnnAddTensor's bias is of y's data type: a float32 bias onto a half y is rounded first.
    Tensor b = bias;
    if (b.dtype() != t) {
      b = new_tensor(bias.shape(), t, bias.device());
      copy(bias, b);
    }
    TensorDesc bias_desc;
    describe(bias_desc, b.view({1, b.numel(), 1, 1}), false, c);
    const double one = 1;
    const float onef = 1;
    const void* alpha = t == kFloat64 ? static_cast<const void*>(&one) : &onef;
    c.check(cudnnAddTensor(pass.handle_(), alpha, bias_desc.d, device_data(b), alpha, pass.problem().y.d, device_data(y)),
            "cudnnAddTensor");
  }
  switch (epilogue.kind) {  // the composite's kernels (apply_activation in src/ops/conv.cpp), in place
    case Epilogue::Kind::None: break;
    case Epilogue::Kind::Relu: unary(UnaryOp::Relu, y, y, 0, 0); break;
    case Epilogue::Kind::Clip: unary(UnaryOp::Clamp, y, y, epilogue.a, epilogue.b); break;
    case Epilogue::Kind::HardSwish: unary(UnaryOp::HardSwish, y, y, 0, 0); break;
    case Epilogue::Kind::HardSigmoid: unary(UnaryOp::HardSigmoid, y, y, epilogue.a, epilogue.b); break;
  }
  return true;
}

bool CudaBackend::conv2d_prefers_channels_last(const Tensor& x, const Tensor& w, const Window2d&, int64_t, bool) {
  return channels_last_rule(x, w);
}

// gx's layout is the pass's (Note [Channels-last training] in src/ops/conv.cpp: channels-last where
// gy arrives so), gy and w copied into it where they are not.
bool CudaBackend::conv2d_backward_input(const Tensor& gy, const Tensor& w, const Window2d& win, int64_t groups,
                                        const Tensor& gx) {
  const DType t = compute_dtype(gy, w, gx);
  const bool nhwc = channels_last(gx);
  if (t == kInt8 || gx.dim() != 4 || (!nhwc && !gx.is_contiguous())) return false;
  const Call c("conv2d_backward_input", {{"gy", &gy}, {"w", &w}, {"gx", &gx}}, win, groups);
  cuda::DeviceGuard guard(gx.device().index);
  Pass2d pass(*this, c, gx, w, gy, win, groups, nhwc, t);
  const Tensor gys = pass.operand(gy, false), ws = pass.operand(w, true);
  return pass.prepare<Pass::BackwardData>(gx, ws, gys) && pass.run<Pass::BackwardData>(0, true);
}

// The pass runs in NHWC where x or gy is channels-last (both then copied into that layout where they
// are not); its filter gradient is then KRSC, written to scratch in that layout and copied into the
// contiguous gw (C_out * C / groups * kh * kw values), but where the two orders coincide.
bool CudaBackend::conv2d_backward_weight(const Tensor& x, const Tensor& gy, const Window2d& win, int64_t groups,
                                         const Tensor& gw) {
  const DType t = compute_dtype(x, gy, gw);
  if (t == kInt8 || gw.dim() != 4 || !gw.is_contiguous()) return false;
  const bool nhwc = channels_last(x) || channels_last(gy);
  const bool same_order = gw.shape()[1] == 1 || (gw.shape()[2] == 1 && gw.shape()[3] == 1);
  const Tensor gws = nhwc && !same_order ? new_channels_last(gw.shape(), gw.dtype(), gw.device()) : gw;
  const Call c("conv2d_backward_weight", {{"x", &x}, {"gy", &gy}, {"gw", &gw}}, win, groups);
  cuda::DeviceGuard guard(x.device().index);
  Pass2d pass(*this, c, x, gws, gy, win, groups, nhwc, t);
  const Tensor xs = pass.operand(x, false), gys = pass.operand(gy, false);
  if (!pass.prepare<Pass::BackwardFilter>(xs, gws, gys) || !pass.run<Pass::BackwardFilter>(0, true)) return false;
  if (gws.storage() != gw.storage()) copy(gws, gw);
  return true;
}

#endif  // BRAID_HAVE_CUDNN

}  // namespace braid::detail
