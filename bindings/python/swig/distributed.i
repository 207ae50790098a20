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

%shared_ptr(braid::distributed::ProcessGroup) %shared_ptr(braid::distributed::Work) %shared_ptr(braid::distributed::SyncBatchNorm)
%shared_ptr(braid::distributed::CommHook) %shared_ptr(braid::distributed::TopKHook) %shared_ptr(braid::distributed::PowerSGDHook) %shared_ptr(braid::distributed::HierarchicalGroup)

// The loss of a pipeline's last stage: a Python callable (output, target) -> Tensor.
%{
namespace braid_py {
inline braid::distributed::PipeLoss pipe_loss(PyObject* callable) {
  BRAID_CHECK_T(braid::TypeError, PyCallable_Check(callable), "train_step: loss must be a callable (output, target) -> Tensor");
  return [fn = held(callable)](const braid::Tensor& out, const braid::Tensor& target) {
    braid::Tensor loss;
    {
      Gil gil;
      PyObject* a = SWIG_NewPointerObj(new braid::Tensor(out), SWIGTYPE_p_braid__Tensor, SWIG_POINTER_OWN);
      PyObject* b = SWIG_NewPointerObj(new braid::Tensor(target), SWIGTYPE_p_braid__Tensor, SWIG_POINTER_OWN);
      PyObject* r = PyObject_CallFunctionObjArgs(fn.get(), a, b, nullptr);
      Py_DECREF(a);
      Py_DECREF(b);
      if (r == nullptr) throw PythonError();  // made while the GIL is held
      void* p = nullptr;
      if (SWIG_IsOK(SWIG_ConvertPtr(r, &p, SWIGTYPE_p_braid__Tensor, 0)) && p != nullptr) loss = *static_cast<braid::Tensor*>(p);
      Py_DECREF(r);
    }
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

BRAID_KEYWORD_OPTIONS(braid::distributed::InitOptions) BRAID_KEYWORD_OPTIONS(braid::distributed::DataParallelOptions) BRAID_KEYWORD_OPTIONS(braid::distributed::LocalSGDOptions) BRAID_KEYWORD_OPTIONS(braid::distributed::JoinOptions)
BRAID_KEYWORD_OPTIONS(braid::distributed::PipelineOptions) BRAID_KEYWORD_OPTIONS(braid::distributed::TopKOptions) BRAID_KEYWORD_OPTIONS(braid::distributed::PowerSGDOptions) BRAID_KEYWORD_OPTIONS(braid::distributed::ParameterServerOptions) BRAID_KEYWORD_OPTIONS(braid::distributed::HierarchicalOptions)

// Note [Python objects that C++ holds] (braid.swg): the module that a DistributedDataParallel or a
// PipelineStage holds keeps its Python object alive until the C++ object is destroyed, which is
// after it has detached from the module. Neither is reachable from the module, so this makes no cycle.
%{
namespace braid_py {
inline std::shared_ptr<braid::nn::Module> holding(std::shared_ptr<braid::nn::Module> m, PyObject* owner) {
  auto both = std::make_shared<std::pair<std::shared_ptr<braid::nn::Module>, std::shared_ptr<PyObject>>>(m, held(owner));
  return std::shared_ptr<braid::nn::Module>(both, m.get());
}
}  // namespace braid_py
%}
%typemap(in) std::shared_ptr<braid::nn::Module> module (void* argp = nullptr, int res = 0, int newmem = 0) {
  res = SWIG_ConvertPtrAndOwn($input, &argp, $descriptor(std::shared_ptr<braid::nn::Module>*), 0, &newmem);
  if (!SWIG_IsOK(res) || argp == nullptr) {
    SWIG_exception_fail(SWIG_ArgError(res), "in method '$symname', argument $argnum: expected a braid.nn.Module");
  }
  $1 = braid_py::holding(*static_cast<std::shared_ptr<braid::nn::Module>*>(argp), $input);
  if (newmem & SWIG_CAST_NEW_MEMORY) delete static_cast<std::shared_ptr<braid::nn::Module>*>(argp);
}

%ignore braid::distributed::DistributedDataParallel::operator();
// The gradient-accumulation guard, as a class of its own (distributed.py's no_sync() holds one).
%feature("flatnested") braid::distributed::DistributedDataParallel::NoSync;
%rename(DataParallelNoSync) braid::distributed::DistributedDataParallel::NoSync;
%ignore braid::distributed::PipelineOptions::sharded;  // no Python ShardedDataParallel yet
%ignore braid::distributed::PipelineStage::Incoming; %ignore braid::distributed::PipelineStage::operator();

%template(PipeActionVector) std::vector<braid::distributed::PipeAction>; %template(LayerProfileVector) std::vector<braid::distributed::LayerProfile>;
%template(StringVectors) std::vector<std::vector<std::string>>;  // bucket_names(): a tuple of tuples

%include "braid/distributed/process_group.h"
%include "braid/distributed/comm_hooks.h"
%ignore braid::distributed::HierarchicalGroup::HierarchicalGroup; %include "braid/distributed/hierarchical.h"
%include "braid/distributed/data_parallel.h"
%include "braid/distributed/local_sgd.h"
%ignore braid::distributed::ParameterServer::ParameterServer(std::shared_ptr<nn::Module>, const OptimizerFactory&, ProcessGroupPtr, const ParameterServerOptions&); %ignore braid::distributed::ParameterServer::on_server_step; %ignore braid::distributed::ParameterServer::server_optimizer;
%template(PullRecordVector) std::vector<braid::distributed::PullRecord>; %include "braid/distributed/parameter_server.h"
%include "braid/distributed/schedule.h" %include "braid/distributed/partition.h" %include "braid/distributed/pipeline.h"
// Python picks signals with the signal module if it wants others; the default pair is what Slurm sends.
%ignore braid::distributed::catch_preemption_signals(const std::vector<int>&);
%include "braid/distributed/preemption.h"
