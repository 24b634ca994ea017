// OnnxGraph::Impl: the protobuf side of the graph being built, shared by
// onnx_graph.cpp (the node and initializer calls) and onnx_export.cpp (the
// model around the graph). Only engine/export/ includes it.
#pragma once

#include <onnx/onnx_pb.h>

#include <map>
#include <string>
#include <vector>

#include "engine/export/onnx_graph.h"

namespace lockstep::engine {

struct OnnxGraph::Impl {
  onnx::GraphProto* graph = nullptr;
  DType float_type = DType::f32;
  int opset = 0;
  core::Stream stream;
  // Initializer names by the Parameter or Buffer they hold: a tied weight is
  // stored once.
  std::map<const void*, std::string> stored;
  std::vector<const Module*> exporting;  // the modules being mapped, outermost first
  std::int64_t counter = 0;

  // "<path of the innermost module>/<hint>_<n>": unique in the graph.
  std::string fresh(const std::string& hint);
};

// ONNX's element type for a lockstep dtype; throws for one ONNX lacks here.
onnx::TensorProto_DataType onnx_type(DType dtype);
// Built-in mappings of engine/nn's modules (onnx_mappings.cpp).
std::map<std::string, OnnxMapping> builtin_onnx_mappings();

}  // namespace lockstep::engine
