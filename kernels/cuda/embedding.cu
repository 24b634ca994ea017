// CUDA embedding lookup and gradient (kernels/embedding.h). The lookup gives
// a block each row; an index outside the vocabulary reads nothing, writes
// zeros and is recorded for the caller to report. The gradient sorts (index,
// position) pairs with CUB's radix sort, which is stable, so that the
// positions of one index come out in order, then adds each index's rows in
// that order over the whole GPU: Note [embedding gradient order]. No atomics.
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
constexpr int kChunk = static_cast<int>(kEmbeddingChunk);
constexpr std::uint32_t kNoKey = UINT32_MAX;  // past either end of the sorted keys
static_assert(kChunk <= kThreads, "a block stages a chunk's keys one per thread");

__device__ std::int64_t index_at(const EmbeddingShape& s, const void* indices, std::int64_t n) {
  return s.index_type == DType::i32 ? static_cast<const std::int32_t*>(indices)[n]
                                    : static_cast<const std::int64_t*>(indices)[n];
}

unsigned row_blocks(std::int64_t count) {
  return static_cast<unsigned>(count < kMaxRowBlocks ? count : kMaxRowBlocks);
}

// How a lookup records a bad index: the report word (Note [index report
// word]), or the first position itself into an all-ones i64 (the synchronous
// caller's form).
enum class Record { report, first_position };

