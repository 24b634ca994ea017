// CPU embedding lookup and gradient (kernels/embedding.h).
#include "kernels/embedding.h"

#include <string>

#include "kernels/error.h"

namespace lockstep::kernels::cpu {
namespace {
std::int64_t index_at(const EmbeddingShape& s, const void* indices, std::int64_t n) {
  const std::int64_t index = s.index_type == DType::i32
                                 ? static_cast<const std::int32_t*>(indices)[n]
                                 : static_cast<const std::int64_t*>(indices)[n];
  if (index < 0 || index >= s.vocab)
    throw InvalidArgument("embedding: index " + std::to_string(index) + " at position " +
                          std::to_string(n) + " is outside the vocabulary [0, " +
                          std::to_string(s.vocab) + ")");
  return index;
}
}  // namespace

void embedding_forward(const EmbeddingShape& s, const float* weight, const void* indices,
                       float* out) {
  for (std::int64_t n = 0; n < s.count; ++n) {
    const float* row = weight + index_at(s, indices, n) * s.dim;
    for (std::int64_t d = 0; d < s.dim; ++d) out[n * s.dim + d] = row[d];
  }
}

void embedding_backward(const EmbeddingShape& s, const float* dout, const void* indices,
                        float* dweight) {
  for (std::int64_t n = 0; n < s.count; ++n) {
    float* row = dweight + index_at(s, indices, n) * s.dim;
    for (std::int64_t d = 0; d < s.dim; ++d) row[d] += dout[n * s.dim + d];
  }
}

}  // namespace lockstep::kernels::cpu
