// The CUDA backend's primitives other than matmul: each checks its operands as the CPU backend
// does, makes their device current, unpacks the tensors into device pointers and strided indexers
// (strided_host.h) and calls the kernel launcher of its kind (kernels.h) on the device's stream.
#include <array>
#include <cstring>
#include <functional>
#include <initializer_list>

#include "backend/cpu/dispatch.h"
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/kernels.h"
#include "backend/cuda/runtime.h"
#include "backend/cuda/strided_host.h"
#include "core/internal.h"

namespace braid::detail {
namespace {

// Where a primitive runs: the device of its anchor operand, made current while in scope, and its
// stream. Every other operand must live there (TypeError naming the primitive and both devices, as
// on the shadow device), since a kernel cannot read another device's or the host's memory.
class Launch {
 public:
  Launch(const char* op, const Tensor& anchor, std::initializer_list<std::reference_wrapper<const Tensor>> operands)
      : device(anchor.device().index), stream(cuda::stream(device)), guard_(device) {
    for (const Tensor& t : operands)
      BRAID_CHECK_T(TypeError, !t.defined() || t.device() == anchor.device(), op, ": operands on different devices (",
                    t.device().str(), " and ", anchor.device().str(), "); move them with .to(device) first");
  }
  const int device;
  const cudaStream_t stream;

