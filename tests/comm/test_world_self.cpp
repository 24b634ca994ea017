// comm::init without a launcher: a world of one that never starts MPI, the
// launcher detection it relies on, the timeout setting, and the abort path
// (in a forked child, whose exit code and output the test reads).
#include <catch2/catch.hpp>

#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <string>
#include <thread>

#include "comm/world.h"
#include "kernels/error.h"
#include "tests/temp_dir.h"

using namespace lockstep;

namespace {

// A launcher-free environment for this test process.
void clear_launcher_environment() {
  for (const char* name : {"OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_RANK", "SLURM_PROCID"})
    unsetenv(name);
}

struct ChildResult {
  int exit_code = -1;
  std::string output;  // stderr
  double seconds = 0;
};

// Runs `body` in a forked child and collects its exit code and stderr.
template <typename Body>
ChildResult run_in_child(Body body) {
  int pipe_fds[2];
  REQUIRE(pipe(pipe_fds) == 0);
  const auto start = std::chrono::steady_clock::now();
  const pid_t pid = fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    dup2(pipe_fds[1], STDERR_FILENO);
    close(pipe_fds[0]);
    body();
    std::_Exit(0);
  }
  close(pipe_fds[1]);
  ChildResult result;
  char chunk[4096];
  for (ssize_t n; (n = read(pipe_fds[0], chunk, sizeof chunk)) > 0;)
    result.output.append(chunk, static_cast<std::size_t>(n));
  close(pipe_fds[0]);
  int status = 0;
  waitpid(pid, &status, 0);
  result.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  result.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return result;
}

}  // namespace

TEST_CASE("launchers are recognised by their environment variables", "[comm][world]") {
  for (const char* name : {"OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_RANK", "SLURM_PROCID"}) {
    const std::map<std::string, std::string> env{{name, "0"}, {"HOME", "/root"}};
    const auto found = comm::detect_launcher([&](const char* n) -> const char* {
      const auto it = env.find(n);
      return it == env.end() ? nullptr : it->second.c_str();
    });
    CHECK(found == std::optional<std::string>(name));
  }
  CHECK_FALSE(comm::detect_launcher([](const char*) -> const char* { return nullptr; }));
}

TEST_CASE("launched directly, the world is one rank without MPI", "[comm][world]") {
  clear_launcher_environment();
  unsetenv("LOCKSTEP_COMM_TIMEOUT");
  int argc = 1;
  char name[] = "test";
  char* args[] = {name, nullptr};
  char** argv = args;
  auto world = comm::init(argc, argv, {.use_gpu = false});
  CHECK(world->rank() == 0);
  CHECK(world->size() == 1);
  CHECK(world->local_rank() == 0);
  CHECK_FALSE(world->uses_mpi());
  CHECK(world->device() == core::Device::cpu());
  CHECK(std::string(world->host().backend()) == "self");
  CHECK(&world->for_device(core::Device::cpu()) == &world->host());
  CHECK_THROWS_WITH(world->for_device(core::Device::cuda(0)), Catch::Contains("cuda:0"));
  CHECK(world->watchdog().timeout() == comm::kDefaultCommTimeout);
  world->shutdown();
  world->shutdown();  // idempotent
}

TEST_CASE("LOCKSTEP_COMM_TIMEOUT sets the watchdog's timeout, and a bad value is an error",
          "[comm][world]") {
  clear_launcher_environment();
  int argc = 0;
  char** argv = nullptr;
  setenv("LOCKSTEP_COMM_TIMEOUT", "2.5", 1);
  CHECK(comm::init(argc, argv, {.use_gpu = false})->watchdog().timeout().count() == 2.5);
  setenv("LOCKSTEP_COMM_TIMEOUT", "ten", 1);
  CHECK_THROWS_WITH(comm::init(argc, argv, {.use_gpu = false}),
                    Catch::Contains("LOCKSTEP_COMM_TIMEOUT='ten'"));
  unsetenv("LOCKSTEP_COMM_TIMEOUT");
}

TEST_CASE("World::abort logs the message and ends the process with the abort code",
          "[comm][world]") {
  clear_launcher_environment();
  const ChildResult child = run_in_child([] {
    int argc = 0;
    char** argv = nullptr;
    auto world = comm::init(argc, argv, {.use_gpu = false});
    world->abort("checkpoint directory vanished");
  });
  CHECK(child.exit_code == comm::kAbortExitCode);
  CHECK_THAT(child.output, Catch::Contains("[rank 0] checkpoint directory vanished") &&
                               Catch::Contains("ending the job"));
}

TEST_CASE("a collective that never completes ends the process within the timeout",
          "[comm][world]") {
  clear_launcher_environment();
  // The timeout writes the flight recorder's dump: into a directory of the
  // test's own, not the working directory.
  const test::TempDir flight;
  const ChildResult child = run_in_child([&] {
    setenv("LOCKSTEP_COMM_TIMEOUT", "0.3", 1);
    setenv("LOCKSTEP_FLIGHT_DIR", flight.path().c_str(), 1);
    int argc = 0;
    char** argv = nullptr;
    auto world = comm::init(argc, argv, {.use_gpu = false});
    world->watchdog().set_step(12);
    comm::OperationInfo info;
    info.name = "allreduce";
    info.communicator = "world";
    world->watchdog().watch_async(info, [] { return false; });
    std::this_thread::sleep_for(std::chrono::seconds(30));
  });
  CHECK(child.exit_code == comm::kAbortExitCode);
  CHECK(child.seconds < 20);
  CHECK_THAT(child.output, Catch::Contains("allreduce #0 on 'world'") &&
                               Catch::Contains("at step 12") &&
                               Catch::Contains("has not completed after"));
  CHECK(std::filesystem::exists(flight / "flight-rank-0.json"));
}
