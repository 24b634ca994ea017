// bench_flight: what the flight recorder (comm/flight_recorder.h) costs per
// collective: a record and its completion alone, and a whole watched
// collective (Watchdog::Scope, which records) with no communication in it.
// The recorder is always on, so this is its whole overhead per collective.
#include <fmt/core.h>

#include <chrono>

#include "comm/watchdog.h"
#include "examples/common/cli.h"

using namespace lockstep;

int main(int argc, char** argv) {
  CLI::App app{"bench_flight: the flight recorder's cost per collective"};
  int iterations = 2'000'000;
  app.add_option("--iterations", iterations, "collectives timed per row")
      ->check(CLI::Range(1, 1'000'000'000));
  CLI11_PARSE(app, argc, argv);

  comm::OperationInfo info;
  info.name = "allreduce";
  info.communicator = "gradients";
  info.count = 1 << 20;
  using Clock = std::chrono::steady_clock;
  const auto per_call = [&](Clock::time_point start) {
    return std::chrono::duration<double, std::nano>(Clock::now() - start).count() / iterations;
  };

  comm::FlightRecorder recorder;
  auto start = Clock::now();
  for (int i = 0; i < iterations; ++i) {
    info.sequence = static_cast<std::uint64_t>(i);
    recorder.complete(recorder.record(info, true));
  }
  const double record_ns = per_call(start);

  comm::Watchdog watchdog(comm::kDefaultCommTimeout, [](const std::string&) {});
  start = Clock::now();
  for (int i = 0; i < iterations; ++i) {
    info.sequence = static_cast<std::uint64_t>(i);
    comm::Watchdog::Scope scope(&watchdog, info);
  }
  const double scope_ns = per_call(start);
  watchdog.stop();

  fmt::print("{:<48} {:>10}\n", "per collective", "ns");
  fmt::print("{:<48} {:>10.1f}\n", "flight record + completion", record_ns);
  fmt::print("{:<48} {:>10.1f}\n", "watched collective (watchdog and recorder)", scope_ns);
  return 0;
}
