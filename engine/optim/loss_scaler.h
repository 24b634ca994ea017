// LossScaler: dynamic loss scaling for f16 training, with torch.amp.GradScaler's
// contract. The loss gradient is multiplied by scale() before backward; after
// the gradients are allreduced, unscale() multiplies them by 1/scale and
// checks them for inf/NaN in one pass, and update() decides: skip the step and
// halve the scale, or step and double the scale after growth_interval clean
// steps in a row. The scale has a floor (min_scale): an inf or NaN found at
// the floor is an error, since scaling can no longer be the cause. The check
// runs on allreduced gradients, so every rank decides the same without an
// extra collective; with ZeRO-1 a rank checks its own shard, and the caller
// agrees on the decision (found_nonfinite, then update_with).
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "comm/shards.h"
#include "engine/core/stream.h"
#include "engine/core/tensor.h"

namespace lockstep::engine {

struct LossScalerOptions {
  bool enabled = true;  // false: scale 1, no unscaling, no check, never skip
  float init_scale = 65536.0f;
  float growth_factor = 2.0f;
  float backoff_factor = 0.5f;
  std::int64_t growth_interval = 2000;
  // Backing off never goes below this; an inf or NaN found at it throws
  // (DeepSpeed's and Megatron's min_loss_scale, 1 by default).
  float min_scale = 1.0f;
};

struct LossScalerState {
  float scale;
  std::int64_t growth_tracker;  // clean steps in a row since the scale last changed
};

class LossScaler {
 public:
  explicit LossScaler(LossScalerOptions options = {});
  // Enabled under f16 autocast only: bf16 has f32's exponent range, and f32
  // needs no scaling (GradScaler's usual use).
  static LossScaler for_autocast(std::optional<DType> autocast);

  bool enabled() const { return options_.enabled; }
  const LossScalerOptions& options() const { return options_; }
  // Multiply the loss gradient by this before backward (1 when disabled).
  float scale() const { return scale_; }

  // Multiplies the flat f32 gradient buffer by 1/scale and records whether any
  // element was inf or NaN, in one pass; the flag stays on the gradients'
  // device and nothing waits. Call once per step, after the allreduce and
  // before clipping. No-op when disabled.
  void unscale(core::Tensor& grads, const core::Stream& stream = {});
  // The same over `ranges` of the buffer only (this rank's ZeRO-1 shard).
  void unscale(core::Tensor& grads, const std::vector<comm::FlatRange>& ranges,
               const core::Stream& stream = {});
  // The same with the flag written to `flag` (i32[1] on the gradients' device),
  // for a caller that reads it with its other values and then calls
  // update_with (Note [one read per step], engine/step_readback.h).
  void unscale(core::Tensor& grads, const std::vector<comm::FlatRange>& ranges,
               const core::Tensor& flag, const core::Stream& stream);
  // Reads the flag that unscale() left: this is the step's host
  // synchronisation (it waits for `stream`). Backs off or grows the scale and
  // returns whether the optimizer should step (false: skip it, the gradients
  // had an inf or NaN). Always true when disabled. Throws NumericalError
  // naming min_scale when an inf or NaN is found with the scale at its floor.
  [[nodiscard]] bool update(const core::Stream& stream = {});
  // Whether unscale() found an inf or NaN in this rank's gradients (waits for
  // `stream`); false when disabled. For callers that agree with other ranks.
  bool found_nonfinite(const core::Stream& stream = {}) const;
  // update() with the finding given: whether any rank found an inf or NaN.
  [[nodiscard]] bool update_with(bool found_nonfinite);

  // For checkpoints. A disabled scaler keeps scale 1 and ignores set_state.
  LossScalerState state() const { return {scale_, growth_tracker_}; }
  void set_state(const LossScalerState& state);

 private:
  LossScalerOptions options_;
  float scale_;
  std::int64_t growth_tracker_ = 0;
  core::Tensor own_flag_;         // i32[1] on the gradients' device, for callers without one
  core::Tensor found_nonfinite_;  // the flag the last unscale() wrote: own_flag_ or the caller's
  bool unscaled_ = false;         // unscale() ran since the last update()
};

}  // namespace lockstep::engine
