// ParameterStore (engine/parameter_store.h).
#include "engine/parameter_store.h"

#include <fmt/core.h>

#include "engine/core/memory.h"
#include "engine/core/ops.h"

namespace lockstep::engine {

ParameterStore::ParameterStore(Module& model, core::Device device, const core::Stream& stream,
                               Gradients gradients)
    : device_(device) {
  model.assign_names();
  std::int64_t offset = 0;
  for (Parameter* p : model.ready_order()) {
    slots_.push_back({p, offset, p->value.numel()});
    index_[p] = slots_.size() - 1;
    offset += (p->value.numel() + kAlignElements - 1) / kAlignElements * kAlignElements;
  }
  // Note [lazy zero_grad]: zero_grad fills everything but the lazy
  // parameters' own elements, in as few runs as the layout allows.
  std::int64_t eager_from = 0;
  for (const Slot& s : slots_) {
    if (!s.parameter->lazy_zero_grad) continue;
    if (s.offset > eager_from) eager_ranges_.emplace_back(eager_from, s.offset - eager_from);
    eager_from = s.offset + s.numel;
  }
  if (offset > eager_from) eager_ranges_.emplace_back(eager_from, offset - eager_from);
  {
    core::MemoryKindScope kind(core::MemoryKind::parameters);  // Note [memory kinds]
    values_ = core::Tensor::zeros({offset}, DType::f32, device, stream);
  }
  if (gradients == Gradients::flat) {
    core::MemoryKindScope kind(core::MemoryKind::gradients);
    grads_ = core::Tensor::zeros({offset}, DType::f32, device, stream);
  }
  for (const Slot& s : slots_) {
    Parameter& p = *s.parameter;
    core::Tensor view = values_.view(s.offset, p.value.shape());
    view.copy_from(p.value, stream);
    p.value = view;
    p.grad = grads_.defined() ? grads_.view(s.offset, view.shape()) : core::Tensor();
    ++p.version;
  }
  for (Parameter* p : model.parameters()) {
    if (p->requires_grad) continue;
    if (!(p->value.device() == device)) p->value = p->value.to(device, stream);
    p->grad = core::Tensor();
    ++p->version;
  }
  for (Buffer* b : model.buffers())
    if (!(b->value.device() == device)) b->value = b->value.to(device, stream);
}

std::size_t ParameterStore::index_of(const Parameter& p) const {
  auto it = index_.find(&p);
  if (it == index_.end())
    throw InvalidArgument("parameter '" + p.name +
                          "' is not in this ParameterStore (frozen, or from another model)");
  return it->second;
}

ParameterStore::~ParameterStore() {
  for (const Slot& s : slots_) s.parameter->make_grad = nullptr;
}

void ParameterStore::zero_grad(const core::Stream& stream) {
  zero_stream_ = stream;
  if (!flat_gradients()) {  // Note [transient gradients]: made by their first writer
    for (std::size_t g = 0; g < groups_.size(); ++g) release(g);
    return;
  }
  for (const auto& [offset, count] : eager_ranges_) grads_.view(offset, {count}).fill_(0.0, stream);
  for (const Slot& s : slots_) s.parameter->grad_stale = s.parameter->lazy_zero_grad;
  zero_stream_ = stream;
}

core::Tensor& ParameterStore::grads() {
  if (!flat_gradients())
    throw InvalidArgument(
        "ParameterStore::grads(): under ZeRO-2 there is no flat gradient buffer, only each "
        "rank's shard (GradientSynchronizer::shard_gradients; Note [transient gradients])");
  for (const Slot& s : slots_) grad_to_add(*s.parameter, zero_stream_);
  return grads_;
}

core::Tensor ParameterStore::make_state_buffer(const core::Stream& stream) const {
  core::MemoryKindScope kind(core::MemoryKind::optimizer_state);  // Note [memory kinds]
  return core::Tensor::zeros({values_.numel()}, DType::f32, device_, stream);
}

void ParameterStore::bump_versions() {
  for (const Slot& s : slots_) ++s.parameter->version;
}

void ParameterStore::use_gradient_groups(std::vector<comm::FlatRange> groups) {
  if (gradient_groups_used())
    throw InvalidArgument("ParameterStore::use_gradient_groups was called already");
  std::size_t slot = 0;
  std::int64_t end = 0;
  for (const comm::FlatRange& range : groups) {
    if (range.offset != end || range.numel <= 0)
      throw InvalidArgument(fmt::format(
          "ParameterStore::use_gradient_groups: group [{}, {}) does not follow the previous one, "
          "which ends at {} (groups tile the flat buffer in order)",
          range.offset, range.offset + range.numel, end));
    end = range.offset + range.numel;
    Group group{range, {}, slot, slot};
    while (slot < slots_.size() && slots_[slot].offset < end) {
      if (slots_[slot].offset + slots_[slot].numel > end)
        throw InvalidArgument(fmt::format(
            "ParameterStore::use_gradient_groups: group [{}, {}) cuts parameter '{}' at [{}, {}) "
            "(a group holds whole parameters)",
            range.offset, end, slots_[slot].parameter->name, slots_[slot].offset,
            slots_[slot].offset + slots_[slot].numel));
      ++slot;
    }
    group.end_slot = slot;
    groups_.push_back(std::move(group));
  }
  if (end < size())
    throw InvalidArgument(
        fmt::format("ParameterStore::use_gradient_groups: the groups end at {}, the buffer at {}",
                    end, size()));
  for (std::size_t g = 0; g < groups_.size(); ++g)
    for (std::size_t i = groups_[g].first_slot; i < groups_[g].end_slot; ++i)
      slots_[i].parameter->make_grad = [this, g] { group(g); };
  grads_ = core::Tensor();
  for (std::size_t g = 0; g < groups_.size(); ++g) release(g);
}

// Note [transient gradients]: zero-filled but for the lazy parameters,
// which are marked stale (Note [lazy zero_grad]); padding stays zero.
core::Tensor ParameterStore::group(std::size_t g) {
  Group& group = groups_.at(g);
  if (group.gradients.defined()) return group.gradients;
  {
    core::MemoryKindScope kind(core::MemoryKind::gradients);  // Note [memory kinds]
    group.gradients = core::Tensor::empty({group.range.numel}, DType::f32, device_, zero_stream_);
  }
  std::int64_t eager_from = 0;  // within the group
  for (std::size_t i = group.first_slot; i < group.end_slot; ++i) {
    const Slot& s = slots_[i];
    Parameter& p = *s.parameter;
    p.grad = group.gradients.view(s.offset - group.range.offset, p.value.shape());
    p.grad_stale = p.lazy_zero_grad;
    if (!p.lazy_zero_grad) continue;
    const std::int64_t at = s.offset - group.range.offset;
    if (at > eager_from)
      group.gradients.view(eager_from, {at - eager_from}).fill_(0.0, zero_stream_);
    eager_from = at + s.numel;
  }
  if (group.range.numel > eager_from)
    group.gradients.view(eager_from, {group.range.numel - eager_from}).fill_(0.0, zero_stream_);
  return group.gradients;
}

void ParameterStore::release(std::size_t g) {
  Group& group = groups_.at(g);
  for (std::size_t i = group.first_slot; i < group.end_slot; ++i) {
    slots_[i].parameter->grad = core::Tensor();
    slots_[i].parameter->grad_stale = false;
  }
  group.gradients = core::Tensor();
}

}  // namespace lockstep::engine
