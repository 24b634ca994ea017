// Checkpoint files (engine/checkpoint_file.h): HDF5 writing (in memory, Note
// [checkpoint image]) and reading through io/hdf5.h, CRC-32 (zlib) checksums,
// the commit sequence through engine/core/output_file.h, and retention.
#include "engine/checkpoint_file.h"

#include <fcntl.h>
#include <fmt/core.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>

#include "engine/core/log.h"
#include "engine/core/output_file.h"
#include "io/hdf5.h"
#include "kernels/checked_math.h"

namespace lockstep::engine {
namespace fs = std::filesystem;
namespace {

using io::Hdf5Id;
using io::Hdf5Lock;

std::string quoted(const fs::path& path) { return fmt::format("'{}'", path.string()); }

struct Checksum {
  std::uint32_t crc = 0;
  std::uint64_t size = 0;
};

Checksum checksum_of(const fs::path& file) {
  const int fd = ::open(file.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw IoError("cannot read checkpoint " + quoted(file) + ": " + std::strerror(errno));
  Checksum sum;
  sum.crc = static_cast<std::uint32_t>(crc32(0L, Z_NULL, 0));
  std::vector<unsigned char> chunk(1 << 20);
  for (;;) {
    const ssize_t got = ::read(fd, chunk.data(), chunk.size());
    if (got < 0 && errno == EINTR) continue;
    if (got < 0) {
      const int error = errno;
      ::close(fd);
      throw IoError("cannot read checkpoint " + quoted(file) + ": " + std::strerror(error));
    }
    if (got == 0) break;
    sum.crc = static_cast<std::uint32_t>(crc32(sum.crc, chunk.data(), static_cast<uInt>(got)));
    sum.size += static_cast<std::uint64_t>(got);
  }
  ::close(fd);
  return sum;
}

fs::path checksum_path(const fs::path& file) { return fs::path(file.string() + ".crc32"); }

void write_attribute(hid_t root, const std::string& name, const AttributeValue& value) {
  Hdf5Id space(LOCKSTEP_CHECK_HDF5(H5Screate(H5S_SCALAR)));
  Hdf5Id type, attribute;
  const void* data = nullptr;
  std::string text;
  if (const auto* i = std::get_if<std::int64_t>(&value)) {
    type = Hdf5Id(LOCKSTEP_CHECK_HDF5(H5Tcopy(H5T_STD_I64LE)));
    data = i;
  } else if (const auto* d = std::get_if<double>(&value)) {
    type = Hdf5Id(LOCKSTEP_CHECK_HDF5(H5Tcopy(H5T_IEEE_F64LE)));
    data = d;
  } else {
    text = std::get<std::string>(value);
    if (text.empty()) text.push_back('\0');  // HDF5 strings have at least one byte
    type = Hdf5Id(LOCKSTEP_CHECK_HDF5(H5Tcopy(H5T_C_S1)));
    LOCKSTEP_CHECK_HDF5(H5Tset_size(type.get(), text.size()));
    data = text.data();
  }
  attribute = Hdf5Id(LOCKSTEP_CHECK_HDF5(
      H5Acreate2(root, name.c_str(), type.get(), space.get(), H5P_DEFAULT, H5P_DEFAULT)));
  LOCKSTEP_CHECK_HDF5(H5Awrite(attribute.get(), type.get(), data));
  attribute.close();
  type.close();
  space.close();
}

// Writes `contents` into the new file `file`, every status checked.
void write_contents(Hdf5Id& file, const CheckpointContents& contents) {
  Hdf5Lock lock;
  Hdf5Id link_props(LOCKSTEP_CHECK_HDF5(H5Pcreate(H5P_LINK_CREATE)));
  LOCKSTEP_CHECK_HDF5(H5Pset_create_intermediate_group(link_props.get(), 1));
  for (const auto& [name, tensor] : contents.tensors) {
    if (tensor.device().is_cuda())
      throw InvalidArgument("checkpoint tensor " + name + " is on " + tensor.device().str() +
                            " (copy it to the CPU first)");
    if (tensor.dtype() == DType::f16 || tensor.dtype() == DType::bf16)
      throw InvalidArgument(std::string("checkpoint tensor ") + name + " is " +
                            dtype_name(tensor.dtype()) + "; checkpoints store f32, i64, i32, u8");
    const std::vector<hsize_t> dims(tensor.shape().begin(), tensor.shape().end());
    Hdf5Id space(LOCKSTEP_CHECK_HDF5(
        dims.empty() ? H5Screate(H5S_SCALAR)
                     : H5Screate_simple(static_cast<int>(dims.size()), dims.data(), nullptr)));
    Hdf5Id type = io::file_type(tensor.dtype());
    Hdf5Id set(LOCKSTEP_CHECK_HDF5(H5Dcreate2(file.get(), name.c_str(), type.get(), space.get(),
                                              link_props.get(), H5P_DEFAULT, H5P_DEFAULT)));
    if (tensor.numel() > 0)
      LOCKSTEP_CHECK_HDF5(
          H5Dwrite(set.get(), type.get(), H5S_ALL, H5S_ALL, H5P_DEFAULT, tensor.data()));
    set.close();
    type.close();
    space.close();
  }
  link_props.close();
  for (const auto& [name, value] : contents.attributes) write_attribute(file.get(), name, value);
}

// Note [checkpoint image]: HDF5 builds a checkpoint in memory (the core
// driver without a backing store) and save() writes the file's image with
// engine/core/output_file.h's checked write(2)s. When HDF5 wrote the file itself, a
// full disk met in the flush of a dataset's close left that identifier open:
// the save failed as it should, and then HDF5 crashed at exit closing it
// (SIGSEGV in H5D_close from H5_term_library). In memory, nothing HDF5 does
// fails for want of space, every identifier is closed on every path, and
// each disk failure (space, quota, EIO) is one of lockstep's own writes, its
// fsync or a rename. The cost: a save holds the file's bytes once more in
// memory while it writes them.
std::vector<unsigned char> checkpoint_image(const CheckpointContents& contents,
                                            const fs::path& name) {
  std::size_t bytes = 64 << 10;  // the core driver's first allocation: the data and some metadata
  for (const auto& [tensor_name, tensor] : contents.tensors)
    bytes = checked_add(bytes, tensor.nbytes(), "checkpoint image size");
  Hdf5Lock lock;
  Hdf5Id access(LOCKSTEP_CHECK_HDF5(H5Pcreate(H5P_FILE_ACCESS)));
  LOCKSTEP_CHECK_HDF5(H5Pset_fapl_core(access.get(), bytes, /*backing_store=*/0));
  Hdf5Id file(
      LOCKSTEP_CHECK_HDF5(H5Fcreate(name.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, access.get())));
  access.close();
  write_contents(file, contents);
  LOCKSTEP_CHECK_HDF5(H5Fflush(file.get(), H5F_SCOPE_LOCAL));
  const ssize_t size = LOCKSTEP_CHECK_HDF5(H5Fget_file_image(file.get(), nullptr, 0));
  std::vector<unsigned char> image(static_cast<std::size_t>(size));
  LOCKSTEP_CHECK_HDF5(H5Fget_file_image(file.get(), image.data(), image.size()));
  file.close();
  return image;
}

// The line of a checksum file: "crc32 <8 hex digits> size <bytes>\n".
std::string checksum_line(const fs::path& data) {
  const Checksum sum = checksum_of(data);
  return fmt::format("crc32 {:08x} size {}\n", sum.crc, sum.size);
}

// The step of "ckpt-<step>.h5", or -1 for any other name.
std::int64_t step_of(const fs::path& file) {
  const std::string name = file.filename().string();
  const std::string prefix = "ckpt-", suffix = ".h5";
  if (name.size() <= prefix.size() + suffix.size() || name.rfind(prefix, 0) != 0 ||
      name.compare(name.size() - suffix.size(), suffix.size(), suffix) != 0)
    return -1;
  const std::string digits =
      name.substr(prefix.size(), name.size() - prefix.size() - suffix.size());
  // Exactly the names save() writes: no sign, no leading zero, at most 18 digits.
  if (digits.size() > 18 || digits.find_first_not_of("0123456789") != std::string::npos ||
      (digits.size() > 1 && digits[0] == '0'))
    return -1;
  return std::stoll(digits);
}

// Reads every dataset below `group_id` (relative names) within `budget` bytes in all.
std::map<std::string, core::Tensor> read_datasets(hid_t group_id, const std::string& object,
                                                  std::uint64_t budget) {
  std::map<std::string, core::Tensor> out;
  for (const std::string& name : io::dataset_names(group_id, object)) {
    const std::string where = object + ", dataset '" + name + "'";
    Hdf5Id set(LOCKSTEP_CHECK_HDF5(H5Dopen2(group_id, name.c_str(), H5P_DEFAULT)));
    core::Tensor t = io::read_tensor(set.get(), where, budget);
    budget -= t.nbytes();
    set.close();
    out[name] = std::move(t);
  }
  return out;
}

// What all of a file's datasets may decode to (Note [hostile files]).
std::uint64_t read_budget(const fs::path& file) {
  std::error_code ec;
  const std::uintmax_t bytes = fs::file_size(file, ec);
  return ec ? 0 : checked_mul<std::uint64_t>(io::kMaxExpansion, bytes, "read budget");
}

}  // namespace

CheckpointDirectory::CheckpointDirectory(fs::path dir, int keep_last, CheckpointStart start,
                                         CheckpointLock lock)
    : dir_(std::move(dir)), keep_last_(keep_last) {
  if (keep_last < 1)
    throw InvalidArgument("CheckpointDirectory: keep_last is " + std::to_string(keep_last) +
                          "; it must be at least 1");
  std::error_code ec;
  fs::create_directories(dir_, ec);
  if (ec) throw IoError("cannot create checkpoint directory " + quoted(dir_) + ": " + ec.message());
  if (lock == CheckpointLock::hold) lock_ = std::make_unique<DirectoryLock>(dir_);
  const auto existing = list();
  if (start == CheckpointStart::fresh && !existing.empty())
    throw CheckpointDirectoryInUse(
        fmt::format("checkpoint directory {} already holds {} checkpoint(s), the newest {}: a "
                    "fresh run would mix its checkpoints with them and prune them. Resume that "
                    "run (CheckpointStart::resume), use another directory, or remove them",
                    quoted(dir_), existing.size(), existing.back().filename().string()),
        existing.back());
}

fs::path CheckpointDirectory::save(std::int64_t step, const CheckpointContents& contents) const {
  if (step < 0) throw InvalidArgument("checkpoint step " + std::to_string(step) + " is negative");
  const std::string name = "ckpt-" + std::to_string(step) + ".h5";
  const fs::path final_path = dir_ / name;
  const fs::path tmp = dir_ / ("." + name + ".tmp");
  const fs::path sum_tmp = dir_ / ("." + name + ".crc32.tmp");
  // Note [checkpoint lock]: without it, a temporary may be another run's.
  for (const fs::path& stale : {tmp, sum_tmp})
    if (lock_ && core::remove_temporary(stale))
      core::log_warn("removed the leftover temporary {} (an earlier save was cut short)",
                     quoted(stale));
  // Only what this save created is removed on failure: something that
  // appears at a temporary name meanwhile is another writer's.
  bool created = false, sum_created = false;
  try {
    const std::vector<unsigned char> image = checkpoint_image(contents, tmp);
    const int image_fd = core::create_exclusive(tmp);  // Note [exclusive creation] in io/hdf5.cpp
    created = true;
    try {
      core::write_all(image_fd, image.data(), image.size(), tmp);
    } catch (...) {
      ::close(image_fd);
      throw;
    }
    core::sync_and_close(image_fd, tmp);
    const std::string line = checksum_line(tmp);
    const int fd = core::create_exclusive(sum_tmp);
    sum_created = true;
    try {
      core::write_all(fd, line.data(), line.size(), sum_tmp);
    } catch (...) {
      ::close(fd);
      throw;
    }
    core::sync_and_close(fd, sum_tmp);
    core::commit_rename(sum_tmp, checksum_path(final_path));
    sum_created = false;
    core::commit_rename(tmp, final_path);
  } catch (...) {
    if (created) core::remove_temporary(tmp);
    if (sum_created) core::remove_temporary(sum_tmp);
    try {
      throw;
    } catch (const Error& e) {
      throw IoError(
          fmt::format("saving checkpoint {} in {} failed; earlier checkpoints are "
                      "untouched: {}",
                      name, quoted(dir_), e.what()));
    }
  }

  std::vector<fs::path> older;
  std::size_t newer = 0;
  for (const fs::path& p : list()) {
    if (step_of(p) < step) older.push_back(p);
    if (step_of(p) > step) ++newer;
  }
  if (newer > 0)
    core::log_warn(
        "checkpoint directory {} holds {} checkpoint(s) newer than step {} (from an "
        "attempt that went further); they are left in place",
        quoted(dir_), newer, step);
  // keep_last counts the checkpoint just written: keep keep_last - 1 older ones.
  const std::size_t keep_older = static_cast<std::size_t>(keep_last_) - 1;
  for (std::size_t i = 0; i + keep_older < older.size(); ++i) {
    std::error_code ignored;  // a checkpoint that cannot be pruned only wastes space
    fs::remove(older[i], ignored);
    fs::remove(checksum_path(older[i]), ignored);
  }
  return final_path;
}

std::vector<fs::path> CheckpointDirectory::list() const {
  std::vector<fs::path> found;
  std::error_code ec;
  for (fs::directory_iterator it(dir_, ec), end; !ec && it != end; it.increment(ec))
    if (step_of(it->path()) >= 0) found.push_back(it->path());
  std::sort(found.begin(), found.end(),
            [](const fs::path& a, const fs::path& b) { return step_of(a) < step_of(b); });
  return found;
}

std::optional<fs::path> CheckpointDirectory::latest_good() const {
  const auto all = list();
  for (auto it = all.rbegin(); it != all.rend(); ++it) {
    try {
      verify_checkpoint(*it);
      return *it;
    } catch (const IoError& e) {
      core::log_warn("skipping checkpoint {}: {}", it->string(), e.what());
    }
  }
  return std::nullopt;
}

std::string verify_checkpoint(const fs::path& file) {
  const fs::path sum_file = checksum_path(file);
  char line[128] = {};
  std::FILE* in = std::fopen(sum_file.c_str(), "r");
  const bool read = in && std::fgets(line, sizeof line, in);
  if (in) std::fclose(in);
  unsigned crc = 0;
  std::uint64_t size = 0;
  if (!read || std::sscanf(line, "crc32 %8x size %20lu", &crc, &size) != 2)
    throw IoError("checkpoint " + quoted(file) + " has no valid checksum file " + quoted(sum_file) +
                  " (it was cut short, or is not a lockstep checkpoint)");
  const Checksum actual = checksum_of(file);
  if (actual.crc != crc || actual.size != size)
    throw IoError(
        fmt::format("checkpoint {} is corrupt: {} bytes with CRC-32 {:08x}, expected {} "
                    "bytes with CRC-32 {:08x} (use an earlier checkpoint)",
                    quoted(file), actual.size, actual.crc, size, crc));
  return fmt::format("crc32 {:08x} size {}", crc, size);
}

CheckpointContents read_checkpoint(const fs::path& file) {
  verify_checkpoint(file);
  const std::string object = "checkpoint " + quoted(file);
  Hdf5Lock lock;
  try {
    Hdf5Id f = io::open_hdf5_file(file, "checkpoint");
    CheckpointContents contents;
    for (auto& [name, t] : read_datasets(f.get(), object, read_budget(file)))
      contents.tensors["/" + name] = std::move(t);
    for (const std::string& name : io::attribute_names(f.get(), object)) {
      Hdf5Id a(LOCKSTEP_CHECK_HDF5(H5Aopen(f.get(), name.c_str(), H5P_DEFAULT)));
      contents.attributes[name] =
          io::read_scalar_attribute(a.get(), object + ", attribute '" + name + "'");
      a.close();
    }
    f.close();
    return contents;
  } catch (const LibraryError& e) {
    throw IoError(object + ": HDF5 cannot read it: " + e.what() + " (use an earlier checkpoint)");
  }
}

std::map<std::string, core::Tensor> read_group(const fs::path& file, const std::string& group,
                                               bool required) {
  const std::string object = "weights file " + quoted(file) + ", group '" + group + "'";
  Hdf5Lock lock;
  try {
    Hdf5Id f = io::open_hdf5_file(file, "weights file");
    if (LOCKSTEP_CHECK_HDF5(H5Lexists(f.get(), group.c_str(), H5P_DEFAULT)) == 0) {
      if (!required) return {};
      throw IoError(object +
                    " does not exist (weights go in /model/<parameter name>, see "
                    "docs/models.md)");
    }
    Hdf5Id g(LOCKSTEP_CHECK_HDF5(H5Gopen2(f.get(), group.c_str(), H5P_DEFAULT)));
    auto out = read_datasets(g.get(), object, read_budget(file));
    g.close();
    f.close();
    return out;
  } catch (const LibraryError& e) {
    throw IoError(object + ": HDF5 cannot read it: " + e.what() + " (the file is damaged)");
  }
}

std::map<std::string, AttributeValue> read_root_attributes(const fs::path& file,
                                                           const std::string& prefix) {
  const std::string object = "weights file " + quoted(file);
  Hdf5Lock lock;
  try {
    Hdf5Id f = io::open_hdf5_file(file, "weights file");
    std::map<std::string, AttributeValue> out;
    for (const std::string& name : io::attribute_names(f.get(), object)) {
      if (!name.starts_with(prefix)) continue;
      Hdf5Id a(LOCKSTEP_CHECK_HDF5(H5Aopen(f.get(), name.c_str(), H5P_DEFAULT)));
      out[name] = io::read_scalar_attribute(a.get(), object + ", attribute '" + name + "'");
      a.close();
    }
    f.close();
    return out;
  } catch (const LibraryError& e) {
    throw IoError(object + ": HDF5 cannot read its attributes: " + e.what() +
                  " (the file is damaged)");
  }
}

}  // namespace lockstep::engine
