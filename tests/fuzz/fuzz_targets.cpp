// The fuzzing entry points (tests/fuzz/fuzz_targets.h). Each input is written
// to one file in a directory of this process's own; any exception other than
// lockstep::Error escapes, and libFuzzer (or the replay test) reports it.
#include "tests/fuzz/fuzz_targets.h"

#include <fcntl.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <stdexcept>
#include <string>
#include <vector>

#include "engine/checkpoint_file.h"
#include "examples/shard/idx_file.h"
#include "examples/shard/text.h"
#include "io/dataset.h"
#include "io/image_decode.h"
#include "io/image_transform.h"
#include "tests/temp_dir.h"

namespace lockstep::fuzz {
namespace {

namespace fs = std::filesystem;

// Each input gets a directory of its own (test::TempDir, removed when the
// input is done, also when its code throws), not one directory for the whole
// process removed at exit: libFuzzer ends a run that reaches -runs without
// running atexit handlers (`fuzz_shard -runs=10` left its directory in
// /tmp), so every fuzzing run left one behind. A crashing input leaves its
// directory, beside the artifact libFuzzer writes. The directory's name has a
// fixed length (not the process id): paths appear in error messages, and the
// inputs a fixed seed tries must not depend on their length.
using Scratch = test::TempDir;

void write_file(const fs::path& path, const void* data, std::size_t size) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) throw std::runtime_error("fuzz: cannot write " + path.string());
  const auto* p = static_cast<const char*>(data);
  while (size > 0) {
    const ssize_t n = ::write(fd, p, size);
    if (n <= 0) {
      ::close(fd);
      throw std::runtime_error("fuzz: cannot write " + path.string());
    }
    p += n;
    size -= static_cast<std::size_t>(n);
  }
  ::close(fd);
}

// Decodes `bytes` and takes three crops of it, as the loader's workers would.
void decode_and_crop(std::span<const std::uint8_t> bytes) {
  io::DecodedImage image;
  io::decode_image(bytes, image);
  const io::PixelView view{
      image.pixels.data(),          image.channels, image.height, image.width, 1,
      image.width * image.channels, image.channels};
  std::vector<float> out(static_cast<std::size_t>(image.channels) * 8 * 8);
  for (const io::CropKind crop : {io::CropKind::random_resized, io::CropKind::center}) {
    const io::ImageOptions options{
        .channels = image.channels, .height = 8, .width = 8, .crop = crop, .flip = true};
    io::crop_resize_normalize(view, io::choose_crop(options, image.height, image.width, 0, 1),
                              options, out.data());
  }
  // The loader's path (Note [scaled decode], Note [cropped decode]): the
  // header, then a 2 x 2 crop from the decode, at the scale it allows (1/8
  // from 16 pixels a side), of just the rows and columns the crop reads.
  const io::ImageHeader header = io::read_image_header(bytes);
  const io::ImageOptions small{.channels = header.channels, .height = 2, .width = 2};
  const io::CropBox box = io::choose_crop(small, header.height, header.width, 0, 1);
  const int scale = header.jpeg ? io::decode_scale(box, small) : 1;
  const io::CropBox scaled_box = io::scaled_box(box, scale);
  const std::int64_t height = (header.height + scale - 1) / scale;
  const std::int64_t width = (header.width + scale - 1) / scale;
  io::DecodedImage part;
  io::decode_image_region(bytes, part, scale,
                          io::crop_source_region(scaled_box, small, height, width));
  const io::PixelView cropped{
      part.pixels.data(),         part.channels, part.image_height, part.image_width, 1,
      part.width * part.channels, part.channels, part.y0,           part.x0};
  io::crop_resize_normalize(cropped, scaled_box, small, out.data());
  // A region drawn from the input's first bytes, decoded (damaged files reach
  // it too: the whole decode below may throw), then checked against the
  // whole decode's pixels wherever that succeeds.
  std::uint64_t draw = 0;
  for (std::size_t i = 0; i < std::min<std::size_t>(bytes.size(), 64); ++i)
    draw = draw * 1099511628211u + bytes[i];
  const std::int64_t x = static_cast<std::int64_t>(draw % static_cast<std::uint64_t>(width));
  const std::int64_t y =
      static_cast<std::int64_t>((draw >> 16) % static_cast<std::uint64_t>(height));
  const io::PixelRegion region{x, y, 1 + static_cast<std::int64_t>((draw >> 32) % (width - x)),
                               1 + static_cast<std::int64_t>((draw >> 48) % (height - y))};
  io::decode_image_region(bytes, part, scale, region);
  io::decode_image(bytes, image, scale);
  for (std::int64_t r = region.y; r < region.y + region.height; ++r)
    for (std::int64_t c = region.x; c < region.x + region.width; ++c)
      for (std::int64_t k = 0; k < image.channels; ++k)
        if (part.pixels[((r - part.y0) * part.width + c - part.x0) * part.channels + k] !=
            image.pixels[(r * image.width + c) * image.channels + k])
          throw std::logic_error("decode_image_region's pixel (" + std::to_string(r) + ", " +
                                 std::to_string(c) + ") is not decode_image's");
}

