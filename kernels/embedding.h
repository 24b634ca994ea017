// Embedding lookup: out[n, :] = weight[index[n], :] for f32 weight [vocab,
// dim] and integer indices (i64 or i32), and its gradient, scatter-added into
// dweight in index order (deterministic on both backends; on CUDA each thread
// owns one column and walks the indices in order, so no atomics).
// An index outside [0, vocab) is an error on the CPU and a zero row (and no
// gradient) on CUDA, which cannot throw from a kernel.
#pragma once

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
void embedding_forward(const EmbeddingShape& s, const float* weight, const void* indices,
                       float* out, CudaStream stream);
void embedding_backward(const EmbeddingShape& s, const float* dout, const void* indices,
                        float* dweight, CudaStream stream);
}  // namespace cuda

}  // namespace lockstep::kernels
