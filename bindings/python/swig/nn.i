// braid._swig.nn: Module and every layer, loss and initialiser (braid/nn/*.h). Module is a director
// class: a Python subclass's forward is what C++ calls (DDP, pipelines, Sequential, ONNX export).
%module(package="braid._swig", directors="1") nn

%include "braid.swg"

%{
#include "braid/distributed/data_parallel.h"
#include "braid/nn/nn.h"
#include "braid/onnx/module.h"
%}

%import "core.i"

// Every class the headers hold by shared_ptr, base first.
%define BRAID_MODULES(X)
X(Module) X(Sequential) X(ModuleList) X(Linear) X(Conv1d) X(Conv2d) X(ConvTranspose2d) X(MaxPool2d) X(AvgPool2d)
X(AdaptiveAvgPool2d) X(BatchNorm) X(BatchNorm1d) X(BatchNorm2d) X(LayerNorm) X(GroupNorm) X(Dropout) X(ReLU)
X(LeakyReLU) X(ReLU6) X(GELU) X(SiLU) X(Sigmoid) X(Tanh) X(Softmax) X(Embedding) X(Flatten) X(Identity) X(Residual)
X(MultiheadAttention) X(TransformerEncoderLayer) X(RNNBase) X(LSTM) X(GRU) X(SkipStash) X(SkipAdd) X(SkipConcat)
X(Loss) X(CrossEntropyLoss) X(NLLLoss) X(MSELoss) X(L1Loss) X(SmoothL1Loss) X(BCEWithLogitsLoss)
%enddef
%define BRAID_SHARED(C) %shared_ptr(braid::nn::C) %enddef
BRAID_MODULES(BRAID_SHARED)

%feature("director") braid::nn::Module;
// Module's base std::enable_shared_from_this is C++ plumbing (named_modules() lists the module itself).
%warnfilter(401) braid::nn::Module;
// What a Python forward returns to C++ must be one Tensor; anything else is a TypeError naming the
// class (SWIG's own message names only the C++ type).
%typemap(directorout) braid::Tensor {
  void* p = nullptr;
  if (!SWIG_IsOK(SWIG_ConvertPtr($input, &p, $descriptor(braid::Tensor*), 0)) || p == nullptr) {
    PyErr_Format(PyExc_TypeError,
                 "%s.forward returned %s; a module that C++ calls (Sequential, DistributedDataParallel, a "
                 "pipeline stage, ONNX export) must return one braid.Tensor",
                 Py_TYPE(swig_get_self())->tp_name, Py_TYPE($input)->tp_name);
    throw braid_py::PythonError();
  }
  $result = *static_cast<braid::Tensor*>(p);
}
%feature("nodirector") braid::nn::Module::to_string;

