// The agreement protocol on one rank (it always agrees with itself, and moves
// text through broadcast unchanged) and how messages name ranks. The
// multi-rank disagreements are in tests/mpi/test_agreement.cpp.
#include <catch2/catch.hpp>

#include "comm/agreement.h"
#include "comm/self_communicator.h"

using namespace lockstep;

TEST_CASE("one rank agrees with itself and broadcasts text unchanged", "[comm][agreement]") {
  comm::SelfCommunicator self;
  CHECK_NOTHROW(comm::check_agreement(self, {{"lr", "0.1"}, {"note", "two\nlines"}}));
  CHECK_NOTHROW(comm::check_agreement(self, {}));
  CHECK_FALSE(comm::first_difference(self, {"a", "b"}));
  const std::string text("bytes\0with a zero and a\nnewline", 31);
  CHECK(comm::broadcast_text(self, text, 0) == text);
  CHECK(comm::broadcast_text(self, "", 0).empty());
}

TEST_CASE("messages name up to eight ranks per version, then a count", "[comm][agreement]") {
  CHECK(comm::rank_list({3}) == "rank 3");
  CHECK(comm::rank_list({1, 2}) == "ranks 1, 2");
  CHECK(comm::rank_list({0, 1, 2, 3, 4, 5, 6, 7, 8, 9}) ==
        "ranks 0, 1, 2, 3, 4, 5, 6, 7 and 2 more");
}
