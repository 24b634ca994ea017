// Attention's non-GEMM pieces, for causal self-attention (engine/nn/attention.h):
// moving heads between the row layout [B, T, parts * H * D] that Linear produces
// and the head-major layout [parts, B, H, T, D] the batched GEMMs want, and the
// causal masked softmax over scores [B * H, T, T] with its backward. The GEMMs
// (QK^T and PV) go through kernels/gemm.h with strided batches, as llm.c does.
#pragma once

#include <cstdint>

#include "kernels/dtype.h"
#include "kernels/stream.h"

namespace lockstep::kernels {

struct AttentionShape {
  std::int64_t batch = 0;     // B
  std::int64_t seq = 0;       // T
  std::int64_t heads = 0;     // H
  std::int64_t head_dim = 0;  // D
  std::int64_t parts = 1;     // P: 3 for fused q, k, v; 1 for one tensor
  DType type = DType::f32;    // of the moved elements (any float type)
};

// Throws InvalidArgument naming the field at fault (non-positive sizes, type).
void validate_attention(const AttentionShape& s);

namespace cpu {
// rows [B, T, P, H, D] -> heads [P, B, H, T, D].
void split_heads(const AttentionShape& s, const void* rows, void* heads);
// heads [P, B, H, T, D] -> rows [B, T, P, H, D] (the inverse of split_heads).
void merge_heads(const AttentionShape& s, const void* heads, void* rows);
// probs[n, i, j] = softmax over j <= i of scale * scores[n, i, j], and 0 for
// j > i; n runs over `matrices` T x T f32 matrices. Max-subtracted, so stable.
// Both softmax functions (CPU and CUDA) may run in place: probs == scores,
// dscores == dprobs (each element is written after its row's reductions, and
// from its own input element only).
void causal_softmax_forward(std::int64_t matrices, std::int64_t seq, float scale,
                            const float* scores, float* probs);
// dscores = scale * probs * (dprobs - sum_j probs * dprobs) for j <= i, else 0.
void causal_softmax_backward(std::int64_t matrices, std::int64_t seq, float scale,
                             const float* probs, const float* dprobs, float* dscores);
}  // namespace cpu

namespace cuda {
void split_heads(const AttentionShape& s, const void* rows, void* heads, CudaStream stream);
void merge_heads(const AttentionShape& s, const void* heads, void* rows, CudaStream stream);
void causal_softmax_forward(std::int64_t matrices, std::int64_t seq, float scale,
                            const float* scores, float* probs, CudaStream stream);
void causal_softmax_backward(std::int64_t matrices, std::int64_t seq, float scale,
                             const float* probs, const float* dprobs, float* dscores,
                             CudaStream stream);
}  // namespace cuda

}  // namespace lockstep::kernels
