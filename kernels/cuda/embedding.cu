// CUDA embedding lookup and gradient (kernels/embedding.h). The lookup gives
// a block each row; an index outside the vocabulary writes zeros and records
// the first such position for the caller to report. The gradient sorts
// (index, position) pairs with CUB's radix sort, which is stable, so that the
// positions of one index come out in order; then a block per run of equal
// indices adds the run's rows channel by channel in that order, in f32: the
// CPU loop's additions in the CPU loop's order, so the bits equal (Note
// [embedding gradient order]). No atomics.
#include <cub/device/device_radix_sort.cuh>

#include <climits>
#include <string>

#include "kernels/cuda/check.h"
#include "kernels/cuda/device_float.cuh"
#include "kernels/embedding.h"

namespace lockstep::kernels::cuda {
namespace {

using detail::kThreads;

constexpr unsigned kMaxRowBlocks = 65536;  // grid-stride over rows beyond this

__device__ std::int64_t index_at(const EmbeddingShape& s, const void* indices, std::int64_t n) {
  return s.index_type == DType::i32 ? static_cast<const std::int32_t*>(indices)[n]
                                    : static_cast<const std::int64_t*>(indices)[n];
}

unsigned row_blocks(std::int64_t count) {
  return static_cast<unsigned>(count < kMaxRowBlocks ? count : kMaxRowBlocks);
}

__global__ void forward_kernel(EmbeddingShape s, const float* weight, const void* indices,
                               float* out, unsigned long long* first_bad) {
  for (std::int64_t n = blockIdx.x; n < s.count; n += gridDim.x) {
    const std::int64_t index = index_at(s, indices, n);
    const bool valid = index >= 0 && index < s.vocab;
    if (!valid && threadIdx.x == 0) atomicMin(first_bad, static_cast<unsigned long long>(n));
    const float* row = weight + (valid ? index : 0) * s.dim;
    float* dst = out + n * s.dim;
    for (std::int64_t d = threadIdx.x; d < s.dim; d += blockDim.x) dst[d] = valid ? row[d] : 0.0f;
  }
}

// Sort keys: the index, or `vocab` for one outside the vocabulary (sorted last,
// never added); values: the position.
__global__ void sort_input_kernel(EmbeddingShape s, const void* indices, std::uint32_t* keys,
                                  std::int32_t* positions) {
  for (std::int64_t n = blockIdx.x * std::int64_t{blockDim.x} + threadIdx.x; n < s.count;
       n += std::int64_t{gridDim.x} * blockDim.x) {
    const std::int64_t index = index_at(s, indices, n);
    keys[n] = static_cast<std::uint32_t>(index >= 0 && index < s.vocab ? index : s.vocab);
    positions[n] = static_cast<std::int32_t>(n);
  }
}

// Note [embedding gradient order]: block k does the work only where sorted
// entry k starts a run of equal keys; its threads own channels, and each adds
// dout[position, d] for the run's positions in increasing order to dweight
// [key, d], in f32, as cpu::embedding_backward does token by token.
__global__ void accumulate_kernel(EmbeddingShape s, const float* dout, const std::uint32_t* keys,
                                  const std::int32_t* positions, float* dweight) {
  for (std::int64_t k = blockIdx.x; k < s.count; k += gridDim.x) {
    const std::uint32_t key = keys[k];
    if (key >= s.vocab || (k > 0 && keys[k - 1] == key)) continue;
    std::int64_t end = k + 1;
    while (end < s.count && keys[end] == key) ++end;
    float* row = dweight + std::int64_t{key} * s.dim;
    for (std::int64_t d = threadIdx.x; d < s.dim; d += blockDim.x) {
      float acc = row[d];
      for (std::int64_t r = k; r < end; ++r) acc += dout[std::int64_t{positions[r]} * s.dim + d];
      row[d] = acc;
    }
  }
}

// The workspace: keys and positions in and out (each rounded up to 256 bytes),
// then CUB's scratch.
struct SortLayout {
  std::size_t array_bytes = 0;
  std::size_t cub_bytes = 0;
  int end_bit = 0;
  std::size_t total() const { return 4 * array_bytes + cub_bytes; }
};

SortLayout sort_layout(const EmbeddingShape& s) {
  if (s.count > INT_MAX)
    throw InvalidArgument("embedding_backward: " + std::to_string(s.count) +
                          " indices, more than the CUDA gradient sorts at once (" +
                          std::to_string(INT_MAX) + "; use a smaller batch)");
  if (s.vocab >= std::int64_t{UINT32_MAX})
    throw InvalidArgument("embedding_backward: vocabulary of " + std::to_string(s.vocab) +
                          " rows, more than the CUDA gradient's 32-bit keys hold");
  SortLayout layout;
  layout.array_bytes = (static_cast<std::size_t>(s.count) * 4 + 255) / 256 * 256;
  // Keys go up to vocab (the out-of-vocabulary key): sort only the bits that can be set.
  while (layout.end_bit < 32 && (std::int64_t{1} << layout.end_bit) <= s.vocab) ++layout.end_bit;
  LOCKSTEP_CHECK_CUDA(cub::DeviceRadixSort::SortPairs(
      nullptr, layout.cub_bytes, static_cast<const std::uint32_t*>(nullptr),
      static_cast<std::uint32_t*>(nullptr), static_cast<const std::int32_t*>(nullptr),
      static_cast<std::int32_t*>(nullptr), static_cast<int>(s.count), 0, layout.end_bit));
  return layout;
}

}  // namespace

void embedding_forward(const EmbeddingShape& s, const float* weight, const void* indices,
                       float* out, std::int64_t* first_bad, CudaStream stream) {
  auto* bad = reinterpret_cast<unsigned long long*>(first_bad);
  LOCKSTEP_CHECK_CUDA(cudaMemsetAsync(bad, 0xff, sizeof *bad, stream));  // -1: none
  if (s.count == 0) return;
  forward_kernel<<<row_blocks(s.count), kThreads, 0, stream>>>(s, weight, indices, out, bad);
  LOCKSTEP_CHECK_CUDA(cudaGetLastError());
}

std::size_t embedding_backward_workspace_bytes(const EmbeddingShape& s) {
  return s.count == 0 ? 0 : sort_layout(s).total();
}

void embedding_backward(const EmbeddingShape& s, const float* dout, const void* indices,
                        float* dweight, void* workspace, CudaStream stream) {
  if (s.count == 0 || s.dim == 0) return;
  const SortLayout layout = sort_layout(s);
  auto* base = static_cast<unsigned char*>(workspace);
  auto* keys_in = reinterpret_cast<std::uint32_t*>(base);
  auto* keys_out = reinterpret_cast<std::uint32_t*>(base + layout.array_bytes);
  auto* positions_in = reinterpret_cast<std::int32_t*>(base + 2 * layout.array_bytes);
  auto* positions_out = reinterpret_cast<std::int32_t*>(base + 3 * layout.array_bytes);
  sort_input_kernel<<<detail::grid_for(s.count), kThreads, 0, stream>>>(s, indices, keys_in,
                                                                        positions_in);
  LOCKSTEP_CHECK_CUDA(cudaGetLastError());
  std::size_t cub_bytes = layout.cub_bytes;
  LOCKSTEP_CHECK_CUDA(cub::DeviceRadixSort::SortPairs(
      base + 4 * layout.array_bytes, cub_bytes, keys_in, keys_out, positions_in, positions_out,
      static_cast<int>(s.count), 0, layout.end_bit, stream));
  accumulate_kernel<<<row_blocks(s.count), kThreads, 0, stream>>>(s, dout, keys_out, positions_out,
                                                                  dweight);
  LOCKSTEP_CHECK_CUDA(cudaGetLastError());
}

}  // namespace lockstep::kernels::cuda
