// Module: a layer or a container of layers with an explicit backward, in the
// style of Torch7's nn. forward(x) keeps what backward needs (in training
// mode only); backward(dy) accumulates parameter gradients and returns dx.
// Parameters and buffers have dotted names from the tree (fc1.weight) and
// PyTorch's layouts, so weights move to and from PyTorch by name.
//
// Note [grad-ready order]: after a child's backward, its container reports the
// child's own parameters as ready through Context::on_grad_ready. The order is
// static and known before the first step (ready_order()): a leaf reports its
// parameters in registration order, Sequential reports its children last to
// first, Residual its inner branch and then its shortcut. ParameterStore lays
// the flat buffers out in this order, so gradient buckets are contiguous.
//
// Note [several inputs and outputs]: forward_named takes the micro-batch's
// tensors by name ("inputs", "targets" and any others the batch carries) and
// returns the model's outputs by name; backward_named takes the gradient of
// each output it returned (an output no loss term read gets none) and
// returns the gradients of the inputs. The defaults run the one-tensor
// forward on "inputs" and name the result "output", so every module and
// container works unchanged; the data-parallel step calls these for every
// model. A model that overrides them reports each child's parameters ready
// (report_ready) right after that child's backward, in its ready order
// (append_ready_order: by default children last to first), as the containers do.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "engine/core/named_tensors.h"
#include "engine/core/random.h"
#include "engine/core/stream.h"
#include "engine/core/tensor.h"

namespace lockstep::engine {

// What a parameter is, for optimizer groups (no weight decay on biases and
// normalisation parameters is the usual choice).
enum class ParamRole { weight, bias, norm };

struct Parameter {
  std::string name;    // dotted path from the root, once names are assigned
  core::Tensor value;  // f32
  core::Tensor grad;   // f32, same shape; undefined while frozen
  ParamRole role = ParamRole::weight;
  bool requires_grad = true;
  // Bumped whenever `value` changes (optimizer step, load): modules key
  // caches derived from the value (the autocast low-precision copy) on it.
  std::uint64_t version = 0;
  // Note [fused weight copy] (kernels/optimizer.h): a low-precision copy of
  // `value` that the optimizer's CUDA step wrote beside it, current while
  // low_copy_version == version; AutocastWeight reads it instead of casting.
  // low_copy_wanted is the type a module last asked AutocastWeight for (the
  // optimizer's cue to write one); mutable since AutocastWeight sees the
  // weight const.
  core::Tensor low_copy;
  std::uint64_t low_copy_version = 0;
  mutable std::optional<DType> low_copy_wanted;
  // Note [lazy zero_grad]: set by the owning module when every writer of
  // this gradient honours grad_stale; then `grad_stale` says that `grad`
  // holds stale values that count as zero.
  bool lazy_zero_grad = false;
  bool grad_stale = false;
  // Note [transient gradients] (engine/parameter_store.h): set under ZeRO-2,
  // where `grad` is undefined until a writer needs it; accumulate_grad and
  // grad_to_add call it to give `grad` its storage.
  std::function<void()> make_grad;
};

// Note [lazy zero_grad]: ParameterStore::zero_grad fills most gradients with
// zeros but not the weights of Linear and Conv2d (the bulk of the bytes),
// whose owners set Parameter::lazy_zero_grad: it marks those stale, and
// their first backward writer overwrites them (a weight-gradient GEMM with
// beta 0) instead of adding to zeros; later writers and micro-batches add.
// Every writer of such a gradient must go through accumulate_grad (a writer
// that can overwrite) or grad_to_add (one that can only add, such as the
// embedding that shares its weight with a tied Linear head). A gradient no
// writer reached is zero-filled before anyone reads it: when its module
// reports it ready (Module::report_ready) and in ParameterStore::grads().
// Modules written elsewhere own parameters without the flag: their gradients
// are zero-filled as before, so they may add to them directly (except under
// ZeRO-2, Note [transient gradients]: there a writer calls grad_to_add first).
//
// For a writer that can overwrite: false when `p`'s gradient is stale (write
// it, do not add to it), and marks it written.
bool accumulate_grad(Parameter& p);
// For a writer that can only add: `p`'s gradient, zero-filled first when stale.
float* grad_to_add(Parameter& p, const core::Stream& stream);

struct Buffer {
  std::string name;
  core::Tensor value;
};

class Module;
class IndexChecks;  // engine/step_readback.h

// Where a container is in a child's pass, for Context::on_module.
enum class ModulePhase { before_forward, after_forward, before_backward, after_backward };

// What one forward/backward call needs besides its input.
struct Context {
  core::Stream stream;
  // f16 or bf16: Linear and Conv2d compute in that type (f32 accumulation).
  std::optional<DType> autocast;
  // Dropout masks are Philox at (seed, stream from (step, layer), global sample
  // index): the same for a sample whatever the number of ranks.
  std::uint64_t seed = 0;
  std::uint64_t step = 0;
  std::int64_t first_sample = 0;  // global index of this micro-batch's row 0
  // Called once per trainable parameter when its gradient is complete
  // (Note [grad-ready order]); may be empty.
  std::function<void(Parameter&)> on_grad_ready;
  // Called by Sequential just before and after each child's forward and
  // backward (after_backward: once its parameters are reported ready); the
  // ZeRO-3 step gathers and drops a unit's parameters there (Note [parameter
  // units], engine/zero3.h). May be empty.
  std::function<void(Module&, ModulePhase)> on_module;
  // Note [activation checkpointing] (engine/nn/checkpointed.h): false in a
  // Checkpointed module's first forward, which keeps nothing for backward
  // (Module::keeps_for_backward); `recompute` is true in its second, which
  // must not move state a second time (BatchNorm's running statistics).
  bool keep_for_backward = true;
  bool recompute = false;
  // The passes are being captured into a CUDA graph and will be replayed
  // with these arguments (Note [step graph], engine/step_graph.h): `step` is
  // frozen, so a module that draws from it (Dropout) refuses.
  bool graph_capture = false;
  // Note [deferred index check] (engine/step_readback.h): set by the
  // data-parallel step, whose readback carries the Embedding lookups' index
  // checks home; null elsewhere, where a lookup checks at once.
  IndexChecks* index_checks = nullptr;
};

class Module {
 public:
  explicit Module(std::string type_name) : type_name_(std::move(type_name)) {}
  virtual ~Module() = default;
  Module(const Module&) = delete;
  Module& operator=(const Module&) = delete;

