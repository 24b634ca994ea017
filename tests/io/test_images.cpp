// The image pipeline: JPEG and PNG decoding (channels, pixels, hostile and
// truncated files), crops as torchvision draws them and keyed by (seed,
// epoch, sample), bilinear resampling against a float64 loop, and the
// DataLoader over encoded-image shards and u8 shards: the same bits for any
// thread count, rank count and resume, and errors naming the shard and row;
// JPEGs decoded at a DCT scale against the full decode.
#include <catch2/catch.hpp>

#include <zlib.h>

#include <cstdio>  // jpeglib.h needs FILE declared
// clang-format off
#include <jpeglib.h>
// clang-format on

#include <cmath>
#include <map>

#include "io/encoded_shard_writer.h"
#include "io/image_decode.h"
#include "io/image_fixtures.h"
#include "io/loader.h"
#include "io/shard_fixtures.h"

using namespace lockstep;
using namespace lockstep::io;
using test::TempDir;

namespace {

// Writes `images` (encoded files) as one encoded-image shard, labels i % 3.
void write_images(const std::filesystem::path& path,
                  const std::vector<std::vector<std::uint8_t>>& images) {
  std::vector<std::int64_t> sizes;
  for (const auto& image : images) sizes.push_back(static_cast<std::int64_t>(image.size()));
  EncodedShardWriter writer(path, sizes);
  for (std::size_t i = 0; i < images.size(); ++i)
    writer.append(images[i], static_cast<std::int64_t>(i % 3));
  writer.close();
}

// Test image i: PNG (lossless) of 3 channels and a size that depends on i.
std::vector<std::uint8_t> test_png(int i) {
  const int height = 20 + i % 7, width = 24 + (i * 5) % 11;
  return test::encode_png(test::image_pixels(i, height, width, 3), height, width, 3);
}

// Every batch of one epoch (from `position`), as global sample -> its f32 values.
std::map<std::int64_t, std::vector<float>> epoch_images(const Dataset& data, LoaderOptions options,
                                                        std::int64_t epoch,
                                                        std::int64_t position = 0) {
  DataLoader loader(data, options);
  loader.start_epoch(epoch, position);
  std::map<std::int64_t, std::vector<float>> out;
  const std::int64_t per_image =
      core::shape_numel({options.images.channels, options.images.height, options.images.width});
  while (auto batch = loader.next()) {
    const float* values = batch->inputs.data_as<float>();
    for (std::int64_t r = 0; r < batch->valid; ++r)
      out[batch->indices[r]].assign(values + r * per_image, values + (r + 1) * per_image);
  }
  return out;
}

// Bilinear sample of channel c at (y, x) in float64, edges clamped, as Note
// [bilinear resampling] states, written independently of the code under test.
double bilinear(const std::vector<std::uint8_t>& hwc, int height, int width, int channels, int c,
                double y, double x) {
  const auto at = [&](long yy, long xx) {
    yy = std::clamp<long>(yy, 0, height - 1);
    xx = std::clamp<long>(xx, 0, width - 1);
    return static_cast<double>(hwc[(yy * width + xx) * channels + c]);
  };
  const double y0 = std::floor(y), x0 = std::floor(x), fy = y - y0, fx = x - x0;
  const long iy = static_cast<long>(y0), ix = static_cast<long>(x0);
  return (1 - fy) * ((1 - fx) * at(iy, ix) + fx * at(iy, ix + 1)) +
         fy * ((1 - fx) * at(iy + 1, ix) + fx * at(iy + 1, ix + 1));
}

}  // namespace

TEST_CASE("PNG and JPEG decode to one channel when grayscale and three when colour",
          "[io][images]") {
  DecodedImage out;
  for (const int channels : {1, 2, 3, 4}) {  // gray, gray+alpha, RGB, RGBA
    const auto pixels = test::image_pixels(channels, 9, 13, channels);
    decode_image(test::encode_png(pixels, 9, 13, channels), out);
    const int colour = channels >= 3 ? 3 : 1;
    REQUIRE(out.channels == colour);
    REQUIRE(out.height == 9);
    REQUIRE(out.width == 13);
    // PNG is lossless; alpha is dropped, the colour channels kept exactly.
    for (int p = 0; p < 9 * 13; ++p)
      for (int c = 0; c < colour; ++c)
        REQUIRE(out.pixels[p * colour + c] == pixels[p * channels + c]);
  }
  for (const int channels : {1, 3}) {
    const auto pixels = test::image_pixels(7, 16, 24, channels);
    decode_image(test::encode_jpeg(pixels, 16, 24, channels, 100), out);
    REQUIRE(out.channels == channels);
    REQUIRE(out.width == 24);
    // JPEG at quality 100 without chroma subsampling: a smooth pattern comes
    // back within the DCT's rounding, a few levels (measured: at most 2;
    // YCbCr conversion adds one more for colour).
    for (std::size_t i = 0; i < pixels.size(); ++i)
      REQUIRE(std::abs(int(out.pixels[i]) - int(pixels[i])) <= 4);
  }
}

