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
// Collective and blocking. `loss_sum` is this rank's summed (not averaged)
// loss over its `samples`; this rank's stop request is stop_requested().
// `sums` holds this rank's values on entry and their sums over every rank
// on return; every rank passes as many (the caller's configuration, which
// ranks have agreed on, fixes how many). Throws InvalidArgument for a
// negative sample count or one whose sum over the world could overflow.
StepTotals agree_on_step(Communicator& comm, double loss_sum, std::int64_t samples,
                         std::span<double> sums = {});

// Makes these signals request a stop instead of ending the process. Under
// OpenMPI, mpirun forwards SIGUSR1 and SIGUSR2 to every rank (SIGINT and
// SIGTERM make it kill the job), so `kill -USR1 <mpirun pid>` stops a run at
// the next step; Slurm's `--signal=USR1@120` warns before a time limit.
void install_stop_handlers(std::initializer_list<int> signals);
void request_stop();  // what the handlers do; async-signal-safe
bool stop_requested();
void clear_stop_request();

}  // namespace lockstep::comm
