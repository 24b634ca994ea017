// Opening a set of shards and reading rows across them (io/dataset.h).
#include "io/dataset.h"

#include <fmt/core.h>

#include <algorithm>
#include <cstring>
#include <fstream>

#include "io/detail/shard_file.h"
#include "kernels/error.h"

namespace lockstep::io {

namespace fs = std::filesystem;

struct Dataset::State {
  std::vector<std::unique_ptr<detail::ShardFile>> files;
  std::vector<ShardInfo> infos;
  std::vector<std::int64_t> ends;  // exclusive global end row of each shard
  std::vector<std::int64_t> labels;
  std::vector<float> targets;
  ShardFormat format;
  std::vector<std::string> class_names;
  fs::path class_names_file;
};

namespace {

// A directory's classes.txt, one name a line; none when it has no such file.
std::vector<std::string> read_class_names(const fs::path& file) {
  std::error_code error;
  if (!fs::is_regular_file(file, error)) return {};
  std::ifstream in(file);
  std::vector<std::string> names;
  for (std::string line; std::getline(in, line);) names.push_back(line);
  if (in.bad() || !in.eof())
    throw IoError("cannot read the class names in '" + file.string() +
                  "' (check the file and its permissions)");
  return names;
}

// Throws InvalidArgument naming the shard, the row and the value when a
// target of `shard` lies outside [0, 1] (OpenOptions::probability_targets).
void check_probabilities(const fs::path& shard, const std::vector<float>& targets,
                         std::int64_t per_row) {
  const auto bad = std::find_if(targets.begin(), targets.end(),
                                [](float v) { return !(v >= 0.0f && v <= 1.0f); });
  if (bad == targets.end()) return;
  const std::int64_t at = bad - targets.begin();
  throw InvalidArgument(fmt::format(
      "shard '{}', dataset '{}', row {}: target {} (value {} of the row) is outside [0, 1], but "
      "binary cross-entropy reads each target as a probability, and past [0, 1] its loss falls "
      "without bound (fix the data, or train with a loss for any real target: mse, l1 or huber)",
      shard.string(), kTargetsName, at / per_row, *bad, at % per_row));
}

}  // namespace

Dataset Dataset::open(const fs::path& path, const OpenOptions& options) {
  std::error_code error;
  const fs::file_status status = fs::status(path, error);
  if (!fs::exists(status))
    throw IoError("dataset '" + path.string() +
                  "' does not exist (pass a directory of *.h5 shards or one .h5 file)");
  if (!fs::is_directory(status)) return open(std::vector<fs::path>{path}, options);
  std::vector<fs::path> shards;
  for (const auto& entry : fs::directory_iterator(path))
    if (entry.path().extension() == ".h5" && entry.is_regular_file())
      shards.push_back(entry.path());
  if (shards.empty())
    throw IoError("no shards: directory '" + path.string() +
                  "' holds no *.h5 files (write some with lockstep-shard)");
  std::sort(shards.begin(), shards.end(),
            [](const fs::path& a, const fs::path& b) { return a.filename() < b.filename(); });
  return open_shards(shards, options, path);
}

Dataset Dataset::open(const std::vector<fs::path>& shard_paths, const OpenOptions& options) {
  return open_shards(shard_paths, options, {});
}

Dataset Dataset::open_shards(const std::vector<fs::path>& shard_paths, const OpenOptions& options,
                             const fs::path& directory) {
  if (shard_paths.empty()) throw IoError("no shards: the list of shard files is empty");
  auto state = std::make_shared<State>();
  std::int64_t rows = 0;
  for (const fs::path& path : shard_paths) {
    auto file = std::make_unique<detail::ShardFile>(path, options.force_hdf5);
    if (state->files.empty()) {
      state->format = file->format();
    } else if (!(file->format() == state->format)) {
      throw IoError("shard '" + path.string() + "' holds " + file->format().str() + ", but '" +
                    state->files.front()->path().string() + "' holds " + state->format.str() +
                    " (every shard of a dataset must have the same dtypes and per-sample shape; "
                    "re-create the odd shard or leave it out)");
    }
    state->infos.push_back({path, rows, file->rows(), file->layout(), file->layout_reason()});
    rows += file->rows();
    state->ends.push_back(rows);
    const std::vector<std::int64_t> labels = file->take_labels();
    state->labels.insert(state->labels.end(), labels.begin(), labels.end());
    const std::vector<float> targets = file->take_targets();
    if (options.probability_targets && state->format.has_targets)
      check_probabilities(path, targets, core::shape_numel(state->format.target_shape));
    state->targets.insert(state->targets.end(), targets.begin(), targets.end());
    state->files.push_back(std::move(file));
  }
  if (!directory.empty()) {
    state->class_names = read_class_names(directory / "classes.txt");
    if (!state->class_names.empty()) state->class_names_file = directory / "classes.txt";
  }
  return Dataset(std::move(state));
}

std::int64_t Dataset::size() const { return state_->ends.empty() ? 0 : state_->ends.back(); }
const ShardFormat& Dataset::format() const { return state_->format; }
const std::vector<ShardInfo>& Dataset::shards() const { return state_->infos; }

std::vector<std::pair<std::string, std::string>> Dataset::agreement_fields() const {
  std::vector<std::pair<std::string, std::string>> fields{
      {"dataset.samples", std::to_string(size())},
      {"dataset.format", format().str()},
      {"dataset.shards", std::to_string(shards().size())}};
  for (std::size_t i = 0; i < shards().size(); ++i) {
    const ShardInfo& s = shards()[i];
    std::error_code error;
    const std::uintmax_t bytes = std::filesystem::file_size(s.path, error);
    fields.emplace_back(fmt::format("dataset.shard[{}]", i),
                        fmt::format("{}: {} rows, {}", s.path.filename().string(), s.rows,
                                    error ? "size unknown (" + error.message() + ")"
                                          : std::to_string(bytes) + " bytes"));
  }
  return fields;
}

const std::vector<std::int64_t>& Dataset::labels() const { return state_->labels; }
const std::vector<float>& Dataset::targets() const { return state_->targets; }
const std::vector<std::string>& Dataset::class_names() const { return state_->class_names; }
const fs::path& Dataset::class_names_file() const { return state_->class_names_file; }

std::string Dataset::describe_row(std::int64_t row) const {
  const auto shard =
      std::upper_bound(state_->ends.begin(), state_->ends.end(), row) - state_->ends.begin();
  if (row < 0 || shard >= static_cast<std::ptrdiff_t>(state_->infos.size()))
    return "row " + std::to_string(row) + " (outside the dataset)";
  const ShardInfo& info = state_->infos[shard];
  return "shard '" + info.path.string() + "', row " + std::to_string(row - info.first_row);
}

void Dataset::check_labels(std::int64_t num_classes) const {
  if (num_classes < 1)
    throw InvalidArgument("num_classes " + std::to_string(num_classes) + " is below 1");
  const auto& labels = state_->labels;
  const auto bad = std::find_if(labels.begin(), labels.end(), [&](std::int64_t label) {
    return label < 0 || label >= num_classes;
  });
  if (bad == labels.end()) return;
  const std::int64_t row = bad - labels.begin();
  const auto shard =
      std::upper_bound(state_->ends.begin(), state_->ends.end(), row) - state_->ends.begin();
  const ShardInfo& info = state_->infos[shard];
  throw InvalidArgument(fmt::format(
      "shard '{}', dataset 'labels', row {}: label {} is outside [0, {}) for a model with {} "
      "classes (check the model's number of classes, or the labels the shards were written with)",
      info.path.string(), row - info.first_row, *bad, num_classes, num_classes));
}

void Dataset::read_inputs(std::span<const std::int64_t> rows, void* dst) const {
  struct Want {
    std::int64_t row;
    std::size_t slot;  // position in `rows`, and so in dst
  };
  if (format().encoded)
    throw InvalidArgument("Dataset::read_inputs on encoded images (" + format().str() +
                          "), whose rows differ in size (read them with read_encoded(), or "
                          "through a DataLoader with LoaderOptions::images)");
  const std::int64_t total = size();
  std::vector<Want> wants(rows.size());
  for (std::size_t i = 0; i < rows.size(); ++i) {
    if (rows[i] < 0 || rows[i] >= total)
      throw InvalidArgument(
          fmt::format("row {} is outside the dataset's {} samples (read rows that a sampler "
                      "over this dataset's size() gives)",
                      rows[i], total));
    wants[i] = {rows[i], i};
  }
  std::sort(wants.begin(), wants.end(), [](const Want& a, const Want& b) {
    return a.row < b.row || (a.row == b.row && a.slot < b.slot);
  });

  const std::size_t row_bytes = sample_bytes();
  auto* out = static_cast<std::byte*>(dst);
  std::vector<std::int64_t> local;
  std::vector<std::byte*> targets;
  std::vector<std::pair<std::size_t, std::size_t>> repeats;  // (from slot, to slot)
  std::size_t i = 0;
  while (i < wants.size()) {
    const std::size_t shard =
        std::upper_bound(state_->ends.begin(), state_->ends.end(), wants[i].row) -
        state_->ends.begin();
    const std::int64_t first = state_->infos[shard].first_row, end = state_->ends[shard];
    local.clear();
    targets.clear();
    for (; i < wants.size() && wants[i].row < end; ++i) {
      if (i > 0 && wants[i].row == wants[i - 1].row) {
        repeats.push_back({wants[i - 1].slot, wants[i].slot});
        continue;
      }
      local.push_back(wants[i].row - first);
      targets.push_back(out + wants[i].slot * row_bytes);
    }
    state_->files[shard]->read_rows(local, targets);
  }
  // A repeated row was read once into its first slot; `repeats` runs in
  // sorted order, so each source is filled before it is copied on.
  for (const auto& [from, to] : repeats)
    std::memcpy(out + to * row_bytes, out + from * row_bytes, row_bytes);
}

void Dataset::read_encoded(std::int64_t row, std::vector<std::uint8_t>& bytes) const {
  if (row < 0 || row >= size())
    throw InvalidArgument(fmt::format("row {} is outside the dataset's {} samples", row, size()));
  const std::size_t shard =
      std::upper_bound(state_->ends.begin(), state_->ends.end(), row) - state_->ends.begin();
  state_->files[shard]->read_encoded(row - state_->infos[shard].first_row, bytes);
}

void check_same_classes(const Dataset& data, const std::string& name, const Dataset& other,
                        const std::string& other_name) {
  const std::vector<std::string>& a = data.class_names();
  const std::vector<std::string>& b = other.class_names();
  if (a.empty() || b.empty() || a == b) return;
  const std::size_t first = static_cast<std::size_t>(
      std::mismatch(a.begin(), a.end(), b.begin(), b.end()).first - a.begin());
  const auto in = [first](const Dataset& d) {
    const std::vector<std::string>& names = d.class_names();
    return first < names.size()
               ? fmt::format("{:?} in '{}'", names[first], d.class_names_file().string())
               : fmt::format("missing from '{}' (it names {} classes)",
                             d.class_names_file().string(), names.size());
  };
  throw InvalidArgument(fmt::format(
      "{} and {} number their classes differently: class {} is {} but {} (label {} would name "
      "a different class in each: shard both from folders with the same class names, none of "
      "them empty)",
      other_name, name, first, in(other), in(data), first));
}

}  // namespace lockstep::io
