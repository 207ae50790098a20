// Host emulation of cuDNN's convolution API (shim/cudnn.h; not part of braid): the three passes
// computed naively in double from the descriptors, with the checks and refusals of the real library
// for what braid could get wrong (dimensions, data and compute types, layouts, workspace sizes and
// memory), TF32 rounding of float inputs unless the math type is FMA, and a test hook that makes
// the next call of a named function fail (emu_cudnn_fail), and one that counts the passes run in
// NHWC (emu_cudnn_nhwc_runs). Half descriptors (CUDNN_DATA_HALF,
// CUDNN_DATA_BFLOAT16) with a float compute type are cuDNN's PSEUDO_HALF_CONFIG and
// PSEUDO_BFLOAT16_CONFIG: the half operands read exactly, the sums (and alpha, beta times the
// output's old value) in double, each output element rounded once to float and then to its half
// type (the two roundings can differ from one only at a near-tie); a bfloat16 problem
// with a half compute type is refused as cuDNN refuses it. cudnnAddTensor wants its two tensors of
// one data type, as cuDNN's (BAD_PARAM otherwise), and computes in double, rounding once.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "cudnn.h"

namespace braid::detail { float half_to_float(uint16_t); float bfloat16_to_float(uint16_t); uint16_t float_to_half(float); uint16_t float_to_bfloat16(float); }
void emu_check_device(const void* p, size_t n);  // emu_runtime.cpp: aborts unless p .. p + n is device memory

struct cudnnContext { cudaStream_t stream = nullptr; };
struct cudnnTensorStruct { cudnnDataType_t t = CUDNN_DATA_FLOAT; int d[4] = {}; int s[4] = {}; bool set = false; };
struct cudnnFilterStruct { cudnnDataType_t t = CUDNN_DATA_FLOAT; cudnnTensorFormat_t f = CUDNN_TENSOR_NCHW; int d[4] = {}; bool set = false; };
struct cudnnConvolutionStruct {
  int pad[2] = {}, stride[2] = {1, 1}, dil[2] = {1, 1}, groups = 1;
  cudnnConvolutionMode_t mode = CUDNN_CROSS_CORRELATION;
  cudnnDataType_t compute = CUDNN_DATA_FLOAT;
  cudnnMathType_t math = CUDNN_DEFAULT_MATH;
  bool set = false;
};

