// Tensor and sequence parallelism, run plainly and under `mpiexec -n 2` and `-n 4`, over the world
// (tp = world size) and, at 4 ranks, over pairs made by split (tp = 2): the collectives against
// closed forms, and the parallel layers against the one-process serial model that every rank also
// computes (outputs and every gradient, float32 and float64), the traffic counter against the
// counts Note [Tensor-parallel regions] gives, and the weight bytes per rank against 1/tp.
#include <algorithm>
#include <cmath>
#include <map>

#include "braid/autograd.h"
#include "braid/distributed.h"
#include "braid/nn/nn.h"
#include "braid/random.h"
#include "mpi_test_main.h"

using namespace braid;
using namespace braid::distributed;
using braid::testing::DistTest;
using braid::testing::N;
using braid::testing::R;

namespace {

struct TpGroup {
  std::string label;
  ProcessGroupPtr group;
};

/// The world, and at 4 ranks also pairs of ranks {0, 1} and {2, 3}.
std::vector<TpGroup> tp_groups() {
  static ProcessGroupPtr pairs = N() == 4 ? world()->split(world()->rank() / 2, world()->rank()) : nullptr;
  std::vector<TpGroup> out{{"tp=world(" + std::to_string(N()) + ")", world()}};
  if (pairs) out.push_back({"tp=2 in a world of 4", pairs});
  return out;
}

double max_abs_diff(const Tensor& a, const Tensor& b) {
  return a.numel() == 0 ? 0.0 : amax(abs(a.to(kFloat64) - b.to(kFloat64))).item();
}

/// |got - want| <= tol max|want| elementwise: 2e-5 for float32, 1e-10 for float64.
void expect_close(const Tensor& got, const Tensor& want, const std::string& what) {
  ASSERT_TRUE(got.defined() && want.defined()) << what << ": undefined tensor";
  ASSERT_EQ(got.shape(), want.shape()) << what;
  const double tol = want.dtype() == kFloat64 ? 1e-10 : 2e-5;
  const double scale = want.numel() == 0 ? 0.0 : amax(abs(want.to(kFloat64))).item();
  EXPECT_LE(max_abs_diff(got, want), tol * std::max(scale, 1e-6)) << what << " (max |want| = " << scale << ")";
}

/// A value per element that differs between ranks and is exact in binary: (i + 100 r) / 8.
Tensor rank_tensor(const Shape& shape, int r, DType dt = kFloat64) {
  int64_t n = 1;
  for (int64_t s : shape) n *= s;
  return ((arange(0, static_cast<double>(n), 1, kFloat64) + 100.0 * r) * 0.125).reshape(shape).to(dt);
}

/// The part of a serial parameter (or gradient) that a rank's parallel one holds: the whole of it,
/// its slice along the axis whose size differs, or for in_proj_* this rank's rows of each of q, k, v.
Tensor shard_of(const std::string& name, const Tensor& full, const Shape& local, int P, int r) {
  if (full.shape() == local) return full;
  if (name.ends_with("in_proj_weight") || name.ends_with("in_proj_bias")) {
    std::vector<Tensor> parts;
    for (const Tensor& t : chunk(full, 3, 0)) parts.push_back(t.narrow(0, r * (t.size(0) / P), t.size(0) / P));
    return concat(parts, 0);
  }
  for (int64_t d = 0; d < full.dim(); ++d)
    if (full.size(d) != local[static_cast<size_t>(d)])
      return full.narrow(d, r * local[static_cast<size_t>(d)], local[static_cast<size_t>(d)]);
  return full;
}

/// Every parameter of par has the serial name, and its gradient is the serial gradient's shard.
void expect_grads_match(const nn::Module& serial, const nn::Module& par, const ProcessGroup& g,
                        const std::string& what) {
  std::map<std::string, Tensor> want;
  for (auto& [n, p] : serial.named_parameters()) want[n] = p;
  const auto got = par.named_parameters();
  EXPECT_EQ(got.size(), want.size()) << what;
  for (auto& [n, p] : got) {
    ASSERT_TRUE(want.count(n)) << what << ": parameter '" << n << "' has no serial counterpart";
    ASSERT_TRUE(p.grad().defined()) << what << ": " << n << " has no gradient";
    expect_close(p.grad(), shard_of(n, want[n].grad(), p.shape(), g.size(), g.rank()), what + " grad of " + n);
    expect_close(p.detach(), shard_of(n, want[n].detach(), p.shape(), g.size(), g.rank()), what + " value of " + n);
  }
}

/// sum(out * w) with w fixed: a loss whose gradient differs at every element.
Tensor weighted_sum(const Tensor& out, uint64_t seed) {
  Generator gen(seed);
  return sum(out * randn(out.shape(), out.dtype(), &gen));
}

}  // namespace

