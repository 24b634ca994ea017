// Test images made in the test: JPEG through TurboJPEG's encoder and PNG
// through libpng's simplified writer, of a pixel pattern given by a formula,
// so the decoder, the loader and the programs' tests need no image files.
#pragma once

#include <png.h>
#include <turbojpeg.h>

#include <cstdint>
#include <stdexcept>
#include <vector>

namespace lockstep::test {

// Pixel (y, x, c) of test image `seed`: smooth, so JPEG keeps it within a few levels.
inline std::uint8_t image_value(int seed, std::int64_t y, std::int64_t x, std::int64_t c) {
  return static_cast<std::uint8_t>((seed * 37 + y * 5 + x * 3 + c * 60) % 200 + 20);
}

// [height, width, channels] pixels of test image `seed`.
inline std::vector<std::uint8_t> image_pixels(int seed, int height, int width, int channels) {
  std::vector<std::uint8_t> pixels(static_cast<std::size_t>(height) * width * channels);
  for (int y = 0; y < height; ++y)
    for (int x = 0; x < width; ++x)
      for (int c = 0; c < channels; ++c)
        pixels[(static_cast<std::size_t>(y) * width + x) * channels + c] =
            image_value(seed, y, x, c);
  return pixels;
}

// A JPEG of `pixels` ([height, width, channels], 1 or 3 channels) at
// `quality`, colour ones at TurboJPEG's `subsampling` (4:4:4 unless given),
// progressive when `progressive`.
inline std::vector<std::uint8_t> encode_jpeg(const std::vector<std::uint8_t>& pixels, int height,
                                             int width, int channels, int quality = 95,
                                             int subsampling = TJSAMP_444,
                                             bool progressive = false) {
  tjhandle tj = tjInitCompress();
  unsigned char* buffer = nullptr;
  unsigned long size = 0;
  const int status = tjCompress2(
      tj, pixels.data(), width, 0, height, channels == 1 ? TJPF_GRAY : TJPF_RGB, &buffer, &size,
      channels == 1 ? TJSAMP_GRAY : subsampling, quality, progressive ? TJFLAG_PROGRESSIVE : 0);
  std::vector<std::uint8_t> out(buffer, buffer + (status == 0 ? size : 0));
  tjFree(buffer);
  tjDestroy(tj);
  if (status != 0) throw std::runtime_error("tjCompress2 failed");
  return out;
}

// A PNG of `pixels` ([height, width, channels]: 1 gray, 2 gray+alpha, 3 RGB, 4 RGBA).
inline std::vector<std::uint8_t> encode_png(const std::vector<std::uint8_t>& pixels, int height,
                                            int width, int channels) {
  png_image image{};
  image.version = PNG_IMAGE_VERSION;
  image.width = static_cast<png_uint_32>(width);
  image.height = static_cast<png_uint_32>(height);
  image.format = channels == 1   ? PNG_FORMAT_GRAY
                 : channels == 2 ? PNG_FORMAT_GA
                 : channels == 3 ? PNG_FORMAT_RGB
                                 : PNG_FORMAT_RGBA;
  png_alloc_size_t size = 0;
  if (!png_image_write_to_memory(&image, nullptr, &size, 0, pixels.data(), 0, nullptr))
    throw std::runtime_error("png_image_write_to_memory (size) failed");
  std::vector<std::uint8_t> out(size);
  if (!png_image_write_to_memory(&image, out.data(), &size, 0, pixels.data(), 0, nullptr))
    throw std::runtime_error("png_image_write_to_memory failed");
  out.resize(size);
  return out;
}

}  // namespace lockstep::test
