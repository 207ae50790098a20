// braid._swig.data: datasets, the DataLoader, transforms and the readers (braid/data/*.h). Dataset
// is a director class whose size and get are Python's __len__ and __getitem__, so a Python subclass
// is written as for PyTorch; the loader's background thread calls it (taking the GIL).
%module(package="braid._swig", directors="1") data

%include "braid.swg"

%{
#include "braid/data.h"
%}

%import "core.i"

%shared_ptr(braid::data::Dataset)
%shared_ptr(braid::data::TensorDataset)
%shared_ptr(braid::data::Transform)
%shared_ptr(braid::data::Normalize)
%shared_ptr(braid::data::RandomCrop)
%shared_ptr(braid::data::RandomHorizontalFlip)
%feature("director") braid::data::Dataset;

%template(TransformVector) std::vector<std::shared_ptr<const braid::data::Transform>>;

// ---- Dataset: a Python sequence of (input, target) pairs, as torch's ----
%rename(__len__) braid::data::Dataset::size;
%rename(__getitem__) braid::data::Dataset::get;
%{
namespace braid_py {
// o as a Tensor: a braid.Tensor as it is, anything else (a NumPy array, a number, a nested list)
// through braid.as_tensor, which shares a NumPy array's memory where it can.
inline braid::Tensor tensor_like(PyObject* o, swig_type_info* type) {
  void* p = nullptr;
  if (SWIG_IsOK(SWIG_ConvertPtr(o, &p, type, 0)) && p != nullptr) return *static_cast<braid::Tensor*>(p);
  PyObject* mod = PyImport_ImportModule("braid");
  PyObject* t = mod ? PyObject_CallMethod(mod, "as_tensor", "O", o) : nullptr;
  Py_XDECREF(mod);
  bool ok = t != nullptr && SWIG_IsOK(SWIG_ConvertPtr(t, &p, type, 0)) && p != nullptr;
  braid::Tensor result = ok ? *static_cast<braid::Tensor*>(p) : braid::Tensor();
  Py_XDECREF(t);
  if (!ok) throw PythonError();
  return result;
}
// (input, target) from a Python pair; anything else is a TypeError naming what came instead.
inline braid::data::Example example_arg(PyObject* o, const char* who, swig_type_info* type) {
  if (!(PyTuple_Check(o) || PyList_Check(o)) || PySequence_Size(o) != 2) {
    PyErr_Format(PyExc_TypeError, "%s must return (input, target), got %s", who, Py_TYPE(o)->tp_name);
    throw PythonError();
  }
  std::unique_ptr<PyObject, decltype(&Py_DecRef)> pair(PySequence_Fast(o, ""), Py_DecRef);
  return {tensor_like(PySequence_Fast_GET_ITEM(pair.get(), 0), type),
          tensor_like(PySequence_Fast_GET_ITEM(pair.get(), 1), type)};
}
}  // namespace braid_py
%}
// A typemap whose conversion may throw (a PythonError, or braid's own error) raises it in Python.
%define BRAID_PY_ARG(METHOD, TYPE, CONVERT, INPUT)
%typemap(METHOD) TYPE {
  try {
    $1 = CONVERT(INPUT);
  } catch (...) {
    braid_py::set_python_error();
    SWIG_fail;
  }
}
%enddef
%typemap(out) braid::data::Example {
  $result = Py_BuildValue("(NN)", braid_py::tensor_result(std::move($1.input), $descriptor(braid::Tensor*)),
                          braid_py::tensor_result(std::move($1.target), $descriptor(braid::Tensor*)));
}
%typemap(directorout) braid::data::Example {
  $result = braid_py::example_arg($input, "Dataset.__getitem__", $descriptor(braid::Tensor*));
}

