// The MPI group's reduction algorithms (mpi_reduce.h).
#include "distributed/mpi_reduce.h"

#include "braid/autograd.h"
#include "braid/ops.h"
#include "distributed/internal.h"

namespace braid::distributed::detail {

void check_mpi(int code, const std::string& what) {
  if (code == MPI_SUCCESS) return;
  char msg[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(code, msg, &len);
  throw DistributedError(::braid::detail::cat("braid: ", what, ": MPI error: ", std::string(msg, static_cast<size_t>(len))));
}

MPI_Datatype mpi_type(DType t) {
  switch (t) {
    case DType::Float32: return MPI_FLOAT;
    case DType::Float64: return MPI_DOUBLE;
    case DType::Int64: return MPI_INT64_T;
    case DType::Int32: return MPI_INT32_T;
    case DType::Bool: return MPI_UINT8_T;
    default: return MPI_DATATYPE_NULL;
  }
}

MPI_Op mpi_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::Max: return MPI_MAX;
    case ReduceOp::Min: return MPI_MIN;
    default: return MPI_SUM;
  }
}

namespace {

template <typename T>
void combine_as(T* a, const T* b, int64_t n, ReduceOp op) {
  switch (op) {
    case ReduceOp::Max:
      for (int64_t i = 0; i < n; ++i) a[i] = a[i] < b[i] ? b[i] : a[i];
      break;
    case ReduceOp::Min:
      for (int64_t i = 0; i < n; ++i) a[i] = b[i] < a[i] ? b[i] : a[i];
      break;
    default:
      for (int64_t i = 0; i < n; ++i) a[i] = static_cast<T>(a[i] + b[i]);
  }
}

}  // namespace

void MpiReducer::all_reduce(const Tensor& t, ReduceOp op, const AllReduceOptions& options, Wait wait) {
  wait_ = std::move(wait);
  all_reduce_now(t, op, options);
  wait_ = nullptr;
}

void MpiReducer::reduce_scatter(const Tensor& flat, ReduceOp op, AllReduceOptions options, Wait wait) {
  wait_ = std::move(wait);
  reduce_scatter_now(flat, op, options);
  wait_ = nullptr;
}

// Note [Reduction order]: which algorithm a buffer takes depends only on its size, dtype, the
// options and the group's size, and reduce_scatter_inplace takes the reduce-scatter half of the
// algorithm all_reduce with deterministic = true takes (recursive halving for recursive
// doubling, the ring's first half for the ring), so that every element is summed in the same
// tree: a sharded run's gradients have the bits of a data-parallel run's.
MpiReducer::Algo MpiReducer::choose(const Tensor& t, ReduceOp op, const AllReduceOptions& options) const {
  const bool floating = is_floating(t.dtype());
  const bool half = t.dtype() == DType::Float16 || t.dtype() == DType::BFloat16;
  const bool sum_like = op == ReduceOp::Sum || op == ReduceOp::Average;
  const bool compressed = half || options.wire_dtype != WireDType::Native;
  const bool pow2 = (size_ & (size_ - 1)) == 0;
  if (!compressed && pow2 && t.numel() * t.element_size() < kDoublingMaxBytes) return Algo::Doubling;
  if (floating && sum_like &&
      (half || options.deterministic || options.wire_dtype != WireDType::Native ||
       t.numel() * t.element_size() >= kRingMinBytes))
    return Algo::Ring;
  return Algo::Mpi;
}

DType MpiReducer::wire_of(const Tensor& t, WireDType wire_dtype) const {
  return wire_dtype == WireDType::Float16    ? DType::Float16
         : wire_dtype == WireDType::BFloat16 ? DType::BFloat16
                                             : t.dtype();
}

void MpiReducer::all_reduce_now(const Tensor& t, ReduceOp op, const AllReduceOptions& options) {
  if (size_ == 1 || t.numel() == 0) return;
  switch (choose(t, op, options)) {
    case Algo::Doubling: recursive_doubling(t, op); return;
    case Algo::Ring: {
      const Tensor flat = t.view({t.numel()});
      const DType wire = wire_of(t, options.wire_dtype);
      ring_reduce_scatter(flat, wire, op == ReduceOp::Average);
      ring_all_gather(flat, wire);
      return;
    }
    case Algo::Mpi: break;
  }
  std::vector<MPI_Request> req(1);
  check_mpi(MPI_Iallreduce(MPI_IN_PLACE, t.raw_data(), static_cast<int>(t.numel()), mpi_type(t.dtype()), mpi_op(op),
                           comm_, req.data()),
            "MPI_Iallreduce");
  wait_(req);
  if (op == ReduceOp::Average) Tensor(t).mul_(1.0 / size_);
}

