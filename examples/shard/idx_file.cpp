// IdxFile and convert_idx (idx_file.h): the header is a magic number
// 0x0000TTDD (TT = 0x08, unsigned bytes; DD = number of dimensions) and DD
// big-endian 32-bit sizes.
#include "idx_file.h"

#include <fmt/core.h>
#include <fmt/format.h>
#include <zlib.h>

#include <algorithm>
#include <string>
#include <system_error>

#include "io/shard_writer.h"
#include "kernels/checked_math.h"
#include "kernels/error.h"
#include "progress.h"

namespace lockstep::examples {
namespace {

constexpr unsigned kUnsignedByte = 0x08;
constexpr std::int64_t kPieceBytes = 64 << 20;  // samples converted per append, in bytes

// Note [IDX sizes]: every size the header declares is checked before anything
// is sized from it: the product of the item dimensions and the item count
// with checked_mul (a crafted header once wrapped to 0 bytes per item, and
// the converter divided by it: SIGFPE), no dimension of 0, at most
// kMaxDims dimensions, and the data no larger than the file can hold: its
// bytes after the header when stored plain, at most kMaxInflation bytes per
// byte when gzipped (deflate's best ratio is 1032:1). So no buffer is ever
// larger than the file's contents can fill.
constexpr unsigned kMaxDims = 16;  // far more than any IDX dataset; HDF5's limit is 32
constexpr std::int64_t kMaxInflation = 1100;

}  // namespace

IdxFile::IdxFile(std::filesystem::path path) : path_(std::move(path)) {
  file_ = gzopen(path_.c_str(), "rb");
  if (!file_)
    throw IoError("cannot open IDX file '" + path_.string() +
                  "' (install dataset-fashion-mnist, or pass --src)");
  auto read_u32 = [this] {
    unsigned char b[4];
    if (gzread(static_cast<gzFile>(file_), b, 4) != 4)
      throw IoError("IDX file '" + path_.string() + "' ends inside its header");
    return std::uint32_t{b[0]} << 24 | std::uint32_t{b[1]} << 16 | std::uint32_t{b[2]} << 8 | b[3];
  };
  try {
    const std::uint32_t magic = read_u32();
    const unsigned type = (magic >> 8) & 0xff, rank = magic & 0xff;
    if ((magic >> 16) != 0 || type != kUnsignedByte || rank < 1)
      throw IoError("'" + path_.string() + "' is not an IDX file of unsigned bytes (magic " +
                    std::to_string(magic) + ")");
    if (rank > kMaxDims)
      throw IoError(fmt::format(
          "IDX file '{}' declares {} dimensions, more than the {} lockstep-shard converts (a "
          "damaged or crafted header; re-install the file)",
          path_.string(), rank, kMaxDims));
    for (unsigned i = 0; i < rank; ++i) dims_.push_back(read_u32());
    // Note [IDX sizes]
    const std::string file = "IDX file '" + path_.string() + "'";
    for (std::size_t i = 1; i < dims_.size(); ++i) {
      if (dims_[i] == 0)
        throw IoError(fmt::format(
            "{} declares items of shape [{}] with a dimension of 0 (a damaged or crafted header; "
            "re-install the file)",
            file, fmt::join(dims_.begin() + 1, dims_.end(), ", ")));
      item_bytes_ = checked_mul(item_bytes_, dims_[i], (file + ": the bytes of one item").c_str());
    }
    const std::int64_t data_bytes =
        checked_mul(dims_[0], item_bytes_, (file + ": the bytes of all items").c_str());
    std::error_code error;
    const auto file_bytes = static_cast<std::int64_t>(std::filesystem::file_size(path_, error));
    if (error) throw IoError(file + ": cannot read its size: " + error.message());
    const std::int64_t header_bytes = 4 * (1 + static_cast<std::int64_t>(rank));
    const bool plain = gzdirect(static_cast<gzFile>(file_)) == 1;
    const std::int64_t most = plain ? file_bytes - header_bytes : file_bytes * kMaxInflation;
    if (data_bytes > most)
      throw IoError(fmt::format(
          "{} declares {} items of {} bytes ({} bytes), more than its {} bytes{} can hold (a "
          "damaged, truncated or crafted file; re-install it)",
          file, dims_[0], item_bytes_, data_bytes, file_bytes, plain ? "" : " of gzip"));
  } catch (...) {
    gzclose(static_cast<gzFile>(file_));
    throw;
  }
}

IdxFile::~IdxFile() { gzclose(static_cast<gzFile>(file_)); }

void IdxFile::read(std::int64_t count, std::uint8_t* out) {
  std::int64_t left = checked_mul(count, item_bytes_, "IdxFile::read: the bytes to read");
  while (left > 0) {
    const int piece = static_cast<int>(std::min<std::int64_t>(left, 1 << 30));
    const int got = gzread(static_cast<gzFile>(file_), out, static_cast<unsigned>(piece));
    if (got <= 0)
      throw IoError("IDX file '" + path_.string() + "' ends early or is corrupt (re-install it)");
    out += got;
    left -= got;
  }
}

void convert_idx(const std::filesystem::path& images_path, const std::filesystem::path& labels_path,
                 const std::filesystem::path& out, int shards, const std::string& split) {
  IdxFile images(images_path), labels(labels_path);
  const std::int64_t count = images.dims()[0];
  if (labels.dims().size() != 1 || labels.dims()[0] != count)
    throw IoError(fmt::format("'{}' holds {} images but '{}' holds {} labels", images_path.string(),
                              count, labels_path.string(), labels.dims()[0]));
  if (shards > count)
    throw InvalidArgument(fmt::format("--shards {} is more than the {} samples of '{}'", shards,
                                      count, images_path.string()));
  io::ShardFormat format{DType::u8, {1}, DType::i64};
  for (std::size_t i = 1; i < images.dims().size(); ++i)
    format.sample_shape.push_back(images.dims()[i]);
  io::DatasetWriter writer(out, format, count, shards, split);
  Progress progress(split, count);
  // At least one item, at most all of them (Note [IDX sizes] bounds both).
  const std::int64_t piece = std::clamp<std::int64_t>(kPieceBytes / images.item_bytes(), 1, count);
  std::vector<std::uint8_t> pixels(static_cast<std::size_t>(piece * images.item_bytes()));
  std::vector<std::uint8_t> raw_labels(static_cast<std::size_t>(piece));
  std::vector<std::int64_t> wide_labels(static_cast<std::size_t>(piece));
  for (std::int64_t done = 0; done < count;) {
    const std::int64_t n = std::min(piece, count - done);
    images.read(n, pixels.data());
    labels.read(n, raw_labels.data());
    for (std::int64_t i = 0; i < n; ++i) wide_labels[i] = raw_labels[i];
    writer.append(pixels.data(), wide_labels.data(), n);
    done += n;
    progress.update(done);
  }
  writer.close();
}

}  // namespace lockstep::examples
