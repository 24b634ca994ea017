// StepReadback: every value a data-parallel step reads from the device, held
// in one device buffer and read with one copy (Note [one read per step]): the
// loss and row totals, the f16 loss scaler's inf/NaN flag, the gradients'
// sums of squares per range, the rank-invariant mode's chunk losses, and the
// embedding lookups' bad-index report (IndexChecks, Note [deferred index
// check]).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "engine/core/stream.h"
#include "engine/core/tensor.h"
#include "kernels/embedding.h"

namespace lockstep::engine {

// Note [deferred index check]: an Embedding lookup on a GPU cannot throw from
// its kernel, and waiting for the stream after each lookup to read its check
// cost a host synchronisation per lookup (two per GPT micro-batch). Inside a
// DataParallelStep the lookup instead registers here (Context::index_checks)
// and its kernel records a bad index into the step's readback word (Note
// [index report word], kernels/embedding.h), tagged with its place in the
// step's lookups; the one read the step makes anyway brings the word home, and
// DataParallelStep::update throws the lookup's error, naming the module, the
// index, its position and the vocabulary, before anything is applied: every
// rank skips the update (this rank's loss goes to the agreement as NaN) and
// this rank throws. Until then the bad positions read no table row (zeros
// flow on) and add nothing to the gradient. A lookup outside a step (no
// Context::index_checks) still checks at once (Note [embedding index check]).
class IndexChecks {
 public:
  explicit IndexChecks(core::Tensor word) : word_(std::move(word)) {}
  // Registers a lookup of `indices` by `module` (Module::describe()) into a
  // table of `vocab` rows, and returns what its kernel records with; a null
  // word when the tags are used up (the caller then checks at once).
  kernels::IndexReport add(std::string module, core::Tensor indices, std::int64_t vocab);
  // Forgets the lookups (the word itself is zeroed by StepReadback::clear).
  void clear() { lookups_.clear(); }
  // Throws InvalidArgument for the bad index that `word` (read back) records,
  // naming its lookup; reads the index from the device (a wait, on this error
  // path only). Returns when the word records none.
  void check(std::uint64_t word, const core::Stream& stream) const;

 private:
  struct Lookup {
    std::string module;
    core::Tensor indices;
    std::int64_t vocab;
  };
  core::Tensor word_;  // u64[1] in the readback's buffer
  std::vector<Lookup> lookups_;
};

// The error an Embedding lookup throws for an index outside [0, vocab); the
// CPU check, the synchronous CUDA check and IndexChecks give the same words.
std::string embedding_index_error(const std::string& module, std::int64_t index,
                                  std::int64_t position, std::int64_t vocab);

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
  // The embedding lookups' report: Note [deferred index check].
  IndexChecks& index_checks() { return index_checks_; }
  // Scratch for the reductions' per-block partials; never read back.
  core::Tensor workspace() const { return workspace_; }

  struct Values {
    double loss_total = 0.0;
    std::int64_t rows_total = 0;
    bool nonfinite = false;
    std::vector<double> sum_squares;
    std::vector<float> chunk_losses;
    std::uint64_t bad_index = 0;  // Note [index report word]: 0 when every index was in range
  };
  // One copy of every slot to the host: waits for `stream` on a GPU.
  const Values& read(const core::Stream& stream);

 private:
  core::Tensor buffer_;  // the slots, then the workspace
  std::size_t read_bytes_ = 0;
  std::size_t index_word_at_ = 0;
  core::Tensor loss_total_, rows_total_, nonfinite_, sum_squares_, chunk_losses_, workspace_;
  IndexChecks index_checks_{core::Tensor()};
  std::vector<std::byte> host_;
  Values values_;
};

}  // namespace lockstep::engine
