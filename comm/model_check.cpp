// check_same_model (comm/model_check.h): rank 0's entries are broadcast,
// every rank finds its first difference from them, and an allgather of
// fixed-size records tells every rank about every other.
#include "comm/model_check.h"

#include <fmt/core.h>

#include <algorithm>
#include <cstring>

#include "kernels/error.h"

namespace lockstep::comm {
namespace {

// A record: the index of the rank's first differing entry (-1: none), then
// that entry's text, cut to fit.
constexpr std::int64_t kRecordBytes = 256;
constexpr std::size_t kTextBytes = kRecordBytes - sizeof(std::int64_t) - 1;
// Ranks named per version of the differing entry, so messages stay readable
// at a thousand ranks.
constexpr std::size_t kRanksNamed = 8;

std::string join_lines(const std::vector<std::string>& lines) {
  std::string text;
  for (const std::string& line : lines) text += line + "\n";
  return text;
}

std::vector<std::string> split_lines(const std::string& text) {
  std::vector<std::string> lines;
  std::size_t start = 0;
  for (std::size_t end; (end = text.find('\n', start)) != std::string::npos; start = end + 1)
    lines.push_back(text.substr(start, end - start));
  return lines;
}

std::string nothing_after(std::size_t count) {
  return fmt::format("nothing (its model ends after {} entries)", count);
}

// Rank 0's entries, on every rank.
std::vector<std::string> broadcast_entries(Communicator& comm,
                                           const std::vector<std::string>& entries) {
  const std::string mine = join_lines(entries);
  core::Tensor length = core::Tensor::from_vector<std::int64_t>(
      {static_cast<std::int64_t>(mine.size())}, {1}, DType::i64, comm.device());
  comm.broadcast(length, 0);
  const std::int64_t bytes = length.to_vector<std::int64_t>()[0];
  core::Tensor text = comm.rank() == 0
                          ? core::Tensor::from_host(mine.data(), {bytes}, DType::u8, comm.device())
                          : core::Tensor::empty({bytes}, DType::u8, comm.device());
  comm.broadcast(text, 0);
  const std::vector<std::uint8_t> received = text.to_vector<std::uint8_t>();
  return split_lines(std::string(received.begin(), received.end()));
}

}  // namespace

void check_same_model(Communicator& comm, const std::vector<std::string>& entries) {
  const std::vector<std::string> reference = broadcast_entries(comm, entries);

  std::int64_t first = -1;
  std::string mine;
  const std::size_t common = std::min(entries.size(), reference.size());
  for (std::size_t i = 0; i < common && first < 0; ++i)
    if (entries[i] != reference[i]) {
      first = static_cast<std::int64_t>(i);
      mine = entries[i];
    }
  if (first < 0 && entries.size() != reference.size()) {
    first = static_cast<std::int64_t>(common);
    mine = entries.size() > common ? entries[common] : nothing_after(entries.size());
  }

  std::vector<std::uint8_t> record(kRecordBytes, 0);
  std::memcpy(record.data(), &first, sizeof first);
  std::memcpy(record.data() + sizeof first, mine.data(), std::min(mine.size(), kTextBytes));
  const core::Tensor send =
      core::Tensor::from_host(record.data(), {kRecordBytes}, DType::u8, comm.device());
  core::Tensor all = core::Tensor::empty({kRecordBytes * comm.size()}, DType::u8, comm.device());
  comm.allgather(send, all);
  const std::vector<std::uint8_t> records = all.to_vector<std::uint8_t>();

  // The earliest difference any rank reports, and who has which version of it.
  std::int64_t entry = -1;
  for (int r = 0; r < comm.size(); ++r) {
    std::int64_t index;
    std::memcpy(&index, records.data() + r * kRecordBytes, sizeof index);
    if (index >= 0 && (entry < 0 || index < entry)) entry = index;
  }
  if (entry < 0) return;
  std::vector<std::pair<std::string, std::vector<int>>> versions;
  for (int r = 0; r < comm.size(); ++r) {
    const std::uint8_t* at = records.data() + r * kRecordBytes;
    std::int64_t index;
    std::memcpy(&index, at, sizeof index);
    if (index != entry) continue;
    const std::string text(reinterpret_cast<const char*>(at + sizeof index));
    auto it = std::find_if(versions.begin(), versions.end(),
                           [&](const auto& v) { return v.first == text; });
    if (it == versions.end()) it = versions.insert(versions.end(), {text, {}});
    it->second.push_back(r);
  }

  const auto e = static_cast<std::size_t>(entry);
  std::string message =
      fmt::format("the model differs across ranks at entry {}: rank 0 has {}", entry,
                  e < reference.size() ? reference[e] : nothing_after(reference.size()));
  for (const auto& [text, ranks] : versions) {
    std::string who = ranks.size() == 1 ? "rank" : "ranks";
    for (std::size_t i = 0; i < std::min(ranks.size(), kRanksNamed); ++i)
      who += fmt::format("{} {}", i ? "," : "", ranks[i]);
    if (ranks.size() > kRanksNamed) who += fmt::format(" and {} more", ranks.size() - kRanksNamed);
    message += fmt::format("; {} {} {}", who, ranks.size() == 1 ? "has" : "have", text);
  }
  message +=
      ". Every rank must build the same model: check that all ranks run the same program "
      "with the same configuration";
  throw InvalidArgument(message);
}

}  // namespace lockstep::comm