// ---- the collectives against closed forms ----

class TensorParallelCollectives : public DistTest {};

TEST_F(TensorParallelCollectives, ForwardAndBackwardAreTheDualCollectives) {
  for (const auto& [label, g] : tp_groups()) {
    const int P = g->size(), r = g->rank();
    const Shape s{4, 3, 2};
    auto all_ranks = [&](int64_t axis) {  // every rank's rank_tensor concatenated along axis
      std::vector<Tensor> parts;
      for (int q = 0; q < P; ++q) parts.push_back(rank_tensor(s, q));
      return concat(parts, axis);
    };
    Tensor sum_over_ranks = zeros(s, kFloat64);
    for (int q = 0; q < P; ++q) sum_over_ranks = sum_over_ranks + rank_tensor(s, q);

    {  // copy_to_tp: identity forward, gradients summed
      Tensor x = rank_tensor(s, r).set_requires_grad();
      Tensor y = copy_to_tp(x, g);
      expect_close(y, rank_tensor(s, r), label + " copy_to_tp forward");
      y.backward(rank_tensor(s, r));
      expect_close(x.grad(), sum_over_ranks, label + " copy_to_tp backward");
    }
    {  // reduce_from_tp: summed forward, identity backward
      Tensor x = rank_tensor(s, r).set_requires_grad();
      Tensor y = reduce_from_tp(x, g);
      expect_close(y, sum_over_ranks, label + " reduce_from_tp forward");
      y.backward(rank_tensor(s, 7));
      expect_close(x.grad(), rank_tensor(s, 7), label + " reduce_from_tp backward");
    }
    for (int64_t axis : {0, 1, 2}) {  // gathers: concatenated forward
      const std::string a = label + " gather axis " + std::to_string(axis);
      Tensor x = rank_tensor(s, r).set_requires_grad();
      Tensor y = axis == 2 ? gather_from_tp(x, g) : gather_from_sp(x, axis, g);
      expect_close(y, all_ranks(axis), a + " forward");
      y.backward(all_ranks(axis) * (r + 1.0));  // rank q's upstream gradient is (q + 1) times the same
      // gather_from_tp keeps its own slice; gather_from_sp reduce-scatters, summing (q + 1) over q.
      Tensor want = axis == 2 ? rank_tensor(s, r) * (r + 1.0) : rank_tensor(s, r) * (P * (P + 1) / 2.0);
      expect_close(x.grad(), want, a + " backward");
    }
    const Shape big{4 * P, 3, 2 * P};
    Tensor whole = zeros(big, kFloat64);
    for (int q = 0; q < P; ++q) whole = whole + rank_tensor(big, q);
    for (int kind = 0; kind < 3; ++kind) {  // scatters: sliced forward, gradient all-gathered
      const int64_t axis = kind == 2 ? 2 : 0;
      const char* names[] = {"reduce_scatter_to_sp", "scatter_to_sp", "scatter_to_tp"};
      const std::string a = label + " " + names[kind];
      Shape small = big;
      const int64_t n = big[static_cast<size_t>(axis)] / P;
      small[static_cast<size_t>(axis)] = n;
      Tensor x = rank_tensor(big, r).set_requires_grad();
      Tensor y = kind == 0 ? reduce_scatter_to_sp(x, 0, g) : kind == 1 ? scatter_to_sp(x, 0, g) : scatter_to_tp(x, g);
      Tensor want = (kind == 0 ? whole : rank_tensor(big, r)).narrow(axis, r * n, n);
      expect_close(y, want, a + " forward");
      y.backward(rank_tensor(small, r));
      std::vector<Tensor> parts;
      for (int q = 0; q < P; ++q) parts.push_back(rank_tensor(small, q));
      expect_close(x.grad(), concat(parts, axis), a + " backward");
    }
  }
}