namespace {
std::mutex mu;
std::map<std::string, int> failing;  // emu_cudnn_fail's marks

cudnnStatus_t injected(const char* call) {
  std::lock_guard<std::mutex> l(mu);
  auto it = failing.find(call);
  if (it == failing.end()) return CUDNN_STATUS_SUCCESS;
  const int s = it->second;
  failing.erase(it);
  return static_cast<cudnnStatus_t>(s);
}
#define EMU_HOOK(name) if (cudnnStatus_t hooked = injected(name)) return hooked

size_t esize(cudnnDataType_t t) { return t == CUDNN_DATA_DOUBLE ? 8 : t == CUDNN_DATA_FLOAT ? 4 : 2; }
double tf32(double v) {  // float rounded to 10 mantissa bits, to nearest even (TF32's inputs)
  uint32_t b; float f = static_cast<float>(v); std::memcpy(&b, &f, 4);
  if ((b & 0x7f800000u) == 0x7f800000u) return v;
  b = (b + 0xfffu + ((b >> 13) & 1u)) & ~0x1fffu;
  std::memcpy(&f, &b, 4);
  return f;
}
double load(const void* p, cudnnDataType_t t, int64_t i) {
  switch (t) {
    case CUDNN_DATA_FLOAT: return static_cast<const float*>(p)[i];
    case CUDNN_DATA_DOUBLE: return static_cast<const double*>(p)[i];
    case CUDNN_DATA_HALF: return braid::detail::half_to_float(static_cast<const uint16_t*>(p)[i]);
    case CUDNN_DATA_BFLOAT16: return braid::detail::bfloat16_to_float(static_cast<const uint16_t*>(p)[i]);
  }
  std::abort();
}
void store(void* p, cudnnDataType_t t, int64_t i, double v) {
  switch (t) {
    case CUDNN_DATA_FLOAT: static_cast<float*>(p)[i] = static_cast<float>(v); return;
    case CUDNN_DATA_DOUBLE: static_cast<double*>(p)[i] = v; return;
    case CUDNN_DATA_HALF: static_cast<uint16_t*>(p)[i] = braid::detail::float_to_half(static_cast<float>(v)); return;
    case CUDNN_DATA_BFLOAT16: static_cast<uint16_t*>(p)[i] = braid::detail::float_to_bfloat16(static_cast<float>(v)); return;
  }
}
int64_t at(const cudnnTensorStruct& t, int64_t n, int64_t c, int64_t h, int64_t w) {
  return n * t.s[0] + c * t.s[1] + h * t.s[2] + w * t.s[3];
}
int64_t at(const cudnnFilterStruct& f, int64_t k, int64_t c, int64_t i, int64_t j) {
  const int C = f.d[1], R = f.d[2], S = f.d[3];
  return f.f == CUDNN_TENSOR_NCHW ? ((k * C + c) * R + i) * S + j : ((k * R + i) * S + j) * C + c;
}
int64_t extent(const cudnnTensorStruct& t) {
  int64_t e = 1;
  for (int a = 0; a < 4; ++a) e += int64_t{t.d[a] - 1} * t.s[a];
  return e;
}
// 1: packed NCHW, 2: packed NHWC, 3: both (size-1 axes), 0: neither.
int layout(const cudnnTensorStruct& t) {
  const int c = t.d[1], h = t.d[2], w = t.d[3];
  auto same = [&](int a, int b, int cc, int d) {
    const int want[4] = {a, b, cc, d};
    for (int i = 0; i < 4; ++i) if (t.d[i] != 1 && t.s[i] != want[i]) return false;
    return true;
  };
  return (same(c * h * w, h * w, w, 1) ? 1 : 0) | (same(h * w * c, 1, w * c, c) ? 2 : 0);
}
int64_t out_dim(int in, int pad, int dil, int k, int stride) { return (int64_t{in} + 2 * pad - int64_t{dil} * (k - 1) - 1) / stride + 1; }

// What real cuDNN says of a problem: success, a bad parameter, or not supported.
cudnnStatus_t check(const cudnnTensorStruct* x, const cudnnFilterStruct* w, const cudnnConvolutionStruct* c,
                    const cudnnTensorStruct* y) {
  if (!x || !w || !c || !y || !x->set || !w->set || !c->set || !y->set) return CUDNN_STATUS_BAD_PARAM;
  if (x->d[1] != w->d[1] * c->groups || w->d[0] % c->groups || y->d[1] != w->d[0] || y->d[0] != x->d[0] ||
      y->d[2] != out_dim(x->d[2], c->pad[0], c->dil[0], w->d[2], c->stride[0]) ||
      y->d[3] != out_dim(x->d[3], c->pad[1], c->dil[1], w->d[3], c->stride[1]))
    return CUDNN_STATUS_BAD_PARAM;
  if (x->t != w->t || x->t != y->t || c->mode != CUDNN_CROSS_CORRELATION) return CUDNN_STATUS_NOT_SUPPORTED;
  const bool compute_ok = x->t == CUDNN_DATA_DOUBLE ? c->compute == CUDNN_DATA_DOUBLE
                          : x->t == CUDNN_DATA_HALF ? c->compute == CUDNN_DATA_FLOAT || c->compute == CUDNN_DATA_HALF
                                                    : c->compute == CUDNN_DATA_FLOAT;
  if (!compute_ok) return CUDNN_STATUS_NOT_SUPPORTED;
  const int lx = layout(*x), ly = layout(*y), lw = w->f == CUDNN_TENSOR_NCHW ? 1 : 2;
  // Packed tensors of one layout, the filter's included; float64 has no NHWC kernels.
  if (!(lx & ly & lw)) return CUDNN_STATUS_NOT_SUPPORTED_LAYOUT;
  if (x->t == CUDNN_DATA_DOUBLE && lw == 2) return CUDNN_STATUS_NOT_SUPPORTED_LAYOUT;
  return CUDNN_STATUS_SUCCESS;
}

// The emulated algorithms: 0 and 1 of every pass (and GEMM forward) run, 1 and 2 with a workspace.
bool runs(int algo) { return algo >= 0 && algo <= 1; }
size_t workspace_of(int algo, const cudnnTensorStruct& y) {
  return algo == 0 ? 0 : 4096 + static_cast<size_t>(y.d[0]) * y.d[1] * y.d[2] * y.d[3] * 4;
}

enum class Pass { Fwd, Data, Filter };
long nhwc_runs[3];  // the passes computed in NHWC (an NHWC filter), per Pass, for emu_cudnn_nhwc_runs
// The convolution of x and w into y, or its adjoints (into x or into w); alpha and beta as cuDNN's.
void compute(Pass pass, const cudnnTensorStruct& x, const void* xp, const cudnnFilterStruct& w, const void* wp,
             const cudnnConvolutionStruct& c, const cudnnTensorStruct& y, const void* yp, void* out,
             const void* alpha_p, const void* beta_p) {
  if (w.f == CUDNN_TENSOR_NHWC) {
    std::lock_guard<std::mutex> l(mu);
    ++nhwc_runs[static_cast<int>(pass)];
  }
  const bool dbl = x.t == CUDNN_DATA_DOUBLE;
  const double alpha = dbl ? *static_cast<const double*>(alpha_p) : *static_cast<const float*>(alpha_p);
  const double beta = dbl ? *static_cast<const double*>(beta_p) : *static_cast<const float*>(beta_p);
  const bool round = x.t == CUDNN_DATA_FLOAT && c.math != CUDNN_FMA_MATH;
  auto in = [&](double v) { return round ? tf32(v) : v; };
  const int N = x.d[0], C = x.d[1], H = x.d[2], W = x.d[3], K = w.d[0], Cg = w.d[1], R = w.d[2], S = w.d[3];
  const int OH = y.d[2], OW = y.d[3], Kg = K / c.groups;
  std::vector<double> acc(pass == Pass::Fwd ? size_t(N) * K * OH * OW : pass == Pass::Data ? size_t(N) * C * H * W
                                                                                           : size_t(K) * Cg * R * S, 0.0);
  for (int n = 0; n < N; ++n)
    for (int k = 0; k < K; ++k)
      for (int oy = 0; oy < OH; ++oy)
        for (int ox = 0; ox < OW; ++ox)
          for (int cg = 0; cg < Cg; ++cg)
            for (int i = 0; i < R; ++i)
              for (int j = 0; j < S; ++j) {
                const int64_t iy = int64_t{oy} * c.stride[0] - c.pad[0] + int64_t{i} * c.dil[0];
                const int64_t ix = int64_t{ox} * c.stride[1] - c.pad[1] + int64_t{j} * c.dil[1];
                if (iy < 0 || iy >= H || ix < 0 || ix >= W) continue;
                const int ch = k / Kg * Cg + cg;
                const double wv = pass == Pass::Filter ? 0 : in(load(wp, w.t, at(w, k, cg, i, j)));
                const double xv = pass == Pass::Data ? 0 : in(load(xp, x.t, at(x, n, ch, iy, ix)));
                const double yv = pass == Pass::Fwd ? 0 : in(load(yp, y.t, at(y, n, k, oy, ox)));
                if (pass == Pass::Fwd) acc[((size_t(n) * K + k) * OH + oy) * OW + ox] += xv * wv;
                else if (pass == Pass::Data) acc[((size_t(n) * C + ch) * H + iy) * W + ix] += yv * wv;
                else acc[((size_t(k) * Cg + cg) * R + i) * S + j] += xv * yv;
              }
  size_t e = 0;
  auto put = [&](int64_t o, cudnnDataType_t t) {
    const double old = beta != 0 ? beta * load(out, t, o) : 0;
    store(out, t, o, alpha * acc[e++] + old);
  };
  if (pass == Pass::Fwd)
    for (int n = 0; n < N; ++n) for (int k = 0; k < K; ++k) for (int a = 0; a < OH; ++a) for (int b = 0; b < OW; ++b) put(at(y, n, k, a, b), y.t);
  else if (pass == Pass::Data)
    for (int n = 0; n < N; ++n) for (int ch = 0; ch < C; ++ch) for (int a = 0; a < H; ++a) for (int b = 0; b < W; ++b) put(at(x, n, ch, a, b), x.t);
  else
    for (int k = 0; k < K; ++k) for (int cg = 0; cg < Cg; ++cg) for (int a = 0; a < R; ++a) for (int b = 0; b < S; ++b) put(at(w, k, cg, a, b), w.t);
}

int64_t filter_numel(const cudnnFilterStruct& w) { return int64_t{w.d[0]} * w.d[1] * w.d[2] * w.d[3]; }

// One pass's API over the shared pieces.
template <typename Perf, typename Algo>
cudnnStatus_t heuristics(cudnnStatus_t ok, const cudnnTensorStruct& y, int requested, int* returned, Perf* perf, int count) {
  if (ok != CUDNN_STATUS_SUCCESS && ok != CUDNN_STATUS_NOT_SUPPORTED && ok != CUDNN_STATUS_NOT_SUPPORTED_LAYOUT) return ok;
  const int order[] = {1, 0};  // the heuristics' choice first
  *returned = 0;
  for (int i = 0; i < count && *returned < requested; ++i) {
    const int a = i < 2 ? order[i] : i;
    Perf p{};
    p.algo = static_cast<Algo>(a);
    p.status = ok == CUDNN_STATUS_SUCCESS && runs(a) ? CUDNN_STATUS_SUCCESS : CUDNN_STATUS_NOT_SUPPORTED;
    p.time = -1;
    p.memory = runs(a) ? workspace_of(a, y) : 0;
    perf[(*returned)++] = p;
  }
  return CUDNN_STATUS_SUCCESS;
}
cudnnStatus_t workspace(cudnnStatus_t ok, int algo, const cudnnTensorStruct& y, size_t* n) {
  if (ok != CUDNN_STATUS_SUCCESS) return ok;
  if (!runs(algo)) return CUDNN_STATUS_NOT_SUPPORTED;
  *n = workspace_of(algo, y);
  return CUDNN_STATUS_SUCCESS;
}
cudnnStatus_t execute(cudnnStatus_t ok, int algo, const cudnnTensorStruct& y, void* ws, size_t wsn) {
  if (ok != CUDNN_STATUS_SUCCESS) return ok;
  if (!runs(algo)) return CUDNN_STATUS_NOT_SUPPORTED;
  if (wsn < workspace_of(algo, y)) return CUDNN_STATUS_BAD_PARAM;
  if (wsn) { emu_check_device(ws, wsn); std::memset(ws, 0x5A, wsn); }  // the algorithm's scratch
  return CUDNN_STATUS_SUCCESS;
}
template <typename Perf, typename Algo>
cudnnStatus_t find(cudnnStatus_t ok, const cudnnTensorStruct& y, void* ws, size_t wsn, int requested, int* returned,
                   Perf* perf, int count) {
  if (ok != CUDNN_STATUS_SUCCESS) return ok;
  if (wsn) emu_check_device(ws, wsn);
  *returned = 0;
  for (int a = 0; a < count && *returned < requested; ++a) {  // fastest first: the one without workspace
    Perf p{};
    p.algo = static_cast<Algo>(a);
    p.status = !runs(a) ? CUDNN_STATUS_NOT_SUPPORTED : workspace_of(a, y) > wsn ? CUDNN_STATUS_INTERNAL_ERROR_DEVICE_ALLOCATION_FAILED : CUDNN_STATUS_SUCCESS;
    p.time = runs(a) ? 0.5f + a : -1;
    p.memory = runs(a) ? workspace_of(a, y) : 0;
    perf[(*returned)++] = p;
  }
  return CUDNN_STATUS_SUCCESS;
}
}  // namespace

