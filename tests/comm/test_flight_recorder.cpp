// The flight recorder (comm/flight_recorder.h): the ring's wraparound and
// fields, state changes on overwritten records, the JSON dump (parsed by
// python3's json module, independent of the writer), a watchdog's dump on
// SIGUSR2 and on a timeout, the liveness check it carries (Note [liveness
// check]), and a dump that cannot be written (reported, no partial file
// left). Waits for the watchdog thread allow 10 s.
#include <catch2/catch.hpp>

#include <unistd.h>
#include <algorithm>
#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <sstream>
#include <thread>

#include "comm/watchdog.h"
#include "engine/core/log.h"
#include "tests/temp_dir.h"

using namespace lockstep;
using comm::FlightRecorder;
using comm::FlightState;
using comm::OperationInfo;

namespace {

OperationInfo info(const char* name, std::uint64_t sequence, std::int64_t count) {
  OperationInfo i;
  i.name = name;
  i.communicator = "gradients";
  i.sequence = sequence;
  i.count = count;
  i.dtype = DType::bf16;
  i.step = static_cast<std::int64_t>(sequence / 3);
  i.bucket = static_cast<std::int64_t>(sequence % 3);
  return i;
}

bool wait_for_file(const std::filesystem::path& path) {
  for (int i = 0; i < 1000 && !std::filesystem::exists(path); ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  return std::filesystem::exists(path);
}

// python3 parses the file and evaluates `check` (a Python expression over the dump d).
bool python_accepts(const std::filesystem::path& file, const std::string& check) {
  const auto script = file.parent_path() / "check.py";
  std::ofstream(script) << "import json, sys\nd = json.load(open(sys.argv[1]))\nsys.exit(0 if ("
                        << check << ") else 1)\n";
  return std::system(("python3 '" + script.string() + "' '" + file.string() + "'").c_str()) == 0;
}

}  // namespace

TEST_CASE("the flight recorder keeps the last records, oldest first, with their fields") {
  FlightRecorder recorder(4);
  for (std::uint64_t s = 0; s < 6; ++s) recorder.record(info("allreduce", s, 100 + s), true);
  CHECK(recorder.recorded() == 6);
  const auto records = recorder.records();
  REQUIRE(records.size() == 4);
  for (std::size_t i = 0; i < 4; ++i) {
    const auto& r = records[i];
    CHECK(r.sequence == i + 2);
    CHECK(r.ticket == i + 2);
    CHECK(std::string(r.kind) == "allreduce");
    CHECK(std::string(r.communicator) == "gradients");
    CHECK(r.count == static_cast<std::int64_t>(102 + i));
    CHECK(r.dtype == DType::bf16);
    CHECK(r.step == static_cast<std::int64_t>((i + 2) / 3));
    CHECK(r.bucket == static_cast<std::int64_t>((i + 2) % 3));
    CHECK(r.state == FlightState::started);
    CHECK(r.enqueue_ns >= 0);
    CHECK(r.start_ns == r.enqueue_ns);
    CHECK(r.end_ns == -1);
  }
}

TEST_CASE("the flight recorder's states follow their tickets; overwritten ones are ignored") {
  FlightRecorder recorder(2);
  const auto a = recorder.record(info("allreduce", 0, 8), false);
  const auto b = recorder.record(info("broadcast", 1, 8), false);
  recorder.complete(a);  // an asynchronous collective: enqueued, then completed
  recorder.fail(b);
  auto records = recorder.records();
  CHECK(records[0].state == FlightState::completed);
  CHECK(records[0].start_ns == -1);
  CHECK(records[0].end_ns >= records[0].enqueue_ns);
  CHECK(records[1].state == FlightState::failed);
  CHECK(records[1].start_ns == -1);
  FlightRecorder::Ticket found = 99;
  CHECK(recorder.find(info("broadcast", 1, 8), found));
  CHECK(found == b);
  CHECK_FALSE(recorder.find(info("allreduce", 1, 8), found));  // another kind at that number
  recorder.record(info("barrier", 2, 0), false);               // overwrites a
  recorder.complete(a);
  records = recorder.records();
  CHECK(records[0].sequence == 1);
  CHECK(records[0].state == FlightState::failed);
  CHECK(records[1].state == FlightState::enqueued);
}

TEST_CASE("the flight recorder truncates long names and escapes the reason in its JSON") {
  test::TempDir dir;
  FlightRecorder recorder(3);
  OperationInfo long_name = info("allreduce", 7, 5);
  long_name.communicator = std::string(100, 'c');
  recorder.record(long_name, true);
  recorder.record(info("reduce_scatter", 8, 6), false);
  const auto file = dir.path() / "dump.json";
  std::ofstream(file) << recorder.json(2, 4, 12, "watchdog: \"x\"\n  rank 1\\ said\t");
  CHECK(python_accepts(file,
                       "d['rank'] == 2 and d['size'] == 4 and d['step'] == 12 and "
                       "d['reason'] == 'watchdog: \"x\"\\n  rank 1\\\\ said\\t' and "
                       "d['capacity'] == 3 and d['recorded'] == 2 and len(d['collectives']) == 2 "
                       "and d['liveness'] is None"));
  CHECK(python_accepts(file,
                       "d['collectives'][0]['communicator'] == 'c' * 23 and "
                       "d['collectives'][0]['bytes'] == 10 and d['collectives'][0]['dtype'] == "
                       "'bf16' and d['collectives'][0]['state'] == 'started' and "
                       "d['collectives'][1] == {'sequence': 8, 'communicator': 'gradients', "
                       "'kind': 'reduce_scatter', 'count': 6, 'bytes': 12, 'dtype': 'bf16', "
                       "'step': 2, 'bucket': 2, 'enqueue_ns': d['collectives'][1]['enqueue_ns'], "
                       "'start_ns': -1, 'end_ns': -1, 'state': 'enqueued'}"));
}

TEST_CASE("a watchdog records its collectives and dumps them on SIGUSR2 and on a timeout") {
  test::TempDir dir;
  comm::set_flight_directory(dir.path());
  comm::install_flight_signal();
  std::mutex mutex;  // guards message, written on the watchdog thread
  std::string message;
  const auto reported = [&] {
    std::lock_guard lock(mutex);
    return !message.empty();
  };
  comm::Watchdog watchdog(comm::Seconds(0.1), [&](const std::string& m) {
    std::lock_guard lock(mutex);
    message = m;
  });
  watchdog.set_step(5);
  const auto unbucketed = [](OperationInfo i) {
    i.bucket = -1;  // for the watchdog to fill in from the OperationContext
    return i;
  };
  {
    comm::OperationContext bucket("gradient bucket 2 of 3", 1);
    comm::Watchdog::Scope scope(&watchdog, unbucketed(info("allreduce", 0, 16)));
  }
  try {
    comm::Watchdog::Scope scope(&watchdog, unbucketed(info("broadcast", 1, 4)));
    throw std::runtime_error("the collective failed");
  } catch (const std::runtime_error&) {
  }
  auto records = watchdog.flight_records();
  REQUIRE(records.size() == 2);
  CHECK(records[0].state == FlightState::completed);
  CHECK(records[0].step == 5);
  CHECK(records[0].bucket == 1);
  CHECK(records[1].state == FlightState::failed);
  CHECK(records[1].bucket == -1);

  const auto file = dir.path() / "flight-rank-0.json";
  REQUIRE(std::raise(SIGUSR2) == 0);
  REQUIRE(wait_for_file(file));
  CHECK(python_accepts(file, "d['reason'] == 'SIGUSR2' and len(d['collectives']) == 2"));
  std::filesystem::remove(file);

  {
    comm::Watchdog::Scope stuck(&watchdog, info("allreduce", 2, 16));
    REQUIRE(wait_for_file(file));
    for (int i = 0; i < 1000 && !reported(); ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  watchdog.stop();
  CHECK(python_accepts(file,
                       "d['reason'].startswith('watchdog: allreduce #2') and "
                       "d['collectives'][2]['state'] == 'started'"));
  CHECK_THAT(message, Catch::Contains("python3 tools/flight.py " + dir.path().string()));
  comm::set_flight_directory({});
}

namespace {

// Rank 1 of three: rank 0 answers the watchdog's question, rank 2 does not.
class OneSilentPeer final : public comm::PeerChannel {
 public:
  int rank() const override { return 1; }
  int size() const override { return 3; }
  void serve(const std::function<std::string()>&) override {}
  std::vector<std::optional<comm::PeerAnswer>> ask_all(
      comm::Seconds grace, const std::function<std::string()>&) override {
    std::vector<std::optional<comm::PeerAnswer>> answers(3);
    answers[0] = {"gradients#2\n\nwaiting in allreduce #2 on 'gradients' for 0.1 s",
                  std::chrono::steady_clock::now()};
    std::this_thread::sleep_for(grace);  // as MPI's waits for the silent rank
    return answers;
  }
};

}  // namespace

// Note [liveness check]: the timeout's dump says who answered and when, and
// who did not; the times are the recorder's, ordered against the dump's
// now_ns (rank 0 answers at once, then the check waits out its grace).
TEST_CASE("a watchdog's dump after a timeout carries its liveness check") {
  test::TempDir dir;
  comm::set_flight_directory(dir.path());
  std::atomic<bool> reported{false};
  comm::Watchdog watchdog(
      comm::Seconds(0.1), [&](const std::string&) { reported = true; },
      std::make_unique<OneSilentPeer>());
  {
    comm::Watchdog::Scope stuck(&watchdog, info("allreduce", 2, 16));
    for (int i = 0; i < 1000 && !reported; ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  watchdog.stop();
  comm::set_flight_directory({});
  REQUIRE(reported);
  // The grace is min(timeout, 2 s) = 0.1 s; the check ends at least that long after it began.
  CHECK(python_accepts(dir.path() / "flight-rank-1.json",
                       "d['liveness']['answered'] == [0] and d['liveness']['silent'] == [2] and "
                       "d['liveness']['grace_s'] == 0.1 and d['collectives'][0]['start_ns'] < "
                       "d['liveness']['asked_ns'] <= d['liveness']['answered_ns'][0] and "
                       "d['liveness']['answered_ns'][0] + 100_000_000 <= "
                       "d['liveness']['ended_ns'] <= d['now_ns']"));
}

TEST_CASE("a flight dump that cannot be written is reported with the reason, and no partial file") {
  test::TempDir dir;
  const auto not_a_directory = dir.path() / "a-file";
  std::ofstream(not_a_directory) << "x";
  comm::set_flight_directory(not_a_directory);
  comm::Watchdog watchdog(comm::Seconds(60), [](const std::string&) {});
  CHECK(watchdog.dump_flight("test").empty());
  watchdog.stop();
  comm::set_flight_directory({});
  const auto failures = core::write_failures();
  const std::string expected =
      "the flight dump " + (not_a_directory / "flight-rank-0.json").string() + ": Not a directory";
  CHECK(std::any_of(failures.begin(), failures.end(),
                    [&](const std::string& line) { return line.rfind(expected, 0) == 0; }));
  CHECK(std::distance(std::filesystem::directory_iterator(dir.path()),
                      std::filesystem::directory_iterator()) == 1);
}

TEST_CASE("a flight dump replaces a link planted at its name, never writing through it") {
  // Note [one way to write a file]: the link could point at a checkpoint.
  test::TempDir dir, elsewhere;
  const auto victim = elsewhere.path() / "ckpt-10.h5";
  std::ofstream(victim) << "precious";
  std::filesystem::create_symlink(victim, dir.path() / "flight-rank-0.json");
  comm::set_flight_directory(dir.path());
  comm::Watchdog watchdog(comm::Seconds(60), [](const std::string&) {});
  const auto dumped = watchdog.dump_flight("a reason with \"quotes\"\nand a newline");
  watchdog.stop();
  comm::set_flight_directory({});
  CHECK(dumped == dir.path() / "flight-rank-0.json");
  CHECK_FALSE(std::filesystem::is_symlink(dumped));
  std::ifstream in(victim);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  CHECK(text == "precious");
}
