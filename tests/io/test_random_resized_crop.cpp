// io::choose_crop's random-resized-crop against torchvision's algorithm:
// torchvision.transforms.RandomResizedCrop.get_params
// (torchvision/transforms/transforms.py) transcribed below in float64, Python's round (half to
// even) and floor division included, fed the same uniforms the library draws (Note [keyed
// augmentation]: Philox at (seed, 0xA06 << 48 + epoch), 41 a sample). Only the source of randomness
// is not torchvision's: torch.randint (0, n + 1) is taken as floor(u (n + 1)) of a uniform, as the
// library takes it. Every box must be the reference's exactly: the ten attempts, the bounds test,
// and the fallback (the whole image cut to the nearest allowed aspect ratio, centred), at
// ImageNet's defaults and at other ranges. torchvision draws its uniforms and takes the log of the
// ratio range in float32; the library and this reference compute in float64 from the same float32
// uniforms, so a box could differ from torchvision's own by a pixel only where a side lands within
// float32 rounding of a half.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "io/image_transform.h"
#include "kernels/philox.h"

using namespace lockstep;
using namespace lockstep::io;

namespace {

constexpr std::uint64_t kAugmentStream = std::uint64_t{0xA06} << 48;  // image_transform.cpp's
constexpr int kWordsPerSample = 4 * 10 + 1;

// Python's round(x) for a float: to the nearest integer, halves to even.
double python_round(double x) {
  const double lower = std::floor(x), fraction = x - lower;
  if (fraction > 0.5) return lower + 1;
  if (fraction < 0.5) return lower;
  return std::fmod(lower, 2.0) == 0 ? lower : lower + 1;
}

struct Box {
  std::int64_t top, left, height, width;
  bool flip;
};

// get_params(img, scale, ratio) as torchvision writes it, from the uniforms u.
Box torchvision_box(const float* u, std::int64_t height, std::int64_t width, double scale_min,
                    double scale_max, double ratio_min, double ratio_max, bool flip) {
  const bool flipped = flip && u[kWordsPerSample - 1] < 0.5f;
  const double area = static_cast<double>(height) * static_cast<double>(width);
  const double log_min = std::log(ratio_min), log_max = std::log(ratio_max);
  const auto randint = [](float uniform, std::int64_t high) {  // torch.randint(0, high)
    return std::min<std::int64_t>(
        high - 1, static_cast<std::int64_t>(std::floor(static_cast<double>(uniform) * high)));
  };
  for (int attempt = 0; attempt < 10; ++attempt) {
    const float* a = u + 4 * attempt;
    const double target_area = area * (scale_min + (scale_max - scale_min) * a[0]);
    const double aspect_ratio = std::exp(log_min + (log_max - log_min) * a[1]);
    const auto w = static_cast<std::int64_t>(python_round(std::sqrt(target_area * aspect_ratio)));
    const auto h = static_cast<std::int64_t>(python_round(std::sqrt(target_area / aspect_ratio)));
    if (0 < w && w <= width && 0 < h && h <= height) {
      const std::int64_t i = randint(a[2], height - h + 1);
      const std::int64_t j = randint(a[3], width - w + 1);
      return {i, j, h, w, flipped};
    }
  }
  // Fallback to central crop.
  const double in_ratio = static_cast<double>(width) / static_cast<double>(height);
  std::int64_t w = width, h = height;
  if (in_ratio < std::min(ratio_min, ratio_max)) {
    w = width;
    h = static_cast<std::int64_t>(python_round(static_cast<double>(w) / ratio_min));
  } else if (in_ratio > std::max(ratio_min, ratio_max)) {
    h = height;
    w = static_cast<std::int64_t>(python_round(static_cast<double>(h) * ratio_max));
  }
  return {(height - h) / 2, (width - w) / 2, h, w, flipped};
}

// Counts boxes that went to the fallback, to show the cases reach it.
struct Tally {
  int attempts = 0, fallbacks = 0;
};

void require_torchvision_boxes(const ImageOptions& o, std::int64_t height, std::int64_t width,
                               int samples, Tally& tally) {
  for (std::int64_t epoch = 0; epoch < 2; ++epoch)
    for (std::int64_t sample = 0; sample < samples; ++sample) {
      float u[kWordsPerSample];
      kernels::cpu::uniform({o.seed, kAugmentStream + static_cast<std::uint64_t>(epoch)},
                            static_cast<std::uint64_t>(sample) * kWordsPerSample, u,
                            kWordsPerSample);
      const Box want = torchvision_box(u, height, width, o.scale_min, o.scale_max, o.ratio_min,
                                       o.ratio_max, o.flip);
      const CropBox got = choose_crop(o, height, width, epoch, sample);
      INFO("image " << height << " x " << width << ", epoch " << epoch << ", sample " << sample
                    << ": got (top " << got.y << ", left " << got.x << ", " << got.h << " x "
                    << got.w << "), torchvision (top " << want.top << ", left " << want.left << ", "
                    << want.height << " x " << want.width << ")");
      REQUIRE(got.y == static_cast<double>(want.top));
      REQUIRE(got.x == static_cast<double>(want.left));
      REQUIRE(got.h == static_cast<double>(want.height));
      REQUIRE(got.w == static_cast<double>(want.width));
      REQUIRE(got.flip == want.flip);
      const bool whole_or_cut = (want.height == height || want.width == width) &&
                                want.top == (height - want.height) / 2 &&
                                want.left == (width - want.width) / 2;
      (whole_or_cut ? tally.fallbacks : tally.attempts)++;
    }
}

}  // namespace

TEST_CASE("random-resized-crop's boxes are torchvision's get_params on the same uniforms",
          "[io][images]") {
  ImageOptions o{.channels = 3,
                 .height = 224,
                 .width = 224,
                 .crop = CropKind::random_resized,
                 .flip = true,
                 .seed = 11};
  Tally tally;
  SECTION("ImageNet's ranges: scale 0.08-1, ratio 3/4-4/3") {
    // Photos' shapes, a square, tiny images, and strips that no attempt fits
    // (the fallback cuts them to 4/3 or 3/4, centred).
    const std::int64_t sizes[][2] = {{375, 500}, {500, 333}, {224, 224}, {1, 1},   {3, 5},
                                     {2, 200},   {200, 2},   {7, 1000},  {1000, 7}};
    for (const auto& size : sizes) require_torchvision_boxes(o, size[0], size[1], 500, tally);
    CHECK(tally.attempts > 1000);
    CHECK(tally.fallbacks > 1000);
  }
  SECTION("other ranges, and a fallback side that is a half (Python rounds it to even)") {
    o.scale_min = 0.25;
    o.scale_max = 0.5;
    o.ratio_min = 0.8;
    o.ratio_max = 1.25;
    // 2 x 200: no attempt fits; the fallback's width is round(2 x 1.25) =
    // round(2.5) = 2 in Python, where std::round would give 3.
    require_torchvision_boxes(o, 2, 200, 200, tally);
    const CropBox strip = choose_crop(o, 2, 200, 0, 0);
    CHECK(strip.w == 2);
    CHECK(strip.x == 99);
    // 6 x 1: round(1 / 0.8) = round(1.25) = 1, no half; 10 x 2: round(2.5) = 2 again.
    for (const auto& size : {std::pair{6, 1}, std::pair{10, 2}, std::pair{300, 400}})
      require_torchvision_boxes(o, size.first, size.second, 200, tally);
    CHECK(choose_crop(o, 10, 2, 0, 0).h == 2);
    CHECK(tally.fallbacks > 100);
  }
}
