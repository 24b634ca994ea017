// lockstep-predict: a model preset's outputs for every sample of HDF5
// shards, with a checkpoint's weights, in eval mode and with the training
// run's preprocessing (engine::Predictor, Note [preprocess like training]).
// Writes one JSON line a sample (its index, the argmax class, the label when
// the shards have one, and the logits or probabilities) and prints the
// accuracy where there are labels, as lockstep-train --eval-only does.
#include <fmt/core.h>

#include <cmath>
#include <cstdio>
#include <filesystem>

#include "comm/world.h"
#include "engine/core/json.h"
#include "engine/core/output_file.h"
#include "engine/predict.h"
#include "examples/common/flags.h"
#include "examples/shard/progress.h"

using namespace lockstep;
using namespace lockstep::engine;
using namespace lockstep::examples;

namespace {

struct Flags {
  std::string checkpoint, model, data, out, outputs = "logits", device, normalize;
  std::int64_t batch_size = 256;
  int threads = 1, loader_threads = 2;
  bool allow_partial_weights = false;  // Note [weights files] in engine/checkpoint.h
  bool has_normalize = false;
};

// One row's softmax, in double (the exponentials of logits far apart
// underflow to 0 rather than overflowing: the row's maximum is subtracted).
core::Json probabilities(const float* logits, std::int64_t classes) {
  double top = logits[0], sum = 0;
  for (std::int64_t c = 1; c < classes; ++c) top = std::max(top, static_cast<double>(logits[c]));
  std::vector<double> e(static_cast<std::size_t>(classes));
  for (std::int64_t c = 0; c < classes; ++c)
    sum += e[static_cast<std::size_t>(c)] = std::exp(static_cast<double>(logits[c]) - top);
  core::Json row = core::Json::array();
  for (double v : e) row.push(v / sum);
  return row;
}

// --normalize as an input record (Note [input record] in
// engine/input_record.h): "none", or means then stds as lockstep-train takes
// them, for images of `preset`.
InputRecord normalize_record(const std::string& text, const ModelPreset& preset) {
  InputRecord r{.scale_u8 = true};
  if (text == "none") return r;
  if (preset.sample_shape.size() != 3)
    throw InvalidArgument(
        fmt::format("--normalize {}: --model {} takes {}, not images (leave --normalize out)", text,
                    preset.name, core::shape_str(preset.sample_shape)));
  const std::int64_t channels = preset.sample_shape[0];
  const std::vector<float> values = parse_float_list(text, "--normalize");
  if (values.size() % 2 != 0)
    throw InvalidArgument(fmt::format(
        "--normalize {}: {} numbers, not a mean and a std a channel (MEAN,STD or C means then C "
        "stds)",
        text, values.size()));
  const auto half = static_cast<std::ptrdiff_t>(values.size() / 2);
  r.mean.assign(values.begin(), values.begin() + half);
  r.std.assign(values.begin() + half, values.end());
  if (r.mean.size() != 1 && static_cast<std::int64_t>(r.mean.size()) != channels)
    throw InvalidArgument(fmt::format(
        "--normalize {}: {} means and {} stds, but the model takes {} channel{} (give a mean and "
        "a std, or {} of each)",
        text, r.mean.size(), r.std.size(), channels, channels == 1 ? "" : "s", channels));
  for (float s : r.std)
    if (!(s > 0))
      throw InvalidArgument(fmt::format("--normalize {}: a std of {}, not above 0", text, s));
  return r;
}

int run(const Flags& f, comm::World& world) {
  if (world.size() > 1)
    throw InvalidArgument(fmt::format(
        "lockstep-predict runs as one process, but it was started as {} ranks (run it without "
        "mpirun or srun)",
        world.size()));
  use_cpu_threads(f.threads, true);
  const io::Dataset data = io::Dataset::open(f.data);
  PredictorOptions options{.device = world.device(),
                           .stream = core::Stream::create(world.device()),
                           .weights = {.allow_partial = f.allow_partial_weights},
                           .input = std::nullopt};
  if (f.has_normalize) options.input = normalize_record(f.normalize, model_preset(f.model));
  Predictor predictor(f.model, f.checkpoint, options);
  if (!predictor.model_shape().note.empty())  // Note [model from the weights]
    fmt::print("model {}: {}\n", f.model, predictor.model_shape().note);
  const WeightsLoadReport& weights = predictor.weights();
  if (weights.partial() || !weights.kept_counters.empty())
    fmt::print("weights of {}: {}\n", f.checkpoint, weights.summary());
  fmt::print("lockstep-predict: {} on {} ({} samples, {}) on {}\ninput: {}\n", f.model, f.data,
             data.size(), data.format().str(), world.device().str(),
             predictor.input() ? predictor.input()->str() +
                                     (f.has_normalize ? " (--normalize)" : " (the checkpoint's)")
                               : f.checkpoint +
                                     " has no input record: u8 / 255, no normalisation (pass "
                                     "--normalize if the weights were trained with one)");
  core::OutputFile out(f.out, "the --out file");
  const bool probs = f.outputs == "probabilities";
  std::int64_t done = 0, correct = 0, labelled = 0;
  Progress progress("lockstep-predict", data.size());
  predictor.predict_dataset(
      data, f.batch_size,
      [&](const PredictedBatch& batch) {
        const std::vector<std::int64_t> classes = argmax_rows(batch.outputs);
        const std::int64_t width = batch.outputs.shape()[1];
        const float* values = batch.outputs.data_as<float>();
        std::string lines;
        for (std::size_t r = 0; r < classes.size(); ++r) {
          const float* row = values + static_cast<std::int64_t>(r) * width;
          core::Json record =
              core::Json::object().set("sample", batch.indices[r]).set("class", classes[r]);
          if (!batch.labels.empty()) {
            record.set("label", batch.labels[r]);
            correct += classes[r] == batch.labels[r];
            ++labelled;
          }
          core::Json row_json = core::Json::array();
          if (probs)
            row_json = probabilities(row, width);
          else
            for (std::int64_t c = 0; c < width; ++c) row_json.push(row[c]);
          record.set(f.outputs, std::move(row_json));
          lines += record.dump() + "\n";
        }
        out.write(lines);
        done += static_cast<std::int64_t>(classes.size());
        progress.update(done);
      },
      f.loader_threads);
  out.commit();
  fmt::print("lockstep-predict: wrote {} predictions ({}) to {}\n", done, f.outputs, f.out);
  if (labelled > 0)
    fmt::print("accuracy {:.2f}% ({} of {} samples)\n", 100.0 * correct / labelled, correct,
               labelled);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Flags f;
  CLI::App app{
      "lockstep-predict: a model preset's outputs for every sample of HDF5 shards, with a "
      "checkpoint's weights"};
  app.footer(
      "The model runs in eval mode (dropout off, BatchNorm with its running statistics), on\n"
      "inputs preprocessed as lockstep-train preprocessed them: u8 inputs / 255, and the\n"
      "--normalize the checkpoint records. --out gets one JSON line a sample:\n"
      "{\"sample\": 0, \"class\": 7, \"label\": 7, \"logits\": [...]}. See docs/deploy.md.");
  add_weights_flags(app, f.checkpoint, f.allow_partial_weights, f.model, false, "");
  app.add_option("--data", f.data, "the shards to predict (a directory of *.h5, or one .h5)")
      ->required()
      ->check(non_empty() & CLI::ExistingPath);
  app.add_option("--out", f.out, "the JSON lines file to write, one line a sample")
      ->required()
      ->check(non_empty());
  app.add_option("--outputs", f.outputs,
                 "what each line holds besides the class: logits, or probabilities (softmax)")
      ->check(one_of({"logits", "probabilities"}))
      ->capture_default_str();
  app.add_option("--normalize", f.normalize,
                 "MEAN,STD (or C means then C stds) of u8 images in [0, 1], or none (default: "
                 "what the checkpoint records; a weights file records nothing)")
      ->check(non_empty());
  app.add_option("--batch-size", f.batch_size, "samples per forward")
      ->check(within(1, kMaxRows))
      ->capture_default_str();
  app.add_option("--device", f.device, "cpu or cuda (default: cuda when usable)")
      ->check(device_name());
  app.add_option("--threads", f.threads, "CPU threads (the CPU GEMM library's)")
      ->check(threads_per_rank())
      ->capture_default_str();
  app.add_option("--loader-threads", f.loader_threads, "threads reading and preprocessing shards")
      ->check(within(1, 64))
      ->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  f.has_normalize = app.count("--normalize") > 0;
  comm::InitOptions init;
  init.use_gpu = f.device != "cpu";
  return comm::guarded_main("lockstep-predict", argc, argv, init, [&](comm::World& world) {
    if (f.device == "cuda" && !world.device().is_cuda())
      throw InvalidArgument("--device cuda, but no GPU is usable here (use --device cpu)");
    return run(f, world);
  });
}
