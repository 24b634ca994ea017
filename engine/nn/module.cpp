// Module tree bookkeeping (engine/nn/module.h): names, traversal, ready order.
#include "engine/nn/module.h"

#include <mutex>

#include "engine/core/memory.h"
#include "kernels/error.h"

namespace lockstep::engine {
namespace {
std::string join(const std::string& path, const std::string& name) {
  if (name.empty()) return path;
  return path.empty() ? name : path + "." + name;
}
}  // namespace

std::string Module::describe() const {
  return type_name_ + " '" + (path_.empty() ? "<root>" : path_) + "'";
}

core::Tensor Module::forward(const core::Tensor&, Context&) {
  throw InvalidArgument(describe() +
                        ": takes named inputs and gives named outputs; call forward_named (as "
                        "the data-parallel step does), or put it where one tensor goes in and "
                        "one comes out");
}

core::Tensor Module::backward(const core::Tensor&, Context&) {
  throw InvalidArgument(describe() +
                        ": takes named output gradients; call backward_named (as the "
                        "data-parallel step does)");
}

core::NamedTensors Module::forward_named(const core::NamedTensors& inputs, Context& ctx) {
  return {{"output", forward(inputs.at("inputs", describe()), ctx)}};
}

core::NamedTensors Module::backward_named(const core::NamedTensors& output_grads, Context& ctx) {
  return {{"inputs", backward(output_grads.at("output", describe() + " backward"), ctx)}};
}

void Module::train(bool on) {
  training_ = on;
  for (Child& c : children_) c.module->train(on);
}

void Module::assign_names(const std::string& path) {
  path_ = path;
  for (std::size_t i = 0; i < parameters_.size(); ++i)
    parameters_[i].name = join(path, parameter_names_[i]);
  for (std::size_t i = 0; i < buffers_.size(); ++i) buffers_[i].name = join(path, buffer_names_[i]);
  for (Child& c : children_) c.module->assign_names(join(path, c.name));
}

std::vector<Module*> Module::children() const {
  std::vector<Module*> out;
  for (const Child& c : children_) out.push_back(c.module.get());
  return out;
}

std::vector<Parameter*> Module::own_parameters() {
  std::vector<Parameter*> out;
  for (Parameter& p : parameters_) out.push_back(&p);
  return out;
}

std::vector<Buffer*> Module::own_buffers() {
  std::vector<Buffer*> out;
  for (Buffer& b : buffers_) out.push_back(&b);
  return out;
}

std::vector<Parameter*> Module::parameters() {
  std::vector<Parameter*> out = own_parameters();
  for (Child& c : children_)
    for (Parameter* p : c.module->parameters()) out.push_back(p);
  return out;
}

std::vector<Buffer*> Module::buffers() {
  std::vector<Buffer*> out = own_buffers();
  for (Child& c : children_)
    for (Buffer* b : c.module->buffers()) out.push_back(b);
  return out;
}

std::vector<Parameter*> Module::ready_order() {
  std::vector<Parameter*> out;
  append_ready_order(out);
  return out;
}

void Module::append_ready_order(std::vector<Parameter*>& out) {
  for (auto it = children_.rbegin(); it != children_.rend(); ++it)
    it->module->append_ready_order(out);
  for (Parameter& p : parameters_)
    if (p.requires_grad) out.push_back(&p);
}

void Module::report_ready(Context& ctx) {
  for (Parameter& p : parameters_)
    if (p.requires_grad) grad_to_add(p, ctx.stream);  // Note [lazy zero_grad]: no stale reads
  if (!ctx.on_grad_ready) return;
  for (Parameter& p : parameters_)
    if (p.requires_grad) ctx.on_grad_ready(p);
}

bool accumulate_grad(Parameter& p) {
  if (!p.grad.defined() && p.make_grad) p.make_grad();  // Note [transient gradients]
  const bool accumulate = !p.grad_stale;
  p.grad_stale = false;
  return accumulate;
}

float* grad_to_add(Parameter& p, const core::Stream& stream) {
  if (!p.grad.defined() && p.make_grad) p.make_grad();  // Note [transient gradients]
  if (p.grad_stale) p.grad.fill_(0.0, stream);
  p.grad_stale = false;
  return p.grad.data_as<float>();
}

Parameter& Module::add_parameter(const std::string& name, const core::Shape& shape,
                                 ParamRole role) {
  Parameter& p = parameters_.emplace_back();
  parameter_names_.push_back(name);
  p.name = join(path_, name);
  p.role = role;
  {
    core::MemoryKindScope kind(core::MemoryKind::parameters);  // Note [memory kinds]
    p.value = core::Tensor::zeros(shape, DType::f32);
  }
  core::MemoryKindScope kind(core::MemoryKind::gradients);
  p.grad = core::Tensor::zeros(shape, DType::f32);
  return p;
}

Buffer& Module::add_buffer(const std::string& name, core::Tensor value) {
  Buffer& b = buffers_.emplace_back();
  buffer_names_.push_back(name);
  b.name = join(path_, name);
  b.value = std::move(value);
  return b;
}

Module& Module::add_child(const std::string& name, std::unique_ptr<Module> child) {
  if (!child) throw InvalidArgument(describe() + ": child '" + name + "' is null");
  Module& ref = *child;
  children_.push_back({name, std::move(child)});
  ref.assign_names(join(path_, name));
  ref.train(training_);
  return ref;
}

void Module::shape_error(const core::Tensor& x, const std::string& expected) const {
  throw InvalidArgument(describe() + ": input has shape " + core::shape_str(x.shape()) + ", " +
                        expected);
}

void Module::require_float(const core::Tensor& t, const char* what) const {
  if (!is_floating(t.dtype()))
    throw InvalidArgument(describe() + ": " + what + " dtype " + dtype_name(t.dtype()) +
                          " is not a float type (cast it to f32, f16 or bf16)");
}

void Module::check_gradient(const core::Tensor& dy, const core::Shape& output_shape,
                            const core::Device& output_device) const {
  if (dy.shape() != output_shape || !(dy.device() == output_device))
    throw InvalidArgument(describe() + ": gradient " + core::shape_str(dy.shape()) + " on " +
                          dy.device().str() + ", the output was " + core::shape_str(output_shape) +
                          " on " + output_device.str() +
                          " (pass the gradient of this layer's own output)");
}

void Module::no_forward_error() const {
  throw InvalidArgument(describe() +
                        ": backward without a training-mode forward (call train() before "
                        "forward, and run forward once before each backward)");
}

const core::Tensor& AutocastWeight::get(const Parameter& weight, DType type,
                                        const core::Stream& stream) {
  if (type == DType::f32) return weight.value;
  weight.low_copy_wanted = type;  // Note [fused weight copy]: the optimizer's cue
  if (weight.low_copy.defined() && weight.low_copy.dtype() == type &&
      weight.low_copy_version == weight.version) {
    copy_ = core::Tensor();
    return weight.low_copy;
  }
  if (!copy_.defined() || copy_.dtype() != type || version_ != weight.version ||
      source_ != weight.value.data()) {
    copy_ = weight.value.cast(type, stream);
    version_ = weight.version;
    source_ = weight.value.data();
  }
  return copy_;
}

namespace {

// Note [initialised when built]: the generator layers draw from when built.
struct BuildGenerator {
  std::mutex mutex;
  core::Generator generator{0};
};

BuildGenerator& build_generator() {
  static BuildGenerator g;
  return g;
}

thread_local bool t_initialization_deferred = false;

}  // namespace

void manual_seed(std::uint64_t seed) {
  BuildGenerator& g = build_generator();
  std::lock_guard lock(g.mutex);
  g.generator = core::Generator(seed);
}

DeferInitialization::DeferInitialization() : was_deferred_(t_initialization_deferred) {
  t_initialization_deferred = true;
}

DeferInitialization::~DeferInitialization() { t_initialization_deferred = was_deferred_; }

void Module::initialize_when_built() {
  if (t_initialization_deferred) return;
  BuildGenerator& g = build_generator();
  std::lock_guard lock(g.mutex);
  reset_parameters(g.generator);
}

void initialize(Module& root, std::uint64_t seed) {
  core::Generator rng(seed);
  std::function<void(Module&)> visit = [&](Module& m) {
    m.reset_parameters(rng);
    if (m.initializes_subtree()) return;
    for (Module* c : m.children()) visit(*c);
  };
  visit(root);
}

}  // namespace lockstep::engine
