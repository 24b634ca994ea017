// The partition the CUDA column sums use (kernels/detail/column_chunks.h,
// Note [column chunks]), checked on the CPU: every row in exactly one
// non-empty chunk, every column in one tile, the grid within CUDA's limits,
// enough blocks to fill the H200 at GPT-2's shapes, and the workspace size.
#include <catch2/catch.hpp>

#include <cstdint>
#include <vector>

#include "kernels/detail/column_chunks.h"

using namespace lockstep::kernels::detail;

TEST_CASE("column chunks cover every row once and every column in a tile", "[kernels][chunks]") {
  const std::vector<std::int64_t> row_counts = {1,    7,     63,    64,      65,          1000,
                                                4097, 16384, 65537, 1 << 20, 3000000017LL};
  for (std::int64_t cols : {1, 31, 32, 33, 768, 3072, 50304}) {
    for (std::int64_t rows : row_counts) {
      INFO("rows " << rows << ", cols " << cols);
      const ColumnChunks p = column_chunks(rows, cols);
      CHECK(p.tiles * kColumnTile >= cols);
      CHECK((p.tiles - 1) * kColumnTile < cols);
      REQUIRE(p.chunks >= 1);
      CHECK(p.chunks <= kMaxChunks);  // gridDim.y may be at most 65535
      CHECK(p.tiles <= 0x7fffffffLL);
      // Chunk c holds rows [c * chunk_rows, min(rows, (c + 1) * chunk_rows)): together
      // they cover [0, rows), and the last one is not empty.
      CHECK(p.chunks * p.chunk_rows >= rows);
      CHECK((p.chunks - 1) * p.chunk_rows < rows);
      // No more chunks than kMinChunkRows-row pieces: small inputs are not split finely.
      CHECK(p.chunks <= (rows + kMinChunkRows - 1) / kMinChunkRows);
      CHECK(column_sums_workspace_bytes(rows, cols, 2) ==
            static_cast<std::size_t>(2 * p.chunks * cols) * sizeof(double));
    }
  }
}

TEST_CASE("column chunks fill the H200 at gpt2's LayerNorm and bias shapes", "[kernels][chunks]") {
  // 16K tokens: C = 768 (LayerNorm, attention and MLP projections' biases), 4C (c_fc).
  for (std::int64_t cols : {768, 3072}) {
    const ColumnChunks p = column_chunks(16384, cols);
    INFO("cols " << cols << ": " << p.tiles << " tiles x " << p.chunks << " chunks");
    CHECK(p.tiles * p.chunks >= 2 * 132);
    CHECK(p.chunk_rows <= 2048);  // each thread reads at most 256 rows
  }
}

TEST_CASE("column chunks of no rows need no workspace", "[kernels][chunks]") {
  const ColumnChunks p = column_chunks(0, 768);
  CHECK(p.chunks == 0);
  CHECK(p.tiles == 24);
  CHECK(column_sums_workspace_bytes(0, 768, 2) == 0);
  CHECK(column_sums_workspace_bytes(100, 0, 1) == 0);
}