void MpiReducer::reduce_scatter_now(const Tensor& t, ReduceOp op, AllReduceOptions options) {
  if (size_ == 1 || t.numel() == 0) return;
  options.deterministic = true;
  const Tensor flat = t.view({t.numel()});
  switch (choose(t, op, options)) {
    case Algo::Doubling: recursive_halving(flat, op); return;
    case Algo::Ring: ring_reduce_scatter(flat, wire_of(t, options.wire_dtype), op == ReduceOp::Average); return;
    case Algo::Mpi: all_reduce_now(t, op, options); return;  // integers, max, min: the whole buffer
  }
}

// Sends bytes of send to partner while receiving its bytes into recv, in pieces small enough for
// MPI's eager protocol: one rendezvous handshake costs more than several eager messages here.
void MpiReducer::exchange(const void* send, int64_t send_bytes, void* recv, int64_t recv_bytes, int partner) {
  std::vector<MPI_Request> reqs;
  for (int64_t off = 0; off < recv_bytes; off += kEagerBytes) {
    MPI_Request r;
    check_mpi(MPI_Irecv(static_cast<char*>(recv) + off, static_cast<int>(std::min(kEagerBytes, recv_bytes - off)),
                        MPI_BYTE, partner, kRingTag, comm_, &r),
              "MPI_Irecv (recursive doubling)");
    reqs.push_back(r);
  }
  for (int64_t off = 0; off < send_bytes; off += kEagerBytes) {
    MPI_Request r;
    check_mpi(MPI_Isend(static_cast<const char*>(send) + off, static_cast<int>(std::min(kEagerBytes, send_bytes - off)),
                        MPI_BYTE, partner, kRingTag, comm_, &r),
              "MPI_Isend (recursive doubling)");
    reqs.push_back(r);
  }
  wait_(reqs);
}

// Recursive halving: at distance N/2, N/4, ..., 1 each rank keeps half of its segment range (the
// half holding its own segment), sends the other half to its partner and adds the partner's copy
// of the kept half: the tree of recursive_doubling, element by element.
void MpiReducer::recursive_halving(const Tensor& flat, ReduceOp op) {
  const int64_t n = flat.numel(), es = flat.element_size();
  Tensor other = empty({n}, flat.dtype());
  int lo = 0, hi = size_;
  for (int mask = size_ >> 1; mask >= 1; mask >>= 1) {
    const int mid = lo + (hi - lo) / 2;
    const bool upper = (rank_ & mask) != 0;
    const int keep_lo = upper ? mid : lo, keep_hi = upper ? hi : mid;
    const int give_lo = upper ? lo : mid, give_hi = upper ? mid : hi;
    const int64_t kb = n * keep_lo / size_, ke = n * keep_hi / size_;
    const int64_t gb = n * give_lo / size_, ge = n * give_hi / size_;
    exchange(static_cast<const char*>(flat.raw_data()) + gb * es, (ge - gb) * es,
             static_cast<char*>(other.raw_data()) + kb * es, (ke - kb) * es, rank_ ^ mask);
    combine(flat.narrow(0, kb, ke - kb), other.narrow(0, kb, ke - kb), op);
    lo = keep_lo;
    hi = keep_hi;
  }
  if (op == ReduceOp::Average) flat.narrow(0, n * rank_ / size_, n * (rank_ + 1) / size_ - n * rank_ / size_).mul_(1.0 / size_);
}

// Exchanges the whole buffer with the partner at distance N/2, N/4, ..., 1 and combines.
void MpiReducer::recursive_doubling(const Tensor& t, ReduceOp op) {
  const int64_t n = t.numel(), bytes = n * t.element_size();
  Tensor other = empty({n}, t.dtype());
  for (int mask = size_ >> 1; mask >= 1; mask >>= 1) {
    exchange(t.raw_data(), bytes, other.raw_data(), bytes, rank_ ^ mask);
    combine(t, other, op);
  }
  if (op == ReduceOp::Average) Tensor(t).mul_(1.0 / size_);
}

/// a = op(a, b) elementwise, in a's dtype (small buffers: a plain loop beats a dispatched op).
void MpiReducer::combine(const Tensor& a, const Tensor& b, ReduceOp op) {
  const int64_t n = a.numel();
  switch (a.dtype()) {
    case DType::Float32: combine_as(static_cast<float*>(a.raw_data()), static_cast<const float*>(b.raw_data()), n, op); break;
    case DType::Float64: combine_as(static_cast<double*>(a.raw_data()), static_cast<const double*>(b.raw_data()), n, op); break;
    case DType::Int64: combine_as(static_cast<int64_t*>(a.raw_data()), static_cast<const int64_t*>(b.raw_data()), n, op); break;
    case DType::Int32: combine_as(static_cast<int32_t*>(a.raw_data()), static_cast<const int32_t*>(b.raw_data()), n, op); break;
    case DType::Bool: {
      // Sum of bools is "any", as MPI's sum of 0/1 bytes clamped back to bool would give.
      auto* x = static_cast<uint8_t*>(a.raw_data());
      const auto* y = static_cast<const uint8_t*>(b.raw_data());
      for (int64_t i = 0; i < n; ++i) x[i] = op == ReduceOp::Min ? (x[i] && y[i]) : (x[i] || y[i]);
      break;
    }
    default: BRAID_ASSERT(false, "combine: unexpected dtype ", dtype_name(a.dtype()));
  }
}