extern "C" void emu_cudnn_fail(const char* call, int status) { std::lock_guard<std::mutex> l(mu); failing[call] = status; }
// The passes computed in NHWC so far: forward, backward-data, backward-filter (a test's probe).
extern "C" long emu_cudnn_nhwc_runs(int pass) { std::lock_guard<std::mutex> l(mu); return nhwc_runs[pass]; }

cudnnStatus_t cudnnCreate(cudnnHandle_t* h) { EMU_HOOK("cudnnCreate"); *h = new cudnnContext; return CUDNN_STATUS_SUCCESS; }
cudnnStatus_t cudnnDestroy(cudnnHandle_t h) { delete h; return CUDNN_STATUS_SUCCESS; }
cudnnStatus_t cudnnSetStream(cudnnHandle_t h, cudaStream_t s) { if (!s) return CUDNN_STATUS_BAD_PARAM; h->stream = s; return CUDNN_STATUS_SUCCESS; }
const char* cudnnGetErrorString(cudnnStatus_t s) {
  switch (s) {
    case CUDNN_STATUS_SUCCESS: return "CUDNN_STATUS_SUCCESS";
    case CUDNN_STATUS_NOT_INITIALIZED: return "CUDNN_STATUS_NOT_INITIALIZED";
    case CUDNN_STATUS_BAD_PARAM: return "CUDNN_STATUS_BAD_PARAM";
    case CUDNN_STATUS_NOT_SUPPORTED: return "CUDNN_STATUS_NOT_SUPPORTED";
    case CUDNN_STATUS_NOT_SUPPORTED_LAYOUT: return "CUDNN_STATUS_NOT_SUPPORTED_LAYOUT";
    case CUDNN_STATUS_INTERNAL_ERROR: return "CUDNN_STATUS_INTERNAL_ERROR";
    case CUDNN_STATUS_INTERNAL_ERROR_DEVICE_ALLOCATION_FAILED: return "CUDNN_STATUS_INTERNAL_ERROR_DEVICE_ALLOCATION_FAILED";
    case CUDNN_STATUS_EXECUTION_FAILED: return "CUDNN_STATUS_EXECUTION_FAILED";
  }
  return "CUDNN_STATUS_UNKNOWN";
}
cudnnStatus_t cudnnCreateTensorDescriptor(cudnnTensorDescriptor_t* d) { *d = new cudnnTensorStruct; return CUDNN_STATUS_SUCCESS; }
cudnnStatus_t cudnnSetTensor4dDescriptorEx(cudnnTensorDescriptor_t d, cudnnDataType_t t, int n, int c, int h, int w, int ns, int cs, int hs, int ws) {
  if (n <= 0 || c <= 0 || h <= 0 || w <= 0 || ns <= 0 || cs <= 0 || hs <= 0 || ws <= 0) return CUDNN_STATUS_BAD_PARAM;
  *d = {t, {n, c, h, w}, {ns, cs, hs, ws}, true};
  return CUDNN_STATUS_SUCCESS;
}
cudnnStatus_t cudnnDestroyTensorDescriptor(cudnnTensorDescriptor_t d) { delete d; return CUDNN_STATUS_SUCCESS; }
cudnnStatus_t cudnnCreateFilterDescriptor(cudnnFilterDescriptor_t* d) { *d = new cudnnFilterStruct; return CUDNN_STATUS_SUCCESS; }
cudnnStatus_t cudnnSetFilter4dDescriptor(cudnnFilterDescriptor_t d, cudnnDataType_t t, cudnnTensorFormat_t f, int k, int c, int h, int w) {
  if (k <= 0 || c <= 0 || h <= 0 || w <= 0) return CUDNN_STATUS_BAD_PARAM;
  *d = {t, f, {k, c, h, w}, true};
  return CUDNN_STATUS_SUCCESS;
}
cudnnStatus_t cudnnDestroyFilterDescriptor(cudnnFilterDescriptor_t d) { delete d; return CUDNN_STATUS_SUCCESS; }
cudnnStatus_t cudnnCreateConvolutionDescriptor(cudnnConvolutionDescriptor_t* d) { *d = new cudnnConvolutionStruct; return CUDNN_STATUS_SUCCESS; }
cudnnStatus_t cudnnSetConvolution2dDescriptor(cudnnConvolutionDescriptor_t d, int ph, int pw, int u, int v, int dh, int dw, cudnnConvolutionMode_t mode, cudnnDataType_t compute) {
  if (ph < 0 || pw < 0 || u <= 0 || v <= 0 || dh <= 0 || dw <= 0) return CUDNN_STATUS_BAD_PARAM;
  d->pad[0] = ph; d->pad[1] = pw; d->stride[0] = u; d->stride[1] = v; d->dil[0] = dh; d->dil[1] = dw;
  d->mode = mode; d->compute = compute; d->set = true;
  return CUDNN_STATUS_SUCCESS;
}
cudnnStatus_t cudnnSetConvolutionGroupCount(cudnnConvolutionDescriptor_t d, int g) { if (g <= 0) return CUDNN_STATUS_BAD_PARAM; d->groups = g; return CUDNN_STATUS_SUCCESS; }
cudnnStatus_t cudnnSetConvolutionMathType(cudnnConvolutionDescriptor_t d, cudnnMathType_t m) { d->math = m; return CUDNN_STATUS_SUCCESS; }
cudnnStatus_t cudnnDestroyConvolutionDescriptor(cudnnConvolutionDescriptor_t d) { delete d; return CUDNN_STATUS_SUCCESS; }

