// The watchdog in one process: timeouts of blocking and asynchronous
// collectives, asynchronous errors, and the failure message built from what
// the other ranks answer (a scripted PeerChannel stands in for MPI). Timeouts
// are 0.1 s; waits for a report allow 10 s so that a loaded CI machine
// cannot make them flaky.
#include <catch2/catch.hpp>

#include <atomic>
#include <chrono>
#include <mutex>
#include <thread>

#include "comm/watchdog.h"
#include "kernels/error.h"

using namespace lockstep;
using comm::OperationInfo;
using comm::Seconds;
using comm::Watchdog;

namespace {

// Collects the watchdog's messages.
struct Reports {
  std::mutex mutex;
  std::vector<std::string> messages;

  Watchdog::Handler handler() {
    return [this](const std::string& m) {
      std::lock_guard lock(mutex);
      messages.push_back(m);
    };
  }
  std::size_t count() {
    std::lock_guard lock(mutex);
    return messages.size();
  }
  std::string first() {
    std::lock_guard lock(mutex);
    return messages.empty() ? "" : messages.front();
  }
  bool wait_for_one() {
    for (int i = 0; i < 1000 && count() == 0; ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    return count() > 0;
  }
};

OperationInfo allreduce_info(std::uint64_t sequence) {
  OperationInfo info;
  info.name = "allreduce";
  info.communicator = "world";
  info.sequence = sequence;
  info.count = 1024;
  info.dtype = DType::f32;
  return info;
}

// Rank 0 of three: rank 1 is in the same collective, rank 2 in none, or
// busy (set_rank2), or silent.
class ScriptedPeers final : public comm::PeerChannel {
 public:
  explicit ScriptedPeers(bool rank2_answers) : rank2_answers_(rank2_answers) {}
  void set_rank2(std::optional<std::string> status) {
    std::lock_guard lock(mutex_);
    rank2_ = std::move(status);
  }
  int rank() const override { return 0; }
  int size() const override { return 3; }
  void serve(const std::function<std::string()>& status) override {
    std::lock_guard lock(mutex_);
    last_status_ = status();
  }
  std::string last_status() {
    std::lock_guard lock(mutex_);
    return last_status_;
  }
  std::vector<std::optional<comm::PeerAnswer>> ask_all(
      Seconds, const std::function<std::string()>&) override {
    const auto now = std::chrono::steady_clock::now();
    std::vector<std::optional<comm::PeerAnswer>> answers(3);
    answers[1] = {"world#57\n\nwaiting in allreduce #57 on 'world' for 0.1 s", now};
    std::lock_guard lock(mutex_);
    if (rank2_answers_ && rank2_) answers[2] = {*rank2_, now};
    return answers;
  }