// Sends src to the right neighbour while receiving the left neighbour's matching segment; each
// received chunk is either added into dst (reduce) or copied into it. Chunks are double-buffered
// so that chunk i is added while chunk i+1 arrives.
void MpiReducer::ring_step(const Tensor& src, const Tensor& dst, DType wire, bool reduce) {
  const int right = (rank_ + 1) % size_, left = (rank_ + size_ - 1) % size_;
  const int64_t wsize = dtype_size(wire);
  const Tensor send = src.dtype() == wire ? src : src.to(wire);
  const bool direct = !reduce && dst.dtype() == wire;  // receive straight into place
  const int64_t chunk = std::max<int64_t>(1, kRingChunkBytes / wsize);
  const int64_t n_send = send.numel(), n_recv = dst.numel();
  std::vector<MPI_Request> sends;
  for (int64_t off = 0; off < n_send; off += chunk) {
    MPI_Request r;
    check_mpi(MPI_Isend(static_cast<char*>(send.raw_data()) + off * wsize, static_cast<int>(std::min(chunk, n_send - off) * wsize),
                        MPI_BYTE, right, kRingTag, comm_, &r),
              "MPI_Isend (ring)");
    sends.push_back(r);
  }
  Tensor buf[2];
  if (!direct) buf[0] = empty({std::min(chunk, n_recv)}, wire), buf[1] = empty({std::min(chunk, n_recv)}, wire);
  auto post = [&](int64_t off, int slot) {
    const int64_t len = std::min(chunk, n_recv - off);
    void* where = direct ? static_cast<char*>(dst.raw_data()) + off * wsize : buf[slot].raw_data();
    MPI_Request r;
    check_mpi(MPI_Irecv(where, static_cast<int>(len * wsize), MPI_BYTE, left, kRingTag, comm_, &r), "MPI_Irecv (ring)");
    return r;
  };
  std::vector<MPI_Request> pending(1);
  if (n_recv > 0) pending[0] = post(0, 0);
  for (int64_t off = 0, i = 0; off < n_recv; off += chunk, ++i) {
    std::vector<MPI_Request> cur{pending[0]};
    if (off + chunk < n_recv) pending[0] = post(off + chunk, static_cast<int>((i + 1) % 2));
    wait_(cur);
    if (direct) continue;
    const int64_t len = std::min(chunk, n_recv - off);
    Tensor got = buf[i % 2].narrow(0, 0, len);
    Tensor out = dst.narrow(0, off, len);
    if (reduce) out.add_(got.dtype() == out.dtype() ? got : got.to(out.dtype()));
    else out.copy_(got);
  }
  wait_(sends);
}

// The ring's segments by label: label i is segment (i - 1) mod N, so that the segment a rank
// finishes in the reduce-scatter half (label rank + 1) is its own, segment rank.
Tensor MpiReducer::ring_segment(const Tensor& flat, int label, int p) {
  const int64_t n = flat.numel();
  const int i = (label + p - 1) % p;
  const int64_t b = n * i / p, e = n * (i + 1) / p;
  return flat.narrow(0, b, e - b);
}

// After it, this rank's own segment holds the sum over the ring, finished once here (averaged,
// rounded to the wire dtype) so that every rank receives the same bytes in the all-gather half.
void MpiReducer::ring_reduce_scatter(const Tensor& flat, DType wire, bool average) {
  const int p = size_, r = rank_;
  for (int s = 0; s < p - 1; ++s)
    ring_step(ring_segment(flat, (r - s + p) % p, p), ring_segment(flat, (r - s - 1 + 2 * p) % p, p), wire, true);
  Tensor own = ring_segment(flat, (r + 1) % p, p);
  if (average) own.mul_(1.0 / p);
  if (wire != flat.dtype()) own.copy_(own.to(wire));
}

void MpiReducer::ring_all_gather(const Tensor& flat, DType wire) {
  const int p = size_, r = rank_;
  for (int s = 0; s < p - 1; ++s)
    ring_step(ring_segment(flat, (r + 1 - s + p) % p, p), ring_segment(flat, (r - s + p) % p, p), wire, false);
}

}  // namespace braid::distributed::detail
