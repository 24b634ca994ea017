// Ranks agree on named fields before training: each rank passes the values it
// was given (configuration, dataset, checkpoint...), and a difference is an
// error on every rank naming the field, the ranks and their values, instead
// of ranks training side by side on different settings (Note [agreement]).
// check_same_model (comm/model_check.h) is the same protocol over model entries.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "comm/communicator.h"

namespace lockstep::comm {

// (name, value) pairs, in an order every rank builds alike.
using NamedValues = std::vector<std::pair<std::string, std::string>>;

// Note [agreement]: one allgather of a 16-byte digest per rank (the entry
// count and a 64-bit FNV-1a hash of every entry) answers the usual case,
// where every rank agrees. Only when the digests differ does it broadcast
// rank 0's entries, let each rank find its first difference from them, and
// allgather fixed-size records of that entry, so that every rank can name
// every version. Every message size is fixed or rank 0's, so a difference
// (even in the number of entries) cannot make the check itself hang.

// The first entry where some rank differs from rank 0, and who has what there.
struct EntryDifference {
  std::int64_t index = 0;
  std::optional<std::string> reference;  // rank 0's entry; nullopt: rank 0 has fewer entries
  // Each version other ranks have at `index` (nullopt: that rank has fewer
  // entries) with those ranks, in rank order. Texts are cut to 500 bytes.
  std::vector<std::pair<std::optional<std::string>, std::vector<int>>> versions;
};

// Collective; nullopt when every rank passed the same entries. Entries may
// hold any bytes but '\n', which is sent as "\\n".
std::optional<EntryDifference> first_difference(Communicator& comm,
                                                const std::vector<std::string>& entries);

// Collective. Throws InvalidArgument on every rank when some rank's fields
// (names and values, in order) differ from rank 0's:
//   ranks disagree on 'lr': rank 0 has '0.05'; rank 1 has '0.1'. ...
void check_agreement(Communicator& comm, const NamedValues& fields);

// "rank 3", "ranks 1, 2", "ranks 0, 1, ... and 12 more": how messages name ranks.
std::string rank_list(const std::vector<int>& ranks);

// Collective: rank `root`'s `text` on every rank (two broadcasts: the length, the bytes).
std::string broadcast_text(Communicator& comm, const std::string& text, int root);

}  // namespace lockstep::comm
