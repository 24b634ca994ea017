// core::OutputFile, AppendFile and the run's inputs (engine/core/output_file.h,
// Note [one way to write a file]): a file appears whole or not at all, links
// planted at its name are never written through, and an output that is one
// of the run's inputs is refused with the input untouched.
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <cerrno>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "engine/core/output_file.h"
#include "kernels/error.h"
#include "temp_dir.h"

using lockstep::IoError;
using lockstep::test::TempDir;
namespace core = lockstep::core;
namespace fs = std::filesystem;

namespace {

std::string text_of(const fs::path& file) {
  std::ifstream in(file, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

std::vector<std::string> names_in(const fs::path& dir) {
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(dir)) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  return names;
}

}  // namespace

TEST_CASE("an output file appears whole on commit and not at all without it", "[core][files]") {
  TempDir dir;
  core::write_file(dir / "out.json", "first\n", "the test's file");
  CHECK(text_of(dir / "out.json") == "first\n");
  core::write_file(dir / "out.json", "second\n", "the test's file");
  CHECK(text_of(dir / "out.json") == "second\n");
  {
    core::OutputFile file(dir / "out.json", "the test's file");
    file.write("never committed");
    CHECK(fs::exists(file.temporary()));
    CHECK(file.temporary().parent_path() == dir.path());
  }
  CHECK(text_of(dir / "out.json") == "second\n");
  CHECK(names_in(dir.path()) == std::vector<std::string>{"out.json"});  // no temporary left
  CHECK_THROWS_WITH(core::write_file(dir / "absent" / "out.json", "x", "the test's file"),
                    Catch::Contains("the test's file") && Catch::Contains("absent"));
}

TEST_CASE("a link planted at an output's name is replaced, never written through",
          "[core][files]") {
  TempDir dir, elsewhere;
  const fs::path victim = elsewhere / "ckpt-10.h5";
  std::ofstream(victim) << "precious";
  fs::create_symlink(victim, dir / "trace.json");
  core::write_file(dir / "trace.json", "{}", "the trace file");
  CHECK(text_of(victim) == "precious");
  CHECK_FALSE(fs::is_symlink(dir / "trace.json"));
  CHECK(text_of(dir / "trace.json") == "{}");

  // An append-only record file refuses the link and leaves its target alone.
  fs::create_symlink(victim, dir / "metrics.jsonl");
  CHECK_THROWS_WITH(core::AppendFile(dir / "metrics.jsonl", "the metrics file"),
                    Catch::Contains("symbolic link") && Catch::Contains("metrics.jsonl"));
  CHECK(text_of(victim) == "precious");
  fs::create_directory(dir / "a-directory");
  CHECK_THROWS_AS(core::AppendFile(dir / "a-directory", "the metrics file"), IoError);
}

TEST_CASE("an output that is one of the run's inputs is refused, however it is named",
          "[core][files]") {
  TempDir dir;
  const fs::path input = dir / "weights.h5";
  std::ofstream(input) << "the only copy";
  core::note_input(input);
  CHECK_THROWS_WITH(core::write_file(input, "onnx", "the ONNX file"),
                    Catch::Contains("one of this run's inputs") && Catch::Contains("weights.h5"));
  // The same file through another name: a symlink, a hard link, a dotted path.
  fs::create_symlink(input, dir / "alias.h5");
  fs::create_hard_link(input, dir / "hard.h5");
  for (const fs::path& other : {dir / "alias.h5", dir / "hard.h5", dir / "." / "weights.h5"}) {
    INFO(other);
    CHECK_THROWS_WITH(core::write_file(other, "onnx", "the ONNX file"),
                      Catch::Contains("the same file as") || Catch::Contains("inputs"));
    CHECK_THROWS_WITH(core::AppendFile(other, "the metrics file"),
                      Catch::Contains("inputs") || Catch::Contains("symbolic link"));
  }
  // The commit step of the HDF5 writers (checkpoints, shards) refuses it too.
  const int fd = core::create_exclusive(dir / ".tmp");
  core::write_all(fd, "x", 1, dir / ".tmp");
  core::sync_and_close(fd, dir / ".tmp");
  CHECK_THROWS_WITH(core::commit_rename(dir / ".tmp", input), Catch::Contains("inputs"));
  CHECK(text_of(input) == "the only copy");
  core::remove_temporary(dir / ".tmp");
}

TEST_CASE("an append-only record file grows by whole lines", "[core][files]") {
  TempDir dir;
  {
    core::AppendFile file(dir / "m.jsonl", "the metrics file");
    CHECK(file.append("{\"step\": 1}\n") == 0);
  }
  {
    core::AppendFile file(dir / "m.jsonl", "the metrics file");  // a resumed run continues it
    CHECK(file.append("{\"step\": 2}\n") == 0);
  }
  CHECK(text_of(dir / "m.jsonl") == "{\"step\": 1}\n{\"step\": 2}\n");
  if (fs::exists("/dev/full")) {  // a full disk: the caller gets the errno
    core::AppendFile full("/dev/full", "the metrics file");
    CHECK(full.append("{}\n") == ENOSPC);
  }
}

TEST_CASE("an append-only record file refuses a FIFO without a reader instead of hanging",
          "[core][files]") {
  TempDir dir;
  REQUIRE(::mkfifo((dir / "fifo").c_str(), 0600) == 0);
  CHECK_THROWS_WITH(core::AppendFile(dir / "fifo", "the metrics file"),
                    Catch::Contains("a FIFO with no reader"));
}
