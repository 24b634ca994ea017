// The data-parallel step's gradient checks, between the gradient
// synchronisation and the update: the loss scaler's inf/NaN finding, the
// norm, clipping. Under ZeRO-1 each rank holds the averaged gradients of its
// shard only (Note [shard layout], comm/shards.h), so the decisions need
// every rank's finding and squared norm, summed: they ride in the step
// agreement (comm::StepAgreement), the step's one small collective. Without
// sharding every rank measures the whole buffer and decides alone.
#pragma once

#include <array>
#include <vector>

#include "comm/shards.h"
#include "engine/core/stream.h"
#include "engine/core/tensor.h"
#include "engine/optim/loss_scaler.h"
#include "engine/step_readback.h"

namespace lockstep::engine {

// Note [sharded step checks]: measure_gradients unscales `ranges` (the whole
// flat gradient buffer, or this rank's ZeRO-1 shard of it) and leaves the
// finding and the ranges' sums of squares in the step's readback slots (Note
// [one read per step], engine/step_readback.h). gradient_payload turns the
// read values into [found inf/NaN (0 or 1), sum of squares], in f64 (Note
// [non-finite steps], engine/data_parallel_step.h). Under ZeRO-1 the agreement
// sums the payloads over the ranks (comm::StepAgreement's `sums`), and
// decide_gradients takes the totals, the same bits on every rank: the loss
// scaler decides on the global finding (LossScaler::update_with), and the
// global norm drives clipping (of `ranges`, when max_grad_norm > 0) and the
// skip of an fp32 or bf16 step with a non-finite gradient.
using GradientPayload = std::array<double, 2>;

void measure_gradients(core::Tensor& grads, const std::vector<comm::FlatRange>& ranges,
                       LossScaler& scaler, StepReadback& readback, const core::Stream& stream);
GradientPayload gradient_payload(const StepReadback::Values& values);

struct GradientCheck {
  bool clean = true;       // no rank found an inf or NaN (f16's loss scaler); the step may update
  double grad_norm = 0.0;  // global, after unscaling, before clipping; NaN when not clean
};

// `global`: the payload of every rank's shard, summed (or this rank's alone
// without sharding). Throws NumericalError when the loss scale is at its
// floor and an inf or NaN was found.
GradientCheck decide_gradients(core::Tensor& grads, const std::vector<comm::FlatRange>& ranges,
                               LossScaler& scaler, double max_grad_norm,
                               const GradientPayload& global, const core::Stream& stream);

}  // namespace lockstep::engine
