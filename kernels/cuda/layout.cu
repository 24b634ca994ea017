// CUDA layout permutations (kernels/layout.h): a tiled transpose through
// shared memory, so that a warp reads 32 consecutive elements of a row of x
// and writes 32 consecutive elements of a row of y (coalesced on both sides,
// Note [transpose tiles]), plus the f32 transpose-add that folds a
// channels-last weight gradient into the KCRS one (kernels/cuda/conv.cu).
#include <algorithm>
#include <cstdint>
#include <initializer_list>
#include <string>

#include "kernels/cuda/check.h"
#include "kernels/cuda/device_float.cuh"
#include "kernels/cuda/grid_index.cuh"
#include "kernels/error.h"
#include "kernels/layout.h"

namespace lockstep::kernels::cuda {
namespace {

// Note [transpose tiles]: a block of 32 x 8 threads moves one 32 x 32 tile of
// one batch entry per iteration: it loads rows i0..i0+31 of x (threadIdx.x
// along the row: consecutive addresses), syncs, and stores columns j0..j0+31
// of the tile as rows of y (threadIdx.x along i: consecutive again). The
// tile row is 33 wide so that reading a column of it touches 32 different
// banks for 4-byte words (8-byte words are served per half warp, 2-byte ones
// pair up within a bank word: at most two-way conflicts). Edge tiles are
// bounds-checked on both sides; the second __syncthreads keeps the next
// iteration's loads from overwriting a tile still being stored. Tiles are
// numbered over (batch, tile row, tile column), so no grid dimension limit
// applies; blocks stride over them. A matrix with at most kNarrow rows or
// columns (an RGB image's 3 channels, a 1x1 or 7x7x3 filter) would leave
// most of each tile idle, so it takes narrow_transpose_kernel instead: a
// thread per position along the long side, looping over the short one;
// consecutive threads touch consecutive elements of the long side's rows
// (coalesced), and each thread's short run is contiguous on the other side,
// so a warp's stores for one short index cover a few sectors that the next
// indices fill (L2 merges them).
constexpr int kTile = 32;
constexpr int kTileRows = 8;
constexpr std::int64_t kMaxBlocks = 1 << 16;

constexpr std::int64_t kNarrow = 8;

enum class Store { copy, assign_sum, add };

template <typename In, typename Acc, Store kStore>
__device__ __forceinline__ Acc load(const In& v) {
  if constexpr (kStore == Store::copy)
    return v;
  else
    return detail::to_f32(v);
}

template <typename Acc, Store kStore>
__device__ __forceinline__ void store(Acc& dst, Acc v) {
  if constexpr (kStore == Store::copy)
    dst = v;
  else if constexpr (kStore == Store::add)
    dst = dst + v;
  else
    dst = 0.0f + v;
}

// y[b, j, i] = x[b, i, j] (copy), or the f32 sum of it with y (add) or with 0
// (assign_sum), x widened to Acc on load.
template <typename In, typename Acc, Store kStore, typename Index>
__global__ void transpose_kernel(const In* x, Acc* y, Index rows, Index cols, Index tiles_r,
                                 Index tiles_c, Index tiles) {
  __shared__ Acc tile[kTile][kTile + 1];
  const int tx = static_cast<int>(threadIdx.x), ty = static_cast<int>(threadIdx.y);
  for (Index t = blockIdx.x; t < tiles; t += gridDim.x) {
    const Index b = t / (tiles_r * tiles_c), rem = t % (tiles_r * tiles_c);
    const Index i0 = rem / tiles_c * kTile, j0 = rem % tiles_c * kTile;
    const In* in = x + b * rows * cols;
    Acc* out = y + b * rows * cols;
    for (int k = ty; k < kTile; k += kTileRows) {
      const Index i = i0 + k, j = j0 + tx;
      if (i < rows && j < cols) tile[k][tx] = load<In, Acc, kStore>(in[i * cols + j]);
    }
    __syncthreads();
    for (int k = ty; k < kTile; k += kTileRows) {
      const Index j = j0 + k, i = i0 + tx;
      if (i < rows && j < cols) store<Acc, kStore>(out[j * rows + i], tile[tx][k]);
    }
    __syncthreads();
  }
}

// The same permutation for rows <= kNarrow or cols <= kNarrow (Note
// [transpose tiles]): thread t takes batch entry t / long_side and position
// t % long_side along the long side.
template <typename In, typename Acc, Store kStore, typename Index>
__global__ void narrow_transpose_kernel(const In* x, Acc* y, Index batch, Index rows, Index cols) {
  const bool short_rows = rows <= cols;
  const Index long_side = short_rows ? cols : rows, short_side = short_rows ? rows : cols;
  for (Index t = detail::first_index<Index>(); t < batch * long_side;
       t += detail::grid_stride<Index>()) {
    const Index b = t / long_side, p = t % long_side;
    const In* in = x + b * rows * cols;
    Acc* out = y + b * rows * cols;
    for (Index q = 0; q < short_side; ++q) {
      const Index i = short_rows ? q : p, j = short_rows ? p : q;
      store<Acc, kStore>(out[j * rows + i], load<In, Acc, kStore>(in[i * cols + j]));
    }
  }
}

void check_sizes(const char* op, std::initializer_list<std::int64_t> sizes) {
  for (std::int64_t v : sizes)
    if (v < 0)
      throw InvalidArgument(std::string(op) + ": sizes must not be negative, got " +
                            std::to_string(v) + " (check the tensor's shape)");
}

template <typename In, typename Acc, Store kStore>
void launch(std::int64_t batch, std::int64_t rows, std::int64_t cols, const void* x, void* y,
            CudaStream stream) {
  if (std::min(rows, cols) <= kNarrow) {
    const std::int64_t threads = batch * std::max(rows, cols);
    detail::with_index(batch * rows * cols, [&](auto index) {
      using Index = decltype(index);
      narrow_transpose_kernel<In, Acc, kStore, Index>
          <<<detail::grid_for(threads), detail::kThreads, 0, stream>>>(
              static_cast<const In*>(x), static_cast<Acc*>(y), static_cast<Index>(batch),
              static_cast<Index>(rows), static_cast<Index>(cols));
    });
    LOCKSTEP_CHECK_CUDA(cudaGetLastError());
    return;
  }
  const std::int64_t tiles_r = (rows + kTile - 1) / kTile, tiles_c = (cols + kTile - 1) / kTile;
  const std::int64_t tiles = batch * tiles_r * tiles_c;
  const dim3 block(kTile, kTileRows);
  const auto grid = static_cast<unsigned>(std::min(tiles, kMaxBlocks));
  // Offsets reach batch * rows * cols - 1, the largest index the kernel forms.
  detail::with_index(batch * rows * cols, [&](auto index) {
    using Index = decltype(index);
    transpose_kernel<In, Acc, kStore, Index><<<grid, block, 0, stream>>>(
        static_cast<const In*>(x), static_cast<Acc*>(y), static_cast<Index>(rows),
        static_cast<Index>(cols), static_cast<Index>(tiles_r), static_cast<Index>(tiles_c),
        static_cast<Index>(tiles));
  });
  LOCKSTEP_CHECK_CUDA(cudaGetLastError());
}

}  // namespace

void batched_transpose(DType type, std::int64_t batch, std::int64_t rows, std::int64_t cols,
                       const void* x, void* y, CudaStream stream) {
  check_sizes("batched_transpose", {batch, rows, cols});
  if (batch == 0 || rows == 0 || cols == 0) return;
  if (rows == 1 || cols == 1) {  // the permutation is the identity
    LOCKSTEP_CHECK_CUDA(
        cudaMemcpyAsync(y, x, static_cast<std::size_t>(batch * rows * cols) * dtype_size(type),
                        cudaMemcpyDeviceToDevice, stream));
    return;
  }
  detail::dispatch_word(dtype_size(type), [&](auto word) {
    using Word = decltype(word);
    launch<Word, Word, Store::copy>(batch, rows, cols, x, y, stream);
  });
}

void nchw_to_nhwc(DType type, std::int64_t n, std::int64_t c, std::int64_t h, std::int64_t w,
                  const void* x, void* y, CudaStream stream) {
  check_sizes("nchw_to_nhwc", {n, c, h, w});
  batched_transpose(type, n, c, h * w, x, y, stream);
}

void nhwc_to_nchw(DType type, std::int64_t n, std::int64_t c, std::int64_t h, std::int64_t w,
                  const void* x, void* y, CudaStream stream) {
  check_sizes("nhwc_to_nchw", {n, c, h, w});
  batched_transpose(type, n, h * w, c, x, y, stream);
}

void batched_transpose_add_f32(DType x_type, std::int64_t batch, std::int64_t rows,
                               std::int64_t cols, const void* x, float* y, bool accumulate,
                               CudaStream stream) {
  check_sizes("batched_transpose_add_f32", {batch, rows, cols});
  if (batch == 0 || rows == 0 || cols == 0) return;
  detail::dispatch_float(x_type, "batched_transpose_add_f32", [&](auto value) {
    using In = decltype(value);
    if (accumulate)
      launch<In, float, Store::add>(batch, rows, cols, x, y, stream);
    else
      launch<In, float, Store::assign_sum>(batch, rows, cols, x, y, stream);
  });
}

}  // namespace lockstep::kernels::cuda
