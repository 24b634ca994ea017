// Embedding lookup: out[n, :] = weight[index[n], :] for f32 weight [vocab,
// dim] and integer indices (i64 or i32), and its gradient, scatter-added into
// dweight in f32. The CPU adds in position order; CUDA sorts the pairs by
// index, stably, and adds an index's rows in that order when it has at most
// kEmbeddingChunk of them (the CPU's bits), in fixed chunks beyond (Note
// [embedding gradient order] in cuda/embedding.cu: no atomics, the same bits
// run to run). An index outside [0, vocab) is an error on the CPU; the CUDA
// lookup, which cannot throw from a kernel, writes a zero row and records
// the position in a report word (Note [index report word]), which the caller
// reads and reports (engine/nn/embedding.cpp: Note [embedding index check]);
// the CUDA gradient skips such an index.
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

// An index with at most this many positions in one call gets the CPU's bits
// on CUDA; one with more is summed in chunks of this many (Note [embedding
// gradient order]).
constexpr std::int64_t kEmbeddingChunk = 32;

// Note [index report word]: a device u64, zero while no lookup met a bad
// index. A lookup tagged `tag` (below 2^kIndexReportTagBits) that meets one at
// position n (below 2^kIndexReportPositionBits) raises the word with atomicMax
// to ~(tag << kIndexReportPositionBits | n), so the word ends at the smallest
// (tag, position): the first lookup in tag order with a bad index, at its
// first bad position. Lookups on one stream tagged in launch order report the
// first bad index in that order, as the CPU loop would meet it.
constexpr int kIndexReportPositionBits = 40;
constexpr int kIndexReportTagBits = 23;
struct IndexReport {
  std::uint64_t* word = nullptr;  // device memory; null: nothing recorded
  std::uint64_t tag = 0;
};
inline bool index_report_bad(std::uint64_t word) { return word != 0; }
inline std::uint64_t index_report_tag(std::uint64_t word) {
  return ~word >> kIndexReportPositionBits;
}
inline std::int64_t index_report_position(std::uint64_t word) {
  return static_cast<std::int64_t>(~word & ((std::uint64_t{1} << kIndexReportPositionBits) - 1));
}

namespace cpu {
void embedding_forward(const EmbeddingShape& s, const float* weight, const void* indices,
                       float* out);
void embedding_backward(const EmbeddingShape& s, const float* dout, const void* indices,
                        float* dweight);
}  // namespace cpu

namespace cuda {
// Records a bad index into `report` (Note [index report word]) without
// clearing it first; a null word records nothing (indices the caller built
// in range). Throws for more than 2^40 indices when reporting.
void embedding_forward(const EmbeddingShape& s, const float* weight, const void* indices,
                       float* out, IndexReport report, CudaStream stream);
// first_bad: one device i64, set to the first position whose index is outside
// the vocabulary, or to -1 when there is none.
void embedding_forward(const EmbeddingShape& s, const float* weight, const void* indices,
                       float* out, std::int64_t* first_bad, CudaStream stream);
// Device scratch embedding_backward needs (the sort's keys, positions and CUB's
// own, and the chunks' partial sums); throws for more than 2^31 - 1 indices or
// 2^32 - 1 rows.
std::size_t embedding_backward_workspace_bytes(const EmbeddingShape& s);
void embedding_backward(const EmbeddingShape& s, const float* dout, const void* indices,
                        float* dweight, void* workspace, CudaStream stream);
}  // namespace cuda

}  // namespace lockstep::kernels