// ---- DataLoader ----
// Note [A Python dataset in a DataLoader]
// The loader's dataset argument is a Dataset or an (inputs, targets) pair of tensors or arrays (a
// TensorDataset over them). A Python Dataset is a director, which does not own its Python half
// (Note [Python objects that C++ holds] in braid.swg), so the shared_ptr the loader gets also holds
// a reference to the Python object and drops it, taking the GIL, when C++ lets the dataset go. C++
// destroys the loader's members after ~DataLoader has stopped the prefetch thread, so that thread
// never calls a dataset that is gone, whichever of the two Python frees first.
%{
namespace braid_py {
// The object behind a Python handle of T or of a class derived from it; null when o is neither.
template <typename T>
std::shared_ptr<T> shared_arg(PyObject* o, swig_type_info* type) {
  void* p = nullptr;
  int newmem = 0;
  if (!SWIG_IsOK(SWIG_ConvertPtrAndOwn(o, &p, type, 0, &newmem)) || p == nullptr) return nullptr;
  std::shared_ptr<T> result = *static_cast<std::shared_ptr<T>*>(p);
  if (newmem & SWIG_CAST_NEW_MEMORY) delete static_cast<std::shared_ptr<T>*>(p);
  return result;
}
inline std::shared_ptr<const braid::data::Dataset> dataset_arg(PyObject* o, swig_type_info* dataset_type,
                                                               swig_type_info* tensor_type) {
  if (PyTuple_Check(o) || PyList_Check(o)) {
    BRAID_CHECK(PySequence_Size(o) == 2, "DataLoader: a dataset given as a sequence must be (inputs, targets), got ",
                PySequence_Size(o), " items");
    braid::data::Example e = example_arg(o, "DataLoader", tensor_type);
    return std::make_shared<braid::data::TensorDataset>(e.input, e.target);
  }
  // A Python Dataset need not call super().__init__(), as torch's need not: its C++ half is made here.
  auto* cls = static_cast<SwigPyClientData*>(dataset_type->clientdata);
  if (SWIG_Python_GetSwigThis(o) == nullptr && cls != nullptr && PyObject_IsInstance(o, cls->klass) == 1) {
    PyObject* done = PyObject_CallMethod(cls->klass, "__init__", "O", o);
    if (done == nullptr) throw PythonError();
    Py_DECREF(done);
  }
  std::shared_ptr<const braid::data::Dataset> dataset = shared_arg<braid::data::Dataset>(o, dataset_type);
  if (dataset == nullptr) {
    PyErr_Format(PyExc_TypeError, "DataLoader: expected a braid.data.Dataset or (inputs, targets), got %s",
                 Py_TYPE(o)->tp_name);
    throw PythonError();
  }
  auto* director = dynamic_cast<const Swig::Director*>(dataset.get());
  if (director == nullptr) return dataset;
  return {dataset.get(), [dataset, self = held(director->swig_get_self())](const braid::data::Dataset*) mutable {
            Gil gil;  // the director is dropped before its Python half
            dataset.reset();
            self.reset();
          }};
}
// transforms=[Normalize(...), RandomCrop(...)]: any sequence of braid.data transforms (a loader's
// keyword, set on DataLoaderOptions.transforms).
inline std::vector<std::shared_ptr<const braid::data::Transform>> transforms_arg(PyObject* o, swig_type_info* type) {
  PyObject* seq = PySequence_Fast(o, "DataLoader: transforms must be a sequence of braid.data transforms");
  if (seq == nullptr) throw PythonError();
  std::vector<std::shared_ptr<const braid::data::Transform>> out;
  for (Py_ssize_t i = 0; i < PySequence_Fast_GET_SIZE(seq) && PyErr_Occurred() == nullptr; ++i) {
    PyObject* item = PySequence_Fast_GET_ITEM(seq, i);
    out.push_back(shared_arg<braid::data::Transform>(item, type));
    if (out.back() == nullptr)
      PyErr_Format(PyExc_TypeError, "DataLoader: transform %zd is a %s, not a braid.data transform", i, Py_TYPE(item)->tp_name);
  }
  Py_DECREF(seq);
  if (PyErr_Occurred() != nullptr) throw PythonError();
  return out;
}
}  // namespace braid_py
%}
%typemap(in) const std::vector<std::shared_ptr<const braid::data::Transform>>& (std::vector<std::shared_ptr<const braid::data::Transform>> temp) {
  try {
    temp = braid_py::transforms_arg($input, $descriptor(std::shared_ptr<braid::data::Transform>*));
  } catch (...) {
    braid_py::set_python_error();
    SWIG_fail;
  }
  $1 = &temp;
}
%typemap(freearg) const std::vector<std::shared_ptr<const braid::data::Transform>>& ""
BRAID_PY_ARG(in, std::shared_ptr<const braid::data::Dataset> dataset, braid_py::dataset_arg,
             %arg($input, $descriptor(std::shared_ptr<braid::data::Dataset>*), $descriptor(braid::Tensor*)))
// loader.dataset, as torch's: a Python Dataset is the very object given, a TensorDataset a handle.
%typemap(out) const std::shared_ptr<const braid::data::Dataset>& {
  if (auto* director = dynamic_cast<const Swig::Director*>($1->get())) {
    $result = director->swig_get_self();
    Py_INCREF($result);
  } else {
    auto tensors = std::dynamic_pointer_cast<const braid::data::TensorDataset>(*$1);
    $result = tensors ? SWIG_NewPointerObj(new std::shared_ptr<braid::data::TensorDataset>(std::const_pointer_cast<braid::data::TensorDataset>(tensors)),
                                           $descriptor(std::shared_ptr<braid::data::TensorDataset>*), SWIG_POINTER_OWN)
                      : SWIG_NewPointerObj(new std::shared_ptr<braid::data::Dataset>(std::const_pointer_cast<braid::data::Dataset>(*$1)),
                                           $descriptor(std::shared_ptr<braid::data::Dataset>*), SWIG_POINTER_OWN);
  }
}
%rename(_dataset) braid::data::DataLoader::dataset;

