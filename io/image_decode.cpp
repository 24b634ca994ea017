// decode_image (io/image_decode.h).
//
// Note [decoding hostile images]: every image comes from a file someone else
// wrote. Both decoders report errors by return value here (TurboJPEG's
// functions return -1; libpng's simplified API catches its own longjmp and
// returns 0), so no C error path unwinds through C++ frames. Before any
// buffer is sized, the header's width and height are checked against
// kMaxDecodedPixels. TurboJPEG runs with TJFLAG_STOPONWARNING, so a
// truncated or corrupt JPEG (which libjpeg would otherwise finish with grey
// rows and a warning) is an error, and TJFLAG_LIMITSCANS, so a progressive
// JPEG of thousands of scans (a decoding-time bomb) is refused.
#include "io/image_decode.h"

#include <png.h>
#include <turbojpeg.h>

#include <fmt/core.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <string>

namespace lockstep::io {
namespace {

struct TjHandleDeleter {
  void operator()(void* handle) const { tjDestroy(handle); }
};

tjhandle thread_decompressor() {
  thread_local std::unique_ptr<void, TjHandleDeleter> handle(tjInitDecompress());
  if (!handle)
    throw DecodeError(std::string("TurboJPEG cannot make a decompressor: ") +
                      tjGetErrorStr2(nullptr));
  return handle.get();
}

void check_size(const char* kind, std::int64_t width, std::int64_t height) {
  if (width < 1 || height < 1 || width > kMaxDecodedPixels / height)
    throw DecodeError(
        fmt::format("the {} header declares {} x {} pixels (at most {} pixels, "
                    "each side at least 1)",
                    kind, width, height, kMaxDecodedPixels));
}

void decode_jpeg(std::span<const std::uint8_t> bytes, DecodedImage& out) {
  tjhandle tj = thread_decompressor();
  int width = 0, height = 0, subsampling = 0, colorspace = 0;
  if (tjDecompressHeader3(tj, bytes.data(), static_cast<unsigned long>(bytes.size()), &width,
                          &height, &subsampling, &colorspace) != 0)
    throw DecodeError(std::string("not a readable JPEG: ") + tjGetErrorStr2(tj));
  check_size("JPEG", width, height);
  if (colorspace == TJCS_CMYK || colorspace == TJCS_YCCK)
    throw DecodeError("a CMYK JPEG (convert it to RGB, e.g. with PIL's convert(\"RGB\"))");
  const bool gray = colorspace == TJCS_GRAY;
  out.channels = gray ? 1 : 3;
  out.height = height;
  out.width = width;
  out.pixels.resize(static_cast<std::size_t>(width) * height * out.channels);
  if (tjDecompress2(tj, bytes.data(), static_cast<unsigned long>(bytes.size()), out.pixels.data(),
                    width, 0, height, gray ? TJPF_GRAY : TJPF_RGB,
                    TJFLAG_STOPONWARNING | TJFLAG_LIMITSCANS) != 0)
    throw DecodeError(std::string("a damaged or truncated JPEG: ") + tjGetErrorStr2(tj));
}

// Picks the 8-bit format libpng converts to (the image's channels, alpha
// kept for now) and sizes the buffer: all channels are read, and with alpha
// the colour ones are then moved down over them in place (each pixel's
// destination lies at or before its source).
void prepare_png(png_image& image, DecodedImage& out) {
  const bool color = (image.format & PNG_FORMAT_FLAG_COLOR) != 0;
  const bool alpha = (image.format & PNG_FORMAT_FLAG_ALPHA) != 0;
  image.format = color ? (alpha ? PNG_FORMAT_RGBA : PNG_FORMAT_RGB)
                       : (alpha ? PNG_FORMAT_GA : PNG_FORMAT_GRAY);
  out.channels = color ? 3 : 1;
  out.height = image.height;
  out.width = image.width;
  out.pixels.resize(static_cast<std::size_t>(image.width) * image.height *
                    (out.channels + (alpha ? 1 : 0)));
}

void decode_png(std::span<const std::uint8_t> bytes, DecodedImage& out) {
  png_image image;
  std::memset(&image, 0, sizeof image);
  image.version = PNG_IMAGE_VERSION;
  const auto fail = [&](const char* what) {
    const std::string message = fmt::format("{}: {}", what, image.message);
    png_image_free(&image);
    throw DecodeError(message);
  };
  if (!png_image_begin_read_from_memory(&image, bytes.data(), bytes.size()))
    fail("not a readable PNG");
  // From here until png_image_finish_read, libpng holds memory that only
  // png_image_free releases (the fuzzer found the leak of a too-large image).
  try {
    check_size("PNG", image.width, image.height);
    prepare_png(image, out);
  } catch (...) {
    png_image_free(&image);
    throw;
  }
  const bool alpha = (image.format & PNG_FORMAT_FLAG_ALPHA) != 0;
  const int stored = static_cast<int>(out.channels) + (alpha ? 1 : 0);
  const std::size_t pixels = static_cast<std::size_t>(image.width) * image.height;
  if (!png_image_finish_read(&image, nullptr, out.pixels.data(), 0, nullptr))
    fail("a damaged or truncated PNG");
  if (alpha) {
    for (std::size_t p = 0; p < pixels; ++p)
      for (int c = 0; c < stored - 1; ++c)
        out.pixels[p * (stored - 1) + c] = out.pixels[p * stored + c];
    out.pixels.resize(pixels * (stored - 1));
  }
}

}  // namespace

void decode_image(std::span<const std::uint8_t> bytes, DecodedImage& out) {
  static constexpr std::uint8_t kPng[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1A, '\n'};
  if (bytes.size() >= 3 && bytes[0] == 0xFF && bytes[1] == 0xD8 && bytes[2] == 0xFF)
    return decode_jpeg(bytes, out);
  if (bytes.size() >= 8 && std::equal(kPng, kPng + 8, bytes.begin())) return decode_png(bytes, out);
  throw DecodeError(
      fmt::format("{} bytes that start as neither a JPEG (FF D8 FF) nor a PNG does", bytes.size()));
}

}  // namespace lockstep::io
