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

// The tensor-scalar operators; braid/_tensor.py turns them into __add__ and friends.
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
%feature("kwargs", "0") braid::sum;

// A Tensor is a handle: Python's copy is the C++ copy constructor (same storage).
%copyctor braid::Tensor;

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
// These touch Python objects: the GIL stays held while they run.
%nothread braid_py::tensor_over_memory;
%nothread braid_py::to_dlpack;
%nothread braid_py::from_dlpack_capsule;
%nothread braid_py::dlpack_device;
%include "interop.h"
