// The per-step agreement: one small allreduce of {loss sum, sample count,
// stop flag} that every rank runs after each optimizer step. It gives every
// rank the global mean loss, and it carries stop requests: a signal that
// reaches any one rank (a scheduler's preemption warning, a user's kill)
// makes every rank see `stop` at the same step, so they stop, or save a
// checkpoint, together (design.md, "Determinism contract").
#pragma once

#include <cstdint>
#include <initializer_list>

#include "comm/communicator.h"

namespace lockstep::comm {

struct StepTotals {
  double loss_sum = 0;       // over every rank
  std::int64_t samples = 0;  // over every rank
  bool stop = false;         // some rank asked to stop
  double mean_loss() const { return samples > 0 ? loss_sum / static_cast<double>(samples) : 0.0; }
};

// Collective and blocking. `loss_sum` is this rank's summed (not averaged)
// loss over its `samples`; this rank's stop request is stop_requested().
// The three travel as f32: counts are exact while the world's total stays
// below 2^24 per step, which is checked (InvalidArgument).
StepTotals agree_on_step(Communicator& comm, double loss_sum, std::int64_t samples);

// Makes these signals request a stop instead of ending the process. Under
// OpenMPI, mpirun forwards SIGUSR1 and SIGUSR2 to every rank (SIGINT and
// SIGTERM make it kill the job), so `kill -USR1 <mpirun pid>` stops a run at
// the next step; Slurm's `--signal=USR1@120` warns before a time limit.
void install_stop_handlers(std::initializer_list<int> signals);
void request_stop();  // what the handlers do; async-signal-safe
bool stop_requested();
void clear_stop_request();

}  // namespace lockstep::comm
