// The "ranks agree on named fields" protocol (comm/agreement.h) across real
// ranks: equal fields pass; a value, a name or the number of fields that
// differs on one rank is an error on every rank naming the field, the ranks
// and both values; and every rank resumes from the checkpoint rank 0 chose.
#include <catch2/catch.hpp>

#include <fmt/core.h>

#include <unistd.h>

#include <filesystem>
#include <string>

#include "comm/agreement.h"
#include "engine/checkpoint_choice.h"
#include "mpi/mpi_world.h"

using namespace lockstep;
namespace fs = std::filesystem;

namespace {

comm::NamedValues fields() {
  return {{"model", "mlp"}, {"lr", "0.05"}, {"seed", "7"}, {"dataset.shard[0]", "a.h5: 10 rows"}};
}

// The message every rank must get, as a matcher of each expected part.
void require_disagreement(const comm::NamedValues& mine, const std::vector<std::string>& parts) {
  comm::Communicator& comm = test::mpi_world().host();
  std::string message;
  try {
    comm::check_agreement(comm, mine);
  } catch (const InvalidArgument& e) {
    message = e.what();
  }
  INFO(message);
  for (const std::string& part : parts) CHECK_THAT(message, Catch::Contains(part));
}

}  // namespace

TEST_CASE("ranks with the same fields agree", "[mpi][agreement]") {
  comm::Communicator& comm = test::mpi_world().host();
  CHECK_NOTHROW(comm::check_agreement(comm, fields()));
  CHECK_NOTHROW(comm::check_agreement(comm, {}));
  // Newlines travel escaped and still compare equal.
  CHECK_NOTHROW(comm::check_agreement(comm, {{"note", "two\nlines"}}));
}

TEST_CASE("a value that differs on the last rank is named with both values on every rank",
          "[mpi][agreement]") {
  comm::Communicator& comm = test::mpi_world().host();
  if (comm.size() == 1) return;  // one rank always agrees with itself
  const int last = comm.size() - 1;
  comm::NamedValues mine = fields();
  if (comm.rank() == last) mine[1].second = "0.1";
  require_disagreement(mine, {"ranks disagree on 'lr'", "rank 0 has '0.05'",
                              fmt::format("rank {} has '0.1'", last)});
}

TEST_CASE("different values on several ranks are each named with their ranks", "[mpi][agreement]") {
  comm::Communicator& comm = test::mpi_world().host();
  if (comm.size() < 3) return;
  comm::NamedValues mine = fields();
  mine[3].second = fmt::format("shard-of-rank-{}.h5: 10 rows", comm.rank());
  require_disagreement(
      mine,
      {"ranks disagree on 'dataset.shard[0]'", "rank 0 has 'shard-of-rank-0.h5: 10 rows'",
       "rank 1 has 'shard-of-rank-1.h5: 10 rows'", "rank 2 has 'shard-of-rank-2.h5: 10 rows'"});
}

TEST_CASE("a missing or renamed field is a disagreement, not a hang", "[mpi][agreement]") {
  comm::Communicator& comm = test::mpi_world().host();
  if (comm.size() == 1) return;
  const int last = comm.size() - 1;
  comm::NamedValues fewer = fields();
  if (comm.rank() == last) fewer.pop_back();
  require_disagreement(fewer,
                       {"ranks disagree on 'dataset.shard[0]'", "rank 0 has 'a.h5: 10 rows'",
                        fmt::format("rank {} has no such field (it passed 3 fields)", last)});
  comm::NamedValues renamed = fields();
  if (comm.rank() == last) renamed[2].first = "shuffle";
  require_disagreement(renamed, {"ranks disagree on 'seed'", "rank 0 has '7'",
                                 fmt::format("rank {} has field 'shuffle' = '7'", last)});
}

TEST_CASE("every rank resumes from the checkpoint rank 0 chose, or all report the difference",
          "[mpi][agreement]") {
  comm::Communicator& comm = test::mpi_world().host();
  // A directory per rank, as on hosts without a shared file system.
  const std::string job = comm::broadcast_text(comm, std::to_string(::getpid()), 0);
  auto dir_of = [&](int rank) {
    return fs::temp_directory_path() / fmt::format("lockstep-agree-{}-{}", job, rank);
  };
  const fs::path dir = dir_of(comm.rank());
  fs::remove_all(dir);
  const engine::CheckpointDirectory checkpoints(dir, 10, engine::CheckpointStart::resume);
  auto save = [&](std::int64_t step, float value) {
    engine::CheckpointContents c;
    c.tensors["/model/w"] = core::Tensor::from_vector<float>({value}, {1}, DType::f32);
    c.attributes["step"] = step;
    checkpoints.save(step, c);
  };
  save(3, 1.0f);
  // Only rank 0 has step 6: every rank follows rank 0 to ckpt-6.h5.
  if (comm.rank() == 0) save(6, 2.0f);
  // Ranks that pass no directory (no --resume auto) still take part.
  const std::string newest =
      engine::newest_checkpoint_name_of_rank0(comm, comm.rank() == 1 ? nullptr : &checkpoints);
  REQUIRE(newest == "ckpt-6.h5");
  const std::optional<fs::path> chosen = dir / newest;
  if (comm.size() > 1) {
    require_disagreement({engine::checkpoint_agreement_field(chosen)},
                         {"ranks disagree on 'checkpoint'", "rank 0 has 'ckpt-6.h5 (crc32 ",
                          "rank 1 has 'checkpoint ", "ckpt-6.h5' has no valid checksum"});
    // The same step, other bytes on the other ranks.
    if (comm.rank() != 0) save(6, 3.0f);
    std::string message;
    try {
      comm::check_agreement(comm, {engine::checkpoint_agreement_field(chosen)});
    } catch (const InvalidArgument& e) {
      message = e.what();
    }
    CHECK_THAT(message, Catch::Contains("rank 0 has 'ckpt-6.h5 (crc32 "));
    CHECK_THAT(message, Catch::Matches(".*; ranks? 1(, 2)? ha(s|ve) 'ckpt-6\\.h5 \\(crc32 .*"));
    // A copy of rank 0's bytes agrees.
    if (comm.rank() != 0)
      for (const char* name : {"ckpt-6.h5", "ckpt-6.h5.crc32"})
        fs::copy_file(dir_of(0) / name, dir / name, fs::copy_options::overwrite_existing);
  }
  CHECK_NOTHROW(comm::check_agreement(comm, {engine::checkpoint_agreement_field(chosen)}));
  CHECK(engine::newest_checkpoint_name_of_rank0(comm, nullptr).empty());
  comm.barrier();  // rank 0's files are read by the others until here
  fs::remove_all(dir);
}
