// lockstep-shard text (text.h). The sources are read whole and concatenated
// in the order given; each byte is a token. The stream is split before
// windowing (the first 1 - F of it trains, the tail is held out), so no
// window of one split holds a token of the other. Windows hold T+1 tokens and
// start T apart: every token but the first is a target exactly once.
#include "text.h"

#include <fmt/core.h>

#include <fstream>
#include <iterator>
#include <string>

#include "io/shard_writer.h"
#include "kernels/error.h"

using namespace lockstep;
namespace fs = std::filesystem;

namespace {

std::vector<std::int32_t> read_bytes(const std::vector<fs::path>& sources) {
  std::vector<std::int32_t> tokens;
  for (const fs::path& path : sources) {
    std::ifstream in(path, std::ios::binary);
    if (!in) throw IoError("--src '" + path.string() + "': cannot open it (check the path)");
    const std::string bytes{std::istreambuf_iterator<char>(in), {}};
    if (in.bad()) throw IoError("--src '" + path.string() + "': reading it failed");
    for (char c : bytes) tokens.push_back(static_cast<std::uint8_t>(c));
  }
  return tokens;
}

// Windows of T+1 tokens, T apart, from tokens [begin, end).
std::int64_t write_windows(const std::vector<std::int32_t>& tokens, std::int64_t begin,
                           std::int64_t end, std::int64_t seq, int shards, const fs::path& dir,
                           const char* split) {
  const std::int64_t windows = (end - begin - 1) / seq;
  if (windows < 1)
    throw InvalidArgument(fmt::format(
        "the {} split has {} bytes, fewer than one window of --seq {} + 1 (give more text, a "
        "shorter --seq, or a different --val-fraction)",
        split, end - begin, seq));
  if (windows < shards)
    throw InvalidArgument(
        fmt::format("the {} split has {} windows, fewer than --shards {}", split, windows, shards));
  io::DatasetWriter writer(dir, {DType::i32, {seq + 1}, DType::i64, false}, windows, shards);
  std::vector<std::int32_t> window(static_cast<std::size_t>(seq + 1));
  for (std::int64_t w = 0; w < windows; ++w) {
    const auto first = tokens.begin() + begin + w * seq;
    std::copy(first, first + seq + 1, window.begin());
    writer.append(window.data(), nullptr, 1);
  }
  writer.close();
  return windows;
}

}  // namespace

int text(const TextOptions& o) {
  if (o.seq < 1) throw InvalidArgument("--seq must be at least 1");
  if (o.shards < 1) throw InvalidArgument("--shards must be at least 1");
  if (!(o.val_fraction >= 0.0 && o.val_fraction < 1.0))
    throw InvalidArgument("--val-fraction " + std::to_string(o.val_fraction) + " is not in [0, 1)");
  const std::vector<std::int32_t> tokens = read_bytes(o.sources);
  const auto total = static_cast<std::int64_t>(tokens.size());
  const auto held_out = static_cast<std::int64_t>(static_cast<double>(total) * o.val_fraction);
  const std::int64_t train =
      write_windows(tokens, 0, total - held_out, o.seq, o.shards, o.out / "train", "train");
  std::int64_t val = 0;
  if (held_out > 0)
    val = write_windows(tokens, total - held_out, total, o.seq, 1, o.out / "val", "val");
  fmt::print("wrote {} bytes as {} train and {} val windows of {} tokens to {}\n", total, train,
             val, o.seq + 1, o.out.string());
  return 0;
}