// ---- layers against the serial model ----

class TensorParallelLayers : public DistTest {};

TEST_F(TensorParallelLayers, ColumnThenRowParallelLinearEqualsSerial) {
  for (const auto& [label, g] : tp_groups()) {
    for (DType dt : {kFloat32, kFloat64}) {
      const std::string what = label + " " + dtype_name(dt);
      manual_seed(5);
      auto serial = std::make_shared<nn::Sequential>();
      serial->add(std::make_shared<nn::Linear>(8, 12))
          .add(std::make_shared<nn::ReLU>())
          .add(std::make_shared<nn::Linear>(12, 8));
      serial->to(dt);
      auto par = std::make_shared<nn::Sequential>();
      par->add(std::make_shared<ColumnParallelLinear>(*std::dynamic_pointer_cast<nn::Linear>(serial->at(0)), g))
          .add(std::make_shared<nn::ReLU>())
          .add(std::make_shared<RowParallelLinear>(*std::dynamic_pointer_cast<nn::Linear>(serial->at(2)), g));
      Generator gen(9);
      Tensor x0 = randn({5, 3, 8}, dt, &gen);
      Tensor xs = x0.clone().set_requires_grad(), xp = x0.clone().set_requires_grad();
      Tensor ys = serial->forward(xs), yp = par->forward(xp);
      expect_close(yp, ys, what + " output");
      weighted_sum(ys, 1).backward();
      weighted_sum(yp, 1).backward();
      expect_close(xp.grad(), xs.grad(), what + " input grad");
      expect_grads_match(*serial, *par, *g, what);
    }
  }
}

TEST_F(TensorParallelLayers, LayersMadeFromSizesHoldTheirShardOfTheSerialInitialisation) {
  for (const auto& [label, g] : tp_groups()) {
    manual_seed(21);
    nn::Linear l1(8, 12), l2(12, 8);
    nn::Embedding emb(16, 4);
    manual_seed(21);  // every rank alike, and the draws in the serial order
    ColumnParallelLinear c(8, 12, g);
    RowParallelLinear rw(12, 8, g);
    VocabParallelEmbedding pemb(16, 4, g);
    for (auto [serial, par] : {std::pair<nn::Module*, nn::Module*>{&l1, &c}, {&l2, &rw}, {&emb, &pemb}}) {
      const nn::StateDict want = serial->state_dict();
      for (auto& [n, t] : par->state_dict())
        EXPECT_EQ(max_abs_diff(t, shard_of(n, want.at(n), t.shape(), g->size(), g->rank())), 0.0)
            << label << " " << par->type_name() << "." << n;
    }
  }
}

TEST_F(TensorParallelLayers, GatheredColumnAndScatteredRowInputsEqualSerial) {
  for (const auto& [label, g] : tp_groups()) {
    manual_seed(6);
    nn::Linear l1(8, 12), l2(12, 4);
    l1.to(kFloat64), l2.to(kFloat64);
    ColumnParallelLinear c(l1, g, {.gather_output = true});
    RowParallelLinear rw(l2, g, {.input_is_parallel = false});
    Generator gen(10);
    Tensor x0 = randn({6, 8}, kFloat64, &gen);
    Tensor xs = x0.clone().set_requires_grad(), xp = x0.clone().set_requires_grad();
    Tensor ys = l2.forward(tanh(l1.forward(xs))), hp = c.forward(xp);
    expect_close(hp, l1.forward(x0), label + " gathered column output");
    Tensor yp = rw.forward(tanh(hp));
    expect_close(yp, ys, label + " output");
    weighted_sum(ys, 2).backward();
    weighted_sum(yp, 2).backward();
    expect_close(xp.grad(), xs.grad(), label + " input grad");
    expect_grads_match(l1, c, *g, label + " column");
    expect_grads_match(l2, rw, *g, label + " row");
  }
}

