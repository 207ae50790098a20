"""braid.nn: layers, losses, containers and initialisers (braid/nn/*.h), and Module for models
written in Python.

The layer classes are the generated ones, with the headers' keyword arguments
(nn.Conv2d(1, 16, 3, padding=1, bias=False)). A Python class that subclasses nn.Module and assigns
layers and nn.Parameter objects as attributes registers them by name, as in PyTorch; its forward is
what C++ calls too, so it trains under optimizers, DistributedDataParallel and pipelines, saves to
checkpoints and exports to ONNX like a C++ module.
"""

import sys
import types

from . import _tensor
from ._swig import nn as _nn
from ._swig import _nn as _nx  # the extension: unbound Module_* functions, safe from the patches below
from ._swig import core as _core

Tensor = _tensor.Tensor
# The layers, losses and containers: every generated subclass of Module, by its C++ name.
for _name, _cls in list(vars(_nn).items()):
    if isinstance(_cls, type) and issubclass(_cls, _nn.Module):
        globals()[_name] = _cls


class Parameter(Tensor):
    """A tensor that a Module registers as a trainable parameter when it is assigned as an attribute.
    It shares data's memory (as torch.nn.Parameter)."""

    def __init__(self, data=None, requires_grad=True):
        if data is None:
            data = _core.empty((0,))
        Tensor.__init__(self, data.detach())
        self.requires_grad_(requires_grad)

    def __repr__(self):
        return "Parameter containing:\n" + Tensor.__repr__(self)


# ---- Module: the patches that give a module written in Python PyTorch's attribute rules ----
# Everything else (state_dict, named_modules, parameters, train/eval, training, repr) is the
# generated C++ API (braid/nn/module.h, swig/nn.i).


def _init(self, *args, **kwargs):
    """Sets up a module written in Python; call it first in a subclass's __init__ (super().__init__())."""
    if type(self) is _nn.Module:
        raise TypeError("nn.Module is abstract: subclass it and define forward()")
    object.__setattr__(self, "_py_attrs", {})
    _nx.Module_swiginit(self, _nx.new_Module(self, type(self).__name__))


def _setattr(self, name, value):
    """An attribute of a module written in Python that is a Parameter or a Module registers it under
    its name, and a Tensor assigned to a buffer's name replaces the buffer, as in PyTorch."""
    if name.startswith("_") or name in ("this", "thisown") or type(self).__module__.startswith("braid._swig"):
        object.__setattr__(self, name, value)  # private and SWIG's state, or a C++ layer: no registration
        return
    attrs = self.__dict__.get("_py_attrs")
    if attrs is None:
        raise AttributeError(f"cannot assign '{name}' before Module.__init__() (call super().__init__() first)")
    old = attrs.get(name)
    is_buffer = any(n == name for n, _ in _nx.Module_named_buffers(self, False))
    if isinstance(value, Parameter) and isinstance(old, Tensor):
        # A re-assigned parameter keeps its registration: the registered tensor (what forward and the
        # optimizer hold) takes the new values.
        self.load_state_dict({name: value}, strict=False)
        return
    if isinstance(value, Parameter):
        self.register_parameter(name, value, value.requires_grad)
        object.__setattr__(self, name, value)
    elif isinstance(value, _nn.Module):
        if isinstance(old, _nn.Module):
            self.replace_child(name, value)
        else:
            self.register_module(name, value)
        # Read back through C++ (__getattr__ -> named_children()), so that a child that C++ replaced
        # (convert_sync_batchnorm, replace_child) is the one forward calls.
        self.__dict__.pop(name, None)
    elif isinstance(value, Tensor) and is_buffer:
        self.set_buffer(name, value)
        return
    elif old is not None or is_buffer:
        kind = "module" if isinstance(old, _nn.Module) else "parameter" if old is not None else "buffer"
        raise TypeError(f"cannot assign {type(value).__name__} to '{name}', a registered {kind}")
    else:
        object.__setattr__(self, name, value)
        return
    attrs[name] = value  # keeps a Python module alive as long as its parent