 private:
  cuda::DeviceGuard guard_;
};

void* ptr(const Tensor& t) { return t.defined() ? device_data(t) : nullptr; }

template <int N>
cuda::Indexer<N> indexer(const Shape& shape, const std::array<const Tensor*, N>& operands) {
  std::array<const int64_t*, N> strides{};
  for (int k = 0; k < N; ++k) strides[k] = operands[k]->strides().data();
  return cuda::make_indexer<N>(shape, strides);
}

}  // namespace

void CudaBackend::copy(const Tensor& src, const Tensor& dst) {
  BRAID_ASSERT(src.shape() == dst.shape(), "copy: shapes ", shape_str(src.shape()), " and ", shape_str(dst.shape()));
  const int64_t n = dst.numel();
  if (n == 0) return;
  Launch l("copy", dst, {src});
  if (src.dtype() == dst.dtype() && src.is_contiguous() && dst.is_contiguous()) {
    if (ptr(src) != ptr(dst))
      cuda::check(cudaMemcpyAsync(ptr(dst), ptr(src), static_cast<size_t>(n * dst.element_size()),
                                  cudaMemcpyDeviceToDevice, l.stream),
                  "copy", "cudaMemcpyAsync");
    return;
  }
  cuda::launch_copy(dst.dtype(), src.dtype(), indexer<2>(dst.shape(), {&dst, &src}), n, ptr(dst), ptr(src), l.stream);
}

void CudaBackend::fill(const Tensor& dst, double value) {
  if (dst.numel() == 0) return;
  Launch l("fill", dst, {});
  uint64_t bits = 0;  // the value's element, converted as the CPU converts it
  dispatch_all(dst.dtype(), "fill", [&]<typename T>() {
    const T v = convert<T>(value);
    std::memcpy(&bits, &v, sizeof(T));
  });
  cuda::launch_fill(static_cast<int>(dst.element_size()), bits, indexer<1>(dst.shape(), {&dst}), dst.numel(), ptr(dst),
                    l.stream);
}

void CudaBackend::iota(const Tensor& dst, double start, double step) {
  if (dst.numel() == 0) return;
  BRAID_ASSERT(dst.is_contiguous(), "iota: dst must be contiguous");
  Launch l("iota", dst, {});
  cuda::launch_iota(dst.dtype(), dst.numel(), ptr(dst), start, step, l.stream);
}

void CudaBackend::unary(UnaryOp op, const Tensor& x, const Tensor& out, double p0, double p1) {
  const bool bool_out = op == UnaryOp::LogicalNot || op == UnaryOp::IsNan;
  BRAID_ASSERT(out.dtype() == (bool_out ? kBool : x.dtype()) && out.shape() == x.shape(), "unary: got ",
               dtype_name(x.dtype()), " ", shape_str(x.shape()), " -> ", dtype_name(out.dtype()), " ",
               shape_str(out.shape()));
  Launch l("unary", out, {x});
  cuda::launch_unary(op, x.dtype(), indexer<2>(out.shape(), {&out, &x}), out.numel(), ptr(out), ptr(x), p0, p1,
                     l.stream);
}

void CudaBackend::binary(BinaryOp op, const Tensor& a, const Tensor& b, const Tensor& out) {
  BRAID_ASSERT(a.dtype() == b.dtype() && out.dtype() == (op >= BinaryOp::Eq ? kBool : a.dtype()) &&
                   a.shape() == out.shape() && b.shape() == out.shape(),
               "binary: got ", dtype_name(a.dtype()), " ", shape_str(a.shape()), ", ", dtype_name(b.dtype()), " ",
               shape_str(b.shape()), " -> ", dtype_name(out.dtype()), " ", shape_str(out.shape()));
  Launch l("binary", out, {a, b});
  cuda::launch_binary(op, a.dtype(), indexer<3>(out.shape(), {&out, &a, &b}), out.numel(), ptr(out), ptr(a), ptr(b),
                      l.device, l.stream);
}

void CudaBackend::where(const Tensor& cond, const Tensor& a, const Tensor& b, const Tensor& out) {
  BRAID_ASSERT(cond.dtype() == kBool && a.dtype() == out.dtype() && b.dtype() == out.dtype(),
               "where: dtypes do not match");
  Launch l("where", out, {cond, a, b});
  cuda::launch_where(out.dtype(), indexer<4>(out.shape(), {&out, &cond, &a, &b}), out.numel(), ptr(out),
                     static_cast<const bool*>(ptr(cond)), ptr(a), ptr(b), l.stream);
}

void CudaBackend::reduce(ReduceOp op, const Tensor& x, const std::vector<int64_t>& axes, const Tensor& out) {
  static const char* const kNames[] = {"sum", "prod", "max", "min", "argmax", "argmin"};
  const char* name = kNames[static_cast<int>(op)];
  const bool arg = op == ReduceOp::ArgMax || op == ReduceOp::ArgMin;
  if (out.numel() == 0) return;
  BRAID_ASSERT(out.is_contiguous() && out.dtype() == (arg ? kInt64 : x.dtype()) && out.dim() == x.dim(), name,
               ": out must be contiguous, keepdim-shaped and of the result dtype");
  Launch l(name, out, {x});
  // Kept positions in out's row-major order (out is contiguous), with x's strides.
  const cuda::Indexer<1> kept = cuda::make_indexer<1>(out.shape(), {x.strides().data()}, /*reorder=*/false);
  if (arg) {
    BRAID_ASSERT(axes.size() == 1, name, " reduces exactly one axis");
    const int64_t len = x.shape()[axes[0]];
    BRAID_CHECK(len > 0, name, ": cannot reduce an empty axis");
    return cuda::launch_arg_reduce(op == ReduceOp::ArgMax, x.dtype(), kept, out.numel(), len, x.strides()[axes[0]],
                                   ptr(x), static_cast<int64_t*>(ptr(out)), l.stream);
  }
  Shape rshape(x.shape().size(), 1);  // x's shape over the reduced axes, 1 over the kept ones
  for (int64_t a : axes) rshape[a] = x.shape()[a];
  const cuda::ReduceShape shape{kept, cuda::make_indexer<1>(rshape, {x.strides().data()}), out.numel(),
                                shape_numel(rshape)};
  cuda::launch_reduce(op, x.dtype(), shape, ptr(x), ptr(out), l.device, l.stream);
}

void CudaBackend::gather(const Tensor& x, int64_t axis, const Tensor& index, const Tensor& out) {
  BRAID_ASSERT(
      index.dtype() == kInt64 && index.shape() == out.shape() && x.dtype() == out.dtype() && x.dim() == out.dim(),
      "gather: index must be int64 of out's shape");
  if (out.numel() == 0) return;
  Launch l("gather", out, {x, index});
  Shape xs = x.strides();
  const int64_t axis_stride = xs[axis];
  xs[axis] = 0;
  const auto ix = cuda::make_indexer<3>(out.shape(), {out.strides().data(), index.strides().data(), xs.data()});
  cuda::launch_gather(static_cast<int>(x.element_size()), ix, out.numel(), axis_stride, ptr(out),
                      static_cast<const int64_t*>(ptr(index)), ptr(x), l.stream);
}

void CudaBackend::scatter_add(const Tensor& out, int64_t axis, const Tensor& index, const Tensor& src) {
  BRAID_ASSERT(
      index.dtype() == kInt64 && index.shape() == src.shape() && src.dtype() == out.dtype() && src.dim() == out.dim(),
      "scatter_add: index must be int64 of src's shape");
  if (src.numel() == 0) return;
  Launch l("scatter_add", out, {index, src});
  Shape os = out.strides();
  const int64_t axis_stride = os[axis];
  os[axis] = 0;
  const auto ix = cuda::make_indexer<3>(src.shape(), {os.data(), index.strides().data(), src.strides().data()});
  cuda::launch_scatter_add(src.dtype(), ix, src.numel(), axis_stride, ptr(out), static_cast<const int64_t*>(ptr(index)),
                           ptr(src), l.stream);
}

void CudaBackend::random(RandomKind kind, const Tensor& out, uint64_t seed, uint64_t counter, double a, double b) {
  if (out.numel() == 0) return;
  BRAID_ASSERT(out.is_contiguous(), "random: out must be contiguous");
  Launch l("random", out, {});
  cuda::launch_random(kind, out.dtype(), out.numel(), ptr(out), seed, counter, a, b, l.stream);
}

void CudaBackend::im2col(const Tensor& x, const Window2d& win, const Tensor& cols) {
  BRAID_ASSERT(x.dim() == 4 && x.is_contiguous() && cols.is_contiguous() && x.dtype() == cols.dtype(),
               "im2col: x (N, C, h, w) and cols must be contiguous and of one dtype");
  if (cols.numel() == 0) return;
  Launch l("im2col", cols, {x});
  cuda::launch_im2col(x.dtype(), ptr(x), ptr(cols), x.shape()[0], x.shape()[1], win, l.stream);
}

void CudaBackend::col2im(const Tensor& cols, const Window2d& win, const Tensor& x) {
  BRAID_ASSERT(x.dim() == 4 && x.is_contiguous() && cols.is_contiguous() && x.dtype() == cols.dtype(),
               "col2im: x (N, C, h, w) and cols must be contiguous and of one dtype");
  if (cols.numel() == 0) return;
  Launch l("col2im", x, {cols});
  cuda::launch_col2im(x.dtype(), ptr(cols), ptr(x), x.shape()[0], x.shape()[1], win, l.stream);
}

void CudaBackend::depthwise_conv2d(const Tensor& x, const Tensor& w, const Tensor& bias, const Window2d& win,
                                   const Tensor& y) {
  BRAID_ASSERT(x.dim() == 4 && w.dim() == 4 && y.dim() == 4 && x.is_contiguous() && w.is_contiguous() &&
                   y.is_contiguous() && (!bias.defined() || bias.is_contiguous()) && x.dtype() == w.dtype() &&
                   x.dtype() == y.dtype() && (!bias.defined() || bias.dtype() == x.dtype()),
               "depthwise_conv2d: x, w, y (and bias) must be contiguous and of one dtype");
  if (y.numel() == 0) return;
  Launch l("depthwise_conv2d", y, {x, w, bias});
  const int64_t c = x.shape()[1];
  cuda::launch_depthwise_conv2d(x.dtype(), ptr(x), ptr(w), ptr(bias), ptr(y), x.shape()[0], c, w.shape()[0] / c, win,
                                l.stream);
}

namespace {
void check_planes(const Tensor& x, const Tensor& out, const char* op) {
  BRAID_ASSERT(x.dim() == 4 && out.dim() == 4 && x.is_contiguous() && out.is_contiguous() && x.dtype() == out.dtype() &&
                   x.shape()[0] * x.shape()[1] == out.shape()[0] * out.shape()[1],
               op, ": operands must be contiguous (N, C, *, *) tensors of one dtype");
}
}  // namespace

void CudaBackend::max_pool2d(const Tensor& x, const Window2d& win, const Tensor& out, const Tensor& indices) {
  check_planes(x, out, "max_pool2d");
  BRAID_ASSERT(
      !indices.defined() || (indices.dtype() == kInt64 && indices.is_contiguous() && indices.shape() == out.shape()),
      "max_pool2d: indices must be contiguous int64 of out's shape");
  if (out.numel() == 0) return;
  Launch l("max_pool2d", out, {x, indices});
  cuda::launch_max_pool2d(x.dtype(), ptr(x), ptr(out), static_cast<int64_t*>(ptr(indices)),  // null when undefined
                          out.shape()[0] * out.shape()[1], win, l.stream);
}

void CudaBackend::avg_pool2d(const Tensor& x, const Window2d& win, bool count_include_pad, const Tensor& out) {
  check_planes(x, out, "avg_pool2d");
  if (out.numel() == 0) return;
  Launch l("avg_pool2d", out, {x});
  cuda::launch_avg_pool2d(x.dtype(), ptr(x), ptr(out), out.shape()[0] * out.shape()[1], win, count_include_pad,
                          l.stream);
}

void CudaBackend::avg_pool2d_backward(const Tensor& grad, const Window2d& win, bool count_include_pad,
                                      const Tensor& grad_x) {
  check_planes(grad_x, grad, "avg_pool2d_backward");
  if (grad.numel() == 0) return;
  Launch l("avg_pool2d_backward", grad_x, {grad});
  cuda::launch_avg_pool2d_backward(grad.dtype(), ptr(grad), ptr(grad_x), grad.shape()[0] * grad.shape()[1], win,
                                   count_include_pad, l.stream);
}

}  // namespace braid::detail
