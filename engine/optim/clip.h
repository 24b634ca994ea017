// Gradient norm and clipping by global norm over the flat gradient buffer
// (ParameterStore::grads()), as torch.nn.utils.clip_grad_norm_ does over all
// parameters. Padding between parameters is zero (Note [padding stays zero],
// engine/optim/optimizer.cpp), so the whole-buffer sum of squares is exactly
// the sum over parameters. With ZeRO-1 each rank holds its shard's gradients
// only: the range forms work on those, and the caller sums over ranks. Call
// after unscaling.
#pragma once

#include <vector>

#include "comm/shards.h"
#include "engine/core/stream.h"
#include "engine/core/tensor.h"

namespace lockstep::engine {

// The sum of squares of `grads` (f32) over `ranges`, in f64 throughout: per
// range the kernels' sum of squares (accumulated in f64, deterministic on
// CUDA), added in f64. Never rounded to f32, so squares of finite gradients
// cannot overflow (Note [non-finite steps], engine/data_parallel_step.h).
// Reading it synchronises `stream` once, however many ranges.
double grad_sum_squares(const core::Tensor& grads, const std::vector<comm::FlatRange>& ranges,
                        const core::Stream& stream = {});
// The same sums, one per range, left on the gradients' device for the caller
// to read with its other values (Note [one read per step], engine/step_readback.h):
// `totals` is i64[ranges.size()] holding f64s, `workspace` at least
// kernels::cuda::kReduceWorkspaceBytes on a GPU (unused on the CPU). Nothing waits.
void enqueue_sum_squares(const core::Tensor& grads, const std::vector<comm::FlatRange>& ranges,
                         const core::Tensor& totals, const core::Tensor& workspace,
                         const core::Stream& stream);
// The totals' sum in range order, in f64: how grad_sum_squares adds them.
double sum_in_order(const std::vector<double>& totals);
// The L2 norm of the whole of `grads`: the square root of grad_sum_squares.
double grad_norm(const core::Tensor& grads, const core::Stream& stream = {});

// Scales `ranges` of `grads` by clip_coef = max_norm / (norm + 1e-6) when that
// is below 1; `norm` is the global norm. A non-finite norm leaves the
// gradients as they are: the loss scaler (or the caller) skips such a step.
void clip_to_norm(core::Tensor& grads, const std::vector<comm::FlatRange>& ranges, double norm,
                  double max_norm, const core::Stream& stream = {});
// clip_to_norm over the whole buffer with its own norm, which it returns.
double clip_grad_norm(core::Tensor& grads, double max_norm, const core::Stream& stream = {});

}  // namespace lockstep::engine
