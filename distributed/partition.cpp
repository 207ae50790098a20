// Layer profiling and the partitioning dynamic program (see partition.h).
//
// Note [Partition cost model]
// A stage holding layers [i, j) costs sum(forward + backward) of its layers plus, unless it is the
// last, 2 x output_bytes(j - 1) / bandwidth (the activation it sends and the gradient it gets back).
// Its memory is 4 x parameter bytes plus micro_batches_in_flight x the activations its layers
// produce. best[k][j] = the smallest possible slowest-stage time for the first j layers in k stages
// = min over i of max(best[k - 1][i], cost(i, j)): O(K L^2) with prefix sums.
#include "braid/distributed/partition.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <limits>
#include <map>
#include <sstream>

#include "braid/autograd.h"
#include "braid/nn/skip.h"
#include "braid/ops.h"

namespace braid::distributed {

namespace {

double seconds_of(const std::function<void()>& fn, int repeats) {
  fn();  // warm-up
  std::vector<double> t;
  for (int r = 0; r < repeats; ++r) {
    const auto start = std::chrono::steady_clock::now();
    fn();
    t.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  std::nth_element(t.begin(), t.begin() + static_cast<long>(t.size() / 2), t.end());
  return t[t.size() / 2];
}

}  // namespace

std::vector<LayerProfile> profile_layers(nn::Sequential& model, const Tensor& sample_input, int repeats) {
  BRAID_CHECK(repeats >= 1, "profile_layers: repeats must be at least 1, got ", repeats);
  BRAID_CHECK(model.size() >= 1, "profile_layers: the model has no layers");
  std::vector<LayerProfile> out;
  Tensor x = sample_input;
  // Tensors stashed by SkipStash and not yet used (skip.h): each run of a layer starts from a copy,
  // and a cut after the layer sends them along with its output.
  std::map<std::string, Tensor> carried;
  auto leaf = [](const Tensor& t) {
    Tensor l = t.detach();
    if (is_floating(l.dtype())) l.set_requires_grad(true);
    return l;
  };
  for (const auto& [name, layer] : model.named_children()) {
    LayerProfile p;
    p.name = name + " " + layer->describe();
    for (const Tensor& w : layer->parameters()) p.parameter_bytes += w.numel() * w.element_size();
    Tensor in = leaf(x);
    Tensor y;
    std::map<std::string, Tensor> left;
    auto run = [&] {
      nn::SkipScope scope(carried);
      Tensor r = layer->forward(in);
      left = scope.tensors();
      return r;
    };
    p.forward_seconds = seconds_of(
        [&] {
          NoGradGuard no_grad;
          y = run();
        },
        repeats);
    p.output_bytes = y.numel() * y.element_size();
    if (in.requires_grad() || !layer->parameters().empty()) {
      Tensor g = ones_like(y);
      // Backward alone: the forward that records the graph is outside the timed part.
      std::vector<double> t;
      for (int r = 0; r <= repeats; ++r) {
        Tensor yr = run();
        const auto start = std::chrono::steady_clock::now();
        if (yr.requires_grad()) yr.backward(g);
        if (r > 0) t.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
      }
      std::nth_element(t.begin(), t.begin() + static_cast<long>(t.size() / 2), t.end());
      p.backward_seconds = t[t.size() / 2];
      layer->zero_grad();
    }
    carried.clear();
    for (const auto& [k, v] : left) {
      carried[k] = leaf(v);
      p.output_bytes += v.numel() * v.element_size();
    }
    x = y.detach();
    out.push_back(p);
  }
  return out;
}

PartitionPlan partition(const std::vector<LayerProfile>& layers, int stages, const PartitionOptions& o) {
  const int n = static_cast<int>(layers.size());
  BRAID_CHECK(stages >= 1, "partition: stages must be at least 1, got ", stages);
  BRAID_CHECK(n >= stages, "partition: ", n, " layers cannot fill ", stages, " stages (each needs one)");
  BRAID_CHECK(o.micro_batches_in_flight >= 1, "partition: micro_batches_in_flight must be at least 1");
  std::vector<double> time(static_cast<size_t>(n + 1), 0.0);
  std::vector<int64_t> params(static_cast<size_t>(n + 1), 0), acts(static_cast<size_t>(n + 1), 0);
  for (int i = 0; i < n; ++i) {
    const auto& l = layers[static_cast<size_t>(i)];
    time[static_cast<size_t>(i + 1)] = time[static_cast<size_t>(i)] + l.forward_seconds + l.backward_seconds;
    params[static_cast<size_t>(i + 1)] = params[static_cast<size_t>(i)] + l.parameter_bytes;
    acts[static_cast<size_t>(i + 1)] = acts[static_cast<size_t>(i)] + l.output_bytes;
  }
  auto cost = [&](int i, int j) {  // layers [i, j)
    double c = time[static_cast<size_t>(j)] - time[static_cast<size_t>(i)];
    if (j < n && o.bandwidth > 0) c += 2.0 * static_cast<double>(layers[static_cast<size_t>(j - 1)].output_bytes) / o.bandwidth;
    return c;
  };
  auto memory = [&](int i, int j) {
    return 4 * (params[static_cast<size_t>(j)] - params[static_cast<size_t>(i)]) +
           o.micro_batches_in_flight * (acts[static_cast<size_t>(j)] - acts[static_cast<size_t>(i)]);
  };
  auto fits = [&](int i, int j) { return o.memory_limit <= 0 || memory(i, j) <= o.memory_limit; };

  PartitionPlan plan;
  if (!o.cuts.empty()) {
    BRAID_CHECK(static_cast<int>(o.cuts.size()) == stages - 1, "partition: ", stages, " stages need ", stages - 1,
                " cut points, got ", o.cuts.size());
    plan.first_layer.push_back(0);
    for (int c : o.cuts) {
      BRAID_CHECK(c > plan.first_layer.back() && c < n, "partition: cut points must increase within (0, ", n,
                  "), got ", c, " after ", plan.first_layer.back());
      plan.first_layer.push_back(c);
    }
  } else {
    const double inf = std::numeric_limits<double>::infinity();
    // best[k][j]: k stages over the first j layers; from[k][j]: where the last of them starts.
    std::vector<std::vector<double>> best(static_cast<size_t>(stages + 1), std::vector<double>(static_cast<size_t>(n + 1), inf));
    std::vector<std::vector<int>> from(static_cast<size_t>(stages + 1), std::vector<int>(static_cast<size_t>(n + 1), -1));
    best[0][0] = 0;
    for (int k = 1; k <= stages; ++k)
      for (int j = k; j <= n; ++j)
        for (int i = k - 1; i < j; ++i) {
          if (best[static_cast<size_t>(k - 1)][static_cast<size_t>(i)] == inf || !fits(i, j)) continue;
          const double v = std::max(best[static_cast<size_t>(k - 1)][static_cast<size_t>(i)], cost(i, j));
          if (v < best[static_cast<size_t>(k)][static_cast<size_t>(j)]) {
            best[static_cast<size_t>(k)][static_cast<size_t>(j)] = v;
            from[static_cast<size_t>(k)][static_cast<size_t>(j)] = i;
          }
        }
    if (best[static_cast<size_t>(stages)][static_cast<size_t>(n)] == inf) {
      int64_t largest_layer = 0;
      for (int i = 0; i < n; ++i) largest_layer = std::max(largest_layer, memory(i, i + 1));
      throw ValueError(::braid::detail::cat("partition: no plan of ", stages, " stages fits the memory limit of ",
                                            o.memory_limit, " bytes per stage; the largest single layer needs ",
                                            largest_layer, " bytes (use more stages or a higher limit)"));
    }
    std::vector<int> starts;
    for (int k = stages, j = n; k > 0; --k) {
      const int i = from[static_cast<size_t>(k)][static_cast<size_t>(j)];
      starts.push_back(i);
      j = i;
    }
    plan.first_layer.assign(starts.rbegin(), starts.rend());
  }
  for (int s = 0; s < stages; ++s) {
    const int i = plan.first_layer[static_cast<size_t>(s)];
    const int j = s + 1 < stages ? plan.first_layer[static_cast<size_t>(s + 1)] : n;
    plan.stage_seconds.push_back(cost(i, j));
    plan.stage_bytes.push_back(memory(i, j));
    plan.bottleneck_seconds = std::max(plan.bottleneck_seconds, cost(i, j));
    if (o.memory_limit > 0 && !o.cuts.empty())
      BRAID_CHECK(fits(i, j), "partition: stage ", s, " of the manual plan needs ", memory(i, j),
                  " bytes, over the limit of ", o.memory_limit);
  }
  return plan;
}

std::shared_ptr<nn::Sequential> slice_layers(const nn::Sequential& model, int begin, int end) {
  const auto children = model.named_children();
  BRAID_CHECK(0 <= begin && begin < end && end <= static_cast<int>(children.size()), "slice_layers: layers [", begin,
              ", ", end, ") are not within the model's ", children.size());
  auto stage = std::make_shared<nn::Sequential>();
  for (int i = begin; i < end; ++i) stage->add(children[static_cast<size_t>(i)].second, children[static_cast<size_t>(i)].first);
  return stage;
}

std::shared_ptr<nn::Sequential> stage_layers(const nn::Sequential& model, const PartitionPlan& plan, int stage) {
  const int k = static_cast<int>(plan.first_layer.size());
  BRAID_CHECK(stage >= 0 && stage < k, "stage_layers: stage ", stage, " of a ", k, "-stage plan");
  const int end = stage + 1 < k ? plan.first_layer[static_cast<size_t>(stage + 1)] : static_cast<int>(model.size());
  return slice_layers(model, plan.first_layer[static_cast<size_t>(stage)], end);
}

std::string PartitionPlan::str(const std::vector<LayerProfile>& layers) const {
  std::ostringstream os;
  const int n = static_cast<int>(layers.size());
  for (size_t s = 0; s < first_layer.size(); ++s) {
    const int i = first_layer[s];
    const int j = s + 1 < first_layer.size() ? first_layer[s + 1] : n;
    char line[160];
    std::snprintf(line, sizeof line, "stage %zu: layers %d-%d, predicted %.3f ms, %.2f MB", s, i, j - 1,
                  stage_seconds[s] * 1e3, static_cast<double>(stage_bytes[s]) / 1e6);
    os << line << (s + 1 < first_layer.size() ? "\n" : "");
  }
  return os.str();
}

}  // namespace braid::distributed