template <Record record>
__global__ void forward_kernel(EmbeddingShape s, const float* weight, const void* indices,
                               float* out, unsigned long long* word, unsigned long long tag) {
  for (std::int64_t n = blockIdx.x; n < s.count; n += gridDim.x) {
    const std::int64_t index = index_at(s, indices, n);
    const bool valid = index >= 0 && index < s.vocab;
    if (!valid && threadIdx.x == 0 && word != nullptr) {
      if constexpr (record == Record::report)
        atomicMax(word, ~(tag << kIndexReportPositionBits | static_cast<unsigned long long>(n)));
      else
        atomicMin(word, static_cast<unsigned long long>(n));
    }
    float* dst = out + n * s.dim;
    if (!valid) {  // no read of the table: the index may point anywhere
      for (std::int64_t d = threadIdx.x; d < s.dim; d += blockDim.x) dst[d] = 0.0f;
      continue;
    }
    const float* row = weight + index * s.dim;
    for (std::int64_t d = threadIdx.x; d < s.dim; d += blockDim.x) dst[d] = row[d];
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

// Note [embedding gradient order]: after the stable sort, the positions of one
// key (a run) are contiguous and in increasing order. Real text repeats a few
// tokens hundreds of times in a batch (gpt2's 8192 tokens), so a block per run
// would leave one block adding a whole 8192-row run. Instead the sorted
// entries are cut into chunks of kChunk, block c owning [c kChunk, (c+1)
// kChunk), and every channel is added in an order fixed by the sorted keys
// alone (not by the grid or the block size, so the bits repeat):
// - a run of at most kChunk positions is added by the block holding its first
//   entry, straight into dweight in position order, as the CPU loop adds it
//   (the CPU's bits; such a run may reach into the next chunk);
// - a longer run is cut at the chunk boundaries into pieces; each block sums
//   its piece in position order into a partial, slot 2c for a piece that
//   begins at the chunk's start, 2c + 1 for one that begins inside it (at most
//   one of each, since two runs that begin in one chunk cannot both be long);
//   then finish_kernel adds the partials to dweight's row in chunk order.
// A block decides from the keys in [c kChunk - kChunk, c kChunk + 2 kChunk),
// staged in shared memory: whether a run is long is whether the entry kChunk
// after its start still holds its key. Blocks (c, y) spread the channels, a
// thread one channel of each piece: gpt2's 8192 tokens give 256 x 3 blocks,
// about one wave on an H100 or H200, each thread walking at most kChunk
// pieces (a block per run, as before, had 8192 blocks but left a run of
// hundreds of rows to one block).
__global__ void chunk_kernel(EmbeddingShape s, const float* __restrict__ dout,
                             const std::uint32_t* __restrict__ keys,
                             const std::int32_t* __restrict__ positions,
                             float* __restrict__ dweight, float* __restrict__ partials) {
  __shared__ std::uint32_t staged_keys[3 * kChunk];
  __shared__ std::int32_t staged_positions[2 * kChunk];
  const std::int64_t first = std::int64_t{blockIdx.x} * kChunk, lo = first - kChunk;
  for (int t = threadIdx.x; t < 3 * kChunk; t += blockDim.x) {
    const std::int64_t k = lo + t;
    staged_keys[t] = k >= 0 && k < s.count ? keys[k] : kNoKey;
    if (t < 2 * kChunk) staged_positions[t] = first + t < s.count ? positions[first + t] : 0;
  }
  __syncthreads();
  const auto key_at = [&](std::int64_t k) { return staged_keys[k - lo]; };
  const auto row_at = [&](std::int64_t k) {
    return dout + std::int64_t{staged_positions[k - first]} * s.dim;
  };
  const std::int64_t end = first + kChunk < s.count ? first + kChunk : s.count;
  const std::int64_t channel = blockIdx.y * std::int64_t{blockDim.x} + threadIdx.x;
  const std::int64_t channel_step = std::int64_t{gridDim.y} * blockDim.x;
  for (std::int64_t k = first; k < end;) {
    const std::uint32_t key = key_at(k);
    std::int64_t piece_end = k + 1;
    while (piece_end < end && key_at(piece_end) == key) ++piece_end;
    const bool starts_run = key_at(k - 1) != key;
    std::int64_t start = k;  // the run's, when it starts within kChunk before k
    while (start > lo && key_at(start - 1) == key) --start;
    const bool long_run = start == lo || key_at(start + kChunk) == key;
    if (key < s.vocab && starts_run && !long_run) {
      std::int64_t run_end = k + 1;
      while (key_at(run_end) == key) ++run_end;
      float* row = dweight + std::int64_t{key} * s.dim;
      for (std::int64_t d = channel; d < s.dim; d += channel_step) {
        float acc = row[d];
        for (std::int64_t r = k; r < run_end; ++r) acc += row_at(r)[d];
        row[d] = acc;
      }
    } else if (key < s.vocab && long_run) {
      float* partial = partials + (2 * std::int64_t{blockIdx.x} + (k == first ? 0 : 1)) * s.dim;
      for (std::int64_t d = channel; d < s.dim; d += channel_step) {
        float acc = row_at(k)[d];
        for (std::int64_t r = k + 1; r < piece_end; ++r) acc += row_at(r)[d];
        partial[d] = acc;
      }
    }
    k = piece_end;
  }
}

// Block (c, y): the long run that starts in chunk c, if any, adds its pieces'
// partials to its row in chunk order; blockIdx.y spreads the channels.
__global__ void finish_kernel(EmbeddingShape s, const std::uint32_t* __restrict__ keys,
                              const float* __restrict__ partials, float* __restrict__ dweight) {
  __shared__ long long long_start;
  const std::int64_t first = std::int64_t{blockIdx.x} * kChunk;
  if (threadIdx.x == 0) long_start = -1;
  __syncthreads();
  if (threadIdx.x < kChunk) {
    const std::int64_t k = first + threadIdx.x;
    if (k + kChunk < s.count) {
      const std::uint32_t key = keys[k];
      if (key < s.vocab && (k == 0 || keys[k - 1] != key) && keys[k + kChunk] == key)
        long_start = k;  // one writer at most: Note [embedding gradient order]
    }
  }
  __syncthreads();
  const std::int64_t start = long_start;
  if (start < 0) return;
  const std::uint32_t key = keys[start];
  // The run's end: the first entry past start + kChunk with another key.
  std::int64_t in_run = start + kChunk, past = s.count;
  while (past - in_run > 1) {
    const std::int64_t mid = in_run + (past - in_run) / 2;
    (keys[mid] == key ? in_run : past) = mid;
  }
  const std::int64_t last_chunk = (past - 1) / kChunk;
  const float* first_partial =
      partials + (2 * std::int64_t{blockIdx.x} + (start == first ? 0 : 1)) * s.dim;
  float* row = dweight + std::int64_t{key} * s.dim;
  for (std::int64_t d = blockIdx.y * std::int64_t{blockDim.x} + threadIdx.x; d < s.dim;
       d += std::int64_t{gridDim.y} * blockDim.x) {
    float acc = row[d] + first_partial[d];
    for (std::int64_t c = std::int64_t{blockIdx.x} + 1; c <= last_chunk; ++c)
      acc += partials[2 * c * s.dim + d];
    row[d] = acc;
  }
}

// The workspace: keys and positions in and out (each rounded up to 256 bytes),
// CUB's scratch, then two partial rows per chunk.
struct SortLayout {
  std::size_t array_bytes = 0;
  std::size_t cub_bytes = 0;
  std::size_t partial_bytes = 0;
  std::int64_t chunks = 0;
  int end_bit = 0;
  std::size_t partials_at() const { return (4 * array_bytes + cub_bytes + 255) / 256 * 256; }
  std::size_t total() const { return partials_at() + partial_bytes; }
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
  layout.chunks = (s.count + kChunk - 1) / kChunk;
  layout.partial_bytes =
      2 * static_cast<std::size_t>(layout.chunks) * static_cast<std::size_t>(s.dim) * sizeof(float);
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
                       float* out, IndexReport report, CudaStream stream) {
  if (s.count == 0) return;
  if (report.word != nullptr && (s.count > (std::int64_t{1} << kIndexReportPositionBits) ||
                                 report.tag >= (std::uint64_t{1} << kIndexReportTagBits)))
    throw InvalidArgument("embedding_forward: " + std::to_string(s.count) +
                          " indices or lookup tag " + std::to_string(report.tag) +
                          " beyond what the index report word holds (2^" +
                          std::to_string(kIndexReportPositionBits) + " positions, 2^" +
                          std::to_string(kIndexReportTagBits) + " tags)");
  forward_kernel<Record::report><<<row_blocks(s.count), kThreads, 0, stream>>>(
      s, weight, indices, out, reinterpret_cast<unsigned long long*>(report.word), report.tag);
  LOCKSTEP_CHECK_CUDA(cudaGetLastError());
}

void embedding_forward(const EmbeddingShape& s, const float* weight, const void* indices,
                       float* out, std::int64_t* first_bad, CudaStream stream) {
  auto* bad = reinterpret_cast<unsigned long long*>(first_bad);
  LOCKSTEP_CHECK_CUDA(cudaMemsetAsync(bad, 0xff, sizeof *bad, stream));  // -1: none
  if (s.count == 0) return;
  forward_kernel<Record::first_position>
      <<<row_blocks(s.count), kThreads, 0, stream>>>(s, weight, indices, out, bad, 0);
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
  auto* partials = reinterpret_cast<float*>(base + layout.partials_at());
  sort_input_kernel<<<detail::grid_for(s.count), kThreads, 0, stream>>>(s, indices, keys_in,
                                                                        positions_in);
  LOCKSTEP_CHECK_CUDA(cudaGetLastError());
  std::size_t cub_bytes = layout.cub_bytes;
  LOCKSTEP_CHECK_CUDA(cub::DeviceRadixSort::SortPairs(
      base + 4 * layout.array_bytes, cub_bytes, keys_in, keys_out, positions_in, positions_out,
      static_cast<int>(s.count), 0, layout.end_bit, stream));
  const std::int64_t channel_blocks = (s.dim + kThreads - 1) / kThreads;
  const dim3 grid(static_cast<unsigned>(layout.chunks),
                  static_cast<unsigned>(channel_blocks < 65535 ? channel_blocks : 65535));
  chunk_kernel<<<grid, kThreads, 0, stream>>>(s, dout, keys_out, positions_out, dweight, partials);
  LOCKSTEP_CHECK_CUDA(cudaGetLastError());
  finish_kernel<<<grid, kThreads, 0, stream>>>(s, keys_out, partials, dweight);
  LOCKSTEP_CHECK_CUDA(cudaGetLastError());
}

}  // namespace lockstep::kernels::cuda