// Python's keywords are DataLoaderOptions' fields (Note [Options as keywords] in typemaps.swg);
// device=None leaves batches where the dataset made them.
BRAID_KEYWORD_OPTIONS(braid::data::DataLoaderOptions)
%naturalvar braid::data::DataLoaderOptions::transforms;
%naturalvar braid::data::DataLoaderOptions::device;
%ignore braid::data::DataLoader::Iterator;
%ignore braid::data::DataLoader::begin;
%ignore braid::data::DataLoader::end;
%extend braid::data::DataLoader {
  int64_t __len__() const { return $self->num_batches(); }
  // The rest of the epoch's batches as (input, target); the GIL is released while next() waits.
  std::pair<braid::Tensor, braid::Tensor> __next__() {
    braid::data::Batch b;
    if ($self->next(b)) return {b.input, b.target};
    SWIG_PYTHON_THREAD_BEGIN_BLOCK;  // the GIL (until the scope ends), to raise StopIteration through braid_py::PythonError
    PyErr_SetNone(PyExc_StopIteration);
    throw braid_py::PythonError();
  }
  %pythoncode %{
    __iter__ = lambda self: self
    dataset = property(_dataset)
  %}
}
// ---- ProgressBar: braid.progress.Progress(label, total, unit="img/s", stream=None, clock=None) ----
// stream is a Python text stream (None: sys.stdout as it is when the bar is made, so that pytest's
// capture and a redirected sys.stdout see the line); clock a callable giving seconds (tests).
%{
namespace braid_py {
inline braid::data::ProgressOutput progress_stream(PyObject* o) {
  PyObject* stream = o == Py_None ? PySys_GetObject("stdout") : o;  // borrowed
  PyObject* tty = stream ? PyObject_CallMethod(stream, "isatty", nullptr) : nullptr;
  if (tty == nullptr) throw PythonError();
  braid::data::ProgressOutput out{nullptr, PyObject_IsTrue(tty) == 1};
  Py_DECREF(tty);
  out.write = [s = held(stream)](const std::string& text) {
    Gil gil;
    PyObject* r = PyObject_CallMethod(s.get(), "write", "s#", text.data(), static_cast<Py_ssize_t>(text.size()));
    Py_XDECREF(r);
    PyObject* f = r ? PyObject_CallMethod(s.get(), "flush", nullptr) : nullptr;
    Py_XDECREF(f);
    if (f == nullptr) throw PythonError();  // made while the GIL is held
  };
  return out;
}
inline std::function<double()> clock_arg(PyObject* o) {
  if (o == Py_None) return {};
  return [c = held(o)] {
    Gil gil;
    PyObject* r = PyObject_CallNoArgs(c.get());
    double t = r ? PyFloat_AsDouble(r) : -1;
    Py_XDECREF(r);
    if (PyErr_Occurred()) throw PythonError();
    return t;
  };
}
// metrics: a dict of name: number, in its order, or None.
inline braid::data::ProgressBar::Values metrics_arg(PyObject* o) {
  braid::data::ProgressBar::Values values;
  if (o != Py_None && !PyDict_Check(o)) {
    PyErr_Format(PyExc_TypeError, "metrics must be a dict of name: number, got %s", Py_TYPE(o)->tp_name);
    throw PythonError();
  }
  PyObject *key, *value;
  for (Py_ssize_t pos = 0; o != Py_None && PyDict_Next(o, &pos, &key, &value);) {
    PyObject* name = PyObject_Str(key);
    const char* text = name ? PyUnicode_AsUTF8(name) : nullptr;
    double v = PyFloat_AsDouble(value);
    if (text != nullptr) values.emplace_back(text, v);
    Py_XDECREF(name);
    if (PyErr_Occurred()) throw PythonError();
  }
  return values;
}
}  // namespace braid_py
%}
BRAID_PY_ARG(in, braid::data::ProgressOutput stream, braid_py::progress_stream, $input)
BRAID_PY_ARG(default, braid::data::ProgressOutput stream, braid_py::progress_stream, Py_None)  // not C's stdout
BRAID_PY_ARG(in, std::function<double()> clock, braid_py::clock_arg, $input)
%typemap(in) const braid::data::ProgressBar::Values& metrics (braid::data::ProgressBar::Values temp) {
  try {
    temp = braid_py::metrics_arg($input);
  } catch (...) {
    braid_py::set_python_error();
    SWIG_fail;
  }
  $1 = &temp;
}
%ignore braid::data::ProgressOutput;

%include "braid/data/dataset.h"
%include "braid/data/transforms.h"
%include "braid/data/loader.h"
%include "braid/data/readers.h"
%include "braid/data/progress.h"
