// Optimizer base (engine/optim/optimizer.h): groups, the segment table, named
// state and the step bookkeeping shared by SGD and AdamW.
#include "engine/optim/optimizer.h"

#include <fmt/core.h>

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
      runs.push_back({s.offset, s.numel, group_of[i], s.offset});
  }
  std::vector<kernels::OptimizerSegment> segments;
  for (const kernels::OptimizerSegment& run : runs)
    for (std::int64_t start = 0; start < run.length; start += kernels::kMaxSegmentLength)
      segments.push_back({run.offset + start,
                          std::min(kernels::kMaxSegmentLength, run.length - start), run.group,
                          run.offset + start});
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
  set_segments(build_segments(store, group_of), stream);
}

void Optimizer::set_segments(std::vector<kernels::OptimizerSegment> segments,
                             const core::Stream& stream) {
  segments_ = std::move(segments);
  kernels::validate_segments(segments_.data(), static_cast<std::int64_t>(segments_.size()),
                             static_cast<int>(groups_.size()), type_name_.c_str());
  device_segments_ = core::Tensor();
  if (store_.device().is_cuda() && !segments_.empty())
    device_segments_ = core::Tensor::from_host(
        segments_.data(),
        {static_cast<std::int64_t>(segments_.size() * sizeof(kernels::OptimizerSegment))},
        DType::u8, store_.device(), stream);
}

const kernels::OptimizerSegment* Optimizer::device_segments() const {
  if (!device_segments_.defined()) return nullptr;
  return static_cast<const kernels::OptimizerSegment*>(device_segments_.data());
}

void Optimizer::step(const core::Stream& stream) {
  prepare_weight_copy(stream);
  launch(stream);
  ++steps_;
  store_.bump_versions();
  publish_weight_copy();
}

// Note [fused weight copy]: taken on CUDA when the optimizer is not sharded
// and every parameter whose module asked for a copy asked for the same type
// (bf16 or f16); the step then writes the whole buffer's copy. Otherwise the
// modules cast as before (AutocastWeight): on the CPU, which keeps its order
// and bits; under ZeRO-1 to 3, where a rank updates only its shard and the
// gather moves the f32 values; and where the asked types differ.
void Optimizer::prepare_weight_copy(const core::Stream& stream) {
  weight_copy_ = {};
  if (!store_.device().is_cuda() || sharded()) return;
  std::optional<DType> type;
  for (const ParameterStore::Slot& s : store_.slots()) {
    const std::optional<DType>& wanted = s.parameter->low_copy_wanted;
    if (!wanted) continue;
    if ((*wanted != DType::bf16 && *wanted != DType::f16) || (type && *type != *wanted)) return;
    type = wanted;
  }
  if (!type) {
    weight_copies_ = core::Tensor();
    return;
  }
  if (!weight_copies_.defined() || weight_copies_.dtype() != *type) {
    core::MemoryKindScope kind(core::MemoryKind::parameters);  // Note [memory kinds]
    weight_copies_ = core::Tensor::empty({store_.size()}, *type, store_.device(), stream);
  }
  weight_copy_ = {weight_copies_.data(), *type};
}

void Optimizer::publish_weight_copy() {
  if (weight_copy_.data == nullptr) return;
  for (const ParameterStore::Slot& s : store_.slots()) {
    Parameter& p = *s.parameter;
    if (p.low_copy_wanted != weight_copy_.type) continue;
    p.low_copy = weight_copies_.view(s.offset, s.shape);
    p.low_copy_version = p.version;
  }
}

