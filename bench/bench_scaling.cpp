// bench_scaling: how well a full training step (engine::DataParallelStep:
// forward, cross-entropy, backward with bucketed gradient averaging, the
// gradient norm, SGD with momentum or AdamW, the step's loss agreement)
// scales over the ranks it runs on (mpirun -np N), and what a ZeRO stage
// saves and costs against plain data parallelism (Note [zero comparison]).
//
// Everything is measured in one run. The one-rank baseline is rank 0 stepping
// alone while the other ranks sleep (not spin) in a barrier, so "N ranks
// against 1 rank" compares the same binary, model and machine state.
//   weak:   fixed per-rank batch B; efficiency = solo(B) / synced(B)
//   strong: fixed global batch G;   efficiency = solo(G) / (N * synced(G/N))
// Beside the efficiencies it reports the step without synchronisation (all
// ranks computing at once: what sharing the machine costs), the allreduce of
// every bucket alone, the exposed communication and the overlap fraction,
// and it times the synchronised step's parts one after another (Note [serial
// step]) so that the scaling model can account for synced - compute.
// It also writes the inputs of tools/scaling_model.py: the backward profile
// (when each bucket's gradients are complete) and the link's alpha-beta fit.
// Started without mpirun it is a world of one, which still gives the profile
// (the GPU machine has no OpenMPI: tools/gpu-check.sh runs it that way).
// --rank-invariant also times the rank-invariant step (StepOptions::
// rank_invariant, docs/reproducibility.md) beside the default synchronised
// step, alternating, at the same micro-batch and world size, with the memory
// each holds; on CUDA both with the deterministic kernels the mode requires
// (Note [deterministic gemm]), so that the ratio is the mode's own cost.
#include <fmt/core.h>
#include <mpi.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "bench/report.h"
#include "bench/synthetic_training.h"
#include "comm/gradient_synchronizer.h"
#include "comm/world.h"
#include "engine/core/memory.h"
#include "engine/core/ops.h"
#include "engine/core/random.h"
#include "engine/core/trace.h"
#include "engine/data_parallel_step.h"
#include "engine/nn/loss.h"
#include "engine/optim/loss_scaler.h"
#include "engine/parameter_store.h"
#include "examples/common/flags.h"
#include "kernels/conv.h"
#include "kernels/gemm.h"

using namespace lockstep;
using namespace lockstep::engine;
using Clock = std::chrono::steady_clock;

