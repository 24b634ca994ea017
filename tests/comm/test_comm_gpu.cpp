// One-rank NCCL tests for the GPU machine ([gpu]): comm::init launched
// directly binds cuda:0 and creates a one-rank NCCL communicator without
// MPI; its collectives and the synchroniser's stream path run on device
// buffers. With one rank every reduction is the identity, so the expected
// values are the inputs (or their independent 16-bit roundings); the
// rank-invariant reduction's device path (alltoall, the chunk tree) too.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "comm/comm_test_support.h"
#include "comm/gradient_synchronizer.h"
#include "comm/ordered_reduce.h"
#include "comm/world.h"
#include "support/world_of_one.h"

using namespace lockstep;
using comm::ReduceOp;
using core::Tensor;

namespace {

std::vector<float> ramp(std::int64_t n) {
  std::vector<float> v(static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < n; ++i) v[static_cast<std::size_t>(i)] = 0.25f * (i % 97) - 12.0f;
  return v;
}

// Elements of the segments whose one-rank reduction `got` is not `sent` as
// the wire format rounds it (an f32 wire leaves it as it is).
std::size_t wire_mismatches(const std::vector<float>& got, const std::vector<float>& sent,
                            const std::vector<comm::GradientSegment>& segments, DType wire) {
  std::size_t wrong = 0;
  for (const auto& s : segments)
    for (std::int64_t i = s.offset; i < s.offset + s.numel; ++i) {
      const double x = sent[static_cast<std::size_t>(i)];
      const double want = wire == DType::bf16  ? test::round_bf16(x)
                          : wire == DType::f16 ? test::round_f16(x)
                                               : x;
      if (got[static_cast<std::size_t>(i)] != want) ++wrong;
    }
  return wrong;
}

}  // namespace

TEST_CASE("launched directly, the world binds cuda:0 and a one-rank NCCL communicator",
          "[gpu][comm]") {
  comm::World& world = test::gpu_world_of_one();
  CHECK_FALSE(world.uses_mpi());
  CHECK(world.size() == 1);
  REQUIRE(world.device() == core::Device::cuda(0));
  comm::Communicator& nccl = world.for_device(world.device());
  CHECK(std::string(nccl.backend()) == "nccl");
  CHECK(nccl.device() == core::Device::cuda(0));
  // Note [NCCL connects at init]: set before NCCL's first call, to 0 unless the
  // environment that ran this test had set it (tools/gpu-check.sh does not).
  const char* connect = std::getenv("NCCL_RUNTIME_CONNECT");
  REQUIRE(connect != nullptr);
  INFO("NCCL_RUNTIME_CONNECT=" << connect);
  CHECK(std::string(connect) == "0");
}

TEST_CASE("one-rank NCCL collectives on device buffers return the inputs", "[gpu][comm]") {
  comm::World& world = test::gpu_world_of_one();
  comm::Communicator& nccl = world.for_device(world.device());
  const core::Device gpu = world.device();
  core::Stream stream = core::Stream::create(gpu);
  Tensor scratch = Tensor::zeros({4}, DType::f32, gpu);
  nccl.allreduce(scratch.data(), 0, DType::f32, ReduceOp::sum);  // nothing to do is fine
  nccl.allgather(scratch.data(), scratch.data(), 0, DType::f32, stream);
  for (std::int64_t n : {1, 1000, 65537}) {
    const std::vector<float> values = ramp(n);  // exact in f16 and bf16
    for (DType dtype : {DType::f32, DType::f16, DType::bf16})
      for (ReduceOp op : {ReduceOp::sum, ReduceOp::avg}) {
        Tensor x = Tensor::from_vector(values, {n}, DType::f32, gpu).cast(dtype);
        nccl.allreduce(x, op);          // blocking, on the communicator's stream
        nccl.allreduce(x, op, stream);  // enqueued on ours
        CHECK(x.cast(DType::f32, stream).to_vector<float>(stream) == values);
      }
    Tensor x = Tensor::from_vector(values, {n}, DType::f32, gpu);
    nccl.broadcast(x, 0);
    Tensor gathered = Tensor::zeros({n}, DType::f32, gpu);
    nccl.allgather(x, gathered);
    Tensor scattered = Tensor::zeros({n}, DType::f32, gpu);
    nccl.reduce_scatter(gathered, scattered, ReduceOp::sum);
    CHECK(scattered.to_vector<float>() == values);
  }
  nccl.barrier();
  auto dup = nccl.duplicate("gpu-dup");
  Tensor one = Tensor::from_vector<float>({3.0f}, {1}, DType::f32, gpu);
  dup->allreduce(one, ReduceOp::sum);
  CHECK(one.to_vector<float>() == std::vector<float>{3.0f});
}

