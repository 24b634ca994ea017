// The per-step agreement: one small collective of {loss sum, sample count,
// stop flag, and the caller's f64 sums} that every rank runs after each
// optimizer step. It gives every rank the global mean loss, and it carries
// stop requests: a signal that reaches any one rank (a scheduler's
// preemption warning, a user's kill) makes every rank see `stop` at the same
// step, so they stop, or save a checkpoint, together (design.md, "Determinism
// contract"). ZeRO-1's inf finding and sum of squares ride along (Note
// [sharded step checks], engine/zero.h), so a step has one such collective.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <span>
#include <vector>

#include "comm/communicator.h"

namespace lockstep::comm {

struct StepTotals {
  double loss_sum = 0;       // over every rank
  std::int64_t samples = 0;  // over every rank
  bool stop = false;         // some rank asked to stop
  double mean_loss() const { return samples > 0 ? loss_sum / static_cast<double>(samples) : 0.0; }
};

// Note [step agreement]: one allgather of a fixed record per rank, eight-byte
// slots: [loss sum (f64), samples (i64), stop (0 or 1), sums...(f64)]. Every
// rank adds the records in rank order, so every rank gets the same bits
// whatever order the MPI library would reduce in, the counts are exact, and
// the f64 sums are never rounded to f32 (Note [non-finite steps],
// engine/data_parallel_step.h): an allgather, not an allreduce, because
// communicators reduce f32, f16 and bf16 only. The record is 24 + 8 x
// sums.size() bytes, so at 1024 ranks with two sums the collective moves
// 40 KB a step, as fast as a small allreduce (both are latency).
//
// Note [agreement without allocation]: the records live in the object, sized
// once, and travel by the communicator's raw-pointer allgather, so agree()
// allocates nothing (no tensor, no vector; the DataParallelStep keeps one
// StepAgreement for its lifetime). What the communicator itself does per
// collective (the watchdog's bookkeeping of MPI's) is its own.
class StepAgreement {
 public:
  // `comm` must be a communicator of host memory (comm::World::host(); else
  // InvalidArgument); `sums` is how many f64 sums every agree() carries, the
  // same on every rank.
  explicit StepAgreement(Communicator& comm, std::size_t sums = 0);

  // Collective and blocking. `loss_sum` is this rank's summed (not averaged)
  // loss over its `samples`; this rank's stop request is stop_requested().
  // `sums` (as many as constructed with) holds this rank's values on entry
  // and their sums over every rank on return. Throws InvalidArgument for a
  // negative sample count, one whose sum over the world could overflow, or
  // the wrong number of sums.
  StepTotals agree(double loss_sum, std::int64_t samples, std::span<double> sums = {});

 private:
  Communicator& comm_;
  std::size_t slots_;                  // per record
  std::vector<std::int64_t> mine_;     // this rank's record
  std::vector<std::int64_t> records_;  // every rank's, in rank order
};

// Makes these signals request a stop instead of ending the process. Under
// OpenMPI, mpirun forwards SIGUSR1 and SIGUSR2 to every rank (SIGINT and
// SIGTERM make it kill the job), so `kill -USR1 <mpirun pid>` stops a run at
// the next step; Slurm's `--signal=USR1@120` warns before a time limit.
void install_stop_handlers(std::initializer_list<int> signals);
void request_stop();  // what the handlers do; async-signal-safe
bool stop_requested();
void clear_stop_request();

}  // namespace lockstep::comm