namespace {

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

struct Config {
  int steps = 20;  // per timed block
  int trials = 5;  // blocks; the median is reported
  int warmup = 3;
  bool mpi = true;  // false: a world of one started without mpirun
};

// A barrier that sleeps while it waits, so that idle ranks leave their cores
// to the rank being measured (MPI_Barrier would spin on them).
void sleeping_barrier(const Config& config) {
  if (!config.mpi) return;
  MPI_Request request = MPI_REQUEST_NULL;
  MPI_Ibarrier(MPI_COMM_WORLD, &request);
  for (int done = 0; MPI_Test(&request, &done, MPI_STATUS_IGNORE), !done;) ::usleep(200);
}

double slowest(const Config& config, double seconds) {
  if (config.mpi) MPI_Allreduce(MPI_IN_PLACE, &seconds, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  return seconds;
}

// Note [serial step]: without host overlap (Note [host overlap]) the
// synchronised step is the step without sync, then a wait for the slowest
// rank, then the communication, after which the next forward starts with
// caches the communication has filled. bench_scaling times that sequence
// with a barrier between compute and communication, per rank and per part, so
// that the scaling model can name each part of synced - compute
// (tools/scaling_model.py --check):
//   straggler:        E[max over ranks of a step's compute] - max over ranks
//                     of E[compute]; with a barrier, every rank's compute +
//                     wait is the slowest compute of that step, so this is the
//                     mean over ranks of compute + wait less the largest mean
//                     compute. It is what averaging a block hides from the
//                     compute column.
//   comm in step:     the communication right after backward, ranks aligned,
//                     against the comm column (communication alone, repeated
//                     on the same buffers): what following backward costs it.
//   compute after comm: the largest mean compute here less the compute
//                     column: forward and optimizer refilling the caches the
//                     communication evicted.
// The part of synced that these leave is the synchronised path's own cost
// (the step agreement, the synchroniser's bookkeeping).
//
// Per-rank times of the serial step's parts, step by step.
struct SerialTimes {
  std::vector<double> compute, wait, comm;
  void add(double c, double w, double m) {
    compute.push_back(c);
    wait.push_back(w);
    comm.push_back(m);
  }
};

// What a runner trains: a model preset at a per-rank batch, its precision,
// device and optimizer (bench::SyntheticTraining).
struct Workload {
  std::string model;
  std::int64_t batch = 0;
  std::optional<DType> autocast;
  core::Device device;
  std::string optimizer = "sgd";
};

// One rank's model, optimizer and synthetic batch, and the three kinds of
// step the benchmark times. Both training steps are engine::DataParallelStep:
// over the world (built collectively, only when the runner takes part in
// synchronised steps) or this rank's alone (no communication at all). With
// `without_sync` false the runner has only the synchronised step, over a
// store laid out for its ZeRO stage and the one optimizer that step shards,
// so that what it holds is what that stage holds (Note [zero comparison]).
class StepRunner {
 public:
  StepRunner(const Workload& w, comm::World* world, comm::SynchronizerOptions options = {},
             bool rank_invariant = false, bool without_sync = true)
      : t_(w.model, w.batch, w.device,
           {.optimizer = w.optimizer,
            .zero_stage = world ? options.zero_stage : 0,
            .world_size = world ? world->size() : 1}),
        scaler_(LossScaler::for_autocast(w.autocast)),
        batch_{t_.x, t_.y} {
    if (without_sync) {
      // The step without sync shares the store, which ZeRO-2 and ZeRO-3 shard.
      if (world && options.zero_stage >= 2)
        throw InvalidArgument(fmt::format(
            "the step without sync cannot share a ZeRO-{} store (the scaling tables are "
            "measured at --zero 0 or 1)",
            options.zero_stage));
      local_ = make_step(nullptr, w.autocast, unsharded(options), *t_.optimizer);
    }
    if (!world) return;
    // ZeRO-1 beside the step without sync: the synchronised step shards an
    // optimizer of its own (the same kind); the step without sync keeps the
    // whole one.
    if (options.zero_stage == 1 && local_)
      shard_optimizer_ = bench::make_optimizer(w.optimizer, *t_.store, t_.stream);
    synced_ = make_step(world, w.autocast, options,
                        shard_optimizer_ ? *shard_optimizer_ : *t_.optimizer, rank_invariant);
  }

  // The training step; with `synchronise`, gradients are averaged over the
  // ranks as backward produces them and the ranks agree on the loss.
  // Synchronised steps are numbered alone in the trace, so that the numbers
  // agree across ranks; a step without sync takes the number of the last
  // synchronised one.
  void step(bool synchronise) {
    if (synchronise) core::trace::set_step(synced_->steps() + 1);
    core::trace::Span step_span(synchronise ? "step" : "step without sync", "step");
    (synchronise ? *synced_ : *local_).run({&batch_, 1});
  }

  // Every bucket's allreduce (ZeRO-1: reduce-scatter, then the parameter
  // gather) with nothing to overlap it.
  void communicate_only() {
    comm::GradientSynchronizer& sync = synced_->synchronizer();
    sync.begin_step(synced_->steps());
    for (std::size_t s = 0; s < sync.segments().size(); ++s) sync.mark_ready(s);
    sync.finish();
    if (sync.sharded()) sync.gather(t_.store->values());
  }

  // The synchronised step's work in sequence (Note [serial step]), each part
  // timed on this rank: the step without sync, a barrier (the wait for the
  // slowest rank), then every bucket's communication.
  void serial_step(comm::Communicator& host, SerialTimes& times) {
    const auto start = Clock::now();
    step(false);
    synchronize();
    const auto computed = Clock::now();
    host.barrier();
    const auto aligned = Clock::now();
    communicate_only();
    synchronize();
    times.add(std::chrono::duration<double>(computed - start).count(),
              std::chrono::duration<double>(aligned - computed).count(), seconds_since(aligned));
  }

  struct Profile {
    double forward_ms = 0, backward_ms = 0, optimizer_ms = 0;
    std::vector<double> segment_ready_ms;  // from the start of backward, in ready order
  };
  // The median of `repeats` profiles, field by field, after one discarded: a
  // first step pays for first-touch allocations (its forward takes several
  // times as long) and would tell the scaling model of another step.
  Profile warm_profile(int repeats) {
    profile();
    std::vector<Profile> runs;
    for (int i = 0; i < repeats; ++i) runs.push_back(profile());
    auto median = [&](auto field) {
      std::vector<double> v;
      for (const Profile& r : runs) v.push_back(field(r));
      std::sort(v.begin(), v.end());
      return v[v.size() / 2];
    };
    Profile p;
    p.forward_ms = median([](const Profile& r) { return r.forward_ms; });
    p.backward_ms = median([](const Profile& r) { return r.backward_ms; });
    p.optimizer_ms = median([](const Profile& r) { return r.optimizer_ms; });
    for (std::size_t s = 0; s < runs.front().segment_ready_ms.size(); ++s)
      p.segment_ready_ms.push_back(median([s](const Profile& r) { return r.segment_ready_ms[s]; }));
    return p;
  }
  // One step timed in its phases. A GPU stream is synchronised at every
  // readiness to read the host clock; the ready times are then rescaled so
  // that the last one equals the backward time measured without those stalls.
  Profile profile() {
    Profile p;
    Context ctx = local_->context(0, t_.x.dim(0));
    t_.store->zero_grad(t_.stream);
    t_.stream.synchronize();
    auto start = Clock::now();
    const core::Tensor loss = loss_.forward(t_.model->forward(t_.x, ctx), t_.y, ctx);
    t_.stream.synchronize();
    p.forward_ms = 1e3 * seconds_since(start);
    start = Clock::now();
    t_.model->backward(loss_.backward(1.0f, ctx), ctx);
    t_.stream.synchronize();
    p.backward_ms = 1e3 * seconds_since(start);
    start = Clock::now();
    t_.optimizer->step(t_.stream);
    t_.store->zero_grad(t_.stream);
    t_.stream.synchronize();
    p.optimizer_ms = 1e3 * seconds_since(start);

    p.segment_ready_ms.assign(t_.store->slots().size(), 0.0);
    ctx.on_grad_ready = [&](Parameter& param) {
      t_.stream.synchronize();
      p.segment_ready_ms[t_.store->index_of(param)] = 1e3 * seconds_since(start);
    };
    const core::Tensor again = loss_.forward(t_.model->forward(t_.x, ctx), t_.y, ctx);
    const core::Tensor dy = loss_.backward(1.0f, ctx);
    t_.stream.synchronize();
    start = Clock::now();
    t_.model->backward(dy, ctx);
    t_.stream.synchronize();
    const double stalled_ms = 1e3 * seconds_since(start);
    for (double& t : p.segment_ready_ms) t *= p.backward_ms / stalled_ms;
    t_.store->zero_grad(t_.stream);
    t_.stream.synchronize();
    return p;
  }

  void synchronize() const { t_.stream.synchronize(); }
  // Optimizer state held by this rank in synchronised steps.
  std::int64_t optimizer_state_bytes() const {
    return (shard_optimizer_ ? *shard_optimizer_ : *t_.optimizer).state_bytes();
  }
  comm::GradientSynchronizer& synchronizer() { return synced_->synchronizer(); }
  std::int64_t parameters() const {
    std::int64_t n = 0;
    for (const ParameterStore::Slot& s : t_.store->slots()) n += s.numel;
    return n;
  }

 private:
  static comm::SynchronizerOptions unsharded(comm::SynchronizerOptions sync) {
    sync.zero_stage = 0;
    return sync;
  }
  std::unique_ptr<DataParallelStep> make_step(comm::World* world, std::optional<DType> autocast,
                                              const comm::SynchronizerOptions& sync,
                                              Optimizer& optimizer, bool rank_invariant = false) {
    StepOptions o;
    o.autocast = autocast;
    o.sync = sync;
    o.rank_invariant = rank_invariant;
    return std::make_unique<DataParallelStep>(*t_.model, *t_.store, optimizer,
                                              make_scheduler("constant", {}), scaler_, world, o,
                                              t_.stream);
  }

  bench::SyntheticTraining t_;
  LossScaler scaler_;
  MicroBatch batch_;
  std::unique_ptr<Optimizer> shard_optimizer_;  // ZeRO-1's; before the steps that use it
  std::unique_ptr<DataParallelStep> local_, synced_;
  CrossEntropyLoss loss_;  // the profile's
};

// One kind of step: run by every rank, or (solo) by rank 0 alone while the
// others sleep through it. `wait` ends a timed block: the stream
// synchronisation that makes a GPU's queued steps count.
struct Phase {
  bool take_part;
  std::function<void()> step;
  std::function<void()> wait;
};

// Per phase, the median over blocks of the slowest participating rank's
// seconds per step. Blocks of the phases alternate (trial by trial), so that
// a drift of the machine's speed hits every phase alike rather than biasing
// the ratio of two of them.
std::vector<double> time_phases(const Config& config, const std::vector<Phase>& phases) {
  for (const Phase& p : phases)
    if (p.take_part)
      for (int i = 0; i < config.warmup; ++i) p.step();
  std::vector<std::vector<double>> blocks(phases.size());
  for (int t = 0; t < config.trials; ++t)
    for (std::size_t k = 0; k < phases.size(); ++k) {
      sleeping_barrier(config);
      double s = 0.0;
      if (phases[k].take_part) {
        const auto start = Clock::now();
        for (int i = 0; i < config.steps; ++i) phases[k].step();
        phases[k].wait();
        s = seconds_since(start) / config.steps;
      }
      blocks[k].push_back(slowest(config, s));
    }
  std::vector<double> medians;
  for (auto& b : blocks) {
    std::sort(b.begin(), b.end());
    medians.push_back(b[b.size() / 2]);
  }
  return medians;
}

// Step-to-step variation of the unsynchronised step on every rank at once:
// the standard deviation of single step times over their mean, averaged over
// the ranks. A synchronised step waits for the slowest rank, so this is what
// the scaling model's straggler term needs (tools/scaling_model.py).
double relative_jitter(const Config& config, StepRunner& runner) {
  std::vector<double> s;
  sleeping_barrier(config);
  for (int i = 0; i < config.steps * config.trials; ++i) {
    const auto start = Clock::now();
    runner.step(false);
    runner.synchronize();
    s.push_back(seconds_since(start));
  }
  double mean = 0, var = 0;
  for (double x : s) mean += x / static_cast<double>(s.size());
  for (double x : s) var += (x - mean) * (x - mean) / static_cast<double>(s.size());
  double jitter = std::sqrt(var) / mean;
  if (!config.mpi) return jitter;
  MPI_Allreduce(MPI_IN_PLACE, &jitter, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
  int ranks = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &ranks);
  return jitter / ranks;
}

// The serial step's terms (Note [serial step]), from every rank's times: per
// part, the median over the timed blocks of the block's mean, then over ranks.
struct SerialTerms {
  double compute_s = 0, straggler_s = 0, comm_s = 0;
};

SerialTerms serial_terms(const Config& config, const SerialTimes& t) {
  auto block_median = [&](auto value) {
    std::vector<double> means;
    const auto steps = static_cast<std::size_t>(config.steps);
    for (auto first = static_cast<std::size_t>(config.warmup); first + steps <= t.compute.size();
         first += steps) {
      double sum = 0;
      for (std::size_t i = first; i < first + steps; ++i) sum += value(i);
      means.push_back(sum / static_cast<double>(steps));
    }
    std::sort(means.begin(), means.end());
    return means[means.size() / 2];
  };
  double largest = block_median([&](std::size_t i) { return t.compute[i]; });
  double reached = block_median([&](std::size_t i) { return t.compute[i] + t.wait[i]; });
  double comm = block_median([&](std::size_t i) { return t.comm[i]; });
  if (config.mpi) {
    int ranks = 1;
    MPI_Comm_size(MPI_COMM_WORLD, &ranks);
    MPI_Allreduce(MPI_IN_PLACE, &largest, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    MPI_Allreduce(MPI_IN_PLACE, &reached, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
    MPI_Allreduce(MPI_IN_PLACE, &comm, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
    reached /= ranks;
    comm /= ranks;
  }
  return {largest, std::max(0.0, reached - largest), comm};
}

struct Row {
  std::string mode;
  std::int64_t batch_per_rank, global_batch;
  double solo_s, compute_s, synced_s, comm_s, efficiency;
  double jitter;
  double serial_s;  // the serial step (Note [serial step]) and its terms
  SerialTerms serial;

  double exposed_s() const { return std::max(0.0, synced_s - compute_s); }
  // The share of the communication that backward hid.
  double overlap() const {
    return comm_s > 0 ? std::clamp(1.0 - exposed_s() / comm_s, 0.0, 1.0) : 1.0;
  }
};

void print_row(const Row& r, int ranks) {
  fmt::print(
      "{:<7} {:>5} {:>7} {:>7} {:>9.2f} {:>11.2f} {:>10.2f} {:>8.2f} {:>10.2f} {:>8.0f}% "
      "{:>11.3f}\n",
      r.mode, ranks, r.batch_per_rank, r.global_batch, r.solo_s * 1e3, r.compute_s * 1e3,
      r.synced_s * 1e3, r.comm_s * 1e3, r.exposed_s() * 1e3, r.overlap() * 100, r.efficiency);
}

std::vector<bench::JsonField> row_fields(const Row& r, int ranks) {
  return {bench::field("mode", r.mode),
          bench::field("ranks", static_cast<long long>(ranks)),
          bench::field("batch_per_rank", static_cast<long long>(r.batch_per_rank)),
          bench::field("global_batch", static_cast<long long>(r.global_batch)),
          bench::field("solo_ms", r.solo_s * 1e3),
          bench::field("compute_ms", r.compute_s * 1e3),
          bench::field("synced_ms", r.synced_s * 1e3),
          bench::field("comm_ms", r.comm_s * 1e3),
          bench::field("exposed_ms", r.exposed_s() * 1e3),
          bench::field("overlap", r.overlap()),
          bench::field("contention", r.compute_s / r.solo_s),
          bench::field("jitter", r.jitter),
          bench::field("serial_ms", r.serial_s * 1e3),
          bench::field("serial_compute_ms", r.serial.compute_s * 1e3),
          bench::field("straggler_ms", r.serial.straggler_s * 1e3),
          bench::field("comm_in_step_ms", r.serial.comm_s * 1e3),
          bench::field("efficiency", r.efficiency)};
}

// Allreduce seconds at sizes from 4 KiB to 64 MiB, and the alpha-beta cost
// t = alpha + (2 (p-1) / p) * bytes / bus_bandwidth (nccl-tests' busbw):
// alpha from the smallest message, the bandwidth from the size nearest the
// model's largest bucket (on a CPU a 2 MB message stays in the caches and
// runs twice as fast as a 64 MiB one). Two points, not a least-squares fit:
// on a loaded machine one slow point would tilt a fit into a negative alpha.
struct LinkFit {
  std::vector<std::int64_t> sizes;
  std::vector<double> seconds;
  double alpha_s = 0, bus_bytes_per_s = 0;
};

LinkFit fit_link(comm::World& world, core::Device device, const Config& config,
                 std::int64_t bucket_bytes) {
  LinkFit fit;
  comm::Communicator& comm = world.for_device(device);
  const core::Stream stream = core::Stream::create(device);
  for (std::int64_t bytes = 4096; bytes <= (std::int64_t{64} << 20); bytes *= 8) {
    core::Tensor buffer = core::Tensor::zeros({bytes / 4}, DType::f32, device, stream);
    fit.sizes.push_back(bytes);
    const Phase allreduce{true, [&] { comm.allreduce(buffer, comm::ReduceOp::sum, stream); },
                          [&] { stream.synchronize(); }};
    fit.seconds.push_back(time_phases(config, {allreduce})[0]);
  }
  std::size_t at = fit.sizes.size() - 1;  // nearest on a log scale
  for (std::size_t i = 1; i < fit.sizes.size(); ++i)
    if (std::fabs(std::log(static_cast<double>(fit.sizes[i]) / bucket_bytes)) <
        std::fabs(std::log(static_cast<double>(fit.sizes[at]) / bucket_bytes)))
      at = i;
  const double p = world.size();
  const double bus_bytes = 2.0 * (p - 1) / p * static_cast<double>(fit.sizes[at]);
  fit.alpha_s = fit.seconds.front();
  // A noisy run can time the small message slower than the large one; then
  // the whole large-message time counts as transfer.
  const double transfer_s =
      fit.seconds[at] > fit.alpha_s ? fit.seconds[at] - fit.alpha_s : fit.seconds[at];
  fit.bus_bytes_per_s = bus_bytes / transfer_s;
  return fit;
}

// The device's dense GEMM rate in the step's compute type, for the scaling
// model's translation of this profile to another device.
double gemm_gflops(core::Device device, std::optional<DType> autocast) {
  const std::int64_t n = device.is_cuda() ? 8192 : 1024;
  const DType type = autocast.value_or(DType::f32);
  const core::Stream stream = core::Stream::create(device);
  core::Tensor a = core::Tensor::empty({n, n}, DType::f32, device, stream);
  core::Generator(3).normal(a, 0.0f, 1.0f, stream);
  core::Tensor in = a;
  if (type != DType::f32) {
    in = core::Tensor::empty({n, n}, type, device, stream);
    core::ops::cast(a, in, stream);
  }
  core::Tensor c = core::Tensor::empty({n, n}, type, device, stream);
  const double s = bench::median_seconds([&] { core::ops::matmul(in, in, c, {}, stream); },
                                         [&] { stream.synchronize(); }, 3, 0.2);
  return 2.0 * static_cast<double>(n * n * n) / s / 1e9;
}

struct Options {
  std::string model = "mlp", precision = "fp32", device = "cpu", mode = "both", json;
  std::string optimizer = "sgd";
  std::int64_t batch = 128, global_batch = 0;
  int threads = 1, zero = 0;
  double bucket_cap_mib = 25, first_bucket_cap_mib = 1;
  std::string host_overlap = "auto";
  bool link = true, rank_invariant = false;
  std::string trace, trace_steps = "1:";
};

// Memory on `device` that constructing a runner and one synchronised step
// leave held, the model state among it, and the peak of a further step above
// it (Note [memory kinds]).
struct RunnerMemory {
  std::size_t held_bytes = 0, step_peak_bytes = 0;
  // Of held_bytes: the parameters, gradients and optimizer state, between steps.
  std::size_t parameter_bytes = 0, gradient_bytes = 0, optimizer_state_bytes = 0;
  std::size_t gathered_bytes = 0;  // the gathered kind's own peak in the further step
  std::size_t model_state_bytes() const {
    return parameter_bytes + gradient_bytes + optimizer_state_bytes;
  }
};

template <typename Make>
RunnerMemory measure_memory(core::Device device, Make&& make, std::optional<StepRunner>& runner) {
  const core::MemoryStats before = core::memory_stats(device);
  make();
  runner->step(true);
  runner->synchronize();
  const core::MemoryStats between = core::memory_stats(device);
  const auto held = [&](core::MemoryKind kind) {
    const auto k = static_cast<std::size_t>(kind);
    return between.current_by_kind[k] - before.current_by_kind[k];
  };
  RunnerMemory m;
  m.held_bytes = between.current_bytes - before.current_bytes;
  m.parameter_bytes = held(core::MemoryKind::parameters);
  m.gradient_bytes = held(core::MemoryKind::gradients);
  m.optimizer_state_bytes = held(core::MemoryKind::optimizer_state);
  core::reset_peak_memory(device);
  runner->step(true);
  runner->synchronize();
  const core::MemoryStats after = core::memory_stats(device);
  m.step_peak_bytes = after.peak_bytes - after.current_bytes;
  m.gathered_bytes = after.kind_peak_bytes[static_cast<std::size_t>(core::MemoryKind::gathered)];
  return m;
}

// Note [zero comparison]: `--zero Z` (Z >= 1) measures ZeRO-Z against plain
// data parallelism in the same run, at the same per-rank batch and world
// size. Each runner is built afresh, one after the other, with only its
// synchronised step and the optimizer that step shards (StepRunner's
// `without_sync` false), so that what the memory counters gain while it is
// built and steps once is its own. Its model state is what the parameters,
// gradients and optimizer_state kinds (Note [memory kinds]) then hold between
// steps; gathered_bytes is the gathered kind's own peak over a further step:
// ZeRO-3's working set of gathered parameters. Every figure is the largest
// over the ranks (shards differ by at most one chunk). The two steps are then
// timed alternating, block by block (time_phases).
void compare_zero(comm::World& world, const Options& o, const Config& config, const Workload& work,
                  const comm::SynchronizerOptions& sync, bench::JsonLines& json,
                  const std::vector<bench::JsonField>& common) {
  comm::SynchronizerOptions plain_sync = sync;
  plain_sync.zero_stage = 0;
  std::optional<StepRunner> plain, sharded;
  const RunnerMemory pm = measure_memory(
      work.device, [&] { plain.emplace(work, &world, plain_sync, false, false); }, plain);
  const RunnerMemory zm = measure_memory(
      work.device, [&] { sharded.emplace(work, &world, sync, false, false); }, sharded);
  const auto largest = [&](std::size_t bytes) {
    unsigned long long b = bytes;
    if (config.mpi)
      MPI_Allreduce(MPI_IN_PLACE, &b, 1, MPI_UNSIGNED_LONG_LONG, MPI_MAX, MPI_COMM_WORLD);
    return static_cast<long long>(b);
  };
  struct Figures {
    long long parameters, gradients, optimizer_state, model_state, gathered, step_peak;
  };
  const auto figures = [&](const RunnerMemory& m) {
    return Figures{largest(m.parameter_bytes),       largest(m.gradient_bytes),
                   largest(m.optimizer_state_bytes), largest(m.model_state_bytes()),
                   largest(m.gathered_bytes),        largest(m.step_peak_bytes)};
  };
  const Figures p = figures(pm), z = figures(zm);
  const std::vector<double> t =
      time_phases(config, {{true, [&] { plain->step(true); }, [&] { plain->synchronize(); }},
                           {true, [&] { sharded->step(true); }, [&] { sharded->synchronize(); }}});
  if (world.rank() != 0) return;
  const double mib = 1.0 / (1 << 20);
  fmt::print(
      "\nZeRO-{} against plain data parallelism, {} per rank, {} ranks, {} (the largest over "
      "the ranks; model state = parameters + gradients + optimizer state held between steps)\n",
      o.zero, o.batch, world.size(), o.optimizer);
  fmt::print("{:<8} {:>11} {:>11} {:>11} {:>12} {:>10} {:>10} {:>9}\n", "", "params MiB",
             "grads MiB", "optim MiB", "model state", "gathered", "step peak", "step ms");
  const auto line = [&](const std::string& name, const Figures& f, double seconds) {
    fmt::print("{:<8} {:>11.2f} {:>11.2f} {:>11.2f} {:>12.2f} {:>10.2f} {:>10.2f} {:>9.2f}\n", name,
               f.parameters * mib, f.gradients * mib, f.optimizer_state * mib, f.model_state * mib,
               f.gathered * mib, f.step_peak * mib, seconds * 1e3);
  };
  line("ZeRO-0", p, t[0]);
  line(fmt::format("ZeRO-{}", o.zero), z, t[1]);
  const double state_ratio =
      static_cast<double>(z.model_state) / static_cast<double>(p.model_state);
  fmt::print("ratio: model state {:.3f}, step time {:.3f}\n", state_ratio, t[1] / t[0]);
  std::vector<bench::JsonField> fields = common;
  for (auto& f : std::vector<bench::JsonField>{
           bench::field("ranks", static_cast<long long>(world.size())),
           bench::field("batch", static_cast<long long>(o.batch)),
           bench::field("optimizer", o.optimizer),
           bench::field("zero", static_cast<long long>(o.zero)),
           bench::field("params", static_cast<long long>(plain->parameters())),
           bench::field("parameter_bytes", z.parameters),
           bench::field("gradient_bytes", z.gradients),
           bench::field("optimizer_state_bytes", z.optimizer_state),
           bench::field("model_state_bytes", z.model_state),
           bench::field("gathered_bytes", z.gathered), bench::field("step_peak_bytes", z.step_peak),
           bench::field("step_ms", t[1] * 1e3),
           bench::field("plain_model_state_bytes", p.model_state),
           bench::field("plain_step_peak_bytes", p.step_peak),
           bench::field("plain_step_ms", t[0] * 1e3),
           bench::field("model_state_ratio", state_ratio), bench::field("step_ratio", t[1] / t[0])})
    fields.push_back(f);
  json.write(fields);
}

// The profile, weak and strong scaling, the link's fit and the rank-invariant
// step, at ZeRO stage 0 or 1 (the step without sync shares the store).
void scaling_tables(comm::World& world, const Options& o, const Config& config,
                    const Workload& work, std::int64_t global,
                    const comm::SynchronizerOptions& sync, bench::JsonLines& json,
                    const std::function<std::vector<bench::JsonField>(const char*)>& common) {
  const bool rank0 = world.rank() == 0;
  const int n = world.size();
  const core::Device device = work.device;
  const std::optional<DType> autocast = work.autocast;
  const auto at_batch = [&](std::int64_t batch) {
    Workload w = work;
    w.batch = batch;
    return w;
  };
  StepRunner runner(work, &world, sync);
  if (rank0) {
    const auto p = runner.warm_profile(5);
    const auto& buckets = runner.synchronizer().buckets();
    auto fields = common("scaling_profile");
    core::Json list = core::Json::array();
    for (std::size_t b = 0; b < buckets.size(); ++b) {
      double ready = 0;
      for (std::size_t s = buckets[b].first_segment; s < buckets[b].end_segment; ++s)
        ready = std::max(ready, p.segment_ready_ms[s]);
      list.push(core::Json::object().set("bytes", buckets[b].numel * 4).set("ready_ms", ready));
    }
    for (auto& f : std::vector<bench::JsonField>{
             bench::field("batch", static_cast<long long>(o.batch)),
             bench::field("params", static_cast<long long>(runner.parameters())),
             bench::field("gemm_gflops", gemm_gflops(device, autocast)),
             bench::field("forward_ms", p.forward_ms),
             bench::field("backward_ms", p.backward_ms),
             bench::field("optimizer_ms", p.optimizer_ms),
             bench::field("step_ms", p.forward_ms + p.backward_ms + p.optimizer_ms),
             bench::field("zero", static_cast<long long>(o.zero)),
             bench::field("optimizer_state_bytes",
                          static_cast<long long>(runner.optimizer_state_bytes())),
             {"buckets", list}})
      fields.push_back(f);
    json.write(fields);
    fmt::print(
        "{} batch {} per rank, {} {}, {} ranks, {} thread(s) each; {} parameters in {} "
        "buckets{}{}\nprofile (one rank): forward {:.2f} ms, backward {:.2f} ms, optimizer "
        "{:.2f} ms\n\n",
        o.model, o.batch, device.str(), o.precision, n, o.threads, runner.parameters(),
        buckets.size(),
        o.zero == 1 ? fmt::format(", ZeRO-1 ({} bytes of optimizer state per rank)",
                                  runner.optimizer_state_bytes())
                    : "",
        device.is_cuda()                   ? ""
        : sync.host_overlap.value_or(true) ? ", reduced during backward"
                                           : ", reduced after backward",
        p.forward_ms, p.backward_ms, p.optimizer_ms);
    fmt::print("{:<7} {:>5} {:>7} {:>7} {:>9} {:>11} {:>10} {:>8} {:>10} {:>9} {:>11}\n", "mode",
               "ranks", "B/rank", "global", "solo ms", "compute ms", "synced ms", "comm ms",
               "exposed ms", "overlap", "efficiency");
  }

  auto emit = [&](const Row& r) {
    if (!rank0) return;
    print_row(r, n);
    fmt::print(
        "{:<7} serial step {:.2f} ms: compute {:.2f}, straggler {:.2f}, comm in step {:.2f}\n", "",
        r.serial_s * 1e3, r.serial.compute_s * 1e3, r.serial.straggler_s * 1e3,
        r.serial.comm_s * 1e3);
    auto fields = common("scaling");
    for (auto& f : row_fields(r, n)) fields.push_back(f);
    fields.push_back(bench::field("zero", static_cast<long long>(o.zero)));
    fields.push_back(bench::field("optimizer_state_bytes",
                                  static_cast<long long>(runner.optimizer_state_bytes())));
    fields.push_back(device.is_cuda()
                         ? bench::field("host_overlap", core::Json())
                         : bench::field("host_overlap", sync.host_overlap.value_or(true)));
    json.write(fields);
  };

  // Solo, all ranks computing, synchronised, communication alone, and the
  // serial step (Note [serial step]).
  auto phases_of = [&](StepRunner& r, SerialTimes& serial) {
    const auto wait = [&r] { r.synchronize(); };
    return std::vector<Phase>{
        {rank0, [&r] { r.step(false); }, wait},
        {true, [&r] { r.step(false); }, wait},
        {true, [&r] { r.step(true); }, wait},
        {true, [&r] { r.communicate_only(); }, wait},
        {true, [&r, &serial, &world] { r.serial_step(world.host(), serial); }, [] {}}};
  };
  SerialTimes weak_serial;
  const std::vector<double> weak = time_phases(config, phases_of(runner, weak_serial));
  const double jitter = relative_jitter(config, runner);
  if (o.mode != "strong")
    emit({"weak", o.batch, o.batch * n, weak[0], weak[1], weak[2], weak[3], weak[0] / weak[2],
          jitter, weak[4], serial_terms(config, weak_serial)});

  if (o.mode != "weak") {
    // Solo is one rank with the whole global batch; the rest at G / N per rank.
    const std::int64_t per_rank = global / n;
    std::optional<StepRunner> strong;
    if (per_rank != o.batch) strong.emplace(at_batch(per_rank), &world, sync);
    StepRunner& s = strong ? *strong : runner;
    std::optional<StepRunner> whole;
    if (rank0) whole.emplace(at_batch(global), nullptr);
    SerialTimes strong_serial;
    std::vector<Phase> phases = phases_of(s, strong_serial);
    phases[0] = {rank0, [&] { whole->step(false); }, [&] { whole->synchronize(); }};
    const std::vector<double> t = time_phases(config, phases);
    const double s_jitter = strong ? relative_jitter(config, s) : jitter;
    emit({"strong", per_rank, global, t[0], t[1], t[2], t[3], t[0] / (n * t[2]), s_jitter, t[4],
          serial_terms(config, strong_serial)});
  }
  if (rank0)
    bench::print_legend(
        "solo: rank 0 stepping alone in the same run while the other ranks wait",
        "no ratio column; efficiency = solo / synced (weak) or solo(G) / (N x synced(G/N)) "
        "(strong): higher is better, 1 is perfect scaling");

  if (o.link && n > 1) {
    std::int64_t largest = 0;
    for (const comm::Bucket& b : runner.synchronizer().buckets())
      largest = std::max(largest, b.numel * 4);
    const LinkFit fit = fit_link(world, device, config, largest);
    if (rank0) {
      std::string sizes = "[", ms = "[";
      for (std::size_t i = 0; i < fit.sizes.size(); ++i) {
        sizes += fmt::format("{}{}", i ? ", " : "", fit.sizes[i]);
        ms += fmt::format("{}{:.6g}", i ? ", " : "", fit.seconds[i] * 1e3);
      }
      fmt::print("\nlink: allreduce = {:.1f} us + bus bytes / {:.2f} GB/s ({} ranks)\n",
                 fit.alpha_s * 1e6, fit.bus_bytes_per_s / 1e9, n);
      json.write({bench::field("bench", "scaling_link"),
                  bench::field("device", device.str()),
                  bench::field("ranks", static_cast<long long>(n)),
                  bench::field("alpha_us", fit.alpha_s * 1e6),
                  bench::field("bus_bandwidth_gbps", fit.bus_bytes_per_s / 1e9),
                  {"sizes_bytes", sizes + "]"},
                  {"allreduce_ms", ms + "]"}});
    }
  }
  if (o.rank_invariant) {
    if (device.is_cuda()) kernels::set_deterministic(true);
    // Both runners built afresh here, so that each one's memory is its own.
    std::optional<StepRunner> plain, invariant;
    const RunnerMemory plain_memory = measure_memory(
        device, [&] { plain.emplace(work, &world, sync); }, plain);
    const RunnerMemory invariant_memory = measure_memory(
        device, [&] { invariant.emplace(work, &world, sync, true); }, invariant);
    const std::vector<double> t = time_phases(
        config, {{true, [&] { plain->step(true); }, [&] { plain->synchronize(); }},
                 {true, [&] { invariant->step(true); }, [&] { invariant->synchronize(); }}});
    if (rank0) {
      const double mib = 1.0 / (1 << 20);
      fmt::print(
          "\nrank-invariant step, {} per rank, {} ranks: {:.2f} ms against the default's {:.2f} "
          "ms, ratio {:.3f}; memory held {:.2f} MiB against {:.2f} MiB, step peak above it "
          "{:.2f} MiB against {:.2f} MiB (rank 0)\n",
          o.batch, n, t[1] * 1e3, t[0] * 1e3, t[1] / t[0], invariant_memory.held_bytes * mib,
          plain_memory.held_bytes * mib, invariant_memory.step_peak_bytes * mib,
          plain_memory.step_peak_bytes * mib);
      auto fields = common("scaling_invariant");
      for (auto& f : std::vector<bench::JsonField>{
               bench::field("ranks", static_cast<long long>(n)),
               bench::field("batch", static_cast<long long>(o.batch)),
               bench::field("zero", static_cast<long long>(o.zero)),
               bench::field("default_ms", t[0] * 1e3), bench::field("invariant_ms", t[1] * 1e3),
               bench::field("ratio", t[1] / t[0]),
               bench::field("default_held_bytes", static_cast<long long>(plain_memory.held_bytes)),
               bench::field("invariant_held_bytes",
                            static_cast<long long>(invariant_memory.held_bytes)),
               bench::field("default_step_peak_bytes",
                            static_cast<long long>(plain_memory.step_peak_bytes)),
               bench::field("invariant_step_peak_bytes",
                            static_cast<long long>(invariant_memory.step_peak_bytes))})
        fields.push_back(f);
      json.write(fields);
    }
  }
}

int run(comm::World& world, const Options& o, const Config& config) {
  const bool rank0 = world.rank() == 0;
  const int n = world.size();
  const core::Device device = o.device == "cuda" ? world.device() : core::Device::cpu();
  if (!o.trace.empty()) {
    world.host().barrier();
    examples::start_trace(world.rank(), o.trace, o.trace_steps);
  }
  std::optional<DType> autocast;
  if (o.precision == "fp16")
    autocast = DType::f16;
  else if (o.precision == "bf16")
    autocast = DType::bf16;
  const std::int64_t global = o.global_batch > 0 ? o.global_batch : o.batch * n;
  if (global % n != 0)
    throw InvalidArgument(
        fmt::format("--global-batch {} does not split evenly over {} ranks (use a multiple of {})",
                    global, n, n));
  bench::JsonLines json(rank0 ? o.json : std::string());
  auto common = [&](const char* bench_name) {
    return std::vector<bench::JsonField>{
        bench::field("bench", bench_name), bench::field("model", o.model),
        bench::field("device", device.str()), bench::field("precision", o.precision),
        bench::field("threads", static_cast<long long>(o.threads))};
  };

  comm::SynchronizerOptions sync;
  sync.bucket_cap_bytes = static_cast<std::size_t>(o.bucket_cap_mib * (1 << 20));
  sync.first_bucket_cap_bytes = static_cast<std::size_t>(o.first_bucket_cap_mib * (1 << 20));
  sync.host_overlap =
      o.host_overlap == "auto" ? comm::host_overlap_pays(world, o.threads) : o.host_overlap == "on";
  sync.zero_stage = o.zero;
  const Workload work{o.model, o.batch, autocast, device, o.optimizer};
  if (o.zero <= 1) scaling_tables(world, o, config, work, global, sync, json, common);
  if (o.zero >= 1) compare_zero(world, o, config, work, sync, json, common("scaling_zero"));
  if (const auto file = core::trace::finish(); !file.empty() && rank0)
    fmt::print("trace: {} (and the other ranks' files beside it)\n", file.string());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{
      "bench_scaling: weak and strong scaling of a training step over the ranks of "
      "mpirun -np N, against one rank in the same run"};
  Options o;
  Config config;
  app.add_option("--model", o.model, "mlp, cnn, resnet, mlp-large, gpt-tiny or gpt2")
      ->capture_default_str();
  app.add_option("--batch", o.batch, "per-rank batch (weak scaling)")->capture_default_str();
  app.add_option("--global-batch", o.global_batch,
                 "global batch for strong scaling (default: batch x ranks)");
  app.add_option("--mode", o.mode, "weak, strong or both")->capture_default_str();
  app.add_option("--precision", o.precision, "fp32, fp16 or bf16")->capture_default_str();
  app.add_option("--device", o.device, "cpu or cuda")->capture_default_str();
  app.add_option("--threads", o.threads, "CPU threads per rank")->capture_default_str();
  app.add_option("--bucket-cap-mib", o.bucket_cap_mib, "gradient bucket cap")
      ->capture_default_str();
  app.add_option("--first-bucket-cap-mib", o.first_bucket_cap_mib, "the first bucket's cap")
      ->capture_default_str();
  app.add_option("--host-overlap", o.host_overlap,
                 "host gradients reduced during backward (on), after it (off), or on when a core "
                 "is spare (auto)")
      ->capture_default_str();
  app.add_option("--zero", o.zero,
                 "ZeRO stage: 0 (allreduce), 1 (optimizer state sharded), 2 (and gradients) or 3 "
                 "(and parameters); 1 to 3 also measure the stage against stage 0 (model state "
                 "per rank, step time); 2 and 3 only that")
      ->capture_default_str();
  app.add_option("--optimizer", o.optimizer, "sgd (momentum 0.9) or adamw")->capture_default_str();
  app.add_option("--steps", config.steps, "steps per timed block")->capture_default_str();
  app.add_option("--trials", config.trials, "timed blocks (median)")->capture_default_str();
  app.add_option("--link", o.link, "fit the allreduce's alpha-beta cost")->capture_default_str();
  app.add_flag("--rank-invariant", o.rank_invariant,
               "also time the rank-invariant step beside the default synchronised one "
               "(docs/reproducibility.md)");
  app.add_option("--json", o.json, "write JSON lines here (rank 0)");
  auto* trace = app.add_option("--trace", o.trace,
                               "write a timeline of each rank to DIR/rank-<r>.json (Perfetto; "
                               "tools/trace.py)");
  app.add_option("--trace-steps", o.trace_steps,
                 "trace only steps FIRST:LAST of each configuration measured (e.g. 10:20)")
      ->needs(trace);
  // What each flag accepts (examples/common/flags.h), checked while parsing.
  app.get_option("--model")->check(examples::model_name());
  app.get_option("--mode")->check(examples::one_of({"weak", "strong", "both"}));
  app.get_option("--precision")->check(examples::precision_name());
  app.get_option("--device")->check(examples::device_name());
  app.get_option("--host-overlap")->check(examples::one_of({"auto", "on", "off"}));
  app.get_option("--batch")->check(examples::within(1, examples::kMaxRows));
  app.get_option("--global-batch")->check(examples::within(1, examples::kMaxRows));
  app.get_option("--threads")->check(examples::threads_per_rank());
  app.get_option("--bucket-cap-mib")->check(examples::within(0.001, 1 << 20));
  app.get_option("--first-bucket-cap-mib")->check(examples::within(0.001, 1 << 20));
  app.get_option("--zero")->check(examples::within(0, 3));
  app.get_option("--optimizer")->check(examples::one_of({"sgd", "adamw"}));
  app.get_option("--steps")->check(examples::within(1, 1e6));
  app.get_option("--trials")->check(examples::within(1, 1000));
  app.get_option("--json")->check(examples::non_empty());
  app.get_option("--trace")->check(examples::non_empty());
  app.get_option("--trace-steps")->check(examples::step_window());
  CLI11_PARSE(app, argc, argv);
  if (o.rank_invariant && o.zero >= 2) {
    fmt::print(stderr,
               "bench_scaling: --rank-invariant is timed with the scaling tables, at --zero 0 or "
               "1 (not {})\n",
               o.zero);
    return 2;
  }
  std::unique_ptr<comm::World> world;
  try {
    comm::InitOptions init;
    init.use_gpu = o.device == "cuda";
    world = comm::init(argc, argv, init);
    config.mpi = world->uses_mpi();  // without mpirun: one rank, the profile and solo step
    if (o.device == "cuda" && !world->device().is_cuda())
      throw InvalidArgument("--device cuda, but no GPU is usable here (use --device cpu)");
    examples::use_cpu_threads(o.threads, world->rank() == 0);
    const int rc = run(*world, o, config);
    world->shutdown();
    return rc;
  } catch (const std::exception& e) {
    if (world && world->size() > 1) world->abort(std::string("bench_scaling: ") + e.what(), 1);
    fmt::print(stderr, "bench_scaling: {}\n", e.what());
    return 1;
  }
}