TEST_F(TensorParallelLayers, HeadParallelAttentionEqualsSerialWithMasks) {
  for (const auto& [label, g] : tp_groups()) {
    for (bool batch_first : {false, true}) {
      const std::string what = label + (batch_first ? " batch_first" : "");
      manual_seed(7);
      nn::MultiheadAttention serial(8, 4, {.bias = true, .batch_first = batch_first});
      serial.to(kFloat64);
      ParallelMultiheadAttention par(serial, g);
      EXPECT_EQ(par.local_heads(), 4 / g->size());
      Generator gen(11);
      const int64_t L = 5, S = 6, B = 2;
      Shape qs = batch_first ? Shape{B, L, 8} : Shape{L, B, 8}, ks = batch_first ? Shape{B, S, 8} : Shape{S, B, 8};
      Tensor q0 = randn(qs, kFloat64, &gen), k0 = randn(ks, kFloat64, &gen);
      Tensor qs_ = q0.clone().set_requires_grad(), ks_ = k0.clone().set_requires_grad();
      Tensor qp = q0.clone().set_requires_grad(), kp = k0.clone().set_requires_grad();
      Tensor pad = zeros({B, S}, kBool);
      pad.narrow(1, S - 2, 2).narrow(0, 1, 1).fill_(1.0);  // batch 1 ignores its last two keys
      Tensor mask = randn({B * 4, L, S}, kFloat64, &gen);  // one additive mask per head
      Tensor ys = serial.forward(qs_, ks_, ks_, pad, mask), yp = par.forward(qp, kp, kp, pad, mask);
      expect_close(yp, ys, what + " cross-attention output");
      weighted_sum(ys, 3).backward();
      weighted_sum(yp, 3).backward();
      expect_close(qp.grad(), qs_.grad(), what + " query grad");
      expect_close(kp.grad(), ks_.grad(), what + " key grad");
      expect_grads_match(serial, par, *g, what);
    }
  }
}

// ---- a Transformer encoder parallelised by name ----

namespace {

std::shared_ptr<nn::Sequential> encoder(DType dt, bool batch_first = false, bool norm_first = false) {
  manual_seed(8);
  auto m = std::make_shared<nn::Sequential>();
  for (int i = 0; i < 2; ++i)
    m->add(std::make_shared<nn::TransformerEncoderLayer>(
        8, 4,
        nn::TransformerEncoderLayerOptions{
            .dim_feedforward = 16, .dropout = 0.0, .batch_first = batch_first, .norm_first = norm_first}));
  m->to(dt);
  return m;
}

std::vector<std::pair<std::string, ParallelStyle>> encoder_plan(bool with_norms) {
  std::vector<std::pair<std::string, ParallelStyle>> plan;
  for (const char* l : {"0", "1"}) {
    const std::string p = l;
    plan.push_back({p + ".self_attn", ParallelStyle::Headwise});
    plan.push_back({p + ".linear1", ParallelStyle::Colwise});
    plan.push_back({p + ".linear2", ParallelStyle::Rowwise});
    if (with_norms) {
      plan.push_back({p + ".norm1", ParallelStyle::Sequence});
      plan.push_back({p + ".norm2", ParallelStyle::Sequence});
    }
  }
  return plan;
}

int64_t bytes_of(const Tensor& t) { return t.numel() * static_cast<int64_t>(dtype_size(t.dtype())); }

}  // namespace

class TensorParallelEncoder : public DistTest {};

