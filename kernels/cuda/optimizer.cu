// CUDA optimizer steps and unscaling (kernels/optimizer.h). One launch covers
// every parameter: each block takes whole segments from the device-resident
// table, and the group hyper-parameters travel by value in the launch, so a
// step needs no host-to-device copy. Same f32 formulas as the CPU versions;
// the weights' low-precision copy written in the same pass (Note [fused
// weight copy]).
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

// What a step does with an updated weight besides storing it: nothing, or
// the store into the low-precision copy (Note [fused weight copy]).
struct NoCopy {
  __device__ void operator()(std::int64_t, float) const {}
};
template <typename T>
struct CopyTo {
  T* low;
  __device__ void operator()(std::int64_t i, float p) const { low[i] = detail::from_f32<T>(p); }
};

// Calls launch(copier) with the copier `copy` asks for.
template <typename Launch>
void with_copy(const WeightCopy& copy, const char* op, Launch&& launch) {
  if (copy.data == nullptr) return launch(NoCopy{});
  if (copy.type == DType::bf16)
    return launch(CopyTo<__nv_bfloat16>{static_cast<__nv_bfloat16*>(copy.data)});
  if (copy.type == DType::f16) return launch(CopyTo<__half>{static_cast<__half*>(copy.data)});
  throw InvalidArgument(std::string(op) + ": a weight copy in " + dtype_name(copy.type) +
                        " (the fused copy is bf16 or f16)");
}

template <typename Copy>
__global__ void sgd_kernel(const OptimizerSegment* segments, std::int64_t segment_count,
                           GroupTable<SgdGroup> groups, int group_count, float* params,
                           const float* grads, float* momentum, Copy copy) {
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
      float updated;
      if (h.momentum == 0.0f) {
        updated = p - h.lr * d;
      } else {
        const float b = h.first_step ? d : h.momentum * buf[i] + h.one_minus_dampening * d;
        buf[i] = b;
        updated = p - h.lr * (h.nesterov ? d + h.momentum * b : b);
      }
      params[i] = updated;
      copy(i, updated);
    }
  }
}

template <typename Copy>
__global__ void adamw_kernel(const OptimizerSegment* segments, std::int64_t segment_count,
                             GroupTable<AdamwGroup> groups, int group_count, float* params,
                             const float* grads, float* exp_avg, float* exp_avg_sq, Copy copy) {
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
      const float updated = params[i] * h.decay_factor - h.step_size * (m / denom);
      params[i] = updated;
      copy(i, updated);
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
              CudaStream stream, WeightCopy copy) {
  const auto table = group_table(groups, group_count, "sgd_step");
  if (segment_count == 0) return;
  with_copy(copy, "sgd_step", [&](auto copier) {
    sgd_kernel<<<grid_for_segments(segment_count), kThreads, 0, stream>>>(
        segments, segment_count, table, group_count, params, grads, momentum, copier);
  });
  LOCKSTEP_CHECK_CUDA(cudaGetLastError());
}

void adamw_step(const OptimizerSegment* segments, std::int64_t segment_count,
                const AdamwGroup* groups, int group_count, float* params, const float* grads,
                float* exp_avg, float* exp_avg_sq, CudaStream stream, WeightCopy copy) {
  const auto table = group_table(groups, group_count, "adamw_step");
  if (segment_count == 0) return;
  with_copy(copy, "adamw_step", [&](auto copier) {
    adamw_kernel<<<grid_for_segments(segment_count), kThreads, 0, stream>>>(
        segments, segment_count, table, group_count, params, grads, exp_avg, exp_avg_sq, copier);
  });
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