TEST_CASE("damaged, truncated and oversized images are DecodeErrors, never crashes",
          "[io][images][errors]") {
  DecodedImage out;
  const auto pixels = test::image_pixels(1, 32, 32, 3);
  const auto jpeg = test::encode_jpeg(pixels, 32, 32, 3);
  const auto png = test::encode_png(pixels, 32, 32, 3);
  for (const auto* file : {&jpeg, &png}) {
    // A PNG cut inside its 12-byte IEND trailer still holds the whole image,
    // and libpng decodes it: cuts here reach into the image data.
    for (const std::size_t keep :
         {file->size() / 2, file->size() - 16, std::size_t{40}, std::size_t{9}}) {
      INFO((file == &jpeg ? "jpeg" : "png") << " cut to " << keep << " bytes");
      const std::vector<std::uint8_t> cut(file->begin(), file->begin() + keep);
      CHECK_THROWS_AS(decode_image(cut, out), DecodeError);
    }
    std::vector<std::uint8_t> noisy = *file;
    for (std::size_t i = 20; i < noisy.size(); i += 7) noisy[i] ^= 0x5A;
    CHECK_THROWS_AS(decode_image(noisy, out), DecodeError);
  }
  // A PNG header that declares 65535 x 65535 pixels (IHDR's CRC fixed up).
  std::vector<std::uint8_t> huge = png;
  for (const int at : {16, 20}) {
    huge[at] = 0;
    huge[at + 1] = 0;
    huge[at + 2] = 0xFF;
    huge[at + 3] = 0xFF;
  }
  const std::uint32_t crc = static_cast<std::uint32_t>(crc32(0, huge.data() + 12, 17));
  for (int b = 0; b < 4; ++b) huge[29 + b] = static_cast<std::uint8_t>(crc >> (24 - 8 * b));
  CHECK_THROWS_WITH(decode_image(huge, out), Catch::Contains("declares 65535 x 65535 pixels"));
  // After all those failures, this thread decodes a good JPEG (Note [decoding hostile images]).
  decode_image(jpeg, out);
  CHECK((out.channels == 3 && out.height == 32 && out.width == 32));
  const std::vector<std::uint8_t> gif{'G', 'I', 'F', '8', '9', 'a'};
  CHECK_THROWS_WITH(decode_image(gif, out), Catch::Contains("neither a JPEG"));
}

TEST_CASE("random-resized-crop draws torchvision's boxes, keyed by seed, epoch and sample",
          "[io][images]") {
  ImageOptions o{.channels = 3,
                 .height = 8,
                 .width = 8,
                 .crop = CropKind::random_resized,
                 .flip = true,
                 .seed = 5};
  int flips = 0;
  for (std::int64_t sample = 0; sample < 2000; ++sample) {
    const CropBox box = choose_crop(o, 60, 90, 3, sample);
    const double area = box.w * box.h / (60.0 * 90.0), ratio = box.w / box.h;
    // Whole pixels inside the image; area and aspect within the ranges, up
    // to the rounding of w and h to whole pixels (one pixel of each side).
    REQUIRE(box.x >= 0);
    REQUIRE(box.x + box.w <= 90);
    REQUIRE(box.y + box.h <= 60);
    REQUIRE(box.w == std::round(box.w));
    REQUIRE(area <= 1.0);
    REQUIRE(area >= 0.08 * (1 - 2.0 / 7));  // the smallest box: about 19 x 21 pixels
    REQUIRE(ratio >= 0.75 * 0.85);
    REQUIRE(ratio <= 4.0 / 3.0 / 0.85);
    flips += box.flip;
    const CropBox again = choose_crop(o, 60, 90, 3, sample);
    REQUIRE((again.x == box.x && again.y == box.y && again.w == box.w && again.flip == box.flip));
  }
  // A fair coin: 1000 of 2000 within 4.5 standard deviations (sqrt(500) ~ 22).
  CHECK(std::abs(flips - 1000) < 100);
  const CropBox a = choose_crop(o, 60, 90, 3, 17), b = choose_crop(o, 60, 90, 4, 17);
  CHECK((a.x != b.x || a.w != b.w || a.y != b.y));  // another epoch, another crop
  // A 2 x 200 strip: no attempt fits in 10, so the fallback takes the whole
  // height and the widest allowed aspect (4/3 of 2: 3 pixels), centred.
  const CropBox strip = choose_crop(o, 2, 200, 0, 0);
  CHECK(strip.h == 2);
  CHECK(strip.w == 3);
  CHECK(strip.x == 98);
}

