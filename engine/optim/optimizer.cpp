// Optimizer base (engine/optim/optimizer.h): groups, the segment table, named
// state and the step bookkeeping shared by SGD and AdamW.
#include "engine/optim/optimizer.h"

#include <algorithm>
#include <cmath>

namespace lockstep::engine {
namespace {

void check_hyper_parameter(const std::string& who, const char* what, double value) {
  if (!(value >= 0.0) || !std::isfinite(value))
    throw InvalidArgument(who + ": " + what + " " + std::to_string(value) +
                          " is invalid (use a finite value >= 0)");
}

// Note [padding stays zero]: segments cover parameters only, so the zeros
// between them in the flat buffers stay zero and whole-buffer reductions (grad
// norm, inf/NaN check) stay exact. Updating them would not even be harmless:
// AdamW with eps = 0 turns a zero into 0/0.
std::vector<kernels::OptimizerSegment> build_segments(const ParameterStore& store,
                                                      const std::vector<std::int32_t>& group_of) {
  // Runs of one group; parameters touch (no padding) when a size is a multiple of 64.
  std::vector<kernels::OptimizerSegment> runs;
  for (std::size_t i = 0; i < group_of.size(); ++i) {
    const ParameterStore::Slot& s = store.slots()[i];
    if (!runs.empty() && runs.back().group == group_of[i] &&
        runs.back().offset + runs.back().length == s.offset)
      runs.back().length += s.numel;
    else
      runs.push_back({s.offset, s.numel, group_of[i]});
  }
  std::vector<kernels::OptimizerSegment> segments;
  for (const kernels::OptimizerSegment& run : runs)
    for (std::int64_t start = 0; start < run.length; start += kernels::kMaxSegmentLength)
      segments.push_back({run.offset + start,
                          std::min(kernels::kMaxSegmentLength, run.length - start), run.group});
  return segments;
}

}  // namespace

std::vector<ParamGroup> decay_groups(const ParameterStore& store, double lr, double weight_decay) {
  std::vector<ParamGroup> groups{{{}, lr, weight_decay}, {{}, lr, 0.0}};
  for (const ParameterStore::Slot& s : store.slots())
    groups[s.parameter->role == ParamRole::weight ? 0 : 1].params.push_back(s.parameter);
  return groups;
}

std::vector<ParamGroup> single_group(const ParameterStore& store, double lr, double weight_decay) {
  ParamGroup group{{}, lr, weight_decay};
  for (const ParameterStore::Slot& s : store.slots()) group.params.push_back(s.parameter);
  return {group};
}

Optimizer::Optimizer(std::string type_name, ParameterStore& store, std::vector<ParamGroup> groups,
                     const core::Stream& stream)
    : type_name_(std::move(type_name)), store_(store) {
  if (groups.empty() || groups.size() > static_cast<std::size_t>(kernels::kMaxOptimizerGroups))
    throw InvalidArgument(type_name_ + ": " + std::to_string(groups.size()) +
                          " parameter groups (use 1 to " +
                          std::to_string(kernels::kMaxOptimizerGroups) + ")");
  // The group of each slot, in store order; -1 until a group claims it.
  std::vector<std::int32_t> group_of(store.slots().size(), -1);
  for (std::size_t g = 0; g < groups.size(); ++g) {
    check_hyper_parameter(type_name_, "lr", groups[g].lr);
    check_hyper_parameter(type_name_, "weight_decay", groups[g].weight_decay);
    groups_.push_back({groups[g].lr, groups[g].lr, groups[g].weight_decay});
    for (Parameter* p : groups[g].params) {
      std::int32_t& slot_group = group_of[store.index_of(*p)];
      if (slot_group >= 0)
        throw InvalidArgument(type_name_ + ": parameter '" + p->name + "' is in groups " +
                              std::to_string(slot_group) + " and " + std::to_string(g) +
                              " (give each parameter one group)");
      slot_group = static_cast<std::int32_t>(g);
    }
  }
  for (std::size_t i = 0; i < group_of.size(); ++i)
    if (group_of[i] < 0)
      throw InvalidArgument(type_name_ + ": parameter '" + store.slots()[i].parameter->name +
                            "' is trainable but in no group (add it to one, or freeze it "
                            "before building the ParameterStore)");
  segments_ = build_segments(store, group_of);
  kernels::validate_segments(segments_.data(), static_cast<std::int64_t>(segments_.size()),
                             static_cast<int>(groups_.size()), type_name_.c_str());
  if (store.device().is_cuda() && !segments_.empty())
    device_segments_ = core::Tensor::from_host(
        segments_.data(),
        {static_cast<std::int64_t>(segments_.size() * sizeof(kernels::OptimizerSegment))},
        DType::u8, store.device(), stream);
}

const kernels::OptimizerSegment* Optimizer::device_segments() const {
  if (!device_segments_.defined()) return nullptr;
  return static_cast<const kernels::OptimizerSegment*>(device_segments_.data());
}

void Optimizer::step(const core::Stream& stream) {
  launch(stream);
  ++steps_;
  store_.bump_versions();
}

const Optimizer::Group& Optimizer::group_at(std::size_t group) const {
  if (group >= groups_.size())
    throw InvalidArgument(type_name_ + ": no parameter group " + std::to_string(group) +
                          " (it has " + std::to_string(groups_.size()) + ")");
  return groups_[group];
}

void Optimizer::set_lr(std::size_t group, double lr) {
  group_at(group);
  check_hyper_parameter(type_name_, "lr", lr);
  groups_[group].lr = lr;
}

core::Tensor Optimizer::add_state(const std::string& name, const core::Stream& stream) {
  state_.emplace_back(name, store_.make_state_buffer(stream));
  return state_.back().second;
}

std::vector<OptimizerStateTensor> Optimizer::state_tensors() const {
  std::vector<OptimizerStateTensor> out;
  for (const ParameterStore::Slot& s : store_.slots())
    for (const auto& [name, buffer] : state_)
      out.push_back({s.parameter->name, name, buffer.view(s.offset, s.parameter->value.shape())});
  return out;
}

const ParameterStore::Slot& Optimizer::slot_named(const std::string& parameter) const {
  for (const ParameterStore::Slot& s : store_.slots())
    if (s.parameter->name == parameter) return s;
  throw InvalidArgument(type_name_ + ": no trainable parameter named '" + parameter +
                        "' (check the checkpoint was written for this model)");
}

void Optimizer::set_state_tensor(const std::string& parameter, const std::string& state,
                                 const core::Tensor& value, const core::Stream& stream) {
  const ParameterStore::Slot& s = slot_named(parameter);
  auto it = std::find_if(state_.begin(), state_.end(),
                         [&](const auto& entry) { return entry.first == state; });
  if (it == state_.end())
    throw InvalidArgument(type_name_ + " has no state '" + state + "' (for parameter '" +
                          parameter + "')");
  const core::Shape& shape = s.parameter->value.shape();
  if (value.shape() != shape || value.dtype() != DType::f32)
    throw InvalidArgument(type_name_ + " state '" + parameter + "/" + state + "': got " +
                          core::shape_str(value.shape()) + " " + dtype_name(value.dtype()) +
                          ", expected " + core::shape_str(shape) + " f32");
  it->second.view(s.offset, shape).copy_from(value, stream);
}

std::vector<OptimizerScalar> Optimizer::scalar_state() const { return {{"step", steps_}}; }

void Optimizer::set_scalar_state(const std::string& name, std::int64_t value) {
  if (name != "step")
    throw InvalidArgument(type_name_ + " has no scalar state '" + name + "' (it has 'step')");
  if (value < 0)
    throw InvalidArgument(type_name_ + ": step " + std::to_string(value) + " is negative");
  steps_ = value;
}

}  // namespace lockstep::engine
