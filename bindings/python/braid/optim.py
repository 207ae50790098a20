"""braid.optim: optimizers with PyTorch's keyword arguments and parameter groups, learning-rate
schedules, gradient clipping and the GradScaler (braid/optim/*.h).

    opt = braid.optim.Adam(model.parameters(), lr=1e-3, weight_decay=0.01)
    opt = braid.optim.SGD([{"params": backbone, "lr": 1e-4}, {"params": head}], lr=0.1, momentum=0.9)
"""

from ._swig import core as _core
from ._swig import optim as _optim
from ._tensor import Tensor

Optimizer = _optim.Optimizer
ParamGroup = _optim.ParamGroup
StepLR = _optim.StepLR
MultiStepLR = _optim.MultiStepLR
ExponentialLR = _optim.ExponentialLR
CosineWithWarmup = _optim.CosineWithWarmup
OneCycleLR = _optim.OneCycleLR
LRScheduler = _optim.LRScheduler
clip_grad_norm_ = _optim.clip_grad_norm_


def _options(options_cls, kwargs, who):
    opts = options_cls()
    known = [k for k in dir(opts) if not k.startswith("_") and k not in ("this", "thisown")]
    for key, value in kwargs.items():
        if key == "betas":
            opts.beta1, opts.beta2 = (float(b) for b in value)
            continue
        if key not in known:
            raise TypeError(f"{who}: unknown option '{key}'; known: {', '.join(sorted(known + ['betas']))}"
                            if hasattr(opts, "beta1") else f"{who}: unknown option '{key}'; known: {', '.join(sorted(known))}")
        setattr(opts, key, value)
    return opts


def _make(cls, options_cls):
    def factory(params, **kwargs):
        return cls(list(params), _options(options_cls, kwargs, cls.__name__))

    factory.__name__ = cls.__name__
    factory.__doc__ = (cls.__doc__ or "") + f"\n\nKeyword arguments: the fields of {options_cls.__name__}."
    return factory


SGD = _make(_optim.SGD, _optim.SGDOptions)
Adam = _make(_optim.Adam, _optim.AdamOptions)
AdamW = _make(_optim.AdamW, _optim.AdamWOptions)
RMSprop = _make(_optim.RMSprop, _optim.RMSpropOptions)
Adagrad = _make(_optim.Adagrad, _optim.AdagradOptions)


def _groups_as_dicts(self):
    return [dict(g.options.items(), params=list(g.params)) for g in _optim.Optimizer.param_groups(self)]


Optimizer.groups = _groups_as_dicts


def _state_dict(self):
    s = _optim.Optimizer.state_dict(self)
    return {"tensors": dict(s.tensors.items()), "scalars": dict(s.scalars.items())}


def _load_state_dict(self, state):
    s = _optim.OptimizerState()
    s.tensors = _optim.TensorMap(state["tensors"])
    s.scalars = _optim.DoubleMap(state["scalars"])
    _optim.Optimizer.load_state_dict(self, s)


Optimizer.state_dict = _state_dict
Optimizer.load_state_dict = _load_state_dict


def GradScaler(**kwargs):
    """Loss scaling for float16 training (torch.cuda.amp.GradScaler's defaults and keywords)."""
    return _optim.GradScaler(_options(_optim.GradScalerOptions, kwargs, "GradScaler"))
