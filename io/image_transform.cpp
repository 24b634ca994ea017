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
#include "io/image_transform.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "kernels/error.h"
#include "kernels/philox.h"

namespace lockstep::io {
namespace {

constexpr std::uint64_t kAugmentStream = std::uint64_t{0xA06} << 48;
constexpr int kAttempts = 10;
constexpr std::int64_t kWordsPerSample = 4 * kAttempts + 1;
constexpr double kCenterFraction = 0.875;  // 224 of 256, torchvision's ImageNet evaluation

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
// position reads the zero padding, so the inner loop has no branch.
struct Taps {
  std::vector<std::int64_t> first, second;
  std::vector<float> first_weight, second_weight;
};

Taps taps(double start, double extent, std::int64_t out, std::int64_t size, std::int64_t stride) {
  Taps t;
  t.first.resize(out);
  t.second.resize(out);
  t.first_weight.resize(out);
  t.second_weight.resize(out);
  for (std::int64_t o = 0; o < out; ++o) {
    const double at =
        start + (static_cast<double>(o) + 0.5) * extent / static_cast<double>(out) - 0.5;
    const bool inside = at >= -0.5 && at <= static_cast<double>(size) - 0.5;
    const double lower = std::floor(at);
    const auto weight = static_cast<float>(at - lower);
    const auto base = static_cast<std::int64_t>(lower);
    t.first[o] = std::clamp<std::int64_t>(base, 0, size - 1) * stride;
    t.second[o] = std::clamp<std::int64_t>(base + 1, 0, size - 1) * stride;
    t.first_weight[o] = inside ? 1.0f - weight : 0.0f;
    t.second_weight[o] = inside ? weight : 0.0f;
  }
  return t;
}

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
    const auto w = static_cast<std::int64_t>(std::round(std::sqrt(target * aspect)));
    const auto h = static_cast<std::int64_t>(std::round(std::sqrt(target / aspect)));
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
    h = static_cast<std::int64_t>(std::round(width / o.ratio_min));
  else if (in_ratio > o.ratio_max)
    w = static_cast<std::int64_t>(std::round(height * o.ratio_max));
  box.y = static_cast<double>((source_height - h) / 2);
  box.x = static_cast<double>((source_width - w) / 2);
  box.h = static_cast<double>(h);
  box.w = static_cast<double>(w);
  return box;
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

// The bilinear value of every output pixel (0 outside the source), through
// finish(channel, value), into out [C, H, W].
template <typename T, typename Finish>
void resample(const PixelView& s, const CropBox& box, const ImageOptions& o, T* out,
              Finish finish) {
  const Taps xs = taps(box.x, box.w, o.width, s.width, s.column_stride);
  const Taps ys = taps(box.y, box.h, o.height, s.height, s.row_stride);
  const std::int64_t width = o.width;
  const std::int64_t* __restrict x0 = xs.first.data();
  const std::int64_t* __restrict x1 = xs.second.data();
  const float* __restrict w0 = xs.first_weight.data();
  const float* __restrict w1 = xs.second_weight.data();
  for (std::int64_t c = 0; c < o.channels; ++c) {
    const std::uint8_t* plane = s.data + c * s.channel_stride;
    for (std::int64_t oy = 0; oy < o.height; ++oy) {
      T* __restrict row = out + (c * o.height + oy) * width;
      const std::uint8_t* __restrict top = plane + ys.first[oy];
      const std::uint8_t* __restrict bottom = plane + ys.second[oy];
      const float v0 = ys.first_weight[oy], v1 = ys.second_weight[oy];
      const std::int64_t step = box.flip ? -1 : 1;
      T* __restrict dst = box.flip ? row + width - 1 : row;
      for (std::int64_t ox = 0; ox < width; ++ox, dst += step) {
        const float upper =
            w0[ox] * static_cast<float>(top[x0[ox]]) + w1[ox] * static_cast<float>(top[x1[ox]]);
        const float lower = w0[ox] * static_cast<float>(bottom[x0[ox]]) +
                            w1[ox] * static_cast<float>(bottom[x1[ox]]);
        *dst = finish(c, v0 * upper + v1 * lower);
      }
    }
  }
}

}  // namespace

void crop_resize_normalize(const PixelView& s, const CropBox& box, const ImageOptions& o,
                           float* out) {
  const kernels::ChannelAffine affine = channel_affine(o);
  resample(s, box, o, out, [&affine](std::int64_t c, float value) {
    return value * affine.scale[c] + affine.bias[c];
  });
}

void crop_resize_u8(const PixelView& s, const CropBox& box, const ImageOptions& o,
                    std::uint8_t* out) {
  // A convex mix of u8 values lies in [0, 255]: rounded half up.
  resample(s, box, o, out,
           [](std::int64_t, float value) { return static_cast<std::uint8_t>(value + 0.5f); });
}

}  // namespace lockstep::io