TEST_CASE("crops are resampled bilinearly and normalised as a float64 loop says", "[io][images]") {
  const int height = 37, width = 53;
  const auto pixels = test::image_pixels(3, height, width, 3);
  const PixelView view{pixels.data(), 3, height, width, 1, width * 3, 3};
  ImageOptions o{.channels = 3,
                 .height = 16,
                 .width = 12,
                 .mean = {0.4f, 0.5f, 0.6f},
                 .std = {0.2f, 0.25f, 0.3f}};
  for (const CropBox box : {CropBox{3, 5, 30.5, 20, false}, CropBox{0, 0, 53, 37, true},
                            CropBox{10, 2, 6, 8, false}}) {  // shrink, flip, enlarge
    std::vector<float> out(3 * 16 * 12);
    crop_resize_normalize(view, box, o, out.data());
    for (int c = 0; c < 3; ++c)
      for (int oy = 0; oy < 16; ++oy)
        for (int ox = 0; ox < 12; ++ox) {
          const double y = box.y + (oy + 0.5) * box.h / 16 - 0.5;
          const double x = box.x + (ox + 0.5) * box.w / 12 - 0.5;
          const double want =
              (bilinear(pixels, height, width, 3, c, y, x) / 255 - o.mean[c]) / o.std[c];
          const int column = box.flip ? 11 - ox : ox;
          // f32 arithmetic on values below 5 in magnitude: 1e-5 is ~40 ulps of slack.
          REQUIRE(out[(c * 16 + oy) * 12 + column] == Approx(want).margin(1e-5));
        }
  }
}

TEST_CASE(
    "the loader decodes encoded-image shards with the same bits on any threads, ranks "
    "and resume",
    "[io][images][loader]") {
  TempDir dir;
  std::vector<std::vector<std::uint8_t>> images;
  for (int i = 0; i < 30; ++i)
    images.push_back(i % 2 ? test_png(i)
                           : test::encode_jpeg(test::image_pixels(i, 22, 30, 3), 22, 30, 3));
  write_images(dir / "a.h5", {images.begin(), images.begin() + 13});
  write_images(dir / "b.h5", {images.begin() + 13, images.end()});
  const Dataset data = Dataset::open(dir.path());
  LoaderOptions options{.sampler = {.micro_batch = 4, .seed = 11}, .threads = 1};
  options.images = {.channels = 3,
                    .height = 16,
                    .width = 16,
                    .crop = CropKind::random_resized,
                    .flip = true,
                    .mean = {0.5f},
                    .std = {0.25f},
                    .seed = 11};
  const auto reference = epoch_images(data, options, 2);
  REQUIRE(reference.size() == 28);  // 7 whole batches of 4 (drop_last)
  options.threads = 3;
  CHECK(epoch_images(data, options, 2) == reference);
  // Resumed after 3 batches: the rest of the epoch is the same bits.
  const auto resumed = epoch_images(data, options, 2, 12);
  for (const auto& [sample, values] : resumed) CHECK(values == reference.at(sample));
  CHECK(resumed.size() == 16);
  // Two ranks of micro-batch 2 (the same global batch): each sample, the same bits.
  std::map<std::int64_t, std::vector<float>> ranks;
  for (int rank = 0; rank < 2; ++rank) {
    LoaderOptions r = options;
    r.sampler.micro_batch = 2;
    r.sampler.world_size = 2;
    r.sampler.rank = rank;
    ranks.merge(epoch_images(data, r, 2));
  }
  CHECK(ranks == reference);
  // Another epoch draws other crops.
  CHECK(epoch_images(data, options, 3) != reference);

  // The evaluation crop of an image the output's size is its pixels x (1/255),
  // exactly the bits of scale_u8 (image 1 is a 21 x 29 PNG).
  options.images = {.channels = 3, .height = 21, .width = 29};
  options.sampler.shuffle = false;
  options.sampler.micro_batch = 1;
  const auto eval = epoch_images(data, options, 0);
  REQUIRE(eval.size() == 30);
  const auto pixels = test::image_pixels(1, 21, 29, 3);
  for (int c = 0; c < 3; ++c)
    for (int p = 0; p < 21 * 29; ++p)
      REQUIRE(eval.at(1)[c * 21 * 29 + p] == static_cast<float>(pixels[p * 3 + c]) * (1.0f / 255));
}

