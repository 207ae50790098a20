// The autograd engine itself: accumulation, retain_graph, no_grad, detach, long chains, and that
// saved buffers and graphs are released. Expected gradients are closed forms.
#include <gtest/gtest.h>

#include <cmath>

#include "braid/braid.h"

namespace braid {
namespace {

Tensor vec(std::vector<double> v) { return tensor(v, {static_cast<int64_t>(v.size())}); }

TEST(Autograd, AccumulatesWhenATensorIsUsedTwice) {
  Tensor x = vec({1, -2, 3}).set_requires_grad();
  Tensor y = (x * x + x * 3.0).sum();  // dy/dx = 2x + 3
  y.backward();
  EXPECT_EQ(x.grad().to_vector<double>(), (std::vector<double>{5, -1, 9}));
}

TEST(Autograd, BackwardFromSeveralRootsIsOnePass) {
  // u = x^2, v = 3u + x (v's graph reaches u's), w = x itself (a leaf root):
  // d/dx [gu.u + gv.v + gw.w] = gu.2x + gv.(6x + 1) + gw.
  Tensor x = vec({1, -2, 3}).set_requires_grad();
  Tensor u = x * x, v = u * 3.0 + x;
  Tensor gu = vec({1, 2, 3}), gv = vec({-1, 0.5, 2}), gw = vec({10, 20, 30});
  int fired = 0;
  add_grad_ready_hook(x, [&] { ++fired; });
  backward({u, v}, {gu, gv});
  const auto xs = std::vector<double>{1, -2, 3};
  const auto a = gu.to_vector<double>(), b = gv.to_vector<double>();
  auto g = x.grad().to_vector<double>();
  for (size_t i = 0; i < 3; ++i) EXPECT_DOUBLE_EQ(g[i], a[i] * 2 * xs[i] + b[i] * (6 * xs[i] + 1)) << i;
  EXPECT_EQ(fired, 1) << "the hook fires once per pass, after both roots' contributions";
  x.set_grad(Tensor());
  backward({x}, {gw});
  EXPECT_EQ(x.grad().to_vector<double>(), gw.to_vector<double>());
  EXPECT_THROW(backward({u}, {vec({1, 2})}), ValueError);
  // No gradients, or an undefined one, mean ones: d/dx [sum(u) + gw.x] = 2x + gw.
  x.set_grad(Tensor());
  backward({x * x, x}, {Tensor(), gw});
  EXPECT_EQ(x.grad().to_vector<double>(), (std::vector<double>{12, 16, 36}));
  x.set_grad(Tensor());
  backward({x * x});
  EXPECT_EQ(x.grad().to_vector<double>(), (std::vector<double>{2, -4, 6}));
}

TEST(Autograd, GradientsAccumulateAcrossBackwardCalls) {
  Tensor x = vec({2}).set_requires_grad();
  (x * x).sum().backward();
  (x * x).sum().backward();
  EXPECT_DOUBLE_EQ(x.grad().item(), 8.0);
}

TEST(Autograd, BroadcastGradientIsReducedToOperandShape) {
  Tensor a = ones({2, 3}, kFloat64).set_requires_grad();
  Tensor b = vec({1, 2, 3}).set_requires_grad();
  (a * b).sum().backward();
  EXPECT_EQ(b.grad().shape(), (Shape{3}));
  EXPECT_EQ(b.grad().to_vector<double>(), (std::vector<double>{2, 2, 2}));
  EXPECT_EQ(a.grad().to_vector<double>(), (std::vector<double>{1, 2, 3, 1, 2, 3}));
}

TEST(Autograd, SecondBackwardWithoutRetainGraphFailsClearly) {
  Tensor x = vec({1, 2}).set_requires_grad();
  Tensor y = exp(x).sum();
  y.backward();
  try {
    y.backward();
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("retain_graph"), std::string::npos) << e.what();
  }
}

TEST(Autograd, RetainGraphAllowsASecondBackward) {
  Tensor x = vec({0.5}).set_requires_grad();
  Tensor y = exp(x).sum();
  y.backward(Tensor(), true);
  y.backward();
  EXPECT_NEAR(x.grad().item(), 2 * std::exp(0.5), 1e-15);
}

TEST(Autograd, NoGradRecordsNothing) {
  Tensor x = vec({1, 2}).set_requires_grad();
  Tensor y;
  {
    NoGradGuard guard;
    y = x * 2.0;
  }
  EXPECT_FALSE(y.requires_grad());
  EXPECT_TRUE(is_grad_enabled());
  EXPECT_THROW(y.sum().backward(), Error);
}

TEST(Autograd, DetachStopsGradientButSharesStorage) {
  Tensor x = vec({3}).set_requires_grad();
  Tensor d = x.detach();
  EXPECT_EQ(d.storage(), x.storage());
  EXPECT_FALSE(d.requires_grad());
  (x * d).sum().backward();  // d is a constant: dy/dx = d = 3
  EXPECT_DOUBLE_EQ(x.grad().item(), 3.0);
}

TEST(Autograd, ExplicitOutputGradient) {
  Tensor x = vec({1, 2, 3}).set_requires_grad();
  Tensor y = x * x;
  y.backward(vec({1, 0, -1}));
  EXPECT_EQ(x.grad().to_vector<double>(), (std::vector<double>{2, 0, -6}));
}

TEST(Autograd, NonScalarOutputNeedsAGradient) {
  Tensor x = vec({1, 2}).set_requires_grad();
  EXPECT_THROW((x * 2.0).backward(), ValueError);
  EXPECT_THROW((x * 2.0).backward(vec({1, 2, 3})), ValueError);
}

TEST(Autograd, RetainGradKeepsNonLeafGradient) {
  Tensor x = vec({1, 2}).set_requires_grad();
  Tensor h = x * 3.0;
  h.retain_grad();
  (h * h).sum().backward();
  EXPECT_EQ(h.grad().to_vector<double>(), (std::vector<double>{6, 12}));
  EXPECT_EQ(x.grad().to_vector<double>(), (std::vector<double>{18, 36}));
}

TEST(Autograd, LeafGradDoesNotAliasOtherGradients) {
  Tensor a = vec({1}).set_requires_grad(), b = vec({1}).set_requires_grad();
  (a + b).sum().backward();
  EXPECT_NE(a.grad().storage(), b.grad().storage());
}

TEST(Autograd, OnlyFloatingLeavesRequireGrad) {
  Tensor i = arange(3);
  EXPECT_THROW(i.set_requires_grad(), TypeError);
  Tensor x = vec({1}).set_requires_grad();
  Tensor y = x * 2.0;
  EXPECT_THROW(y.set_requires_grad(false), ValueError);
}

TEST(Autograd, InPlaceOnTrackedTensorIsRefused) {
  Tensor x = vec({1}).set_requires_grad();
  EXPECT_THROW(x.add_(vec({1})), ValueError);
  {
    NoGradGuard guard;
    x.add_(vec({1}));
  }
  EXPECT_DOUBLE_EQ(x.item(), 2.0);
}

TEST(Autograd, ChainOf100000OpsRunsBackwardWithoutRecursion) {
  const int n = 100000;
  Tensor x = vec({1.0}).set_requires_grad();
  Tensor y = x;
  for (int i = 0; i < n; ++i) y = y * 1.00001;
  y.sum().backward();
  EXPECT_NEAR(x.grad().item(), std::pow(1.00001, n), 1e-9);
  // Dropping y destroys the 100,000-node graph, which must not recurse either.
  y = Tensor();
}

TEST(Autograd, SavedBuffersAreFreedDuringBackward) {
  Tensor x = randn({1000}, kFloat64).set_requires_grad();
  Tensor y = exp(x);  // exp saves its output
  std::weak_ptr<Storage> saved = y.storage();
  Tensor loss = (y * 2.0).sum();
  y = Tensor();
  EXPECT_FALSE(saved.expired());  // the graph still holds exp's output
  loss.backward();
  EXPECT_TRUE(saved.expired());  // freed once exp's backward ran
}

TEST(Autograd, GraphIsReleasedAfterBackward) {
  const int64_t before = Storage::live_bytes();
  {
    Tensor x = randn({256, 256}, kFloat64).set_requires_grad();
    Tensor loss = sum(tanh(matmul(x, x)) * sigmoid(x));
    loss.backward();
    EXPECT_TRUE(x.grad().defined());
  }
  EXPECT_EQ(Storage::live_bytes(), before);
}

TEST(Autograd, UnreachedBranchStillLetsSharedNodesRun) {
  // y depends on h through a path with no gradient (argmax) and one with; h must still run.
  Tensor x = vec({1, 2}).set_requires_grad();
  Tensor h = x * 2.0;
  Tensor idx = argmax(h, 0);
  Tensor y = (h * h).sum() + cast(idx, kFloat64);
  y.backward();
  EXPECT_EQ(x.grad().to_vector<double>(), (std::vector<double>{8, 16}));
}

TEST(Autograd, SplitBackwardGivesTheInputGradientFirstAndTheWeightsLater) {
  // f = sum(w * x * x): df/dx = 2 w x now, df/dw = x^2 only when the deferred half runs.
  Tensor x = vec({1, -2, 3}).set_requires_grad();
  Tensor w = vec({0.5, 4, -1}).set_requires_grad();
  int fired = 0;
  add_grad_ready_hook(w, [&] { ++fired; });
  DeferredWeightGrads later = backward_input({(w * x * x).sum()}, {}, {x});
  EXPECT_EQ(x.grad().to_vector<double>(), (std::vector<double>{1, -16, -6}));
  EXPECT_FALSE(w.grad().defined());
  EXPECT_EQ(fired, 0);
  ASSERT_TRUE(later.pending());
  later.run();
  EXPECT_EQ(w.grad().to_vector<double>(), (std::vector<double>{1, 4, 9}));
  EXPECT_EQ(x.grad().to_vector<double>(), (std::vector<double>{1, -16, -6}));  // untouched by the second half
  EXPECT_EQ(fired, 1);
  EXPECT_FALSE(later.pending());
  EXPECT_THROW(later.run(), ValueError);
  EXPECT_THROW(backward_input({(w * x).sum()}, {}, {x * 2.0}), ValueError);  // not a leaf
}

TEST(Autograd, SplitBackwardEqualsBackwardBitwise) {
  // Two layers with a tied weight (used by both matmuls, through a transpose off the input path),
  // a bias, two roots: the halves together give backward()'s gradients exactly.
  Generator g(7);
  const Tensor x0 = randn({5, 4}, kFloat64, &g), w0 = randn({4, 4}, kFloat64, &g), b0 = randn({4}, kFloat64, &g);
  const Tensor gy = randn({5, 4}, kFloat64, &g), gz = randn({5, 4}, kFloat64, &g);
  auto run = [&](bool split) {
    Tensor x = x0.clone().set_requires_grad(), w = w0.clone().set_requires_grad(), b = b0.clone().set_requires_grad();
    Tensor h = tanh(matmul(x, transpose(w, 0, 1)) + b);
    Tensor y = matmul(h, transpose(w, 0, 1)), z = h * x;
    if (split) {
      DeferredWeightGrads later = backward_input({y, z}, {gy, gz}, {x});
      EXPECT_FALSE(w.grad().defined());
      EXPECT_FALSE(b.grad().defined());
      later.run();
    } else {
      backward({y, z}, {gy, gz});
    }
    return std::vector<std::vector<double>>{x.grad().to_vector<double>(), w.grad().to_vector<double>(),
                                            b.grad().to_vector<double>()};
  };
  const auto whole = run(false), halves = run(true);
  for (size_t i = 0; i < whole.size(); ++i) EXPECT_EQ(whole[i], halves[i]) << "gradient " << i;
}

TEST(Autograd, SplitBackwardFreesWhatOnlyTheInputGradientNeeds) {
  // exp saves its output a for the input gradient alone: freed by the first half. The product
  // b * w saves b for w's gradient: kept until the second half.
  Tensor x = randn({1000}, kFloat64).set_requires_grad();
  Tensor w = randn({1000}, kFloat64).set_requires_grad();
  Tensor a = exp(x), b = a + 1.0;
  std::weak_ptr<Storage> saved_a = a.storage(), saved_b = b.storage();
  Tensor loss = (b * w).sum();
  a = Tensor();
  b = Tensor();
  DeferredWeightGrads later = backward_input({loss}, {}, {x});
  loss = Tensor();
  EXPECT_TRUE(saved_a.expired());
  EXPECT_FALSE(saved_b.expired());
  later.run();
  EXPECT_TRUE(saved_b.expired());
}

TEST(Autograd, GradFnNames) {
  Tensor x = vec({1}).set_requires_grad();
  EXPECT_EQ(x.grad_fn_name(), "");
  EXPECT_EQ(exp(x).grad_fn_name(), "exp");
  EXPECT_EQ(matmul(x, x).grad_fn_name(), "reshape");  // 1-d . 1-d squeezes the 2-d product
  EXPECT_TRUE(x.is_leaf());
  EXPECT_FALSE(exp(x).is_leaf());
}

}  // namespace
}  // namespace braid
