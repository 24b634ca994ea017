// Image transforms run in the loader threads: random-resized-crop (as
// torchvision's RandomResizedCrop), the evaluation centre crop (Resize then
// CenterCrop), random crop with zero padding (fixed-shape images), the
// horizontal flip, and per-channel normalisation fused into the u8-to-f32
// conversion. Every random draw is keyed (Note [keyed augmentation]): a
// function of (seed, epoch, global sample index), never of a thread's state.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "io/image_decode.h"
#include "kernels/image.h"

namespace lockstep::io {

enum class CropKind {
  center,          // the evaluation crop: resize the shorter side, crop the middle
  random_resized,  // torchvision's RandomResizedCrop (scale, ratio, 10 attempts)
  random_padded,   // a random out-size window of the image padded by `padding` zeros
};

struct ImageOptions {
  std::int64_t channels = 0;           // C the model takes; 0: no image pipeline
  std::int64_t height = 0, width = 0;  // the output size
  CropKind crop = CropKind::center;
  // center: the shorter side is resized to this before the crop (torchvision's
  // Resize(resize) then CenterCrop((height, width))); 0: the crop fills the
  // shorter side's 0.875 (256 for 224), or the whole image when it already
  // has the output size.
  std::int64_t resize = 0;
  double scale_min = 0.08, scale_max = 1.0;             // random_resized: of the image's area
  double ratio_min = 3.0 / 4.0, ratio_max = 4.0 / 3.0;  // random_resized: width / height
  std::int64_t padding = 0;                             // random_padded: zeros on each side
  bool flip = false;                                    // horizontal flip with probability 1/2
  // Per channel, of pixels scaled to [0, 1]: out = (x / 255 - mean) / std.
  // Empty: mean 0 and std 1 (x / 255). One value: every channel.
  std::vector<float> mean{}, std{};
  std::uint64_t seed = 0;

  bool enabled() const { return channels > 0; }
  // Throws InvalidArgument naming the field and its value.
  void check() const;
  // "random-resized-crop 224x224, flip, mean [0.485, ...]" for logs and records.
  std::string str() const;
};

// Where one output image comes from: the box [x, x + w) x [y, y + h) of the
// source, in source pixels, resampled to the output size, and whether it is
// mirrored. A pure function of (options, source size, epoch, sample).
struct CropBox {
  double x = 0, y = 0, w = 0, h = 0;
  bool flip = false;
};
CropBox choose_crop(const ImageOptions& options, std::int64_t source_height,
                    std::int64_t source_width, std::int64_t epoch, std::int64_t sample);

// The JPEG decode's scale for `box` (Note [scaled decode] in
// image_transform.cpp): the largest d of 8, 4 and 2 for which the box is at
// least d times the output on both sides, else 1; and the box in the pixels
// of an image decoded at 1/d of each side.
int decode_scale(const CropBox& box, const ImageOptions& options);
CropBox scaled_box(const CropBox& box, int scale_denominator);

// A source image of 8-bit pixels with arbitrary strides (decoded images are
// [H, W, C], shard rows [C, H, W]).
struct PixelView {
  const std::uint8_t* data = nullptr;
  std::int64_t channels = 0, height = 0, width = 0;
  std::int64_t channel_stride = 0, row_stride = 0, column_stride = 0;
  // A view of part of the height x width image (a cropped decode, Note
  // [cropped decode] in image_decode.cpp): `data` is its pixel (first_row,
  // first_column), and the view holds at least crop_source_region's pixels.
  std::int64_t first_row = 0, first_column = 0;
};

// The pixels of a source_height x source_width image that
// crop_resize_normalize and crop_resize_u8 read for `box` (every tap,
// clamped to the image as Note [bilinear resampling] clamps it; never empty).
PixelRegion crop_source_region(const CropBox& box, const ImageOptions& options,
                               std::int64_t source_height, std::int64_t source_width);

// Writes options.channels x height x width f32 values to `out` ([C, H, W]):
// `box` of `source` resampled bilinearly (Note [bilinear resampling]),
// mirrored when box.flip, normalised. `source` has options.channels channels.
void crop_resize_normalize(const PixelView& source, const CropBox& box, const ImageOptions& options,
                           float* out);
// The same crop as u8 (each value rounded half up), for the CUDA loader,
// which copies u8 batches and normalises them on the device
// (kernels::cuda::normalize_u8 with channel_affine(options)).
void crop_resize_u8(const PixelView& source, const CropBox& box, const ImageOptions& options,
                    std::uint8_t* out);
// Options' mean and std as the per-channel map x * scale + bias of u8 pixels.
kernels::ChannelAffine channel_affine(const ImageOptions& options);

}  // namespace lockstep::io
