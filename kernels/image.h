// u8 images to f32 with a per-channel affine map, out = x * scale[c] +
// bias[c] (scale = 1 / (255 std), bias = -mean / std: torchvision's ToTensor
// then Normalize in one pass), over [images, channels, plane] buffers. The
// CUDA loader copies u8 batches (a quarter of f32's bytes) and runs this on
// the device; both twins round the product and the sum separately (no fused
// multiply-add), so they agree bit for bit.
#pragma once

#include <cstdint>

#include "kernels/stream.h"

namespace lockstep::kernels {

inline constexpr int kMaxImageChannels = 4;

struct ChannelAffine {
  int channels = 0;
  float scale[kMaxImageChannels] = {};
  float bias[kMaxImageChannels] = {};
};

namespace cpu {
void normalize_u8(const std::uint8_t* in, float* out, std::int64_t images, std::int64_t plane,
                  const ChannelAffine& affine);
}  // namespace cpu

namespace cuda {
void normalize_u8(const std::uint8_t* in, float* out, std::int64_t images, std::int64_t plane,
                  const ChannelAffine& affine, CudaStream stream);
}  // namespace cuda

}  // namespace lockstep::kernels
