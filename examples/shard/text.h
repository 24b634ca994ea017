// lockstep-shard text: plain-text files as byte-level token shards for a
// language model (vocabulary 256; docs/data-format.md, token shards).
#pragma once

#include <cstdint>
#include <filesystem>
#include <vector>

struct TextOptions {
  std::vector<std::filesystem::path> sources;
  std::filesystem::path out;
  std::int64_t seq = 0;  // T: each window holds T+1 tokens, windows T apart
  int shards = 1;
  double val_fraction = 0.0;  // the tail of the text that goes to OUT/val
};

// Writes OUT/train (and OUT/val when val_fraction > 0); returns the exit code.
int text(const TextOptions& options);
