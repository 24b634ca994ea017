// ParameterStore: every trainable parameter of a model in one flat f32 value
// buffer and one flat f32 gradient buffer, laid out in ready order (Note
// [grad-ready order] in engine/nn/module.h), each parameter at a 256-byte
// aligned offset. Each Parameter's value and grad become views into them.
// Consequences, all intended: a gradient bucket is a contiguous slice (no copy
// for an f32 allreduce); zero_grad skips the bulk (Note [lazy zero_grad]); optimizer state gets
// flat buffers of the same layout, updated by a few launches driven by slots().
// Under ZeRO-2 the gradients live in transient groups instead (Note
// [transient gradients], comm/gradient_synchronizer.h); under ZeRO-3 the
// values too: the store keeps this rank's packed shard of them, and a unit's
// values exist only while the step has it gathered (Note [parameter units],
// engine/zero3.h).
#pragma once

#include <cstdint>
#include <unordered_map>
#include <utility>
#include <vector>

#include "comm/gradient_synchronizer.h"
#include "engine/nn/module.h"

namespace lockstep::engine {

// ZeRO-3 (Note [parameter units], engine/zero3.h): the modules whose
// parameters are gathered together, in forward order, and the world size
// the layout is for. Every unit and every run of parameters in no unit (a
// resident piece, gathered for the whole step) starts at a multiple of
// ranks x 64 elements.
struct ParameterUnits {
  std::vector<Module*> modules;
  int ranks = 1;
};

class ParameterStore final : public comm::GradientGroups {
 public:
  static constexpr std::int64_t kAlignElements = 64;  // 256 bytes of f32

  struct Slot {
    Parameter* parameter;
    std::int64_t offset;  // elements into the flat buffers
    std::int64_t numel;
    core::Shape shape;  // the parameter's, also while ZeRO-3 leaves its value undefined
  };

  using Units = ParameterUnits;
  // A unit's parameters, or a run of parameters in no unit (unit -1): slots
  // [first_slot, end_slot) in `range`, which runs to the next piece's start
  // (the last piece: to the size rounded up to ranks x 64).
  struct Piece {
    comm::FlatRange range;
    int unit = -1;
    std::size_t first_slot = 0, end_slot = 0;
  };

  // Where gradients live: one flat buffer, or (ZeRO-2) the synchroniser's
  // groups, so that the flat buffer is never made (Note [transient gradients]).
  enum class Gradients { flat, groups };

  // Names the tree (Module::assign_names), moves every parameter and buffer of
  // `model` to `device`, and re-points trainable parameters into the flat
  // buffers (values copied, gradients zeroed). Frozen parameters keep their own
  // value and no gradient. Gradients::groups: no gradient has storage until
  // use_gradient_groups (the ZeRO-2 step calls it). `units` (ZeRO-3): lays
  // the units out for the step's world size; throws InvalidArgument when a
  // unit's parameters are not one run in ready order or are in two units.
  ParameterStore(Module& model, core::Device device, const core::Stream& stream = {},
                 Gradients gradients = Gradients::flat, Units units = {});
  ParameterStore(const ParameterStore&) = delete;
  ParameterStore& operator=(const ParameterStore&) = delete;
  ~ParameterStore() override;

  core::Device device() const { return device_; }
  const std::vector<Slot>& slots() const { return slots_; }  // ready order
  // The flat values; after shard_values, this rank's packed shard of them.
  core::Tensor& values() { return values_; }
  // Zero-fills first any gradient still stale (Note [lazy zero_grad]).
  // Throws InvalidArgument under ZeRO-2, which keeps no flat gradient buffer.
  core::Tensor& grads();
  // Whether grads() has a flat buffer to give.
  bool flat_gradients() const { return grads_.defined(); }
  std::int64_t size() const { return numel_; }  // elements of the flat layout, padding included
  // Position of `p` in slots(); throws InvalidArgument for a foreign parameter.
  std::size_t index_of(const Parameter& p) const;

  // Zero-fills the gradients, but marks those of lazy_zero_grad parameters
  // stale instead: their first writer overwrites them, and one nothing
  // writes reads as zero (Note [lazy zero_grad] in engine/nn/module.h).
  // Fills happen on `stream`.
  void zero_grad(const core::Stream& stream = {});
  // A zero-filled flat buffer with this layout, for optimizer state.
  core::Tensor make_state_buffer(const core::Stream& stream = {}) const;
  // Marks every value as changed (Parameter::version), after an optimizer
  // step or a load wrote the flat value buffer.
  void bump_versions();

  // ZeRO-2 (Note [transient gradients]): drops the flat gradient buffer;
  // from now on a gradient has storage only while its group (`groups`, flat
  // ranges of whole slots in order, covering the buffer) lives: made by the
  // first accumulate_grad or grad_to_add of one of its parameters (or by
  // group()), zero-filled as zero_grad would, and dropped by release().
  // Every slot's grad is undefined in between. Once only.
  void use_gradient_groups(std::vector<comm::FlatRange> groups);
  bool gradient_groups_used() const { return !groups_.empty(); }
  core::Tensor group(std::size_t group) override;
  void release(std::size_t group) override;

  // ZeRO-3 (Note [parameter units]): the layout's units and pieces (empty
  // without Units), and the world size they are laid out for.
  const std::vector<Piece>& pieces() const { return pieces_; }
  const Units& units() const { return units_; }
  // Keeps only this rank's chunks of the values, packed chunk after chunk in
  // bucket order (values() from now on); every trainable value is undefined
  // until set_values. Once only.
  void shard_values(const comm::ShardLayout& layout, const core::Stream& stream = {});
  bool values_sharded() const { return values_sharded_; }
  // Points piece `piece`'s parameters into `gathered` (its range's values);
  // bumps nothing: the values are those the shards hold.
  void set_values(std::size_t piece, const core::Tensor& gathered);
  // Every piece's parameters into `full` (the whole flat layout's values).
  void set_all_values(const core::Tensor& full);
  // Piece `piece`'s values are no longer gathered.
  void drop_values(std::size_t piece);

 private:
  core::Device device_;
  std::vector<Slot> slots_;
  std::unordered_map<const Parameter*, std::size_t> index_;
  core::Tensor values_, grads_;
  std::int64_t numel_ = 0;
  std::vector<std::pair<std::int64_t, std::int64_t>>
      eager_ranges_;          // (offset, count) zero_grad fills
  core::Stream zero_stream_;  // where zero_grad's deferred fills go
  // Note [transient gradients]: each group's range, buffer (undefined while
  // released) and slots [first, end).
  struct Group {
    comm::FlatRange range;
    core::Tensor gradients;
    std::size_t first_slot = 0, end_slot = 0;
  };
  std::vector<Group> groups_;
  Units units_;
  std::vector<Piece> pieces_;
  bool values_sharded_ = false;
};

}  // namespace lockstep::engine
