// Replays files through a fuzzing entry point without libFuzzer: the seed
// corpus and every input that once crashed (tests/fuzz/regressions/), run by
// the unit tests. Usage: lockstep_fuzz_replay shard|checkpoint|convert|image DIR...
// Exits non-zero when a directory is empty or an input escapes with anything
// but a lockstep::Error (a signal ends it the usual way).
#include <cstdio>
#include <cstring>
#include <exception>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "tests/fuzz/fuzz_targets.h"

int main(int argc, char** argv) {
  namespace fs = std::filesystem;
  using Target = int (*)(const std::uint8_t*, std::size_t);
  Target target = nullptr;
  if (argc >= 3 && std::strcmp(argv[1], "shard") == 0) target = lockstep::fuzz::shard_input;
  if (argc >= 3 && std::strcmp(argv[1], "checkpoint") == 0)
    target = lockstep::fuzz::checkpoint_input;
  if (argc >= 3 && std::strcmp(argv[1], "convert") == 0) target = lockstep::fuzz::convert_input;
  if (argc >= 3 && std::strcmp(argv[1], "image") == 0) target = lockstep::fuzz::image_input;
  if (target == nullptr) {
    std::fprintf(stderr, "usage: %s shard|checkpoint|convert|image DIR...\n", argv[0]);
    return 2;
  }
  for (int i = 2; i < argc; ++i) {
    std::vector<fs::path> inputs;
    for (const auto& entry : fs::directory_iterator(argv[i]))
      if (entry.is_regular_file()) inputs.push_back(entry.path());
    if (inputs.empty()) {
      std::fprintf(stderr, "%s holds no inputs\n", argv[i]);
      return 1;
    }
    for (const fs::path& path : inputs) {
      std::ifstream in(path, std::ios::binary);
      const std::string bytes((std::istreambuf_iterator<char>(in)),
                              std::istreambuf_iterator<char>());
      const auto* data = reinterpret_cast<const std::uint8_t*>(bytes.data());
      try {
        target(data, bytes.size());
      } catch (const std::exception& e) {
        std::fprintf(stderr, "%s: escaped with %s\n", path.c_str(), e.what());
        return 1;
      }
    }
    std::printf("%s: %zu inputs replayed\n", argv[i], inputs.size());
  }
  return 0;
}
