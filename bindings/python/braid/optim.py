"""braid.optim: optimizers with PyTorch's keyword arguments and parameter groups, learning-rate
schedules, gradient clipping and the GradScaler (braid/optim/*.h).

    opt = braid.optim.Adam(model.parameters(), lr=1e-3, weight_decay=0.01)
    opt = braid.optim.SGD([{"params": backbone, "lr": 1e-4}, {"params": head}], lr=0.1, momentum=0.9)
"""

from ._swig import optim as _optim

Optimizer = _optim.Optimizer
ParamGroup = _optim.ParamGroup
StepLR = _optim.StepLR
MultiStepLR = _optim.MultiStepLR
ExponentialLR = _optim.ExponentialLR
CosineWithWarmup = _optim.CosineWithWarmup
OneCycleLR = _optim.OneCycleLR
LRScheduler = _optim.LRScheduler
clip_grad_norm_ = _optim.clip_grad_norm_
# The options structs' fields are their keywords (Note [Options as keywords] in typemaps.swg).
SGD = _optim.SGD
Adam = _optim.Adam
AdamW = _optim.AdamW
RMSprop = _optim.RMSprop
Adagrad = _optim.Adagrad
GradScaler = _optim.GradScaler  # torch.cuda.amp.GradScaler's defaults and keywords


def _groups_as_dicts(self):
    return [dict(g.options.items(), params=list(g.params)) for g in _optim.Optimizer.param_groups(self)]


Optimizer.groups = _groups_as_dicts