TEST_CASE("a damaged image or a channel mismatch fails its batch naming the shard and row",
          "[io][images][loader][errors]") {
  TempDir dir;
  std::vector<std::vector<std::uint8_t>> images{test_png(0), test_png(1), test_png(2)};
  images[2].resize(images[2].size() / 2);                                 // truncated
  images[1] = test::encode_png(test::image_pixels(1, 8, 8, 1), 8, 8, 1);  // grayscale
  write_images(dir / "s.h5", images);
  const Dataset data = Dataset::open(dir / "s.h5");
  LoaderOptions options{.sampler = {.micro_batch = 1, .shuffle = false}, .threads = 2};
  options.images = {.channels = 3, .height = 8, .width = 8};
  DataLoader loader(data, options);
  loader.start_epoch(0);
  CHECK(loader.next());
  CHECK_THROWS_WITH(loader.next(), Catch::Contains("s.h5', row 1: the image has 1 channel "
                                                   "(grayscale), but the model takes 3"));
  options.sampler.shuffle = false;
  DataLoader second(data, options);
  second.start_epoch(0, 2);
  CHECK_THROWS_WITH(second.next(), Catch::Contains("s.h5', row 2, dataset 'inputs': a damaged or "
                                                   "truncated PNG"));
  LoaderOptions plain{.sampler = {.micro_batch = 1}};
  CHECK_THROWS_WITH(DataLoader(data, plain), Catch::Contains("need LoaderOptions::images"));
}

TEST_CASE("u8 image shards take random crops with zero padding and flips, pixel for pixel",
          "[io][images][loader]") {
  TempDir dir;
  test::write_shard(dir / "a.h5", 0, 40, {1, 6, 5}, DType::u8);  // sample_value(i, j)
  const Dataset data = Dataset::open(dir / "a.h5");
  LoaderOptions options{.sampler = {.micro_batch = 8, .seed = 3}, .threads = 2};
  options.images = {.channels = 1,
                    .height = 6,
                    .width = 5,
                    .crop = CropKind::random_padded,
                    .padding = 2,
                    .flip = true,
                    .seed = 3};
  const auto got = epoch_images(data, options, 1);
  REQUIRE(got.size() == 40);
  int shifted = 0, flipped = 0;
  for (const auto& [sample, values] : got) {
    const CropBox box = choose_crop(options.images, 6, 5, 1, sample);
    REQUIRE((box.x >= -2 && box.x <= 2 && box.y >= -2 && box.y <= 2));
    shifted += box.x != 0 || box.y != 0;
    flipped += box.flip;
    for (int y = 0; y < 6; ++y)
      for (int x = 0; x < 5; ++x) {
        const int sy = y + static_cast<int>(box.y), sx = x + static_cast<int>(box.x);
        const bool inside = sy >= 0 && sy < 6 && sx >= 0 && sx < 5;
        const float want =
            inside ? static_cast<float>(test::sample_value(sample, sy * 5 + sx, DType::u8)) *
                         (1.0f / 255)
                   : 0.0f;
        REQUIRE(values[y * 5 + (box.flip ? 4 - x : x)] == want);
      }
  }
  CHECK(shifted > 20);  // 24 of 25 offsets move the window
  CHECK(flipped > 5);
  LoaderOptions three = options;
  three.images.channels = 3;
  CHECK_THROWS_WITH(DataLoader(data, three),
                    Catch::Contains("images have 1 channels") && Catch::Contains("takes 3"));
}

TEST_CASE("u8 crops normalised by the kernel are the fused crops within their rounding",
          "[io][images]") {
  const auto pixels = test::image_pixels(4, 30, 40, 3);
  const PixelView view{pixels.data(), 3, 30, 40, 1, 120, 3};
  ImageOptions o{.channels = 3, .height = 10, .width = 14, .mean = {0.5f}, .std = {0.25f}};
  const CropBox box{2.5, 1, 31, 27, true};
  std::vector<float> fused(3 * 140), from_u8(3 * 140);
  std::vector<std::uint8_t> crop(3 * 140);
  crop_resize_normalize(view, box, o, fused.data());
  crop_resize_u8(view, box, o, crop.data());
  kernels::cpu::normalize_u8(crop.data(), from_u8.data(), 1, 140, channel_affine(o));
  // Rounding to u8 moves a value by at most half a level: 0.5 / (255 * 0.25),
  // plus 1e-6 for the f32 arithmetic.
  for (std::size_t i = 0; i < fused.size(); ++i)
    REQUIRE(std::abs(fused[i] - from_u8[i]) <= 0.5 / (255 * 0.25) + 1e-6);
  // With the crop at whole pixels and scale 1, the two paths agree exactly.
  const CropBox exact{3, 4, 14, 10, false};
  crop_resize_normalize(view, exact, o, fused.data());
  crop_resize_u8(view, exact, o, crop.data());
  kernels::cpu::normalize_u8(crop.data(), from_u8.data(), 1, 140, channel_affine(o));
  CHECK(fused == from_u8);
}

