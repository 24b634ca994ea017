// Optimizer steps and loss-scale unscaling over flat f32 buffers (engine's
// ParameterStore lays every trainable parameter out in one buffer). One call
// updates every parameter: a segment table says which runs of the buffers
// belong to which parameter group, and each group brings its hyper-parameters.
// The update formulas are torch.optim's (SGD, AdamW), computed in f32. On
// CUDA a step can also write the updated weights' bf16 or f16 copy in the same
// pass (Note [fused weight copy]).
#pragma once

#include <cstdint>

#include "kernels/dtype.h"
#include "kernels/stream.h"

namespace lockstep::kernels {

// A run of the flat buffers whose elements all belong to one parameter group.
// Parameters are read at `offset`, gradients at `offset + grad_shift`, the
// optimizer state at `state_offset`: the same place for state in the flat
// layout, another when a rank keeps state for its ZeRO shard only, packed
// (engine's Optimizer::shard); gradients move too under ZeRO-2, whose rank
// keeps only its shard of them, packed like the state.
struct OptimizerSegment {
  std::int64_t offset;          // elements into the flat parameter buffer
  std::int64_t length;          // elements
  std::int32_t group;           // index into the per-group hyper-parameters
  std::int64_t state_offset;    // elements into the state buffers
  std::int64_t grad_shift = 0;  // gradient index minus parameter index
};

// CUDA gives each segment one thread block, so callers split longer runs into
// segments of at most this many elements to spread the work over the GPU.
constexpr std::int64_t kMaxSegmentLength = std::int64_t{1} << 15;
// The CUDA launches pass the group hyper-parameters by value (kernel
// parameter memory), which bounds their number.
constexpr int kMaxOptimizerGroups = 16;

// torch.optim.SGD for one group; lr, weight_decay, momentum, dampening as there.
struct SgdGroup {
  float lr;
  float weight_decay;
  float momentum;             // 0: no momentum buffer is read or written
  float one_minus_dampening;  // 1 - dampening, rounded once from f64 as in PyTorch
  bool nesterov;
  bool first_step;  // PyTorch's first momentum step: buf = g, without dampening
};

// torch.optim.AdamW for one group at step t (1 on the first step). The scalars
// are computed by the caller in f64 and rounded once, as PyTorch's are.
struct AdamwGroup {
  float decay_factor;  // 1 - lr * weight_decay
  float beta1, one_minus_beta1;
  float beta2, one_minus_beta2;
  float eps;
  float step_size;              // lr / (1 - beta1^t)
  float bias_correction2_sqrt;  // sqrt(1 - beta2^t)
};

// Note [fused weight copy]: under autocast, Linear and Conv2d compute on a
// bf16 or f16 copy of their f32 weight, which was remade by a cast per weight
// after every step (gpt2: ~49 casts, 0.5 GB read and 0.25 GB written). The
// CUDA steps instead write copy[i] = the updated params[i] rounded to nearest
// even in `type` (the cast's conversion, so the same bits) as they store
// params[i]: one more 2-byte store per element, no second read. `data` is
// indexed like params and covers every segment; padding is left unwritten.
struct WeightCopy {
  void* data = nullptr;      // device memory; null: no copy written
  DType type = DType::bf16;  // bf16 or f16
};

// Throws InvalidArgument naming the first segment (host memory) whose group is
// outside [0, group_count). The CPU steps check their table with it on every
// call. Note [device segment table]: the CUDA steps cannot read theirs, which
// lives in device memory, so its builder checks it here before the upload
// (engine's Optimizer does), and the kernels leave a segment naming a missing
// group untouched rather than read past the group table.
void validate_segments(const OptimizerSegment* segments, std::int64_t segment_count,
                       int group_count, const char* op);

namespace cpu {
// momentum may be null when no group has momentum.
void sgd_step(const OptimizerSegment* segments, std::int64_t segment_count, const SgdGroup* groups,
              int group_count, float* params, const float* grads, float* momentum);
void adamw_step(const OptimizerSegment* segments, std::int64_t segment_count,
                const AdamwGroup* groups, int group_count, float* params, const float* grads,
                float* exp_avg, float* exp_avg_sq);
// grads *= inv_scale over n elements, and *found_nonfinite = 1 when any element
// was inf or NaN before scaling (otherwise left as it is): GradScaler's
// unscale, fused with its check so the buffer is read once.
void unscale_and_check(float* grads, std::int64_t n, float inv_scale,
                       std::int32_t* found_nonfinite);
}  // namespace cpu

namespace cuda {
// segments, params, grads, state and found_nonfinite are device memory; the
// group hyper-parameters are host memory, copied into the launch. The segment
// table must have passed validate_segments (Note [device segment table]).
// `copy`, when it has data, receives the updated weights in its type (Note
// [fused weight copy]); the CPU steps have no such copy.
void sgd_step(const OptimizerSegment* segments, std::int64_t segment_count, const SgdGroup* groups,
              int group_count, float* params, const float* grads, float* momentum,
              CudaStream stream, WeightCopy copy = {});
void adamw_step(const OptimizerSegment* segments, std::int64_t segment_count,
                const AdamwGroup* groups, int group_count, float* params, const float* grads,
                float* exp_avg, float* exp_avg_sq, CudaStream stream, WeightCopy copy = {});
void unscale_and_check(float* grads, std::int64_t n, float inv_scale, std::int32_t* found_nonfinite,
                       CudaStream stream);
}  // namespace cuda

}  // namespace lockstep::kernels
