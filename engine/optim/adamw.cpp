// AdamW (engine/optim/adamw.h): option checks and the per-group kernel
// arguments, with the bias corrections of step t computed in f64.
#include "engine/optim/adamw.h"

#include <cmath>

#include "engine/core/dispatch.h"

namespace lockstep::engine {
namespace {

AdamwOptions validated(const AdamwOptions& o) {
  for (double beta : {o.beta1, o.beta2})
    if (!(beta >= 0.0 && beta < 1.0))
      throw InvalidArgument("AdamW: beta " + std::to_string(beta) + " is outside [0, 1)");
  if (!(o.eps >= 0.0))
    throw InvalidArgument("AdamW: eps " + std::to_string(o.eps) + " must be >= 0");
  return o;
}

}  // namespace

AdamW::AdamW(ParameterStore& store, std::vector<ParamGroup> groups, AdamwOptions options,
             const core::Stream& stream)
    : Optimizer("AdamW", store, std::move(groups), stream), options_(validated(options)) {
  add_state("exp_avg", stream);
  add_state("exp_avg_sq", stream);
}

void AdamW::launch(const core::Stream& stream) {
  const double t = static_cast<double>(steps() + 1);
  const double bias_correction1 = 1.0 - std::pow(options_.beta1, t);
  const double bias_correction2 = 1.0 - std::pow(options_.beta2, t);
  const AdamwOptions& o = options_;
  std::vector<kernels::AdamwGroup> groups;
  for (std::size_t g = 0; g < group_count(); ++g) {
    kernels::AdamwGroup h;
    h.decay_factor = static_cast<float>(1.0 - lr(g) * weight_decay(g));
    h.beta1 = static_cast<float>(o.beta1);
    h.one_minus_beta1 = static_cast<float>(1.0 - o.beta1);
    h.beta2 = static_cast<float>(o.beta2);
    h.one_minus_beta2 = static_cast<float>(1.0 - o.beta2);
    h.eps = static_cast<float>(o.eps);
    h.step_size = static_cast<float>(lr(g) / bias_correction1);
    h.bias_correction2_sqrt = static_cast<float>(std::sqrt(bias_correction2));
    groups.push_back(h);
  }
  float* params = store().values().data_as<float>();
  const float* grads = gradient_data();
  float *exp_avg = state_data(0), *exp_avg_sq = state_data(1);
  const auto segment_count = static_cast<std::int64_t>(segments().size());
  const int group_count = static_cast<int>(groups.size());
  core::dispatch(
      store().device(), stream,
      [&] {
        kernels::cpu::adamw_step(segments().data(), segment_count, groups.data(), group_count,
                                 params, grads, exp_avg, exp_avg_sq);
      },
      [&](kernels::CudaStream cuda_stream) {
        kernels::cuda::adamw_step(device_segments(), segment_count, groups.data(), group_count,
                                  params, grads, exp_avg, exp_avg_sq, cuda_stream, weight_copy());
      });
}

}  // namespace lockstep::engine
