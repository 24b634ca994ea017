// ZeRO-1's part of the data-parallel step, between the reduce-scatter and
// the update. Each rank holds the averaged gradients of its shard only
// (Note [shard layout], comm/shards.h), so the step's global decisions take
// one small collective: every rank's inf/NaN finding and squared norm, summed.
#pragma once

#include <vector>

#include "comm/communicator.h"
#include "comm/shards.h"
#include "engine/core/stream.h"
#include "engine/core/tensor.h"
#include "engine/optim/loss_scaler.h"

namespace lockstep::engine {

struct ShardedCheck {
  bool clean = true;       // no rank found an inf or NaN (f16's loss scaler); the step may update
  double grad_norm = 0.0;  // global, after unscaling, before clipping; NaN when not clean
};

// Note [sharded step checks]: unscales `owned` (this rank's shard of the flat
// gradients), then one allreduce over `host` of [found inf/NaN, sum of
// squares] gives every rank the same two numbers: the loss scaler decides on
// the global finding (LossScaler::update_with), and the global norm drives
// clipping (of the shard, when max_grad_norm > 0) and the skip of an fp32 or
// bf16 step with a non-finite gradient. `host` is a communicator of host
// memory (comm::World::host(); InvalidArgument otherwise). Collective;
// throws NumericalError when the loss scale is at its floor and an inf or
// NaN was found.
ShardedCheck check_sharded_gradients(core::Tensor& grads, const std::vector<comm::FlatRange>& owned,
                                     LossScaler& scaler, double max_grad_norm,
                                     comm::Communicator& host, const core::Stream& stream);

}  // namespace lockstep::engine
