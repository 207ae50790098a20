// braid-fit: fits a two-layer tanh MLP to y = sin(3x) on [-1, 1] with autograd and plain SGD, printing
// the loss as it falls. It is the README's main job until the training issue lands, and a short
// end-to-end exercise of creation ops, matmul, broadcasting, backward and in-place updates.
#include <braid/braid.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

namespace {

struct Mlp {
  braid::Tensor w1, b1, w2, b2;  // (1, H), (H), (H, 1), (1)

  std::vector<braid::Tensor*> parameters() { return {&w1, &b1, &w2, &b2}; }

  // x: (N, 1) -> (N, 1)
  braid::Tensor forward(const braid::Tensor& x) const {
    braid::Tensor h = braid::tanh(braid::matmul(x, w1) + b1);
    return braid::matmul(h, w2) + b2;
  }
};

braid::Tensor parameter(braid::Tensor t) {
  t.set_requires_grad(true);
  return t;
}

}  // namespace

int main(int argc, char** argv) {
  const int64_t steps = argc > 1 ? std::atoll(argv[1]) : 5000;
  const int64_t n = 256, hidden = 32;
  const double lr = 0.1;
  const int64_t report_every = steps >= 10 ? steps / 10 : 1;

  braid::manual_seed(0);  // same numbers at any thread count, so the printed losses are reproducible
  std::printf("braid-fit: 2-layer tanh MLP (hidden %lld) fitting y = sin(3x) on %lld points, %d threads\n",
              static_cast<long long>(hidden), static_cast<long long>(n), braid::get_num_threads());

  braid::Tensor x = braid::linspace(-1.0, 1.0, n).reshape({n, 1});
  braid::Tensor y = braid::sin(x * 3.0);

  // A wide first layer (std 2) puts the tanh knees inside [-1, 1], where sin(3x) bends; the second
  // layer is scaled by 1/sqrt(H) so the initial output is O(1).
  Mlp model{parameter(braid::randn({1, hidden}, braid::kFloat32, nullptr, 0.0, 2.0)),
            parameter(braid::zeros({hidden})),
            parameter(braid::randn({hidden, 1}, braid::kFloat32, nullptr, 0.0, 1.0 / std::sqrt(double(hidden)))),
            parameter(braid::zeros({1}))};

  using clock = std::chrono::steady_clock;
  const auto start = clock::now();
  auto last = start;
  int64_t last_step = 0;
  double loss_value = 0.0;
  for (int64_t step = 1; step <= steps; ++step) {
    braid::Tensor diff = model.forward(x) - y;
    braid::Tensor loss = braid::mean(diff * diff);
    loss.backward();
    {
      braid::NoGradGuard no_grad;  // the update itself must not be recorded
      for (braid::Tensor* p : model.parameters()) {
        p->add_(p->grad(), -lr);
        p->set_grad(braid::Tensor());
      }
    }
    if (step % report_every == 0 || step == 1 || step == steps) {
      loss_value = loss.item();
      if (!std::isfinite(loss_value)) {
        std::fprintf(stderr, "braid-fit: loss is %f at step %lld; the learning rate is too high\n", loss_value,
                     static_cast<long long>(step));
        return 1;
      }
      const auto now = clock::now();
      const double interval = std::chrono::duration<double>(now - last).count();
      std::printf("step %6lld/%lld  loss %.6f  %8.0f steps/s\n", static_cast<long long>(step),
                  static_cast<long long>(steps), loss_value, (step - last_step) / interval);
      std::fflush(stdout);
      last = now;
      last_step = step;
    }
  }
  const double seconds = std::chrono::duration<double>(clock::now() - start).count();
  std::printf("final loss %.6f after %lld steps in %.2f s\n", loss_value, static_cast<long long>(steps), seconds);
  return 0;
}
