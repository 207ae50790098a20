// make_grid: the process groups of a data x pipeline x tensor grid of ranks (Note [Grid placement]
// in braid/distributed/pipeline.h).
#include "braid/distributed/pipeline.h"

#include "braid/error.h"

namespace braid::distributed {

int Grid::rank_of(int r, int s, int t) const {
  BRAID_CHECK_T(IndexError, r >= 0 && r < shape.data && s >= 0 && s < shape.pipeline && t >= 0 && t < shape.tensor,
                "Grid::rank_of: coordinates (replica ", r, ", stage ", s, ", tensor rank ", t,
                ") outside the grid of ", shape.data, " x ", shape.pipeline, " x ", shape.tensor);
  return (r * shape.pipeline + s) * shape.tensor + t;
}

std::string Grid::describe() const {
  return detail::cat("replica ", replica, " of ", shape.data, ", stage ", stage, " of ", shape.pipeline,
                     ", tensor shard ", tensor_rank, " of ", shape.tensor);
}

Grid make_grid(const GridShape& shape, ProcessGroupPtr world_group) {
  ProcessGroupPtr w = world_group ? std::move(world_group) : world();
  const int n = w->size();
  BRAID_CHECK(shape.pipeline >= 1 && shape.tensor >= 1 && shape.data >= 0,
              "make_grid: the pipeline and tensor sizes must be positive and data at least 0 (0: the rest), got data ",
              shape.data, ", pipeline ", shape.pipeline, ", tensor ", shape.tensor);
  const int model = shape.pipeline * shape.tensor;
  BRAID_CHECK(n % model == 0 && (shape.data == 0 || shape.data * model == n), "make_grid: ", n,
              " ranks do not form a grid of ", shape.data == 0 ? std::string("D") : std::to_string(shape.data),
              " replicas x ", shape.pipeline, " pipeline stages x ", shape.tensor, " tensor shards (group ", w->name(),
              ")");
  Grid g;
  g.shape = shape;
  g.shape.data = n / model;
  const int r = w->rank();
  g.tensor_rank = r % shape.tensor;
  g.stage = (r / shape.tensor) % shape.pipeline;
  g.replica = r / model;
  // One color per group that varies only along the group's own axis (split orders members by key).
  g.tensor = w->split(g.replica * shape.pipeline + g.stage, g.tensor_rank);
  g.pipeline = w->split(g.replica * shape.tensor + g.tensor_rank, g.stage);
  g.data = w->split(g.stage * shape.tensor + g.tensor_rank, g.replica);
  g.model = w->split(g.replica, r % model);
  return g;
}

Grid make_grid(int pipeline_stages, ProcessGroupPtr world_group) {
  ProcessGroupPtr w = world_group ? std::move(world_group) : world();
  BRAID_CHECK(pipeline_stages >= 1 && w->size() % pipeline_stages == 0, "make_grid: ", w->size(),
              " ranks do not divide into pipelines of ", pipeline_stages, " stages");
  return make_grid(GridShape{.data = 0, .pipeline = pipeline_stages, .tensor = 1}, w);
}

}  // namespace braid::distributed
