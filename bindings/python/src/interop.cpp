// Exceptions across the language boundary, tensors over NumPy and DLPack memory, and callbacks
// into Python (see interop.h). No NumPy header is used: arrays are reached through the array
// interface, so one build of the module imports under NumPy 1.x and 2.x alike.
#include "interop.h"

#include <dlpack/dlpack.h>

#include <new>
#include <utility>

#include "braid/error.h"

namespace braid_py {

namespace {

// Drops a reference with the GIL held, unless the interpreter is already gone (a tensor that a
// static or a leaked C++ object keeps past Py_Finalize).
void release_reference(PyObject* o) {
  if (o == nullptr || !Py_IsInitialized()) return;
  Gil gil;
  Py_DECREF(o);
}

std::string describe_current_error() {
  // Called with an error set; leaves it set.
  PyObject *type, *value, *tb;
  PyErr_Fetch(&type, &value, &tb);
  PyErr_NormalizeException(&type, &value, &tb);
  std::string msg = "Python exception";
  if (value != nullptr) {
    if (PyObject* s = PyObject_Str(value)) {
      const char* name = type != nullptr ? reinterpret_cast<PyTypeObject*>(type)->tp_name : "Exception";
      const char* text = PyUnicode_AsUTF8(s);
      msg = std::string(name) + ": " + (text != nullptr ? text : "");
      Py_DECREF(s);
    }
    PyErr_Clear();
  }
  PyErr_Restore(type, value, tb);
  return msg;
}

}  // namespace

struct PythonError::Saved {
  PyObject* type = nullptr;
  PyObject* value = nullptr;
  PyObject* traceback = nullptr;
  ~Saved() {
    release_reference(type);
    release_reference(value);
    release_reference(traceback);
  }
};

PythonError::PythonError() : braid::Error(describe_current_error()), saved_(std::make_shared<Saved>()) {
  PyErr_Fetch(&saved_->type, &saved_->value, &saved_->traceback);
}

void PythonError::restore() const {
  // PyErr_Restore steals references; the saved ones stay for another restore.
  Py_XINCREF(saved_->type);
  Py_XINCREF(saved_->value);
  Py_XINCREF(saved_->traceback);
  PyErr_Restore(saved_->type, saved_->value, saved_->traceback);
}

void set_python_error() {
  try {
    throw;
  } catch (const PythonError& e) {
    e.restore();
  } catch (const braid::ValueError& e) {
    PyErr_SetString(PyExc_ValueError, e.what());
  } catch (const braid::IndexError& e) {
    PyErr_SetString(PyExc_IndexError, e.what());
  } catch (const braid::TypeError& e) {
    PyErr_SetString(PyExc_TypeError, e.what());
  } catch (const braid::NotImplementedError& e) {
    PyErr_SetString(PyExc_NotImplementedError, e.what());
  } catch (const std::bad_alloc&) {
    PyErr_SetString(PyExc_MemoryError, "braid: out of memory");
  } catch (const std::exception& e) {
    // braid::DistributedError, braid::Error and anything from the standard library.
    PyErr_SetString(PyExc_RuntimeError, e.what());
  } catch (...) {
    PyErr_SetString(PyExc_RuntimeError, "braid: unknown C++ exception");
  }
}

braid::Tensor tensor_over_memory(PyObject* owner, uintptr_t data, const braid::Shape& shape,
                                 const braid::Shape& byte_strides, braid::DType dtype) {
  const int64_t esize = braid::dtype_size(dtype);
  braid::Shape strides = braid::contiguous_strides(shape);
  int64_t extent = shape.empty() ? 1 : 0;  // elements spanned, from the first to one past the last
  if (!byte_strides.empty()) {
    BRAID_CHECK(byte_strides.size() == shape.size(), "from_numpy: ", byte_strides.size(), " strides for shape ",
                braid::shape_str(shape));
    for (size_t i = 0; i < shape.size(); ++i) {
      BRAID_CHECK(byte_strides[i] >= 0, "from_numpy: the array has a negative stride (", byte_strides[i],
                  " bytes on axis ", i, "), which braid's tensors cannot view; pass a copy (a.copy())");
      BRAID_CHECK(byte_strides[i] % esize == 0, "from_numpy: stride ", byte_strides[i], " bytes on axis ", i,
                  " is not a multiple of the ", esize, "-byte element");
      strides[i] = byte_strides[i] / esize;
    }
  }
  int64_t numel = braid::shape_numel(shape, "from_numpy");
  if (numel > 0) {
    extent = 1;
    for (size_t i = 0; i < shape.size(); ++i) extent += (shape[i] - 1) * strides[i];
  } else {
    extent = 0;
  }
  Py_INCREF(owner);
  auto storage = braid::Storage::wrap(reinterpret_cast<void*>(data), extent * esize, braid::Device::cpu(),
                                      [owner] { release_reference(owner); });
  auto impl = std::make_shared<braid::TensorImpl>();
  impl->storage = std::move(storage);
  impl->shape = shape;
  impl->strides = std::move(strides);
  impl->dtype = dtype;
  return braid::Tensor(std::move(impl));
}

// ---- DLPack ----

namespace {

// DLPack 0.8 added kDLBool; Debian 12's header is 0.6, so its code is spelled out.
constexpr uint8_t kDLBoolCode = 6;

// Note [DLPack 1.0 without its header]
// NumPy 2 asks for DLPack 1.0's versioned capsule and marks the array it makes from a legacy one
// read-only. Debian 12's dlpack.h is 0.6, which predates the versioned struct, so its layout (the
// ABI that dlpack.h 1.0 defines: version, manager_ctx, deleter, flags, then a DLTensor unchanged
// since 0.6) is written out here; replace it with the header's once Debian ships 1.0.
struct DLPackVersion10 {
  uint32_t major;
  uint32_t minor;
};
struct DLManagedTensorVersioned10 {
  DLPackVersion10 version;
  void* manager_ctx;
  void (*deleter)(DLManagedTensorVersioned10* self);
  uint64_t flags;
  DLTensor dl_tensor;
};
constexpr uint64_t kDLFlagBitmaskReadOnly = 1ULL << 0;

DLDataType dl_dtype(braid::DType t) {
  switch (t) {
    case braid::DType::Float32: return {kDLFloat, 32, 1};
    case braid::DType::Float64: return {kDLFloat, 64, 1};
    case braid::DType::Float16: return {kDLFloat, 16, 1};
    case braid::DType::BFloat16: return {kDLBfloat, 16, 1};
    case braid::DType::Int64: return {kDLInt, 64, 1};
    case braid::DType::Int32: return {kDLInt, 32, 1};
    case braid::DType::Bool: return {kDLBoolCode, 8, 1};
    case braid::DType::Int8:
      return {kDLInt, 8, 1};
    case braid::DType::UInt8:
      return {kDLUInt, 8, 1};
  }
  throw braid::TypeError("to_dlpack: unknown dtype");
}

braid::DType braid_dtype(const DLDataType& t) {
  BRAID_CHECK_T(braid::TypeError, t.lanes == 1, "from_dlpack: vector types (", int(t.lanes), " lanes) are not supported");
  if (t.code == kDLFloat && t.bits == 32) return braid::DType::Float32;
  if (t.code == kDLFloat && t.bits == 64) return braid::DType::Float64;
  if (t.code == kDLFloat && t.bits == 16) return braid::DType::Float16;
  if (t.code == kDLBfloat && t.bits == 16) return braid::DType::BFloat16;
  if (t.code == kDLInt && t.bits == 64) return braid::DType::Int64;
  if (t.code == kDLInt && t.bits == 32) return braid::DType::Int32;
  if (t.code == kDLBoolCode && t.bits == 8) return braid::DType::Bool;
  if (t.code == kDLInt && t.bits == 8) return braid::DType::Int8;
  if (t.code == kDLUInt && t.bits == 8) return braid::DType::UInt8;
  throw braid::TypeError(
      braid::detail::cat("from_dlpack: DLPack type code ", int(t.code), " with ", int(t.bits),
                         " bits has no braid dtype (float16/32/64, bfloat16, int8/32/64, uint8, bool)"));
}

DLDevice dl_device(braid::Device d) {
  switch (d.type) {
    case braid::DeviceType::CPU: return {kDLCPU, 0};
    case braid::DeviceType::CUDA: return {kDLCUDA, d.index};
    case braid::DeviceType::Shadow: break;
  }
  throw braid::TypeError(braid::detail::cat("__dlpack__: a tensor on ", d.str(),
                                            " cannot be shared through DLPack; copy it with .cpu() first"));
}

braid::Device braid_device(const DLDevice& d) {
  if (d.device_type == kDLCPU) return braid::Device::cpu();
  if (d.device_type == kDLCUDA) return braid::Device::cuda(d.device_id);
  throw braid::TypeError(braid::detail::cat("from_dlpack: DLPack device type ", int(d.device_type),
                                            " is neither the CPU (1) nor CUDA (2)"));
}

// What a capsule's managed tensor owns: the tensor handle that keeps the memory alive, and the
// shape and strides arrays DLPack points into. One of the two managed structs is handed out.
struct Export {
  braid::Tensor tensor;
  std::vector<int64_t> shape, strides;
  DLManagedTensor managed{};
  DLManagedTensorVersioned10 versioned{};
};

void delete_export(DLManagedTensor* m) { delete static_cast<Export*>(m->manager_ctx); }
void delete_versioned_export(DLManagedTensorVersioned10* m) { delete static_cast<Export*>(m->manager_ctx); }

// A capsule that nobody consumed still owns its tensor; a consumed one is renamed "used_...".
void capsule_destructor(PyObject* capsule) {
  if (PyCapsule_IsValid(capsule, "dltensor")) {
    auto* m = static_cast<DLManagedTensor*>(PyCapsule_GetPointer(capsule, "dltensor"));
    if (m != nullptr && m->deleter != nullptr) m->deleter(m);
  }
}
void versioned_capsule_destructor(PyObject* capsule) {
  if (PyCapsule_IsValid(capsule, "dltensor_versioned")) {
    auto* m = static_cast<DLManagedTensorVersioned10*>(PyCapsule_GetPointer(capsule, "dltensor_versioned"));
    if (m != nullptr && m->deleter != nullptr) m->deleter(m);
  }
}

}  // namespace

PyObject* to_dlpack(const braid::Tensor& t, bool versioned) {
  auto* e = new Export{t, t.shape(), t.strides(), {}, {}};
  DLTensor& dl = versioned ? e->versioned.dl_tensor : e->managed.dl_tensor;
  try {
    dl.device = dl_device(t.device());
    dl.dtype = dl_dtype(t.dtype());
  } catch (...) {
    delete e;
    throw;
  }
  dl.data = reinterpret_cast<void*>(t.data_ptr());
  dl.ndim = static_cast<int32_t>(t.dim());
  dl.shape = e->shape.data();
  dl.strides = e->strides.data();
  dl.byte_offset = 0;
  PyObject* capsule;
  if (versioned) {
    e->versioned.version = {1, 0};
    e->versioned.manager_ctx = e;
    e->versioned.deleter = delete_versioned_export;
    e->versioned.flags = 0;  // writable
    capsule = PyCapsule_New(&e->versioned, "dltensor_versioned", versioned_capsule_destructor);
  } else {
    e->managed.manager_ctx = e;
    e->managed.deleter = delete_export;
    capsule = PyCapsule_New(&e->managed, "dltensor", capsule_destructor);
  }
  if (capsule == nullptr) delete e;
  return capsule;
}

braid::Tensor from_dlpack_capsule(PyObject* capsule) {
  const bool versioned = PyCapsule_IsValid(capsule, "dltensor_versioned");
  BRAID_CHECK_T(braid::TypeError, versioned || PyCapsule_IsValid(capsule, "dltensor"),
                "from_dlpack: expected an unused DLPack capsule ('dltensor' or 'dltensor_versioned')");
  DLManagedTensor* m = nullptr;
  DLManagedTensorVersioned10* mv = nullptr;
  if (versioned) {
    mv = static_cast<DLManagedTensorVersioned10*>(PyCapsule_GetPointer(capsule, "dltensor_versioned"));
    BRAID_CHECK_T(braid::TypeError, mv->version.major == 1, "from_dlpack: DLPack ", mv->version.major, ".",
                  mv->version.minor, " is not supported (braid reads 0.x and 1.x)");
  } else {
    m = static_cast<DLManagedTensor*>(PyCapsule_GetPointer(capsule, "dltensor"));
  }
  const DLTensor& dl = versioned ? mv->dl_tensor : m->dl_tensor;
  const braid::DType dtype = braid_dtype(dl.dtype);
  const braid::Device device = braid_device(dl.device);
  braid::Shape shape(dl.shape, dl.shape + dl.ndim);
  braid::Shape strides = dl.strides != nullptr ? braid::Shape(dl.strides, dl.strides + dl.ndim)
                                               : braid::contiguous_strides(shape);
  const int64_t esize = braid::dtype_size(dtype);
  BRAID_CHECK(dl.byte_offset % esize == 0, "from_dlpack: byte_offset ", dl.byte_offset, " is not a multiple of the ",
              esize, "-byte element");
  int64_t extent = 0;
  if (braid::shape_numel(shape, "from_dlpack") > 0) {
    extent = 1;
    for (size_t i = 0; i < shape.size(); ++i) {
      BRAID_CHECK(strides[i] >= 0, "from_dlpack: negative stride ", strides[i], " on axis ", i,
                  " cannot be viewed by braid; pass a copy");
      extent += (shape[i] - 1) * strides[i];
    }
  }
  char* base = static_cast<char*>(dl.data);
  const int64_t offset = static_cast<int64_t>(dl.byte_offset) / esize;
  // From here the producer's memory belongs to braid's storage: its release calls the deleter.
  PyCapsule_SetName(capsule, versioned ? "used_dltensor_versioned" : "used_dltensor");
  auto storage = braid::Storage::wrap(base, (offset + extent) * esize, device, [m, mv] {
    if (!Py_IsInitialized()) return;
    Gil gil;  // a Python producer's deleter drops Python references
    if (m != nullptr && m->deleter != nullptr) m->deleter(m);
    if (mv != nullptr && mv->deleter != nullptr) mv->deleter(mv);
  });
  auto impl = std::make_shared<braid::TensorImpl>();
  impl->storage = std::move(storage);
  impl->shape = std::move(shape);
  impl->strides = std::move(strides);
  impl->offset = offset;
  impl->dtype = dtype;
  braid::Tensor t(std::move(impl));
  if (versioned && (mv->flags & kDLFlagBitmaskReadOnly) != 0) return t.clone();  // read-only: a copy
  return t;
}

PyObject* dlpack_device(const braid::Tensor& t) {
  DLDevice d = dl_device(t.device());
  return Py_BuildValue("(ii)", static_cast<int>(d.device_type), static_cast<int>(d.device_id));
}

std::shared_ptr<PyObject> held(PyObject* o) {
  Py_INCREF(o);
  return {o, release_reference};
}

std::function<void()> callback(PyObject* callable) {
  BRAID_CHECK_T(braid::TypeError, PyCallable_Check(callable), "expected a callable, got ",
                Py_TYPE(callable)->tp_name);
  return [fn = held(callable)] {
    Gil gil;
    PyObject* r = PyObject_CallNoArgs(fn.get());
    if (r == nullptr) throw PythonError();
    Py_DECREF(r);
  };
}

}  // namespace braid_py
