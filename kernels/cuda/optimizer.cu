// CUDA optimizer steps and unscaling (kernels/optimizer.h). One launch covers
// every parameter: each block takes whole segments from the device-resident
// table, and the group hyper-parameters travel by value in the launch, so a
// step needs no host-to-device copy. Same f32 formulas as the CPU versions.
#include <algorithm>
#include <string>

#include "kernels/cuda/check.h"
#include "kernels/cuda/device_float.cuh"
#include "kernels/optimizer.h"

namespace lockstep::kernels::cuda {
namespace {

using detail::kThreads;

template <typename Group>
struct GroupTable {
  Group group[kMaxOptimizerGroups];
};

template <typename Group>
GroupTable<Group> group_table(const Group* groups, int group_count, const char* op) {
  if (group_count < 1 || group_count > kMaxOptimizerGroups)
    throw InvalidArgument(std::string(op) + ": " + std::to_string(group_count) +
                          " parameter groups (1 to " + std::to_string(kMaxOptimizerGroups) +
                          " are supported)");
  GroupTable<Group> table{};
  std::copy(groups, groups + group_count, table.group);
  return table;
}

unsigned grid_for_segments(std::int64_t segment_count) {
  return static_cast<unsigned>(std::min<std::int64_t>(segment_count, 8192));
}

// A segment naming a group outside the table is left untouched (Note [device
// segment table]); kMaxOptimizerGroups bounds the table, group_count its use.
__device__ bool known_group(const OptimizerSegment& segment, int group_count) {
  return segment.group >= 0 && segment.group < group_count;
}

__global__ void sgd_kernel(const OptimizerSegment* segments, std::int64_t segment_count,
                           GroupTable<SgdGroup> groups, int group_count, float* params,
                           const float* grads, float* momentum) {
  for (std::int64_t s = blockIdx.x; s < segment_count; s += gridDim.x) {
    const OptimizerSegment segment = segments[s];
    if (!known_group(segment, group_count)) continue;
    const SgdGroup h = groups.group[segment.group];
    const std::int64_t end = segment.offset + segment.length;
    float* buf = momentum + (segment.state_offset - segment.offset);  // indexed like params
    for (std::int64_t i = segment.offset + threadIdx.x; i < end; i += blockDim.x) {
      const float p = params[i];
      const float g = grads[i + segment.grad_shift];
      const float d = h.weight_decay != 0.0f ? g + h.weight_decay * p : g;
      if (h.momentum == 0.0f) {
        params[i] = p - h.lr * d;
        continue;
      }
      const float b = h.first_step ? d : h.momentum * buf[i] + h.one_minus_dampening * d;
      buf[i] = b;
      params[i] = p - h.lr * (h.nesterov ? d + h.momentum * b : b);
    }
  }
}

__global__ void adamw_kernel(const OptimizerSegment* segments, std::int64_t segment_count,
                             GroupTable<AdamwGroup> groups, int group_count, float* params,
                             const float* grads, float* exp_avg, float* exp_avg_sq) {
  for (std::int64_t s = blockIdx.x; s < segment_count; s += gridDim.x) {
    const OptimizerSegment segment = segments[s];
    if (!known_group(segment, group_count)) continue;
    const AdamwGroup h = groups.group[segment.group];
    const std::int64_t end = segment.offset + segment.length;
    const std::int64_t to_state = segment.state_offset - segment.offset;
    for (std::int64_t i = segment.offset + threadIdx.x; i < end; i += blockDim.x) {
      const float g = grads[i + segment.grad_shift];
      const float m = h.beta1 * exp_avg[i + to_state] + h.one_minus_beta1 * g;
      const float v = h.beta2 * exp_avg_sq[i + to_state] + h.one_minus_beta2 * (g * g);
      exp_avg[i + to_state] = m;
      exp_avg_sq[i + to_state] = v;
      const float denom = sqrtf(v) / h.bias_correction2_sqrt + h.eps;
      params[i] = params[i] * h.decay_factor - h.step_size * (m / denom);
    }
  }
}

__global__ void unscale_kernel(float* grads, std::int64_t n, float inv_scale,
                               std::int32_t* found_nonfinite) {
  bool nonfinite = false;
  for (std::int64_t i = blockIdx.x * std::int64_t{blockDim.x} + threadIdx.x; i < n;
       i += std::int64_t{gridDim.x} * blockDim.x) {
    const float g = grads[i];
    nonfinite |= !isfinite(g);
    grads[i] = g * inv_scale;
  }
  if (nonfinite) *found_nonfinite = 1;  // every writer stores the same 1
}

}  // namespace

void sgd_step(const OptimizerSegment* segments, std::int64_t segment_count, const SgdGroup* groups,
              int group_count, float* params, const float* grads, float* momentum,
              CudaStream stream) {
  const auto table = group_table(groups, group_count, "sgd_step");
  if (segment_count == 0) return;
  sgd_kernel<<<grid_for_segments(segment_count), kThreads, 0, stream>>>(
      segments, segment_count, table, group_count, params, grads, momentum);
  LOCKSTEP_CHECK_CUDA(cudaGetLastError());
}

void adamw_step(const OptimizerSegment* segments, std::int64_t segment_count,
                const AdamwGroup* groups, int group_count, float* params, const float* grads,
                float* exp_avg, float* exp_avg_sq, CudaStream stream) {
  const auto table = group_table(groups, group_count, "adamw_step");
  if (segment_count == 0) return;
  adamw_kernel<<<grid_for_segments(segment_count), kThreads, 0, stream>>>(
      segments, segment_count, table, group_count, params, grads, exp_avg, exp_avg_sq);
  LOCKSTEP_CHECK_CUDA(cudaGetLastError());
}

void unscale_and_check(float* grads, std::int64_t n, float inv_scale, std::int32_t* found_nonfinite,
                       CudaStream stream) {
  if (n == 0) return;
  unscale_kernel<<<detail::grid_for(n), kThreads, 0, stream>>>(grads, n, inv_scale,
                                                               found_nonfinite);
  LOCKSTEP_CHECK_CUDA(cudaGetLastError());
}

}  // namespace lockstep::kernels::cuda
