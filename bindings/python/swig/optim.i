// braid._swig.optim: optimizers, parameter groups, learning-rate schedules, gradient clipping and
// the GradScaler (braid/optim/*.h). braid/optim.py gives them PyTorch's keyword arguments.
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

%ignore braid::optim::Optimizer::param_groups() const;
%ignore braid::optim::Optimizer::state;
%ignore braid::optim::GradScaler::Record;

%include "braid/optim/optimizer.h"
%include "braid/optim/optimizers.h"
%include "braid/optim/lr_scheduler.h"
%include "braid/optim/grad_scaler.h"
