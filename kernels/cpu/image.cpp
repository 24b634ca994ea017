// CPU u8 image normalisation (kernels/image.h).
#include "kernels/image.h"

namespace lockstep::kernels::cpu {

void normalize_u8(const std::uint8_t* in, float* out, std::int64_t images, std::int64_t plane,
                  const ChannelAffine& affine) {
  for (std::int64_t i = 0; i < images; ++i)
    for (int c = 0; c < affine.channels; ++c) {
      const std::int64_t at = (i * affine.channels + c) * plane;
      const float scale = affine.scale[c], bias = affine.bias[c];
      for (std::int64_t p = 0; p < plane; ++p) {
        const float scaled = static_cast<float>(in[at + p]) * scale;  // rounded: no FMA
        out[at + p] = scaled + bias;
      }
    }
}

}  // namespace lockstep::kernels::cpu
