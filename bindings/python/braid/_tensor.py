"""braid.Tensor as Python sees it: the SWIG-generated class from braid/tensor.h, given PyTorch's
Python protocol (operators, indexing, properties, NumPy's array interface, DLPack).

Everything here is sugar over the generated functions; no computation happens in Python except the
index arithmetic of advanced indexing.
"""

import collections
import enum
import numbers
import operator

import numpy as np

from ._swig import core as _core
from ._swig import _core as _cx  # the extension: unbound Tensor_* functions

Tensor = _core.Tensor
Device = _core.Device
# Binds an extension function (first argument self) as a method, as SWIG's own proxies do.
_method = _core._swig_new_instance_method


# braid::DType as an IntEnum, names and values from the wrapper (braid.float32 is DType::Float32).
dtype = enum.IntEnum("dtype", {_core.dtype_name(v): v for n, v in vars(_core).items() if n.startswith("DType_")},
                     module=__name__)
dtype.__doc__ = "An element type (braid/dtype.h); float16, bfloat16, int8 and uint8 are storage types."
dtype.__repr__ = dtype.__str__ = lambda self: f"braid.{self.name}"
dtype.is_floating_point = property(_core.is_floating)
dtype.itemsize = property(_core.dtype_size)


_TO_NUMPY = {d: np.dtype(d.name) for d in dtype if d != dtype.bfloat16}  # NumPy has no bfloat16
# NumPy's int8/uint8 arrays (images, labels) become int64 tensors that compute, as torch.tensor
# makes lists of ints; braid's int8/uint8 (storage: quantised ONNX values) come back as themselves.
_FROM_NUMPY = {v: k for k, v in _TO_NUMPY.items() if k not in (dtype.int8, dtype.uint8)}


def _numpy_dtype(dt):
    try:
        return _TO_NUMPY[dt]
    except KeyError:
        raise TypeError(f"{dtype(dt)!r} has no NumPy equivalent; convert it first, e.g. t.to(braid.float32)") from None


def _braid_dtype(npdt):
    npdt = np.dtype(npdt)
    if npdt in _FROM_NUMPY:
        return _FROM_NUMPY[npdt]
    if npdt.kind in "iu":  # other integer widths become int64, as torch.tensor does with lists
        return dtype.int64
    if npdt.kind == "f":
        return dtype.float32
    raise TypeError(f"NumPy dtype {npdt} has no braid equivalent (float16/32/64, int32/64, bool)")


# ---- devices ----

_DEVICE_TYPES = {_core.DeviceType_CPU: "cpu", _core.DeviceType_CUDA: "cuda", _core.DeviceType_Shadow: "shadow"}


def device(spec, index=None):
    """A braid.Device from "cpu", "cuda", "cuda:1", "shadow", or a type and an index."""
    if isinstance(spec, Device):
        return spec
    if index is not None:
        spec = f"{spec}:{index}"
    return Device.parse(spec)


Device.type = property(lambda d: _DEVICE_TYPES[_cx.Device_type_get(d)], doc="'cpu', 'cuda' or 'shadow'")
Device.__repr__ = lambda d: f"device(type='{d.type}', index={d.index})"
Device.__hash__ = lambda d: hash((d.type, d.index))
_device_eq = Device.__eq__
Device.__eq__ = lambda a, b: _device_eq(a, device(b)) if isinstance(b, (Device, str)) else NotImplemented


# ---- shapes ----


def _shape_args(args):
    """(2, 3), ((2, 3),) and ([2, 3],) all mean the shape (2, 3), as in PyTorch."""
    if len(args) == 1 and not isinstance(args[0], numbers.Integral):
        return tuple(int(s) for s in args[0])
    return tuple(int(s) for s in args)


# ---- properties (requires_grad and is_leaf: %attribute in swig/core.i) ----

Tensor.shape = property(_cx.Tensor_shape, doc="The sizes, outermost first, as a tuple.")
Tensor.device = property(_cx.Tensor_device)
Tensor.grad = property(_cx.Tensor_grad, _cx.Tensor_set_grad, doc="The accumulated gradient, or None.")
Tensor.mT = property(_cx.Tensor_mT)
Tensor.dtype = property(lambda t: dtype(_cx.Tensor_dtype(t)))
Tensor.ndim = property(_cx.Tensor_dim)
Tensor.grad_fn = property(lambda t: _cx.Tensor_grad_fn_name(t) or None,
                          doc="The name of the op that produced this tensor (None for leaves).")
