// ObjectHeaderCheck: the check, without HDF5, of an object's header (and, for
// a group, of its B-tree, symbol nodes and heap) that hdf5_read.cpp makes
// before HDF5 decodes any object of a file it has opened (Note [object
// headers], Note [group trees] in io/hdf5_format_check.cpp). The superblock
// and the root's header are checked before the file is opened, by
// check_hdf5_file() (io/hdf5.h).
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>

#include "io/hdf5.h"

namespace lockstep::io::detail {

class ObjectHeaderCheck {
 public:
  // `file` is `path` opened by HDF5, called a `what` in errors ("shard").
  ObjectHeaderCheck(hid_t file, const std::filesystem::path& path, const std::string& what);
  ~ObjectHeaderCheck();
  ObjectHeaderCheck(const ObjectHeaderCheck&) = delete;
  ObjectHeaderCheck& operator=(const ObjectHeaderCheck&) = delete;

  // Checks the header at `address` of the object called `name` ("'data'",
  // "the root group"); throws IoError naming the file and the object.
  void operator()(const std::string& name, std::uint64_t address) const;

 private:
  int fd_;
  std::uint64_t base_ = 0, bytes_ = 0;    // the user block's size; the file's after it
  unsigned internal_k_ = 0, leaf_k_ = 0;  // the group B-trees' orders (H5Pget_sym_k)
  unsigned chunk_k_ = 0;                  // the chunk B-trees' order (H5Pget_istore_k)
  std::string what_;
  std::filesystem::path path_;
};

}  // namespace lockstep::io::detail
