// Optimizer: the base of SGD and AdamW (engine/optim/sgd.h, adamw.h), which
// update every trainable parameter in one pass over the ParameterStore's flat
// buffers. Parameter groups (their own lr and weight decay) interleave in the
// flat layout, so a segment table built once maps runs of the buffers to
// groups. State (momentum, Adam moments) lives in flat buffers of the same
// layout, or packed for this rank's shard under ZeRO-1 (shard()), and is read
// and written by parameter name, for checkpoints.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "comm/communicator.h"
#include "comm/shards.h"
#include "engine/parameter_store.h"
#include "kernels/optimizer.h"

namespace lockstep::engine {

struct ParamGroup {
  std::vector<Parameter*> params;
  double lr = 1e-3;
  double weight_decay = 0.0;
};

// The usual two groups: [0] the weights (ParamRole::weight) with weight_decay,
// [1] biases and normalisation parameters without. Either may be empty; both
// are kept so that group indices mean the same for every model.
std::vector<ParamGroup> decay_groups(const ParameterStore& store, double lr, double weight_decay);
// One group with weight decay on every parameter, as torch.optim does by default.
std::vector<ParamGroup> single_group(const ParameterStore& store, double lr, double weight_decay);

// One parameter's share of one state buffer; a checkpoint stores it as
// /optimizer/<parameter>/<state>.
struct OptimizerStateTensor {
  std::string parameter;  // Parameter::name
  std::string state;      // PyTorch's names: momentum_buffer, exp_avg, exp_avg_sq
  core::Tensor value;     // a view into the flat state buffer, shaped like the parameter
};

struct OptimizerScalar {
  std::string name;
  std::int64_t value;
};

class Optimizer {
 public:
  virtual ~Optimizer() = default;
  Optimizer(const Optimizer&) = delete;
  Optimizer& operator=(const Optimizer&) = delete;

  // Updates every parameter from store.grads() and then bumps the parameter
  // versions (autocast weight copies are keyed on them). On CUDA, unsharded,
  // the same pass writes the autocast weight copies the modules asked for
  // (Note [fused weight copy]).
  void step(const core::Stream& stream = {});
  // The type of the weight copies the last step wrote in its pass, if it
  // wrote any (Note [fused weight copy]): for run headers and traces.
  std::optional<DType> fused_weight_copy() const;
  // Optimizer steps taken. Every group steps together, so one count serves
  // them all: the t of AdamW's bias corrections, SGD's first momentum step.
  std::int64_t steps() const { return steps_; }

  const std::string& type_name() const { return type_name_; }  // "SGD", "AdamW"
  std::size_t group_count() const { return groups_.size(); }
  double lr(std::size_t group) const { return group_at(group).lr; }
  void set_lr(std::size_t group, double lr);
  // The lr the group was built with, which schedulers scale (torch's initial_lr).
  double initial_lr(std::size_t group) const { return group_at(group).initial_lr; }
  double weight_decay(std::size_t group) const { return group_at(group).weight_decay; }

  // ZeRO-1 (Note [sharded state]): from now on update only this rank's shard
  // of `layout` (the GradientSynchronizer's) and keep state for it alone,
  // packed; the state so far is kept. `comm` (on the store's device) gathers
  // the state for state_tensors() and must outlive the optimizer. Once only.
  // ZeRO-2: `packed_grads` (defined) is this rank's shard of the gradients,
  // packed like the state (GradientSynchronizer::shard_gradients), which the
  // update reads instead of store.grads().
  void shard(comm::Communicator& comm, const comm::ShardLayout& layout,
             const core::Stream& stream = {}, core::Tensor packed_grads = {});
  bool sharded() const { return shard_comm_ != nullptr; }
  // Bytes of optimizer state this rank holds (every state buffer together).
  std::int64_t state_bytes() const;

  // Every (parameter, state) pair, in store order; writing through a view
  // writes the state. Sharded: views of a gathered copy (writing through them
  // changes nothing), and a collective that every rank must call.
  std::vector<OptimizerStateTensor> state_tensors(const core::Stream& stream = {}) const;
  // The (parameter, state) names of state_tensors(), in the same order; local.
  std::vector<std::pair<std::string, std::string>> state_names() const;
  // Copies `value` (the parameter's shape, f32, any device) into that state
  // (sharded: the part of it in this rank's shard).
  void set_state_tensor(const std::string& parameter, const std::string& state,
                        const core::Tensor& value, const core::Stream& stream = {});
  // {"step", steps()}: with the state tensors, all a resumed run needs.
  std::vector<OptimizerScalar> scalar_state() const;
  void set_scalar_state(const std::string& name, std::int64_t value);

 protected:
  // Checks the groups (each stored parameter in exactly one) and builds the
  // segment table, on the store's device too.
  Optimizer(std::string type_name, ParameterStore& store, std::vector<ParamGroup> groups,
            const core::Stream& stream);
  // A zero-filled flat state buffer, listed by state_tensors() under `name`.
  void add_state(const std::string& name, const core::Stream& stream);
  // The index-th state buffer added, as launch() reads it (shard() replaces them).
  float* state_data(std::size_t index) { return state_[index].second.data_as<float>(); }
  // Runs the update for step t = steps() + 1.
  virtual void launch(const core::Stream& stream) = 0;

  ParameterStore& store() { return store_; }
  // What launch() reads the gradients from: store().grads(), or ZeRO-2's packed shard.
  const float* gradient_data();
  const std::vector<kernels::OptimizerSegment>& segments() const { return segments_; }
  // The same table in GPU memory; null on the CPU.
  const kernels::OptimizerSegment* device_segments() const;
  // Where launch() writes the weights' low-precision copy in its CUDA pass;
  // no data when none is written (Note [fused weight copy]).
  kernels::WeightCopy weight_copy() const { return weight_copy_; }

 private:
  struct Group {
    double lr, initial_lr, weight_decay;
  };
  const Group& group_at(std::size_t group) const;
  // Checks the table and keeps it, and a copy on a GPU store's device.
  void set_segments(std::vector<kernels::OptimizerSegment> segments, const core::Stream& stream);
  const ParameterStore::Slot& slot_named(const std::string& parameter) const;
  // Note [fused weight copy]: before launch(), the copy's buffer when the
  // modules ask for one; after it, each asking parameter's view of it.
  void prepare_weight_copy(const core::Stream& stream);
  void publish_weight_copy();

  std::string type_name_;  // "SGD", "AdamW": for messages
  ParameterStore& store_;
  std::vector<Group> groups_;
  std::vector<kernels::OptimizerSegment> segments_;
  core::Tensor device_segments_;  // u8 bytes of segments_ on a GPU store
  std::vector<std::pair<std::string, core::Tensor>> state_;
  std::int64_t steps_ = 0;
  comm::Communicator* shard_comm_ = nullptr;  // set by shard()
  comm::ShardLayout shard_layout_;
  core::Tensor packed_grads_;   // ZeRO-2: set by shard()
  core::Tensor weight_copies_;  // indexed like store().values(), in weight_copy_.type
  kernels::WeightCopy weight_copy_;
};

}  // namespace lockstep::engine
