// DataLoader on a GPU against the same loader on the CPU: the same batches
// byte for byte (plain and u8-scaled, where both compute x * (1.0f / 255)),
// with a pool small enough that every buffer is reused while its previous
// copy may still run, on the consumer's own stream, and torn down while
// copies are in flight; and its workers run with the loader's GPU current.
#include <cuda_runtime_api.h>
#include <catch2/catch.hpp>

#include <cstring>
#include <mutex>
#include <set>

#include "io/loader.h"
#include "io/shard_fixtures.h"

using namespace lockstep;
using namespace lockstep::io;
using test::TempDir;

namespace {

const core::Device kGpu = core::Device::cuda(0);

struct Samples {
  TempDir dir;
  Dataset data;
  Samples() : data(make(dir)) {}
  static Dataset make(const TempDir& dir) {
    test::write_shard(dir / "a.h5", 0, 700, {3, 16, 16}, DType::u8);
    test::write_shard(dir / "b.h5", 700, 500, {3, 16, 16}, DType::u8);
    return Dataset::open(dir.path());
  }
};

std::vector<std::uint8_t> host_bytes(const core::Tensor& t, const core::Stream& stream) {
  std::vector<std::uint8_t> out(t.nbytes());
  t.copy_to_host(out.data(), stream);
  return out;
}

}  // namespace

TEST_CASE("cuda batches equal cpu batches, plain and scaled", "[gpu][io][loader]") {
  Samples s;
  for (bool scale : {false, true}) {
    const LoaderOptions base{
        .sampler = {.micro_batch = 32, .seed = 4}, .threads = 3, .scale_u8 = scale};
    DataLoader cpu(s.data, base);
    LoaderOptions on_gpu = base;
    on_gpu.device = kGpu;
    on_gpu.depth = 2;  // every buffer is refilled right after its copy was issued
    on_gpu.stream = core::Stream::create(kGpu);
    DataLoader gpu(s.data, on_gpu);
    cpu.start_epoch(3);
    gpu.start_epoch(3);
    int batches = 0;
    while (auto g = gpu.next()) {
      auto c = cpu.next();
      REQUIRE(c);
      REQUIRE(g->inputs.device() == kGpu);
      REQUIRE(g->indices == c->indices);
      REQUIRE(g->inputs.dtype() == (scale ? DType::f32 : DType::u8));
      CHECK(host_bytes(g->inputs, on_gpu.stream) == host_bytes(c->inputs, {}));
      CHECK(host_bytes(g->labels, on_gpu.stream) == host_bytes(c->labels, {}));
      CHECK(g->ready.ready());  // copy_to_host synchronised the consumer's stream
      ++batches;
    }
    CHECK_FALSE(cpu.next());
    CHECK(batches == 1200 / 32);
  }
}

TEST_CASE("a cuda loader shuts down with copies in flight", "[gpu][io][loader]") {
  Samples s;
  for (int taken : {0, 1, 5}) {
    DataLoader gpu(s.data, {.sampler = {.micro_batch = 64}, .threads = 4, .device = kGpu});
    gpu.start_epoch(0);
    for (int i = 0; i < taken; ++i) REQUIRE(gpu.next());
  }
  SUCCEED("no crash, hang or sanitizer report");
}

// The loader's device is the last visible GPU, the one a fresh thread does
// not start on when there are several. On a machine with one GPU the two
// coincide and this cannot tell; it guards multi-GPU nodes.
TEST_CASE("loader workers run with the loader's GPU current", "[gpu][io][loader]") {
  Samples s;
  int count = 0;
  REQUIRE(cudaGetDeviceCount(&count) == cudaSuccess);
  const core::Device device = core::Device::cuda(count - 1);
  std::mutex mutex;
  std::set<int> seen;
  LoaderOptions options{.sampler = {.micro_batch = 64}, .threads = 3, .device = device};
  options.transform = [&](HostBatch&) {  // on a worker: no Catch2 assertions here
    int current = -1;
    if (cudaGetDevice(&current) != cudaSuccess) current = -1;
    std::lock_guard lock(mutex);
    seen.insert(current);
  };
  DataLoader gpu(s.data, options);
  gpu.start_epoch(0);
  while (gpu.next()) {
  }
  CHECK(seen == std::set<int>{device.index});
}

// Note [image batches]: a cuda loader copies u8 crops and normalises them on
// the device; its batches are the cpu twin's normalisation of the same u8
// crops, bit for bit (both round the product and the sum separately).
TEST_CASE("cuda image batches are u8 crops normalised on the device", "[gpu][io][loader][images]") {
  Samples s;
  LoaderOptions options{.sampler = {.micro_batch = 16, .seed = 2}, .threads = 2, .device = kGpu};
  options.images = {.channels = 3,
                    .height = 12,
                    .width = 12,
                    .crop = CropKind::random_resized,
                    .flip = true,
                    .mean = {0.4f, 0.5f, 0.6f},
                    .std = {0.2f, 0.3f, 0.4f},
                    .seed = 2};
  options.stream = core::Stream::create(kGpu);
  DataLoader gpu(s.data, options);
  gpu.start_epoch(1);
  const kernels::ChannelAffine affine = channel_affine(options.images);
  int batches = 0;
  while (auto g = gpu.next()) {
    REQUIRE(g->inputs.dtype() == DType::f32);
    std::vector<float> got(g->inputs.numel());
    g->inputs.copy_to_host(got.data(), options.stream);
    std::vector<std::uint8_t> crops(got.size()), rows(3 * 16 * 16);
    for (std::size_t r = 0; r < g->indices.size(); ++r) {
      s.data.read_inputs(std::vector<std::int64_t>{g->indices[r]}, rows.data());
      const PixelView view{rows.data(), 3, 16, 16, 256, 16, 1};
      crop_resize_u8(view, choose_crop(options.images, 16, 16, 1, g->indices[r]), options.images,
                     crops.data() + r * 3 * 144);
    }
    std::vector<float> want(got.size());
    kernels::cpu::normalize_u8(crops.data(), want.data(), 16, 144, affine);
    REQUIRE(got == want);
    ++batches;
  }
  CHECK(batches == 1200 / 16);
}
