// Checkpoint files (engine/checkpoint_file.h): HDF5 writing and reading under
// io's HDF5 lock, CRC-32 (zlib) checksums, and the commit sequence.
#include "engine/checkpoint_file.h"

#include <fcntl.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>

#include "engine/core/log.h"
#include "io/check_hdf5.h"

namespace lockstep::engine {
namespace fs = std::filesystem;
namespace {

using io::Hdf5Lock;

// Closes an HDF5 handle when it goes out of scope.
class Handle {
 public:
  Handle(hid_t id, herr_t (*close)(hid_t)) : id_(id), close_(close) {}
  ~Handle() {
    if (id_ >= 0) close_(id_);
  }
  Handle(const Handle&) = delete;
  Handle& operator=(const Handle&) = delete;
  operator hid_t() const { return id_; }

 private:
  hid_t id_;
  herr_t (*close_)(hid_t);
};

void fsync_path(const fs::path& path, bool directory) {
  const int fd = ::open(path.c_str(), directory ? (O_RDONLY | O_DIRECTORY) : O_RDONLY);
  if (fd < 0 || ::fsync(fd) != 0) {
    if (fd >= 0) ::close(fd);
    throw IoError("cannot fsync " + path.string() + ": " + std::strerror(errno));
  }
  ::close(fd);
}

struct Checksum {
  std::uint32_t crc = 0;
  std::uintmax_t size = 0;
};

Checksum checksum_of(const fs::path& file) {
  std::ifstream in(file, std::ios::binary);
  if (!in) throw IoError("cannot read " + file.string());
  Checksum sum;
  sum.crc = static_cast<std::uint32_t>(crc32(0L, Z_NULL, 0));
  std::vector<char> chunk(1 << 20);
  while (in) {
    in.read(chunk.data(), static_cast<std::streamsize>(chunk.size()));
    const auto got = static_cast<uInt>(in.gcount());
    sum.crc =
        static_cast<std::uint32_t>(crc32(sum.crc, reinterpret_cast<Bytef*>(chunk.data()), got));
    sum.size += got;
  }
  return sum;
}

fs::path checksum_path(const fs::path& file) { return fs::path(file.string() + ".crc32"); }

hid_t hdf5_type(DType t) {
  switch (t) {
    case DType::f32:
      return H5T_IEEE_F32LE;
    case DType::i64:
      return H5T_STD_I64LE;
    case DType::i32:
      return H5T_STD_I32LE;
    case DType::u8:
      return H5T_STD_U8LE;
    default:
      break;
  }
  throw InvalidArgument(std::string("checkpoint tensors must be f32, i64, i32 or u8, got ") +
                        dtype_name(t));
}

DType dtype_of(hid_t type, const std::string& where) {
  const H5T_class_t cls = H5Tget_class(type);
  const std::size_t size = H5Tget_size(type);
  if (cls == H5T_FLOAT && size == 4) return DType::f32;
  if (cls == H5T_INTEGER && size == 8 && H5Tget_sign(type) == H5T_SGN_2) return DType::i64;
  if (cls == H5T_INTEGER && size == 4 && H5Tget_sign(type) == H5T_SGN_2) return DType::i32;
  if (cls == H5T_INTEGER && size == 1 && H5Tget_sign(type) == H5T_SGN_NONE) return DType::u8;
  throw IoError(where +
                ": unsupported HDF5 element type (expected float32, int64, int32 or uint8)");
}

void write_attribute(hid_t root, const std::string& name, const AttributeValue& value) {
  Handle space(LOCKSTEP_CHECK_HDF5(H5Screate(H5S_SCALAR)), H5Sclose);
  if (const auto* i = std::get_if<std::int64_t>(&value)) {
    Handle a(LOCKSTEP_CHECK_HDF5(
                 H5Acreate2(root, name.c_str(), H5T_STD_I64LE, space, H5P_DEFAULT, H5P_DEFAULT)),
             H5Aclose);
    LOCKSTEP_CHECK_HDF5(H5Awrite(a, H5T_NATIVE_INT64, i));
  } else if (const auto* d = std::get_if<double>(&value)) {
    Handle a(LOCKSTEP_CHECK_HDF5(
                 H5Acreate2(root, name.c_str(), H5T_IEEE_F64LE, space, H5P_DEFAULT, H5P_DEFAULT)),
             H5Aclose);
    LOCKSTEP_CHECK_HDF5(H5Awrite(a, H5T_NATIVE_DOUBLE, d));
  } else {
    const std::string& s = std::get<std::string>(value);
    Handle type(LOCKSTEP_CHECK_HDF5(H5Tcopy(H5T_C_S1)), H5Tclose);
    LOCKSTEP_CHECK_HDF5(H5Tset_size(type, std::max<std::size_t>(1, s.size())));
    Handle a(
        LOCKSTEP_CHECK_HDF5(H5Acreate2(root, name.c_str(), type, space, H5P_DEFAULT, H5P_DEFAULT)),
        H5Aclose);
    std::string padded = s.empty() ? std::string(1, '\0') : s;
    LOCKSTEP_CHECK_HDF5(H5Awrite(a, type, padded.data()));
  }
}

void write_file(const fs::path& path, const CheckpointContents& contents) {
  Hdf5Lock lock;
  Handle file(LOCKSTEP_CHECK_HDF5(H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT)),
              H5Fclose);
  Handle link_props(LOCKSTEP_CHECK_HDF5(H5Pcreate(H5P_LINK_CREATE)), H5Pclose);
  LOCKSTEP_CHECK_HDF5(H5Pset_create_intermediate_group(link_props, 1));
  for (const auto& [name, tensor] : contents.tensors) {
    if (tensor.device().is_cuda())
      throw InvalidArgument("checkpoint tensor " + name + " is on " + tensor.device().str() +
                            " (copy it to the CPU first)");
    std::vector<hsize_t> dims(tensor.shape().begin(), tensor.shape().end());
    Handle space(LOCKSTEP_CHECK_HDF5(dims.empty() ? H5Screate(H5S_SCALAR)
                                                  : H5Screate_simple(static_cast<int>(dims.size()),
                                                                     dims.data(), nullptr)),
                 H5Sclose);
    const hid_t type = hdf5_type(tensor.dtype());
    Handle set(LOCKSTEP_CHECK_HDF5(H5Dcreate2(file, name.c_str(), type, space, link_props,
                                              H5P_DEFAULT, H5P_DEFAULT)),
               H5Dclose);
    if (tensor.numel() > 0)
      LOCKSTEP_CHECK_HDF5(H5Dwrite(set, type, H5S_ALL, H5S_ALL, H5P_DEFAULT, tensor.data()));
  }
  for (const auto& [name, value] : contents.attributes) write_attribute(file, name, value);
}

// Writes the checksum of `data` to `target` through a temporary, fsynced.
void write_checksum(const fs::path& data, const fs::path& target) {
  const Checksum sum = checksum_of(data);
  const fs::path tmp = fs::path(target.string() + ".tmp");
  {
    std::ofstream out(tmp, std::ios::trunc);
    char line[64];
    std::snprintf(line, sizeof line, "crc32 %08x size %ju\n", sum.crc, sum.size);
    out << line;
    if (!out.flush()) throw IoError("cannot write " + tmp.string());
  }
  fsync_path(tmp, false);
  fs::rename(tmp, target);
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
  if (digits.find_first_not_of("0123456789") != std::string::npos) return -1;
  return std::stoll(digits);
}

// Reads every dataset under `group` into `out`, keyed by path relative to it.
herr_t collect(hid_t object, const char* name, const H5O_info_t* info, void* data) {
  if (info->type != H5O_TYPE_DATASET) return 0;
  auto* out = static_cast<std::map<std::string, core::Tensor>*>(data);
  Handle set(LOCKSTEP_CHECK_HDF5(H5Dopen2(object, name, H5P_DEFAULT)), H5Dclose);
  Handle space(LOCKSTEP_CHECK_HDF5(H5Dget_space(set)), H5Sclose);
  Handle type(LOCKSTEP_CHECK_HDF5(H5Dget_type(set)), H5Tclose);
  const int rank = LOCKSTEP_CHECK_HDF5(H5Sget_simple_extent_ndims(space));
  std::vector<hsize_t> dims(static_cast<std::size_t>(rank));
  LOCKSTEP_CHECK_HDF5(H5Sget_simple_extent_dims(space, dims.data(), nullptr));
  const DType dtype = dtype_of(type, name);
  core::Tensor t = core::Tensor::empty(core::Shape(dims.begin(), dims.end()), dtype);
  if (t.numel() > 0)
    LOCKSTEP_CHECK_HDF5(H5Dread(set, hdf5_type(dtype), H5S_ALL, H5S_ALL, H5P_DEFAULT, t.data()));
  (*out)[name] = t;
  return 0;
}

AttributeValue read_attribute(hid_t root, const char* name) {
  Handle a(LOCKSTEP_CHECK_HDF5(H5Aopen(root, name, H5P_DEFAULT)), H5Aclose);
  Handle type(LOCKSTEP_CHECK_HDF5(H5Aget_type(a)), H5Tclose);
  switch (H5Tget_class(type)) {
    case H5T_INTEGER: {
      std::int64_t v = 0;
      LOCKSTEP_CHECK_HDF5(H5Aread(a, H5T_NATIVE_INT64, &v));
      return v;
    }
    case H5T_FLOAT: {
      double v = 0;
      LOCKSTEP_CHECK_HDF5(H5Aread(a, H5T_NATIVE_DOUBLE, &v));
      return v;
    }
    case H5T_STRING: {
      if (H5Tis_variable_str(type) > 0) {
        char* text = nullptr;
        LOCKSTEP_CHECK_HDF5(H5Aread(a, type, &text));
        std::string s = text ? text : "";
        H5free_memory(text);
        return s;
      }
      std::string s(H5Tget_size(type), '\0');
      LOCKSTEP_CHECK_HDF5(H5Aread(a, type, s.data()));
      return s.substr(0, s.find('\0'));
    }
    default:
      break;
  }
  throw IoError(std::string("attribute '") + name + "' has an unsupported type");
}

}  // namespace

