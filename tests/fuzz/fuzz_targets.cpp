// The fuzzing entry points (tests/fuzz/fuzz_targets.h). Each input is written
// to one file in a directory of this process's own; any exception other than
// lockstep::Error escapes, and libFuzzer (or the replay test) reports it.
#include "tests/fuzz/fuzz_targets.h"

#include <fcntl.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
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

namespace lockstep::fuzz {
namespace {

namespace fs = std::filesystem;

// A name of fixed length (not the process id): paths appear in error
// messages, and the inputs a fixed seed tries must not depend on their length.
const fs::path& scratch_dir() {
  static const fs::path dir = [] {
    std::string name = (fs::temp_directory_path() / "lockstep-fuzz-XXXXXX").string();
    if (::mkdtemp(name.data()) == nullptr)
      throw std::runtime_error("fuzz: cannot make a directory like " + name);
    const fs::path d = name;
    std::atexit([] {
      std::error_code ignored;
      fs::remove_all(scratch_dir(), ignored);
    });
    return d;
  }();
  return dir;
}

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
  // The loader's path (Note [scaled decode]): the header, then a 2 x 2 crop
  // from the decode at the scale it allows (1/8 from 16 pixels a side).
  const io::ImageHeader header = io::read_image_header(bytes);
  const io::ImageOptions small{.channels = header.channels, .height = 2, .width = 2};
  const io::CropBox box = io::choose_crop(small, header.height, header.width, 0, 1);
  const int scale = header.jpeg ? io::decode_scale(box, small) : 1;
  io::decode_image(bytes, image, scale);
  const io::PixelView scaled{
      image.pixels.data(),          image.channels, image.height, image.width, 1,
      image.width * image.channels, image.channels};
  io::crop_resize_normalize(scaled, io::scaled_box(box, scale), small, out.data());
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
  const fs::path file = scratch_dir() / "input.h5";
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
  const fs::path file = scratch_dir() / "ckpt-1.h5";
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
  const fs::path images = scratch_dir() / "images.idx", labels = scratch_dir() / "labels.idx";
  const fs::path out = scratch_dir() / "shards";
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
  std::error_code ignored;
  fs::remove_all(out, ignored);
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
  fs::remove_all(out, ignored);
  try {
    text(text_options);
  } catch (const Error&) {
  }
  return 0;
}

}  // namespace lockstep::fuzz