TEST_F(TensorParallelEncoder, ParallelizeModuleEqualsSerialWithTwoAllReducesEachWayPerLayer) {
  for (const auto& [label, g] : tp_groups()) {
    for (DType dt : {kFloat32, kFloat64}) {
      const std::string what = label + " " + dtype_name(dt);
      auto serial = encoder(dt), par = encoder(dt);
      const ParallelizeResult res = parallelize_module(*par, g, encoder_plan(false));
      EXPECT_EQ(res.replaced.size(), 6u) << what;
      EXPECT_TRUE(res.sequence_parallel_parameters.empty()) << what;
      EXPECT_EQ(par->child("0.linear1")->type_name(), "ColumnParallelLinear");
      EXPECT_EQ(par->child("1.self_attn.out_proj")->type_name(), "RowParallelLinear");

      // Weight bytes: the split tensors hold exactly 1/tp of the serial ones, the rest all of them.
      std::map<std::string, Tensor> whole;
      for (auto& [n, p] : serial->named_parameters()) whole[n] = p;
      int64_t split_serial = 0, split_mine = 0;
      for (auto& [n, p] : par->named_parameters()) {
        const bool split = n.ends_with("in_proj_weight") || n.ends_with("in_proj_bias") ||
                           n.ends_with("out_proj.weight") || n.ends_with("linear1.weight") ||
                           n.ends_with("linear1.bias") || n.ends_with("linear2.weight");
        if (split) {
          EXPECT_EQ(bytes_of(p) * g->size(), bytes_of(whole[n])) << what << " " << n;
          split_serial += bytes_of(whole[n]), split_mine += bytes_of(p);
        } else {
          EXPECT_EQ(bytes_of(p), bytes_of(whole[n])) << what << " " << n;
        }
      }
      EXPECT_EQ(split_mine * g->size(), split_serial) << what;

      const int64_t L = 8, B = 3, E = 8;
      Generator gen(12);
      Tensor x0 = randn({L, B, E}, dt, &gen);
      Tensor xs = x0.clone().set_requires_grad(), xp = x0.clone().set_requires_grad();
      Tensor ys = serial->forward(xs);
      g->reset_traffic();
      Tensor yp = par->forward(xp);
      const Traffic fwd = g->traffic();
      expect_close(yp, ys, what + " output");
      weighted_sum(ys, 4).backward();
      Tensor loss = weighted_sum(yp, 4);
      g->reset_traffic();
      loss.backward();
      const Traffic bwd = g->traffic();
      expect_close(xp.grad(), xs.grad(), what + " input grad");
      expect_grads_match(*serial, *par, *g, what);

      // The shards gather back into the serial state dict, bitwise before a step and close after one.
      for (auto& [n, t] : gather_state_dict(*par)) EXPECT_EQ(max_abs_diff(t, serial->state_dict().at(n)), 0.0) << n;
      {
        NoGradGuard no_grad;
        for (auto* m : {serial.get(), par.get()})
          for (Tensor p : m->parameters()) p.add_(p.grad(), -0.1);
      }
      const nn::StateDict stepped = gather_state_dict(*par);
      EXPECT_EQ(stepped.size(), serial->state_dict().size()) << what;
      for (auto& [n, t] : serial->state_dict()) expect_close(stepped.at(n), t, what + " after a step: " + n);
      auto reloaded = encoder(dt);
      reloaded->load_state_dict(stepped);  // the serial model takes the gathered state as it is
      expect_close(reloaded->forward(x0), serial->forward(x0), what + " serial model from the gathered state");

      // Two all-reduces of the (L, N, E) activations per layer each way, nothing else.
      for (const auto& [dir, t] : {std::pair{"forward", fwd}, std::pair{"backward", bwd}}) {
        EXPECT_EQ(t.all_reduce.calls, 2 * 2) << what << " " << dir;
        EXPECT_EQ(t.all_reduce.elements, 2 * 2 * L * B * E) << what << " " << dir;
        EXPECT_EQ(t.all_gather.calls + t.reduce_scatter.calls + t.broadcast.calls, 0) << what << " " << dir;
        // A ring all-reduce sends 2 (tp - 1) / tp of its elements from each rank.
        EXPECT_DOUBLE_EQ(t.bus_elements(), 2 * 2 * 2.0 * (g->size() - 1) / g->size() * L * B * E) << what << " " << dir;
      }
    }
  }
}