void read_some_rows(const io::Dataset& data) {
  const std::int64_t n = data.size();
  if (n == 0) return;
  const std::vector<std::int64_t> rows = {0, n / 2, n - 1, 0};
  if (data.format().encoded) {
    std::vector<std::uint8_t> bytes;
    for (const std::int64_t row : rows) {
      data.read_encoded(row, bytes);
      try {
        decode_and_crop(bytes);
      } catch (const io::DecodeError&) {
      }
    }
    data.check_labels(10);
    return;
  }
  std::vector<std::byte> out(rows.size() * data.sample_bytes());
  data.read_inputs(rows, out.data());
  data.check_labels(10);
}

}  // namespace

int shard_input(const std::uint8_t* data, std::size_t size) {
  const Scratch scratch;
  const fs::path file = scratch / "input.h5";
  write_file(file, data, size);
  for (bool force_hdf5 : {false, true}) {
    try {
      read_some_rows(io::Dataset::open(file, {.force_hdf5 = force_hdf5}));
    } catch (const Error&) {
    }
  }
  return 0;
}

int image_input(const std::uint8_t* data, std::size_t size) {
  try {
    decode_and_crop({data, size});
  } catch (const Error&) {
  }
  return 0;
}

int checkpoint_input(const std::uint8_t* data, std::size_t size) {
  const Scratch scratch;
  const fs::path file = scratch / "ckpt-1.h5";
  write_file(file, data, size);
  const auto crc = crc32(crc32(0L, Z_NULL, 0), data, static_cast<uInt>(size));
  char line[64];
  const int length = std::snprintf(line, sizeof line, "crc32 %08lx size %zu\n", crc, size);
  write_file(file.string() + ".crc32", line, static_cast<std::size_t>(length));
  try {
    engine::read_checkpoint(file);
  } catch (const Error&) {
  }
  try {
    engine::read_group(file, "/model", false);
  } catch (const Error&) {
  }
  return 0;
}

int convert_input(const std::uint8_t* data, std::size_t size) {
  const Scratch scratch;
  const fs::path images = scratch / "images.idx", labels = scratch / "labels.idx";
  const fs::path out = scratch / "shards";
  write_file(images, data, size);
  // An IDX header of labels: magic 0x00000801, then the count bytes 4-7 of
  // the images (gunzipped when gzipped) declare; as many labels as that, up
  // to 64 Ki (more is a labels file too short for its header: an error).
  std::vector<std::uint8_t> label_file = {0, 0, 8, 1, 0, 0, 0, 0};
  std::uint8_t head[8] = {};
  if (gzFile gz = gzopen(images.c_str(), "rb")) {
    if (gzread(gz, head, sizeof head) < 0) head[4] = head[5] = head[6] = head[7] = 0;
    gzclose(gz);
  }
  std::uint32_t count = 0;
  for (std::size_t i = 4; i < 8; ++i) {
    label_file[i] = head[i];
    count = count << 8 | head[i];
  }
  label_file.resize(8 + std::min<std::uint32_t>(count, 1 << 16), 3);
  write_file(labels, label_file.data(), label_file.size());
  try {
    examples::convert_idx(images, labels, out, 1, "train");
  } catch (const Error&) {
  }
  if (size < 3) return 0;
  TextOptions text_options;
  text_options.sources = {images};
  text_options.out = out / "text";
  text_options.seq = 1 + data[0] % 64;
  text_options.shards = 1 + data[1] % 4;
  text_options.val_fraction = 0.1 * (data[2] % 5);
  std::error_code ignored;
  fs::remove_all(out, ignored);
  try {
    text(text_options);
  } catch (const Error&) {
  }
  return 0;
}

}  // namespace lockstep::fuzz
