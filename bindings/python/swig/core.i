// braid._core: dtypes, devices, tensors, the ops, autograd, random numbers, threads, autocast, and
// the NumPy/DLPack interop of the bindings (braid/_tensor.py builds the Python Tensor on these).
%module(package="braid._swig", directors="1") core

%include "braid.swg"

%{
#include "braid/braid.h"
#include "braid/knobs.h"
%}

%template(Int64Vector) std::vector<int64_t>;
%template(DoubleVector) std::vector<double>;
%template(FloatVector) std::vector<float>;
%template(Int32Vector) std::vector<int32_t>;
%template(BoolVector) std::vector<bool>;
%template(TensorVector) std::vector<braid::Tensor>;
%template(TensorPair) std::pair<braid::Tensor, braid::Tensor>;  // aminmax
%template(StringVector) std::vector<std::string>;

// ---- what stays in C++ ----
%ignore braid::TensorImpl;
%ignore braid::Tensor::Tensor(std::shared_ptr<TensorImpl>);
%ignore braid::Tensor::impl;
%ignore braid::Tensor::impl_ptr;
%ignore braid::Tensor::storage;
%ignore braid::Tensor::raw_data;
%ignore braid::Tensor::data;
%ignore braid::Tensor::to_vector;
%ignore braid::Storage;
%ignore braid::detail;
%ignore braid::from_blob;          // Python shares memory through from_numpy / from_dlpack
%ignore braid::from_buffer;
%ignore braid::tensor;            // braid.tensor() (Python) takes any nested sequence or array
%ignore braid::tensor_bool;
%ignore braid::NoGradGuard;        // braid.no_grad() is the Python form
%ignore braid::check_scalar_fits;
%ignore braid::default_generator;
%ignore braid::Device::operator!=;
%rename(__eq__) braid::Device::operator==;
%rename(__str__) braid::Device::str;
%ignore braid::Error;
%ignore braid::ValueError;
%ignore braid::IndexError;
%ignore braid::TypeError;
%ignore braid::NotImplementedError;
%ignore braid::DistributedError;

// The tensor-scalar operators as functions (add_scalar, ...); Tensor.__add__ and friends are below.
%rename(add_scalar) braid::operator+(const Tensor&, double);
%rename(sub_scalar) braid::operator-(const Tensor&, double);
%rename(mul_scalar) braid::operator*(const Tensor&, double);
%rename(div_scalar) braid::operator/(const Tensor&, double);
%rename(radd_scalar) braid::operator+(double, const Tensor&);
%rename(rsub_scalar) braid::operator-(double, const Tensor&);
%rename(rmul_scalar) braid::operator*(double, const Tensor&);
%rename(rdiv_scalar) braid::operator/(double, const Tensor&);
%ignore braid::operator+(const Tensor&, const Tensor&);
%ignore braid::operator-(const Tensor&, const Tensor&);
%ignore braid::operator*(const Tensor&, const Tensor&);
%ignore braid::operator/(const Tensor&, const Tensor&);
%ignore braid::operator-(const Tensor&);

// The ops that Tensor's operators call: positional arguments only, which SWIG parses without the
// keyword machinery (a third of a small op's wrapper cost, benchmarks/README.md "Python overhead").
%feature("kwargs", "0") braid::add;
%feature("kwargs", "0") braid::sub;
%feature("kwargs", "0") braid::mul;
%feature("kwargs", "0") braid::div;
%feature("kwargs", "0") braid::neg;
%feature("kwargs", "0") braid::matmul;
%feature("kwargs", "0") braid::eq;
%feature("kwargs", "0") braid::ne;
%feature("kwargs", "0") braid::lt;
%feature("kwargs", "0") braid::le;
%feature("kwargs", "0") braid::gt;
%feature("kwargs", "0") braid::ge;
%feature("kwargs", "0") braid::operator+;
%feature("kwargs", "0") braid::operator-;
%feature("kwargs", "0") braid::operator*;
%feature("kwargs", "0") braid::operator/;
%feature("kwargs", "0") braid::relu;
%feature("kwargs", "0") braid::sigmoid;
%feature("kwargs", "0") braid::tanh;
%feature("kwargs", "0") braid::exp;