TEST_CASE("the synchroniser reduces device gradients on its stream, f32 and 16-bit wire",
          "[gpu][comm]") {
  comm::World& world = test::gpu_world_of_one();
  const core::Device gpu = world.device();
  core::Stream compute = core::Stream::create(gpu);
  for (DType wire : {DType::f32, DType::bf16, DType::f16}) {
    std::int64_t total = 0;
    comm::SynchronizedModel model;
    model.segments = test::aligned_segments(
        {{"fc2.weight", {10, 300}}, {"fc2.bias", {10}}, {"fc1.weight", {300, 40}}}, total);
    std::mt19937 rng(5);
    std::uniform_real_distribution<float> dist(-4.0f, 4.0f);
    std::vector<float> host(static_cast<std::size_t>(total));
    for (float& v : host) v = dist(rng);
    model.parameters = Tensor::zeros({total}, DType::f32, gpu, compute);
    model.gradients = Tensor::from_vector(host, {total}, DType::f32, gpu, compute);
    model.buffers = {{"bn.mean", Tensor::zeros({7}, DType::f32, gpu, compute)}};
    const Tensor grads = model.gradients;
    comm::SynchronizerOptions options;
    options.first_bucket_cap_bytes = 4096;
    options.bucket_cap_bytes = 16384;
    options.wire_dtype = wire;
    options.compute_stream = compute;
    comm::GradientSynchronizer sync(world.for_device(gpu), std::move(model), options);
    CHECK(sync.buckets().size() > 1);
    sync.begin_step(0);
    for (std::size_t s = 0; s < sync.segments().size(); ++s) sync.mark_ready(s);
    sync.finish();
    INFO("wire " << dtype_name(wire));
    CHECK(wire_mismatches(grads.to_vector<float>(compute), host, sync.segments(), wire) == 0);
  }
}

// ZeRO-1 on device buffers (Note [shard layout]): ncclReduceScatter per
// bucket on the communication stream, the tail bucket and a 16-bit wire
// through their scratch buffers, and gather()'s ncclAllGather back, ordered
// after the compute stream's work and before its next. The buffer ends 10
// elements after a 64-element boundary, so even one rank has a tail bucket.
// One rank owns every chunk: the gradients are the inputs (or their 16-bit
// roundings) and the gather leaves the parameters as the compute stream wrote them.
TEST_CASE("ZeRO-1 reduce-scatters device gradients and gathers parameters, with a tail",
          "[gpu][comm][zero]") {
  comm::World& world = test::gpu_world_of_one();
  const core::Device gpu = world.device();
  core::Stream compute = core::Stream::create(gpu);
  for (DType wire : {DType::f32, DType::bf16, DType::f16}) {
    INFO("wire " << dtype_name(wire));
    std::int64_t padded = 0;
    comm::SynchronizedModel model;
    model.segments = test::aligned_segments(
        {{"fc2.weight", {10, 300}}, {"fc2.bias", {10}}, {"fc1.weight", {10, 1}}}, padded);
    const std::int64_t total = model.segments.back().offset + model.segments.back().numel;
    std::mt19937 rng(6);
    std::uniform_real_distribution<float> dist(-4.0f, 4.0f);
    std::vector<float> grads_host(static_cast<std::size_t>(total)), params_host(grads_host.size());
    for (float& v : grads_host) v = dist(rng);
    for (float& v : params_host) v = dist(rng);
    model.parameters = Tensor::zeros({total}, DType::f32, gpu, compute);
    model.gradients = Tensor::from_vector(grads_host, {total}, DType::f32, gpu, compute);
    Tensor params = model.parameters, grads = model.gradients;
    comm::SynchronizerOptions options;
    options.first_bucket_cap_bytes = options.bucket_cap_bytes = 4096;
    options.wire_dtype = wire;
    options.compute_stream = compute;
    options.zero_stage = 1;
    comm::GradientSynchronizer sync(world.for_device(gpu), std::move(model), options);
    const comm::ShardLayout& layout = sync.shard_layout();
    REQUIRE(layout.buckets.size() > 2);
    REQUIRE(layout.padded_numel() > total);  // the tail bucket
    sync.begin_step(0);
    for (std::size_t s = 0; s < sync.segments().size(); ++s) sync.mark_ready(s);
    sync.finish();
    CHECK(wire_mismatches(grads.to_vector<float>(compute), grads_host, sync.segments(), wire) == 0);
    // The "update", on the compute stream; the gather must come after it.
    const Tensor updated =
        Tensor::from_vector(params_host, {total}, DType::f32);  // outlives the copy
    params.copy_from(updated, compute);
    sync.gather(params);
    CHECK(params.to_vector<float>(compute) == params_host);
  }
}