Tensor.T = property(lambda t: t.permute(tuple(range(t.ndim - 1, -1, -1))))
Tensor.is_cuda = property(lambda t: t.device.type == "cuda")


def _size(self, dim=None):
    """The shape, or the size of one axis."""
    return self.shape if dim is None else _cx.Tensor_size(self, dim)


def _stride(self, dim=None):
    s = _cx.Tensor_strides(self)
    return s if dim is None else s[dim]


Tensor.size = _size
Tensor.stride = _stride


def _item(self):
    v = _cx.Tensor_item(self)
    dt = _cx.Tensor_dtype(self)
    if dt == dtype.bool:
        return bool(v)
    if dt in (dtype.int64, dtype.int32):
        return int(v)
    return v


Tensor.item = _item
Tensor.__float__ = lambda t: float(_cx.Tensor_item(t))
Tensor.__int__ = lambda t: int(_cx.Tensor_item(t))


Tensor.__repr__ = lambda t: _cx.Tensor_to_string(t)
Tensor.__str__ = Tensor.__repr__
Tensor.__hash__ = object.__hash__


def _iter(self):
    for i in range(len(self)):
        yield self[i]


Tensor.__iter__ = _iter

# ---- NumPy and DLPack ----


def _array_interface(self):
    if self.requires_grad:
        # As numpy(): a NumPy view of a tensor autograd tracks would let writes bypass the graph.
        raise RuntimeError("a tensor that requires grad has no array interface; use t.detach().numpy()")
    if self.device.type != "cpu":
        raise TypeError(f"a tensor on {self.device} has no array interface; copy it with .cpu() first")
    npdt = _numpy_dtype(self.dtype)
    return {
        "shape": self.shape,
        "typestr": npdt.str,
        "data": (self.data_ptr(), False),
        "strides": tuple(s * npdt.itemsize for s in _cx.Tensor_strides(self)),
        "version": 3,
    }


Tensor.__array_interface__ = property(_array_interface)


def _numpy(self, force=False):
    """A NumPy array sharing this CPU tensor's memory (writes through either are seen by the other).
    force=True copies a tensor from another device, or one that requires grad, first."""
    t = self
    if force:
        t = t.detach().cpu()
    elif t.requires_grad:
        raise RuntimeError("numpy() of a tensor that requires grad; use t.detach().numpy()")
    elif t.device.type != "cpu":
        raise TypeError(f"numpy() of a tensor on {t.device}; copy it with .cpu() first")
    return np.asarray(t)


Tensor.numpy = _numpy


def _tolist(self):
    a = np.asarray(self.detach().cpu() if self.dtype != dtype.bfloat16 else self.detach().cpu().to(dtype.float32))
    return a.tolist()


Tensor.tolist = _tolist


def _dlpack(self, stream=None, max_version=None, dl_device=None, copy=None):
    """A DLPack capsule sharing this tensor's memory: DLPack 1.0's versioned one when the consumer
    accepts it (max_version >= (1, 0), as NumPy 2 asks), else the legacy one."""
    versioned = max_version is not None and tuple(max_version)[0] >= 1
    return _core.to_dlpack(self.clone() if copy else self, versioned)


Tensor.__dlpack__ = _dlpack
Tensor.__dlpack_device__ = _method(_core.dlpack_device)  # (device_type, device_id) in DLPack's codes


def from_numpy(array):
    """A CPU tensor sharing array's memory; the tensor keeps the array alive. Negative strides are
    refused (pass array.copy())."""
    if not isinstance(array, np.ndarray):
        raise TypeError(f"from_numpy: expected a numpy.ndarray, got {type(array).__name__}")
    dt = _FROM_NUMPY.get(array.dtype)
    if dt is None:
        raise TypeError(f"from_numpy: NumPy dtype {array.dtype} has no braid equivalent (float16/32/64, int32/64, bool)")
    iface = array.__array_interface__
    strides = iface["strides"] or ()
    return _core.tensor_over_memory(array, iface["data"][0], array.shape, strides, dt)


