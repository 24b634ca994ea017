// Embedding lookup: out[n, :] = weight[index[n], :] for f32 weight [vocab,
// dim] and integer indices (i64 or i32), and its gradient, scatter-added into
// dweight in position order, in f32: the same bits on both backends (on CUDA
// the pairs are sorted by index, stably, then each index's positions added in
// order: Note [embedding gradient order] in cuda/embedding.cu; no atomics).
// An index outside [0, vocab) is an error on the CPU; the CUDA lookup, which
// cannot throw from a kernel, writes a zero row and records the first such
// position, which the caller reads and reports (engine/nn/embedding.cpp:
// Note [embedding index check]); the CUDA gradient skips such an index.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/dtype.h"
#include "kernels/stream.h"

namespace lockstep::kernels {

struct EmbeddingShape {
  std::int64_t count = 0;  // indices
  std::int64_t vocab = 0;
  std::int64_t dim = 0;
  DType index_type = DType::i64;
};

namespace cpu {
void embedding_forward(const EmbeddingShape& s, const float* weight, const void* indices,
                       float* out);
void embedding_backward(const EmbeddingShape& s, const float* dout, const void* indices,
                        float* dweight);
}  // namespace cpu

namespace cuda {
// first_bad: one device i64, set to the first position whose index is outside
// the vocabulary, or to -1 when there is none.
void embedding_forward(const EmbeddingShape& s, const float* weight, const void* indices,
                       float* out, std::int64_t* first_bad, CudaStream stream);
// Device scratch embedding_backward needs (the sort's keys, positions and CUB's
// own); throws for more than 2^31 - 1 indices or 2^32 - 1 rows.
std::size_t embedding_backward_workspace_bytes(const EmbeddingShape& s);
void embedding_backward(const EmbeddingShape& s, const float* dout, const void* indices,
                        float* dweight, void* workspace, CudaStream stream);
}  // namespace cuda

}  // namespace lockstep::kernels
