// Internal to the CUDA BatchNorm: what its two files share. The device
// helpers both layouts' kernels use (Pack, the per-value expressions, the
// coefficient math of the finalize kernels), packs_fit and dispatch_epilogue,
// and the channels-last launchers (kernels/cuda/batchnorm_rows.cu) that the
// entry points in kernels/cuda/batchnorm.cu dispatch spatial == 1 to.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <type_traits>

#include "kernels/batchnorm.h"
#include "kernels/cuda/device_float.cuh"

namespace lockstep::kernels::cuda::detail {

// Channel c's statistics from its sums of x - pilot and (x - pilot)^2, the
// running update (unbiased variance) and coef = {mean, weight * rstd, bias}.
inline __device__ void finish_stats(const BatchNormShape& s, std::int64_t c, double sum,
                                    double squares, double pilot, const float* weight,
                                    const float* bias, float* save_mean, float* save_rstd,
                                    double momentum, float* running_mean, float* running_var,
                                    float4* coef) {
  const double count = static_cast<double>(s.batch * s.spatial);
  const double shifted_mean = sum / count;
  const double var = fmax(squares / count - shifted_mean * shifted_mean, 0.0);
  const double mean = pilot + shifted_mean;
  const double rstd = 1.0 / sqrt(var + s.eps);
  save_mean[c] = static_cast<float>(mean);
  save_rstd[c] = static_cast<float>(rstd);
  if (running_mean) {
    running_mean[c] = static_cast<float>((1.0 - momentum) * running_mean[c] + momentum * mean);
    const double unbiased = var * count / (count - 1.0);
    running_var[c] = static_cast<float>((1.0 - momentum) * running_var[c] + momentum * unbiased);
  }
  coef[c] =
      make_float4(static_cast<float>(mean), static_cast<float>(rstd * weight[c]), bias[c], 0.0f);
}

// Channel c from its sums of g and g (x - mean): dweight += rstd sum(g (x -
// mean)), dbias += sum(g), and coef = {mean, k1, mean(g), k2} with dx = k1 (g -
// mean(g)) - k2 (x - mean): the CPU's w rstd (g - mean(g) - xhat mean(g xhat))
// rearranged.
inline __device__ void finish_grads(const BatchNormShape& s, std::int64_t c, double sum_g,
                                    double sum_gx, const float* weight, const float* save_mean,
                                    const float* save_rstd, float* dweight, float* dbias,
                                    float4* coef) {
  const double count = static_cast<double>(s.batch * s.spatial);
  const double rstd = save_rstd[c], k1 = weight[c] * rstd;
  if (dweight) dweight[c] = static_cast<float>(dweight[c] + sum_gx * rstd);
  if (dbias) dbias[c] = static_cast<float>(dbias[c] + sum_g);
  coef[c] = make_float4(save_mean[c], static_cast<float>(k1), static_cast<float>(sum_g / count),
                        static_cast<float>(k1 * rstd * rstd * sum_gx / count));
}

// `identity` counts only for add_relu.
template <BatchNormEpilogue E>
__device__ __forceinline__ float epilogue(float v, float identity) {
  if (E == BatchNormEpilogue::add_relu) v += identity;
  if (E != BatchNormEpilogue::none) v = v > 0.0f ? v : 0.0f;  // relu(NaN) = 0, as the CPU's
  return v;
}

// The normalisation of one value and its epilogue, in f32: the one
// expression both layouts' apply kernels use, so they round alike.
template <BatchNormEpilogue E>
__device__ __forceinline__ float normalised(float x, float4 k, float identity) {
  return epilogue<E>((x - k.x) * k.y + k.z, identity);
}

// dx of one value from its masked gradient g, in f32 (coef as finish_grads
// makes it): the one expression of both layouts' dx kernels.
__device__ __forceinline__ float input_grad(float g, float x, float4 k) {
  return k.y * (g - k.z) - k.w * (x - k.x);
}

// V consecutive values of one row (V divides the row length: one channel's
// in NCHW, V channels of one position in channels-last), loaded and stored as
// one access: 16 bytes where the row length and the pointers allow (Note
// [batchnorm packs]), else one value.
template <typename T, int V>
struct alignas(sizeof(T) * V) Pack {
  T v[V];
};

// Note [batchnorm packs]: the elementwise passes (apply, dx) move 16 bytes per
// access (8 f16/bf16 or 4 f32 values) when every row's length is a multiple of
// that and every pointer is 16-byte aligned (resnet's 56x56, 28x28, 14x14;
// not 7x7), else one value: 16-bit scalar accesses leave too few bytes in
// flight to fill an H100's or H200's memory system. Each value's arithmetic
// is the same either way, so the choice never changes a bit. The NCHW sums
// stay scalar: their order is part of the result (Note [batchnorm passes] in
// batchnorm.cu); the channels-last sums load packs, in an order that does not
// depend on them (Note [channels-last batchnorm] in batchnorm_rows.cu).
// `row_length`: spatial in NCHW, channels in channels-last.
template <typename T>
bool packs_fit(std::int64_t row_length, std::initializer_list<const void*> pointers) {
  if (row_length % static_cast<std::int64_t>(16 / sizeof(T)) != 0) return false;
  for (const void* p : pointers)
    if (reinterpret_cast<std::uintptr_t>(p) % 16 != 0) return false;  // null is aligned
  return true;
}

// Calls f(std::integral_constant<BatchNormEpilogue, E>{}) for the runtime epi.
template <typename F>
void dispatch_epilogue(BatchNormEpilogue epi, F&& f) {
  switch (epi) {
    case BatchNormEpilogue::none:
      f(std::integral_constant<BatchNormEpilogue, BatchNormEpilogue::none>{});
      return;
    case BatchNormEpilogue::relu:
      f(std::integral_constant<BatchNormEpilogue, BatchNormEpilogue::relu>{});
      return;
    case BatchNormEpilogue::add_relu:
      f(std::integral_constant<BatchNormEpilogue, BatchNormEpilogue::add_relu>{});
      return;
  }
}

// The fused calls for spatial == 1 (Note [channels-last batchnorm] in
// batchnorm_rows.cu), each taken by the entry point of the same name after its
// checks; `partial` and `coef` are the workspace's parts (FusedLayout in
// batchnorm.cu), `splits` is batchnorm_row_splits(s).
void batchnorm_rows_forward_training(const BatchNormShape& s, DType type, BatchNormEpilogue epi,
                                     std::int64_t splits, const void* x, const void* identity,
                                     const float* weight, const float* bias, void* y,
                                     float* save_mean, float* save_rstd, double momentum,
                                     float* running_mean, float* running_var, double* partial,
                                     float4* coef, CudaStream stream);

// y from the coefficients the caller's inference_coef_kernel wrote.
void batchnorm_rows_forward_inference(const BatchNormShape& s, DType type, BatchNormEpilogue epi,
                                      const void* x, const void* identity, const float4* coef,
                                      void* y, CudaStream stream);

void batchnorm_rows_backward(const BatchNormShape& s, DType type, BatchNormEpilogue epi,
                             std::int64_t splits, const void* x, const void* y, const void* dy,
                             const float* weight, const float* save_mean, const float* save_rstd,
                             void* dx, void* d_identity, float* dweight, float* dbias,
                             double* partial, float4* coef, CudaStream stream);

}  // namespace lockstep::kernels::cuda::detail
