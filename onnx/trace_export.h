// ONNX export by tracing (Note [Export by tracing] in trace_export.cpp), for export.cpp.
#pragma once

#include <string>

#include "braid/nn/module.h"
#include "braid/onnx/export.h"

namespace braid::onnx {

/// The nodes of m's forward on x, from one traced run; the fallback of export_layer.
Value export_traced(GraphBuilder& g, nn::Module& m, const std::string& prefix, const Value& x);
/// How many modules this process has exported by tracing (export_model checks those exports).
int traced_module_count();
/// Throws NotImplementedError when model (traced from m) does not reproduce m's forward on an input
/// other than example: another batch size when it is symbolic, other values when they are floats.
void check_traced_export(const Model& model, nn::Module& m, const Tensor& example, const ExportOptions& options);

}  // namespace braid::onnx
