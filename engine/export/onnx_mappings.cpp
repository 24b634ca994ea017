// The ONNX mappings of engine/nn's built-in modules: each turns a module's
// eval-mode forward into standard operators (docs/deploy.md lists them).
// They use only OnnxGraph's public calls, as a user's mapping would.
#include <cmath>
#include <limits>
#include <numbers>

#include "engine/export/detail/onnx_impl.h"
#include "engine/nn/activation.h"
#include "engine/nn/attention.h"
#include "engine/nn/batchnorm.h"
#include "engine/nn/channels_last.h"
#include "engine/nn/checkpointed.h"
#include "engine/nn/containers.h"
#include "engine/nn/conv.h"
#include "engine/nn/embedding.h"
#include "engine/nn/gpt.h"
#include "engine/nn/linear.h"
#include "engine/nn/norm.h"
#include "engine/nn/pooling.h"

namespace lockstep::engine {
namespace {

using Dims = std::vector<std::int64_t>;

std::string dims_str(const Dims& d) {
  std::string s = "[";
  for (std::size_t i = 0; i < d.size(); ++i)
    s += (i ? ", " : "") + (d[i] == kOnnxDynamicDim ? std::string("?") : std::to_string(d[i]));
  return s + "]";
}

void require_float(const Module& m, const OnnxValue& x, OnnxGraph& g) {
  if (x.dtype != g.float_type())
    g.refuse(m, "input is " + std::string(dtype_name(x.dtype)) + ", the layer expects floats");
}

// A known size must equal `want`; a dynamic one is taken on trust.
void require_dim(const Module& m, const OnnxValue& x, std::size_t axis, std::int64_t want,
                 const std::string& what, OnnxGraph& g) {
  if (x.shape.size() <= axis || (x.shape[axis] != kOnnxDynamicDim && x.shape[axis] != want))
    g.refuse(m, "input " + dims_str(x.shape) + " has no " + what + " of " + std::to_string(want) +
                    " (check the previous layer's output or the input shape)");
}

OnnxValue sequential(Module& m, const OnnxValue& x, OnnxGraph& g) {
  OnnxValue v = x;
  for (Module* child : m.children()) v = g.module(*child, v);
  return v;
}

// Checkpointing changes how backward runs, not what forward computes.
OnnxValue checkpointed(Module& m, const OnnxValue& x, OnnxGraph& g) {
  return g.module(static_cast<Checkpointed&>(m).inner(), x);
}

// Channels-last changes the layout the layers run on, not what the model
// computes on its NCHW input (Note [channels-last layers]): the graph is NCHW.
OnnxValue channels_last(Module& m, const OnnxValue& x, OnnxGraph& g) {
  return g.module(static_cast<ChannelsLast&>(m).inner(), x);
}

OnnxValue residual(Module& m, const OnnxValue& x, OnnxGraph& g) {
  auto& r = static_cast<Residual&>(m);
  const OnnxValue a = g.module(r.inner(), x);
  const OnnxValue b = r.shortcut() ? g.module(*r.shortcut(), x) : x;
  if (a.shape != b.shape)
    g.refuse(m, "inner branch gives " + dims_str(a.shape) + " but the shortcut gives " +
                    dims_str(b.shape));
  OnnxValue y = g.op("Add", {a.name, b.name}, a.dtype, a.shape);
  return r.relu_after_add() ? g.op("Relu", {y.name}, y.dtype, y.shape) : y;
}

// Note [linear layout]: the initializer keeps Linear's [out, in] layout (and
// its parameter name). [batch, in] inputs use Gemm with transB; inputs of
// other ranks multiply by a Transpose of the weight, which ONNX Runtime and
// TensorRT fold into a constant when they build the model.
OnnxValue linear_product(Module& m, const OnnxValue& x, OnnxGraph& g) {
  auto& l = static_cast<Linear&>(m);
  require_float(m, x, g);
  require_dim(m, x, x.shape.size() - 1, l.in_features(), "last dimension", g);
  Dims shape = x.shape;
  shape.back() = l.out_features();
  const std::string w = g.parameter(l.weight());
  if (x.shape.size() == 2) {
    std::vector<std::string> in = {x.name, w};
    if (l.bias()) in.push_back(g.parameter(*l.bias()));
    return g.op("Gemm", in, x.dtype, shape, {{"transB", std::int64_t{1}}});
  }
  const std::string wt = g.node("Transpose", {w}, {{"perm", Dims{1, 0}}}).front();
  OnnxValue y = g.op("MatMul", {x.name, wt}, x.dtype, shape);
  return l.bias() ? g.op("Add", {y.name, g.parameter(*l.bias())}, y.dtype, shape) : y;
}

OnnxValue activation_of(Module& m, kernels::Activation kind, const OnnxValue& x, OnnxGraph& g);

// A Linear with a fused activation (Note [fused activation] in
// engine/nn/linear.h) is its product's nodes, then the activation's.
OnnxValue linear(Module& m, const OnnxValue& x, OnnxGraph& g) {
  const OnnxValue y = linear_product(m, x, g);
  const auto fused = static_cast<Linear&>(m).activation();
  return fused ? activation_of(m, *fused, y, g) : y;
}

OnnxValue conv2d(Module& m, const OnnxValue& x, OnnxGraph& g) {
  auto& c = static_cast<Conv2d&>(m);
  kernels::Conv2dShape s = c.config();
  require_float(m, x, g);
  if (x.shape.size() != 4) g.refuse(m, "input " + dims_str(x.shape) + " is not [N, C, H, W]");
  require_dim(m, x, 1, s.in_channels, "channel count", g);
  if (x.shape[2] == kOnnxDynamicDim || x.shape[3] == kOnnxDynamicDim)
    g.refuse(m, "input " + dims_str(x.shape) + " needs a fixed height and width");
  s.in_h = x.shape[2];
  s.in_w = x.shape[3];
  std::vector<std::string> in = {x.name, g.parameter(c.weight())};
  if (c.bias()) in.push_back(g.parameter(*c.bias()));
  return g.op("Conv", in, x.dtype, {x.shape[0], s.out_channels, s.out_h(), s.out_w()},
              {{"kernel_shape", Dims{s.kernel_h, s.kernel_w}},
               {"strides", Dims{s.stride_h, s.stride_w}},
               {"pads", Dims{s.pad_h, s.pad_w, s.pad_h, s.pad_w}},
               {"dilations", Dims{s.dilation_h, s.dilation_w}},
               {"group", s.groups}});
}

OnnxValue pool2d(Module& m, const OnnxValue& x, OnnxGraph& g, const std::string& op,
                 kernels::Pool2dShape s, OnnxAttributes attributes) {
  require_float(m, x, g);
  if (x.shape.size() != 4 || x.shape[2] == kOnnxDynamicDim || x.shape[3] == kOnnxDynamicDim)
    g.refuse(m, "input " + dims_str(x.shape) + " is not [N, C, H, W] with a fixed H and W");
  s.in_h = x.shape[2];
  s.in_w = x.shape[3];
  attributes["kernel_shape"] = Dims{s.kernel_h, s.kernel_w};
  attributes["strides"] = Dims{s.stride_h, s.stride_w};
  attributes["pads"] = Dims{s.pad_h, s.pad_w, s.pad_h, s.pad_w};
  return g.op(op, {x.name}, x.dtype, {x.shape[0], x.shape[1], s.out_h(), s.out_w()}, attributes);
}

OnnxValue max_pool2d(Module& m, const OnnxValue& x, OnnxGraph& g) {
  return pool2d(m, x, g, "MaxPool", static_cast<MaxPool2d&>(m).config(), {});
}

OnnxValue avg_pool2d(Module& m, const OnnxValue& x, OnnxGraph& g) {
  auto& p = static_cast<AvgPool2d&>(m);
  return pool2d(m, x, g, "AveragePool", p.config(),
                {{"count_include_pad", std::int64_t{p.count_include_pad() ? 1 : 0}}});
}

OnnxValue global_avg_pool2d(Module& m, const OnnxValue& x, OnnxGraph& g) {
  require_float(m, x, g);
  if (x.shape.size() != 4) g.refuse(m, "input " + dims_str(x.shape) + " is not [N, C, H, W]");
  return g.op("GlobalAveragePool", {x.name}, x.dtype, {x.shape[0], x.shape[1], 1, 1});
}

// The affine parameter, or a constant `fill` when the layer has none.
std::string affine_or(OnnxGraph& g, Parameter* p, std::int64_t features, float fill) {
  if (p) return g.parameter(*p);
  return g.constant_float(std::vector<float>(static_cast<std::size_t>(features), fill), {features});
}

OnnxValue batch_norm2d(Module& m, const OnnxValue& x, OnnxGraph& g) {
  auto& bn = static_cast<BatchNorm2d&>(m);
  require_float(m, x, g);
  if (x.shape.size() != 4) g.refuse(m, "input " + dims_str(x.shape) + " is not [N, C, H, W]");
  require_dim(m, x, 1, bn.num_features(), "channel count", g);
  if (!bn.running_mean())
    g.refuse(m,
             "has no running statistics (track_running_stats=false normalises by each batch's "
             "statistics in eval mode, which BatchNormalization cannot express)");
  const std::int64_t c = bn.num_features();
  const OnnxValue y =
      g.op("BatchNormalization",
           {x.name, affine_or(g, bn.weight(), c, 1.0f), affine_or(g, bn.bias(), c, 0.0f),
            g.buffer(*bn.running_mean()), g.buffer(*bn.running_var())},
           x.dtype, x.shape, {{"epsilon", static_cast<float>(bn.eps())}});
  // A BatchNorm2d with its ReLU (the resnet presets' bn1) is the two nodes.
  if (bn.activation() == BatchNormActivation::relu) return g.op("Relu", {y.name}, y.dtype, y.shape);
  return y;
}

OnnxValue layer_norm(Module& m, const OnnxValue& x, OnnxGraph& g) {
  auto& ln = static_cast<LayerNorm&>(m);
  require_float(m, x, g);
  require_dim(m, x, x.shape.size() - 1, ln.features(), "last dimension", g);
  const std::int64_t c = ln.features();
  return g.op("LayerNormalization",
              {x.name, affine_or(g, ln.weight(), c, 1.0f), affine_or(g, ln.bias(), c, 0.0f)},
              x.dtype, x.shape, {{"axis", std::int64_t{-1}}, {"epsilon", ln.eps()}});
}

// Note [gelu from primitives]: GELU is built from Mul, Add, Tanh (or Erf) at
// every opset: the Gelu operator exists only from opset 20. ONNX Runtime's
// graph optimizer fuses both patterns back into one kernel (Gelu, FastGelu).
OnnxValue activation_of(Module& m, kernels::Activation kind, const OnnxValue& x, OnnxGraph& g) {
  require_float(m, x, g);
  if (kind == kernels::Activation::relu) return g.op("Relu", {x.name}, x.dtype, x.shape);
  auto mul = [&](const std::string& a, const std::string& b) {
    return g.node("Mul", {a, b}).front();
  };
  auto add = [&](const std::string& a, const std::string& b) {
    return g.node("Add", {a, b}).front();
  };
  auto scalar = [&](double v) { return g.constant_float({static_cast<float>(v)}, {}); };
  std::string inner;
  if (kind == kernels::Activation::gelu_tanh) {
    // 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
    const std::string cube = mul(mul(x.name, x.name), x.name);
    const std::string u =
        mul(add(x.name, mul(cube, scalar(0.044715))), scalar(std::sqrt(2 / std::numbers::pi)));
    inner = g.node("Tanh", {u}).front();
  } else {
    // 0.5 x (1 + erf(x / sqrt 2))
    inner = g.node("Erf", {mul(x.name, scalar(1 / std::sqrt(2.0)))}).front();
  }
  const std::string half_x = mul(x.name, scalar(0.5));
  return g.op("Mul", {half_x, add(inner, scalar(1.0))}, x.dtype, x.shape);
}

OnnxValue activation(Module& m, const OnnxValue& x, OnnxGraph& g) {
  return activation_of(m, static_cast<Activation&>(m).kind(), x, g);
}

OnnxValue dropout(Module& /*m*/, const OnnxValue& x, OnnxGraph& /*g*/) {
  return x;  // eval mode: the identity
}

OnnxValue flatten(Module& m, const OnnxValue& x, OnnxGraph& g) {
  if (x.shape.empty()) g.refuse(m, "input has no batch dimension");
  std::int64_t rest = 1;
  for (std::size_t i = 1; i < x.shape.size(); ++i) {
    if (x.shape[i] == kOnnxDynamicDim)
      g.refuse(m, "input " + dims_str(x.shape) + " has a dynamic dimension after the batch");
    rest *= x.shape[i];
  }
  return g.op("Flatten", {x.name}, x.dtype, {x.shape[0], rest}, {{"axis", std::int64_t{1}}});
}

OnnxValue embedding(Module& m, const OnnxValue& x, OnnxGraph& g) {
  auto& e = static_cast<Embedding&>(m);
  if (x.dtype != DType::i64 && x.dtype != DType::i32)
    g.refuse(m, "indices are " + std::string(dtype_name(x.dtype)) + ", expected i64 or i32");
  Dims shape = x.shape;
  shape.push_back(e.dim());
  return g.op("Gather", {g.parameter(e.weight()), x.name}, g.float_type(), shape,
              {{"axis", std::int64_t{0}}});
}

// Axis `axis` of `x`'s run-time shape, as an i64 scalar.
std::string runtime_dim(OnnxGraph& g, const OnnxValue& x, std::int64_t axis) {
  const std::string shape = g.node("Shape", {x.name}).front();
  return g.node("Gather", {shape, g.constant_i64({axis}, {})}, {{"axis", std::int64_t{0}}}).front();
}

// Note [causal mask in onnx]: the mask is built from the run-time sequence
// length T (Range, then key position <= query position), so one graph
// serves every T up to the block size; masked scores become the float
// type's lowest finite value rather than -inf, so that no inf enters an f16
// engine, and softmax sends them to exactly 0 as lockstep's kernel does.
OnnxValue causal_self_attention(Module& m, const OnnxValue& x, OnnxGraph& g) {
  auto& a = static_cast<CausalSelfAttention&>(m);
  require_float(m, x, g);
  if (x.shape.size() != 3) g.refuse(m, "input " + dims_str(x.shape) + " is not [batch, seq, C]");
  require_dim(m, x, 2, a.embed_dim(), "embedding size", g);
  const std::int64_t c = a.embed_dim(), h = a.num_heads(), d = c / h;
  const OnnxValue qkv = g.module(a.c_attn(), x);  // [B, T, 3C]
  const std::string split =
      g.node("Reshape", {qkv.name, g.constant_i64({0, 0, 3, h, d}, {5})}).front();
  const std::string heads = g.node("Transpose", {split}, {{"perm", Dims{2, 0, 3, 1, 4}}}).front();
  auto part = [&](std::int64_t i) {  // [B, H, T, D]
    return g.node("Gather", {heads, g.constant_i64({i}, {})}, {{"axis", std::int64_t{0}}}).front();
  };
  const std::string q = part(0), k = part(1), v = part(2);
  const std::string kt = g.node("Transpose", {k}, {{"perm", Dims{0, 1, 3, 2}}}).front();
  const std::string scores =
      g.node("Mul", {g.node("MatMul", {q, kt}).front(),
                     g.constant_float({1.0f / std::sqrt(static_cast<float>(d))}, {})})
          .front();
  const std::string t = runtime_dim(g, x, 1);
  const std::string positions =
      g.node("Range", {g.constant_i64({0}, {}), t, g.constant_i64({1}, {})}).front();
  const std::string query = g.node("Unsqueeze", {positions, g.constant_i64({1}, {1})}).front();
  const std::string key = g.node("Unsqueeze", {positions, g.constant_i64({0}, {1})}).front();
  const std::string allowed = g.node("LessOrEqual", {key, query}).front();  // [T, T]
  const float lowest =
      g.float_type() == DType::f16 ? -65504.0f : std::numeric_limits<float>::lowest();
  const std::string masked =
      g.node("Where", {allowed, scores, g.constant_float({lowest}, {})}).front();
  const std::string probs = g.node("Softmax", {masked}, {{"axis", std::int64_t{-1}}}).front();
  const std::string y_heads = g.node("MatMul", {probs, v}).front();  // [B, H, T, D]
  const std::string y_rows = g.node("Transpose", {y_heads}, {{"perm", Dims{0, 2, 1, 3}}}).front();
  const OnnxValue y{g.node("Reshape", {y_rows, g.constant_i64({0, 0, c}, {3})}).front(), x.dtype,
                    x.shape};
  return g.module(a.c_proj(), y);
}

// GPT: token and position embeddings, the blocks, ln_f and the head tied to
// the token embedding (one initializer, transformer.wte.weight).
OnnxValue gpt(Module& m, const OnnxValue& tokens, OnnxGraph& g) {
  auto& model = static_cast<GPT&>(m);
  if (tokens.shape.size() != 2)
    g.refuse(m, "input " + dims_str(tokens.shape) + " is not [batch, seq]");
  const std::int64_t seq = tokens.shape[1], block = model.config().block_size;
  if (seq != kOnnxDynamicDim && (seq < 1 || seq > block))
    g.refuse(m, "sequence length " + std::to_string(seq) + " is outside 1.." +
                    std::to_string(block) + " (the block size)");
  const OnnxValue tok = g.module(model.wte(), tokens);  // [B, T, C]
  const std::string positions =
      g.node("Range", {g.constant_i64({0}, {}), runtime_dim(g, tokens, 1), g.constant_i64({1}, {})})
          .front();
  const OnnxValue pos = g.module(model.wpe(), {positions, DType::i64, {seq}});  // [T, C]
  OnnxValue x = g.op("Add", {tok.name, pos.name}, tok.dtype, tok.shape);
  x = g.module(model.ln_f(), g.module(model.blocks(), x));
  return g.module(model.lm_head(), x);
}

}  // namespace

std::map<std::string, OnnxMapping> builtin_onnx_mappings() {
  return {
      {"Sequential", sequential},
      {"Residual", residual},
      {"Checkpointed", checkpointed},
      {"ChannelsLast", channels_last},
      {"Linear", linear},
      {"Conv2d", conv2d},
      {"MaxPool2d", max_pool2d},
      {"AvgPool2d", avg_pool2d},
      {"GlobalAvgPool2d", global_avg_pool2d},
      {"BatchNorm2d", batch_norm2d},
      {"LayerNorm", layer_norm},
      {"ReLU", activation},
      {"GELU", activation},
      {"GELU(tanh)", activation},
      {"Dropout", dropout},
      {"Flatten", flatten},
      {"Embedding", embedding},
      {"CausalSelfAttention", causal_self_attention},
      {"GPT", gpt},
  };
}

}  // namespace lockstep::engine