// A Tensor is a handle: Python's copy is the C++ copy constructor (same storage).
%copyctor braid::Tensor;

// ---- Python's operators on Tensor: the ops of ops.h, with PyTorch's typing of Python scalars ----
// Note [Python operands]
// The other operand of an operator is a Tensor, a Python or NumPy number, or a NumPy array; anything
// else makes the operator return NotImplemented (so Python tries the reflected one, then raises
// TypeError), while an error of the op itself (shapes, dtypes) is raised as usual. A number becomes a
// 0-d tensor typed as PyTorch types Python scalars: a bool is bool; an int follows Note [Type
// promotion]'s whole-number rule; a float keeps a floating tensor's dtype and makes an integer or bool
// tensor float32. Where the tensor-scalar overload (which sees only a double) gives that same dtype,
// it is used instead (`fast`).
%{
#include <cstring>
namespace braid_py {
struct Operand {
  braid::Tensor tensor;  // for a number, made on first use (the fast path needs none)
  double value = 0;
  bool number = false, fast = false;
  braid::DType dtype = braid::DType::Float32;
  braid::Device device = braid::Device::cpu();
  const braid::Tensor& get() {
    if (!tensor.defined()) tensor = braid::scalar_tensor(value, dtype, device);
    return tensor;
  }
};
inline bool is_type(PyObject* o, const char* a, const char* b = "") {
  const char* n = Py_TYPE(o)->tp_name;
  return std::strcmp(n, a) == 0 || std::strcmp(n, b) == 0;
}
// False when o is no operand (the caller returns NotImplemented); a Python error is left set.
inline bool operand(PyObject* o, const braid::Tensor& self, Operand* out, swig_type_info* type) {
  void* p = nullptr;
  bool builtin = PyBool_Check(o) || PyLong_Check(o) || PyFloat_Check(o);  // spares SWIG's failing lookup
  if (!builtin && SWIG_IsOK(SWIG_ConvertPtr(o, &p, type, 0)) && p != nullptr) {
    out->tensor = *static_cast<braid::Tensor*>(p);
    return true;
  }
  braid::DType dt = self.dtype();
  bool floating = braid::is_floating(dt);
  if (is_type(o, "numpy.ndarray")) {
    PyObject* mod = PyImport_ImportModule("braid");
    PyObject* r = mod ? PyObject_CallMethod(mod, "tensor", "O", o) : nullptr;
    Py_XDECREF(mod);
    bool ok = r != nullptr && SWIG_IsOK(SWIG_ConvertPtr(r, &p, type, 0)) && p != nullptr;
    if (ok) out->tensor = static_cast<braid::Tensor*>(p)->to(self.device());
    Py_XDECREF(r);
    return ok;
  }
  if (PyBool_Check(o) || is_type(o, "numpy.bool_", "numpy.bool")) {
    out->value = PyObject_IsTrue(o);
    dt = braid::DType::Bool;
    out->fast = floating;
  } else if (PyLong_Check(o) || (PyIndex_Check(o) && !PyFloat_Check(o))) {
    out->value = PyFloat_AsDouble(o);
    dt = braid::scalar_result_type(dt, out->value);
    out->fast = true;
  } else if (PyFloat_Check(o) || (PyNumber_Check(o) && !PyComplex_Check(o) && PyObject_HasAttrString(o, "__float__"))) {
    out->value = PyFloat_AsDouble(o);
    dt = floating ? dt : braid::DType::Float32;
    out->fast = floating;
  } else {
    return false;
  }
  if (PyErr_Occurred()) return false;
  out->number = true;
  out->dtype = dt;
  out->device = self.device();
  return true;
}
// &, |, ^ and ~: braid has no bitwise integer ops, and a logical result for integer operands, where
// PyTorch computes a bitwise one, would be silently wrong.
inline void check_bool(const braid::Tensor& a, const braid::Tensor& b, const char* op) {
  BRAID_CHECK_T(braid::TypeError, a.dtype() == braid::DType::Bool && b.dtype() == braid::DType::Bool, "'", op,
                "' is defined for bool tensors only (got ", braid::dtype_name(a.dtype()), " and ",
                braid::dtype_name(b.dtype()), "); braid has no bitwise integer ops");
}
// An in-place operator stores result into self, refusing a result of a wider kind (bool < integer < floating).
inline int kind(braid::DType t) { return t == braid::DType::Bool ? 0 : braid::is_floating(t) ? 2 : 1; }
inline braid::Tensor& store(braid::Tensor& self, const braid::Tensor& result) {
  BRAID_CHECK_T(braid::TypeError, kind(result.dtype()) <= kind(self.dtype()), "result type ",
                braid::dtype_name(result.dtype()), " cannot be stored in a ", braid::dtype_name(self.dtype()),
                " tensor in place");
  return self.copy_(result);
}
}  // namespace braid_py
%}
%typemap(in) braid_py::Operand OTHER (bool ok = false) {
  try {
    ok = braid_py::operand($input, *arg1, &$1, $descriptor(braid::Tensor*));
  } catch (...) {
    braid_py::set_python_error();
    SWIG_fail;
  }
  if (!ok) {
    if (PyErr_Occurred()) SWIG_fail;
    Py_INCREF(Py_NotImplemented);
    return Py_NotImplemented;
  }
}
// An in-place operator returns the Python object it was called on (`a += b` keeps `a is obj`), as
// requires_grad_ does (`t = braid.ones(2).requires_grad_()`).
%typemap(out) braid::Tensor& __iadd__, braid::Tensor& __isub__, braid::Tensor& __imul__, braid::Tensor& __itruediv__,
              braid::Tensor& __ipow__, braid::Tensor& requires_grad_ {
  $result = swig_obj[0];
  Py_INCREF($result);
}
// Positional only (the in-place typemap reads swig_obj), and errors of the op propagate rather than
// turning into NotImplemented (Note [Python operands]).
%define BRAID_OPERATOR_FEATURES(NAME)
%feature("kwargs", "0") braid::Tensor::NAME;
%feature("python:maybecall", "0") braid::Tensor::NAME;
%enddef
%define BRAID_OPERATOR_NAMES(NAME)
BRAID_OPERATOR_FEATURES(__ ## NAME ## __)
BRAID_OPERATOR_FEATURES(__r ## NAME ## __)
BRAID_OPERATOR_FEATURES(__i ## NAME ## __)
%enddef
BRAID_OPERATOR_NAMES(add) BRAID_OPERATOR_NAMES(sub) BRAID_OPERATOR_NAMES(mul) BRAID_OPERATOR_NAMES(truediv)
BRAID_OPERATOR_NAMES(pow) BRAID_OPERATOR_NAMES(and) BRAID_OPERATOR_NAMES(or) BRAID_OPERATOR_NAMES(xor)
BRAID_OPERATOR_NAMES(matmul) BRAID_OPERATOR_NAMES(eq) BRAID_OPERATOR_NAMES(ne) BRAID_OPERATOR_NAMES(lt)
BRAID_OPERATOR_NAMES(le) BRAID_OPERATOR_NAMES(gt) BRAID_OPERATOR_NAMES(ge)
BRAID_OPERATOR_FEATURES(requires_grad_)
%define BRAID_BINARY(NAME, FN, FAST, RFAST)
  braid::Tensor __ ## NAME ## __(braid_py::Operand OTHER) const { return OTHER.fast ? FAST : braid::FN(*$self, OTHER.get()); }
  braid::Tensor __r ## NAME ## __(braid_py::Operand OTHER) const { return OTHER.fast ? RFAST : braid::FN(OTHER.get(), *$self); }
  braid::Tensor& __i ## NAME ## __(braid_py::Operand OTHER) {
    return braid_py::store(*$self, OTHER.fast ? FAST : braid::FN(*$self, OTHER.get()));
  }
%enddef
%define BRAID_COMPARE(NAME)
  braid::Tensor __ ## NAME ## __(braid_py::Operand OTHER) const { return braid::NAME(*$self, OTHER.get()); }
%enddef
%define BRAID_LOGICAL(NAME, SYMBOL)
  braid::Tensor __ ## NAME ## __(braid_py::Operand OTHER) const {
    braid_py::check_bool(*$self, OTHER.get(), SYMBOL);
    return braid::logical_ ## NAME(*$self, OTHER.get());
  }
  braid::Tensor __r ## NAME ## __(braid_py::Operand OTHER) const {
    braid_py::check_bool(OTHER.get(), *$self, SYMBOL);
    return braid::logical_ ## NAME(OTHER.get(), *$self);
  }
