// Gradient norm and clipping by global norm over the flat gradient buffer
// (ParameterStore::grads()), as torch.nn.utils.clip_grad_norm_ does over all
// parameters. Padding between parameters is zero (Note [padding stays zero],
// engine/optim/optimizer.cpp), so the whole-buffer sum of squares is exactly
// the sum over parameters. Call after unscaling.
#pragma once

#include "engine/core/stream.h"
#include "engine/core/tensor.h"

namespace lockstep::engine {

// The L2 norm of `grads` (f32): the square root of core::ops::sum_squares,
// which accumulates in f64 and is deterministic on CUDA. Reading it on the host
// synchronises `stream`.
double grad_norm(const core::Tensor& grads, const core::Stream& stream = {});

// Scales `grads` by clip_coef = max_norm / (norm + 1e-6) when that is below 1,
// and returns the norm before clipping. A non-finite norm leaves the gradients
// as they are: the loss scaler (or the caller) skips such a step.
double clip_grad_norm(core::Tensor& grads, double max_norm, const core::Stream& stream = {});

}  // namespace lockstep::engine
