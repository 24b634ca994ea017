// check_same_model: before training starts, every rank compares its model's
// description (names, shapes, dtypes and order of parameters and buffers)
// with rank 0's. A rank whose model differs would later wait in a collective
// of another size, or train garbage; instead every rank fails together with
// one message that names the first difference and the ranks that have it.
#pragma once

#include <string>
#include <vector>

#include "comm/communicator.h"

namespace lockstep::comm {

// Collective (Note [agreement], comm/agreement.h). Throws InvalidArgument on
// every rank when some rank's `entries` (one line each, in order) differ from
// rank 0's.
void check_same_model(Communicator& comm, const std::vector<std::string>& entries);

}  // namespace lockstep::comm
