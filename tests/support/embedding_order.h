// The CUDA embedding gradient's additions (Note [embedding gradient order],
// kernels/cuda/embedding.cu) written as a host loop in f32: an index with at
// most kEmbeddingChunk positions adds them to its row in position order (the
// CPU loop's order); a longer one sums each piece between the chunk
// boundaries of the sorted order in position order, then adds the pieces to
// its row in order. [gpu] tests hold the kernel to this bit for bit; CPU
// tests hold this to kernels::cpu::embedding_backward and a float64 sum.
#pragma once

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <vector>

#include "kernels/embedding.h"

namespace lockstep::test {

// dweight [vocab, dim] += the gradient of dout [count, dim] at i64 `indices`;
// an index outside [0, vocab) adds nothing.
inline void embedding_backward_in_cuda_order(std::int64_t count, std::int64_t vocab,
                                             std::int64_t dim, const float* dout,
                                             const std::int64_t* indices, float* dweight) {
  const std::int64_t chunk = kernels::kEmbeddingChunk;
  const auto key = [&](std::int64_t n) {
    return indices[n] >= 0 && indices[n] < vocab ? indices[n] : vocab;
  };
  std::vector<std::int64_t> order(static_cast<std::size_t>(count));
  std::iota(order.begin(), order.end(), std::int64_t{0});
  std::stable_sort(order.begin(), order.end(),
                   [&](std::int64_t a, std::int64_t b) { return key(a) < key(b); });
  const auto row_of = [&](std::int64_t k) {
    return dout + order[static_cast<std::size_t>(k)] * dim;
  };
  for (std::int64_t start = 0; start < count;) {
    const std::int64_t run_key = key(order[static_cast<std::size_t>(start)]);
    std::int64_t end = start + 1;
    while (end < count && key(order[static_cast<std::size_t>(end)]) == run_key) ++end;
    if (run_key < vocab) {
      float* row = dweight + run_key * dim;
      if (end - start <= chunk) {
        for (std::int64_t d = 0; d < dim; ++d) {
          float acc = row[d];
          for (std::int64_t r = start; r < end; ++r) acc += row_of(r)[d];
          row[d] = acc;
        }
      } else {
        for (std::int64_t d = 0; d < dim; ++d) {
          float acc = row[d];
          for (std::int64_t a = start; a < end;) {
            const std::int64_t b = std::min(end, (a / chunk + 1) * chunk);  // next boundary
            float piece = row_of(a)[d];
            for (std::int64_t r = a + 1; r < b; ++r) piece += row_of(r)[d];
            acc += piece;
            a = b;
          }
          row[d] = acc;
        }
      }
    }
    start = end;
  }
}

}  // namespace lockstep::test