%enddef
%extend braid::Tensor {
  BRAID_BINARY(add, add, *$self + OTHER.value, OTHER.value + *$self)
  BRAID_BINARY(sub, sub, *$self - OTHER.value, OTHER.value - *$self)
  BRAID_BINARY(mul, mul, *$self * OTHER.value, OTHER.value * *$self)
  BRAID_BINARY(truediv, div, *$self / OTHER.value, OTHER.value / *$self)
  BRAID_BINARY(pow, pow, braid::pow(*$self, OTHER.value), braid::pow(OTHER.get(), *$self))
  BRAID_COMPARE(eq)
  BRAID_COMPARE(ne)
  BRAID_COMPARE(lt)
  BRAID_COMPARE(le)
  BRAID_COMPARE(gt)
  BRAID_COMPARE(ge)
  BRAID_LOGICAL(and, "&")
  BRAID_LOGICAL(or, "|")
  BRAID_LOGICAL(xor, "^")
  braid::Tensor __matmul__(braid_py::Operand OTHER) const {
    BRAID_CHECK_T(braid::TypeError, !OTHER.number, "'@' needs a tensor operand, not a number");
    return braid::matmul(*$self, OTHER.get());
  }
  braid::Tensor __rmatmul__(braid_py::Operand OTHER) const {
    BRAID_CHECK_T(braid::TypeError, !OTHER.number, "'@' needs a tensor operand, not a number");
    return braid::matmul(OTHER.get(), *$self);
  }
  braid::Tensor& requires_grad_(bool requires_grad = true) { return $self->set_requires_grad(requires_grad); }
  // len(), bool() and operator.index() with PyTorch's errors for the tensors that have none.
  int64_t __len__() const {
    BRAID_CHECK_T(braid::TypeError, $self->dim() > 0, "len() of a 0-d tensor");
    return $self->size(0);
  }
  bool __bool__() const {
    BRAID_CHECK($self->numel() == 1, "the truth value of a tensor with shape ", braid::shape_str($self->shape()),
                " is ambiguous; use .any() or .all()");
    return $self->item() != 0;
  }
  int64_t __index__() const {
    BRAID_CHECK_T(braid::TypeError, !braid::is_floating($self->dtype()) && $self->numel() == 1,
                  "only integer tensors of a single element can be converted to an index");
    return static_cast<int64_t>($self->item());
  }
  braid::Tensor __neg__() const { return braid::neg(*$self); }
  braid::Tensor __abs__() const { return braid::abs(*$self); }
  braid::Tensor __invert__() const {
    braid_py::check_bool(*$self, *$self, "~");
    return braid::logical_not(*$self);
  }
}
// The axes of a reduction (ops.h's `dim`): None (every axis), one int, or a sequence of ints, as in
// PyTorch.
%{
namespace braid_py {
inline bool dims_arg(PyObject* o, std::vector<int64_t>* out) {
  out->clear();
  auto push = [out](PyObject* item) {
    PyObject* index = PyIndex_Check(item) ? PyNumber_Index(item) : nullptr;
    if (index != nullptr) out->push_back(PyLong_AsLongLong(index));
    Py_XDECREF(index);
    bool ok = index != nullptr && !PyErr_Occurred();
    PyErr_Clear();
    return ok;
  };
  if (o == Py_None) return true;
  if (PyIndex_Check(o)) return push(o);
  PyObject* seq = PySequence_Fast(o, "");
  bool ok = seq != nullptr;
  for (Py_ssize_t i = 0, n = ok ? PySequence_Fast_GET_SIZE(seq) : 0; ok && i < n; ++i) {
    ok = push(PySequence_Fast_GET_ITEM(seq, i));
  }
  Py_XDECREF(seq);
  PyErr_Clear();
  return ok;
}
}  // namespace braid_py
%}
%typemap(in) const std::vector<int64_t>& dim (std::vector<int64_t> v) {
  if (!braid_py::dims_arg($input, &v)) {
    SWIG_exception_fail(SWIG_TypeError, "in method '$symname', argument $argnum: expected an int, a sequence of ints or None");
  }
  $1 = &v;
}
%typemap(freearg) const std::vector<int64_t>& dim "";
%typemap(typecheck, precedence=SWIG_TYPECHECK_INT64_ARRAY) const std::vector<int64_t>& dim {
  std::vector<int64_t> v;
  $1 = braid_py::dims_arg($input, &v);
}
// requires_grad and is_leaf are tensor.h's accessors read (and requires_grad written) as attributes,
// as PyTorch's properties: t.requires_grad = True. (The accessors that return a Tensor or a Shape by
// value are properties in braid/_tensor.py: SWIG's attributes of such types point into the object.)
%include <attribute.i>
%attribute(braid::Tensor, bool, is_leaf, is_leaf);
%attribute(braid::Tensor, bool, requires_grad, requires_grad, set_requires_grad);
%include "braid/dtype.h"
%include "braid/device.h"
%include "braid/tensor.h"
%include "braid/random.h"
%include "braid/ops.h"
// conv.h's sizes per spatial axis: one int for both axes (3 is {3, 3}), a sequence, or None (empty:
// the documented default, e.g. stride = kernel_size), as PyTorch's int-or-pair arguments.
%{
namespace braid_py {
inline bool pair_arg(PyObject* o, std::vector<int64_t>* out) {
  out->clear();
  if (o == Py_None) return true;
  if (PyLong_Check(o)) {
    out->assign(2, PyLong_AsLongLong(o));
    return true;
  }
  if (!PySequence_Check(o) || PyUnicode_Check(o)) return false;
  for (Py_ssize_t i = 0, n = PySequence_Size(o); i < n; ++i) {
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
%typemap(in) const std::vector<int64_t>& PAIR (std::vector<int64_t> v) {
  if (!braid_py::pair_arg($input, &v)) {
    SWIG_exception_fail(SWIG_TypeError, "in method '$symname', argument $argnum: expected an int, a sequence of ints or None");
  }
  $1 = &v;
}
%typemap(freearg) const std::vector<int64_t>& PAIR "";  // v is a local, not new'ed
%typemap(typecheck, precedence=SWIG_TYPECHECK_INT64_ARRAY) const std::vector<int64_t>& PAIR {
  std::vector<int64_t> v;
  $1 = braid_py::pair_arg($input, &v);
}
%apply const std::vector<int64_t>& PAIR {
  const std::vector<int64_t>& kernel_size, const std::vector<int64_t>& stride, const std::vector<int64_t>& padding,
  const std::vector<int64_t>& dilation, const std::vector<int64_t>& output_padding,
  const std::vector<int64_t>& output_size
};
%include "braid/conv.h"
%clear const std::vector<int64_t>& kernel_size, const std::vector<int64_t>& stride, const std::vector<int64_t>& padding,
       const std::vector<int64_t>& dilation, const std::vector<int64_t>& output_padding,
       const std::vector<int64_t>& output_size;
// Python builds the items with the static functions (braid/_tensor.py's __getitem__).
%ignore braid::TensorIndex::Kind;
%ignore braid::TensorIndex::kind;
%ignore braid::TensorIndex::integer;
%ignore braid::TensorIndex::start;
%ignore braid::TensorIndex::stop;
%ignore braid::TensorIndex::step;
%ignore braid::TensorIndex::indices;
%template(TensorIndexVector) std::vector<braid::TensorIndex>;  // before index(), which takes it
%include "braid/indexing.h"
%include "braid/autograd.h"
%include "braid/parallel.h"
%include "braid/amp.h"
%ignore braid::print_config(std::ostream&);  // Python's print_config() writes to stdout
%template(KnobVector) std::vector<braid::Knob>;
%include "braid/knobs.h"
%ignore braid_py::PythonError;
%ignore braid_py::set_python_error;
%ignore braid_py::callback;
%ignore braid_py::Gil;
%ignore braid_py::held;
// These touch Python objects: the GIL stays held while they run.
%nothread braid_py::tensor_over_memory;
%nothread braid_py::to_dlpack;
%nothread braid_py::from_dlpack_capsule;
%nothread braid_py::dlpack_device;
%include "interop.h"
