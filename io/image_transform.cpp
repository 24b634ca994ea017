// Image transforms (io/image_transform.h).
//
// Note [keyed augmentation]: sample s of epoch e draws its words from the
// Philox stream (seed, kAugmentStream + e) at offset s * kWordsPerSample:
// four uniforms per random-resized-crop attempt (area scale, log aspect
// ratio, top, left; ten attempts, as torchvision makes), then one for the
// flip; random_padded uses the first two for top and left. So a crop depends
// on nothing but (seed, epoch, global sample index): not the thread that made
// it, the rank that reads the sample, or whether the run was resumed.
//
// Note [bilinear resampling]: output pixel (oy, ox) samples the source at
// x = box.x + (ox + 0.5) * box.w / width - 0.5 (and likewise y), the pixel
// centre convention of torch's interpolate(mode="bilinear",
// align_corners=False, antialias=False) and OpenCV's INTER_LINEAR: a 2x2
// neighbourhood, edges clamped. It differs from torchvision's default on PIL
// images (PIL's bilinear is a triangle filter widened by the downscaling
// factor, i.e. antialiased) when an image is shrunk by more than 2x: the
// 2x2 filter then skips source pixels and aliases fine texture. torchvision
// also rounds the resized image to u8 and the centre crop's offsets to whole
// pixels; here the crop is one resampling of the source box, in f32, with no
// intermediate image. A position more than half a pixel outside the source
// (the zero padding of random_padded, or a centre crop larger than the image)
// reads 0, as torchvision's fill=0 padding does before normalisation.
//
// Note [separable resampling]: the bilinear crop runs as two passes, one
// along each axis, from per-row and per-column taps (offsets and weights)
// made once per image. When the box is shrunk vertically (box.h > height),
// rows first: for each output row, its two source rows are mixed over the
// columns the taps reach (a contiguous loop over bytes that the compiler
// vectorises), then the columns are mixed and the value finished
// (normalised to f32, or rounded to u8) into the output. Otherwise columns
// first: each source row that an output row reads is resampled to the
// output's width once and kept while the next output rows read it (two are
// kept; the source rows only move down), then two such rows are mixed per
// output row and finished, a contiguous loop. So each pass touches at most
// one mixed value per output value along the other axis. The passes round
// differently (rows first: v0 a + v1 b down a column, then w0 and w1 across;
// columns first the other way round; no fused multiply-add, as the build
// contracts none); which one runs is a function of the box and the options,
// so the crop stays a function of the image and the draw, and both are
// within f32 rounding of the float64 bilinear value (tests/io/test_images.cpp).
// The flip mirrors the column taps. Taps and rows live in per-thread buffers
// that only grow: a loader thread allocates nothing per image once it has
// made its largest crop.
#include "io/image_transform.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <utility>

#include "kernels/error.h"
#include "kernels/philox.h"

namespace lockstep::io {
namespace {

constexpr std::uint64_t kAugmentStream = std::uint64_t{0xA06} << 48;
constexpr int kAttempts = 10;
constexpr std::int64_t kWordsPerSample = 4 * kAttempts + 1;
constexpr double kCenterFraction = 0.875;  // 224 of 256, torchvision's ImageNet evaluation

// Python's round(x), which torchvision's RandomResizedCrop rounds sides with:
// to the nearest integer, halves to even (std::round takes halves away from
// zero: round(2.5) is 2 in Python, 3 there). Sides land on a half in the
// fallback at ratio ranges other than ImageNet's (2 x 1.25).
double round_half_even(double x) {
  const double lower = std::floor(x), fraction = x - lower;
  if (fraction != 0.5) return fraction < 0.5 ? lower : lower + 1;
  return std::fmod(lower, 2.0) == 0.0 ? lower : lower + 1;
}

const char* crop_name(CropKind kind) {
  switch (kind) {
    case CropKind::center:
      return "centre-crop";
    case CropKind::random_resized:
      return "random-resized-crop";
    default:
      return "random-crop";
  }
}

// Source offsets (positions times `stride`) of the two neighbours of each
// output position along one axis, and their weights: 0 and 0 where the
// position reads the zero padding, so the inner loop has no branch. Mirrored,
// output position o takes the taps of out - 1 - o.
struct Taps {
  std::vector<std::int64_t> first, second;
  std::vector<float> first_weight, second_weight;

