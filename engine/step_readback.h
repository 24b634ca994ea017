// StepReadback: every value a data-parallel step reads from the device, held
// in one device buffer and read with one copy (Note [one read per step]): the
// loss and row totals, the f16 loss scaler's inf/NaN flag, the gradients'
// sums of squares per range, and the rank-invariant mode's chunk losses.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "engine/core/stream.h"
#include "engine/core/tensor.h"

namespace lockstep::engine {

// Note [one read per step]: on a GPU each copy to the host waits for the
// stream, draining the queue that the next step's work would otherwise
// overlap. A step used to wait two or three times (the scaler's flag, the
// norm, the loss totals) and twice more under ZeRO-1 (the shard's flag and its
// norm). The kernels that produce those values now write them into one
// buffer's slots, in stream order, and the step reads the slots with one
// copy after the last of them; then the host decides (the scaler's update,
// the clip coefficient, the skip) from the copies and launches only the
// clipping it decided. The norm is measured even when the flag will say
// inf/NaN, and ignored then: a wasted reduction on a skipped step, against a
// wait on every step. DataParallelStep::update is the only reader.
class StepReadback {
 public:
  // Slots for `ranges` sums of squares and `chunks` chunk losses, on `device`.
  StepReadback(std::int64_t ranges, std::int64_t chunks, core::Device device,
               const core::Stream& stream);

  // Zeroes every slot: at the start of each step.
  void clear(const core::Stream& stream);

  core::Tensor loss_total() const { return loss_total_; }      // f32[1], loss x rows summed
  core::Tensor rows_total() const { return rows_total_; }      // f32[1], counted rows
  core::Tensor nonfinite() const { return nonfinite_; }        // i32[1], the scaler's flag
  core::Tensor sum_squares() const { return sum_squares_; }    // f64[ranges]
  core::Tensor chunk_losses() const { return chunk_losses_; }  // f32[chunks], loss x rows
  // Scratch for the reductions' per-block partials; never read back.
  core::Tensor workspace() const { return workspace_; }

  struct Values {
    double loss_total = 0.0;
    std::int64_t rows_total = 0;
    bool nonfinite = false;
    std::vector<double> sum_squares;
    std::vector<float> chunk_losses;
  };
  // One copy of every slot to the host: waits for `stream` on a GPU.
  const Values& read(const core::Stream& stream);

 private:
  core::Tensor buffer_;  // the slots, then the workspace
  std::size_t read_bytes_ = 0;
  core::Tensor loss_total_, rows_total_, nonfinite_, sum_squares_, chunk_losses_, workspace_;
  std::vector<std::byte> host_;
  Values values_;
};

}  // namespace lockstep::engine
