// How the CUDA column sums (LayerNorm's dgamma and dbeta, a Linear's bias
// gradient) split a [rows, cols] buffer: tiles of kColumnTile columns times
// chunks of whole rows, one block each, every block writing f64 partials
// that a second pass adds chunk by chunk in order. Plain C++, so that the
// partition is tested on the CPU (tests/kernels/test_column_chunks.cpp).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>

namespace lockstep::kernels::detail {

constexpr std::int64_t kColumnTile = 32;    // a warp's adjacent columns: coalesced reads
constexpr std::int64_t kChunkRowLanes = 8;  // rows a block reads at once (32 x 8 threads)
constexpr std::int64_t kMinChunkRows = 64;
constexpr std::int64_t kMaxChunks = 1024;  // well under the grid's 65535 in y
// Blocks to aim for: 8 per SM of the H200's 132. A constant, never the device's
// SM count, so that the partition (and so the bits) depend on the shape only.
constexpr std::int64_t kTargetBlocks = 1056;

// Note [column chunks]: the sum over rows of column j is, in f64, the sum over
// chunks c = 0, 1, ... in order of the chunk's sum, which is the sum over row
// lanes l = 0..7 in order of rows begin + l, begin + l + 8, ... in order. The
// partition depends only on (rows, cols), so the result is the same bits on
// every run and every device; it differs from the CPU's in-order f64 sum only
// in f64 rounding (relative 2^-53 per add) before the one rounding to f32.
struct ColumnChunks {
  std::int64_t tiles = 0;       // ceil(cols / kColumnTile)
  std::int64_t chunks = 0;      // 0 when there are no rows; every chunk non-empty
  std::int64_t chunk_rows = 0;  // rows per chunk; the last may have fewer
};

inline ColumnChunks column_chunks(std::int64_t rows, std::int64_t cols) {
  ColumnChunks p;
  p.tiles = (cols + kColumnTile - 1) / kColumnTile;
  if (rows <= 0 || cols <= 0) return p;
  const std::int64_t by_size = (rows + kMinChunkRows - 1) / kMinChunkRows;
  const std::int64_t by_blocks = (kTargetBlocks + p.tiles - 1) / p.tiles;
  const std::int64_t wanted = std::clamp<std::int64_t>(std::min(by_size, by_blocks), 1, kMaxChunks);
  p.chunk_rows = (rows + wanted - 1) / wanted;
  p.chunks = (rows + p.chunk_rows - 1) / p.chunk_rows;  // drops chunks left empty by rounding
  return p;
}

// Workspace for `sums` column sums of one [rows, cols] buffer: sums x chunks x
// cols f64 partials.
inline std::size_t column_sums_workspace_bytes(std::int64_t rows, std::int64_t cols, int sums) {
  const ColumnChunks p = column_chunks(rows, cols);
  return static_cast<std::size_t>(sums) * static_cast<std::size_t>(p.chunks) *
         static_cast<std::size_t>(cols < 0 ? 0 : cols) * sizeof(double);
}

}  // namespace lockstep::kernels::detail