// ---- forward ----
cudnnStatus_t cudnnGetConvolutionForwardAlgorithm_v7(cudnnHandle_t, cudnnTensorDescriptor_t x, cudnnFilterDescriptor_t w, cudnnConvolutionDescriptor_t c, cudnnTensorDescriptor_t y, int req, int* ret, cudnnConvolutionFwdAlgoPerf_t* perf) {
  EMU_HOOK("cudnnGetConvolutionForwardAlgorithm_v7");
  return heuristics<cudnnConvolutionFwdAlgoPerf_t, cudnnConvolutionFwdAlgo_t>(check(x, w, c, y), *y, req, ret, perf, CUDNN_CONVOLUTION_FWD_ALGO_COUNT);
}
cudnnStatus_t cudnnGetConvolutionForwardWorkspaceSize(cudnnHandle_t, cudnnTensorDescriptor_t x, cudnnFilterDescriptor_t w, cudnnConvolutionDescriptor_t c, cudnnTensorDescriptor_t y, cudnnConvolutionFwdAlgo_t a, size_t* n) {
  EMU_HOOK("cudnnGetConvolutionForwardWorkspaceSize");
  return workspace(check(x, w, c, y), a, *y, n);
}
cudnnStatus_t cudnnFindConvolutionForwardAlgorithmEx(cudnnHandle_t, cudnnTensorDescriptor_t x, const void* xp, cudnnFilterDescriptor_t w, const void* wp, cudnnConvolutionDescriptor_t c, cudnnTensorDescriptor_t y, void* yp, int req, int* ret, cudnnConvolutionFwdAlgoPerf_t* perf, void* ws, size_t wsn) {
  EMU_HOOK("cudnnFindConvolutionForwardAlgorithmEx");
  cudnnStatus_t s = find<cudnnConvolutionFwdAlgoPerf_t, cudnnConvolutionFwdAlgo_t>(check(x, w, c, y), *y, ws, wsn, req, ret, perf, CUDNN_CONVOLUTION_FWD_ALGO_COUNT);
  if (s != CUDNN_STATUS_SUCCESS) return s;
  emu_check_device(xp, extent(*x) * esize(x->t)); emu_check_device(wp, filter_numel(*w) * esize(w->t)); emu_check_device(yp, extent(*y) * esize(y->t));
  const float one = 1, zero = 0; const double oned = 1, zerod = 0; const bool d = x->t == CUDNN_DATA_DOUBLE;
  compute(Pass::Fwd, *x, xp, *w, wp, *c, *y, nullptr, yp, d ? (const void*)&oned : &one, d ? (const void*)&zerod : &zero);
  return s;
}
cudnnStatus_t cudnnConvolutionForward(cudnnHandle_t, const void* alpha, cudnnTensorDescriptor_t x, const void* xp, cudnnFilterDescriptor_t w, const void* wp, cudnnConvolutionDescriptor_t c, cudnnConvolutionFwdAlgo_t a, void* ws, size_t wsn, const void* beta, cudnnTensorDescriptor_t y, void* yp) {
  EMU_HOOK("cudnnConvolutionForward");
  cudnnStatus_t s = execute(check(x, w, c, y), a, *y, ws, wsn);
  if (s != CUDNN_STATUS_SUCCESS) return s;
  emu_check_device(xp, extent(*x) * esize(x->t)); emu_check_device(wp, filter_numel(*w) * esize(w->t)); emu_check_device(yp, extent(*y) * esize(y->t));
  compute(Pass::Fwd, *x, xp, *w, wp, *c, *y, nullptr, yp, alpha, beta);
  return s;
}

