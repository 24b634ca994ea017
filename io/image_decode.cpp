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
// JPEG of thousands of scans (a decoding-time bomb) is refused. After a
// failure, the thread's TurboJPEG handle is replaced (below).
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

// Note [decoding hostile images] (the handle): a failed TurboJPEG call can
// leave the handle so that the next, good, JPEG fails too (seen after a
// damaged one: "Unsupported marker type 0x81"), so a thread starts over with
// a new handle after any failure.
std::unique_ptr<void, TjHandleDeleter>& thread_handle() {
  thread_local std::unique_ptr<void, TjHandleDeleter> handle;
  return handle;
}

tjhandle thread_decompressor() {
  std::unique_ptr<void, TjHandleDeleter>& handle = thread_handle();
  if (!handle) handle.reset(tjInitDecompress());
  if (!handle)
    throw DecodeError(std::string("TurboJPEG cannot make a decompressor: ") +
                      tjGetErrorStr2(nullptr));
  return handle.get();
}

[[noreturn]] void jpeg_failure(tjhandle tj, const char* what) {
  const std::string message = what + std::string(tjGetErrorStr2(tj));
  thread_handle().reset();
  throw DecodeError(message);
}

void check_size(const char* kind, std::int64_t width, std::int64_t height) {
  if (width < 1 || height < 1 || width > kMaxDecodedPixels / height)
    throw DecodeError(
        fmt::format("the {} header declares {} x {} pixels (at most {} pixels, "
                    "each side at least 1)",
                    kind, width, height, kMaxDecodedPixels));
}

ImageHeader jpeg_header(tjhandle tj, std::span<const std::uint8_t> bytes) {
  int width = 0, height = 0, subsampling = 0, colorspace = 0;
  if (tjDecompressHeader3(tj, bytes.data(), static_cast<unsigned long>(bytes.size()), &width,
                          &height, &subsampling, &colorspace) != 0)
    jpeg_failure(tj, "not a readable JPEG: ");
  check_size("JPEG", width, height);
  if (colorspace == TJCS_CMYK || colorspace == TJCS_YCCK)
    throw DecodeError("a CMYK JPEG (convert it to RGB, e.g. with PIL's convert(\"RGB\"))");
  return {colorspace == TJCS_GRAY ? 1 : 3, height, width, true};
}

void decode_jpeg(std::span<const std::uint8_t> bytes, DecodedImage& out, int scale_denominator) {
  tjhandle tj = thread_decompressor();
  const ImageHeader header = jpeg_header(tj, bytes);
  const tjscalingfactor scale{1, scale_denominator};
  const int width = TJSCALED(static_cast<int>(header.width), scale);
  const int height = TJSCALED(static_cast<int>(header.height), scale);
  out.channels = header.channels;
  out.height = height;
  out.width = width;
  out.pixels.resize(static_cast<std::size_t>(width) * height * out.channels);
  // Asked for TJSCALED's size, tjDecompress2 picks exactly the factor 1/d.
  if (tjDecompress2(tj, bytes.data(), static_cast<unsigned long>(bytes.size()), out.pixels.data(),
                    width, 0, height, out.channels == 1 ? TJPF_GRAY : TJPF_RGB,
                    TJFLAG_STOPONWARNING | TJFLAG_LIMITSCANS) != 0)
    jpeg_failure(tj, "a damaged or truncated JPEG: ");
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

bool is_jpeg(std::span<const std::uint8_t> bytes) {
  return bytes.size() >= 3 && bytes[0] == 0xFF && bytes[1] == 0xD8 && bytes[2] == 0xFF;
}

bool is_png(std::span<const std::uint8_t> bytes) {
  static constexpr std::uint8_t kPng[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1A, '\n'};
  return bytes.size() >= 8 && std::equal(kPng, kPng + 8, bytes.begin());
}

[[noreturn]] void unknown_format(std::span<const std::uint8_t> bytes) {
  throw DecodeError(
      fmt::format("{} bytes that start as neither a JPEG (FF D8 FF) nor a PNG does", bytes.size()));
}

}  // namespace

ImageHeader read_image_header(std::span<const std::uint8_t> bytes) {
  if (is_jpeg(bytes)) return jpeg_header(thread_decompressor(), bytes);
  if (!is_png(bytes)) unknown_format(bytes);
  png_image image;
  std::memset(&image, 0, sizeof image);
  image.version = PNG_IMAGE_VERSION;
  if (!png_image_begin_read_from_memory(&image, bytes.data(), bytes.size())) {
    const std::string message = fmt::format("not a readable PNG: {}", image.message);
    png_image_free(&image);
    throw DecodeError(message);
  }
  const ImageHeader header{(image.format & PNG_FORMAT_FLAG_COLOR) != 0 ? 3 : 1, image.height,
                           image.width, false};
  png_image_free(&image);
  check_size("PNG", header.width, header.height);
  return header;
}

void decode_image(std::span<const std::uint8_t> bytes, DecodedImage& out, int scale_denominator) {
  if (scale_denominator != 1 && scale_denominator != 2 && scale_denominator != 4 &&
      scale_denominator != 8)
    throw InvalidArgument(
        fmt::format("decode_image: scale denominator {} is not 1, 2, 4 or 8", scale_denominator));
  if (is_jpeg(bytes)) return decode_jpeg(bytes, out, scale_denominator);
  if (is_png(bytes)) return decode_png(bytes, out);
  unknown_format(bytes);
}

}  // namespace lockstep::io