TEST_CASE(
    "a JPEG decoded at 1/2, 1/4 or 1/8 for a crop that large is the full decode's crop "
    "within a few levels",
    "[io][images]") {
  // A smooth photograph-like pattern (no edges for the two filters to treat
  // differently), 4:4:4 at quality 95.
  const int height = 300, width = 400;
  std::vector<std::uint8_t> pixels(static_cast<std::size_t>(height) * width * 3);
  for (int y = 0; y < height; ++y)
    for (int x = 0; x < width; ++x)
      for (int c = 0; c < 3; ++c)
        pixels[(static_cast<std::size_t>(y) * width + x) * 3 + c] = static_cast<std::uint8_t>(
            std::lround(120 + 60 * std::sin(y / 23.0 + c) * std::cos(x / 31.0) + 20 * c));
  const auto jpeg = test::encode_jpeg(pixels, height, width, 3, 95);
  const ImageHeader header = read_image_header(jpeg);
  REQUIRE(
      (header.jpeg && header.channels == 3 && header.height == height && header.width == width));
  DecodedImage full, scaled;
  decode_image(jpeg, full);
  const PixelView full_view{full.pixels.data(), 3, height, width, 1, width * 3, 3};
  struct Case {
    CropBox box;
    std::int64_t out_height, out_width;
    int scale;
  };
  for (const Case& k :
       {Case{{10, 20, 300.5, 250, false}, 60, 70, 4}, Case{{0, 0, 400, 300, true}, 37, 50, 8},
        Case{{51, 7, 233, 180, false}, 90, 100, 2}, Case{{51, 7, 233, 180, false}, 91, 100, 1}}) {
    const ImageOptions o{.channels = 3, .height = k.out_height, .width = k.out_width};
    REQUIRE(decode_scale(k.box, o) == k.scale);
    decode_image(jpeg, scaled, k.scale);
    CHECK(scaled.width == (width + k.scale - 1) / k.scale);
    const PixelView view{scaled.pixels.data(), 3, scaled.height, scaled.width, 1,
                         scaled.width * 3,     3};
    const std::size_t n = 3 * k.out_height * k.out_width;
    std::vector<float> want(n), got(n);
    crop_resize_normalize(full_view, k.box, o, want.data());
    crop_resize_normalize(view, scaled_box(k.box, k.scale), o, got.data());
    double worst = 0, total = 0;
    for (std::size_t i = 0; i < n; ++i) {
      worst = std::max(worst, std::abs(double(got[i]) - want[i]) * 255);
      total += std::abs(double(got[i]) - want[i]) * 255;
    }
    INFO("scale 1/" << k.scale << ": worst " << worst << " levels, mean " << total / n);
    // Measured: worst 2.6, 3.2 and 3.7 levels at 1/2, 1/4 and 1/8, means
    // 0.4 to 0.7 (the scaled IDCT's rounding and a block mean against two
    // samples). A box misplaced by half a scaled pixel moves values by about
    // 10 levels on this pattern at 1/8, so 5 and 1 would catch it.
    CHECK(worst <= 5);
    CHECK(total / n <= 1);
    if (k.scale == 1) CHECK(got == want);
  }
  // The loader decodes at the scale the crop allows: an evaluation crop of
  // 60 x 80 takes a 261 x 348 box of this image, decoded at 1/4.
  TempDir dir;
  write_images(dir / "big.h5", {jpeg});
  LoaderOptions options{.sampler = {.micro_batch = 1, .shuffle = false}, .threads = 1};
  options.images = {.channels = 3, .height = 60, .width = 80};
  const CropBox box = choose_crop(options.images, height, width, 0, 0);
  REQUIRE(decode_scale(box, options.images) == 4);
  const auto loaded = epoch_images(Dataset::open(dir / "big.h5"), options, 0);
  std::vector<float> want(3 * 60 * 80);
  crop_resize_normalize(full_view, box, options.images, want.data());
  double worst = 0;
  for (std::size_t i = 0; i < want.size(); ++i)
    worst = std::max(worst, std::abs(double(loaded.at(0)[i]) - want[i]) * 255);
  CHECK(worst <= 5);
}

