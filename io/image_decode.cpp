// decode_image and decode_image_region (io/image_decode.h).
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
// failure, the thread's TurboJPEG handle is replaced (below). The cropped
// decode keeps the same rules through libjpeg's API (Note [cropped decode]):
// its errors longjmp to a C-like frame that returns them as a value.
#include "io/image_decode.h"

#include <png.h>
#include <turbojpeg.h>

#include <cstdio>  // jpeglib.h needs FILE declared
// clang-format off
#include <jpeglib.h>
// clang-format on

#include <fmt/core.h>

#include <algorithm>
#include <csetjmp>
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

// Note [cropped decode]: decode_image_region decodes a JPEG through
// libjpeg's own API, which TurboJPEG 2.1 lacks the calls for:
// jpeg_crop_scanline for the columns (libjpeg moves the first one back to
// an iMCU boundary and says where it is), jpeg_skip_scanlines for the rows above (entropy-
// decoded, as they must be, but no inverse DCT, upsampling or colour
// conversion), then only the rows the region needs; the rows below are never
// read. The region's columns are first widened by kCropMarginColumns a
// side (clamped to the image), because libjpeg-turbo's fancy upsampling
// (h2v1 and h2v2, i.e. 4:2:2 and 4:2:0, wherever the scaled decode still
// upsamples chroma) treats the cropped column range's edges as the image's:
// it replicates the edge chroma sample where the full decode mixes in the
// neighbour, so the first and last decoded columns are not the full
// decode's. Measured (libjpeg-turbo 2.1.5, a textured 203 x 157 image, every
// 13 x 11 region at every column and every 5th row, at 1/1, 1/2, 1/4, 1/8):
// without the margin, 4:2:2 differs at 1/1, 1/2 and 1/4 and 4:2:0 at 1/1
// (4:2:0's chroma needs no upsampling at 1/2 and below), by as much as 26
// levels in the samples printed, and only ever in the first or last decoded
// column; gray, 4:4:4, 4:4:0 (chroma upsampled vertically only) and 4:1:1
// never differ. The rows need no
// margin: jpeg_skip_scanlines keeps h2v2's context rows, and no full-width
// band of 1 to 3 rows at any row differed (4:2:0, 4:2:2, 4:4:0; 150, 157
// and 160 rows; every scale). One more rule: the decoded columns are at least
// kMinCropColumns wide. A 1-column region at the 4:2:0 image's bottom-left
// corner, decoded 2 columns wide, differed (as if chroma rows of at most 2
// samples were upsampled by replication, not the fancy filter); with 16,
// every 1- to 3-column region at every column, in rows 0, 1, the middle and
// the last two, matched for 4:2:0, 4:2:2, 4:4:0 and 4:4:4, baseline and
// progressive, at every scale. tests/io/test_images.cpp checks the
// regions' pixels exactly, not the margin's. The crop then reads the part through
// PixelView's first_row and first_column (io/image_transform.h): its taps
// are placed in the whole image's coordinates and only the whole-pixel
// offsets are shifted, so every weight is the whole decode's too (shifting
// the box's double x and y by the origin instead could round a position,
// and so a weight, differently).
// Parameters match TurboJPEG's tjDecompress2 with the flags decode_image
// passes (islow DCT, fancy upsampling, block smoothing, RGB or gray out), so
// the region's pixels are the full decode's byte for byte
// (tests/io/test_images.cpp: gray, 4:4:4, 4:2:2, 4:2:0, progressive, every
// scale, boxes at the edges and corners). The safety rules are Note
// [decoding hostile images]'s, by other means: the error manager's
// error_exit longjmps back to the call that set it (jpeg_call below, kept
// free of C++ objects with destructors, which a longjmp would skip); its
// emit_message makes every warning an error (TurboJPEG's
// TJFLAG_STOPONWARNING); a progress monitor refuses a JPEG of more than
// kMaxScans scans (TJFLAG_LIMITSCANS's 500); the header's size is checked
// before jpeg_start_decompress allocates. What it gives up: damage below
// the region's last row is never read, so such a file decodes where
// decode_image would throw (the pixels given are still the file's, never
// libjpeg's grey fill, since any warning before them is an error).
constexpr std::int64_t kCropMarginColumns = 1, kMinCropColumns = 16;
constexpr int kMaxScans = 500;

struct JpegErrors {
  jpeg_error_mgr manager;  // first: libjpeg's cinfo->err points here
  std::jmp_buf jump;
  char message[JMSG_LENGTH_MAX];
};

