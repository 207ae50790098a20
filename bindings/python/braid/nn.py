"""braid.nn: layers, losses, containers and initialisers (braid/nn/*.h), and Module for models
written in Python.

The layer classes are the generated ones, with the headers' keyword arguments
(nn.Conv2d(1, 16, 3, padding=1, bias=False)). A Python class that subclasses nn.Module and assigns
layers and nn.Parameter objects as attributes registers them by name, as in PyTorch; its forward is
what C++ calls too, so it trains under optimizers, DistributedDataParallel and pipelines, saves to
checkpoints and exports to ONNX like a C++ module.
"""

import collections
import sys
import types

import numpy as np

from . import _tensor
from ._swig import nn as _nn
from ._swig import _nn as _nx  # the extension: unbound Module_* functions, safe from the patches below
from ._swig import core as _core

Tensor = _tensor.Tensor
Module = _nn.Module


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


# ---- Module: the patches that give every module, C++ or Python, PyTorch's Python interface ----

_module_init = _nn.Module.__init__


def _is_python_module(m):
    """Whether m's class was written in Python (a director: C++ calls its Python forward)."""
    return not type(m).__module__.startswith("braid._swig")


def _init(self, *args, **kwargs):
    """Sets up a module written in Python; call it first in a subclass's __init__ (super().__init__())."""
    if type(self) is Module:
        raise TypeError("nn.Module is abstract: subclass it and define forward()")
    object.__setattr__(self, "_py_attrs", {})
    _module_init(self, type(self).__name__)


def _setattr(self, name, value):
    if name in ("this", "thisown") or not _is_python_module(self) or name.startswith("_"):
        object.__setattr__(self, name, value)
        return
    attrs = self.__dict__.get("_py_attrs")
    if attrs is None:
        raise AttributeError(f"cannot assign '{name}' before Module.__init__() (call super().__init__() first)")
    if isinstance(value, Parameter):
        if name in attrs and isinstance(attrs[name], Tensor):
            self._replace_tensor(name, value)  # the registered tensor (what forward reads) takes the values
            return
        else:
            self.register_parameter(name, value, value.requires_grad)
    elif isinstance(value, _nn.Module):
        if name in attrs and isinstance(attrs[name], _nn.Module):
            self.replace_child(name, value)
        else:
            self.register_module(name, value)
    elif name in attrs:
        raise TypeError(f"cannot assign {type(value).__name__} to '{name}', a registered "
                        f"{'module' if isinstance(attrs[name], _nn.Module) else 'parameter'}")
    else:
        object.__setattr__(self, name, value)
        return
    attrs[name] = value  # keeps a Python module alive as long as its parent
    if isinstance(value, _nn.Module):
        # Read back through C++ (__getattr__ -> child()), so that a child that C++ replaced
        # (convert_sync_batchnorm, replace_child) is the one forward calls.
        self.__dict__.pop(name, None)
    else:
        object.__setattr__(self, name, value)


def _getattr(self, name):
    # Only called when normal lookup fails: a child or parameter of a C++ module by name.
    if name.startswith("__") or name in ("this", "thisown", "_py_attrs"):
        raise AttributeError(name)
    for n, _ in _nx.Module_named_children(self):
        if n == name:
            return _nx.Module_child(self, n)  # its most derived class, or the Python object itself
    for n, t in _nx.Module_named_parameters(self, False):
        if n == name:
            return t
    for n, t in _nx.Module_named_buffers(self, False):
        if n == name:
            return t
    if name == "bias" and any(n == "weight" for n, _ in _nx.Module_named_parameters(self, False)):
        return None  # a layer built with bias=False, as in PyTorch
    raise AttributeError(f"'{type(self).__name__}' has no attribute, child, parameter or buffer '{name}'")


def _call(self, *args, **kwargs):
    return self.forward(*args, **kwargs)


_cpp_forward = _nn.Module.forward  # SWIG's: the C++ virtual forward


