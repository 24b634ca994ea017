// ParameterStore (engine/parameter_store.h).
#include "engine/parameter_store.h"

#include <fmt/core.h>

#include <algorithm>

#include "engine/core/memory.h"
#include "engine/core/ops.h"

namespace lockstep::engine {
namespace {

std::int64_t round_up(std::int64_t value, std::int64_t multiple) {
  return (value + multiple - 1) / multiple * multiple;
}

// Note [parameter units]: the unit of each parameter of `order` (-1: none);
// a unit's parameters must be one run of the ready order.
std::vector<int> units_of(const std::vector<Parameter*>& order,
                          const ParameterStore::Units& units) {
  if (!units.modules.empty() && units.ranks < 1)
    throw InvalidArgument("ParameterStore: Units::ranks is " + std::to_string(units.ranks) +
                          "; give the world size the units are laid out for");
  std::unordered_map<const Parameter*, int> unit_of_parameter;
  for (std::size_t u = 0; u < units.modules.size(); ++u)
    for (Parameter* p : units.modules[u]->parameters()) {
      const auto [it, fresh] = unit_of_parameter.emplace(p, static_cast<int>(u));
      if (!fresh)
        throw InvalidArgument(fmt::format(
            "ParameterStore: parameter '{}' is in unit {} ({}) and unit {} ({}); units must not "
            "nest or overlap",
            p->name, it->second, units.modules[it->second]->describe(), u,
            units.modules[u]->describe()));
    }
  std::vector<int> unit_of(order.size(), -1);
  std::vector<char> ended(units.modules.size(), 0);
  for (std::size_t i = 0; i < order.size(); ++i) {
    const auto it = unit_of_parameter.find(order[i]);
    unit_of[i] = it == unit_of_parameter.end() ? -1 : it->second;
    if (i > 0 && unit_of[i - 1] >= 0 && unit_of[i] != unit_of[i - 1]) ended[unit_of[i - 1]] = 1;
    if (unit_of[i] >= 0 && ended[unit_of[i]])
      throw InvalidArgument(fmt::format(
          "ParameterStore: the parameters of unit {} ({}) are not one run in ready order "
          "(parameter '{}' comes after another unit's); make the unit a module whose parameters "
          "all report ready together, such as a Sequential's child",
          unit_of[i], units.modules[unit_of[i]]->describe(), order[i]->name));
  }
  return unit_of;
}

}  // namespace

ParameterStore::ParameterStore(Module& model, core::Device device, const core::Stream& stream,
                               Gradients gradients, Units units)
    : device_(device), units_(std::move(units)) {
  model.assign_names();
  // Note [parameter units]: each piece starts at a multiple of U.
  const std::vector<Parameter*> order = model.ready_order();
  const std::vector<int> unit_of = units_of(order, units_);
  const std::int64_t piece_align = kAlignElements * std::max(units_.ranks, 1);
  std::int64_t offset = 0;
  for (std::size_t i = 0; i < order.size(); ++i) {
    Parameter* p = order[i];
    if (!units_.modules.empty() && (i == 0 || unit_of[i] != unit_of[i - 1])) {
      offset = round_up(offset, piece_align);
      if (!pieces_.empty()) pieces_.back().range.numel = offset - pieces_.back().range.offset;
      pieces_.push_back({{offset, 0}, unit_of[i], i, i});
    }
    slots_.push_back({p, offset, p->value.numel(), p->value.shape()});
    index_[p] = slots_.size() - 1;
    offset += round_up(p->value.numel(), kAlignElements);
    if (!pieces_.empty()) pieces_.back().end_slot = i + 1;
  }
  if (!pieces_.empty())
    pieces_.back().range.numel = round_up(offset, piece_align) - pieces_.back().range.offset;
  numel_ = offset;
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
    values_ = core::Tensor::zeros({numel_}, DType::f32, device, stream);
  }
  if (gradients == Gradients::flat) {
    core::MemoryKindScope kind(core::MemoryKind::gradients);
    grads_ = core::Tensor::zeros({numel_}, DType::f32, device, stream);
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
  return core::Tensor::zeros({numel_}, DType::f32, device_, stream);
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
    p.grad = group.gradients.view(s.offset - group.range.offset, s.shape);
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

// Note [parameter units]: the packed shard is the optimizer's parameter
// buffer from now on; nothing else holds the values between gathers.
void ParameterStore::shard_values(const comm::ShardLayout& layout, const core::Stream& stream) {
  if (values_sharded_) throw InvalidArgument("ParameterStore::shard_values was called already");
  if (layout.buffer_numel != numel_)
    throw InvalidArgument(fmt::format(
        "ParameterStore::shard_values: the shard layout is of {} elements, the store of {}",
        layout.buffer_numel, numel_));
  core::Tensor shard;
  {
    core::MemoryKindScope kind(core::MemoryKind::parameters);  // Note [memory kinds]
    shard = core::Tensor::zeros({layout.shard_numel()}, DType::f32, device_, stream);
  }
  std::int64_t at = 0;
  for (std::size_t b = 0; b < layout.buckets.size(); ++b) {
    const comm::FlatRange mine = layout.chunk(b, layout.rank);
    if (mine.numel > 0)
      shard.view(at, {mine.numel}).copy_from(values_.view(mine.offset, {mine.numel}), stream);
    at += layout.chunk_numel(b);
  }
  values_ = shard;
  values_sharded_ = true;
  for (const Slot& s : slots_) s.parameter->value = core::Tensor();
}

void ParameterStore::set_values(std::size_t piece, const core::Tensor& gathered) {
  const Piece& p = pieces_.at(piece);
  if (gathered.numel() != p.range.numel)
    throw InvalidArgument(fmt::format(
        "ParameterStore::set_values: piece {} spans {} elements, the gathered buffer {}", piece,
        p.range.numel, gathered.numel()));
  for (std::size_t i = p.first_slot; i < p.end_slot; ++i)
    slots_[i].parameter->value = gathered.view(slots_[i].offset - p.range.offset, slots_[i].shape);
}

void ParameterStore::set_all_values(const core::Tensor& full) {
  if (full.numel() < numel_)
    throw InvalidArgument(
        fmt::format("ParameterStore::set_all_values: the buffer has {} elements, the layout {}",
                    full.numel(), numel_));
  for (const Slot& s : slots_) s.parameter->value = full.view(s.offset, s.shape);
}

void ParameterStore::drop_values(std::size_t piece) {
  const Piece& p = pieces_.at(piece);
  for (std::size_t i = p.first_slot; i < p.end_slot; ++i)
    slots_[i].parameter->value = core::Tensor();
}

}  // namespace lockstep::engine