void jpeg_error_exit(j_common_ptr cinfo) {
  auto* errors = reinterpret_cast<JpegErrors*>(cinfo->err);
  (*cinfo->err->format_message)(cinfo, errors->message);
  std::longjmp(errors->jump, 1);
}

// Warnings (level -1) are errors, as TJFLAG_STOPONWARNING makes them; trace
// messages (levels 1 and up) are dropped.
void jpeg_emit_message(j_common_ptr cinfo, int level) {
  if (level < 0) jpeg_error_exit(cinfo);
}

void jpeg_limit_scans(j_common_ptr cinfo) {
  if (!cinfo->is_decompressor) return;
  const int scans = reinterpret_cast<j_decompress_ptr>(cinfo)->input_scan_number;
  if (scans <= kMaxScans) return;
  auto* errors = reinterpret_cast<JpegErrors*>(cinfo->err);
  std::snprintf(errors->message, sizeof errors->message,
                "a progressive JPEG of more than %d scans (a decoding-time bomb)", kMaxScans);
  std::longjmp(errors->jump, 1);
}

// One libjpeg decompression; destroyed however the decode ends.
struct JpegDecompress {
  jpeg_decompress_struct cinfo;
  JpegErrors errors;
  jpeg_progress_mgr progress;

  JpegDecompress() {
    std::memset(&cinfo, 0, sizeof cinfo);
    cinfo.err = jpeg_std_error(&errors.manager);
    errors.manager.error_exit = jpeg_error_exit;
    errors.manager.emit_message = jpeg_emit_message;
    errors.message[0] = '\0';
    std::memset(&progress, 0, sizeof progress);
    progress.progress_monitor = jpeg_limit_scans;
  }
  ~JpegDecompress() { jpeg_destroy_decompress(&cinfo); }  // a no-op before create
  JpegDecompress(const JpegDecompress&) = delete;
  JpegDecompress& operator=(const JpegDecompress&) = delete;
};

// The steps of a cropped decode, each run by jpeg_call under setjmp.
enum class JpegStep { header, start, rows };

struct JpegRegionJob {
  std::span<const std::uint8_t> bytes;
  int scale_denominator = 1;
  J_COLOR_SPACE out_color_space = JCS_RGB;
  JDIMENSION x = 0, width = 0, y = 0, height = 0;  // the rows and columns asked, then decoded
  JSAMPROW* rows = nullptr;                        // rows: where each decoded row goes
};

// Note [cropped decode] (setjmp): nothing here has a destructor, and what the
// steps change lives in `d` and `job`, outside this frame.
bool jpeg_call(JpegDecompress& d, JpegRegionJob& job, JpegStep step) {
  if (setjmp(d.errors.jump)) return false;
  j_decompress_ptr cinfo = &d.cinfo;
  switch (step) {
    case JpegStep::header:
      jpeg_create_decompress(cinfo);
      cinfo->progress = &d.progress;
      jpeg_mem_src(cinfo, job.bytes.data(), static_cast<unsigned long>(job.bytes.size()));
      jpeg_read_header(cinfo, TRUE);
      return true;
    case JpegStep::start:
      cinfo->out_color_space = job.out_color_space;
      cinfo->scale_num = 1;
      cinfo->scale_denom = static_cast<unsigned int>(job.scale_denominator);
      jpeg_start_decompress(cinfo);
      jpeg_crop_scanline(cinfo, &job.x, &job.width);
      if (job.y > 0 && jpeg_skip_scanlines(cinfo, job.y) != job.y) return false;
      return true;
    case JpegStep::rows:
      for (JDIMENSION done = 0; done < job.height;) {
        const JDIMENSION read = jpeg_read_scanlines(cinfo, job.rows + done, job.height - done);
        if (read == 0) return false;
        done += read;
      }
      return true;
  }
  return false;
}

[[noreturn]] void jpeg_region_failure(const JpegDecompress& d, const char* what) {
  throw DecodeError(std::string(what) + (d.errors.message[0] != '\0'
                                             ? d.errors.message
                                             : "libjpeg stopped early without a message"));
}

