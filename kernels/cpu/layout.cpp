// CPU layout permutations (kernels/layout.h): a blocked transpose per batch
// entry, 32x32 element tiles so that both the reads and the writes of a tile
// stay within a few cache lines each, moved as whole 1-, 2-, 4- or 8-byte words.
#include <algorithm>
#include <cstring>
#include <initializer_list>
#include <string>

#include "kernels/error.h"
#include "kernels/layout.h"

namespace lockstep::kernels::cpu {
namespace {

constexpr std::int64_t kTile = 32;

template <typename Word>
void transpose_words(std::int64_t batch, std::int64_t rows, std::int64_t cols, const Word* x,
                     Word* y) {
  const std::int64_t plane = rows * cols;
  for (std::int64_t b = 0; b < batch; ++b) {
    const Word* in = x + b * plane;
    Word* out = y + b * plane;
    for (std::int64_t i0 = 0; i0 < rows; i0 += kTile)
      for (std::int64_t j0 = 0; j0 < cols; j0 += kTile) {
        const std::int64_t i1 = std::min(rows, i0 + kTile), j1 = std::min(cols, j0 + kTile);
        for (std::int64_t i = i0; i < i1; ++i)
          for (std::int64_t j = j0; j < j1; ++j) out[j * rows + i] = in[i * cols + j];
      }
  }
}

void check_layout_sizes(const char* op, std::initializer_list<std::int64_t> sizes) {
  for (std::int64_t v : sizes)
    if (v < 0)
      throw InvalidArgument(std::string(op) + ": sizes must not be negative, got " +
                            std::to_string(v) + " (check the tensor's shape)");
}

}  // namespace

void batched_transpose(DType type, std::int64_t batch, std::int64_t rows, std::int64_t cols,
                       const void* x, void* y) {
  check_layout_sizes("batched_transpose", {batch, rows, cols});
  if (batch == 0 || rows == 0 || cols == 0) return;
  if (rows == 1 || cols == 1) {  // the permutation is the identity
    std::memcpy(y, x, static_cast<std::size_t>(batch * rows * cols) * dtype_size(type));
    return;
  }
  switch (dtype_size(type)) {
    case 1:
      return transpose_words(batch, rows, cols, static_cast<const std::uint8_t*>(x),
                             static_cast<std::uint8_t*>(y));
    case 2:
      return transpose_words(batch, rows, cols, static_cast<const std::uint16_t*>(x),
                             static_cast<std::uint16_t*>(y));
    case 4:
      return transpose_words(batch, rows, cols, static_cast<const std::uint32_t*>(x),
                             static_cast<std::uint32_t*>(y));
    default:
      return transpose_words(batch, rows, cols, static_cast<const std::uint64_t*>(x),
                             static_cast<std::uint64_t*>(y));
  }
}

void nchw_to_nhwc(DType type, std::int64_t n, std::int64_t c, std::int64_t h, std::int64_t w,
                  const void* x, void* y) {
  check_layout_sizes("nchw_to_nhwc", {n, c, h, w});
  batched_transpose(type, n, c, h * w, x, y);
}

void nhwc_to_nchw(DType type, std::int64_t n, std::int64_t c, std::int64_t h, std::int64_t w,
                  const void* x, void* y) {
  check_layout_sizes("nhwc_to_nchw", {n, c, h, w});
  batched_transpose(type, n, h * w, c, x, y);
}

}  // namespace lockstep::kernels::cpu