  // `origin`: the first position the source holds (PixelView::first_row or
  // first_column); positions and weights are the whole image's, so a view of
  // part of it resamples to the same values.
  void fill(double start, double extent, std::int64_t out, std::int64_t size, std::int64_t stride,
            bool mirror, std::int64_t origin) {
    first.resize(out);
    second.resize(out);
    first_weight.resize(out);
    second_weight.resize(out);
    for (std::int64_t o = 0; o < out; ++o) {
      const double at = tap_position(start, extent, o, out);
      const bool inside = at >= -0.5 && at <= static_cast<double>(size) - 0.5;
      const double lower = std::floor(at);
      const auto weight = static_cast<float>(at - lower);
      const auto base = static_cast<std::int64_t>(lower);
      const std::int64_t to = mirror ? out - 1 - o : o;
      first[to] = (std::clamp<std::int64_t>(base, 0, size - 1) - origin) * stride;
      second[to] = (std::clamp<std::int64_t>(base + 1, 0, size - 1) - origin) * stride;
      first_weight[to] = inside ? 1.0f - weight : 0.0f;
      second_weight[to] = inside ? weight : 0.0f;
    }
  }

  // Where output position o of `out` samples the source (Note [bilinear resampling]).
  static double tap_position(double start, double extent, std::int64_t o, std::int64_t out) {
    return start + (static_cast<double>(o) + 0.5) * extent / static_cast<double>(out) - 0.5;
  }

