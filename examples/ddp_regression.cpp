// braid-ddp-regression: data-parallel least squares, the smallest complete DistributedDataParallel
// program. Every rank builds the same data set and model, trains on its own rows, and DDP averages the
// gradients, so N ranks (mpiexec -n N) end with the weights of one process on all the rows. It is
// the data-parallel program that tests/install builds with CMake against an installed braid; its
// printed weights are checked there against plain gradient descent computed with NumPy.
//
//   mpiexec -n 2 ./braid-ddp-regression [steps]
#include <braid/braid.h>
#include <braid/distributed.h>
#include <braid/nn/nn.h>
#include <braid/optim.h>

#include <cstdio>
#include <cstdlib>
#include <memory>

int main(int argc, char** argv) {
  const int64_t steps = argc > 1 ? std::atoll(argv[1]) : 50;
  const int64_t rows = 64, features = 3;
  const auto& info = braid::distributed::init();
  auto world = braid::distributed::world();
  if (rows % world->size() != 0) {
    braid::distributed::abort_job("braid-ddp-regression: 64 rows do not split evenly over " +
                                  std::to_string(world->size()) + " ranks");
  }

  // The data, the same on every rank, in float64: over a grid s of [-1, 1], one row per point,
  // x = [sin(s), sin(2 s), sin(3 s)] and y = x [1.5, -2, 0.5]^T + 0.3 + 0.1 cos(5 s).
  const braid::Tensor s = braid::linspace(-1.0, 1.0, rows, braid::kFloat64).reshape({rows, 1});
  const braid::Tensor x = braid::sin(braid::matmul(s, braid::tensor(std::vector<double>{1.0, 2.0, 3.0}, {1, features})));
  const braid::Tensor w_true = braid::tensor(std::vector<double>{1.5, -2.0, 0.5}, {features, 1});
  const braid::Tensor y = braid::matmul(x, w_true) + 0.3 + braid::cos(s * 5.0) * 0.1;

  // This rank's rows: a contiguous shard, as a DataLoader with num_shards = world size gives.
  const int64_t per_rank = rows / world->size();
  const braid::Tensor x_mine = x.narrow(0, world->rank() * per_rank, per_rank);
  const braid::Tensor y_mine = y.narrow(0, world->rank() * per_rank, per_rank);

  auto model = std::make_shared<braid::nn::Linear>(features, 1);
  model->to(braid::kFloat64);
  {
    braid::NoGradGuard no_grad;  // start from zero weights, so the run has one answer
    for (braid::Tensor p : model->parameters()) p.zero_();
  }
  braid::distributed::DistributedDataParallel ddp(model);
  braid::optim::SGDOptions options;
  options.lr = 0.2;
  braid::optim::SGD opt(model->parameters(), options);

  double loss = 0.0;
  for (int64_t step = 1; step <= steps; ++step) {
    opt.zero_grad();
    braid::Tensor l = braid::nn::mse_loss(ddp(x_mine), y_mine);
    l.backward();  // the gradients arrive averaged over the ranks
    opt.step();
    braid::Tensor total = l.detach();
    world->all_reduce(total, braid::distributed::ReduceOp::Average);  // the loss over every row
    loss = total.item();
  }
  if (world->rank() == 0) {
    const braid::Tensor w = model->weight().reshape({features});
    std::printf("ranks %d steps %lld loss %.12f\n", info.size, static_cast<long long>(steps), loss);
    std::printf("weight %.12f %.12f %.12f bias %.12f\n", w.select(0, 0).item(), w.select(0, 1).item(),
                w.select(0, 2).item(), model->bias().item());
  }
  braid::distributed::finalize();
}