TEST_F(TensorParallelEncoder, SequenceParallelEqualsSerialWithGathersAndScattersInsteadOfAllReduces) {
  for (const auto& [label, g] : tp_groups()) {
    // Post-norm with the sequence first, and pre-norm batch-first (the sequence on axis 1).
    for (bool batch_first : {false, true}) {
      for (DType dt : {kFloat32, kFloat64}) {
        const std::string what =
            label + " " + dtype_name(dt) + " sequence-parallel" + (batch_first ? " batch_first norm_first" : "");
        const int P = g->size(), r = g->rank();
        const int64_t ax = batch_first ? 1 : 0;
        auto serial = encoder(dt, batch_first, batch_first), par = encoder(dt, batch_first, batch_first);
        const ParallelizeResult res =
            parallelize_module(*par, g, encoder_plan(true), {.sequence_parallel = true, .sequence_axis = ax});
        // norm1 and norm2 (weight, bias) and the two row-parallel biases, per layer.
        EXPECT_EQ(res.sequence_parallel_parameters.size(), 2u * 6u) << what;

        const int64_t L = 8, B = 3, E = 8, Ls = L / P;
        const Shape shape = batch_first ? Shape{B, L, E} : Shape{L, B, E};
        Generator gen(13);
        Tensor x0 = randn(shape, dt, &gen), w = randn(shape, dt, &gen);
        Tensor xs = x0.clone().set_requires_grad(), xp = x0.narrow(ax, r * Ls, Ls).clone().set_requires_grad();
        Tensor ys = serial->forward(xs);
        g->reset_traffic();
        Tensor yp = par->forward(xp);  // this rank's Ls positions
        const Traffic fwd = g->traffic();
        expect_close(yp, ys.narrow(ax, r * Ls, Ls), what + " output shard");
        sum(ys * w).backward();
        Tensor loss = sum(yp * w.narrow(ax, r * Ls, Ls));  // this rank's share of the serial loss
        g->reset_traffic();
        loss.backward();
        const Traffic bwd = g->traffic();
        expect_close(xp.grad(), xs.grad().narrow(ax, r * Ls, Ls), what + " input grad shard");

        for (const auto& [dir, t] : {std::pair{"forward", fwd}, std::pair{"backward", bwd}}) {
          EXPECT_EQ(t.all_reduce.calls, 0) << what << " " << dir;
          EXPECT_EQ(t.all_gather.calls, 2 * 2) << what << " " << dir;
          EXPECT_EQ(t.reduce_scatter.calls, 2 * 2) << what << " " << dir;
          // Each moves the whole (L, N, E) activation: all_gather counts its output, reduce_scatter its input.
          EXPECT_EQ(t.all_gather.elements, 2 * 2 * L * B * E) << what << " " << dir;
          EXPECT_EQ(t.reduce_scatter.elements, 2 * 2 * L * B * E) << what << " " << dir;
          // (tp - 1) / tp of each from each rank: the volume of the two all-reduces without sequence parallelism.
          EXPECT_DOUBLE_EQ(t.bus_elements(), 2 * 2 * 2.0 * (P - 1) / P * L * B * E) << what << " " << dir;
        }
        // The norms and the row-parallel biases saw this rank's positions only: one all-reduce sums them.
        all_reduce_gradients(res.sequence_parallel_parameters, g);
        EXPECT_EQ(g->traffic().all_reduce.calls, 1) << what;
        EXPECT_EQ(g->traffic().all_reduce.elements, 2 * (4 * E + 2 * E)) << what << ": norms' 4 E, biases' 2 E a layer";
        expect_grads_match(*serial, *par, *g, what);
      }
    }
  }
}

