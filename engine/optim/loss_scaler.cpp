// LossScaler (engine/optim/loss_scaler.h). The update rule is GradScaler's
// (_amp_update_scale_): on inf/NaN scale *= backoff and the tracker resets;
// otherwise the tracker counts up and, on reaching growth_interval, the scale
// grows (only to a finite value) and the tracker resets. Backing off stops at
// min_scale, and an inf/NaN found there is an error (DeepSpeed's rule).
#include "engine/optim/loss_scaler.h"

#include <fmt/core.h>

#include <algorithm>
#include <cmath>
#include <string>

#include "engine/core/dispatch.h"
#include "kernels/optimizer.h"

namespace lockstep::engine {

LossScaler::LossScaler(LossScalerOptions options) : options_(options) {
  if (!options_.enabled) {
    scale_ = 1.0f;
    return;
  }
  if (!(options_.init_scale > 0.0f) || !std::isfinite(options_.init_scale) ||
      !(options_.growth_factor > 1.0f) || !(options_.backoff_factor > 0.0f) ||
      !(options_.backoff_factor < 1.0f) || options_.growth_interval < 1 ||
      !(options_.min_scale > 0.0f) || !(options_.min_scale <= options_.init_scale))
    throw InvalidArgument(
        "LossScaler: init_scale " + std::to_string(options_.init_scale) + ", growth_factor " +
        std::to_string(options_.growth_factor) + ", backoff_factor " +
        std::to_string(options_.backoff_factor) + ", growth_interval " +
        std::to_string(options_.growth_interval) + ", min_scale " +
        std::to_string(options_.min_scale) +
        " (need a finite init_scale > 0, growth > 1, 0 < backoff < 1, interval >= 1, "
        "0 < min_scale <= init_scale)");
  scale_ = options_.init_scale;
}

LossScaler LossScaler::for_autocast(std::optional<DType> autocast) {
  LossScalerOptions options;
  options.enabled = autocast == DType::f16;
  return LossScaler(options);
}

void LossScaler::unscale(core::Tensor& grads, const core::Stream& stream) {
  unscale(grads, {{0, grads.numel()}}, stream);
}

void LossScaler::unscale(core::Tensor& grads, const std::vector<comm::FlatRange>& ranges,
                         const core::Stream& stream) {
  if (!enabled()) return;
  const core::Device device = grads.device();
  if (!own_flag_.defined() || !(own_flag_.device() == device))
    own_flag_ = core::Tensor::empty({1}, DType::i32, device, stream);
  unscale(grads, ranges, own_flag_, stream);
}

void LossScaler::unscale(core::Tensor& grads, const std::vector<comm::FlatRange>& ranges,
                         const core::Tensor& flag, const core::Stream& stream) {
  if (!enabled()) return;
  if (grads.dtype() != DType::f32)
    throw InvalidArgument(std::string("LossScaler::unscale: gradients are ") +
                          dtype_name(grads.dtype()) + ", expected the f32 flat gradient buffer");
  if (unscaled_)
    throw InvalidArgument("LossScaler::unscale called twice in one step (call update() between)");
  const core::Device device = grads.device();
  if (flag.dtype() != DType::i32 || flag.numel() != 1 || !(flag.device() == device))
    throw InvalidArgument("LossScaler::unscale: the flag must be one i32 on the gradients' device");
  found_nonfinite_ = flag;
  found_nonfinite_.fill_(0.0, stream);
  const float inv_scale = 1.0f / scale_;
  std::int32_t* flag_data = found_nonfinite_.data_as<std::int32_t>();
  for (const comm::FlatRange& r : ranges) {
    if (r.numel == 0) continue;
    float* data = grads.view(r.offset, {r.numel}).data_as<float>();
    const std::int64_t n = r.numel;
    core::dispatch(
        device, stream, [&] { kernels::cpu::unscale_and_check(data, n, inv_scale, flag_data); },
        [&](kernels::CudaStream cuda_stream) {
          kernels::cuda::unscale_and_check(data, n, inv_scale, flag_data, cuda_stream);
        });
  }
  unscaled_ = true;
}

bool LossScaler::found_nonfinite(const core::Stream& stream) const {
  if (!enabled()) return false;
  if (!unscaled_) throw InvalidArgument("LossScaler: no unscale() in this step to report on");
  std::int32_t found = 0;
  found_nonfinite_.copy_to_host(&found, stream);
  return found != 0;
}

bool LossScaler::update(const core::Stream& stream) {
  if (!enabled()) return true;
  if (!unscaled_) throw InvalidArgument("LossScaler::update without unscale() in this step");
  return update_with(found_nonfinite(stream));
}

bool LossScaler::update_with(bool found_nonfinite) {
  if (!enabled()) return true;
  if (!unscaled_) throw InvalidArgument("LossScaler::update without unscale() in this step");
  unscaled_ = false;
  if (found_nonfinite) {
    if (scale_ <= options_.min_scale)
      throw NumericalError(fmt::format(
          "the loss scale is at its floor (min_scale {}) and the gradients still hold an inf or "
          "NaN: scaling is not the cause, the model's values are (lower the learning rate, "
          "check the data, or train in bf16 or fp32)",
          options_.min_scale));
    scale_ = std::max(scale_ * options_.backoff_factor, options_.min_scale);
    growth_tracker_ = 0;
    return false;
  }
  if (++growth_tracker_ == options_.growth_interval) {
    const float grown = scale_ * options_.growth_factor;
    if (std::isfinite(grown)) scale_ = grown;
    growth_tracker_ = 0;
  }
  return true;
}

void LossScaler::set_state(const LossScalerState& state) {
  if (!enabled()) return;
  if (!(state.scale >= options_.min_scale) || !std::isfinite(state.scale) ||
      state.growth_tracker < 0 || state.growth_tracker >= options_.growth_interval)
    throw InvalidArgument("LossScaler: state (scale " + std::to_string(state.scale) +
                          ", growth tracker " + std::to_string(state.growth_tracker) +
                          ") is invalid for growth_interval " +
                          std::to_string(options_.growth_interval) + " and min_scale " +
                          std::to_string(options_.min_scale));
  scale_ = state.scale;
  growth_tracker_ = state.growth_tracker;
}

}  // namespace lockstep::engine
