// Dataset: a set of HDF5 shards read as one indexable collection of samples
// (docs/data-format.md). Opening checks every shard and that all agree on the
// format, and loads every label (8 bytes a sample) or target (4 bytes a
// value) into memory, so that checks happen once and batches only read
// inputs (fixed-shape rows, or an encoded-image shard's files). Reads are
// thread-safe. A directory's classes.txt names its classes (Note [same classes]).
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "io/shard_format.h"

namespace lockstep::io {

struct ShardInfo {
  std::filesystem::path path;
  std::int64_t first_row = 0;  // global index of its row 0
  std::int64_t rows = 0;
  ShardLayout layout = ShardLayout::contiguous;
  std::string layout_reason;  // why the hdf5 layout ("chunked with filters" ...)
};

struct OpenOptions {
  // Read every shard through HDF5, even contiguous ones: slower, for checks
  // that the two read paths agree (Note [contiguous reads]).
  bool force_hdf5 = false;
  // The targets are probabilities, as binary cross-entropy reads them: every
  // target of a target shard must lie in [0, 1] (outside it the loss has no
  // minimum and falls without bound), checked as each shard is opened.
  bool probability_targets = false;
};

class Dataset {
 public:
  // A directory of *.h5 shards (in name order), or a single .h5 file.
  static Dataset open(const std::filesystem::path& path, const OpenOptions& options = {});
  // Shards in the given order.
  static Dataset open(const std::vector<std::filesystem::path>& shard_paths,
                      const OpenOptions& options = {});

  std::int64_t size() const;
  const ShardFormat& format() const;
  std::size_t sample_bytes() const { return format().sample_bytes(); }
  const std::vector<ShardInfo>& shards() const;

  // What ranks compare before training (comm::check_agreement): the sample
  // count, the format, the shard count, and each shard's file name (not its
  // directory, which may differ across hosts), rows and size in bytes.
  std::vector<std::pair<std::string, std::string>> agreement_fields() const;

  // Labels of every sample, as i64 whatever the shards store (empty for
  // token shards, which have none).
  const std::vector<std::int64_t>& labels() const;
  // Targets of every sample of a target shard (ShardFormat::has_targets), as
  // f32, sample after sample (shape_numel(format().target_shape) each); empty otherwise.
  const std::vector<float>& targets() const;
  // Throws InvalidArgument naming the shard, the row and the label when a
  // label lies outside [0, num_classes).
  void check_labels(std::int64_t num_classes) const;

  // The class names of a dataset opened as a directory that holds a
  // classes.txt beside its shards (lockstep-shard images writes one), one a
  // line, class 0 first; empty otherwise (shard files, or no such file).
  const std::vector<std::string>& class_names() const;
  // That classes.txt; empty when class_names() is.
  const std::filesystem::path& class_names_file() const;

  // "shard 'data/shard-00001-of-00004.h5', row 17": where global `row` lives,
  // for messages.
  std::string describe_row(std::int64_t row) const;

  // Copies the inputs of `rows` (global indices, any order, repeats allowed)
  // to `dst`: row rows[i] at dst + i * sample_bytes(). Reads are sorted and
  // coalesced into runs per shard. Safe to call from many threads at once.
  // Not for encoded-image shards (ShardFormat::encoded), whose rows differ in
  // size: read those with read_encoded().
  void read_inputs(std::span<const std::int64_t> rows, void* dst) const;
  // The encoded bytes (a JPEG or PNG file) of global row `row` of an
  // encoded-image dataset, replacing `bytes`. Safe to call from many threads.
  void read_encoded(std::int64_t row, std::vector<std::uint8_t>& bytes) const;

 private:
  struct State;
  explicit Dataset(std::shared_ptr<const State> state) : state_(std::move(state)) {}
  // Both open()s: `directory` is the one given to open(path), empty for a
  // list of shard files (only a directory's classes.txt is read).
  static Dataset open_shards(const std::vector<std::filesystem::path>& shard_paths,
                             const OpenOptions& options, const std::filesystem::path& directory);
  std::shared_ptr<const State> state_;
};

// Note [same classes]: a label is a class's number, so two datasets trained
// and evaluated together (a train and a val split) must number the same
// classes alike. When both name their classes (Dataset::class_names), throws
// InvalidArgument unless the names are the same, in the same order, naming
// both datasets (`name`, `other_name`: "--data photos/train") and the first
// class that differs. Datasets without names (h5py's shards) are not compared.
void check_same_classes(const Dataset& data, const std::string& name, const Dataset& other,
                        const std::string& other_name);

}  // namespace lockstep::io