TEST_F(TensorParallelEncoder, LanguageModelWithSequenceParallelismEqualsSerial) {
  // Embedding -> encoder layer -> vocabulary head -> cross-entropy, Megatron's whole layout: the
  // embedding reduce-scatters into sequence shards, the head gathers them and leaves its classes split.
  for (const auto& [label, g] : tp_groups()) {
    for (DType dt : {kFloat32, kFloat64}) {
      const std::string what = label + " " + dtype_name(dt);
      const int64_t V = 16, E = 8, L = 8, B = 3;
      auto model = [&] {
        manual_seed(14);
        auto m = std::make_shared<nn::Sequential>();
        m->add(std::make_shared<nn::Embedding>(V, E))
            .add(std::make_shared<nn::TransformerEncoderLayer>(
                E, 4, nn::TransformerEncoderLayerOptions{.dim_feedforward = 16, .dropout = 0.0}))
            .add(std::make_shared<nn::Linear>(E, V));
        m->to(dt);
        return m;
      };
      auto serial = model(), par = model();
      const ParallelizeResult res = parallelize_module(*par, g,
                                                       {{"0", ParallelStyle::Vocab},
                                                        {"1.self_attn", ParallelStyle::Headwise},
                                                        {"1.linear1", ParallelStyle::Colwise},
                                                        {"1.linear2", ParallelStyle::Rowwise},
                                                        {"1.norm1", ParallelStyle::Sequence},
                                                        {"1.norm2", ParallelStyle::Sequence},
                                                        {"2", ParallelStyle::Colwise}},
                                                       {.sequence_parallel = true});
      Generator gen(15);
      Tensor tokens = floor(rand({L, B}, kFloat64, &gen) * static_cast<double>(V)).to(kInt64);
      Tensor target = floor(rand({L, B}, kFloat64, &gen) * static_cast<double>(V)).to(kInt64);
      Tensor ls = nn::cross_entropy(serial->forward(tokens).reshape({-1, V}), target.reshape({-1}));
      Tensor logits = par->forward(tokens);
      EXPECT_EQ(logits.shape(), (Shape{L, B, V / g->size()})) << what;
      Tensor lp = vocab_parallel_cross_entropy(logits, target, g);
      expect_close(lp, ls, what + " loss");
      ls.backward();
      lp.backward();
      all_reduce_gradients(res.sequence_parallel_parameters, g);
      expect_grads_match(*serial, *par, *g, what);
    }
  }
}

// ---- embedding and cross-entropy over a split vocabulary ----

TEST_F(TensorParallelLayers, VocabParallelEmbeddingAndCrossEntropyEqualSerial) {
  for (const auto& [label, g] : tp_groups()) {
    for (DType dt : {kFloat32, kFloat64}) {
      const std::string what = label + " " + dtype_name(dt);
      const int64_t V = 16, E = 8;
      manual_seed(9);
      nn::Embedding emb(V, E);
      nn::Linear head(E, V);
      emb.to(dt), head.to(dt);
      VocabParallelEmbedding pemb(emb, g);
      ColumnParallelLinear phead(head, g);  // logits stay split: (..., V / tp) per rank
      EXPECT_EQ(bytes_of(pemb.weight()) * g->size(), bytes_of(emb.weight())) << what;

      Tensor tokens = tensor(std::vector<int64_t>{0, 3, 15, 7, 8, 12, 1, 9, 4, 14, 11, 2}, {3, 4});
      Tensor target = tensor(std::vector<int64_t>{5, 15, 0, -100, 9, 8, 7, 3, 12, 1, -100, 6}, {3, 4});
      Tensor zs = head.forward(emb.forward(tokens));
      Tensor ls = nn::cross_entropy(zs.reshape({-1, V}), target.reshape({-1}));
      Tensor none_s = nn::cross_entropy(zs.reshape({-1, V}), target.reshape({-1}), Tensor(), -100, "none");
      Tensor zp = phead.forward(pemb.forward(tokens));
      EXPECT_EQ(zp.shape(), (Shape{3, 4, V / g->size()})) << what;
      g->reset_traffic();
      Tensor lp = vocab_parallel_cross_entropy(zp, target, g);
      EXPECT_EQ(g->traffic().all_reduce.calls, 2) << what << ": the maximum, then the sums and target logits";
      EXPECT_EQ(g->traffic().all_gather.calls, 0) << what << ": the logits are never gathered";
      expect_close(lp, ls, what + " loss");
      expect_close(vocab_parallel_cross_entropy(zp, target, g, -100, "none").reshape({-1}), none_s,
                   what + " per-position loss");
      ls.backward();
      g->reset_traffic();
      lp.backward();
      // Backward: only copy_to_tp's all-reduce in front of the head; the loss adds none.
      EXPECT_EQ(g->traffic().all_reduce.calls, 1) << what;
      EXPECT_EQ(g->traffic().all_reduce.elements, 2 * (4 * E + 2 * E)) << what << ": norms' 4 E, biases' 2 E per layer";
      expect_grads_match(emb, pemb, *g, what + " embedding");
      expect_grads_match(head, phead, *g, what + " head");
    }
  }
}

