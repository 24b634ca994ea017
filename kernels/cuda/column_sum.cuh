// Deterministic column sums over a row-major [rows, cols] buffer in two
// passes (Note [column chunks], kernels/detail/column_chunks.h): a grid of
// column tiles x row chunks writes f64 partials to the caller's workspace,
// then one thread per column adds its chunks in order and adds the total to
// an f32 output (+=). No atomics; the bits depend on the shape only.
#pragma once

#include <cstdint>

#include "kernels/cuda/check.h"
#include "kernels/cuda/device_float.cuh"
#include "kernels/detail/column_chunks.h"
#include "kernels/stream.h"

namespace lockstep::kernels::cuda::detail {

using kernels::detail::kChunkRowLanes;
using kernels::detail::kColumnTile;

// Up to kSums f32 outputs, each added to (+=); a null one is skipped.
template <int kSums>
struct ColumnOutputs {
  float* out[kSums] = {};
};

// Block (kColumnTile, kChunkRowLanes), grid (tiles, chunks). term(i, j, acc)
// adds row i's terms of column j to acc[0..kSums).
template <int kSums, typename Term>
__global__ void column_partials(std::int64_t rows, std::int64_t cols, std::int64_t chunk_rows,
                                Term term, double* partials) {
  __shared__ double lanes[kSums][kChunkRowLanes][kColumnTile];
  const std::int64_t j = blockIdx.x * kColumnTile + threadIdx.x;
  const std::int64_t begin = blockIdx.y * chunk_rows;
  const std::int64_t end = begin + chunk_rows < rows ? begin + chunk_rows : rows;
  double acc[kSums] = {};
  if (j < cols)
    for (std::int64_t i = begin + threadIdx.y; i < end; i += kChunkRowLanes) term(i, j, acc);
  for (int k = 0; k < kSums; ++k) lanes[k][threadIdx.y][threadIdx.x] = acc[k];
  __syncthreads();
  if (threadIdx.y != 0 || j >= cols) return;
  for (int k = 0; k < kSums; ++k) {
    double chunk = 0.0;
    for (int lane = 0; lane < kChunkRowLanes; ++lane) chunk += lanes[k][lane][threadIdx.x];
    partials[(k * std::int64_t{gridDim.y} + blockIdx.y) * cols + j] = chunk;
  }
}

template <int kSums>
__global__ void column_finish(const double* partials, std::int64_t chunks, std::int64_t cols,
                              ColumnOutputs<kSums> outputs) {
  for (std::int64_t j = blockIdx.x * std::int64_t{blockDim.x} + threadIdx.x; j < cols;
       j += std::int64_t{gridDim.x} * blockDim.x) {
    for (int k = 0; k < kSums; ++k) {
      if (!outputs.out[k]) continue;
      double total = 0.0;
      for (std::int64_t c = 0; c < chunks; ++c) total += partials[(k * chunks + c) * cols + j];
      outputs.out[k][j] = static_cast<float>(outputs.out[k][j] + total);
    }
  }
}

// Launches both passes on `stream`. workspace: column_sums_workspace_bytes(rows,
// cols, kSums) bytes of device memory. With no rows, adds 0 to every output.
template <int kSums, typename Term>
void column_sums(std::int64_t rows, std::int64_t cols, Term term, ColumnOutputs<kSums> outputs,
                 void* workspace, CudaStream stream) {
  if (cols <= 0) return;
  const kernels::detail::ColumnChunks p = kernels::detail::column_chunks(rows, cols);
  auto* partials = static_cast<double*>(workspace);
  if (p.chunks > 0) {
    const dim3 grid(static_cast<unsigned>(p.tiles), static_cast<unsigned>(p.chunks));
    const dim3 block(kColumnTile, kChunkRowLanes);
    column_partials<kSums><<<grid, block, 0, stream>>>(rows, cols, p.chunk_rows, term, partials);
  }
  column_finish<kSums><<<grid_for(cols), kThreads, 0, stream>>>(partials, p.chunks, cols, outputs);
  LOCKSTEP_CHECK_CUDA(cudaGetLastError());
}

}  // namespace lockstep::kernels::cuda::detail
