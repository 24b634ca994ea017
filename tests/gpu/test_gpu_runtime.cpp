// The CUDA runtime paths under engine/core: zero-byte frees, the pool's
// release and retry on an allocation failure, an event query that says "not
// yet", and the GEMM workspace each stream owns. Each checks the thread's last
// CUDA error too, since an error left there is blamed on the next launch.
#include <cuda_runtime_api.h>
#include <catch2/catch.hpp>

#include <atomic>
#include <cstddef>

#include "engine/core/memory.h"
#include "engine/core/ops.h"
#include "engine/core/stream.h"
#include "engine/core/tensor.h"
#include "kernels/gemm.h"

using namespace lockstep;
using namespace lockstep::core;

namespace {

const Device kGpu = Device::cuda(0);

// What the next launch check would find; reading it clears it, as there.
cudaError_t last_error() { return cudaGetLastError(); }

// A host function that holds its stream until released.
struct Gate {
  std::atomic<bool> open{false};
  static void CUDART_CB wait(void* self) {
    while (!static_cast<Gate*>(self)->open.load()) {
    }
  }
};

}  // namespace

TEST_CASE("zero-byte device allocations free cleanly and the next launch runs", "[gpu][memory]") {
  REQUIRE(last_error() == cudaSuccess);
  const std::size_t before = memory_stats(kGpu).current_bytes;
  {
    const Stream created = Stream::create(kGpu);
    auto on_default = allocate(kGpu, 0, Stream::default_for(kGpu));
    auto on_created = allocate(kGpu, 0, created);
    CHECK(on_default->data() == nullptr);
    CHECK(on_created->data() == nullptr);
    const Tensor empty = Tensor::empty({0, 7}, DType::f16, kGpu, created);
    CHECK(empty.nbytes() == 0);
  }
  CHECK(memory_stats(kGpu).current_bytes == before);
  CHECK(last_error() == cudaSuccess);
  Tensor t = Tensor::empty({1000}, DType::f32, kGpu);
  t.fill_(2.5);
  CHECK(last_error() == cudaSuccess);
  CHECK(t.to_vector<float>()[999] == 2.5f);
}

TEST_CASE("an event still pending leaves no error behind", "[gpu][stream]") {
  const Stream s = Stream::create(kGpu);
  Gate gate;
  REQUIRE(cudaLaunchHostFunc(s.handle(), Gate::wait, &gate) == cudaSuccess);
  Event done;
  done.record(s);
  CHECK_FALSE(done.ready());
  CHECK(last_error() == cudaSuccess);
  gate.open = true;
  done.synchronize();
  CHECK(done.ready());
  CHECK(last_error() == cudaSuccess);
}

// Note [gemm workspace]: the workspace lives and dies with its stream, so a
// stream created after another was destroyed (CUDA may hand out the same
// handle) gets a fresh one, and nothing accumulates.
TEST_CASE("each stream owns one GEMM workspace, freed with the stream", "[gpu][stream][gemm]") {
  const std::size_t bytes = kernels::cuda::kGemmWorkspaceBytes;
  Stream::default_for(kGpu).gemm_workspace();  // the process's own, kept
  const std::size_t before = memory_stats(kGpu).current_bytes;
  for (int round = 0; round < 3; ++round) {
    INFO("round " << round);
    Stream a = Stream::create(kGpu), b = Stream::create(kGpu);
    void* wa = a.gemm_workspace();
    const Stream copy = a;
    CHECK(copy.gemm_workspace() == wa);
    CHECK(b.gemm_workspace() != wa);
    CHECK(memory_stats(kGpu).current_bytes == before + 2 * bytes);
    // A GEMM through ops uses it, and still runs right.
    const Tensor x = Tensor::zeros({64, 32}, DType::f32, kGpu, a);
    Tensor y = Tensor::zeros({64, 64}, DType::f32, kGpu, a);
    ops::matmul(x, x, y, {.trans_b = true}, a);
    CHECK(y.to_vector<float>(a)[100] == 0.0f);
  }
  CHECK(memory_stats(kGpu).current_bytes == before);
  CHECK(cudaDeviceSynchronize() == cudaSuccess);
}

// Note [pool retry]: memory the pool caches, but cannot serve a larger request
// from, is released to the device when that request fails, and the request
// succeeds. Sizes are fractions of what is free, so any GPU fits.
TEST_CASE("a failed device allocation releases the pool's cache and retries", "[gpu][memory]") {
  Stream::default_for(kGpu).synchronize();
  std::size_t free_bytes = 0, total_bytes = 0;
  REQUIRE(cudaMemGetInfo(&free_bytes, &total_bytes) == cudaSuccess);
  const std::size_t unit = free_bytes / 20 / 256 * 256;
  allocate(kGpu, 11 * unit, Stream::default_for(kGpu)).reset();  // cached by the pool
  Stream::default_for(kGpu).synchronize();
  void* outside = nullptr;  // as cuDNN or NCCL would take it: outside the pool
  REQUIRE(cudaMalloc(&outside, 6 * unit) == cudaSuccess);
  // 11 cached + 6 outside of 20: 13 units fit only once the cache is released.
  std::shared_ptr<Storage> large;
  CHECK_NOTHROW(large = allocate(kGpu, 13 * unit, Stream::default_for(kGpu)));
  CHECK(last_error() == cudaSuccess);
  large.reset();
  Stream::default_for(kGpu).synchronize();
  CHECK(cudaFree(outside) == cudaSuccess);
}
