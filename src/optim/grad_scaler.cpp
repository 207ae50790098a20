// GradScaler (braid/optim/grad_scaler.h): PyTorch's loss-scaling state machine, and the hook through
// which ranks agree on skipping a step.
#include "braid/optim/grad_scaler.h"

#include <algorithm>
#include <cmath>
#include <mutex>
#include <vector>

#include "braid/autograd.h"
#include "braid/ops.h"
#include "optim/rank_agreement.h"

namespace braid::optim {

// Note [Skipping a step on every rank]
// PyTorch's GradScaler decides alone on each rank whether a gradient overflowed. Under data
// parallelism that is enough, since the all-reduced gradients (and so the decisions) are the same
// everywhere. In a pipeline, or any split where ranks hold different parameters, an overflow in one
// stage's gradients would make that stage skip while the others step, and the ranks' scales would
// part ways from then on. So the flag is max-reduced across the world before the decision: a skip
// anywhere is a skip everywhere, which is also right for the data-parallel replicas of a pipeline.
//
// The optimizers live in the core library, which knows nothing of distribution; distributed::init()
// installs the world's all-reduce as a hook (optim/rank_agreement.h), explicitly at start-up, and
// finalize() removes it. Model code and training loops do not change, and a program that never
// starts the runtime decides alone, as before. The price is one 4-byte all-reduce per unscale_,
// and that unscale_ is a collective: every rank runs it (through step) as often as the others,
// also a rank whose optimizer saw no gradient this step.

namespace detail {

namespace {
std::mutex g_hook_mu;
AnyRankHook g_hook;
}  // namespace

void set_any_rank_hook(AnyRankHook hook) {
  std::lock_guard<std::mutex> lock(g_hook_mu);
  g_hook = std::move(hook);
}

bool any_rank(bool local) {
  AnyRankHook hook;
  {
    std::lock_guard<std::mutex> lock(g_hook_mu);
    hook = g_hook;
  }
  return hook ? hook(local) : local;
}

}  // namespace detail

namespace {

void check_options(const GradScalerOptions& o, const char* who) {
  BRAID_CHECK(std::isfinite(o.init_scale) && o.init_scale > 0, who, ": the scale must be positive and finite, got ",
              o.init_scale);
  BRAID_CHECK(o.growth_factor > 1 && std::isfinite(o.growth_factor), who, ": growth_factor must be above 1, got ",
              o.growth_factor);
  BRAID_CHECK(o.backoff_factor > 0 && o.backoff_factor < 1, who, ": backoff_factor must be in (0, 1), got ",
              o.backoff_factor);
  BRAID_CHECK(o.growth_interval > 0, who, ": growth_interval must be positive, got ", o.growth_interval);
}

// The scale is held in float32 as PyTorch holds it, so that sequences with any factors match.
double as_float32(double v) { return static_cast<double>(static_cast<float>(v)); }

}  // namespace

GradScaler::GradScaler(const GradScalerOptions& options) : options_(options), scale_(options.init_scale) {
  check_options(options_, "GradScaler");
  scale_ = as_float32(scale_);
}

Tensor GradScaler::scale(const Tensor& loss) const {
  if (!options_.enabled) return loss;
  BRAID_CHECK(loss.defined(), "GradScaler.scale: got an undefined loss");
  return loss * scale_;
}

void GradScaler::unscale_(Optimizer& optimizer) {
  if (!options_.enabled) return;
  Record& rec = records_[&optimizer];
  BRAID_CHECK(!rec.unscaled, "GradScaler.unscale_: already called on this ", optimizer.name(),
              " optimizer since the last update()");
  BRAID_CHECK(!rec.stepped, "GradScaler.unscale_: called after step() on this ", optimizer.name(),
              " optimizer; call update() first");
  std::vector<Tensor> grads;
  for (const ParamGroup& group : optimizer.param_groups()) {
    for (const Tensor& p : group.params) {
      Tensor g = p.grad();
      if (!g.defined()) continue;
      BRAID_CHECK_T(TypeError, is_compute_type(g.dtype()), "GradScaler.unscale_: a parameter of shape ",
                    shape_str(p.shape()), " has a ", dtype_name(g.dtype()),
                    " gradient; keep float32 parameters (autocast rounds them for the products)");
      grads.push_back(g);
    }
  }
  NoGradGuard no_grad;
  const double inv = 1.0 / scale_;
  // The largest magnitudes, summed per device in float64: inf and NaN survive the sum and only one
  // value per device comes to the host.
  std::vector<Tensor> totals;
  for (Tensor& g : grads) {
    g.mul_(inv);
    if (g.numel() == 0) continue;
    Tensor m = amax(abs(g)).to(kFloat64);
    auto same = [&](const Tensor& t) { return t.device() == m.device(); };
    if (auto it = std::find_if(totals.begin(), totals.end(), same); it != totals.end())
      *it = *it + m;
    else
      totals.push_back(m);
  }
  bool found = false;
  for (const Tensor& t : totals) found = found || !std::isfinite(t.item());
  rec.found_inf = detail::any_rank(found);
  rec.unscaled = true;
}

bool GradScaler::step(Optimizer& optimizer) {
  if (!options_.enabled) {
    optimizer.step();
    return true;
  }
  BRAID_CHECK(!records_[&optimizer].stepped, "GradScaler.step: already called on this ", optimizer.name(),
              " optimizer since the last update()");
  if (!records_[&optimizer].unscaled) unscale_(optimizer);
  Record& rec = records_[&optimizer];
  rec.stepped = true;
  if (rec.found_inf) return false;
  optimizer.step();
  return true;
}

void GradScaler::update() {
  if (!options_.enabled) return;
  BRAID_CHECK(!records_.empty(), "GradScaler.update: no step() or unscale_() since the last update(), ",
              "so there is no inf/NaN check to act on");
  bool found = false;
  for (const auto& [opt, rec] : records_) found = found || rec.found_inf;
  records_.clear();
  if (found) {
    scale_ = as_float32(scale_ * options_.backoff_factor);
    growth_tracker_ = 0;
  } else if (++growth_tracker_ == options_.growth_interval) {
    const double grown = as_float32(scale_ * options_.growth_factor);
    if (std::isfinite(grown)) scale_ = grown;
    growth_tracker_ = 0;
  }
}

void GradScaler::update(double new_scale) {
  if (!options_.enabled) return;
  BRAID_CHECK(std::isfinite(new_scale) && new_scale > 0, "GradScaler.update: new_scale must be positive and ",
              "finite, got ", new_scale);
  records_.clear();
  scale_ = as_float32(new_scale);
}

double GradScaler::get_scale() const { return options_.enabled ? scale_ : 1.0; }

std::map<std::string, double> GradScaler::state_dict() const {
  if (!options_.enabled) return {};
  return {{"scale", scale_},
          {"growth_factor", options_.growth_factor},
          {"backoff_factor", options_.backoff_factor},
          {"growth_interval", static_cast<double>(options_.growth_interval)},
          {"_growth_tracker", static_cast<double>(growth_tracker_)}};
}

void GradScaler::load_state_dict(const std::map<std::string, double>& state) {
  if (!options_.enabled) return;
  const char* who = "GradScaler.load_state_dict";
  BRAID_CHECK(!state.empty(), who, ": the state is empty; was it saved from a disabled GradScaler?");
  const std::map<std::string, double> mine = state_dict();
  for (const auto& [key, v] : state)
    BRAID_CHECK(mine.count(key), who, ": unexpected key '", key,
                "'; expected scale, growth_factor, backoff_factor, growth_interval, _growth_tracker");
  for (const auto& [key, v] : mine) BRAID_CHECK(state.count(key), who, ": missing '", key, "'");
  GradScalerOptions o = options_;
  o.init_scale = state.at("scale");
  o.growth_factor = state.at("growth_factor");
  o.backoff_factor = state.at("backoff_factor");
  const double interval = state.at("growth_interval"), tracker = state.at("_growth_tracker");
  BRAID_CHECK(interval == std::floor(interval) && std::fabs(interval) < 1e18, who,
              ": growth_interval must be a whole number, got ", interval);
  o.growth_interval = static_cast<int64_t>(interval);
  check_options(o, who);
  BRAID_CHECK(tracker >= 0 && tracker == std::floor(tracker) && tracker < interval, who,
              ": _growth_tracker must be a whole number in [0, growth_interval), got ", tracker);
  options_ = o;
  scale_ = as_float32(o.init_scale);
  growth_tracker_ = static_cast<int64_t>(tracker);
}

}  // namespace braid::optim
