// OnnxGraph: the graph an ONNX export is building, and the interface through
// which a module maps itself to standard ONNX operators. The built-in modules'
// mappings (onnx_mappings.cpp) and a user's own (register_onnx_mapping) use
// the same calls. This header needs no protobuf: the ONNX schema stays inside
// engine/export/, so engine/nn and a user's code never depend on it.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <variant>
#include <vector>

#include "engine/nn/module.h"

namespace lockstep::engine {

// A dimension known only at run time (the batch, a sequence length).
inline constexpr std::int64_t kOnnxDynamicDim = -1;

// A tensor in the graph: its name, element type and shape (kOnnxDynamicDim
// where it is not fixed). Mappings use the shape to check their input and to
// choose operators (Gemm for [batch, in], MatMul for [..., in]).
struct OnnxValue {
  std::string name;
  DType dtype = DType::f32;
  std::vector<std::int64_t> shape;
};

using OnnxAttribute =
    std::variant<std::int64_t, float, std::string, std::vector<std::int64_t>, std::vector<float>>;
using OnnxAttributes = std::map<std::string, OnnxAttribute>;

class OnnxGraph;
// Maps one module (its subtree) onto the graph: adds nodes that compute the
// module's eval-mode forward of `input` and returns the output value.
using OnnxMapping = std::function<OnnxValue(Module& module, const OnnxValue& input, OnnxGraph&)>;

// Registers the mapping for every module whose type_name() is `type_name`,
// replacing an earlier one (a user's module, or a different mapping of a
// built-in). Thread-safe; the built-ins are registered before the first use.
void register_onnx_mapping(const std::string& type_name, OnnxMapping mapping);
// Whether a mapping for `type_name` exists (built-in or registered).
bool has_onnx_mapping(const std::string& type_name);

class OnnxGraph {
 public:
  struct Impl;
  explicit OnnxGraph(Impl& impl) : impl_(impl) {}

  // Exports `module` through its type's mapping; throws InvalidArgument
  // naming the module (Module::describe()) when there is none.
  OnnxValue module(Module& module, const OnnxValue& input);

  // Adds a node computing `op_type` (default domain) of `inputs` ("" for an
  // optional input left out) and returns its `outputs` fresh output names.
  // Names are prefixed with the path of the module being exported.
  std::vector<std::string> node(const std::string& op_type, const std::vector<std::string>& inputs,
                                const OnnxAttributes& attributes = {}, int outputs = 1);
  // The same with one output, of the given type and shape.
  OnnxValue op(const std::string& op_type, const std::vector<std::string>& inputs, DType dtype,
               std::vector<std::int64_t> shape, const OnnxAttributes& attributes = {});

  // The initializer holding `p` (named p.name, in the export's float type),
  // added the first time: a weight shared by two modules (a tied head) is
  // stored once.
  std::string parameter(const Parameter& p);
  // The same for a buffer (BatchNorm's running statistics).
  std::string buffer(const Buffer& b);
  // Constants, named after the module being exported.
  std::string constant_i64(const std::vector<std::int64_t>& values,
                           const std::vector<std::int64_t>& shape);
  // In the export's float type.
  std::string constant_float(const std::vector<float>& values,
                             const std::vector<std::int64_t>& shape);
  std::string constant_bool(const std::vector<bool>& values,
                            const std::vector<std::int64_t>& shape);

  // The float type activations and weights have in this export (f32 or f16).
  DType float_type() const;
  int opset() const;

  // Throws InvalidArgument naming `module`, with `problem` and a fix.
  [[noreturn]] void refuse(const Module& module, const std::string& problem) const;

 private:
  Impl& impl_;
};

}  // namespace lockstep::engine