namespace {

// A textured image (every pixel its own value, chroma changing from one
// column to the next), so a pixel from the wrong place, or an upsampled
// chroma value that missed its neighbour, shows.
std::vector<std::uint8_t> textured_pixels(int height, int width, int channels) {
  std::vector<std::uint8_t> pixels(static_cast<std::size_t>(height) * width * channels);
  for (int y = 0; y < height; ++y)
    for (int x = 0; x < width; ++x)
      for (int c = 0; c < channels; ++c)
        pixels[(static_cast<std::size_t>(y) * width + x) * channels + c] =
            static_cast<std::uint8_t>((y * 131 + x * 71 + c * 97 + (x * y) % 37) * 2654435761u >>
                                      24);
  return pixels;
}

// Pixel (y, x, c) of the whole image from a decode of part of it.
std::uint8_t pixel_at(const DecodedImage& d, std::int64_t y, std::int64_t x, std::int64_t c) {
  return d.pixels[static_cast<std::size_t>(((y - d.y0) * d.width + (x - d.x0)) * d.channels + c)];
}

}  // namespace

TEST_CASE("a JPEG's cropped decode gives exactly the full decode's pixels of the region",
          "[io][images]") {
  // 203 x 157: neither side a whole number of 16-pixel MCUs, so the last
  // iMCU column and row are partial at every scale.
  const int height = 157, width = 203;
  struct Kind {
    const char* name;
    int channels, subsampling;
    bool progressive;
  };
  for (const Kind& kind : {Kind{"gray", 1, TJSAMP_GRAY, false}, Kind{"4:4:4", 3, TJSAMP_444, false},
                           Kind{"4:2:2", 3, TJSAMP_422, false}, Kind{"4:2:0", 3, TJSAMP_420, false},
                           Kind{"4:2:0 progressive", 3, TJSAMP_420, true},
                           Kind{"4:2:2 progressive", 3, TJSAMP_422, true}}) {
    const auto jpeg =
        test::encode_jpeg(textured_pixels(height, width, kind.channels), height, width,
                          kind.channels, 90, kind.subsampling, kind.progressive);
    for (const int scale : {1, 2, 4, 8}) {
      DecodedImage full, part;
      decode_image(jpeg, full, scale);  // TurboJPEG's whole decode
      const std::int64_t h = full.height, w = full.width;
      std::vector<PixelRegion> regions = {{0, 0, w, h},  // the whole image
                                          {0, 0, 1, 1},  // the corners
                                          {w - 1, 0, 1, 1},
                                          {0, h - 1, 1, 1},
                                          {w - 1, h - 1, 1, 1},
                                          {0, 0, w / 3, h / 3},          // boxes at the edges
                                          {w / 2, 0, w - w / 2, h / 4},  // top right
                                          {0, h / 2, w / 4, h - h / 2},  // bottom left
                                          {w / 3, h / 3, w - w / 3, h - h / 3}};
      // Boxes at every offset modulo the iMCU (8 or 16 pixels at full size),
      // inside and across its edges.
      for (std::int64_t k = 1; k < 40; ++k) {
        const std::int64_t x = (k * 7) % w, y = (k * 5) % h;
        regions.push_back({x, y, std::min<std::int64_t>(1 + k % 23, w - x),
                           std::min<std::int64_t>(1 + (k * 3) % 19, h - y)});
      }
      for (const PixelRegion& r : regions) {
        INFO(kind.name << " at 1/" << scale << ": region x " << r.x << " y " << r.y << " w "
                       << r.width << " h " << r.height);
        decode_image_region(jpeg, part, scale, r);
        REQUIRE(
            (part.image_height == h && part.image_width == w && part.channels == full.channels));
        REQUIRE((part.x0 <= r.x && part.x0 + part.width >= r.x + r.width));
        REQUIRE((part.y0 <= r.y && part.y0 + part.height >= r.y + r.height));
        std::int64_t wrong = 0;
        for (std::int64_t y = r.y; y < r.y + r.height; ++y)
          for (std::int64_t x = r.x; x < r.x + r.width; ++x)
            for (std::int64_t c = 0; c < full.channels; ++c)
              wrong += pixel_at(part, y, x, c) != full.pixels[((y * w) + x) * full.channels + c];
        CHECK(wrong == 0);
        // Just the region's rows: none above or below it is decoded.
        CHECK((part.y0 == r.y && part.height == r.height));
      }
    }
  }
}

