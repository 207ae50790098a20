// braid._swig.distributed: the distributed runtime, process groups, DistributedDataParallel,
// SyncBatchNorm, pipeline stages and schedules, and the partitioner (braid/distributed/*.h).
%module(package="braid._swig") distributed

%include "braid.swg"

%{
#include "braid/distributed.h"
#include "braid/distributed/partition.h"
#include "braid/distributed/pipeline.h"
#include "braid/distributed/schedule.h"
#include "braid/nn/nn.h"
%}

%import "core.i"
%import "nn.i"

%shared_ptr(braid::distributed::ProcessGroup)
%shared_ptr(braid::distributed::Work)
%shared_ptr(braid::distributed::SyncBatchNorm)

// The loss of a pipeline's last stage: a Python callable (output, target) -> Tensor.
%{
namespace braid_py {
inline braid::distributed::PipeLoss pipe_loss(PyObject* callable) {
  BRAID_CHECK_T(braid::TypeError, PyCallable_Check(callable), "train_step: loss must be a callable (output, target) -> Tensor");
  Py_INCREF(callable);
  std::shared_ptr<PyObject> fn(callable, [](PyObject* o) {
    if (!Py_IsInitialized()) return;
    PyGILState_STATE s = PyGILState_Ensure();
    Py_DECREF(o);
    PyGILState_Release(s);
  });
  return [fn](const braid::Tensor& out, const braid::Tensor& target) {
    PyGILState_STATE s = PyGILState_Ensure();
    PyObject* a = SWIG_NewPointerObj(new braid::Tensor(out), SWIGTYPE_p_braid__Tensor, SWIG_POINTER_OWN);
    PyObject* b = SWIG_NewPointerObj(new braid::Tensor(target), SWIGTYPE_p_braid__Tensor, SWIG_POINTER_OWN);
    PyObject* r = PyObject_CallFunctionObjArgs(fn.get(), a, b, nullptr);
    Py_DECREF(a);
    Py_DECREF(b);
    if (r == nullptr) {
      braid_py::PythonError e;
      PyGILState_Release(s);
      throw e;
    }
    void* p = nullptr;
    int res = SWIG_ConvertPtr(r, &p, SWIGTYPE_p_braid__Tensor, 0);
    braid::Tensor loss = SWIG_IsOK(res) && p ? *static_cast<braid::Tensor*>(p) : braid::Tensor();
    Py_DECREF(r);
    PyGILState_Release(s);
    BRAID_CHECK_T(braid::TypeError, loss.defined(), "train_step: the loss callable must return a braid.Tensor");
    return loss;
  };
}
}  // namespace braid_py
%}
%typemap(in) const braid::distributed::PipeLoss& (braid::distributed::PipeLoss temp) {
  try {
    temp = braid_py::pipe_loss($input);
  } catch (...) {
    braid_py::set_python_error();
    SWIG_fail;
  }
  $1 = &temp;
}

%ignore braid::distributed::DistributedDataParallel::operator();
// The gradient-accumulation guard, as a class of its own (distributed.py's no_sync() holds one).
%feature("flatnested") braid::distributed::DistributedDataParallel::NoSync;
%rename(DataParallelNoSync) braid::distributed::DistributedDataParallel::NoSync;
%ignore braid::distributed::PipelineStage::Incoming;
%ignore braid::distributed::PipelineStage::operator();

%template(PipeActionVector) std::vector<braid::distributed::PipeAction>;
%template(LayerProfileVector) std::vector<braid::distributed::LayerProfile>;

%include "braid/distributed/process_group.h"
%include "braid/distributed/data_parallel.h"
%include "braid/distributed/schedule.h"
%include "braid/distributed/partition.h"
%include "braid/distributed/pipeline.h"
// Python picks signals with the signal module if it wants others; the default pair is what Slurm sends.
%ignore braid::distributed::catch_preemption_signals(const std::vector<int>&);
%include "braid/distributed/preemption.h"