// ---- errors ----

TEST_F(TensorParallelLayers, UnevenSplitsAndUnknownNamesAreRejectedWithTheReason) {
  auto m = encoder(kFloat32);
  try {
    parallelize_module(*m, world(), {{"0.linear3", ParallelStyle::Colwise}});
    ADD_FAILURE() << "an unknown module name was accepted";
  } catch (const IndexError& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("unknown module '0.linear3'"), std::string::npos) << msg;
    EXPECT_NE(msg.find("known: 0, 0.self_attn, 0.self_attn.out_proj, 0.linear1"), std::string::npos) << msg;
  }
  try {
    parallelize_module(*m, world(), {{"0.norm1", ParallelStyle::Colwise}});
    ADD_FAILURE() << "a LayerNorm was accepted as Colwise";
  } catch (const TypeError& e) {
    EXPECT_NE(std::string(e.what()).find("'0.norm1' is a LayerNorm, but style Colwise needs a Linear"),
              std::string::npos)
        << e.what();
  }
  EXPECT_THROW(parallelize_module(*m, world(), {{"0.norm1", ParallelStyle::Sequence}}), ValueError)
      << "Sequence style without sequence parallelism";
  if (N() == 1) GTEST_SKIP() << "every split is even over one rank; the uneven cases need 2 or more";
  nn::Linear odd(8, 2 * N() + 1);
  try {
    ColumnParallelLinear c(odd, world());
    ADD_FAILURE() << "an uneven column split was accepted";
  } catch (const ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("out_features (" + std::to_string(2 * N() + 1) +
                                         ") must be divisible by the tensor-parallel size (" + std::to_string(N())),
              std::string::npos)
        << e.what();
  }
  EXPECT_THROW(RowParallelLinear(nn::Linear(2 * N() + 1, 4), world()), ValueError);
  EXPECT_THROW(VocabParallelEmbedding(2 * N() + 1, 4, world()), ValueError);
  nn::MultiheadAttention attn(6, 3, nn::MultiheadAttentionOptions{});  // 3 heads: uneven over 2 and 4 ranks
  try {
    ParallelMultiheadAttention p(attn, world());
    ADD_FAILURE() << "3 heads over " << N() << " ranks were accepted";
  } catch (const ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("num_heads (3) must be divisible by the tensor-parallel size"),
              std::string::npos)
        << e.what();
  }
  // A masked forward needs a MultiheadAttention: the replaced encoder layer says so.
  parallelize_module(*m, world(), {{"0.self_attn", ParallelStyle::Headwise}});
  auto layer = std::dynamic_pointer_cast<nn::TransformerEncoderLayer>(m->at(0));
  EXPECT_THROW(layer->forward(zeros({4, 2, 8}), nn::generate_square_subsequent_mask(4)), TypeError);
}

int main(int argc, char** argv) { return braid::testing::mpi_test_main(argc, argv); }