CheckpointDirectory::CheckpointDirectory(fs::path dir, int keep_last)
    : dir_(std::move(dir)), keep_last_(keep_last) {
  if (keep_last < 1)
    throw InvalidArgument("CheckpointDirectory: keep_last is " + std::to_string(keep_last) +
                          "; it must be at least 1");
  std::error_code ec;
  fs::create_directories(dir_, ec);
  if (ec)
    throw IoError("cannot create checkpoint directory " + dir_.string() + ": " + ec.message());
}

fs::path CheckpointDirectory::save(std::int64_t step, const CheckpointContents& contents) const {
  const fs::path final_path = dir_ / ("ckpt-" + std::to_string(step) + ".h5");
  const fs::path tmp = dir_ / (".ckpt-" + std::to_string(step) + ".h5.tmp");
  write_file(tmp, contents);
  fsync_path(tmp, false);
  write_checksum(tmp, checksum_path(final_path));
  fs::rename(tmp, final_path);
  fsync_path(dir_, true);
  const auto all = list();
  for (std::size_t i = 0; i + keep_last_ < all.size(); ++i) {
    fs::remove(all[i]);
    fs::remove(checksum_path(all[i]));
  }
  return final_path;
}

std::vector<fs::path> CheckpointDirectory::list() const {
  std::vector<fs::path> found;
  if (!fs::is_directory(dir_)) return found;
  for (const auto& entry : fs::directory_iterator(dir_))
    if (step_of(entry.path()) >= 0) found.push_back(entry.path());
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
  std::ifstream in(sum_file);
  unsigned crc = 0;
  std::uintmax_t size = 0;
  std::string line;
  if (!in || !std::getline(in, line) ||
      std::sscanf(line.c_str(), "crc32 %x size %ju", &crc, &size) != 2)
    throw IoError("checkpoint " + file.string() + " has no valid checksum file " +
                  sum_file.string() + " (it was cut short, or is not a lockstep checkpoint)");
  const Checksum actual = checksum_of(file);
  if (actual.crc != crc || actual.size != size)
    throw IoError("checkpoint " + file.string() + " is corrupt: " + std::to_string(actual.size) +
                  " bytes with CRC-32 " + std::to_string(actual.crc) + ", expected " +
                  std::to_string(size) + " bytes with CRC-32 " + std::to_string(crc));
  char sum[64];
  std::snprintf(sum, sizeof sum, "crc32 %08x size %ju", crc, size);
  return sum;
}