// The rank-invariant reduction's device path (comm/ordered_reduce.h): NCCL's
// alltoall (grouped ncclSend/ncclRecv) copies one rank's slice to itself, the
// ChunkTree adds on the GPU with the bits of the host tree (an elementwise
// f32 add rounds the same on both), and ordered synchronisation's finish()
// leaves one rank's gradients as they are.
TEST_CASE("NCCL alltoall, the chunk tree on device and ordered synchronisation",
          "[gpu][comm][invariant]") {
  comm::World& world = test::gpu_world_of_one();
  const core::Device gpu = world.device();
  core::Stream compute = core::Stream::create(gpu);
  comm::Communicator& nccl = world.for_device(gpu);
  const std::vector<float> sent = ramp(1000);
  Tensor send = Tensor::from_vector(sent, {1000}, DType::f32, gpu, compute);
  Tensor recv = Tensor::zeros({1000}, DType::f32, gpu, compute);
  nccl.alltoall(send.data(), recv.data(), 1000, DType::f32, compute);
  CHECK(recv.to_vector<float>(compute) == sent);

  constexpr std::int64_t leaves = 5, numel = 777;
  std::mt19937 rng(8);
  std::uniform_real_distribution<float> mantissa(-1.0f, 1.0f);
  std::vector<std::vector<float>> chunks(leaves, std::vector<float>(numel));
  for (auto& c : chunks)
    for (float& v : c) v = std::ldexp(mantissa(rng), static_cast<int>(rng() % 40) - 20);
  Tensor device_leaf = Tensor::empty({numel}, DType::f32, gpu, compute);
  Tensor host_leaf = Tensor::empty({numel}, DType::f32);
  comm::ChunkTree on_device(device_leaf, leaves, compute), on_host(host_leaf, leaves, {});
  std::vector<Tensor> staged;  // outlive the asynchronous copies
  for (const auto& c : chunks) {
    staged.push_back(Tensor::from_vector(c, {numel}, DType::f32));
    device_leaf.copy_from(staged.back(), compute);
    on_device.add(compute);
    host_leaf.copy_from(staged.back());
    on_host.add({});
  }
  CHECK(device_leaf.to_vector<float>(compute) == host_leaf.to_vector<float>());

  comm::SynchronizedModel model;
  std::int64_t padded = 0;
  model.segments = test::aligned_segments({{"fc.weight", {10, 30}}, {"fc.bias", {10}}}, padded);
  const std::int64_t total = model.segments.back().offset + model.segments.back().numel;
  const std::vector<float> grads_host = ramp(total);
  model.parameters = Tensor::zeros({total}, DType::f32, gpu, compute);
  model.gradients = Tensor::from_vector(grads_host, {total}, DType::f32, gpu, compute);
  Tensor grads = model.gradients;
  comm::SynchronizerOptions options;
  options.compute_stream = compute;
  options.average = false;
  options.ordered = true;
  comm::GradientSynchronizer sync(nccl, std::move(model), options);
  sync.begin_step(0);
  for (std::size_t s = 0; s < sync.segments().size(); ++s) sync.mark_ready(s);
  sync.finish();
  CHECK(grads.to_vector<float>(compute) == grads_host);
}
