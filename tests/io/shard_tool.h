// run_shard_tool(): runs the lockstep-shard program of this build
// (LOCKSTEP_SHARD_TOOL, set by tests/io/CMakeLists.txt) with the given
// arguments, for the tests of its readers and writers.
#pragma once

#include <fmt/core.h>
#include <sys/wait.h>
#include <catch2/catch.hpp>

#include <array>
#include <cstdio>
#include <string>

namespace lockstep::test {

// Its exit status (-1 when a signal ended it), and its stdout and stderr
// together in *output when output is given.
inline int run_shard_tool(const std::string& arguments, std::string* output = nullptr) {
  const std::string command = fmt::format("{} {} 2>&1", LOCKSTEP_SHARD_TOOL, arguments);
  FILE* pipe = popen(command.c_str(), "r");
  REQUIRE(pipe);
  std::string text;
  std::array<char, 4096> buffer;
  while (std::fgets(buffer.data(), buffer.size(), pipe)) text += buffer.data();
  const int status = pclose(pipe);
  if (output) *output = text;
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

}  // namespace lockstep::test