std::optional<DType> Optimizer::fused_weight_copy() const {
  if (weight_copy_.data == nullptr) return std::nullopt;
  return weight_copy_.type;
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

void Optimizer::add_state(const std::string& name, const core::Stream& stream) {
  state_.emplace_back(name, store_.make_state_buffer(stream));
}

std::vector<OptimizerStateTensor> Optimizer::state_tensors(const core::Stream& stream) const {
  std::vector<std::pair<std::string, core::Tensor>> full = state_;
  if (sharded())
    for (auto& [name, buffer] : full) {
      core::Tensor gathered =
          core::Tensor::empty({shard_layout_.padded_numel()}, DType::f32, store_.device(), stream);
      comm::gather_shards(*shard_comm_, shard_layout_, buffer, gathered, stream);
      buffer = gathered;
    }
  std::vector<OptimizerStateTensor> out;
  for (const ParameterStore::Slot& s : store_.slots())
    for (const auto& [name, buffer] : full)
      out.push_back({s.parameter->name, name, buffer.view(s.offset, s.shape)});
  return out;
}

std::vector<std::pair<std::string, std::string>> Optimizer::state_names() const {
  std::vector<std::pair<std::string, std::string>> out;
  for (const ParameterStore::Slot& s : store_.slots())
    for (const auto& entry : state_) out.emplace_back(s.parameter->name, entry.first);
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
  const core::Shape& shape = s.shape;
  if (value.shape() != shape || value.dtype() != DType::f32)
    throw InvalidArgument(type_name_ + " state '" + parameter + "/" + state + "': got " +
                          core::shape_str(value.shape()) + " " + dtype_name(value.dtype()) +
                          ", expected " + core::shape_str(shape) + " f32");
  if (!sharded()) {
    it->second.view(s.offset, shape).copy_from(value, stream);
    return;
  }
  const core::Tensor flat = value.reshape({value.numel()});
  std::int64_t position = 0;  // of the chunk in the packed state
  for (std::size_t b = 0; b < shard_layout_.buckets.size(); ++b) {
    const comm::FlatRange mine = shard_layout_.chunk(b, shard_layout_.rank);
    const std::int64_t start = std::max(mine.offset, s.offset);
    const std::int64_t end = std::min(mine.offset + mine.numel, s.offset + s.numel);
    if (start < end)
      it->second.view(position + start - mine.offset, {end - start})
          .copy_from(flat.view(start - s.offset, {end - start}), stream);
    position += shard_layout_.chunk_numel(b);
  }
}

// Note [sharded state]: with ZeRO-1 a rank updates the parameter elements of
// its chunks (comm::ShardLayout::owned) and keeps their state packed, chunk
// after chunk in bucket order: shard_numel() elements per state buffer, the
// unsharded size / ranks rounded up to 64 elements. A segment of the table
// is a group run cut to one chunk; its state_offset is the packed position.
// Under ZeRO-2 the gradients are packed the same way (the synchroniser's
// shard), so a segment's grad_shift takes them from its packed position too.
// Under ZeRO-3 the store's values are the packed shard as well
// (ParameterStore::shard_values, Note [parameter units]): a segment's offset
// is its packed position and its grad_shift 0.
void Optimizer::shard(comm::Communicator& comm, const comm::ShardLayout& layout,
                      const core::Stream& stream, core::Tensor packed_grads) {
  if (sharded()) throw InvalidArgument(type_name_ + ": shard() was called already");
  if (layout.buffer_numel != store_.size() || layout.ranks != comm.size() ||
      layout.rank != comm.rank())
    throw InvalidArgument(
        fmt::format("{}: the shard layout (rank {} of {}, {} elements) does not fit the store ({} "
                    "elements) and communicator '{}' (rank {} of {})",
                    type_name_, layout.rank, layout.ranks, layout.buffer_numel, store_.size(),
                    comm.label(), comm.rank(), comm.size()));
  if (store_.values_sharded() && !packed_grads.defined())
    throw InvalidArgument(type_name_ +
                          ": the store's values are sharded (ZeRO-3), so the gradients must be "
                          "the packed shard too (pass shard_gradients())");
  if (packed_grads.defined() &&
      (packed_grads.numel() != layout.shard_numel() || packed_grads.dtype() != DType::f32))
    throw InvalidArgument(fmt::format(
        "{}: ZeRO-2's packed gradients are {} {} elements, the shard layout's shard {} f32",
        type_name_, packed_grads.numel(), dtype_name(packed_grads.dtype()), layout.shard_numel()));
  std::vector<kernels::OptimizerSegment> packed;
  std::int64_t position = 0;
  for (std::size_t b = 0; b < layout.buckets.size(); ++b) {
    const comm::FlatRange mine = layout.chunk(b, layout.rank);
    for (const kernels::OptimizerSegment& segment : segments_) {
      const std::int64_t start = std::max(mine.offset, segment.offset);
      const std::int64_t end = std::min(mine.offset + mine.numel, segment.offset + segment.length);
      if (start >= end) continue;
      const std::int64_t at = position + start - mine.offset;  // packed position
      if (store_.values_sharded())  // ZeRO-3: parameters, gradients and state all packed
        packed.push_back({at, end - start, segment.group, at, 0});
      else
        packed.push_back({start, end - start, segment.group, at,
                          packed_grads.defined() ? position - mine.offset : 0});
    }
    position += layout.chunk_numel(b);
  }
  core::MemoryKindScope kind(core::MemoryKind::optimizer_state);  // Note [memory kinds]
  for (auto& [name, buffer] : state_) {
    core::Tensor shard =
        core::Tensor::zeros({layout.shard_numel()}, DType::f32, store_.device(), stream);
    std::int64_t at = 0;
    for (std::size_t b = 0; b < layout.buckets.size(); ++b) {
      const comm::FlatRange mine = layout.chunk(b, layout.rank);
      if (mine.numel > 0)
        shard.view(at, {mine.numel}).copy_from(buffer.view(mine.offset, {mine.numel}), stream);
      at += layout.chunk_numel(b);
    }
    buffer = shard;
  }
  set_segments(std::move(packed), stream);
  // Note [fused weight copy]: a sharded step writes no copies; the modules cast again.
  for (const ParameterStore::Slot& s : store_.slots()) s.parameter->low_copy = core::Tensor();
  weight_copies_ = core::Tensor();
  weight_copy_ = {};
  shard_comm_ = &comm;
  shard_layout_ = layout;
  packed_grads_ = std::move(packed_grads);
}

const float* Optimizer::gradient_data() {
  return packed_grads_.defined() ? packed_grads_.data_as<float>() : store_.grads().data_as<float>();
}

std::int64_t Optimizer::state_bytes() const {
  std::int64_t bytes = 0;
  for (const auto& entry : state_) bytes += static_cast<std::int64_t>(entry.second.nbytes());
  return bytes;
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