void decode_jpeg_region(std::span<const std::uint8_t> bytes, DecodedImage& out,
                        int scale_denominator, const PixelRegion& region) {
  JpegDecompress d;
  JpegRegionJob job{.bytes = bytes, .scale_denominator = scale_denominator};
  if (!jpeg_call(d, job, JpegStep::header)) jpeg_region_failure(d, "not a readable JPEG: ");
  const jpeg_decompress_struct& cinfo = d.cinfo;
  check_size("JPEG", cinfo.image_width, cinfo.image_height);
  if (cinfo.jpeg_color_space == JCS_CMYK || cinfo.jpeg_color_space == JCS_YCCK)
    throw DecodeError("a CMYK JPEG (convert it to RGB, e.g. with PIL's convert(\"RGB\"))");
  if (cinfo.jpeg_color_space != JCS_GRAYSCALE && cinfo.jpeg_color_space != JCS_RGB &&
      cinfo.jpeg_color_space != JCS_YCbCr)
    throw DecodeError(fmt::format(
        "a JPEG of {} components in libjpeg colour space {} (only grayscale, YCbCr and RGB "
        "JPEGs are decoded: re-encode it as one)",
        cinfo.num_components, static_cast<int>(cinfo.jpeg_color_space)));
  const bool gray = cinfo.jpeg_color_space == JCS_GRAYSCALE;
  const std::int64_t d_scale = scale_denominator;
  const std::int64_t image_width = (cinfo.image_width + d_scale - 1) / d_scale;
  const std::int64_t image_height = (cinfo.image_height + d_scale - 1) / d_scale;
  if (region.width < 1 || region.height < 1 || region.x < 0 || region.y < 0 ||
      region.x + region.width > image_width || region.y + region.height > image_height)
    throw InvalidArgument(fmt::format(
        "decode_image_region: region [{}, {}) x [{}, {}) is empty or not within the {} x {} "
        "image (its size at 1/{}; clamp the region to it)",
        region.x, region.x + region.width, region.y, region.y + region.height, image_width,
        image_height, scale_denominator));
  std::int64_t x0 = std::max<std::int64_t>(region.x - kCropMarginColumns, 0);
  std::int64_t x1 = std::min(region.x + region.width + kCropMarginColumns, image_width);
  if (x1 - x0 < kMinCropColumns) {
    x1 = std::min(x0 + kMinCropColumns, image_width);
    x0 = std::max<std::int64_t>(x1 - kMinCropColumns, 0);
  }
  const std::int64_t y0 = region.y, y1 = region.y + region.height;
  job.out_color_space = gray ? JCS_GRAYSCALE : JCS_RGB;
  job.x = static_cast<JDIMENSION>(x0);
  job.width = static_cast<JDIMENSION>(x1 - x0);
  job.y = static_cast<JDIMENSION>(y0);
  job.height = static_cast<JDIMENSION>(y1 - y0);
  if (!jpeg_call(d, job, JpegStep::start)) jpeg_region_failure(d, "a damaged or truncated JPEG: ");
  if (job.x > x0 || job.x + job.width < x1)
    throw DecodeError(fmt::format("libjpeg cropped columns [{}, {}) for [{}, {})", job.x,
                                  job.x + job.width, x0, x1));
  out.channels = gray ? 1 : 3;
  out.width = job.width;
  out.height = job.height;
  out.x0 = job.x;
  out.y0 = job.y;
  out.image_width = image_width;
  out.image_height = image_height;
  const std::size_t row_bytes = static_cast<std::size_t>(out.width * out.channels);
  out.pixels.resize(row_bytes * static_cast<std::size_t>(out.height));
  thread_local std::vector<JSAMPROW> rows;
  rows.resize(static_cast<std::size_t>(out.height));
  for (std::size_t r = 0; r < rows.size(); ++r) rows[r] = out.pixels.data() + r * row_bytes;
  job.rows = rows.data();
  if (!jpeg_call(d, job, JpegStep::rows)) jpeg_region_failure(d, "a damaged or truncated JPEG: ");
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

void check_scale(const char* function, int scale_denominator) {
  if (scale_denominator != 1 && scale_denominator != 2 && scale_denominator != 4 &&
      scale_denominator != 8)
    throw InvalidArgument(
        fmt::format("{}: scale denominator {} is not 1, 2, 4 or 8", function, scale_denominator));
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
  check_scale("decode_image", scale_denominator);
  if (is_jpeg(bytes))
    decode_jpeg(bytes, out, scale_denominator);
  else if (is_png(bytes))
    decode_png(bytes, out);
  else
    unknown_format(bytes);
  out.x0 = out.y0 = 0;
  out.image_height = out.height;
  out.image_width = out.width;
}

void decode_image_region(std::span<const std::uint8_t> bytes, DecodedImage& out,
                         int scale_denominator, const PixelRegion& region) {
  check_scale("decode_image_region", scale_denominator);
  if (is_jpeg(bytes)) return decode_jpeg_region(bytes, out, scale_denominator, region);
  decode_image(bytes, out, 1);
}

}  // namespace lockstep::io
