// The agreement protocol (comm/agreement.h, Note [agreement]).
#include "comm/agreement.h"

#include <fmt/core.h>

#include <algorithm>
#include <cstring>

#include "kernels/error.h"

namespace lockstep::comm {
namespace {

// A record: the index of the rank's first differing entry (-1: none), a byte
// saying whether the rank has an entry there, then that entry's text, cut to fit.
constexpr std::int64_t kRecordBytes = 512;
constexpr std::size_t kHeaderBytes = sizeof(std::int64_t) + 1;
constexpr std::size_t kTextBytes = kRecordBytes - kHeaderBytes - 1;
// Ranks named per version, so that messages stay readable at a thousand ranks.
constexpr std::size_t kRanksNamed = 8;

std::string escape_newlines(const std::string& entry) {
  std::string out;
  for (char c : entry) out += c == '\n' ? std::string("\\n") : std::string(1, c);
  return out;
}

std::string join_lines(const std::vector<std::string>& lines) {
  std::string text;
  for (const std::string& line : lines) text += escape_newlines(line) + "\n";
  return text;
}

std::vector<std::string> split_lines(const std::string& text) {
  std::vector<std::string> lines;
  std::size_t start = 0;
  for (std::size_t end; (end = text.find('\n', start)) != std::string::npos; start = end + 1)
    lines.push_back(text.substr(start, end - start));
  return lines;
}

std::uint64_t fnv1a(const std::string& bytes) {
  std::uint64_t h = 14695981039346656037ull;
  for (unsigned char c : bytes) h = (h ^ c) * 1099511628211ull;
  return h;
}

// Whether every rank's (entry count, hash) equals every other's: one allgather.
bool digests_agree(Communicator& comm, const std::string& text, std::size_t count) {
  const std::vector<std::int64_t> mine{static_cast<std::int64_t>(count),
                                       static_cast<std::int64_t>(fnv1a(text))};
  const core::Tensor send = core::Tensor::from_vector(mine, {2}, DType::i64, comm.device());
  core::Tensor all = core::Tensor::empty({2 * comm.size()}, DType::i64, comm.device());
  comm.allgather(send, all);
  const std::vector<std::int64_t> digests = all.to_vector<std::int64_t>();
  for (int r = 1; r < comm.size(); ++r)
    if (digests[2 * r] != digests[0] || digests[2 * r + 1] != digests[1]) return false;
  return true;
}

}  // namespace

std::string broadcast_text(Communicator& comm, const std::string& text, int root) {
  core::Tensor length = core::Tensor::from_vector<std::int64_t>(
      {static_cast<std::int64_t>(text.size())}, {1}, DType::i64, comm.device());
  comm.broadcast(length, root);
  const std::int64_t bytes = length.to_vector<std::int64_t>()[0];
  if (bytes == 0) return "";
  core::Tensor buffer =
      comm.rank() == root ? core::Tensor::from_host(text.data(), {bytes}, DType::u8, comm.device())
                          : core::Tensor::empty({bytes}, DType::u8, comm.device());
  comm.broadcast(buffer, root);
  const std::vector<std::uint8_t> received = buffer.to_vector<std::uint8_t>();
  return std::string(received.begin(), received.end());
}

std::string rank_list(const std::vector<int>& ranks) {
  std::string who = ranks.size() == 1 ? "rank" : "ranks";
  for (std::size_t i = 0; i < std::min(ranks.size(), kRanksNamed); ++i)
    who += fmt::format("{} {}", i ? "," : "", ranks[i]);
  if (ranks.size() > kRanksNamed) who += fmt::format(" and {} more", ranks.size() - kRanksNamed);
  return who;
}

std::optional<EntryDifference> first_difference(Communicator& comm,
                                                const std::vector<std::string>& entries) {
  const std::string text = join_lines(entries);
  if (digests_agree(comm, text, entries.size())) return std::nullopt;

  const std::vector<std::string> mine = split_lines(text);  // escaped, as rank 0's are
  const std::vector<std::string> reference = split_lines(broadcast_text(comm, text, 0));
  std::int64_t first = -1;
  const std::size_t common = std::min(mine.size(), reference.size());
  for (std::size_t i = 0; i < common && first < 0; ++i)
    if (mine[i] != reference[i]) first = static_cast<std::int64_t>(i);
  if (first < 0 && mine.size() != reference.size()) first = static_cast<std::int64_t>(common);
  const bool has_entry = first >= 0 && static_cast<std::size_t>(first) < mine.size();

  std::vector<std::uint8_t> record(kRecordBytes, 0);
  std::memcpy(record.data(), &first, sizeof first);
  record[sizeof first] = has_entry ? 1 : 0;
  if (has_entry) {
    const std::string& entry = mine[static_cast<std::size_t>(first)];
    std::memcpy(record.data() + kHeaderBytes, entry.data(), std::min(entry.size(), kTextBytes));
  }
  const core::Tensor send =
      core::Tensor::from_host(record.data(), {kRecordBytes}, DType::u8, comm.device());
  core::Tensor all = core::Tensor::empty({kRecordBytes * comm.size()}, DType::u8, comm.device());
  comm.allgather(send, all);
  const std::vector<std::uint8_t> records = all.to_vector<std::uint8_t>();

  // The earliest difference any rank reports, and who has which version of it.
  // (Digests can differ while no entry does only if a rank's entries contain
  // "\\n" where another's contain '\n': then the entries are reported equal.)
  EntryDifference d;
  d.index = -1;
  for (int r = 0; r < comm.size(); ++r) {
    std::int64_t index;
    std::memcpy(&index, records.data() + r * kRecordBytes, sizeof index);
    if (index >= 0 && (d.index < 0 || index < d.index)) d.index = index;
  }
  if (d.index < 0) return std::nullopt;
  for (int r = 0; r < comm.size(); ++r) {
    const std::uint8_t* at = records.data() + r * kRecordBytes;
    std::int64_t index;
    std::memcpy(&index, at, sizeof index);
    if (index != d.index) continue;
    std::optional<std::string> version;
    if (at[sizeof index]) version = std::string(reinterpret_cast<const char*>(at + kHeaderBytes));
    auto it = std::find_if(d.versions.begin(), d.versions.end(),
                           [&](const auto& v) { return v.first == version; });
    if (it == d.versions.end()) it = d.versions.insert(d.versions.end(), {version, {}});
    it->second.push_back(r);
  }
  const auto e = static_cast<std::size_t>(d.index);
  if (e < reference.size()) d.reference = reference[e];
  return d;
}

void check_agreement(Communicator& comm, const NamedValues& fields) {
  // An entry is "name\tvalue"; a tab in a name would only blur the message.
  std::vector<std::string> entries;
  for (const auto& [name, value] : fields) entries.push_back(name + "\t" + value);
  const std::optional<EntryDifference> d = first_difference(comm, entries);
  if (!d) return;

  auto split = [](const std::string& entry) {
    const std::size_t tab = entry.find('\t');
    return tab == std::string::npos
               ? std::pair<std::string, std::string>{entry, ""}
               : std::pair<std::string, std::string>{entry.substr(0, tab), entry.substr(tab + 1)};
  };
  // The field's name as rank 0 has it, or the first other rank's.
  const std::string name = d->reference ? split(*d->reference).first : [&] {
    for (const auto& v : d->versions)
      if (v.first) return split(*v.first).first;
    return std::string("?");
  }();
  auto describe = [&](const std::optional<std::string>& entry, std::size_t fields_count) {
    if (!entry) return fmt::format("no such field (it passed {} fields)", fields_count);
    const auto [n, value] = split(*entry);
    return n == name ? fmt::format("'{}'", value) : fmt::format("field '{}' = '{}'", n, value);
  };
  std::string message = fmt::format("ranks disagree on '{}': rank 0 has {}", name,
                                    describe(d->reference, static_cast<std::size_t>(d->index)));
  for (const auto& [version, ranks] : d->versions)
    message += fmt::format("; {} {} {}", rank_list(ranks), ranks.size() == 1 ? "has" : "have",
                           describe(version, static_cast<std::size_t>(d->index)));
  message +=
      ". Every rank must run the same configuration on the same data and checkpoint: check "
      "each rank's command line and the files it reads";
  throw InvalidArgument(message);
}

}  // namespace lockstep::comm