def _getattr(self, name):
    # Only called when normal lookup fails: a child, parameter or buffer of the module by name.
    if name.startswith("__") or name in ("this", "thisown", "_py_attrs"):
        raise AttributeError(name)
    params = _nx.Module_named_parameters(self, False)
    for n, v in _nx.Module_named_children(self) + params + _nx.Module_named_buffers(self, False):
        if n == name:
            return v
    if name == "bias" and any(n == "weight" for n, _ in params):
        return None  # a layer built with bias=False, as in PyTorch
    raise AttributeError(f"'{type(self).__name__}' has no attribute, child, parameter or buffer '{name}'")


def _to(self, *args, device=None, dtype=None):
    """Moves or converts every parameter and buffer in place (to(device), to(dtype), both); returns self."""
    for a in args:
        if isinstance(a, (_core.Device, str)):
            device = a
        else:
            dtype = a
    if device is not None:
        _nx.Module_to(self, device)
    if dtype is not None:
        _nx.Module_to(self, dtype)
    return self


def _apply(self, fn):
    """Calls fn on every descendant, then on the module itself (as PyTorch's); returns self."""
    for m in self.children():
        m.apply(fn)
    fn(self)
    return self


_nn.Module.__init__ = _init
_nn.Module.__setattr__ = _setattr
_nn.Module.__getattr__ = _getattr
_nn.Module.__call__ = lambda self, *args, **kwargs: self.forward(*args, **kwargs)
_nn.Module.to = _to
_nn.Module.apply = _apply
_nn.Module.cpu = lambda self: self.to("cpu")
_nn.Module.cuda = lambda self, index=0: self.to(f"cuda:{index}")
_nn.Module.float = lambda self: self.to(_tensor.dtype.float32)
_nn.Module.double = lambda self: self.to(_tensor.dtype.float64)

# ---- containers: C++ holds the modules, the container's Python twin keeps Python ones alive ----
# (Note [Python objects that C++ holds] in swig/braid.swg)


def _sequential_init(self, *modules):
    """Sequential(m1, m2, ...) or Sequential(OrderedDict(name=module, ...))."""
    _nx.Sequential_swiginit(self, _nx.new_Sequential())
    if len(modules) == 1 and isinstance(modules[0], dict):
        for name, m in modules[0].items():
            self.append(m, name)
    else:
        for m in modules:
            self.append(m)


def _module_list_init(self, modules=()):
    _nx.ModuleList_swiginit(self, _nx.new_ModuleList())
    for m in modules:
        self.append(m)


def _append(self, module, *name):
    """Appends module (named by its position, or name for a Sequential); returns self."""
    self.add(module, *name)
    self.__dict__.setdefault("_py_attrs", {})[len(self) - 1] = module
    return self


_nn.Sequential.__init__ = _sequential_init
_nn.ModuleList.__init__ = _module_list_init
_nn.Sequential.append = _append
_nn.ModuleList.append = _append

# ---- nn.functional and nn.init, as submodules ----

functional = types.ModuleType("braid.nn.functional", "Layers as functions (braid/nn/*.h, braid/conv.h, braid/ops.h).")
for _name in ("cross_entropy", "nll_loss", "mse_loss", "l1_loss", "smooth_l1_loss", "binary_cross_entropy_with_logits",
              "linear", "dropout"):
    setattr(functional, _name, getattr(_nn, _name))
for _name in ("relu", "leaky_relu", "elu", "silu", "gelu", "sigmoid", "tanh", "softplus", "hardswish", "hardsigmoid",
              "softmax", "log_softmax", "conv1d", "conv2d", "conv_transpose2d", "max_pool2d", "avg_pool2d",
              "adaptive_avg_pool2d", "pad", "one_hot"):
    setattr(functional, _name, getattr(_core, _name))


sys.modules["braid.nn.functional"] = functional

init = types.ModuleType("braid.nn.init", "Weight initialisers, as torch.nn.init (braid/nn/init.h).")
for _name in ("calculate_gain", "calculate_fan_in_and_fan_out", "uniform_", "normal_", "constant_", "zeros_", "ones_",
              "kaiming_uniform_", "kaiming_normal_", "xavier_uniform_", "xavier_normal_"):
    setattr(init, _name, getattr(_nn, _name))
sys.modules["braid.nn.init"] = init