// ---- backward data ----
cudnnStatus_t cudnnGetConvolutionBackwardDataAlgorithm_v7(cudnnHandle_t, cudnnFilterDescriptor_t w, cudnnTensorDescriptor_t dy, cudnnConvolutionDescriptor_t c, cudnnTensorDescriptor_t dx, int req, int* ret, cudnnConvolutionBwdDataAlgoPerf_t* perf) {
  EMU_HOOK("cudnnGetConvolutionBackwardDataAlgorithm_v7");
  return heuristics<cudnnConvolutionBwdDataAlgoPerf_t, cudnnConvolutionBwdDataAlgo_t>(check(dx, w, c, dy), *dy, req, ret, perf, CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT);
}
cudnnStatus_t cudnnGetConvolutionBackwardDataWorkspaceSize(cudnnHandle_t, cudnnFilterDescriptor_t w, cudnnTensorDescriptor_t dy, cudnnConvolutionDescriptor_t c, cudnnTensorDescriptor_t dx, cudnnConvolutionBwdDataAlgo_t a, size_t* n) {
  EMU_HOOK("cudnnGetConvolutionBackwardDataWorkspaceSize");
  return workspace(check(dx, w, c, dy), a, *dy, n);
}
cudnnStatus_t cudnnFindConvolutionBackwardDataAlgorithmEx(cudnnHandle_t, cudnnFilterDescriptor_t w, const void* wp, cudnnTensorDescriptor_t dy, const void* dyp, cudnnConvolutionDescriptor_t c, cudnnTensorDescriptor_t dx, void* dxp, int req, int* ret, cudnnConvolutionBwdDataAlgoPerf_t* perf, void* ws, size_t wsn) {
  EMU_HOOK("cudnnFindConvolutionBackwardDataAlgorithmEx");
  cudnnStatus_t s = find<cudnnConvolutionBwdDataAlgoPerf_t, cudnnConvolutionBwdDataAlgo_t>(check(dx, w, c, dy), *dy, ws, wsn, req, ret, perf, CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT);
  if (s != CUDNN_STATUS_SUCCESS) return s;
  emu_check_device(dxp, extent(*dx) * esize(dx->t)); emu_check_device(wp, filter_numel(*w) * esize(w->t)); emu_check_device(dyp, extent(*dy) * esize(dy->t));
  const float one = 1, zero = 0; const double oned = 1, zerod = 0; const bool d = dx->t == CUDNN_DATA_DOUBLE;
  compute(Pass::Data, *dx, nullptr, *w, wp, *c, *dy, dyp, dxp, d ? (const void*)&oned : &one, d ? (const void*)&zerod : &zero);
  return s;
}
cudnnStatus_t cudnnConvolutionBackwardData(cudnnHandle_t, const void* alpha, cudnnFilterDescriptor_t w, const void* wp, cudnnTensorDescriptor_t dy, const void* dyp, cudnnConvolutionDescriptor_t c, cudnnConvolutionBwdDataAlgo_t a, void* ws, size_t wsn, const void* beta, cudnnTensorDescriptor_t dx, void* dxp) {
  EMU_HOOK("cudnnConvolutionBackwardData");
  cudnnStatus_t s = execute(check(dx, w, c, dy), a, *dy, ws, wsn);
  if (s != CUDNN_STATUS_SUCCESS) return s;
  emu_check_device(dxp, extent(*dx) * esize(dx->t)); emu_check_device(wp, filter_numel(*w) * esize(w->t)); emu_check_device(dyp, extent(*dy) * esize(dy->t));
  compute(Pass::Data, *dx, nullptr, *w, wp, *c, *dy, dyp, dxp, alpha, beta);
  return s;
}

