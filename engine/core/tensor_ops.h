// Device-generic tensor ops for custom layers: each returns a new contiguous
// tensor on its inputs' device and runs on the stream it is given (CUDA work
// is queued there, not waited for; the CPU stream means synchronous, as in
// engine/core/ops.h, whose in-place ops these complement). Float dtypes only.
#pragma once

#include <cstdint>
#include <vector>

#include "engine/core/stream.h"
#include "engine/core/tensor.h"

namespace lockstep::core::ops {

// Note [op dtypes]: f32, f16 and bf16 inputs; math runs in f32 and each result
// is rounded once to the output dtype, which is the input's. Two tensor
// operands of different float dtypes give f32 (the rule of Residual and of
// PyTorch's promotion for f16/bf16/f32: a low-type autocast branch meeting an
// f32 one stays f32); cast first to get a low type. A double scalar takes the
// tensor's dtype for the result but enters the math as f32, not rounded to it.

// Broadcasting binary ops (NumPy rules: shapes align at the last dimension, a
// dimension of 1 or a missing one stretches). The output has the broadcast shape.
Tensor add(const Tensor& a, const Tensor& b, const Stream& stream = {});
Tensor sub(const Tensor& a, const Tensor& b, const Stream& stream = {});
Tensor mul(const Tensor& a, const Tensor& b, const Stream& stream = {});
Tensor div(const Tensor& a, const Tensor& b, const Stream& stream = {});
// Elementwise max and min; a NaN on either side gives NaN (torch.maximum).
Tensor maximum(const Tensor& a, const Tensor& b, const Stream& stream = {});
Tensor minimum(const Tensor& a, const Tensor& b, const Stream& stream = {});

// The same with a scalar on one side: add(x, 1.0), sub(1.0, s).
Tensor add(const Tensor& a, double b, const Stream& stream = {});
Tensor add(double a, const Tensor& b, const Stream& stream = {});
Tensor sub(const Tensor& a, double b, const Stream& stream = {});
Tensor sub(double a, const Tensor& b, const Stream& stream = {});
Tensor mul(const Tensor& a, double b, const Stream& stream = {});
Tensor mul(double a, const Tensor& b, const Stream& stream = {});
Tensor div(const Tensor& a, double b, const Stream& stream = {});
Tensor div(double a, const Tensor& b, const Stream& stream = {});
Tensor maximum(const Tensor& a, double b, const Stream& stream = {});
Tensor minimum(const Tensor& a, double b, const Stream& stream = {});

// Unary math, same shape and dtype. relu(NaN) is NaN, as torch.relu.
Tensor exp(const Tensor& x, const Stream& stream = {});
Tensor log(const Tensor& x, const Stream& stream = {});
Tensor sigmoid(const Tensor& x, const Stream& stream = {});
Tensor tanh(const Tensor& x, const Stream& stream = {});
Tensor relu(const Tensor& x, const Stream& stream = {});
Tensor abs(const Tensor& x, const Stream& stream = {});
Tensor sqrt(const Tensor& x, const Stream& stream = {});
Tensor neg(const Tensor& x, const Stream& stream = {});

// cond != 0 ? a : b, elementwise over the broadcast shape of all three; cond
// is u8 or a float dtype, a and b follow Note [op dtypes].
Tensor where(const Tensor& cond, const Tensor& a, const Tensor& b, const Stream& stream = {});

// Along dimension `dim` (negative counts from the end, -1 the last): softmax
// and log-softmax keep the shape; sum, mean and max drop the dimension, or keep
// it as size 1 with keepdim. Sums accumulate in f64 in a fixed order, so the
// result does not depend on the run; max and softmax propagate NaN.
Tensor softmax(const Tensor& x, int dim, const Stream& stream = {});
Tensor log_softmax(const Tensor& x, int dim, const Stream& stream = {});
Tensor sum(const Tensor& x, int dim, bool keepdim = false, const Stream& stream = {});
Tensor mean(const Tensor& x, int dim, bool keepdim = false, const Stream& stream = {});
Tensor max(const Tensor& x, int dim, bool keepdim = false, const Stream& stream = {});

// x[..., start:end, ...] along `dim` as a new contiguous tensor (0 <= start
// <= end <= size; negative start and end count from the end, as in Python).
Tensor slice(const Tensor& x, int dim, std::int64_t start, std::int64_t end,
             const Stream& stream = {});
// The parts joined along `dim`: equal shapes elsewhere, one device; any one
// dtype (integer tensors too, since nothing is computed).
Tensor concat(const std::vector<Tensor>& parts, int dim, const Stream& stream = {});

}  // namespace lockstep::core::ops
