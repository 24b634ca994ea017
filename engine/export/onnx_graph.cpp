// OnnxGraph (engine/export/onnx_graph.h): nodes, initializers and constants
// on the protobuf graph, and the registry of mappings keyed by type_name.
#include "engine/export/onnx_graph.h"

#include <cmath>
#include <mutex>

#include "engine/export/detail/onnx_impl.h"
#include "kernels/error.h"
#include "kernels/half.h"

namespace lockstep::engine {
namespace {

struct Registry {
  std::mutex mutex;
  std::map<std::string, OnnxMapping> mappings;
};

// The built-ins are in place before anyone reads or adds a mapping, so that a
// user's mapping of a built-in type replaces the built-in one.
Registry& registry() {
  static Registry r{{}, builtin_onnx_mappings()};
  return r;
}

void set_attribute(onnx::NodeProto& node, const std::string& name, const OnnxAttribute& value) {
  onnx::AttributeProto* a = node.add_attribute();
  a->set_name(name);
  if (const auto* i = std::get_if<std::int64_t>(&value)) {
    a->set_type(onnx::AttributeProto::INT);
    a->set_i(*i);
  } else if (const auto* f = std::get_if<float>(&value)) {
    a->set_type(onnx::AttributeProto::FLOAT);
    a->set_f(*f);
  } else if (const auto* s = std::get_if<std::string>(&value)) {
    a->set_type(onnx::AttributeProto::STRING);
    a->set_s(*s);
  } else if (const auto* is = std::get_if<std::vector<std::int64_t>>(&value)) {
    a->set_type(onnx::AttributeProto::INTS);
    for (std::int64_t v : *is) a->add_ints(v);
  } else {
    a->set_type(onnx::AttributeProto::FLOATS);
    for (float v : std::get<std::vector<float>>(value)) a->add_floats(v);
  }
}

// An initializer of `type` holding `values` (f32 values, stored as f32 or f16).
void fill_float(onnx::TensorProto& t, const std::vector<float>& values, DType type) {
  t.set_data_type(onnx_type(type));
  if (type == DType::f16) {
    std::vector<std::uint16_t> bits(values.size());
    for (std::size_t i = 0; i < values.size(); ++i) {
      bits[i] = kernels::f32_to_f16_bits(values[i]);
      if (std::isfinite(values[i]) && !std::isfinite(kernels::f16_bits_to_f32(bits[i])))
        throw InvalidArgument("ONNX export: '" + t.name() + "' element " + std::to_string(i) +
                              " is " + std::to_string(values[i]) +
                              ", beyond f16's range of 65504 (export with f32 precision)");
    }
    t.set_raw_data(bits.data(), bits.size() * sizeof(std::uint16_t));
  } else {
    t.set_raw_data(values.data(), values.size() * sizeof(float));
  }
}

}  // namespace

void register_onnx_mapping(const std::string& type_name, OnnxMapping mapping) {
  if (type_name.empty() || !mapping)
    throw InvalidArgument("register_onnx_mapping: the type name and the mapping must be given");
  Registry& r = registry();
  std::lock_guard lock(r.mutex);
  r.mappings[type_name] = std::move(mapping);
}

bool has_onnx_mapping(const std::string& type_name) {
  Registry& r = registry();
  std::lock_guard lock(r.mutex);
  return r.mappings.count(type_name) != 0;
}

onnx::TensorProto_DataType onnx_type(DType dtype) {
  switch (dtype) {
    case DType::f32:
      return onnx::TensorProto::FLOAT;
    case DType::f16:
      return onnx::TensorProto::FLOAT16;
    case DType::bf16:
      return onnx::TensorProto::BFLOAT16;
    case DType::i32:
      return onnx::TensorProto::INT32;
    case DType::i64:
      return onnx::TensorProto::INT64;
    case DType::u8:
      return onnx::TensorProto::UINT8;
  }
  throw InvalidArgument("ONNX export: no ONNX type for dtype " + std::string(dtype_name(dtype)));
}

std::string OnnxGraph::Impl::fresh(const std::string& hint) {
  std::string prefix = exporting.empty() ? std::string() : exporting.back()->path();
  return (prefix.empty() ? "" : prefix + "/") + hint + "_" + std::to_string(counter++);
}

OnnxValue OnnxGraph::module(Module& module, const OnnxValue& input) {
  OnnxMapping mapping;
  {
    Registry& r = registry();
    std::lock_guard lock(r.mutex);
    auto it = r.mappings.find(module.type_name());
    if (it != r.mappings.end()) mapping = it->second;
  }
  if (!mapping)
    throw InvalidArgument("ONNX export: " + module.describe() +
                          " has no ONNX mapping (give its type '" + module.type_name() +
                          "' one with engine::register_onnx_mapping, engine/export/onnx_graph.h)");
  impl_.exporting.push_back(&module);
  OnnxValue out = mapping(module, input, *this);
  impl_.exporting.pop_back();
  return out;
}

std::vector<std::string> OnnxGraph::node(const std::string& op_type,
                                         const std::vector<std::string>& inputs,
                                         const OnnxAttributes& attributes, int outputs) {
  onnx::NodeProto* n = impl_.graph->add_node();
  const std::string name = impl_.fresh(op_type);
  n->set_name(name);
  n->set_op_type(op_type);
  for (const std::string& in : inputs) n->add_input(in);
  std::vector<std::string> out;
  for (int i = 0; i < outputs; ++i) {
    out.push_back(outputs == 1 ? name : name + ":" + std::to_string(i));
    n->add_output(out.back());
  }
  for (const auto& [key, value] : attributes) set_attribute(*n, key, value);
  return out;
}

OnnxValue OnnxGraph::op(const std::string& op_type, const std::vector<std::string>& inputs,
                        DType dtype, std::vector<std::int64_t> shape,
                        const OnnxAttributes& attributes) {
  return {node(op_type, inputs, attributes).front(), dtype, std::move(shape)};
}

std::string OnnxGraph::parameter(const Parameter& p) {
  auto it = impl_.stored.find(&p);
  if (it != impl_.stored.end()) return it->second;
  if (p.name.empty())
    throw InvalidArgument("ONNX export: a parameter has no name (call assign_names() on the root)");
  onnx::TensorProto* t = impl_.graph->add_initializer();
  t->set_name(p.name);
  for (std::int64_t d : p.value.shape()) t->add_dims(d);
  fill_float(*t, p.value.cast(DType::f32, impl_.stream).to_vector<float>(impl_.stream),
             impl_.float_type);
  impl_.stored[&p] = p.name;
  return p.name;
}

std::string OnnxGraph::buffer(const Buffer& b) {
  auto it = impl_.stored.find(&b);
  if (it != impl_.stored.end()) return it->second;
  onnx::TensorProto* t = impl_.graph->add_initializer();
  t->set_name(b.name);
  for (std::int64_t d : b.value.shape()) t->add_dims(d);
  fill_float(*t, b.value.cast(DType::f32, impl_.stream).to_vector<float>(impl_.stream),
             impl_.float_type);
  impl_.stored[&b] = b.name;
  return b.name;
}

std::string OnnxGraph::constant_i64(const std::vector<std::int64_t>& values,
                                    const std::vector<std::int64_t>& shape) {
  onnx::TensorProto* t = impl_.graph->add_initializer();
  t->set_name(impl_.fresh("const"));
  for (std::int64_t d : shape) t->add_dims(d);
  t->set_data_type(onnx::TensorProto::INT64);
  t->set_raw_data(values.data(), values.size() * sizeof(std::int64_t));
  return t->name();
}

std::string OnnxGraph::constant_float(const std::vector<float>& values,
                                      const std::vector<std::int64_t>& shape) {
  onnx::TensorProto* t = impl_.graph->add_initializer();
  t->set_name(impl_.fresh("const"));
  for (std::int64_t d : shape) t->add_dims(d);
  fill_float(*t, values, impl_.float_type);
  return t->name();
}

std::string OnnxGraph::constant_bool(const std::vector<bool>& values,
                                     const std::vector<std::int64_t>& shape) {
  onnx::TensorProto* t = impl_.graph->add_initializer();
  t->set_name(impl_.fresh("const"));
  for (std::int64_t d : shape) t->add_dims(d);
  t->set_data_type(onnx::TensorProto::BOOL);
  std::string bytes;
  for (bool v : values) bytes.push_back(v ? 1 : 0);
  t->set_raw_data(bytes);
  return t->name();
}

DType OnnxGraph::float_type() const { return impl_.float_type; }
int OnnxGraph::opset() const { return impl_.opset; }

void OnnxGraph::refuse(const Module& module, const std::string& problem) const {
  throw InvalidArgument("ONNX export: " + module.describe() + ": " + problem);
}

}  // namespace lockstep::engine