// ---- backward filter ----
cudnnStatus_t cudnnGetConvolutionBackwardFilterAlgorithm_v7(cudnnHandle_t, cudnnTensorDescriptor_t x, cudnnTensorDescriptor_t dy, cudnnConvolutionDescriptor_t c, cudnnFilterDescriptor_t dw, int req, int* ret, cudnnConvolutionBwdFilterAlgoPerf_t* perf) {
  EMU_HOOK("cudnnGetConvolutionBackwardFilterAlgorithm_v7");
  return heuristics<cudnnConvolutionBwdFilterAlgoPerf_t, cudnnConvolutionBwdFilterAlgo_t>(check(x, dw, c, dy), *dy, req, ret, perf, CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT);
}
cudnnStatus_t cudnnGetConvolutionBackwardFilterWorkspaceSize(cudnnHandle_t, cudnnTensorDescriptor_t x, cudnnTensorDescriptor_t dy, cudnnConvolutionDescriptor_t c, cudnnFilterDescriptor_t dw, cudnnConvolutionBwdFilterAlgo_t a, size_t* n) {
  EMU_HOOK("cudnnGetConvolutionBackwardFilterWorkspaceSize");
  return workspace(check(x, dw, c, dy), a, *dy, n);
}
cudnnStatus_t cudnnFindConvolutionBackwardFilterAlgorithmEx(cudnnHandle_t, cudnnTensorDescriptor_t x, const void* xp, cudnnTensorDescriptor_t dy, const void* dyp, cudnnConvolutionDescriptor_t c, cudnnFilterDescriptor_t dw, void* dwp, int req, int* ret, cudnnConvolutionBwdFilterAlgoPerf_t* perf, void* ws, size_t wsn) {
  EMU_HOOK("cudnnFindConvolutionBackwardFilterAlgorithmEx");
  cudnnStatus_t s = find<cudnnConvolutionBwdFilterAlgoPerf_t, cudnnConvolutionBwdFilterAlgo_t>(check(x, dw, c, dy), *dy, ws, wsn, req, ret, perf, CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT);
  if (s != CUDNN_STATUS_SUCCESS) return s;
  emu_check_device(xp, extent(*x) * esize(x->t)); emu_check_device(dwp, filter_numel(*dw) * esize(dw->t)); emu_check_device(dyp, extent(*dy) * esize(dy->t));
  const float one = 1, zero = 0; const double oned = 1, zerod = 0; const bool d = x->t == CUDNN_DATA_DOUBLE;
  compute(Pass::Filter, *x, xp, *dw, nullptr, *c, *dy, dyp, dwp, d ? (const void*)&oned : &one, d ? (const void*)&zerod : &zero);
  return s;
}
cudnnStatus_t cudnnConvolutionBackwardFilter(cudnnHandle_t, const void* alpha, cudnnTensorDescriptor_t x, const void* xp, cudnnTensorDescriptor_t dy, const void* dyp, cudnnConvolutionDescriptor_t c, cudnnConvolutionBwdFilterAlgo_t a, void* ws, size_t wsn, const void* beta, cudnnFilterDescriptor_t dw, void* dwp) {
  EMU_HOOK("cudnnConvolutionBackwardFilter");
  cudnnStatus_t s = execute(check(x, dw, c, dy), a, *dy, ws, wsn);
  if (s != CUDNN_STATUS_SUCCESS) return s;
  emu_check_device(xp, extent(*x) * esize(x->t)); emu_check_device(dwp, filter_numel(*dw) * esize(dw->t)); emu_check_device(dyp, extent(*dy) * esize(dy->t));
  compute(Pass::Filter, *x, xp, *dw, nullptr, *c, *dy, dyp, dwp, alpha, beta);
  return s;
}

