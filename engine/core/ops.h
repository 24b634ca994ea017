// Tensor ops: check shapes, dtypes and devices, then dispatch to kernels/ by
// device. Every op takes a Stream; given the CPU stream with GPU tensors, it
// runs on the device's default stream and returns when the work is done.
#pragma once

#include "engine/core/stream.h"
#include "engine/core/tensor.h"

namespace lockstep::core::ops {

void fill(Tensor& x, double value, const Stream& stream = {});
// dst = src converted to dst's dtype (same number of elements).
void cast(const Tensor& src, Tensor& dst, const Stream& stream = {});

void add(const Tensor& a, const Tensor& b, Tensor& out, const Stream& stream = {});
void mul(const Tensor& a, const Tensor& b, Tensor& out, const Stream& stream = {});
void scale(Tensor& x, float alpha, const Stream& stream = {});
void axpy(float alpha, const Tensor& x, Tensor& y, const Stream& stream = {});  // y += alpha x

// One-element f32 tensors on x's device, accumulated in f64.
Tensor sum(const Tensor& x, const Stream& stream = {});
Tensor sum_squares(const Tensor& x, const Stream& stream = {});
// Sets the one-element i32 `flag` to 1 if x has an inf or NaN; never clears it.
void flag_nonfinite(const Tensor& x, Tensor& flag, const Stream& stream = {});

struct MatmulOptions {
  bool trans_a = false;  // a is [k, m]
  bool trans_b = false;  // b is [n, k]
  float alpha = 1.0f;
  float beta = 0.0f;  // 1 accumulates into c
};
// c[m, n] = alpha op(a) op(b) + beta c, for 2-D a, b, c; f32 accumulation.
void matmul(const Tensor& a, const Tensor& b, Tensor& c, const MatmulOptions& options = {},
            const Stream& stream = {});
// c[i] = alpha op(a[i]) op(b[i]) + beta c[i] for 3-D a, b, c of one batch size
// (one strided-batched GEMM).
void batched_matmul(const Tensor& a, const Tensor& b, Tensor& c, const MatmulOptions& options = {},
                    const Stream& stream = {});

}  // namespace lockstep::core::ops