 private:
  bool rank2_answers_;
  std::mutex mutex_;
  std::string last_status_;
  std::optional<std::string> rank2_ = "\n\nnot in a collective; the last one finished 9.0 s ago";
};

}  // namespace

TEST_CASE("a collective that outlives the timeout is reported with its step and purpose",
          "[comm][watchdog]") {
  Reports reports;
  Watchdog watchdog(Seconds(0.1), reports.handler());
  watchdog.set_step(7);
  {
    comm::OperationContext context("gradient bucket 2 of 3");
    Watchdog::Scope scope(&watchdog, allreduce_info(57));
    REQUIRE(reports.wait_for_one());
  }
  const std::string message = reports.first();
  CHECK_THAT(message, Catch::Contains("allreduce #57 on 'world' (1024 f32; gradient bucket 2 of "
                                      "3) at step 7") &&
                          Catch::Contains("has not completed") &&
                          Catch::Contains("LOCKSTEP_COMM_TIMEOUT"));
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  CHECK(reports.count() == 1);  // reported once, however long it waits
}

TEST_CASE("collectives that finish in time are not reported", "[comm][watchdog]") {
  Reports reports;
  Watchdog watchdog(Seconds(2.0), reports.handler());
  for (int i = 0; i < 100; ++i) Watchdog::Scope scope(&watchdog, allreduce_info(i));
  std::atomic<bool> done{false};
  watchdog.watch_async(allreduce_info(100), [&] { return done.load(); });
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  CHECK_THAT(watchdog.status(), Catch::StartsWith("world#100\n"));
  done = true;
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  CHECK(reports.count() == 0);
  CHECK_THAT(watchdog.status(),
             Catch::StartsWith("\n\nnot in a collective; the last one, allreduce #100"));
  Watchdog::Scope unwatched(nullptr, allreduce_info(101));  // a null watchdog watches nothing
}

TEST_CASE("an asynchronous collective that never completes, or fails, is reported",
          "[comm][watchdog]") {
  Reports reports;
  Watchdog watchdog(Seconds(0.1), reports.handler());
  watchdog.watch_async(allreduce_info(3), [] { return false; });
  REQUIRE(reports.wait_for_one());
  CHECK_THAT(reports.first(), Catch::Contains("allreduce #3 on 'world'"));

  Reports failures;
  Watchdog failing(Seconds(60.0), failures.handler());
  failing.watch_async(allreduce_info(4), []() -> bool {
    throw LibraryError("CUDA", 700, "CUDA error 700 (illegal address)");
  });
  REQUIRE(failures.wait_for_one());
  CHECK_THAT(failures.first(),
             Catch::Contains("allreduce #4") && Catch::Contains("failed: CUDA error 700"));
}

TEST_CASE("asynchronous errors are polled and reported once, with what was in flight",
          "[comm][watchdog]") {
  Reports reports;
  Watchdog watchdog(Seconds(60.0), reports.handler());
  std::atomic<bool> broken{false};
  const int id = watchdog.add_error_source([&]() -> std::optional<std::string> {
    if (broken) return "NCCL reported an asynchronous error on 'world.nccl': remote process exited";
    return std::nullopt;
  });
  const int other = watchdog.add_error_source([] { return std::optional<std::string>(); });
  watchdog.remove_error_source(other);
  Watchdog::Scope scope(&watchdog, allreduce_info(9));
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  CHECK(reports.count() == 0);
  broken = true;
  REQUIRE(reports.wait_for_one());
  CHECK_THAT(reports.first(), Catch::Contains("remote process exited") &&
                                  Catch::Contains("waiting in allreduce #9"));
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  CHECK(reports.count() == 1);
  watchdog.remove_error_source(id);
}

TEST_CASE("the timeout message says which ranks joined the collective and which did not",
          "[comm][watchdog]") {
  for (bool rank2_answers : {true, false}) {
    Reports reports;
    Watchdog watchdog(Seconds(0.1), reports.handler(),
                      std::make_unique<ScriptedPeers>(rank2_answers));
    {
      Watchdog::Scope scope(&watchdog, allreduce_info(57));
      REQUIRE(reports.wait_for_one());
    }
    const std::string message = reports.first();
    CHECK_THAT(message, Catch::Contains("waiting for all 3 ranks") &&
                            Catch::Contains("rank 1 has joined it: waiting in allreduce #57"));
    if (rank2_answers)
      CHECK_THAT(message, Catch::Contains("rank 2 has NOT joined it: not in a collective"));
    else
      CHECK_THAT(message, Catch::Contains("rank 2: no answer") &&
                              Catch::Contains("ranks that did not answer: 2"));
    CHECK_THAT(message, !Catch::Contains("rank 0"));  // this rank does not ask itself
  }
}

TEST_CASE("the watchdog answers other ranks' questions with its collectives in flight",
          "[comm][watchdog]") {
  Reports reports;
  auto peers = std::make_unique<ScriptedPeers>(true);
  ScriptedPeers* channel = peers.get();
  Watchdog watchdog(Seconds(5.0), reports.handler(), std::move(peers));
  watchdog.set_step(3);
  Watchdog::Scope scope(&watchdog, allreduce_info(5));
  std::string answer;
  for (int i = 0; i < 500 && answer.empty(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    answer = channel->last_status();
  }
  CHECK_THAT(answer, Catch::StartsWith("world#5\n\nwaiting in allreduce #5 on 'world'") &&
                         Catch::Contains("at step 3"));
  CHECK(reports.count() == 0);
}

TEST_CASE("a busy rank says what it is busy with, and for how long", "[comm][watchdog]") {
  Reports reports;
  Watchdog watchdog(Seconds(5.0), reports.handler());
  {
    Watchdog::Busy saving(&watchdog, "saving checkpoint ckpt-12.h5");
    CHECK_THAT(watchdog.status(),
               Catch::StartsWith("\nsaving checkpoint ckpt-12.h5 for 0.") &&
                   Catch::Contains("\nnot in a collective: busy saving checkpoint ckpt-12.h5"));
    {
      Watchdog::Busy inner(&watchdog, "fsync");
      CHECK_THAT(watchdog.status(), Catch::StartsWith("\nfsync for "));
    }
    CHECK_THAT(watchdog.status(), Catch::StartsWith("\nsaving checkpoint"));
  }
  CHECK_THAT(watchdog.status(), Catch::StartsWith("\n\nnot in a collective; none has run yet"));
  Watchdog::Busy nothing(nullptr, "a null watchdog watches nothing");
}

// Note [busy ranks]: rank 2 busy keeps rank 0 waiting past its 0.1 s timeout,
// however often it times out (0.6 s is six timeouts); once rank 2 is idle,
// or silent, the next timeout is reported.
TEST_CASE("a collective waiting for a busy rank waits on; an idle or silent rank ends it",
          "[comm][watchdog]") {
  for (const std::optional<std::string>& after :
       {std::optional<std::string>("\n\nnot in a collective; the last one finished 9.0 s ago"),
        std::optional<std::string>()}) {
    Reports reports;
    auto peers = std::make_unique<ScriptedPeers>(true);
    ScriptedPeers* channel = peers.get();
    channel->set_rank2("\nsaving checkpoint ckpt-12.h5 for 3.0 s\nnot in a collective: busy");
    Watchdog watchdog(Seconds(0.1), reports.handler(), std::move(peers));
    Watchdog::Scope scope(&watchdog, allreduce_info(57));
    std::this_thread::sleep_for(std::chrono::milliseconds(600));
    CHECK(reports.count() == 0);
    channel->set_rank2(after);
    REQUIRE(reports.wait_for_one());
    if (after)
      CHECK_THAT(reports.first(), Catch::Contains("rank 2 has NOT joined it: not in a collective"));
    else
      CHECK_THAT(reports.first(), Catch::Contains("ranks that did not answer: 2"));
  }
}

TEST_CASE("LOCKSTEP_COMM_TIMEOUT takes positive seconds", "[comm][watchdog]") {
  CHECK(comm::parse_timeout_seconds("600").count() == 600.0);
  CHECK(comm::parse_timeout_seconds("2.5").count() == 2.5);
  for (const char* bad : {"", "abc", "0", "-1", "5s", "inf", "nan"})
    CHECK_THROWS_WITH(comm::parse_timeout_seconds(bad),
                      Catch::Contains("LOCKSTEP_COMM_TIMEOUT") && Catch::Contains("positive"));
}

TEST_CASE("operation contexts nest per thread", "[comm][watchdog]") {
  CHECK(comm::OperationContext::current().empty());
  {
    comm::OperationContext outer("outer");
    {
      comm::OperationContext inner("inner");
      CHECK(comm::OperationContext::current() == "inner");
      std::thread([] { CHECK(comm::OperationContext::current().empty()); }).join();
    }
    CHECK(comm::OperationContext::current() == "outer");
  }
  CHECK(comm::OperationContext::current().empty());
}
