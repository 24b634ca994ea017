// bench_step: single-process training-step throughput (the Trainer's step,
// engine::DataParallelStep: forward, cross-entropy, backward, the gradient
// norm, SGD with momentum) of a model preset, against PyTorch running the
// same step in the same run (bench/torch_step.py under one or more Pythons,
// timed in warm blocks alternating with lockstep's), and for mlp, gpt-tiny
// and gpt2 against the floor of their GEMMs alone (bench/gemm_floor.h).
// Language models (gpt-tiny, gpt2) also report tokens/s (samples/s x T).
// With --activation-checkpointing it compares the step with and without
// activation checkpointing instead (Note [checkpointing comparison]).
// --channels-last runs resnet and resnet50 on NHWC activations (Note
// [channels-last layers]); the output and the JSON say which layout ran.
#include <fmt/core.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <functional>
#include <memory>
#include <new>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "bench/gemm_floor.h"
#include "bench/report.h"
#include "bench/synthetic_training.h"
#include "bench/torch_baseline.h"
#include "comm/world.h"
#include "engine/core/memory.h"
#include "engine/core/trace.h"
#include "engine/data_parallel_step.h"
#include "engine/kernel_paths.h"
#include "engine/optim/loss_scaler.h"
#include "examples/common/flags.h"
#include "kernels/conv.h"
#include "kernels/fusion.h"
#include "kernels/gemm.h"

using namespace lockstep;
using namespace lockstep::engine;