  // One input, one output: every layer and container overrides these. A
  // model of several inputs or outputs overrides forward_named and
  // backward_named instead; calling these on it throws InvalidArgument.
  virtual core::Tensor forward(const core::Tensor& x, Context& ctx);
  virtual core::Tensor backward(const core::Tensor& dy, Context& ctx);
  // Several inputs and outputs (Note [several inputs and outputs]): by
  // default {"output": forward(inputs["inputs"])} and {"inputs":
  // backward(grads["output"])} (an undefined dx when none is needed).
  virtual core::NamedTensors forward_named(const core::NamedTensors& inputs, Context& ctx);
  virtual core::NamedTensors backward_named(const core::NamedTensors& output_grads, Context& ctx);
  // PyTorch's default initialisation of this module's own parameters.
  virtual void reset_parameters(core::Generator& /*rng*/) {}
  // True when reset_parameters initialises this whole subtree (a model with
  // its own scheme, such as GPT-2's): initialize() then skips the children.
  virtual bool initializes_subtree() const { return false; }

  const std::string& type_name() const { return type_name_; }
  // Dotted path from the root ("layer1.0.conv1"); "" for the root.
  const std::string& path() const { return path_; }
  // "Linear 'fc2'": how error messages name a layer.
  std::string describe() const;

  void train(bool on = true);
  void eval() { train(false); }
  bool training() const { return training_; }
  // Whether a forward keeps what backward needs: in training, except in a
  // checkpoint's first pass (Note [activation checkpointing]).
  bool keeps_for_backward(const Context& ctx) const { return training_ && ctx.keep_for_backward; }

  // Whether backward must return dx. The root's input is data, which needs
  // no gradient: engine::DataParallelStep (and so the Trainer) calls
  // set_input_grad(false) on the root it trains, containers pass it to the
  // first layer, and a layer that honours it skips a GEMM or a convolution
  // (backward then returns an undefined tensor). A caller of backward that
  // wants dx of the whole model (a saliency map) sets it true afterwards.
  virtual void set_input_grad(bool on) { input_grad_ = on; }
  bool input_grad() const { return input_grad_; }

  // Input checks shared by the layers; their errors name this layer.
  // Throws InvalidArgument unless `t` (the layer's `what`: "input", "gradient")
  // has a float dtype.
  void require_float(const core::Tensor& t, const char* what) const;
  // Throws InvalidArgument unless the gradient `dy` has the shape and device
  // of the output forward returned.
  void check_gradient(const core::Tensor& dy, const core::Shape& output_shape,
                      const core::Device& output_device) const;