// A module handed back to Python is its most derived class; a Python-defined module is the very
// Python object that C++ holds (its director), so attributes set in Python stay.
%{
namespace braid_py {
inline PyObject* module_result(const std::shared_ptr<braid::nn::Module>& m) {
  if (!m) Py_RETURN_NONE;
  if (auto* d = dynamic_cast<Swig::Director*>(m.get())) {
    PyObject* self = d->swig_get_self();
    Py_INCREF(self);
    return self;
  }
#define BRAID_CAST(C)                                                                            \
  if (auto p = std::dynamic_pointer_cast<braid::nn::C>(m); p && m->type_name() == #C) {          \
    static swig_type_info* type = SWIG_TypeQuery("std::shared_ptr< braid::nn::" #C " > *");      \
    return SWIG_NewPointerObj(new std::shared_ptr<braid::nn::C>(p), type, SWIG_POINTER_OWN);     \
  }
  BRAID_CAST(Sequential) BRAID_CAST(ModuleList) BRAID_CAST(Linear) BRAID_CAST(Conv1d) BRAID_CAST(Conv2d)
  BRAID_CAST(ConvTranspose2d) BRAID_CAST(MaxPool2d) BRAID_CAST(AvgPool2d) BRAID_CAST(AdaptiveAvgPool2d)
  BRAID_CAST(BatchNorm1d) BRAID_CAST(BatchNorm2d) BRAID_CAST(LayerNorm) BRAID_CAST(GroupNorm) BRAID_CAST(Dropout)
  BRAID_CAST(ReLU) BRAID_CAST(ReLU6) BRAID_CAST(LeakyReLU) BRAID_CAST(GELU) BRAID_CAST(SiLU) BRAID_CAST(Sigmoid) BRAID_CAST(Tanh)
  BRAID_CAST(Softmax) BRAID_CAST(Embedding) BRAID_CAST(Flatten) BRAID_CAST(Identity) BRAID_CAST(Residual)
  BRAID_CAST(MultiheadAttention) BRAID_CAST(TransformerEncoderLayer) BRAID_CAST(LSTM) BRAID_CAST(GRU)
  BRAID_CAST(SkipStash) BRAID_CAST(SkipAdd) BRAID_CAST(SkipConcat) BRAID_CAST(CrossEntropyLoss) BRAID_CAST(NLLLoss)
  BRAID_CAST(MSELoss) BRAID_CAST(L1Loss) BRAID_CAST(SmoothL1Loss) BRAID_CAST(BCEWithLogitsLoss)
#undef BRAID_CAST
  // Modules wrapped by the other SWIG modules, typed when that module is loaded.
#define BRAID_CAST_OTHER(CLASS, NAME)                                                            \
  if (auto p = std::dynamic_pointer_cast<CLASS>(m)) {                                           \
    if (swig_type_info* type = SWIG_TypeQuery("std::shared_ptr< " #CLASS " > *"))              \
      return SWIG_NewPointerObj(new std::shared_ptr<CLASS>(p), type, SWIG_POINTER_OWN);         \
  }
  BRAID_CAST_OTHER(braid::distributed::SyncBatchNorm, SyncBatchNorm)
  BRAID_CAST_OTHER(braid::onnx::OnnxModule, OnnxModule)
#undef BRAID_CAST_OTHER
  static swig_type_info* base = SWIG_TypeQuery("std::shared_ptr< braid::nn::Module > *");
  return SWIG_NewPointerObj(new std::shared_ptr<braid::nn::Module>(m), base, SWIG_POINTER_OWN);
}
}  // namespace braid_py
%}
%typemap(out) std::shared_ptr<braid::nn::Module>, braid::nn::ModulePtr {
  $result = braid_py::module_result($1);
}

// ---- Ints and Padding: a number, a sequence of numbers, or (Padding) "same" / "valid" ----
%{
namespace braid_py {
inline bool ints_arg(PyObject* o, std::vector<int64_t>* out) {
  if (PyLong_Check(o)) {
    out->assign(1, PyLong_AsLongLong(o));
    return true;
  }
  if (!PySequence_Check(o) || PyUnicode_Check(o)) return false;
  Py_ssize_t n = PySequence_Size(o);
  out->clear();
  for (Py_ssize_t i = 0; i < n; ++i) {
    PyObject* item = PySequence_GetItem(o, i);
    bool ok = item != nullptr && PyLong_Check(item);
    if (ok) out->push_back(PyLong_AsLongLong(item));
    Py_XDECREF(item);
    if (!ok) return false;
  }
  return true;
}
}  // namespace braid_py
%}
%typemap(in) braid::nn::Ints (std::vector<int64_t> v) {
  if (!braid_py::ints_arg($input, &v)) {
    SWIG_exception_fail(SWIG_TypeError, "in method '$symname', argument $argnum: expected an int or a sequence of ints");
  }
  $1 = braid::nn::Ints(v);
}
%typemap(typecheck, precedence=SWIG_TYPECHECK_INT64_ARRAY) braid::nn::Ints {
  std::vector<int64_t> v;
  $1 = braid_py::ints_arg($input, &v);
}
%typemap(in) braid::nn::Padding (std::vector<int64_t> v) {
  if (PyUnicode_Check($input)) {
    try {
      $1 = braid::nn::Padding(std::string(PyUnicode_AsUTF8($input)));
    } catch (...) {
      braid_py::set_python_error();
      SWIG_fail;
    }
  } else if (braid_py::ints_arg($input, &v)) {
    $1 = braid::nn::Padding(v);
  } else {
    SWIG_exception_fail(SWIG_TypeError, "in method '$symname', argument $argnum: expected an int, a sequence of ints, 'same' or 'valid'");
  }
}
%typemap(typecheck, precedence=SWIG_TYPECHECK_INT64_ARRAY) braid::nn::Padding {
  std::vector<int64_t> v;
  $1 = PyUnicode_Check($input) || braid_py::ints_arg($input, &v);
}
%ignore braid::nn::Ints;
%ignore braid::nn::Padding;

%ignore braid::nn::Module::operator();
%ignore braid::nn::Loss::operator();
%ignore braid::nn::SkipScope;
%ignore braid::nn::run_in_skip_scope;
// Note [Layer config]: config() returns structs that hold the options structs, which stay in C++.
%ignore *::config;
%ignore braid::nn::LinearConfig;
%ignore braid::nn::Conv1dConfig;
%ignore braid::nn::Conv2dConfig;
%ignore braid::nn::ConvTranspose2dConfig;
%ignore braid::nn::MaxPool2dConfig;
%ignore braid::nn::AvgPool2dConfig;
%ignore braid::nn::AdaptiveAvgPool2dConfig;
%ignore braid::nn::BatchNormConfig;
%ignore braid::nn::LayerNormConfig;
%ignore braid::nn::GroupNormConfig;
%ignore braid::nn::DropoutConfig;
%ignore braid::nn::LeakyReLUConfig;
%ignore braid::nn::GELUConfig;
%ignore braid::nn::SoftmaxConfig;
%ignore braid::nn::EmbeddingConfig;
%ignore braid::nn::FlattenConfig;
%ignore braid::nn::MultiheadAttentionConfig;
%ignore braid::nn::TransformerEncoderLayerConfig;
%ignore braid::nn::RNNConfig;
%ignore braid::nn::SkipConcatConfig;
// Note [Layer options]: Python passes the options as keywords of the same names (nn.Conv2d(1, 16, 3,
// padding=1, bias=False)), which SWIG takes from the positional constructors; it cannot give keywords
// to an overloaded constructor, so the options structs and their constructors stay in C++.
%ignore braid::nn::Conv1dOptions;
%ignore braid::nn::Conv2dOptions;
%ignore braid::nn::ConvTranspose2dOptions;
%ignore braid::nn::MaxPool2dOptions;
%ignore braid::nn::AvgPool2dOptions;
%ignore braid::nn::BatchNormOptions;
%ignore braid::nn::MultiheadAttentionOptions;
%ignore braid::nn::TransformerEncoderLayerOptions;
%ignore braid::nn::RNNOptions;
%ignore braid::nn::Conv1d::Conv1d(int64_t, int64_t, int64_t, const Conv1dOptions&);
%ignore braid::nn::Conv2d::Conv2d(int64_t, int64_t, Ints, const Conv2dOptions&);
%ignore braid::nn::ConvTranspose2d::ConvTranspose2d(int64_t, int64_t, Ints, const ConvTranspose2dOptions&);
%ignore braid::nn::MaxPool2d::MaxPool2d(Ints, const MaxPool2dOptions&);
%ignore braid::nn::AvgPool2d::AvgPool2d(Ints, const AvgPool2dOptions&);
%ignore braid::nn::BatchNorm1d::BatchNorm1d(int64_t, const BatchNormOptions&);
%ignore braid::nn::BatchNorm2d::BatchNorm2d(int64_t, const BatchNormOptions&);
%ignore braid::nn::MultiheadAttention::MultiheadAttention(int64_t, int64_t, const MultiheadAttentionOptions&);
%ignore braid::nn::TransformerEncoderLayer::TransformerEncoderLayer(int64_t, int64_t, const TransformerEncoderLayerOptions&);
%ignore braid::nn::LSTM::LSTM(int64_t, int64_t, const RNNOptions&);
%ignore braid::nn::GRU::GRU(int64_t, int64_t, const RNNOptions&);

%template(NamedTensor) std::pair<std::string, braid::Tensor>;
%template(NamedTensors) std::vector<std::pair<std::string, braid::Tensor>>;
%template(NamedModule) std::pair<std::string, std::shared_ptr<braid::nn::Module>>;
%template(NamedModules) std::vector<std::pair<std::string, std::shared_ptr<braid::nn::Module>>>;
%template(ModuleVector) std::vector<std::shared_ptr<braid::nn::Module>>;
%template(StateDict) std::map<std::string, braid::Tensor>;
%template(Int64Pair) std::pair<int64_t, int64_t>;

// ---- What Module's tree API returns, as PyTorch returns it ----
// Lists and (name, value) tuples rather than proxies of the std containers, each module its most
// derived class (module_result above); state_dict() a dict of the module's tensors by name.
// A fragment, so that the modules that %import this file (io, distributed) get the helpers too.
%fragment("braid_lists", "header") %{
namespace braid_py {
template <typename T, typename F>
PyObject* list_result(const std::vector<T>& items, F convert) {
  PyObject* out = PyList_New(static_cast<Py_ssize_t>(items.size()));
  for (size_t i = 0; i < items.size(); ++i) PyList_SET_ITEM(out, static_cast<Py_ssize_t>(i), convert(items[i]));
  return out;
}
template <typename T, typename F>
PyObject* list_result(const std::vector<std::pair<std::string, T>>& items, F convert) {
  PyObject* out = PyList_New(static_cast<Py_ssize_t>(items.size()));
  for (size_t i = 0; i < items.size(); ++i)
    PyList_SET_ITEM(out, static_cast<Py_ssize_t>(i), Py_BuildValue("(sN)", items[i].first.c_str(), convert(items[i].second)));
  return out;
}
inline PyObject* tensor_value(const braid::Tensor& t) {
  static swig_type_info* type = SWIG_TypeQuery("braid::Tensor *");
  return tensor_result(braid::Tensor(t), type);
}
// Detached, as PyTorch's state_dict(): the values share the module's memory, outside autograd.
inline PyObject* dict_result(const std::map<std::string, braid::Tensor>& named) {
  PyObject* out = PyDict_New();
  for (const auto& [name, t] : named) {
    PyObject* v = tensor_value(t.detach());
    PyDict_SetItemString(out, name.c_str(), v);
    Py_DECREF(v);
  }
  return out;
}
// A mapping of names to tensors; a value that is not a braid.Tensor (a NumPy array, a nested list)
// becomes one through braid.as_tensor, sharing its memory where it can.
inline bool state_dict_arg(PyObject* o, std::map<std::string, braid::Tensor>* out, swig_type_info* type) {
  PyObject* items = PyMapping_Check(o) ? PyMapping_Items(o) : nullptr;
  if (items == nullptr) {
    if (!PyErr_Occurred()) PyErr_Format(PyExc_TypeError, "expected a mapping of names to tensors, got %s", Py_TYPE(o)->tp_name);
    return false;
  }
  PyObject* braid_module = nullptr;
  bool ok = true;
  for (Py_ssize_t i = 0; ok && i < PyList_GET_SIZE(items); ++i) {
    PyObject* key = PyTuple_GET_ITEM(PyList_GET_ITEM(items, i), 0);
    PyObject* value = PyTuple_GET_ITEM(PyList_GET_ITEM(items, i), 1);
    PyObject* converted = nullptr;
    void* p = nullptr;
    if (!SWIG_IsOK(SWIG_ConvertPtr(value, &p, type, 0)) || p == nullptr) {
      if (braid_module == nullptr) braid_module = PyImport_ImportModule("braid");
      converted = braid_module ? PyObject_CallMethod(braid_module, "as_tensor", "O", value) : nullptr;
      ok = converted != nullptr && SWIG_IsOK(SWIG_ConvertPtr(converted, &p, type, 0)) && p != nullptr;
    }
    const char* name = ok && PyUnicode_Check(key) ? PyUnicode_AsUTF8(key) : nullptr;
    if (ok && name == nullptr && !PyErr_Occurred()) PyErr_SetString(PyExc_TypeError, "state dict names must be str");
    ok = ok && name != nullptr;
    if (ok) (*out)[name] = *static_cast<braid::Tensor*>(p);
    Py_XDECREF(converted);
  }
  Py_XDECREF(braid_module);
  Py_DECREF(items);
  return ok;
}
}  // namespace braid_py
%}
%typemap(out, fragment="braid_lists") std::vector<std::pair<std::string, std::shared_ptr<braid::nn::Module>>>,
                                      std::vector<std::shared_ptr<braid::nn::Module>> {
  $result = braid_py::list_result($1, braid_py::module_result);
}
%typemap(out, fragment="braid_lists") std::vector<std::pair<std::string, braid::Tensor>>, std::vector<braid::Tensor> {
  $result = braid_py::list_result($1, braid_py::tensor_value);
}
%typemap(out, fragment="braid_lists") std::map<std::string, braid::Tensor> {
  $result = braid_py::dict_result($1);
}
%typemap(in, fragment="braid_lists") const std::map<std::string, braid::Tensor>& (std::map<std::string, braid::Tensor> named) {
  if (!braid_py::state_dict_arg($input, &named, $descriptor(braid::Tensor*))) SWIG_fail;
  $1 = &named;
}
%typemap(freearg) const std::map<std::string, braid::Tensor>& "";
%typemap(typecheck, precedence=SWIG_TYPECHECK_POINTER) const std::map<std::string, braid::Tensor>& {
  $1 = PyMapping_Check($input);
}

// ---- Module's Python face: repr, the training flag, and the methods that return the module ----
%define BRAID_REPR(C)
%extend braid::nn::C {
  std::string __repr__() const { return $self->to_string(); }
}
%enddef
BRAID_MODULES(BRAID_REPR)
%include <attribute.i>
%attribute(braid::nn::Module, bool, training, is_training);
// Layers' tensors read as attributes, as in PyTorch (layer.weight, not layer.weight()); a layer built
// with bias=False has bias None.
%attribute(braid::nn::Linear, braid::Tensor, weight, weight);
%attribute(braid::nn::Linear, braid::Tensor, bias, bias);
%attribute(braid::nn::Embedding, braid::Tensor, weight, weight);
// train(), eval() and load_state_dict() return the module itself, as PyTorch's do (model.eval() in
// an expression, seq.train() is seq).
%feature("pythonappend") braid::nn::Module::train "val = self"
%feature("pythonappend") braid::nn::Module::eval "val = self"
%feature("pythonappend") braid::nn::Module::load_state_dict "val = self"
// A Python subclass without forward: the call falls through to the pure virtual, from Python and from
// C++ alike, and the user sees which class lacks it (a director's type_name is its Python class name).
%exception braid::nn::Module::forward {
  try {
    $action
  } catch (const Swig::DirectorPureVirtualException&) {
    PyErr_Format(PyExc_NotImplementedError, "%s does not define forward()", arg1->type_name().c_str());
    SWIG_fail;
  } catch (...) {
    braid_py::set_python_error();
    SWIG_fail;
  }
}

%include "braid/nn/module.h"
// Protected, but a Python subclass registers its attributes through them.
%extend braid::nn::Module {
%template(register_module) register_module<braid::nn::Module>;
}
// Sequential and ModuleList as Python sequences: len(), indexing from either end, and iteration
// (Python's, through __getitem__ until IndexError).
%define BRAID_MODULE_SEQUENCE(CLS)
%extend braid::nn::CLS {
  size_t __len__() const { return $self->size(); }
  braid::nn::ModulePtr __getitem__(int64_t i) const {
    auto n = static_cast<int64_t>($self->size());
    BRAID_CHECK_T(braid::IndexError, i >= -n && i < n, #CLS " index ", i, " out of range for ", n, " modules");
    return $self->at(static_cast<size_t>(i < 0 ? i + n : i));
  }
}
%enddef
BRAID_MODULE_SEQUENCE(Sequential)
BRAID_MODULE_SEQUENCE(ModuleList)
%include "braid/nn/layers.h"
%include "braid/nn/attention.h"
%include "braid/nn/recurrent.h"
%include "braid/nn/skip.h"
%include "braid/nn/loss.h"
%include "braid/nn/init.h"