def _forward(self, *args, **kwargs):
    """A Python subclass without forward gets a clear error, from Python and from C++ alike; a C++
    module seen through the base class (one from another SWIG module) runs its C++ forward."""
    if _is_python_module(self):
        raise NotImplementedError(f"{type(self).__name__} does not define forward()")
    return _cpp_forward(self, *args, **kwargs)


def _buffer(self, name, tensor):
    """Registers tensor as a buffer: saved in state_dict, not trained (running statistics)."""
    t = _nx.Module_register_buffer(self, name, tensor)
    self._py_attrs[name] = t
    object.__setattr__(self, name, t)
    return t


def _replace_tensor(self, name, value):
    # A re-assigned parameter keeps its registration: the registered tensor takes the new values.
    with_grad = _core.is_grad_enabled()
    _core.set_grad_enabled(False)
    try:
        self._py_attrs[name].copy_(value)
    finally:
        _core.set_grad_enabled(with_grad)


def _to(self, *args, **kwargs):
    """Moves or converts every parameter and buffer in place (to(device), to(dtype), both); returns self."""
    dt = kwargs.get("dtype")
    dev = kwargs.get("device")
    for a in args:
        if isinstance(a, (_core.Device, str)):
            dev = a
        else:
            dt = a
    if dev is not None:
        _module_to(self, _tensor.device(dev))
    if dt is not None:
        _module_to(self, int(dt))
    return self


_module_to = _nx.Module_to


def _train(self, mode=True):
    _module_train(self, mode)
    return self


_module_train = _nx.Module_train


def _state_dict(self):
    """Parameters and buffers by dotted name, as NumPy arrays that share the tensors' memory (copies
    for tensors off the CPU)."""
    out = collections.OrderedDict()
    for name, t in list(_nx.Module_named_parameters(self)) + list(_nx.Module_named_buffers(self)):
        t = t.detach()
        out[name] = t.numpy() if t.device.type == "cpu" and t.dtype != _tensor.dtype.bfloat16 else t.numpy(force=True)
    return collections.OrderedDict(sorted(out.items()))


def _load_state_dict(self, state_dict, strict=True):
    """Copies values in by dotted name from NumPy arrays or tensors; strict requires exactly the
    module's names. Nothing is written unless every entry checks out."""
    sd = _nn.StateDict()
    for k, v in state_dict.items():
        sd[k] = v if isinstance(v, Tensor) else _tensor.as_tensor(np.asarray(v, order="C"))
    _module_load(self, sd, strict)
    return self


_module_load = _nx.Module_load_state_dict


def _named_children(self):
    return [(n, _nx.Module_child(self, n)) for n, _ in _nx.Module_named_children(self)]


def _named_modules(self):
    """("", self) first, then every descendant with its dotted path, as in PyTorch."""
    return [("", self)] + [(p, _nx.Module_child(self, p)) for p, _ in _nx.Module_named_modules(self)]


def _children(self):
    return [m for _, m in _named_children(self)]


def _modules(self):
    return [m for _, m in _named_modules(self)]


def _apply(self, fn):
    for m in _children(self):
        m.apply(fn)
    fn(self)
    return self