  // Gives every module its path and every parameter and buffer its dotted
  // name. Call on the root once the tree is built (ParameterStore does).
  void assign_names(const std::string& path = "");

  // The tree, in forward (registration) order.
  std::vector<Module*> children() const;
  std::vector<Parameter*> parameters();  // recursive
  std::vector<Buffer*> buffers();        // recursive
  std::vector<Parameter*> own_parameters();
  std::vector<Buffer*> own_buffers();
  // Trainable parameters in the order their gradients become ready.
  std::vector<Parameter*> ready_order();

  // Reports this module's own trainable parameters to ctx.on_grad_ready;
  // containers call it on each child after that child's backward.
  void report_ready(Context& ctx);
  // Appends this subtree's trainable parameters in ready order; containers
  // whose backward visits children differently override it.
  virtual void append_ready_order(std::vector<Parameter*>& out);

 protected:
  // Note [initialised when built]: a layer calls this at the end of its
  // constructor, as PyTorch's layers call reset_parameters() in __init__:
  // reset_parameters(default_generator()), unless a DeferInitialization is
  // alive on this thread (a model that initialises itself afterwards).
  void initialize_when_built();
  Parameter& add_parameter(const std::string& name, const core::Shape& shape, ParamRole role);
  Buffer& add_buffer(const std::string& name, core::Tensor value);
  // Takes ownership; a child added with an empty name is transparent in
  // dotted names (its children appear at this module's level).
  Module& add_child(const std::string& name, std::unique_ptr<Module> child);
  // Throws InvalidArgument naming this layer, the input shape and what it expects.
  [[noreturn]] void shape_error(const core::Tensor& x, const std::string& expected) const;
  // Throws InvalidArgument: backward found nothing kept by a training-mode forward.
  [[noreturn]] void no_forward_error() const;

 private:
  struct Child {
    std::string name;
    std::unique_ptr<Module> module;
  };
  std::string type_name_;
  std::string path_;
  bool training_ = true;
  bool input_grad_ = true;
  std::deque<Parameter> parameters_;  // deque: references stay valid
  std::vector<std::string> parameter_names_;
  std::deque<Buffer> buffers_;
  std::vector<std::string> buffer_names_;
  std::vector<Child> children_;
};

// Note [autocast weight copy]: Linear and Conv2d compute under autocast on a
// low-precision copy of their f32 weight. The copy is remade only when the
// weight's version (bumped by each optimizer step and load) or storage
// changes, so it is made once per optimizer step, not once per micro-batch.
// Where the optimizer wrote the copy in its own pass (Note [fused weight
// copy]: CUDA, unsharded), get() returns that one and keeps no cast of its
// own; elsewhere (the CPU, ZeRO-1 to 3, the first step, after a load) it casts.
class AutocastWeight {
 public:
  // The weight in `type`: the f32 value itself, or the cached low copy.
  const core::Tensor& get(const Parameter& weight, DType type, const core::Stream& stream);

 private:
  core::Tensor copy_;
  std::uint64_t version_ = 0;
  const void* source_ = nullptr;  // the f32 storage it was cast from
};

// Note [initialised when built]: every built-in layer draws its parameters
// when it is constructed (PyTorch's defaults: Linear and Conv2d uniform in
// +-1/sqrt(fan_in), Embedding normal, norms at one and zero), from one
// process-wide Philox generator seeded 0 at start, as torch.manual_seed's
// generator is; so a model built without engine::initialize trains from a
// proper initialisation (it once trained from zeros, silently: held-out
// error 0.130 against 0.025), and every rank builds the same values. A
// user's layer does the same: call initialize_when_built() at the end of its
// constructor (docs/custom-layers.md). initialize(root, seed) re-draws the
// whole model from Philox(seed), which is what lockstep-train and the
// examples do, so a seed still reproduces a model whatever was built before.

// Re-seeds the process-wide generator the layers draw from when built
// (torch.manual_seed); thread-safe.
void manual_seed(std::uint64_t seed);

// While one is alive on this thread, layers skip initialize_when_built():
// for a model whose constructor applies its own scheme to the whole tree
// afterwards (GPT), so that nothing is drawn twice.
class DeferInitialization {
 public:
  DeferInitialization();
  ~DeferInitialization();
  DeferInitialization(const DeferInitialization&) = delete;
  DeferInitialization& operator=(const DeferInitialization&) = delete;

 private:
  bool was_deferred_;
};

// Draws every parameter's initial value from Philox(seed), module by module in
// forward order, so that a seed reproduces a model.
void initialize(Module& root, std::uint64_t seed);

}  // namespace lockstep::engine
