// SGD (engine/optim/sgd.h): option checks and the per-group kernel arguments.
#include "engine/optim/sgd.h"

#include "engine/core/dispatch.h"

namespace lockstep::engine {
namespace {

SgdOptions validated(const SgdOptions& o) {
  if (!(o.momentum >= 0.0) || !(o.dampening >= 0.0))
    throw InvalidArgument("SGD: momentum " + std::to_string(o.momentum) + " and dampening " +
                          std::to_string(o.dampening) + " must be >= 0");
  if (o.nesterov && (o.momentum <= 0.0 || o.dampening != 0.0))
    throw InvalidArgument(
        "SGD: Nesterov momentum requires a momentum > 0 and zero dampening (got " +
        std::to_string(o.momentum) + " and " + std::to_string(o.dampening) + ")");
  return o;
}

}  // namespace

SGD::SGD(ParameterStore& store, std::vector<ParamGroup> groups, SgdOptions options,
         const core::Stream& stream)
    : Optimizer("SGD", store, std::move(groups), stream), options_(validated(options)) {
  if (options_.momentum != 0.0) add_state("momentum_buffer", stream);
}

void SGD::launch(const core::Stream& stream) {
  std::vector<kernels::SgdGroup> groups;
  for (std::size_t g = 0; g < group_count(); ++g)
    groups.push_back({static_cast<float>(lr(g)), static_cast<float>(weight_decay(g)),
                      static_cast<float>(options_.momentum),
                      static_cast<float>(1.0 - options_.dampening), options_.nesterov,
                      steps() == 0});
  float* params = store().values().data_as<float>();
  const float* grads = gradient_data();
  float* momentum = options_.momentum != 0.0 ? state_data(0) : nullptr;
  const auto segment_count = static_cast<std::int64_t>(segments().size());
  const int group_count = static_cast<int>(groups.size());
  core::dispatch(
      store().device(), stream,
      [&] {
        kernels::cpu::sgd_step(segments().data(), segment_count, groups.data(), group_count, params,
                               grads, momentum);
      },
      [&](kernels::CudaStream cuda_stream) {
        kernels::cuda::sgd_step(device_segments(), segment_count, groups.data(), group_count,
                                params, grads, momentum, cuda_stream, weight_copy());
      });
}

}  // namespace lockstep::engine
