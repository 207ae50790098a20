// What the Python bindings need beyond braid's own API: turning C++ exceptions into Python ones and
// back, tensors that share memory with NumPy arrays and DLPack capsules, and C++ callbacks that call
// Python. SWIG wraps the functions declared here (swig/core.i %includes this header); everything
// else in the module is generated from braid's public headers.
#pragma once

#include <Python.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "braid/tensor.h"

namespace braid_py {

/// A Python exception caught on its way through C++ frames (raised in a Python forward, a Dataset's
/// get or a callback): C++ code unwinds as for any braid::Error, and the wrapper that returns to
/// Python raises the original exception object again, traceback included.
class PythonError : public braid::Error {
 public:
  /// Takes the Python error currently set (the GIL must be held).
  PythonError();
  /// Sets the saved exception as the current Python error (the GIL must be held).
  void restore() const;

 private:
  struct Saved;
  std::shared_ptr<Saved> saved_;
};

/// Sets the Python error that matches the C++ exception being handled: braid's ValueError,
/// IndexError, TypeError and NotImplementedError as Python's, DistributedError and other braid
/// errors as RuntimeError, std::bad_alloc as MemoryError, a PythonError as itself. Call it from a
/// catch block with the GIL held.
void set_python_error();

/// A CPU tensor over memory that owner (a NumPy array, a buffer) keeps alive: the tensor holds a
/// reference to owner until its storage is gone. byte_strides may be empty (row-major).
braid::Tensor tensor_over_memory(PyObject* owner, uintptr_t data, const braid::Shape& shape,
                                 const braid::Shape& byte_strides, braid::DType dtype);

/// A DLPack capsule over t's memory that keeps t alive until the consumer's deleter runs: DLPack
/// 1.0's "dltensor_versioned" (writable) when versioned, else the legacy "dltensor".
PyObject* to_dlpack(const braid::Tensor& t, bool versioned = false);
/// The tensor over a DLPack capsule's memory ("dltensor" or "dltensor_versioned"), which the
/// capsule's producer keeps alive until braid calls its deleter; the capsule is marked used, as the
/// protocol requires. A producer's read-only tensor is copied (braid's tensors are all writable).
braid::Tensor from_dlpack_capsule(PyObject* capsule);
/// (device_type, device_id) in DLPack's codes, for __dlpack_device__.
PyObject* dlpack_device(const braid::Tensor& t);

/// Holds the GIL for a scope, from any thread (the DataLoader's prefetch thread, a backward hook).
struct Gil {
  PyGILState_STATE state = PyGILState_Ensure();
  ~Gil() { PyGILState_Release(state); }
};

/// A new reference to o that C++ may keep, copy and drop on any thread: the last copy to go drops
/// it with the GIL held (unless the interpreter is already gone). What C++ holds of a Python
/// dataset, module, stream or callable (Note [Python objects that C++ holds] in swig/braid.swg).
std::shared_ptr<PyObject> held(PyObject* o);

/// A C++ callback that calls callable with no arguments, taking the GIL; a Python exception it
/// raises arrives in C++ as a PythonError.
std::function<void()> callback(PyObject* callable);

}  // namespace braid_py