namespace {

// Timed blocks of the step, of its GEMM floor and of each PyTorch baseline
// (Note [warm blocks], bench/report.h): how many, and how long each at least.
constexpr int kBlocks = 5;
constexpr double kBlockSeconds = 1.0;

// One PyTorch baseline's figures, or why there are none.
struct Baseline {
  std::string python, torch_version, why_none;
  std::optional<double> ms_per_step, peak_bytes;
  std::optional<bench::BlockTimes> blocks;
};

struct Measure {
  double ms_per_step;
  std::size_t peak_bytes;
  double allocations_per_step;     // tensors allocated (core::allocate) by one step
  std::optional<double> floor_ms;  // the GEMMs alone
  std::vector<Baseline> baselines;
  bench::BlockTimes blocks;  // the step's
  KernelPaths kernels;       // the fused paths the first step took (Note [kernel paths])
  std::optional<StepGraphCounts> graph;  // --cuda-graph's (Note [step graph])
};

// The baseline's block b over ours (the two ran one after the other): the
// fastest and slowest of these pairs bound the ratio's spread.
std::pair<double, double> ratio_spread(const bench::BlockTimes& ours,
                                       const bench::BlockTimes& theirs) {
  double low = 1e300, high = 0;
  for (std::size_t b = 0; b < ours.seconds.size(); ++b) {
    const double r = theirs.seconds[b] / ours.seconds[b];
    low = std::min(low, r);
    high = std::max(high, r);
  }
  return {low, high};
}

// The Trainer's step (engine::DataParallelStep over a world of one) on one
// batch, again and again. The step, its GEMM floor (with_floor, where the
// preset has one: bench/gemm_floor.h) and every PyTorch baseline that
// started are timed in warm blocks taking turns (bench::warm_blocks; each
// block at least `steps` steps), so that neither the machine's drift and
// other load nor the switches between processes tilt their ratios. The peak
// memory comes from the warm-up.
Measure run_lockstep(comm::World& world, const std::string& name, std::int64_t batch,
                     std::optional<DType> autocast, core::Device device, int steps, bool with_floor,
                     const std::vector<std::string>& pythons, const std::string& torch_args,
                     int threads, bool channels_last, bool cuda_graph) {
  bench::SyntheticTraining t(name, batch, device,
                             bench::SyntheticOptions{.channels_last = channels_last});
  const core::Stream& stream = t.stream;
  LossScaler scaler = LossScaler::for_autocast(autocast);
  StepOptions options;
  options.autocast = autocast;
  options.cuda_graph = cuda_graph;
  DataParallelStep data_parallel(*t.model, *t.store, *t.optimizer, make_scheduler("constant", {}),
                                 scaler, &world, options, stream);
  const MicroBatch micro_batch{t.x, t.y};
  auto step = [&] {  // numbered and spanned as the Trainer does, for --trace's cost
    core::trace::set_step(data_parallel.steps() + 1);
    core::trace::reset_breakdown();
    core::trace::Span step_span("step", "step");
    data_parallel.run({&micro_batch, 1});
  };
  const auto sync = [&] { stream.synchronize(); };
  core::reset_peak_memory(device);
  step();  // the first step also makes what the model keeps (autocast copies, scratch)
  KernelPaths kernels = collect_kernel_paths(device, t.optimizer.get(), autocast);
  const std::size_t allocations_before = core::memory_stats(device).allocations;
  for (int i = 0; i < 2; ++i) step();
  sync();
  const core::MemoryStats warm = core::memory_stats(device);
  const double allocations_per_step =
      static_cast<double>(warm.allocations - allocations_before) / 2;
  const std::size_t peak = warm.peak_bytes;

  // Made after the step's own memory, so that a batch too large for the
  // machine is the step's error, not the floor's (bench/gemm_floor.h).
  std::function<void()> floor;
  try {
    if (with_floor) floor = bench::gemm_floor(name, batch);
  } catch (const std::bad_alloc&) {
    throw std::runtime_error(fmt::format(
        "no memory for the GEMM floor of {} at batch {} (its buffers are about the step's own); "
        "give a smaller --batch",
        name, batch));
  }
  std::vector<std::unique_ptr<bench::TorchBaseline>> torches;
  std::vector<std::function<double(int)>> contenders{
      [&](int calls) { return bench::batch_seconds(step, sync, calls); }};
  if (floor)
    contenders.push_back([&](int calls) { return bench::batch_seconds(floor, sync, calls); });
  for (const std::string& python : pythons) {
    torches.push_back(std::make_unique<bench::TorchBaseline>(python, torch_args, threads));
    bench::TorchBaseline* torch = torches.back().get();
    if (torch->ready()) contenders.push_back([torch](int calls) { return torch->run(calls); });
  }
  const std::vector<bench::BlockTimes> blocks =
      bench::warm_blocks(contenders, kBlocks, kBlockSeconds, steps);
  const StepGraphCounts* graph = data_parallel.graph_counts();
  Measure m{1e3 * blocks[0].median,
            peak,
            allocations_per_step,
            std::nullopt,
            {},
            blocks[0],
            std::move(kernels),
            graph ? std::optional<StepGraphCounts>(*graph) : std::nullopt};
  std::size_t next = 1;
  if (floor) m.floor_ms = 1e3 * blocks[next++].median;
  for (const auto& torch : torches) {
    Baseline b{torch->python(), torch->torch_version(), torch->why_none(),
               std::nullopt,    std::nullopt,           std::nullopt};
    if (torch->ready()) {
      b.blocks = blocks[next++];
      b.ms_per_step = 1e3 * b.blocks->median;
      b.peak_bytes = torch->peak_bytes();
    }
    m.baselines.push_back(b);
  }
  return m;
}

// Note [checkpointing comparison]: --activation-checkpointing times the step
// of the model as built and with its blocks checkpointed (engine/nn/
// checkpointed.h), in alternating batches, and measures each one's
// activation peak: the pool's peak during a step less what was allocated
// before it (parameters, gradients, optimizer state, the batch), the most
// over the steps after the first. The medians are of min(--steps, 5) rounds.
struct CheckpointingMeasure {
  double ms_per_step[2];
  std::size_t activation_peak_bytes[2];  // [0] plain, [1] checkpointed
};

CheckpointingMeasure compare_checkpointing(comm::World& world, const std::string& name,
                                           std::int64_t batch, std::optional<DType> autocast,
                                           core::Device device, int steps, bool channels_last) {
  CheckpointingMeasure m{};
  std::vector<std::unique_ptr<bench::SyntheticTraining>> runs;
  std::vector<std::unique_ptr<LossScaler>> scalers;
  std::vector<std::unique_ptr<DataParallelStep>> data_parallel;
  std::vector<std::function<double(int)>> contenders;
  for (int checkpointed = 0; checkpointed < 2; ++checkpointed) {
    runs.push_back(std::make_unique<bench::SyntheticTraining>(
        name, batch, device,
        bench::SyntheticOptions{.activation_checkpointing = checkpointed > 0,
                                .channels_last = channels_last}));
    bench::SyntheticTraining& t = *runs.back();
    scalers.push_back(std::make_unique<LossScaler>(LossScaler::for_autocast(autocast)));
    StepOptions options;
    options.autocast = autocast;
    data_parallel.push_back(std::make_unique<DataParallelStep>(
        *t.model, *t.store, *t.optimizer, make_scheduler("constant", {}), *scalers.back(), &world,
        options, t.stream));
    contenders.push_back([&, checkpointed, calls_so_far = 0](int calls) mutable {
      bench::SyntheticTraining& run = *runs[checkpointed];
      const MicroBatch micro_batch{run.x, run.y};
      double seconds = 0;
      for (int c = 0; c < calls; ++c, ++calls_so_far) {
        run.stream.synchronize();
        const std::size_t live = core::memory_stats(device).current_bytes;
        core::reset_peak_memory(device);
        const auto start = std::chrono::steady_clock::now();
        data_parallel[checkpointed]->run({&micro_batch, 1});
        run.stream.synchronize();
        seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
        if (calls_so_far > 0)
          m.activation_peak_bytes[checkpointed] = std::max(
              m.activation_peak_bytes[checkpointed], core::memory_stats(device).peak_bytes - live);
      }
      return seconds;
    });
  }
  // --steps 1 to 4 are fewer rounds, for a model whose step takes seconds (gpt2).
  const std::vector<double> medians =
      bench::interleaved_medians(contenders, std::min(steps, 5), 0.002 * steps);
  for (int i = 0; i < 2; ++i) m.ms_per_step[i] = 1e3 * medians[i];
  return m;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"bench_step: training-step throughput of a model preset against PyTorch"};
  std::string model = "mlp", precision = "fp32", device_text = "cpu", json_path;
  std::vector<std::string> pythons{"/usr/bin/python3"};
  std::int64_t batch = 128;
  int steps = 30, threads = 1;
  bool baseline = true;
  app.add_option("--model", model, "mlp, cnn, resnet, resnet50, mlp-large, gpt-tiny or gpt2")
      ->capture_default_str();
  app.add_option("--batch", batch, "batch size")->capture_default_str();
  app.add_option("--precision", precision, "fp32, fp16 or bf16")->capture_default_str();
  app.add_option("--device", device_text, "cpu or cuda")->capture_default_str();
  app.add_option("--steps", steps, "the fewest timed steps in a block (each lasts at least 1 s)")
      ->capture_default_str();
  app.add_option("--threads", threads,
                 "CPU threads (the GEMM library's; PyTorch's intra-op threads)")
      ->capture_default_str();
  app.add_option("--python", pythons,
                 "python with torch, for the baseline (repeat for several baselines, all timed "
                 "in the same run; the first fills the table's PyTorch columns)")
      ->capture_default_str();
  app.add_option("--baseline", baseline, "run the PyTorch baseline")->capture_default_str();
  bool torch_compile = false;
  app.add_flag("--torch-compile", torch_compile,
               "the PyTorch baseline times torch.compile(model), compiled in its untimed warm-up "
               "(bench/torch_step.py --compile; where that PyTorch cannot compile, the baseline "
               "is none and says why)");
  bool torch_channels_last = false, torch_cudnn_benchmark = false, channels_last = false;
  app.add_flag("--channels-last", channels_last,
               "lockstep's resnet and resnet50 on channels-last (NHWC) activations (Note "
               "[channels-last layers]); pair it with --torch-channels-last for a like-for-like "
               "baseline");
  app.add_flag("--torch-channels-last", torch_channels_last,
               "the PyTorch baseline's image models in torch.channels_last, weights and inputs "
               "(bench/torch_step.py --channels-last; NGC's ResNet-50 runs NHWC)");
  app.add_flag("--torch-cudnn-benchmark", torch_cudnn_benchmark,
               "the PyTorch baseline autotunes cuDNN in its untimed warm-up "
               "(bench/torch_step.py --cudnn-benchmark)");
  bool cuda_graph = false;
  app.add_flag("--cuda-graph", cuda_graph,
               "lockstep's forward and backward replayed as a CUDA graph once captured after "
               "two eager warm-up steps (StepOptions::cuda_graph, Note [step graph])");
  bool unfused = false;
  app.add_flag("--unfused", unfused,
               "lockstep runs the unfused ops its fused CUDA kernels replace "
               "(kernels::set_fused_kernels(false), Note [one fusion switch]): one build timed "
               "both ways");
  bool no_gemm_timing = false;
  app.add_flag("--no-gemm-timing", no_gemm_timing,
               "new CUDA GEMM plans take cuBLASLt's first heuristic algorithm instead of the "
               "fastest of up to 8 timed (Note [timed gemm algorithms])");
  bool no_conv_timing = false;
  app.add_flag("--no-conv-timing", no_conv_timing,
               "new cuDNN convolution plans take the heuristic's algorithm instead of the "
               "fastest timed by cudnnFind (kernels::set_conv_autotune(false), Note [conv "
               "algorithm choice])");
  app.add_option("--json", json_path, "write JSON lines here");
  std::string trace_dir;
  app.add_option("--trace", trace_dir, "trace every step to DIR/rank-0.json (to measure its cost)");
  bool activation_checkpointing = false;
  app.add_flag("--activation-checkpointing", activation_checkpointing,
               "instead of PyTorch: the step and its activation peak with and without "
               "activation checkpointing (gpt-tiny, gpt2, resnet, resnet50; Note [checkpointing "
               "comparison])");
  // What each flag accepts (examples/common/flags.h), checked while parsing.
  app.get_option("--model")->check(examples::model_name());
  app.get_option("--batch")->check(examples::within(1, examples::kMaxRows));
  app.get_option("--precision")->check(examples::precision_name());
  app.get_option("--device")->check(examples::device_name());
  app.get_option("--steps")->check(examples::within(1, 1e6));
  app.get_option("--threads")->check(examples::threads_per_rank());
  app.get_option("--python")->check(examples::non_empty());
  app.get_option("--json")->check(examples::non_empty());
  app.get_option("--trace")->check(examples::non_empty());
  CLI11_PARSE(app, argc, argv);
  std::signal(SIGPIPE, SIG_IGN);  // a baseline that dies is reported, not fatal
  kernels::set_fused_kernels(!unfused);
  kernels::set_conv_autotune(!no_conv_timing);
#if LOCKSTEP_WITH_CUDA
  kernels::cuda::set_gemm_timing(!no_gemm_timing);
#endif
  std::unique_ptr<comm::World> world;
  try {
    if (!trace_dir.empty()) examples::start_trace(0, trace_dir, "1:");
    world = comm::init(argc, argv, {.use_gpu = examples::usable_device(device_text).is_cuda()});
    if (world->size() > 1)
      throw InvalidArgument("bench_step runs as one process: start it without mpirun");
    const core::Device device = world->device();
    examples::use_cpu_threads(threads, true);
    std::optional<DType> autocast;
    if (precision == "fp16")
      autocast = DType::f16;
    else if (precision == "bf16")
      autocast = DType::bf16;
    else if (precision != "fp32")
      throw InvalidArgument("--precision '" + precision + "' is not fp32, fp16 or bf16");

    if (activation_checkpointing) {
      if (channels_last) fmt::print("activations: channels-last (NHWC; --channels-last)\n");
      const CheckpointingMeasure c =
          compare_checkpointing(*world, model, batch, autocast, device, steps, channels_last);
      const double time_ratio = c.ms_per_step[1] / c.ms_per_step[0];
      const double memory_ratio = static_cast<double>(c.activation_peak_bytes[1]) /
                                  static_cast<double>(c.activation_peak_bytes[0]);
      fmt::print("{:<10} {:>6} {:>6} {:>7} {:>14} {:>16} {:>16}\n", "model", "batch", "prec",
                 "device", "checkpointing", "ms/step", "activation MiB");
      for (int i = 0; i < 2; ++i)
        fmt::print("{:<10} {:>6} {:>6} {:>7} {:>14} {:>16.2f} {:>16.1f}\n", model, batch, precision,
                   device.str(), i ? "on" : "off", c.ms_per_step[i],
                   c.activation_peak_bytes[i] / 1048576.0);
      fmt::print("checkpointed / plain: step time {:.3f}x, activation peak {:.3f}x\n", time_ratio,
                 memory_ratio);
      bench::JsonLines(json_path).write(
          {bench::field("bench", "step_activation_checkpointing"), bench::field("model", model),
           bench::field("channels_last", channels_last),
           bench::field("batch", static_cast<long long>(batch)),
           bench::field("precision", precision), bench::field("device", device.str()),
           bench::field("threads", static_cast<long long>(threads)),
           bench::field("ms_per_step", c.ms_per_step[0]),
           bench::field("checkpointed_ms_per_step", c.ms_per_step[1]),
           bench::field("activation_peak_bytes",
                        static_cast<long long>(c.activation_peak_bytes[0])),
           bench::field("checkpointed_activation_peak_bytes",
                        static_cast<long long>(c.activation_peak_bytes[1])),
           bench::field("step_time_ratio", time_ratio),
           bench::field("activation_peak_ratio", memory_ratio)});
      world->shutdown();
      return 0;
    }
    const bool with_floor = !device.is_cuda() && precision == "fp32";
    const std::string torch_args = fmt::format(
        "--model {} --batch {} --precision {} --device {} --threads {}{}", model, batch, precision,
        device.is_cuda() ? "cuda" : "cpu", threads, torch_compile ? " --compile" : "");
    const std::string torch_step_args = torch_args +
                                        (torch_channels_last ? " --channels-last" : "") +
                                        (torch_cudnn_benchmark ? " --cudnn-benchmark" : "");
    const Measure ours = run_lockstep(*world, model, batch, autocast, device, steps, with_floor,
                                      baseline ? pythons : std::vector<std::string>{},
                                      torch_step_args, threads, channels_last, cuda_graph);
    if (const auto file = core::trace::finish(); !file.empty())
      fmt::print("trace: {}\n", file.string());
    const std::optional<Baseline> first =
        ours.baselines.empty() ? std::nullopt : std::optional<Baseline>(ours.baselines[0]);
    const std::string why_none = !baseline ? "not run (--baseline false)" : first->why_none;
    const std::optional<double> gemm_ms = ours.floor_ms;

    const double samples_per_s = 1e3 * batch / ours.ms_per_step;
    const auto sps = [&](const Baseline& b) {
      return b.ms_per_step ? std::optional<double>(1e3 * batch / *b.ms_per_step) : std::nullopt;
    };
    const auto ratio_of = [&](const Baseline& b) {
      return b.ms_per_step ? std::optional<double>(*b.ms_per_step / ours.ms_per_step)
                           : std::nullopt;
    };
    // The block-by-block ratios' lowest and highest (Note [warm blocks]).
    const auto spread_of = [&](const Baseline& b) {
      if (!b.ms_per_step) return std::pair<std::optional<double>, std::optional<double>>{};
      const auto [low, high] = ratio_spread(ours.blocks, *b.blocks);
      return std::pair<std::optional<double>, std::optional<double>>{low, high};
    };
    const std::optional<double> torch_sps = first ? sps(*first) : std::nullopt;
    const std::optional<double> ratio = first ? ratio_of(*first) : std::nullopt;
    std::optional<double> gemm_ratio, torch_over_gemm;
    if (gemm_ms) gemm_ratio = ours.ms_per_step / *gemm_ms;
    if (gemm_ms && first && first->ms_per_step) torch_over_gemm = *first->ms_per_step / *gemm_ms;
    const ModelPreset& preset = model_preset(model);
    std::optional<double> tokens_per_s, torch_tokens_per_s;
    if (preset.language_model) {
      const auto seq = static_cast<double>(preset.sample_shape[0]);
      tokens_per_s = samples_per_s * seq;
      if (torch_sps) torch_tokens_per_s = *torch_sps * seq;
      fmt::print("tokens/s: lockstep {:.0f}, PyTorch {}\n", *tokens_per_s,
                 torch_tokens_per_s ? fmt::format("{:.0f}", *torch_tokens_per_s) : "-");
    }
    fmt::print("activations: {}\n", channels_last ? "channels-last (NHWC; --channels-last)"
                                                  : "NCHW (PyTorch's default)");
    fmt::print("{:<10} {:>6} {:>6} {:>7} {:>10} {:>12} {:>14} {:>8} {:>12}\n", "model", "batch",
               "prec", "device", "ms/step", "samples/s", "torch samp/s", "ratio", "peak MiB");
    fmt::print("{:<10} {:>6} {:>6} {:>7} {:>10.2f} {:>12.0f} {:>14} {:>8} {:>12.1f}\n", model,
               batch, precision, device.str(), ours.ms_per_step, samples_per_s,
               torch_sps ? fmt::format("{:.0f}", *torch_sps) : "-",
               ratio ? fmt::format("{:.3f}", *ratio) : "-", ours.peak_bytes / 1048576.0);
    if (gemm_ms)
      fmt::print("{} GEMMs alone ({}): {:.2f} ms; step / GEMMs = {:.3f}{}\n", model,
                 kernels::cpu::gemm_library_name(kernels::cpu::gemm_library()), *gemm_ms,
                 *gemm_ratio,
                 torch_over_gemm ? fmt::format("; PyTorch's step / these GEMMs = {:.3f}, the "
                                               "highest ratio a step with them can reach",
                                               *torch_over_gemm)
                                 : "");
    fmt::print("tensors allocated per step: {:.0f}\n", ours.allocations_per_step);
    core::Json graph_json(false);
    if (const std::optional<StepGraphCounts>& g = ours.graph) {
      fmt::print(
          "cuda graph: {} captured ({} nodes, arena {:.1f} MiB), {} replays, {} eager steps\n",
          g->captures, g->nodes, g->arena_bytes / 1048576.0, g->replays, g->eager);
      graph_json =
          bench::object({bench::field("captures", static_cast<long long>(g->captures)),
                         bench::field("replays", static_cast<long long>(g->replays)),
                         bench::field("eager", static_cast<long long>(g->eager)),
                         bench::field("nodes", static_cast<long long>(g->nodes)),
                         bench::field("arena_bytes", static_cast<long long>(g->arena_bytes))});
    }
    for (const std::string& line : ours.kernels.lines()) fmt::print("kernels: {}\n", line);
    fmt::print("lockstep: {:.2f} ms/step, median of {} blocks ({:.2f}-{:.2f})\n", ours.ms_per_step,
               kBlocks, 1e3 * ours.blocks.low, 1e3 * ours.blocks.high);
    for (const Baseline& b : ours.baselines)
      if (b.ms_per_step) {
        const auto [low, high] = ratio_spread(ours.blocks, *b.blocks);
        fmt::print(
            "PyTorch {} ({}): {:.2f} ms/step ({:.2f}-{:.2f}), {:.0f} samples/s; ratio {:.3f} "
            "(block by block {:.3f}-{:.3f})\n",
            b.torch_version, b.python, *b.ms_per_step, 1e3 * b.blocks->low, 1e3 * b.blocks->high,
            *sps(b), *ratio_of(b), low, high);
      } else
        fmt::print("PyTorch under {}: none ({})\n", b.python, b.why_none);
    bench::print_legend(
        baseline ? fmt::format("PyTorch running the same step (bench/torch_step.py under {}, {} "
                               "thread(s){}), timed in {} warm blocks of at least {:g} s taking "
                               "turns with lockstep's (Note [warm blocks] in bench/report.h)",
                               fmt::join(pythons, " and "), threads,
                               torch_compile ? ", torch.compile" : "", kBlocks, kBlockSeconds)
                 : std::string("none: the PyTorch baseline was not run (--baseline false)"),
        std::string("lockstep samples/s / PyTorch samples/s: higher is better") +
            (gemm_ms ? "; step / GEMMs: lower is better, 1 is the GEMMs alone" : ""),
        ratio ? "" : why_none);
    core::Json baselines = core::Json::array();
    for (const Baseline& b : ours.baselines) {
      const std::vector<bench::JsonField> fields{
          bench::field("python", b.python),
          bench::field("torch_version", b.torch_version),
          bench::field("samples_per_s", sps(b)),
          bench::field("ratio", ratio_of(b)),
          bench::field("ratio_low", spread_of(b).first),
          bench::field("ratio_high", spread_of(b).second),
          bench::field("ms_per_step", b.ms_per_step),
          bench::field("ms_per_step_low",
                       b.blocks ? std::optional<double>(1e3 * b.blocks->low) : std::nullopt),
          bench::field("ms_per_step_high",
                       b.blocks ? std::optional<double>(1e3 * b.blocks->high) : std::nullopt),
          bench::field("no_baseline", b.ms_per_step ? core::Json() : core::Json(b.why_none))};
      baselines.push(bench::object(fields));
    }
    bench::JsonLines json(json_path);
    json.write({bench::field("bench", "step"),
                bench::field("model", model),
                bench::field("batch", static_cast<long long>(batch)),
                bench::field("precision", precision),
                bench::field("device", device.str()),
                bench::field("threads", static_cast<long long>(threads)),
                bench::field("cpu_gemm", kernels::cpu::cpu_gemm_kernels().describe()),
                bench::field("samples_per_s", samples_per_s),
                bench::field("ms_per_step", ours.ms_per_step),
                bench::field("ms_per_step_low", 1e3 * ours.blocks.low),
                bench::field("ms_per_step_high", 1e3 * ours.blocks.high),
                bench::field("blocks", static_cast<long long>(kBlocks)),
                bench::field("peak_bytes", static_cast<long long>(ours.peak_bytes)),
                bench::field("allocations_per_step", ours.allocations_per_step),
                bench::field("torch_samples_per_s", torch_sps),
                bench::field("ratio", ratio),
                bench::field("ratio_low", first ? spread_of(*first).first : std::nullopt),
                bench::field("ratio_high", first ? spread_of(*first).second : std::nullopt),
                bench::field("torch_peak_bytes", ratio ? first->peak_bytes : std::nullopt),
                bench::field("gemm_ms", gemm_ms),
                bench::field("step_over_gemm", gemm_ratio),
                bench::field("torch_over_gemm", torch_over_gemm),
                bench::field("tokens_per_s", tokens_per_s),
                bench::field("torch_tokens_per_s", torch_tokens_per_s),
                bench::field("baselines", std::move(baselines)),
                bench::field("channels_last", channels_last),
                bench::field("torch_channels_last", torch_channels_last),
                bench::field("torch_cudnn_benchmark", torch_cudnn_benchmark),
                bench::field("torch_compile", torch_compile),
                bench::field("fused_kernels", !unfused),
                bench::field("cuda_graph", std::move(graph_json)),
                bench::field("gemm_timing", !no_gemm_timing),
                bench::field("conv_timing", !no_conv_timing),
                bench::field("kernels", ours.kernels.json()),
                bench::field("no_baseline", ratio ? core::Json() : core::Json(why_none))});
    world->shutdown();
  } catch (const std::exception& e) {
    fmt::print(stderr, "bench_step: {}\n", e.what());
    return 1;
  }
  return 0;
}