def from_dlpack(obj):
    """A tensor sharing the memory of any object with __dlpack__ (NumPy, PyTorch, CuPy), or of a
    DLPack capsule."""
    if not hasattr(obj, "__dlpack__"):
        return _core.from_dlpack_capsule(obj)
    try:
        capsule = obj.__dlpack__(max_version=(1, 0))
    except TypeError:  # a producer from before DLPack 1.0's keyword
        capsule = obj.__dlpack__()
    return _core.from_dlpack_capsule(capsule)


def tensor(data, dtype=None, device=None, requires_grad=False):
    """A new tensor holding a copy of data (a nested sequence, a number, a NumPy array or a Tensor),
    on the default device unless device is given. Python floats give float32 and ints int64, as in
    PyTorch."""
    if isinstance(data, Tensor):
        t = data.detach().clone()
    else:
        a = np.asarray(data)
        if a.dtype == np.float64 and not isinstance(data, (np.ndarray, np.generic)) and dtype is None:
            a = a.astype(np.float32)  # Python floats are float32 by default, as in PyTorch
        t = from_numpy(np.array(a, dtype=_numpy_dtype(_braid_dtype(a.dtype)), copy=True, order="C"))
    t = t.to(dtype=dtype, device=_core.default_device() if device is None else device)
    return t.requires_grad_(True) if requires_grad else t


def as_tensor(data, dtype=None, device=None):
    """A tensor sharing data's memory when it can (a CPU NumPy array of a braid dtype), else a copy."""
    if isinstance(data, np.ndarray) and data.dtype in _FROM_NUMPY and all(s >= 0 for s in data.strides):
        data = from_numpy(data)
    if not isinstance(data, Tensor):
        return tensor(data, dtype=dtype, device=device)
    return data.to(dtype=dtype, device=device)


# ---- operators: %extend braid::Tensor in swig/core.i (Note [Python operands]) ----

# NumPy defers to these operators (np.float64(2) * t is a Tensor, not an ndarray), as with torch.Tensor.
Tensor.__array_priority__ = 1000
Tensor.__pos__ = lambda t: t

# ---- indexing: the key as braid::index's list of items (braid/indexing.h) ----

_TI = _core.TensorIndex
_opt = lambda v: v if v is None else operator.index(v)  # noqa: E731


def _index_items(self, index):
    items = []
    for i in index if isinstance(index, tuple) else (index,):
        if i is None or i is Ellipsis:
            items.append(_TI.new_axis() if i is None else _TI.ellipsis())
        elif isinstance(i, slice):
            items.append(_TI.slice(_opt(i.start), _opt(i.stop), _opt(i.step)))
        elif isinstance(i, (bool, np.bool_)):
            raise IndexError("a Python bool as an index is not supported; use a bool tensor")
        elif isinstance(i, numbers.Integral):
            items.append(_TI.integer_at(int(i)))
        elif isinstance(i, (Tensor, np.ndarray, list)):
            items.append(_TI.tensor(i if isinstance(i, Tensor) else tensor(np.asarray(i), device=self.device)))
        else:
            raise TypeError(f"unsupported index {i!r} of type {type(i).__name__}")
    return items


def _setitem(self, index, value):
    if not isinstance(value, Tensor):
        value = (_core.scalar_tensor(float(value), self.dtype, self.device) if isinstance(value, numbers.Number)
                 else tensor(value, dtype=self.dtype, device=self.device))
    _core.index_put_(self, _index_items(self, index), value)


Tensor.__getitem__ = lambda t, index: _core.index(t, _index_items(t, index))
Tensor.__setitem__ = _setitem

# ---- methods with PyTorch's argument conventions ----


def _shape_method(fn):
    def m(self, *shape):
        return fn(self, _shape_args(shape))

    m.__doc__ = fn.__doc__
    return m


Tensor.reshape = _shape_method(_cx.Tensor_reshape)
Tensor.view = _shape_method(_cx.Tensor_view)
Tensor.expand = _shape_method(_cx.Tensor_expand)
Tensor.permute = _shape_method(_cx.Tensor_permute)


def _var(fn):
    def m(self, dim=None, correction=1, keepdim=False, unbiased=None):
        if unbiased is not None:
            correction = 1 if unbiased else 0
        return fn(self, dim, correction, keepdim)

    return m


Tensor.var = _var(_core.var)
Tensor.std = _var(_core.std)
_MaxResult = collections.namedtuple("max", ["values", "indices"])
_MinResult = collections.namedtuple("min", ["values", "indices"])


