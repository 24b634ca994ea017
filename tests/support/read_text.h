// read_text: a whole file as a string, for tests that check what a program
// or the library wrote (trace files, reports).
#pragma once

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

namespace lockstep::test {

inline std::string read_text(const std::filesystem::path& file) {
  std::ifstream in(file);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

}  // namespace lockstep::test