// C = alpha A + beta C, A broadcast along its axes of size 1.
cudnnStatus_t cudnnAddTensor(cudnnHandle_t, const void* alpha_p, cudnnTensorDescriptor_t a, const void* ap, const void* beta_p, cudnnTensorDescriptor_t c, void* cp) {
  EMU_HOOK("cudnnAddTensor");
  if (!a->set || !c->set || a->t != c->t) return CUDNN_STATUS_BAD_PARAM;
  for (int i = 0; i < 4; ++i) if (a->d[i] != 1 && a->d[i] != c->d[i]) return CUDNN_STATUS_BAD_PARAM;
  emu_check_device(ap, extent(*a) * esize(a->t)); emu_check_device(cp, extent(*c) * esize(c->t));
  const bool d = c->t == CUDNN_DATA_DOUBLE;
  const double alpha = d ? *static_cast<const double*>(alpha_p) : *static_cast<const float*>(alpha_p);
  const double beta = d ? *static_cast<const double*>(beta_p) : *static_cast<const float*>(beta_p);
  for (int n = 0; n < c->d[0]; ++n) for (int ch = 0; ch < c->d[1]; ++ch) for (int h = 0; h < c->d[2]; ++h) for (int w = 0; w < c->d[3]; ++w) {
    const int64_t o = at(*c, n, ch, h, w);
    const double av = load(ap, a->t, at(*a, a->d[0] == 1 ? 0 : n, a->d[1] == 1 ? 0 : ch, a->d[2] == 1 ? 0 : h, a->d[3] == 1 ? 0 : w));
    store(cp, c->t, o, alpha * av + beta * load(cp, c->t, o));
  }
  return CUDNN_STATUS_SUCCESS;
}