def _max(self, dim=None, keepdim=False):
    """The largest element (0-d); with dim, (values, indices) along it, as torch.max; with a tensor,
    the elementwise maximum."""
    if isinstance(dim, Tensor):
        return _core.maximum(self, dim)
    if dim is None:
        return _core.amax(self)
    return _MaxResult(_core.amax(self, dim, keepdim), _core.argmax(self, dim, keepdim))


def _min(self, dim=None, keepdim=False):
    """The smallest element (0-d); with dim, (values, indices) along it, as torch.min; with a tensor,
    the elementwise minimum."""
    if isinstance(dim, Tensor):
        return _core.minimum(self, dim)
    if dim is None:
        return _core.amin(self)
    return _MinResult(_core.amin(self, dim, keepdim), _core.argmin(self, dim, keepdim))


Tensor.max = _max
Tensor.min = _min
Tensor.clamp = Tensor.clip = _method(_core.clamp)
Tensor.squeeze = _method(_core.squeeze)
Tensor.flatten = _method(_core.flatten)
Tensor.float = lambda t: t.to(dtype.float32)
Tensor.double = lambda t: t.to(dtype.float64)
Tensor.long = lambda t: t.to(dtype.int64)
Tensor.int = lambda t: t.to(dtype.int32)
Tensor.bool = lambda t: t.to(dtype.bool)
Tensor.half = lambda t: t.to(dtype.float16)
Tensor.bfloat16 = lambda t: t.to(dtype.bfloat16)
Tensor.type_as = lambda t, other: t.to(other.dtype)
Tensor.new_zeros = lambda t, *shape: _core.zeros(_shape_args(shape), t.dtype, t.device)
Tensor.new_ones = lambda t, *shape: _core.ones(_shape_args(shape), t.dtype, t.device)
Tensor.split = lambda t, sizes, dim=0: _core.split(
    t, [sizes] * (t.shape[dim] // sizes) + ([t.shape[dim] % sizes] if t.shape[dim] % sizes else [])
    if isinstance(sizes, numbers.Integral) else list(sizes), dim)

_to = _cx.Tensor_to


def _to_method(self, *args, dtype=None, device=None, copy=False):
    """t.to(device), t.to(dtype), t.to(device, dtype), t.to(other_tensor), or keywords."""
    for a in args:
        if isinstance(a, Tensor):
            dtype, device = a.dtype, a.device
        elif isinstance(a, (Device, str)):
            device = a
        else:
            dtype = a
    t = self if device is None else _to(self, device)  # a Device or a string such as "cuda:1"
    if dtype is not None and t.dtype != dtype:
        t = _to(t, int(dtype))
    if copy and t.is_same(self):
        t = t.clone()
    return t


Tensor.to = _to_method
Tensor.cuda = lambda t, index=0: _to(t, Device.cuda(index))

# Methods that are the module-level op with the tensor first (t.exp() is braid.exp(t)).
for _name in ("abs", "exp", "log", "log1p", "expm1", "sqrt", "rsqrt", "square", "reciprocal", "sin", "cos", "tanh",
              "sigmoid", "relu", "silu", "gelu", "erf", "sign", "floor", "ceil", "round", "logical_not", "isnan",
              "maximum", "minimum", "tril", "triu", "unsqueeze", "transpose", "narrow", "gather", "index_select",
              "scatter_add", "neg", "pow", "logical_and", "logical_or", "logical_xor", "eq", "ne", "lt", "le", "gt",
              "ge", "add", "sub", "mul", "div", "asin", "acos", "atan", "leaky_relu", "elu", "softplus", "hardswish",
              "hardsigmoid", "softmax", "log_softmax", "sum", "mean", "prod", "amax", "amin", "logsumexp", "any", "all",
              "argmax", "argmin", "chunk"):
    if not hasattr(Tensor, _name) or _name in ("abs", "neg", "pow"):
        setattr(Tensor, _name, _method(getattr(_core, _name)))
Tensor.masked_fill = lambda t, mask, value: _core.where(mask, _core.scalar_tensor(float(value), t.dtype, t.device), t)
Tensor.__reduce__ = lambda t: (_rebuild, (np.array(t.detach().cpu().numpy(), copy=True), str(t.device), t.requires_grad))


def _rebuild(array, dev, requires_grad):
    return tensor(array, device=dev, requires_grad=requires_grad)
