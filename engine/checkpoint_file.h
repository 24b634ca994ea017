// Checkpoint files: one HDF5 file per checkpoint, written so that a crash
// never leaves a damaged file under a good name, and checked before HDF5 ever
// opens it (HDF5 1.10 can crash on malformed files).
//
// Note [checkpoint commit]: save() writes .ckpt-<step>.h5.tmp, fsyncs it, writes
// the checksum file ckpt-<step>.h5.crc32 (its own temporary, fsync, rename),
// renames the HDF5 file to ckpt-<step>.h5 and fsyncs the directory. A
// checkpoint is good when both files exist and the CRC-32 and size of the
// HDF5 file's bytes match the checksum file; a crash at any point leaves
// either no ckpt-<step>.h5 or a good one.
//
// What goes into a checkpoint (the /model, /buffers, /optimizer groups and
// the attributes) is the Trainer's business; this file moves named tensors
// and attributes to and from disk. Readable with h5py.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "engine/core/tensor.h"

namespace lockstep::engine {

using AttributeValue = std::variant<std::int64_t, double, std::string>;

struct CheckpointContents {
  // HDF5 dataset paths ("/model/fc1.weight") to CPU tensors (f32, i64, i32, u8).
  std::map<std::string, core::Tensor> tensors;
  // Attributes of the root group.
  std::map<std::string, AttributeValue> attributes;
};

class CheckpointDirectory {
 public:
  // keep_last >= 1: older checkpoints are deleted after each save.
  CheckpointDirectory(std::filesystem::path dir, int keep_last);

  // Writes ckpt-<step>.h5 (Note [checkpoint commit]) and returns its path.
  std::filesystem::path save(std::int64_t step, const CheckpointContents& contents) const;
  // Checkpoints present, oldest first (good or not).
  std::vector<std::filesystem::path> list() const;
  // The newest checkpoint whose checksum verifies; logs a warning naming each
  // newer one that does not.
  std::optional<std::filesystem::path> latest_good() const;
  const std::filesystem::path& directory() const { return dir_; }

 private:
  std::filesystem::path dir_;
  int keep_last_;
};

// Throws IoError naming the file when its checksum file is missing or does
// not match its bytes; returns the verified sum ("crc32 0badf00d size 12345").
std::string verify_checkpoint(const std::filesystem::path& file);
// Verifies, then reads every dataset and root attribute.
CheckpointContents read_checkpoint(const std::filesystem::path& file);
// Datasets of one group ("/model") of any HDF5 file with that layout (for
// example one written from a PyTorch state_dict with h5py), keyed by their
// name inside the group. No checksum: such files come from elsewhere.
// Whether `file` (any HDF5 file) has the group `group` ("/buffers").
bool has_group(const std::filesystem::path& file, const std::string& group);
std::map<std::string, core::Tensor> read_group(const std::filesystem::path& file,
                                               const std::string& group);

}  // namespace lockstep::engine