  // The source positions [low, high] that fill's taps reach, clamped.
  static std::pair<std::int64_t, std::int64_t> reach(double start, double extent, std::int64_t out,
                                                     std::int64_t size) {
    // The position rises with o, so the first and last outputs bound it.
    const auto lower = [&](std::int64_t o) {
      return static_cast<std::int64_t>(std::floor(tap_position(start, extent, o, out)));
    };
    return {std::clamp<std::int64_t>(lower(0), 0, size - 1),
            std::clamp<std::int64_t>(lower(out - 1) + 1, 0, size - 1)};
  }
};

}  // namespace

void ImageOptions::check() const {
  if (channels != 1 && channels != 3)
    throw InvalidArgument(
        fmt::format("ImageOptions::channels is {}; images have 1 (grayscale) "
                    "or 3 (colour) channels",
                    channels));
  if (height < 1 || width < 1 || height > (1 << 16) || width > (1 << 16))
    throw InvalidArgument(
        fmt::format("ImageOptions: output size {}x{} is outside 1..65536", height, width));
  if (!(scale_min > 0 && scale_min <= scale_max && scale_max <= 1))
    throw InvalidArgument(fmt::format("ImageOptions: scale range [{}, {}] is not within (0, 1]",
                                      scale_min, scale_max));
  if (!(ratio_min > 0 && ratio_min <= ratio_max && std::isfinite(ratio_max)))
    throw InvalidArgument(
        fmt::format("ImageOptions: ratio range [{}, {}] is not positive", ratio_min, ratio_max));
  if (padding < 0 || padding > (1 << 16) || resize < 0 || resize > (1 << 16))
    throw InvalidArgument(
        fmt::format("ImageOptions: padding {} or resize {} is outside 0..65536", padding, resize));
  for (const std::vector<float>* values : {&mean, &std})
    if (!values->empty() && values->size() != 1 &&
        static_cast<std::int64_t>(values->size()) != channels)
      throw InvalidArgument(
          fmt::format("ImageOptions: {} values of {} for {} channels (give one "
                      "a channel, or one for all)",
                      values->size(), values == &mean ? "mean" : "std", channels));
  for (float s : std)
    if (!(s > 0) || !std::isfinite(s))
      throw InvalidArgument(fmt::format("ImageOptions: std {} is not a positive number", s));
  for (float m : mean)
    if (!std::isfinite(m))
      throw InvalidArgument(fmt::format("ImageOptions: mean {} is not finite", m));
}

std::string ImageOptions::str() const {
  std::string out = fmt::format("{} {}x{} of {} channel{}", crop_name(crop), height, width,
                                channels, channels == 1 ? "" : "s");
  if (crop == CropKind::random_padded) out += fmt::format(", padding {}", padding);
  if (flip) out += ", flip";
  if (!mean.empty()) out += fmt::format(", mean [{}]", fmt::join(mean, ", "));
  if (!std.empty()) out += fmt::format(", std [{}]", fmt::join(std, ", "));
  return out;
}

CropBox choose_crop(const ImageOptions& o, std::int64_t source_height, std::int64_t source_width,
                    std::int64_t epoch, std::int64_t sample) {
  const auto height = static_cast<double>(source_height), width = static_cast<double>(source_width);
  CropBox box;
  if (o.crop == CropKind::center) {
    if (o.resize == 0 && source_height == o.height && source_width == o.width)
      return {0, 0, width, height, false};
    const double resize =
        o.resize > 0
            ? static_cast<double>(o.resize)
            : std::round(static_cast<double>(std::min(o.height, o.width)) / kCenterFraction);
    const double per_output = std::min(height, width) / resize;  // source pixels per output pixel
    box.w = static_cast<double>(o.width) * per_output;
    box.h = static_cast<double>(o.height) * per_output;
    box.x = (width - box.w) / 2;
    box.y = (height - box.h) / 2;
    return box;
  }
  float u[kWordsPerSample];
  kernels::cpu::uniform({o.seed, kAugmentStream + static_cast<std::uint64_t>(epoch)},
                        static_cast<std::uint64_t>(sample) * kWordsPerSample, u, kWordsPerSample);
  box.flip = o.flip && u[kWordsPerSample - 1] < 0.5f;
  // randint(0, n + 1) from one uniform in [0, 1).
  const auto pick = [](float uniform, std::int64_t n) {
    return std::min<std::int64_t>(n,
                                  static_cast<std::int64_t>(uniform * static_cast<double>(n + 1)));
  };
  if (o.crop == CropKind::random_padded) {
    const std::int64_t free_y = source_height + 2 * o.padding - o.height;
    const std::int64_t free_x = source_width + 2 * o.padding - o.width;
    box.y = static_cast<double>(pick(u[0], std::max<std::int64_t>(free_y, 0)) - o.padding);
    box.x = static_cast<double>(pick(u[1], std::max<std::int64_t>(free_x, 0)) - o.padding);
    box.h = static_cast<double>(o.height);
    box.w = static_cast<double>(o.width);
    return box;
  }
  // torchvision.transforms.RandomResizedCrop.get_params, attempt by attempt.
  const double area = height * width;
  const double log_min = std::log(o.ratio_min), log_max = std::log(o.ratio_max);
  for (int attempt = 0; attempt < kAttempts; ++attempt) {
    const float* a = u + 4 * attempt;
    const double target = area * (o.scale_min + (o.scale_max - o.scale_min) * a[0]);
    const double aspect = std::exp(log_min + (log_max - log_min) * a[1]);
    const auto w = static_cast<std::int64_t>(round_half_even(std::sqrt(target * aspect)));
    const auto h = static_cast<std::int64_t>(round_half_even(std::sqrt(target / aspect)));
    if (w > 0 && w <= source_width && h > 0 && h <= source_height) {
      box.y = static_cast<double>(pick(a[2], source_height - h));
      box.x = static_cast<double>(pick(a[3], source_width - w));
      box.h = static_cast<double>(h);
      box.w = static_cast<double>(w);
      return box;
    }
  }
  // The fallback: the whole image, cut to the nearest allowed aspect ratio, centred.
  const double in_ratio = width / height;
  std::int64_t w = source_width, h = source_height;
  if (in_ratio < o.ratio_min)
    h = static_cast<std::int64_t>(round_half_even(width / o.ratio_min));
  else if (in_ratio > o.ratio_max)
    w = static_cast<std::int64_t>(round_half_even(height * o.ratio_max));
  box.y = static_cast<double>((source_height - h) / 2);
  box.x = static_cast<double>((source_width - w) / 2);
  box.h = static_cast<double>(h);
  box.w = static_cast<double>(w);
  return box;
}

// Note [scaled decode]: when the crop's box is at least 2, 4 or 8 times the
// output on both sides, a JPEG is decoded at 1/2, 1/4 or 1/8 of each side
// (TurboJPEG's scaled inverse DCT, as PIL's draft mode and torchvision's
// decode_jpeg do not: a fraction of the full decode's work) and the box
// divided by the same d, so the bilinear pass still shrinks (it never
// enlarges what the decode shrank). Scaled pixel i covers full pixels
// [d i, d (i + 1)), so its centre (i + 0.5) d - 0.5 maps to i, and a box edge
// e to e / d. The box is drawn from the full size before the decode, so every
// draw is unchanged (Note [keyed augmentation]) and the crop is still a
// function of the image and the draw alone. The pixels are not the full
// decode's: a scaled pixel is close to the mean of its d x d block where the
// full path samples two of every d pixels along each axis, so on fine
// texture it aliases less (it is nearer PIL's antialiased resize, Note
// [bilinear resampling]); on a smooth image the two agree within the
// tolerance tests/io/test_images.cpp states. PNGs are decoded at full size.
int decode_scale(const CropBox& box, const ImageOptions& o) {
  for (const int d : {8, 4, 2})
    if (box.w >= static_cast<double>(d * o.width) && box.h >= static_cast<double>(d * o.height))
      return d;
  return 1;
}

CropBox scaled_box(const CropBox& box, int d) {
  const auto scale = static_cast<double>(d);
  return {box.x / scale, box.y / scale, box.w / scale, box.h / scale, box.flip};
}

PixelRegion crop_source_region(const CropBox& box, const ImageOptions& o,
                               std::int64_t source_height, std::int64_t source_width) {
  const auto [x_low, x_high] = Taps::reach(box.x, box.w, o.width, source_width);
  const auto [y_low, y_high] = Taps::reach(box.y, box.h, o.height, source_height);
  return {x_low, y_low, x_high - x_low + 1, y_high - y_low + 1};
}

kernels::ChannelAffine channel_affine(const ImageOptions& o) {
  kernels::ChannelAffine affine;
  affine.channels = static_cast<int>(o.channels);
  for (int c = 0; c < affine.channels; ++c) {
    const float mean = o.mean.empty() ? 0.0f : o.mean[o.mean.size() == 1 ? 0 : c];
    const float std = o.std.empty() ? 1.0f : o.std[o.std.size() == 1 ? 0 : c];
    affine.scale[c] = 1.0f / (255.0f * std);
    affine.bias[c] = -mean / std;
  }
  return affine;
}

namespace {

// The buffers of one thread's crops (Note [separable resampling]).
struct ResampleScratch {
  Taps columns, rows;
  std::vector<float> resampled;  // columns first: two rows [2][C][width]; rows first: one mix
};

ResampleScratch& thread_scratch() {
  thread_local ResampleScratch scratch;
  return scratch;
}

// Where a crop's values go: normalised f32 (f32 set) or u8 rounded half up.
struct Output {
  float* f32 = nullptr;
  std::uint8_t* u8 = nullptr;
  kernels::ChannelAffine affine{};
};

// Columns first, the horizontal pass: source row `row` (every channel) at
// the output's width, into out [C, width]. Interleaved pixels (decoded
// images, [H, W, C]) take each column's taps once for all C channels.
template <int kChannels>
void resample_interleaved_row(const std::uint8_t* __restrict row, const Taps& columns,
                              std::int64_t width, float* __restrict out) {
  const std::int64_t* __restrict x0 = columns.first.data();
  const std::int64_t* __restrict x1 = columns.second.data();
  const float* __restrict w0 = columns.first_weight.data();
  const float* __restrict w1 = columns.second_weight.data();
  for (std::int64_t ox = 0; ox < width; ++ox) {
    const std::uint8_t* a = row + x0[ox];
    const std::uint8_t* b = row + x1[ox];
    for (int c = 0; c < kChannels; ++c)
      out[c * width + ox] = w0[ox] * static_cast<float>(a[c]) + w1[ox] * static_cast<float>(b[c]);
  }
}

[[gnu::target_clones("avx2", "default")]] void resample_row(const PixelView& s,
                                                            const std::uint8_t* row,
                                                            const Taps& columns, std::int64_t width,
                                                            float* out) {
  if (s.channel_stride == 1 && s.column_stride == 3 && s.channels == 3)
    return resample_interleaved_row<3>(row, columns, width, out);
  const std::int64_t* __restrict x0 = columns.first.data();
  const std::int64_t* __restrict x1 = columns.second.data();
  const float* __restrict w0 = columns.first_weight.data();
  const float* __restrict w1 = columns.second_weight.data();
  for (std::int64_t c = 0; c < s.channels; ++c) {
    const std::uint8_t* __restrict source = row + c * s.channel_stride;
    float* __restrict dst = out + c * width;
    for (std::int64_t ox = 0; ox < width; ++ox)
      dst[ox] =
          w0[ox] * static_cast<float>(source[x0[ox]]) + w1[ox] * static_cast<float>(source[x1[ox]]);
  }
}

// Columns first, the vertical pass into f32: v0 upper + v1 lower, then x * scale + bias.
[[gnu::target_clones("avx2", "default")]] void mix_rows(const float* __restrict upper,
                                                        const float* __restrict lower, float v0,
                                                        float v1, float scale, float bias,
                                                        std::int64_t width, float* __restrict out) {
  for (std::int64_t ox = 0; ox < width; ++ox)
    out[ox] = (v0 * upper[ox] + v1 * lower[ox]) * scale + bias;
}

// The same into u8: a convex mix of u8 values lies in [0, 255], rounded half up.
[[gnu::target_clones("avx2", "default")]] void mix_rows(const float* __restrict upper,
                                                        const float* __restrict lower, float v0,
                                                        float v1, std::int64_t width,
                                                        std::uint8_t* __restrict out) {
  for (std::int64_t ox = 0; ox < width; ++ox)
    out[ox] = static_cast<std::uint8_t>(v0 * upper[ox] + v1 * lower[ox] + 0.5f);
}

void columns_first(const PixelView& s, ResampleScratch& scratch, const ImageOptions& o,
                   const Output& out) {
  const std::int64_t row_values = o.channels * o.width;
  scratch.resampled.resize(static_cast<std::size_t>(2 * row_values));
  float* upper = scratch.resampled.data();
  float* lower = upper + row_values;
  std::int64_t upper_row = -1, lower_row = -1;  // the source rows (offsets) they hold
  for (std::int64_t oy = 0; oy < o.height; ++oy) {
    const std::int64_t first = scratch.rows.first[oy], second = scratch.rows.second[oy];
    if (upper_row != first) {
      if (lower_row == first) {
        std::swap(upper, lower);
        std::swap(upper_row, lower_row);
      } else {
        resample_row(s, s.data + first, scratch.columns, o.width, upper);
        upper_row = first;
      }
    }
    const float* bottom = upper;
    if (second != upper_row) {
      if (lower_row != second) {
        resample_row(s, s.data + second, scratch.columns, o.width, lower);
        lower_row = second;
      }
      bottom = lower;
    }
    const float v0 = scratch.rows.first_weight[oy], v1 = scratch.rows.second_weight[oy];
    for (std::int64_t c = 0; c < o.channels; ++c) {
      const std::int64_t at = (c * o.height + oy) * o.width;
      if (out.f32)
        mix_rows(upper + c * o.width, bottom + c * o.width, v0, v1, out.affine.scale[c],
                 out.affine.bias[c], o.width, out.f32 + at);
      else
        mix_rows(upper + c * o.width, bottom + c * o.width, v0, v1, o.width, out.u8 + at);
    }
  }
}

// Rows first, the vertical pass: v0 top + v1 bottom over a run of source bytes.
[[gnu::target_clones("avx2", "default")]] void mix_source_rows(
    const std::uint8_t* __restrict top, const std::uint8_t* __restrict bottom, float v0, float v1,
    std::int64_t n, float* __restrict out) {
  for (std::int64_t k = 0; k < n; ++k)
    out[k] = v0 * static_cast<float>(top[k]) + v1 * static_cast<float>(bottom[k]);
}

// Rows first, the horizontal pass into f32 (w0 a + w1 b, then x * scale +
// bias) or u8, from the mixed row (the column taps are offsets into it).
[[gnu::target_clones("avx2", "default")]] void mix_columns(const float* __restrict mixed,
                                                           const Taps& columns, std::int64_t width,
                                                           float scale, float bias,
                                                           float* __restrict out) {
  const std::int64_t* __restrict x0 = columns.first.data();
  const std::int64_t* __restrict x1 = columns.second.data();
  const float* __restrict w0 = columns.first_weight.data();
  const float* __restrict w1 = columns.second_weight.data();
  for (std::int64_t ox = 0; ox < width; ++ox)
    out[ox] = (w0[ox] * mixed[x0[ox]] + w1[ox] * mixed[x1[ox]]) * scale + bias;
}

[[gnu::target_clones("avx2", "default")]] void mix_columns(const float* __restrict mixed,
                                                           const Taps& columns, std::int64_t width,
                                                           std::uint8_t* __restrict out) {
  const std::int64_t* __restrict x0 = columns.first.data();
  const std::int64_t* __restrict x1 = columns.second.data();
  const float* __restrict w0 = columns.first_weight.data();
  const float* __restrict w1 = columns.second_weight.data();
  for (std::int64_t ox = 0; ox < width; ++ox)
    out[ox] = static_cast<std::uint8_t>(w0[ox] * mixed[x0[ox]] + w1[ox] * mixed[x1[ox]] + 0.5f);
}

// The same for three interleaved channels at once (mixed channel c at +c):
// each column's taps are loaded once for the three.
[[gnu::target_clones("avx2", "default")]] void mix_columns3(const float* __restrict mixed,
                                                            const Taps& columns, std::int64_t width,
                                                            std::int64_t plane, const Output& out,
                                                            std::int64_t at) {
  const std::int64_t* __restrict x0 = columns.first.data();
  const std::int64_t* __restrict x1 = columns.second.data();
  const float* __restrict w0 = columns.first_weight.data();
  const float* __restrict w1 = columns.second_weight.data();
  const float* scale = out.affine.scale;
  const float* bias = out.affine.bias;
  for (std::int64_t ox = 0; ox < width; ++ox) {
    const float* a = mixed + x0[ox];
    const float* b = mixed + x1[ox];
    for (int c = 0; c < 3; ++c) {
      const float value = w0[ox] * a[c] + w1[ox] * b[c];
      if (out.f32)
        out.f32[at + c * plane + ox] = value * scale[c] + bias[c];
      else
        out.u8[at + c * plane + ox] = static_cast<std::uint8_t>(value + 0.5f);
    }
  }
}

void rows_first(const PixelView& s, ResampleScratch& scratch, const ImageOptions& o,
                const Output& out) {
  // The source columns the taps reach, [low, high], and the mixed row's
  // layout: interleaved pixels mix as one run of bytes (channel c at +c),
  // planar ones as a run per channel (channel c at +c * span).
  Taps& columns = scratch.columns;
  const std::int64_t low = *std::min_element(columns.first.begin(), columns.first.end());
  const std::int64_t high = *std::max_element(columns.second.begin(), columns.second.end());
  const bool interleaved = s.channel_stride < s.column_stride;
  const std::int64_t run = high - low + 1 + (interleaved ? (s.channels - 1) * s.channel_stride : 0);
  const std::int64_t runs = interleaved ? 1 : s.channels;
  const std::int64_t mixed_channel_stride = interleaved ? s.channel_stride : run;
  for (std::int64_t& x : columns.first) x -= low;
  for (std::int64_t& x : columns.second) x -= low;
  scratch.resampled.resize(static_cast<std::size_t>(runs * run));
  float* mixed = scratch.resampled.data();
  for (std::int64_t oy = 0; oy < o.height; ++oy) {
    const std::uint8_t* top = s.data + scratch.rows.first[oy] + low;
    const std::uint8_t* bottom = s.data + scratch.rows.second[oy] + low;
    const float v0 = scratch.rows.first_weight[oy], v1 = scratch.rows.second_weight[oy];
    for (std::int64_t r = 0; r < runs; ++r)
      mix_source_rows(top + r * s.channel_stride, bottom + r * s.channel_stride, v0, v1, run,
                      mixed + r * run);
    if (interleaved && o.channels == 3 && mixed_channel_stride == 1) {
      mix_columns3(mixed, columns, o.width, o.height * o.width, out, oy * o.width);
      continue;
    }
    for (std::int64_t c = 0; c < o.channels; ++c) {
      const std::int64_t at = (c * o.height + oy) * o.width;
      const float* channel = mixed + c * mixed_channel_stride;
      if (out.f32)
        mix_columns(channel, columns, o.width, out.affine.scale[c], out.affine.bias[c],
                    out.f32 + at);
      else
        mix_columns(channel, columns, o.width, out.u8 + at);
    }
  }
}

void resample(const PixelView& s, const CropBox& box, const ImageOptions& o, const Output& out) {
  ResampleScratch& scratch = thread_scratch();
  scratch.columns.fill(box.x, box.w, o.width, s.width, s.column_stride, box.flip, s.first_column);
  scratch.rows.fill(box.y, box.h, o.height, s.height, s.row_stride, false, s.first_row);
  if (box.h > static_cast<double>(o.height))
    rows_first(s, scratch, o, out);
  else
    columns_first(s, scratch, o, out);
}

}  // namespace

void crop_resize_normalize(const PixelView& s, const CropBox& box, const ImageOptions& o,
                           float* out) {
  resample(s, box, o, {.f32 = out, .affine = channel_affine(o)});
}

void crop_resize_u8(const PixelView& s, const CropBox& box, const ImageOptions& o,
                    std::uint8_t* out) {
  resample(s, box, o, {.u8 = out});
}

}  // namespace lockstep::io
