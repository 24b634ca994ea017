// ZeRO-1's part of the data-parallel step, between the reduce-scatter and
// the update. Each rank holds the averaged gradients of its shard only
// (Note [shard layout], comm/shards.h), so the step's global decisions need
// every rank's inf/NaN finding and squared norm, summed: they ride in the
// step agreement (comm::StepAgreement), the step's one small collective.
#pragma once

#include <array>
#include <vector>

#include "comm/shards.h"
#include "engine/core/stream.h"
#include "engine/core/tensor.h"
#include "engine/optim/loss_scaler.h"

namespace lockstep::engine {

// Note [sharded step checks]: measure_shard unscales `owned` (this rank's
// shard of the flat gradients) and gives its payload for the step agreement,
// [found inf/NaN (0 or 1), sum of squares], in f64 (Note [non-finite
// steps], engine/data_parallel_step.h). The agreement sums the payloads over
// the ranks (comm::StepAgreement's `sums`), and decide_sharded takes the
// totals, the same bits on every rank: the loss scaler decides on the global
// finding (LossScaler::update_with), and the global norm drives clipping (of
// the shard, when max_grad_norm > 0) and the skip of an fp32 or bf16 step
// with a non-finite gradient.
using ShardPayload = std::array<double, 2>;

ShardPayload measure_shard(core::Tensor& grads, const std::vector<comm::FlatRange>& owned,
                           LossScaler& scaler, const core::Stream& stream);

struct ShardedCheck {
  bool clean = true;       // no rank found an inf or NaN (f16's loss scaler); the step may update
  double grad_norm = 0.0;  // global, after unscaling, before clipping; NaN when not clean
};

// `global`: every rank's measure_shard payload, summed. Throws NumericalError
// when the loss scale is at its floor and an inf or NaN was found.
ShardedCheck decide_sharded(core::Tensor& grads, const std::vector<comm::FlatRange>& owned,
                            LossScaler& scaler, double max_grad_norm, const ShardPayload& global,
                            const core::Stream& stream);

}  // namespace lockstep::engine
