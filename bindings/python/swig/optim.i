// braid._swig.optim: optimizers, parameter groups, learning-rate schedules, gradient clipping and
// the GradScaler (braid/optim/*.h), with PyTorch's keyword arguments: the options structs' fields
// (Note [Options as keywords] in typemaps.swg), betas=(b1, b2) as in AdamOptions.
%module(package="braid._swig") optim

%include "braid.swg"

%{
#include "braid/optim.h"
#include "braid/optim/grad_scaler.h"
%}

%import "core.i"

%shared_ptr(braid::optim::Optimizer)
%shared_ptr(braid::optim::SGD)
%shared_ptr(braid::optim::Adam)
%shared_ptr(braid::optim::AdamW)
%shared_ptr(braid::optim::RMSprop)
%shared_ptr(braid::optim::Adagrad)

%template(DoubleMap) std::map<std::string, double>;
%template(TensorMap) std::map<std::string, braid::Tensor>;
%template(ParamGroupVector) std::vector<braid::optim::ParamGroup>;

BRAID_KEYWORD_OPTIONS(braid::optim::SGDOptions)
BRAID_KEYWORD_OPTIONS(braid::optim::AdamOptions)
BRAID_KEYWORD_OPTIONS(braid::optim::AdamWOptions)
BRAID_KEYWORD_OPTIONS(braid::optim::RMSpropOptions)
BRAID_KEYWORD_OPTIONS(braid::optim::AdagradOptions)
BRAID_KEYWORD_OPTIONS(braid::optim::GradScalerOptions)
%template(DoublePair) std::pair<double, double>;
%naturalvar braid::optim::AdamOptions::betas;
%naturalvar braid::optim::AdamWOptions::betas;
// One constructor per optimizer, so that its arguments have keywords: params is an iterable of
// tensors (one group) or of dicts (the groups), as in PyTorch.
%ignore braid::optim::SGD::SGD(const std::vector<Tensor>&, const SGDOptions&);
%ignore braid::optim::Adam::Adam(const std::vector<Tensor>&, const AdamOptions&);
%ignore braid::optim::AdamW::AdamW(const std::vector<Tensor>&, const AdamWOptions&);
%ignore braid::optim::RMSprop::RMSprop(const std::vector<Tensor>&, const RMSpropOptions&);
%ignore braid::optim::Adagrad::Adagrad(const std::vector<Tensor>&, const AdagradOptions&);

%ignore braid::optim::Optimizer::param_groups() const;
%ignore braid::optim::Optimizer::state;
%ignore braid::optim::GradScaler::Record;

// Parameter groups as PyTorch writes them: an iterable of tensors (one group), or a list of dicts,
// each with "params" (tensors) and options by name ("betas" gives beta1 and beta2); the options a
// group leaves out take the constructor's.
%{
namespace braid_py {
inline bool param_groups_arg(PyObject* o, std::vector<braid::optim::ParamGroup>* out, swig_type_info* type) {
  PyObject* seq = !PyUnicode_Check(o) && !PyDict_Check(o) ? PySequence_Fast(o, "") : nullptr;
  bool ok = seq != nullptr;
  if (ok && (PySequence_Fast_GET_SIZE(seq) == 0 || !PyDict_Check(PySequence_Fast_GET_ITEM(seq, 0)))) {
    PyObject* one = Py_BuildValue("[{s:O}]", "params", seq);  // tensors: one group
    ok = one != nullptr && param_groups_arg(one, out, type);
    Py_XDECREF(one);
    Py_DECREF(seq);
    return ok;
  }
  for (Py_ssize_t i = 0, n = ok ? PySequence_Fast_GET_SIZE(seq) : 0; ok && i < n; ++i) {
    PyObject* dict = PySequence_Fast_GET_ITEM(seq, i);
    PyObject* params = PyDict_Check(dict) ? PyDict_GetItemString(dict, "params") : nullptr;
    if (out == nullptr) {  // the overload check: the shape only
      ok = params != nullptr;
      continue;
    }
    PyObject* it = params != nullptr ? PyObject_GetIter(params) : nullptr;
    braid::optim::ParamGroup group;
    for (PyObject* t = it ? PyIter_Next(it) : nullptr; t != nullptr; t = PyIter_Next(it)) {
      void* p = nullptr;
      ok = ok && SWIG_IsOK(SWIG_ConvertPtr(t, &p, type, 0)) && p != nullptr;
      if (ok) group.params.push_back(*static_cast<braid::Tensor*>(p));
      Py_DECREF(t);
    }
    ok = ok && it != nullptr && !PyErr_Occurred();
    Py_XDECREF(it);
    PyObject *key, *value;
    for (Py_ssize_t pos = 0; ok && PyDict_Next(dict, &pos, &key, &value);) {
      std::string name = PyUnicode_Check(key) ? PyUnicode_AsUTF8(key) : "";
      if (name == "betas") {
        ok = PySequence_Check(value) && PySequence_Size(value) == 2;
        for (int b = 0; ok && b < 2; ++b) {
          PyObject* beta = PySequence_GetItem(value, b);
          group.options[b == 0 ? "beta1" : "beta2"] = beta ? PyFloat_AsDouble(beta) : 0.0;
          Py_XDECREF(beta);
        }
      } else if (name != "params") {
        group.options[name] = PyFloat_AsDouble(value);
      }
      ok = ok && !name.empty() && !PyErr_Occurred();
    }
    if (ok) out->push_back(std::move(group));
  }
  Py_XDECREF(seq);
  PyErr_Clear();
  return ok;
}
}  // namespace braid_py
%}
%typemap(in) std::vector<braid::optim::ParamGroup> {
  if (!braid_py::param_groups_arg($input, &$1, $descriptor(braid::Tensor*))) {
    SWIG_exception_fail(SWIG_TypeError, "in method '$symname', argument $argnum: expected an iterable of tensors, or of dicts each with 'params'");
  }
}
%typemap(typecheck, precedence=1) std::vector<braid::optim::ParamGroup> {
  $1 = braid_py::param_groups_arg($input, nullptr, $descriptor(braid::Tensor*));
}

%include "braid/optim/optimizer.h"
%include "braid/optim/optimizers.h"
%include "braid/optim/lr_scheduler.h"
%include "braid/optim/grad_scaler.h"
