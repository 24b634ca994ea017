// The run header and summary (engine/run_report.h).
#include "engine/run_report.h"

#include <fmt/core.h>
#include <fmt/ranges.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <map>

#include "engine/core/device.h"
#include "engine/core/json.h"
#include "engine/core/log.h"
#include "engine/core/memory.h"
#include "kernels/conv.h"
#include "kernels/fusion.h"

namespace lockstep::engine {

// Note [deterministic runs]: what "deterministic" changes. On CUDA, cuDNN
// may only use algorithms it marks deterministic, and convolution autotuning
// (timing candidates, whose winner can change run to run; on by default
// otherwise) is off whatever set_conv_autotune asked, so the heuristic's
// choice is used (Note [conv algorithm choice]); cuDNN's fused attention takes its deterministic
// backward (it adds dQ with atomics otherwise, Note [fused attention]); new
// cuBLASLt plans take the heuristic's first algorithm instead of the fastest
// timed (Note [timed gemm algorithms]), and bias gradients keep the column
// sums instead of cuBLASLt's epilogues (Note [epilogue fallback]). Everything
// else is deterministic in every mode, on both backends: our own CUDA kernels
// use no floating-point atomics (fixed trees and row-ordered sums, see
// kernels/reduce.h, bias.h, embedding.h), cuBLASLt plans are chosen once per
// shape and kept for the process, OpenBLAS splits a GEMM over its
// rows and columns (never over the summed k), the loader delivers batches in
// sampler order whatever its thread count, and reductions across ranks run
// in an order fixed by the world size. So the CPU has nothing to switch; the
// setting is still applied (and reported) in the process-wide kernel state
// both backends read.
void set_deterministic_run(bool on) { kernels::set_deterministic(on); }

// kernels::conv_autotune() is false whenever deterministic() is on: no run
// that times convolutions reads as deterministic.
bool deterministic_run() { return kernels::deterministic() && !kernels::conv_autotune(); }

std::vector<RankPlacement> gather_placement(comm::World& world) {
  constexpr std::size_t kField = 64;  // host name, then device, each NUL-padded
  std::array<char, 2 * kField> mine{};
  char host[256] = {};
  if (gethostname(host, sizeof host - 1) != 0) host[0] = '?';
  const std::string device = world.device().str();
  std::memcpy(mine.data(), host, std::min(strnlen(host, sizeof host), kField - 1));
  std::memcpy(mine.data() + kField, device.data(), std::min(device.size(), kField - 1));
  std::vector<char> all(mine.size() * static_cast<std::size_t>(world.size()));
  world.host().allgather(mine.data(), all.data(), static_cast<std::int64_t>(mine.size()),
                         DType::u8);
  std::vector<RankPlacement> out;
  for (int r = 0; r < world.size(); ++r) {
    const char* at = all.data() + static_cast<std::size_t>(r) * mine.size();
    out.push_back({r, std::string(at, strnlen(at, kField)),
                   std::string(at + kField, strnlen(at + kField, kField))});
  }
  return out;
}

std::vector<std::string> describe_placement(const std::vector<RankPlacement>& placement) {
  std::vector<std::string> hosts;  // in order of first appearance
  std::map<std::string, std::vector<const RankPlacement*>> by_host;
  for (const RankPlacement& p : placement) {
    if (!by_host.count(p.host)) hosts.push_back(p.host);
    by_host[p.host].push_back(&p);
  }
  std::vector<std::string> lines;
  for (const std::string& host : hosts) {
    std::string ranks, devices;
    for (const RankPlacement* p : by_host[host]) {
      ranks += fmt::format("{}{}", ranks.empty() ? "" : " ", p->rank);
      devices += fmt::format("{}{}", devices.empty() ? "" : " ", p->device);
    }
    lines.push_back(fmt::format("{}: rank{} {} on {}", host, by_host[host].size() > 1 ? "s" : "",
                                ranks, devices));
  }
  return lines;
}

std::string explain_device(core::Device device, const std::string& requested,
                           const std::string& requested_by) {
  const std::string name = device.str();
  if (!requested.empty()) return fmt::format("{} (asked for by {})", name, requested_by);
  if (device.is_cuda()) return name + " (a GPU is usable)";
#if LOCKSTEP_WITH_CUDA
  return name + " (CUDA is built in, but no GPU is usable here)";
#else
  return name + " (this build has no CUDA)";
#endif
}

std::string describe_dataset(const io::Dataset& dataset) {
  std::int64_t pread = 0;
  std::string hdf5_reason;
  for (const io::ShardInfo& s : dataset.shards()) {
    if (s.layout == io::ShardLayout::contiguous) {
      ++pread;
    } else if (hdf5_reason.empty()) {
      hdf5_reason = s.layout_reason;
    }
  }
  const auto shards = static_cast<std::int64_t>(dataset.shards().size());
  std::string reading;
  if (pread == shards) {
    reading = "read in parallel (pread)";
  } else if (pread == 0) {
    reading = "read through HDF5 (" + hdf5_reason + ")";
  } else {
    reading = fmt::format("{} read in parallel (pread), {} through HDF5 ({})", pread,
                          shards - pread, hdf5_reason);
  }
  return fmt::format("{} samples, {}, {} shard{} {}", dataset.size(), dataset.format().str(),
                     shards, shards == 1 ? "" : "s", reading);
}

namespace {

double mean(const std::vector<double>& values) {
  double sum = 0;
  for (double v : values) sum += v;
  return sum / static_cast<double>(values.size());
}

std::int64_t global_batch(const RunHeader& h, int world_size) {
  return h.micro_batch * h.accumulation * world_size;
}

// The formulas of docs/memory.md for f32 training: parameters 4P, gradients
// 4P (ZeRO-2: 4P / N), optimizer state (ZeRO-1 to ZeRO-3: divided by N);
// ZeRO-3 divides the parameters too (its gathered units are not model state).
std::int64_t shared_by(std::int64_t bytes, std::int64_t ranks) {
  return (bytes + ranks - 1) / ranks;
}

std::int64_t model_state_bytes(const RunHeader& h, int world_size) {
  const std::int64_t state_shards = h.zero_stage >= 1 ? world_size : 1;
  const std::int64_t gradient_shards = h.zero_stage >= 2 ? world_size : 1;
  const std::int64_t parameter_shards = h.zero_stage >= 3 ? world_size : 1;
  return shared_by(h.parameter_bytes, parameter_shards) +
         shared_by(h.parameter_bytes, gradient_shards) +
         shared_by(h.optimizer_state_bytes, state_shards);
}

// "model state per rank 3.1 MiB expected (--zero 0): parameters 1.0 MiB +
// gradients 1.0 MiB + optimizer state 1.0 MiB; --activation-checkpointing off"
// (docs/memory.md).
std::string describe_model_state(const RunHeader& h, int world_size) {
  const std::int64_t state_shards = h.zero_stage >= 1 ? world_size : 1;
  const std::int64_t gradient_shards = h.zero_stage >= 2 ? world_size : 1;
  const std::int64_t parameter_shards = h.zero_stage >= 3 ? world_size : 1;
  const auto per = [](std::int64_t shards) {
    return shards > 1 ? fmt::format(" / {} ranks", shards) : std::string();
  };
  return fmt::format(
      "model state per rank {} expected (--zero {}): parameters {}{} + gradients {}{} + "
      "optimizer state {}{}; --activation-checkpointing {}",
      format_bytes(static_cast<std::size_t>(model_state_bytes(h, world_size))), h.zero_stage,
      format_bytes(static_cast<std::size_t>(h.parameter_bytes)), per(parameter_shards),
      format_bytes(static_cast<std::size_t>(h.parameter_bytes)), per(gradient_shards),
      format_bytes(static_cast<std::size_t>(h.optimizer_state_bytes)), per(state_shards),
      h.activation_checkpointing ? "on" : "off");
}

}  // namespace

std::vector<std::string> format_run_header(const RunHeader& h, int world_size,
                                           const std::vector<RankPlacement>& placement) {
  std::vector<std::string> lines;
  lines.push_back(fmt::format("{}: {}", h.program, h.model));
  lines.push_back("  device       " + h.device_reason);
  const std::vector<std::string> hosts = describe_placement(placement);
  lines.push_back(fmt::format("  ranks        {} on {} host{}", world_size, hosts.size(),
                              hosts.size() == 1 ? "" : "s"));
  for (const std::string& line : hosts) lines.push_back("               " + line);
  lines.push_back(fmt::format(
      "  threads      {} compute thread{} per rank{}", h.threads, h.threads == 1 ? "" : "s",
      h.loader_threads > 0 ? fmt::format(", {} loader threads", h.loader_threads) : std::string()));
  if (!h.cpu_gemm.empty()) lines.push_back("  cpu gemm     " + h.cpu_gemm);
  lines.push_back(fmt::format(
      "  batch        {} per rank x {} accumulation x {} rank{} = global batch {}", h.micro_batch,
      h.accumulation, world_size, world_size == 1 ? "" : "s", global_batch(h, world_size)));
  std::string length = fmt::format("  steps        {}", h.total_steps);
  if (h.steps_per_epoch > 0) length += fmt::format(" ({} per epoch)", h.steps_per_epoch);
  if (!h.length_reason.empty()) length += ": " + h.length_reason;
  lines.push_back(length);
  if (!h.resume.empty()) lines.push_back("  start        " + h.resume);
  lines.push_back(fmt::format("  precision    {}{}, deterministic {}{}", h.precision,
                              h.loss_scaling ? " with dynamic loss scaling" : "",
                              deterministic_run() ? "on" : "off",
                              kernels::fused_kernels() ? "" : ", fused CUDA kernels off"));
  if (h.zero_stage >= 1)
    lines.push_back(fmt::format("  zero         ZeRO-{}: optimizer state{} sharded over {} rank{}",
                                h.zero_stage,
                                h.zero_stage == 2   ? " and gradients"
                                : h.zero_stage == 3 ? ", gradients and parameters"
                                                    : "",
                                world_size, world_size == 1 ? "" : "s"));
  if (h.parameter_bytes > 0)
    lines.push_back("  memory       " + describe_model_state(h, world_size));
  for (const DatasetSummary& d : h.data)
    lines.push_back(
        fmt::format("  {:<12} {}: {}", d.role + " data", d.path, describe_dataset(*d.dataset)));
  if (!h.input.empty()) lines.push_back("  input        " + h.input);
  lines.push_back("  checkpoints  " + (h.checkpoint_dir.empty() ? "none" : h.checkpoint_dir));
  lines.push_back("  metrics      " + (h.metrics_path.empty() ? "none" : h.metrics_path));
  return lines;
}

core::Json start_record(const RunHeader& h, int world_size) {
  core::Json record = core::Json::object()
                          .set("run", "start")
                          .set("program", h.program)
                          .set("model", h.model)
                          .set("ranks", world_size)
                          .set("micro_batch", h.micro_batch)
                          .set("accumulation", h.accumulation)
                          .set("global_batch", global_batch(h, world_size))
                          .set("precision", h.precision)
                          .set("loss_scaling", h.loss_scaling)
                          .set("deterministic", deterministic_run())
                          .set("fused_kernels", kernels::fused_kernels())
                          .set("threads", h.threads)
                          .set("start_step", h.start_step)
                          .set("total_steps", h.total_steps)
                          .set("steps_per_epoch", h.steps_per_epoch)
                          .set("zero_stage", h.zero_stage)
                          .set("activation_checkpointing", h.activation_checkpointing);
  if (h.parameter_bytes > 0)
    record.set("expected_model_state_bytes", model_state_bytes(h, world_size));
  if (h.tokens_per_sample > 0) record.set("tokens_per_sample", h.tokens_per_sample);
  if (!h.input.empty()) record.set("input", h.input);
  return record;
}

std::string run_start_record(const RunHeader& h, int world_size) {
  const std::string text = start_record(h, world_size).dump();
  return text.substr(1, text.size() - 2);
}

RunReport::RunReport(comm::World& world, RunHeader header, MetricsWriter& metrics)
    : world_(world),
      header_(std::move(header)),
      placement_(gather_placement(world_)),
      metrics_(metrics) {
  if (world_.rank() == 0) {
    for (const std::string& line : format_run_header(header_, world_.size(), placement_))
      fmt::print("{}\n", line);
    std::fflush(stdout);
    metrics_.write(start_record(header_, world_.size()));
  }
  figures_.last_step = header_.start_step;
  // Note [train loss of a part]: a run resumed inside an epoch sees only its later steps.
  epoch_.began_here =
      header_.start_step == 0 ||
      (header_.steps_per_epoch > 0 && header_.start_step % header_.steps_per_epoch == 0);
  start_ = epoch_start_ = Clock::now();
}

void RunReport::record_step(std::int64_t step, double loss, std::int64_t samples, double seconds,
                            bool skipped) {
  ++figures_.steps;
  figures_.samples += samples;
  figures_.step_s += seconds;
  figures_.last_step = step;
  if (epoch_.steps++ == 0) epoch_.first_step = step;
  epoch_.last_step = step;
  if (skipped) {
    ++figures_.skipped_steps;
    return;  // its loss is not a figure of the model (inf/NaN gradients)
  }
  figures_.last_loss = loss;
  epoch_.loss_sum += loss;
  ++epoch_.losses;
}

void RunReport::record_eval(std::int64_t step, std::int64_t epoch, double loss,
                            std::optional<double> accuracy) {
  figures_.val_loss = loss;
  figures_.val_accuracy = accuracy;
  if (accuracy && (!figures_.best_val_accuracy || *accuracy > *figures_.best_val_accuracy)) {
    figures_.best_val_accuracy = accuracy;
    figures_.best_val_step = step;
    figures_.best_val_epoch = epoch;
  }
}

void RunReport::end_epoch() {
  const Clock::time_point now = Clock::now();
  figures_.epoch_wall_s.push_back(std::chrono::duration<double>(now - epoch_start_).count());
  epoch_start_ = now;
  if (epoch_.steps > 0) {  // a resume at an epoch's end ends it with no step run here
    last_epoch_ = epoch_;
    last_epoch_.ended = true;
  }
  epoch_ = EpochSeen{};
  epoch_.began_here = true;
}

RunReport::Summary RunReport::summary() const {
  Summary s = figures_;
  s.wall_s = std::chrono::duration<double>(Clock::now() - start_).count();
  // The epoch in progress when it has steps, else the last one that ended.
  const EpochSeen& e = epoch_.losses > 0 ? epoch_ : last_epoch_;
  if (e.losses > 0) {
    s.last_epoch_train_loss = e.loss_sum / static_cast<double>(e.losses);
    s.train_loss_first_step = e.first_step;
    s.train_loss_last_step = e.last_step;
    s.train_loss_whole_epoch = e.began_here && e.ended;
    s.train_loss_skipped_steps = e.steps - e.losses;
  }
  s.stop_reason = stop_reason_;
  return s;
}

std::vector<std::string> RunReport::format_summary(const Summary& s) const {
  std::vector<std::string> lines;
  if (s.stop_reason.empty())
    lines.push_back(fmt::format("{}: done at step {}", header_.program, s.last_step));
  else
    lines.push_back(
        fmt::format("{}: stopped at step {} {}", header_.program, s.last_step, s.stop_reason));
  std::string time = "  time         " + format_duration(s.wall_s) + " in all";
  if (!s.epoch_wall_s.empty()) {
    time += fmt::format(", {} per epoch ({} epoch{} ended)", format_duration(mean(s.epoch_wall_s)),
                        s.epoch_wall_s.size(), s.epoch_wall_s.size() == 1 ? "" : "s");
  }
  lines.push_back(time);
  if (s.step_s > 0) {
    std::string rate = fmt::format("  throughput   {:.0f} samples/s", s.samples / s.step_s);
    if (header_.tokens_per_sample > 0)
      rate += fmt::format(", {:.0f} tokens/s",
                          static_cast<double>(s.samples * header_.tokens_per_sample) / s.step_s);
    rate += fmt::format(" (mean over {} steps, evaluation excluded)", s.steps);
    lines.push_back(rate);
  }
  lines.push_back(
      fmt::format("  skipped      {} of {} steps (inf/NaN gradients)", s.skipped_steps, s.steps));
  if (s.last_epoch_train_loss)  // Note [train loss of a part]: what the mean is over
    lines.push_back(
        fmt::format("  train        loss {:.4f} (mean of {}{})", *s.last_epoch_train_loss,
                    s.train_loss_whole_epoch
                        ? fmt::format("the last epoch's steps, {} to {}", s.train_loss_first_step,
                                      s.train_loss_last_step)
                        : fmt::format("steps {} to {}, the part of the last epoch this process ran",
                                      s.train_loss_first_step, s.train_loss_last_step),
                    s.train_loss_skipped_steps > 0
                        ? fmt::format("; {} skipped step{} left out", s.train_loss_skipped_steps,
                                      s.train_loss_skipped_steps == 1 ? "" : "s")
                        : std::string()));
  if (s.val_loss && s.val_accuracy)
    lines.push_back(fmt::format("  val          loss {:.4f}, accuracy {:.2f}% (last evaluation)",
                                *s.val_loss, 100 * *s.val_accuracy));
  else if (s.val_loss)
    lines.push_back(fmt::format("  val          loss {:.4f} (last evaluation)", *s.val_loss));
  if (s.best_val_accuracy)
    lines.push_back(fmt::format("  best val     accuracy {:.2f}% at step {} (epoch {})",
                                100 * *s.best_val_accuracy, s.best_val_step, s.best_val_epoch));
  lines.push_back("  checkpoint   " + (last_checkpoint_.empty() ? "none saved" : last_checkpoint_));
  return lines;
}

std::string RunReport::format_peak_memory(const std::vector<std::uint64_t>& peak_bytes) const {
  const auto rank = [&](std::size_t r) {
    return fmt::format("rank {} {} on {}", r, format_bytes(peak_bytes[r]), placement_[r].device);
  };
  std::string line = "  memory       peak ";
  if (peak_bytes.size() <= 8) {
    for (std::size_t r = 0; r < peak_bytes.size(); ++r) line += (r ? ", " : "") + rank(r);
    return line;
  }
  const auto [low, high] = std::minmax_element(peak_bytes.begin(), peak_bytes.end());
  return line + fmt::format("highest {}, lowest {}", rank(high - peak_bytes.begin()),
                            rank(low - peak_bytes.begin()));
}

std::string RunReport::format_peak_split(int rank, const std::vector<std::uint64_t>& by_kind) {
  std::string line = fmt::format("  peak split   rank {}:", rank);
  for (std::size_t k = 0; k < by_kind.size(); ++k)
    line += fmt::format("{} {} {}", k ? "," : "",
                        core::memory_kind_name(static_cast<core::MemoryKind>(k)),
                        format_bytes(static_cast<std::size_t>(by_kind[k])));
  return line;
}

void RunReport::finish() {
  const core::MemoryStats stats = core::memory_stats(world_.device());
  constexpr std::size_t kFields = 1 + core::kMemoryKinds;  // the peak, then its kinds
  std::array<std::uint64_t, kFields> mine{stats.peak_bytes};
  for (std::size_t k = 0; k < core::kMemoryKinds; ++k) mine[1 + k] = stats.peak_by_kind[k];
  std::vector<std::uint64_t> all(kFields * static_cast<std::size_t>(world_.size()));
  world_.host().allgather(mine.data(), all.data(), kFields, DType::i64);
  if (world_.rank() != 0) return;
  std::vector<std::uint64_t> peaks;
  std::vector<std::vector<std::uint64_t>> splits;
  for (std::size_t r = 0; r < static_cast<std::size_t>(world_.size()); ++r) {
    peaks.push_back(all[r * kFields]);
    splits.emplace_back(all.begin() + static_cast<std::ptrdiff_t>(r * kFields + 1),
                        all.begin() + static_cast<std::ptrdiff_t>((r + 1) * kFields));
  }
  const Summary s = summary();
  for (const std::string& line : format_summary(s)) fmt::print("{}\n", line);
  for (const std::string& failure : core::write_failures())  // Note [write failures]
    fmt::print("  not written  {}\n", failure);
  fmt::print("{}\n", format_peak_memory(peaks));
  if (splits.size() <= 8) {
    for (std::size_t r = 0; r < splits.size(); ++r)
      fmt::print("{}\n", format_peak_split(static_cast<int>(r), splits[r]));
  } else {
    const auto high = std::max_element(peaks.begin(), peaks.end()) - peaks.begin();
    fmt::print("{}\n", format_peak_split(static_cast<int>(high), splits[high]));
  }
  std::fflush(stdout);
  core::Json record =
      core::Json::object()
          .set("run", "end")
          .set("step", s.last_step)
          .set("wall_s", s.wall_s)
          .set("epoch_wall_s", s.epoch_wall_s.empty() ? core::Json() : mean(s.epoch_wall_s))
          .set("samples_per_s", s.step_s > 0 ? core::Json(s.samples / s.step_s) : core::Json())
          .set("skipped_steps", s.skipped_steps)
          .set("steps", s.steps)
          .set("train_loss", s.last_epoch_train_loss)
          .set("train_loss_steps",
               s.last_epoch_train_loss
                   ? core::Json::array().push(s.train_loss_first_step).push(s.train_loss_last_step)
                   : core::Json())
          .set("train_loss_whole_epoch",
               s.last_epoch_train_loss ? core::Json(s.train_loss_whole_epoch) : core::Json())
          .set("val_loss", s.val_loss)
          .set("val_accuracy", s.val_accuracy)
          .set("best_val_accuracy", s.best_val_accuracy)
          .set("best_val_step", s.best_val_accuracy ? core::Json(s.best_val_step) : core::Json())
          .set("checkpoint", last_checkpoint_.empty() ? core::Json() : last_checkpoint_)
          .set("stopped", !s.stop_reason.empty())
          .set("stop_reason", s.stop_reason.empty() ? core::Json() : s.stop_reason);
  core::Json peak_list = core::Json::array();
  for (const std::uint64_t p : peaks) peak_list.push(p);
  record.set("peak_memory_bytes", std::move(peak_list));
  if (header_.tokens_per_sample > 0 && s.step_s > 0)
    record.set("tokens_per_s",
               static_cast<double>(s.samples * header_.tokens_per_sample) / s.step_s);
  core::Json by_kind = core::Json::array();  // Note [memory kinds]
  for (const std::vector<std::uint64_t>& split : splits) {
    core::Json kinds = core::Json::object();
    for (std::size_t k = 0; k < split.size(); ++k)
      kinds.set(core::memory_kind_name(static_cast<core::MemoryKind>(k)), split[k]);
    by_kind.push(std::move(kinds));
  }
  record.set("peak_memory_by_kind", std::move(by_kind));
  metrics_.write(record);
}

}  // namespace lockstep::engine
