// Loss scaling for mixed-precision training, as torch.cuda.amp.GradScaler: the loss is multiplied by
// a large factor before backward so that small float16 gradients do not flush to zero, the
// gradients are divided by it before the optimizer step, and a step whose gradients overflowed is
// skipped while the factor backs off. With bfloat16 (float32's exponent range) scaling is rarely
// needed, but the inf/NaN check still keeps a diverging step out of the weights.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <unordered_map>

#include "braid/optim/optimizer.h"
#include "braid/tensor.h"

namespace braid::optim {

/// PyTorch's defaults.
struct GradScalerOptions {
  double init_scale = 65536.0;  // 2^16
  double growth_factor = 2.0;   // > 1
  double backoff_factor = 0.5;  // in (0, 1)
  int64_t growth_interval = 2000;
  /// Off, scale() returns the loss, step() is optimizer.step() and get_scale() is 1.
  bool enabled = true;
};

/// One training step:
///
///     scaler.scale(loss).backward();
///     scaler.unscale_(opt);                  // optional: before clipping the true gradients
///     scaler.step(opt);                      // skipped when a gradient is inf or NaN
///     scaler.update();
///
/// Under the distributed runtime the inf/NaN decision is the same on every rank (Note [Skipping a
/// step on every rank] in src/optim/grad_scaler.cpp): each unscale_ is then a collective, so every
/// rank calls it (directly or through step) equally often.
class GradScaler {
 public:
  explicit GradScaler(const GradScalerOptions& options = {});

  /// loss * get_scale(), recorded (backward then produces scaled gradients).
  Tensor scale(const Tensor& loss) const;
  /// Divides the gradients of optimizer's parameters by the scale in place and records whether any
  /// is inf or NaN. At most once per optimizer between update()s, and not after step().
  void unscale_(Optimizer& optimizer);
  /// Unscales (unless unscale_ already did) and runs optimizer.step() unless a gradient was inf or
  /// NaN, in which case parameters and optimizer state are left bitwise unchanged. Returns whether
  /// it stepped. Once per optimizer between update()s.
  bool step(Optimizer& optimizer);
  /// Ends the iteration: after a skipped step scale *= backoff_factor and the count of clean steps
  /// restarts; after growth_interval clean steps in a row scale *= growth_factor (kept only if
  /// finite in float32, where the scale is held as in PyTorch). Needs a step() or unscale_() since
  /// the last update().
  void update();
  /// Ends the iteration with the scale set to new_scale (positive), as update(new_scale) in PyTorch.
  void update(double new_scale);

  /// The current scale (1 when disabled).
  double get_scale() const;
  /// Clean steps since the last change of scale.
  int64_t growth_tracker() const { return growth_tracker_; }
  bool is_enabled() const { return options_.enabled; }

  /// PyTorch's keys: "scale", "growth_factor", "backoff_factor", "growth_interval" and
  /// "_growth_tracker"; empty when disabled. A checkpoint stores it with store_state (checkpoint.h).
  std::map<std::string, double> state_dict() const;
  /// Restores a state_dict() (a disabled scaler ignores it). Throws ValueError for an empty state
  /// (one saved from a disabled scaler), a missing or unknown key or an invalid value, before
  /// changing anything.
  void load_state_dict(const std::map<std::string, double>& state);

 private:
  struct Record {  // one optimizer's progress through the current iteration
    bool unscaled = false;
    bool stepped = false;
    bool found_inf = false;
  };
  GradScalerOptions options_;
  double scale_;
  int64_t growth_tracker_ = 0;
  std::unordered_map<const Optimizer*, Record> records_;
};

}  // namespace braid::optim
