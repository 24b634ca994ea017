// IdxFile (idx_file.h): the header is a magic number 0x0000TTDD (TT = 0x08,
// unsigned bytes; DD = number of dimensions) and DD big-endian 32-bit sizes.
#include "idx_file.h"

#include <zlib.h>

#include <string>

#include "kernels/error.h"

namespace lockstep::examples {
namespace {

constexpr unsigned kUnsignedByte = 0x08;

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
    for (unsigned i = 0; i < rank; ++i) dims_.push_back(read_u32());
  } catch (...) {
    gzclose(static_cast<gzFile>(file_));
    throw;
  }
}

IdxFile::~IdxFile() { gzclose(static_cast<gzFile>(file_)); }

std::int64_t IdxFile::item_bytes() const {
  std::int64_t bytes = 1;
  for (std::size_t i = 1; i < dims_.size(); ++i) bytes *= dims_[i];
  return bytes;
}

void IdxFile::read(std::int64_t count, std::uint8_t* out) {
  std::int64_t left = count * item_bytes();
  while (left > 0) {
    const int piece = static_cast<int>(std::min<std::int64_t>(left, 1 << 30));
    const int got = gzread(static_cast<gzFile>(file_), out, static_cast<unsigned>(piece));
    if (got <= 0)
      throw IoError("IDX file '" + path_.string() + "' ends early or is corrupt (re-install it)");
    out += got;
    left -= got;
  }
}

}  // namespace lockstep::examples
