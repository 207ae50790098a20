// The reduction algorithms of the MPI group (mpi_group.cpp): recursive doubling and halving, the
// chunked ring and its two halves, each written on MPI point-to-point, and the choice between
// them. One MpiReducer per group; the group runs its collectives one at a time, so a reducer is
// never used by two threads at once.
//
// Note [All-reduce algorithm]
// Small buffers and non-float data go to MPI_Iallreduce. Large float buffers use a ring (reduce-
// scatter then all-gather, 2(p-1)/p of the buffer sent per rank, the bandwidth optimum) written on
// MPI point-to-point in chunks, so that adding chunk i overlaps receiving chunk i+1; Debian's MPICH
// is several times slower on one node (benchmarks/README.md, "Data-parallel communication"). The
// ring's order of additions depends only on the size and the number of ranks, and every rank ends
// with the owner's bytes, so it is also the deterministic mode and carries compressed wire dtypes.
// Below 32 KiB, on a power-of-two group, recursive doubling (log2 p exchanges of the whole buffer,
// latency-optimal) is faster than MPI_Iallreduce; each pair adds the same two operands, so every
// rank still ends with the same bits.
#pragma once

#include <mpi.h>

#include <functional>
#include <string>
#include <vector>

#include "braid/distributed/process_group.h"

namespace braid::distributed::detail {

/// Buffers of at least this many bytes take the ring (Note [All-reduce algorithm]).
constexpr int64_t kRingMinBytes = 32 * 1024;
/// Bytes per ring message: small enough that reduction overlaps the transfer of the next chunk.
constexpr int64_t kRingChunkBytes = 1 << 20;
constexpr int kRingTag = 11;
/// Largest message recursive doubling sends in one piece (below MPI's rendezvous threshold).
constexpr int64_t kEagerBytes = 8 * 1024;
/// Buffers below this size (on power-of-two groups) take recursive doubling.
constexpr int64_t kDoublingMaxBytes = 256 * 1024;

/// An MPI error code as a DistributedError naming the call.
void check_mpi(int code, const std::string& what);
/// MPI's type for a dtype, or MPI_DATATYPE_NULL (float16 and bfloat16 travel as bytes).
MPI_Datatype mpi_type(DType t);
MPI_Op mpi_op(ReduceOp op);

class MpiReducer {
 public:
  /// Completes the requests (polling against the group's deadline) or throws.
  using Wait = std::function<void(std::vector<MPI_Request>&)>;
  void init(MPI_Comm comm, int rank, int size) {
    comm_ = comm;
    rank_ = rank;
    size_ = size;
  }
  /// In place, every rank ends with the same bits.
  void all_reduce(const Tensor& t, ReduceOp op, const AllReduceOptions& options, Wait wait);
  /// In place: segment rank of flat = [n*rank/N, n*(rank+1)/N) ends reduced (Note [Reduction order]).
  void reduce_scatter(const Tensor& flat, ReduceOp op, AllReduceOptions options, Wait wait);

 private:
  enum class Algo { Doubling, Ring, Mpi };
  Algo choose(const Tensor& t, ReduceOp op, const AllReduceOptions& options) const;
  DType wire_of(const Tensor& t, WireDType wire_dtype) const;
  void all_reduce_now(const Tensor& t, ReduceOp op, const AllReduceOptions& options);
  void reduce_scatter_now(const Tensor& t, ReduceOp op, AllReduceOptions options);
  void exchange(const void* send, int64_t send_bytes, void* recv, int64_t recv_bytes, int partner);
  void recursive_halving(const Tensor& flat, ReduceOp op);
  void recursive_doubling(const Tensor& t, ReduceOp op);
  static void combine(const Tensor& a, const Tensor& b, ReduceOp op);
  void ring_step(const Tensor& src, const Tensor& dst, DType wire, bool reduce);
  static Tensor ring_segment(const Tensor& flat, int label, int p);
  void ring_reduce_scatter(const Tensor& flat, DType wire, bool average);
  void ring_all_gather(const Tensor& flat, DType wire);

  MPI_Comm comm_ = MPI_COMM_NULL;
  int rank_ = 0, size_ = 1;
  Wait wait_;
};

}  // namespace braid::distributed::detail