TEST_CASE("a cropped decode shifted by one pixel would not match (the test above can fail)",
          "[io][images]") {
  const auto jpeg = test::encode_jpeg(textured_pixels(64, 64, 3), 64, 64, 3, 90, TJSAMP_420);
  DecodedImage full, part;
  decode_image(jpeg, full);
  decode_image_region(jpeg, part, 1, {20, 20, 10, 10});
  std::int64_t shifted_x = 0, shifted_y = 0;
  for (std::int64_t y = 20; y < 30; ++y)
    for (std::int64_t x = 20; x < 30; ++x) {
      // The region's pixel against the whole image's one to the right or
      // below (inside the whole image; the region decodes rows [20, 30) only).
      shifted_x += pixel_at(part, y, x, 0) != full.pixels[(y * 64 + x + 1) * 3];
      shifted_y += pixel_at(part, y, x, 0) != full.pixels[((y + 1) * 64 + x) * 3];
    }
  CHECK(shifted_x > 50);
  CHECK(shifted_y > 50);
}

TEST_CASE("a cropped decode refuses damaged, truncated and oversized JPEGs and bad regions",
          "[io][images][errors]") {
  DecodedImage out;
  const int height = 96, width = 64;
  for (const bool progressive : {false, true}) {
    const auto jpeg = test::encode_jpeg(textured_pixels(height, width, 3), height, width, 3, 90,
                                        TJSAMP_420, progressive);
    INFO((progressive ? "progressive" : "baseline"));
    // Cut in its last rows: a region that reaches them throws, as does any
    // region of a progressive JPEG (all of its scans are read first).
    const std::vector<std::uint8_t> cut(jpeg.begin(), jpeg.begin() + jpeg.size() * 9 / 10);
    CHECK_THROWS_AS(decode_image(cut, out), DecodeError);
    CHECK_THROWS_AS(decode_image_region(cut, out, 1, {0, 80, 64, 16}), DecodeError);
    CHECK_THROWS_AS(decode_image_region(cut, out, 2, {0, 0, 32, 48}), DecodeError);
    if (progressive) {
      CHECK_THROWS_AS(decode_image_region(cut, out, 1, {0, 0, 8, 8}), DecodeError);
    } else {
      // Note [cropped decode]: damage below the region is not read.
      DecodedImage full;
      decode_image(jpeg, full);
      decode_image_region(cut, out, 1, {0, 0, 8, 8});
      CHECK(pixel_at(out, 7, 7, 2) == full.pixels[(7 * width + 7) * 3 + 2]);
    }
    std::vector<std::uint8_t> noisy = jpeg;
    for (std::size_t i = 20; i < noisy.size(); i += 7) noisy[i] ^= 0x5A;
    CHECK_THROWS_AS(decode_image_region(noisy, out, 1, {0, 0, width, height}), DecodeError);
    // The header declares 60000 x 60000 (the frame header's height and width).
    std::vector<std::uint8_t> huge = jpeg;
    std::size_t sof = 2;
    while (sof + 1 < huge.size() && !(huge[sof] == 0xFF && (huge[sof + 1] & 0xF0) == 0xC0 &&
                                      huge[sof + 1] != 0xC4 && huge[sof + 1] != 0xC8))
      sof += 2 + ((std::size_t{huge[sof + 2]} << 8) | huge[sof + 3]);
    REQUIRE(sof + 8 < huge.size());
    for (std::size_t b = 5; b < 9; b += 2) {
      huge[sof + b] = 0xEA;  // 60000, under libjpeg's own limit of 65500
      huge[sof + b + 1] = 0x60;
    }
    CHECK_THROWS_WITH(decode_image_region(huge, out, 1, {0, 0, 1, 1}),
                      Catch::Contains("declares 60000 x 60000 pixels"));
    CHECK_THROWS_AS(decode_image(huge, out), DecodeError);
    CHECK_THROWS_WITH(decode_image_region(jpeg, out, 2, {0, 0, 33, 8}),
                      Catch::Contains("not within the 32 x 48 image"));
  }
  // After the failures this thread decodes a good JPEG whole.
  const auto good = test::encode_jpeg(textured_pixels(16, 24, 3), 16, 24, 3);
  decode_image_region(good, out, 1, {0, 0, 24, 16});
  CHECK((out.height == 16 && out.width == 24 && out.x0 == 0 && out.y0 == 0));
}

