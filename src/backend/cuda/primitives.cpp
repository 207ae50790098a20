// The CUDA backend's elementwise, reduction, indexing and random primitives: each checks its
// operands as the CPU backend does, makes their device current, unpacks the tensors into device
// pointers and strided indexers (host.h) and calls the kernel launcher of its kind (kernels.h) on
// the device's stream. Convolution's and pooling's keep theirs with their kernels (conv.cu, pool.cu).
#include <cstring>

#include "backend/cpu/dispatch.h"
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/host.h"
#include "backend/cuda/kernels.h"
#include "backend/cuda/runtime.h"
#include "core/internal.h"

namespace braid::detail {

using cuda::indexer;
using cuda::Launch;
using cuda::ptr;

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

}  // namespace braid::detail