CheckpointContents read_checkpoint(const fs::path& file) {
  verify_checkpoint(file);
  CheckpointContents contents;
  contents.tensors = read_group(file, "/");
  Hdf5Lock lock;
  Handle f(LOCKSTEP_CHECK_HDF5(H5Fopen(file.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT)), H5Fclose);
  H5O_info_t info;
  LOCKSTEP_CHECK_HDF5(H5Oget_info(f, &info));
  for (hsize_t i = 0; i < info.num_attrs; ++i) {
    char name[256];
    LOCKSTEP_CHECK_HDF5(
        H5Aget_name_by_idx(f, ".", H5_INDEX_NAME, H5_ITER_INC, i, name, sizeof name, H5P_DEFAULT));
    contents.attributes[name] = read_attribute(f, name);
  }
  std::map<std::string, core::Tensor> rooted;
  for (auto& [name, t] : contents.tensors) rooted["/" + name] = t;
  contents.tensors = std::move(rooted);
  return contents;
}

namespace {
// Opens an HDF5 file read-only, naming it in the error when it is not one.
hid_t open_readonly(const fs::path& file) {
  if (!fs::exists(file)) throw IoError("weights file " + file.string() + " does not exist");
  const hid_t raw = H5Fopen(file.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
  if (raw < 0)
    throw IoError("cannot open " + file.string() + " as HDF5: " + io::detail::hdf5_error_stack());
  return raw;
}
}  // namespace

bool has_group(const fs::path& file, const std::string& group) {
  Hdf5Lock lock;
  Handle f(open_readonly(file), H5Fclose);
  return H5Lexists(f, group.c_str(), H5P_DEFAULT) > 0;
}

std::map<std::string, core::Tensor> read_group(const fs::path& file, const std::string& group) {
  Hdf5Lock lock;
  Handle f(open_readonly(file), H5Fclose);
  if (H5Lexists(f, group.c_str(), H5P_DEFAULT) <= 0)
    throw IoError(file.string() + " has no group " + group +
                  " (weights go in /model/<parameter name>, see docs/models.md)");
  Handle g(LOCKSTEP_CHECK_HDF5(H5Gopen2(f, group.c_str(), H5P_DEFAULT)), H5Gclose);
  std::map<std::string, core::Tensor> out;
  LOCKSTEP_CHECK_HDF5(H5Ovisit(g, H5_INDEX_NAME, H5_ITER_INC, collect, &out));
  return out;
}

}  // namespace lockstep::engine