Module.__init__ = _init
Module.__setattr__ = _setattr
Module.__getattr__ = _getattr
Module.__call__ = _call
Module.forward = _forward
Module.__repr__ = lambda self: _nx.Module_to_string(self)
Module.register_buffer = _buffer
Module._replace_tensor = _replace_tensor
Module.to = _to
Module.train = _train
Module.eval = lambda self: self.train(False)
Module.training = property(lambda self: self.is_training())
Module.state_dict = _state_dict
Module.load_state_dict = _load_state_dict
Module.children = _children
Module.modules = _modules
Module.apply = _apply
Module.cpu = lambda self: self.to("cpu")
Module.cuda = lambda self, index=0: self.to(f"cuda:{index}")
Module.float = lambda self: self.to(_tensor.dtype.float32)
Module.double = lambda self: self.to(_tensor.dtype.float64)
Module.parameters = lambda self, recurse=True: list(_nx.Module_parameters(self, recurse))
Module.named_parameters = lambda self, recurse=True: list(_nx.Module_named_parameters(self, recurse))
Module.named_buffers = lambda self, recurse=True: list(_nx.Module_named_buffers(self, recurse))
Module.buffers = lambda self, recurse=True: [t for _, t in _nx.Module_named_buffers(self, recurse)]
Module.named_children = _named_children
Module.named_modules = _named_modules
Module.__hash__ = object.__hash__


# Layers: weight and bias read as attributes, as in PyTorch (layer.weight, not layer.weight()).
for _cls in list(vars(_nn).values()):
    if isinstance(_cls, type) and issubclass(_cls, _nn.Module) and _cls is not _nn.Module:
        for _attr in ("weight", "bias"):
            if _attr in vars(_cls):
                setattr(_cls, _attr, property(vars(_cls)[_attr]))
        _cls.__repr__ = Module.__repr__

# ---- containers ----

Sequential = _nn.Sequential
_seq_init = _nn.Sequential.__init__


def _sequential_init(self, *modules):
    """Sequential(m1, m2, ...) or Sequential(OrderedDict(name=module, ...))."""
    _seq_init(self)
    object.__setattr__(self, "_py_attrs", {})
    if len(modules) == 1 and isinstance(modules[0], dict):
        for name, m in modules[0].items():
            self.append(m, name)
    else:
        for m in modules:
            self.append(m)


def _sequential_append(self, module, name=""):
    _nx.Sequential_add(self, module, name)
    self.__dict__.setdefault("_py_attrs", {})[name or str(len(self) - 1)] = module  # keeps Python modules alive
    return self


Sequential.__init__ = _sequential_init
Sequential.append = _sequential_append

ModuleList = _nn.ModuleList
_ml_init = _nn.ModuleList.__init__


def _module_list_init(self, modules=()):
    _ml_init(self)
    object.__setattr__(self, "_py_attrs", {})
    for m in modules:
        self.append(m)


def _module_list_append(self, module):
    _nx.ModuleList_add(self, module)
    self.__dict__.setdefault("_py_attrs", {})[str(len(self) - 1)] = module
    return self


ModuleList.__init__ = _module_list_init
ModuleList.append = _module_list_append

# ---- the layers and losses (generated classes) ----

for _name in ("Linear", "Conv1d", "Conv2d", "ConvTranspose2d", "MaxPool2d", "AvgPool2d", "AdaptiveAvgPool2d",
              "BatchNorm1d", "BatchNorm2d", "LayerNorm", "GroupNorm", "Dropout", "ReLU", "ReLU6", "LeakyReLU", "GELU", "SiLU",
              "Sigmoid", "Tanh", "Softmax", "Embedding", "Flatten", "Identity", "Residual", "MultiheadAttention",
              "TransformerEncoderLayer", "LSTM", "GRU", "SkipStash", "SkipAdd", "SkipConcat", "CrossEntropyLoss",
              "NLLLoss", "MSELoss", "L1Loss", "SmoothL1Loss", "BCEWithLogitsLoss"):
    globals()[_name] = getattr(_nn, _name)

# ---- nn.functional and nn.init, as submodules ----

functional = types.ModuleType("braid.nn.functional", "Layers as functions (braid/nn/*.h, braid/conv.h, braid/ops.h).")
for _name in ("cross_entropy", "nll_loss", "mse_loss", "l1_loss", "smooth_l1_loss", "binary_cross_entropy_with_logits",
              "linear", "dropout", "layer_norm", "group_norm", "batch_norm", "embedding", "scaled_dot_product_attention"):
    if hasattr(_nn, _name):
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
