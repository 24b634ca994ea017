// check_same_model (comm/model_check.h): the agreement protocol of
// comm/agreement.h over the model's entries, with a message in model terms.
#include "comm/model_check.h"

#include <fmt/core.h>

#include "comm/agreement.h"
#include "kernels/error.h"

namespace lockstep::comm {

void check_same_model(Communicator& comm, const std::vector<std::string>& entries) {
  const std::optional<EntryDifference> d = first_difference(comm, entries);
  if (!d) return;
  auto describe = [&](const std::optional<std::string>& entry) {
    return entry ? *entry : fmt::format("nothing (its model ends after {} entries)", d->index);
  };
  std::string message = fmt::format("the model differs across ranks at entry {}: rank 0 has {}",
                                    d->index, describe(d->reference));
  for (const auto& [version, ranks] : d->versions)
    message += fmt::format("; {} {} {}", rank_list(ranks), ranks.size() == 1 ? "has" : "have",
                           describe(version));
  message +=
      ". Every rank must build the same model: check that all ranks run the same program "
      "with the same configuration";
  throw InvalidArgument(message);
}

}  // namespace lockstep::comm
