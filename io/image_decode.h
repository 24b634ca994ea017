// decode_image: one JPEG (libjpeg-turbo's TurboJPEG API) or PNG (libpng's
// simplified API) file, sniffed by its signature, to 8-bit pixels: grayscale
// to one channel, colour to three; decode_image_region: only the rows and
// columns of a JPEG that a crop needs (libjpeg's API, Note [cropped decode]).
// Hostile and truncated files are errors (DecodeError), never a crash or a
// partial image (Note [decoding hostile images] in image_decode.cpp).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "kernels/error.h"

namespace lockstep::io {

// The most pixels a decoded image may have (16384 x 16384): a header that
// declares more is refused before anything is allocated.
inline constexpr std::int64_t kMaxDecodedPixels = std::int64_t{1} << 28;

// Thrown by decode_image; its message says what is wrong with the bytes, and
// the caller adds where they came from (the shard and the row).
class DecodeError : public IoError {
 public:
  using IoError::IoError;
};

struct DecodedImage {
  std::int64_t channels = 0, height = 0, width = 0;
  std::vector<std::uint8_t> pixels;  // [height, width, channels], row-major
  // Where the pixels lie in the whole image (at the decode's scale): its rows
  // [y0, y0 + height) and columns [x0, x0 + width) of image_height x
  // image_width. decode_image: 0, 0 and the image's own size.
  std::int64_t x0 = 0, y0 = 0, image_height = 0, image_width = 0;
};

// The pixels [x, x + width) x [y, y + height) of an image.
struct PixelRegion {
  std::int64_t x = 0, y = 0, width = 0, height = 0;
};

// What decode_image gives at full size, from the header alone (no pixels
// decoded); the same checks and DecodeErrors as decode_image's header.
struct ImageHeader {
  std::int64_t channels = 0, height = 0, width = 0;
  bool jpeg = false;  // a JPEG, which decode_image can decode at 1/2, 1/4 or 1/8 of each side
};
ImageHeader read_image_header(std::span<const std::uint8_t> bytes);

// Decodes `bytes` into `out` (its buffer reused). JPEG: grayscale stays one
// channel, YCbCr and RGB become RGB, CMYK is refused. PNG: palette and
// 16-bit images become 8-bit; alpha is dropped (as PIL's convert("RGB")).
// scale_denominator d (1, 2, 4 or 8): a JPEG is decoded at 1/d of each side,
// ceil(side / d) pixels, by TurboJPEG's scaled inverse DCT (Note [scaled
// decode] in image_transform.cpp); a PNG is always decoded at full size.
// Thread-safe (each thread keeps its own TurboJPEG handle).
void decode_image(std::span<const std::uint8_t> bytes, DecodedImage& out,
                  int scale_denominator = 1);

// As decode_image, but of a JPEG only a part at least as large as `region`
// (in pixels of the image decoded at 1/scale_denominator; it must lie within
// that image) is decoded, and each of the region's pixels is exactly the
// full decode's (Note [cropped decode] in image_decode.cpp); out.x0 and
// out.y0 say where the part lies. A PNG is decoded whole. Rows below the
// region are not read, so damage there goes unseen.
void decode_image_region(std::span<const std::uint8_t> bytes, DecodedImage& out,
                         int scale_denominator, const PixelRegion& region);

}  // namespace lockstep::io
