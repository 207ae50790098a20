// What sharded.cpp (buckets, backward, step) and sharded_units.cpp (stage 3's units) share: the
// bucket, a flat parameter buffer cut into one segment per rank.
#pragma once

#include "braid/distributed/sharded.h"

namespace braid::distributed {

struct ShardedDataParallel::Bucket {
  std::vector<size_t> params;
  std::vector<int64_t> offsets;
  std::vector<Shape> shapes;  // the parameters' own shapes (stage 3 sets [0] while freed)
  int64_t numel = 0;
  int64_t begin = 0, end = 0;  // this rank's segment
  bool unit = false;           // stage 3: gathered and freed around its uses
  bool gathered = true;
  size_t pending = 0;
  Tensor flat;        // the parameters (a unit's storage holds no memory while freed)
  Tensor grad_flat;   // stage 1: always; stages 2 and 3: while the reduce-scatter runs
  Tensor shard;       // the optimizer's parameter: flat's segment, or its own copy of it (stage 3)
  Tensor shard_grad;  // the averaged gradient of the segment (stage 1: a view of grad_flat)
  Tensor carried;     // stage 1: the segment's gradient from earlier passes, while a pass overwrites it
  bool has_grad = false;
  bool launched = false;
  WorkPtr work;
  WorkPtr gather_work;  // stage 3: an all-gather in flight (a prefetch)
};

namespace detail {
/// Makes param a view of view's memory, keeping the tensor itself (Note [Parameters in flat buffers]).
void rebind(const Tensor& param, const Tensor& view);
}  // namespace detail

}  // namespace braid::distributed
