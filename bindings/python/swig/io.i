// braid._swig.io: checkpoints (braid/checkpoint.h) and ONNX import, execution and export
// (braid/onnx/*.h).
%module(package="braid._swig") io

%include "braid.swg"

%{
#include "braid/checkpoint.h"
#include "braid/nn/nn.h"
#include "braid/optim.h"
#include "braid/optim/grad_scaler.h"
#include "braid/data.h"
#include "braid/onnx/model.h"
#include "braid/onnx/module.h"
#include "braid/onnx/export.h"
%}

%import "core.i"
%import "nn.i"
%import "optim.i"
%import "data.i"

%shared_ptr(braid::onnx::OnnxModule)

%template(IntMap) std::map<std::string, int64_t>;
%template(StringMap) std::map<std::string, std::string>;

// The ONNX graph structures and the op registry are C++ extension points; Python loads, runs,
// fine-tunes and exports models.
%ignore braid::onnx::OpContext;
%ignore braid::onnx::OpSchema;
%ignore braid::onnx::OpRegistry;
%ignore braid::onnx::GraphBuilder;
%ignore braid::onnx::Value;
%ignore braid::onnx::register_layer_exporter;
%ignore braid::onnx::export_layer;
%ignore braid::onnx::attr_int;
%ignore braid::onnx::attr_float;
%ignore braid::onnx::attr_ints;
%ignore braid::onnx::attr_string;
%ignore braid::onnx::parse_model;
%ignore braid::onnx::Graph;
%ignore braid::onnx::Node;
%ignore braid::onnx::Attribute;
%ignore braid::onnx::ValueInfo;
%ignore braid::onnx::Dim;
%ignore braid::onnx::OnnxModule::model;
%ignore braid::onnx::Model::graph;

// ck.tensors (integers, scalars, strings) is a view into the C++ Checkpoint, so that writes through
// it change the checkpoint; the view keeps its checkpoint alive (as SWIG's container elements keep
// their container), which makes `braid.checkpoint.load(path).integers["step"]` safe although the
// checkpoint is a temporary.
%typemap(ret, fragment="reference_container_owner") std::map<std::string, braid::Tensor>*,
    std::map<std::string, double>*, std::map<std::string, int64_t>*, std::map<std::string, std::string>* {
  swig::container_owner<swig::pointer_category>::back_reference($result, $self);
}
%include "braid/checkpoint.h"
// braid.onnx.load(path, frozen=True) and braid.onnx.export(model, example, path, opset=13): the
// options' fields as keywords (Note [Options as keywords] in typemaps.swg).
BRAID_KEYWORD_OPTIONS(braid::onnx::OnnxOptions)
BRAID_KEYWORD_OPTIONS(braid::onnx::ExportOptions)
%include "braid/onnx/model.h"
%include "braid/onnx/module.h"
%include "braid/onnx/export.h"
