// Stop requests, the progress line and the metrics file (engine/run_control.h).
#include "engine/run_control.h"

#include <fmt/core.h>

#include <atomic>
#include <cerrno>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <mutex>

#include "comm/step_agreement.h"
#include "engine/core/log.h"
#include "kernels/error.h"

namespace lockstep::engine {
namespace {

std::atomic<int> g_interrupts{0};

extern "C" void on_interrupt(int /*signal*/) {
  if (g_interrupts.fetch_add(1) >= 1) std::_Exit(130);  // the second Ctrl-C: at once
  comm::request_stop();
}

}  // namespace

void install_signal_handlers() {
  static std::once_flag once;
  std::call_once(once, [] {
    comm::install_stop_handlers({SIGTERM, SIGUSR1});
    struct sigaction action {};
    action.sa_handler = on_interrupt;
    sigemptyset(&action.sa_mask);
    sigaction(SIGINT, &action, nullptr);
  });
}

std::string format_duration(double seconds) {
  if (!(seconds >= 0) || seconds > 1e7) return "?";
  const auto s = static_cast<long long>(seconds + 0.5);
  if (s >= 3600) return fmt::format("{}h{:02}m", s / 3600, s % 3600 / 60);
  if (s >= 60) return fmt::format("{}m{:02}s", s / 60, s % 60);
  if (seconds < 10) return fmt::format("{:.1f}s", seconds);
  return fmt::format("{}s", s);
}

std::string progress_line(std::int64_t step, std::int64_t total_steps, double loss, double lr,
                          double samples_per_s, double eta_s) {
  return fmt::format("step {}/{}  loss {:.4f}  lr {:.4g}  {:.0f} samples/s  ETA {}", step,
                     total_steps, loss, lr, samples_per_s, format_duration(eta_s));
}

std::string step_detail(const core::trace::Breakdown& b, double step_ms, std::size_t peak_bytes,
                        const std::string& device) {
  return fmt::format(
      "data {:.2f}  compute {:.2f}  comm {:.2f}  opt {:.2f} ms (of {:.2f})  peak {} on {}",
      b.data_wait_ms, b.compute_ms, b.exposed_comm_ms, b.optimizer_ms, step_ms,
      format_bytes(peak_bytes), device);
}

void add_step_detail(core::Json& record, const core::trace::Breakdown& b, double step_ms,
                     std::size_t peak_bytes) {
  record.set("data_wait_ms", b.data_wait_ms)
      .set("compute_ms", b.compute_ms)
      .set("exposed_comm_ms", b.exposed_comm_ms)
      .set("optimizer_ms", b.optimizer_ms)
      .set("step_ms", step_ms)
      .set("peak_memory_bytes", peak_bytes);
}

std::string step_detail_fields(const core::trace::Breakdown& b, double step_ms,
                               std::size_t peak_bytes) {
  return fmt::format(R"("data_wait_ms": {:.4f}, "compute_ms": {:.4f}, "exposed_comm_ms": {:.4f}, )"
                     R"("optimizer_ms": {:.4f}, "step_ms": {:.4f}, "peak_memory_bytes": {})",
                     b.data_wait_ms, b.compute_ms, b.exposed_comm_ms, b.optimizer_ms, step_ms,
                     peak_bytes);
}

std::string format_bytes(std::size_t bytes) {
  const auto b = static_cast<double>(bytes);
  if (bytes < 1024) return fmt::format("{} B", bytes);
  if (b < 1024.0 * 1024) return fmt::format("{:.1f} KiB", b / 1024);
  if (b < 1024.0 * 1024 * 1024) return fmt::format("{:.1f} MiB", b / (1024.0 * 1024));
  return fmt::format("{:.2f} GiB", b / (1024.0 * 1024 * 1024));
}

MetricsWriter::MetricsWriter(const std::string& path) : path_(path) {
  if (!path.empty()) file_ = std::make_unique<core::AppendFile>(path, "the metrics file");
}

MetricsWriter::~MetricsWriter() = default;

void MetricsWriter::write(const std::string& fields) {
  core::Json record;
  try {
    record = core::Json::parse("{" + fields + "}", "a metrics record");
  } catch (const InvalidArgument&) {
    record = core::Json::object().set("unparsed_record", fields);
  }
  write(record);
}

void MetricsWriter::write(const core::Json& record) {
  if (!file_ || failed_) return;
  const int error = file_->append(record.dump() + "\n");
  if (error == 0) return;
  failed_ = true;  // Note [write failures]: the rule for metrics
  core::report_write_failure(
      "the metrics file " + path_,
      fmt::format("{} (this record and every later one are lost: the run stops at the next step "
                  "boundary, after saving)",
                  std::strerror(error)));
  comm::request_stop();
}

void EtaClock::start(std::int64_t first_step) {
  start_ = std::chrono::steady_clock::now();
  first_step_ = first_step;
}

double EtaClock::eta_s(std::int64_t step, std::int64_t total_steps) const {
  const std::int64_t done = step - first_step_;
  if (done <= 0) return -1;
  const double elapsed =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  return elapsed / static_cast<double>(done) * static_cast<double>(total_steps - step);
}

}  // namespace lockstep::engine
