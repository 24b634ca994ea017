// Checkpoint files: one HDF5 file per checkpoint, written so that a crash
// never leaves a damaged file under a good name, and checked before HDF5 ever
// opens it (HDF5 1.10 can crash on malformed files).
//
// Note [checkpoint commit]: save() writes .ckpt-<step>.h5.tmp (the image of a
// file HDF5 built in memory: Note [checkpoint image]), fsyncs it, writes
// the checksum file ckpt-<step>.h5.crc32 (its own temporary, fsync, rename),
// renames the HDF5 file to ckpt-<step>.h5 and fsyncs the directory. A
// checkpoint is good when both files exist and the CRC-32 and size of the
// HDF5 file's bytes match the checksum file; a crash at any point leaves
// either no ckpt-<step>.h5 or a good one.
//
// Note [checkpoint retention]: a directory belongs to one run. A fresh run
// (CheckpointStart::fresh) refuses a directory that already holds
// checkpoints; a resumed one adopts them. After each save, keep_last counts
// the checkpoint just written and the older ones: only checkpoints with a
// smaller step are deleted, never the one just written, never a newer one
// (left by an attempt that went further before the run was resumed from an
// earlier checkpoint; a warning says how many there are). The run that owns
// a directory holds its lock (Note [checkpoint lock] in checkpoint_lock.h).
//
// What goes into a checkpoint (the /model, /buffers, /optimizer groups and
// the attributes) is the Trainer's business; this file moves named tensors
// and attributes to and from disk. Readable with h5py. Reading goes through
// io/hdf5.h's checked reads (Note [hostile files]): a file with a valid
// checksum but unexpected contents is an IoError naming the object.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "engine/checkpoint_lock.h"
#include "engine/core/tensor.h"
#include "kernels/error.h"

namespace lockstep::engine {

using AttributeValue = std::variant<std::int64_t, double, std::string>;

struct CheckpointContents {
  // HDF5 dataset paths ("/model/fc1.weight") to CPU tensors (f32, i64, i32, u8).
  std::map<std::string, core::Tensor> tensors;
  // Attributes of the root group.
  std::map<std::string, AttributeValue> attributes;
};

enum class CheckpointStart { fresh, resume };
// hold: the directory's writer (a run's rank 0) takes its lock for the
// object's life; none: a reader (the other ranks), or a test that makes
// several at once (Note [checkpoint lock]).
enum class CheckpointLock { none, hold };

// Thrown by a fresh CheckpointDirectory over a directory that already holds
// checkpoints; newest() is the newest of them.
class CheckpointDirectoryInUse : public InvalidArgument {
 public:
  CheckpointDirectoryInUse(const std::string& message, std::filesystem::path newest)
      : InvalidArgument(message), newest_(std::move(newest)) {}
  const std::filesystem::path& newest() const { return newest_; }

 private:
  std::filesystem::path newest_;
};

class CheckpointDirectory {
 public:
  // keep_last >= 1 (Note [checkpoint retention]). Creates `dir` if needed;
  // with CheckpointLock::hold, takes its lock before looking into it
  // (CheckpointDirectoryLocked naming the holder when another run has it).
  CheckpointDirectory(std::filesystem::path dir, int keep_last, CheckpointStart start,
                      CheckpointLock lock = CheckpointLock::none);

  // Writes ckpt-<step>.h5 (Note [checkpoint commit]), prunes older ones
  // (Note [checkpoint retention]) and returns its path. On any failure (a
  // full disk included) throws IoError and leaves no temporary behind and
  // every earlier checkpoint as it was. Leftover temporaries of an earlier
  // save are removed only under the lock; without it they make the save fail.
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
  std::unique_ptr<DirectoryLock> lock_;  // with CheckpointLock::hold
};

// Throws IoError naming the file when its checksum file is missing or does
// not match its bytes; returns the verified sum ("crc32 0badf00d size 12345").
std::string verify_checkpoint(const std::filesystem::path& file);
// Verifies, then reads every dataset and root attribute. Floating-point
// datasets arrive as f32 (io::read_tensor).
CheckpointContents read_checkpoint(const std::filesystem::path& file);
// Datasets of one group ("/model") of any HDF5 file with that layout (for
// example one written from a PyTorch state_dict with h5py), keyed by their
// name inside the group; f16 and f64 arrive as f32. No checksum: such files
// come from elsewhere. An absent group gives an empty map when `required`
// is false.
std::map<std::string, core::Tensor> read_group(const std::filesystem::path& file,
                                               const std::string& group, bool required = true);
// The root attributes of any HDF5 file whose names start with `prefix`,
// without the checksum (as read_group): a weights file's Note [input record]
// (input_record.h). Others are not read: a file from h5py may hold
// attributes of any type.
std::map<std::string, AttributeValue> read_root_attributes(const std::filesystem::path& file,
                                                           const std::string& prefix);

}  // namespace lockstep::engine