namespace {

// A progressive 4:4:4 JPEG through libjpeg's encoder with a scan script of
// one scan per colour component and AC coefficient, in `passes` successive-
// approximation passes (1 to 3), after one DC scan: 1 + 189 passes scans.
std::vector<std::uint8_t> encode_many_scans(const std::vector<std::uint8_t>& pixels, int height,
                                            int width, int passes) {
  jpeg_compress_struct c;
  jpeg_error_mgr errors;
  c.err = jpeg_std_error(&errors);
  jpeg_create_compress(&c);
  unsigned char* buffer = nullptr;
  unsigned long size = 0;
  jpeg_mem_dest(&c, &buffer, &size);
  c.image_width = static_cast<JDIMENSION>(width);
  c.image_height = static_cast<JDIMENSION>(height);
  c.input_components = 3;
  c.in_color_space = JCS_RGB;
  jpeg_set_defaults(&c);
  for (int i = 0; i < 3; ++i) c.comp_info[i].h_samp_factor = c.comp_info[i].v_samp_factor = 1;
  std::vector<jpeg_scan_info> scans{{3, {0, 1, 2, 0}, 0, 0, 0, 0}};
  for (int pass = 0; pass < passes; ++pass)  // point transforms (Ah, Al): (0, 2), (2, 1), (1, 0)
    for (int component = 0; component < 3; ++component)
      for (int k = 1; k < 64; ++k)
        scans.push_back(
            {1, {component, 0, 0, 0}, k, k, pass == 0 ? 0 : 3 - pass, passes == 1 ? 0 : 2 - pass});
  c.scan_info = scans.data();
  c.num_scans = static_cast<int>(scans.size());
  jpeg_start_compress(&c, TRUE);
  for (int y = 0; y < height; ++y) {
    JSAMPROW row = const_cast<JSAMPROW>(pixels.data() + static_cast<std::size_t>(y) * width * 3);
    jpeg_write_scanlines(&c, &row, 1);
  }
  jpeg_finish_compress(&c);
  std::vector<std::uint8_t> out(buffer, buffer + size);
  jpeg_destroy_compress(&c);
  std::free(buffer);
  return out;
}

}  // namespace

TEST_CASE("a cropped decode refuses a progressive JPEG of more than 500 scans, as TurboJPEG does",
          "[io][images][errors]") {
  const auto pixels = textured_pixels(24, 32, 3);
  DecodedImage full, part;
  // 190 scans: decoded, the region exactly the whole decode's.
  const auto many = encode_many_scans(pixels, 24, 32, 1);
  decode_image(many, full);
  decode_image_region(many, part, 1, {0, 0, 32, 24});
  CHECK(part.pixels == full.pixels);
  // 568 scans: refused by both.
  const auto bomb = encode_many_scans(pixels, 24, 32, 3);
  CHECK_THROWS_WITH(decode_image(bomb, full), Catch::Contains("more than 500 scans"));
  CHECK_THROWS_WITH(decode_image_region(bomb, part, 1, {0, 0, 8, 8}),
                    Catch::Contains("more than 500 scans"));
}

TEST_CASE("the loader's cropped decode gives today's batches bit for bit", "[io][images]") {
  // Photo-sized JPEGs (4:2:0 and 4:4:4, baseline and progressive) through
  // the loader, against the whole decode at the same scale and the same
  // crop of it: exactly equal, for crops at 1/1 (24 x 24 of 200 x 150 at
  // scale_min 0.08 gives boxes of 40 to 200 pixels: 1/1 and 1/2 and 1/4)
  // and the centre crop.
  const int height = 150, width = 200;
  std::vector<std::vector<std::uint8_t>> jpegs;
  for (int i = 0; i < 12; ++i)
    jpegs.push_back(test::encode_jpeg(textured_pixels(height, width, 3), height, width, 3, 85,
                                      i % 2 ? TJSAMP_420 : TJSAMP_444, i % 3 == 0));
  TempDir dir;
  write_images(dir / "photos.h5", jpegs);
  const Dataset data = Dataset::open(dir / "photos.h5");
  for (const CropKind crop : {CropKind::random_resized, CropKind::center}) {
    for (const std::int64_t side : {24, 100}) {
      LoaderOptions options{.sampler = {.micro_batch = 4, .shuffle = false}, .threads = 2};
      options.images = {.channels = 3,
                        .height = side,
                        .width = side,
                        .crop = crop,
                        .flip = true,
                        .mean = {0.5f},
                        .std = {0.25f},
                        .seed = 7};
      const auto loaded = epoch_images(data, options, 1);
      std::map<int, int> scales;
      for (int i = 0; i < 12; ++i) {
        const CropBox box = choose_crop(options.images, height, width, 1, i);
        const int scale = decode_scale(box, options.images);
        ++scales[scale];
        DecodedImage full;
        decode_image(jpegs[i], full, scale);
        const PixelView view{full.pixels.data(), 3, full.height, full.width, 1, full.width * 3, 3};
        std::vector<float> want(3 * side * side);
        crop_resize_normalize(view, scaled_box(box, scale), options.images, want.data());
        INFO("image " << i << " at 1/" << scale << ", side " << side);
        CHECK(loaded.at(i) == want);
      }
      if (crop == CropKind::random_resized && side == 24) CHECK(scales.size() >= 2);
    }
  }
}
