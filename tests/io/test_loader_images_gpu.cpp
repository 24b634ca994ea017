// The image pipeline of ResNet-50's recipe on a GPU at its real shapes:
// JPEGs of photo sizes in an encoded-image shard, random-resized-crop to
// 224 x 224 with a flip and ImageNet's normalisation (and the evaluation's
// centre crop), batches of 32 delivered by a cuda loader (u8 crops copied
// from pinned buffers, normalised on the device) against the cpu loader's
// f32 batches of the same draws. The cuda path rounds each resampled value
// to u8 before normalising, the cpu path does not: they differ by at most
// half a level, 0.5 / 255 / std (0.0088 for std 0.224), plus f32 rounding.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>  // turbojpeg.h's users
#include <vector>

#include "io/encoded_shard_writer.h"
#include "io/image_fixtures.h"
#include "io/loader.h"
#include "io/shard_fixtures.h"

using namespace lockstep;
using namespace lockstep::io;
using test::TempDir;

namespace {

const core::Device kGpu = core::Device::cuda(0);

// 96 JPEGs (4:2:0, quality 90, as photographs are stored) of sizes around
// ImageNet's, some smaller than the crop so that it enlarges, some large
// enough that the decode scales (Note [scaled decode]); labels i % 10.
Dataset photo_shard(const TempDir& dir) {
  const int sizes[][2] = {{375, 500}, {500, 333}, {224, 224}, {180, 240}, {640, 480}, {97, 131}};
  std::vector<std::vector<std::uint8_t>> files;
  std::vector<std::int64_t> bytes;
  for (int i = 0; i < 96; ++i) {
    const int height = sizes[i % 6][0], width = sizes[i % 6][1];
    files.push_back(test::encode_jpeg(test::image_pixels(i, height, width, 3), height, width, 3, 90,
                                      TJSAMP_420));
    bytes.push_back(static_cast<std::int64_t>(files.back().size()));
  }
  EncodedShardWriter writer(dir / "photos.h5", bytes);
  for (int i = 0; i < 96; ++i) writer.append(files[i], i % 10);
  writer.close();
  return Dataset::open(dir.path());
}

// Every batch of an epoch of both loaders, compared value by value.
void require_same_batches(const Dataset& data, const ImageOptions& images) {
  const SamplerOptions sampler{.micro_batch = 32, .seed = 4};
  DataLoader cpu(data, {.sampler = sampler, .threads = 2, .images = images});
  const core::Stream stream = core::Stream::create(kGpu);
  DataLoader gpu(
      data, {.sampler = sampler, .threads = 3, .device = kGpu, .stream = stream, .images = images});
  float min_std = 1;
  for (float s : images.std) min_std = std::min(min_std, s);
  // Half a level of the u8 rounding, and f32 rounding of values up to ~3.
  const double tolerance = 0.5 / 255.0 / min_std + 1e-5;
  for (std::int64_t epoch = 0; epoch < 2; ++epoch) {
    cpu.start_epoch(epoch);
    gpu.start_epoch(epoch);
    int batches = 0;
    while (auto c = cpu.next()) {
      auto g = gpu.next();
      REQUIRE(g);
      REQUIRE(g->inputs.shape() == core::Shape{32, 3, 224, 224});
      REQUIRE(g->indices == c->indices);
      std::vector<float> got(g->inputs.numel());
      g->inputs.copy_to_host(got.data(), stream);
      const std::vector<float> want = c->inputs.to_vector<float>();
      double worst = 0;
      for (std::size_t i = 0; i < got.size(); ++i)
        worst = std::max(worst, std::fabs(static_cast<double>(got[i]) - want[i]));
      INFO("epoch " << epoch << " batch " << batches << ": largest difference " << worst);
      REQUIRE(worst <= tolerance);
      REQUIRE(g->labels.to_vector<std::int64_t>(stream) == c->labels.to_vector<std::int64_t>());
      ++batches;
    }
    CHECK(batches == 3);
    CHECK(!gpu.next());
  }
}

}  // namespace

TEST_CASE("cuda batches of JPEGs at 224 are the cpu loader's within half a level",
          "[gpu][io][loader][images]") {
  TempDir dir;
  const Dataset data = photo_shard(dir);
  ImageOptions images{.channels = 3,
                      .height = 224,
                      .width = 224,
                      .mean = {0.485f, 0.456f, 0.406f},
                      .std = {0.229f, 0.224f, 0.225f},
                      .seed = 9};
  SECTION("training: random-resized-crop and flip") {
    images.crop = CropKind::random_resized;
    images.flip = true;
    require_same_batches(data, images);
  }
  SECTION("evaluation: the centre 224 of the shorter side resized to 256") {
    require_same_batches(data, images);
  }
}
