# gen_cases.py --check-torch: runs every case of a written case file through PyTorch 1.13 and
# compares with the expectation in the file, so the NumPy emulation of PyTorch's semantics stays
# honest. Where braid deliberately differs from PyTorch the difference is listed in
# KNOWN_DIFFERENCES, usually with an adapter that makes PyTorch compute braid's semantics so the
# values are still checked.
import collections
import json
import math

import numpy as np
import torch
import torch.nn.functional as F

import ref
import ref_conv
from values import FLOATS, apply_view

TD = {"float32": torch.float32, "float64": torch.float64, "int64": torch.int64,
      "int32": torch.int32, "bool": torch.bool}


def decode(spec):
    """The operand as NumPy sees it (from the case's bytes) and as PyTorch does (its own view)."""
    n = int(np.prod(spec["shape"], dtype=np.int64))
    base = np.frombuffer(bytes.fromhex(spec["data"]), dtype=spec["dtype"], count=n).reshape(spec["shape"])
    t, v = torch.from_numpy(base.copy()), spec["view"]
    if v is not None:
        if v["kind"] == "permute":
            t = t.permute(v["order"])
        elif v["kind"] == "slice":
            t = t[(slice(None),) * v["axis"] + (slice(v["start"], v["end"], v["step"]),)]
        else:
            t = t.expand(v["shape"])
    return apply_view(base, v), t


def num(v):
    return float(v) if isinstance(v, str) else v


def py_scalar(v, d):
    """A C++ double under braid's scalar rule, as the Python number PyTorch would see."""
    return int(v) if d not in FLOATS and ref.whole_fits(v, d) else float(v)


def dims(axes, x):
    return tuple(axes) if axes else tuple(range(x.dim()))


def t_prod(a, x):
    d = dims(a["axes"], x)
    torch.sum(x, dim=d)  # raises PyTorch's errors for repeated or out-of-range axes
    if x.dim() == 0:
        return torch.prod(x)
    r = x
    for ax in sorted((k % x.dim() for k in d), reverse=True):
        r = torch.prod(r, dim=ax, keepdim=True)
    return r if a["keepdim"] else r.reshape(torch.sum(x.to(torch.int64), dim=d).shape)


def t_slice(a, x):
    nd = x.dim()
    if not -max(nd, 1) <= a["axis"] < max(nd, 1):
        raise IndexError("dimension out of range")
    if a["step"] < 1:
        raise ValueError("step must be positive")
    return x[(slice(None),) * (a["axis"] % max(nd, 1)) + (slice(a["start"], a["end"], a["step"]),)]


def t_hardsigmoid(a, x):
    if (a["alpha"], a["beta"]) == (1 / 6, 0.5):
        return F.hardsigmoid(x)
    return torch.clamp(x * a["alpha"] + a["beta"], 0, 1)  # PyTorch has no parameterised form


def t_pad(a, x):
    if a["mode"] == "constant":
        return F.pad(x, a["pads"], value=num(a["value"]))
    return F.pad(x, a["pads"], mode=a["mode"])


def t_scalar(op):
    def run(a, x):
        s = py_scalar(num(a["scalar"]), dname(x))
        f = {"add_scalar": lambda l, r: l + r, "sub_scalar": lambda l, r: l - r,
             "mul_scalar": lambda l, r: l * r, "div_scalar": lambda l, r: l / r}[op]
        return f(s, x) if a["reverse"] else f(x, s)
    return run


def dname(t):
    return str(t.dtype)[6:]


def t_conv2d(a, x, w, b=None):
    """conv2d; braid's {top, bottom, left, right} padding as F.pad and an unpadded conv2d, refusing
    what conv2d refuses with padding: negative pads, and an empty input unless its batch or its
    channels are empty."""
    p = a["padding"]
    if len(p) != 4:
        return F.conv2d(x, w, b, a["stride"], p, a["dilation"], a["groups"])
    batched = x.unsqueeze(0) if x.dim() == 3 else x
    if min(p) < 0 or (batched.numel() == 0 and 0 not in batched.shape[:2]):
        raise RuntimeError("negative padding, or an empty input with a batch and channels")
    return F.conv2d(F.pad(x, (p[2], p[3], p[0], p[1])), w, b, a["stride"], 0, a["dilation"], a["groups"])


UNARY_T = {
    "neg": torch.neg, "abs": torch.abs, "exp": torch.exp, "log": torch.log, "log1p": torch.log1p,
    "expm1": torch.expm1, "sqrt": torch.sqrt, "rsqrt": torch.rsqrt, "square": torch.square,
    "reciprocal": torch.reciprocal, "sin": torch.sin, "cos": torch.cos, "tanh": torch.tanh,
    "sigmoid": torch.sigmoid, "relu": torch.relu, "silu": F.silu, "hardswish": F.hardswish,
    "softplus": F.softplus, "erf": torch.erf, "asin": torch.asin, "acos": torch.acos,
    "atan": torch.atan, "sign": torch.sign, "floor": torch.floor, "ceil": torch.ceil,
    "round": torch.round, "logical_not": torch.logical_not, "isnan": torch.isnan,
}
BINARY_T = {
    "mul": torch.mul, "div": torch.div, "pow": torch.pow, "maximum": torch.maximum,
    "minimum": torch.minimum, "eq": torch.eq, "ne": torch.ne, "lt": torch.lt, "le": torch.le,
    "gt": torch.gt, "ge": torch.ge, "logical_and": torch.logical_and,
    "logical_or": torch.logical_or, "logical_xor": torch.logical_xor,
}

TORCH = {op: (lambda a, x, f=f: f(x)) for op, f in UNARY_T.items()}
TORCH.update({op: (lambda a, x, y, f=f: f(x, y)) for op, f in BINARY_T.items()})
TORCH.update({op: t_scalar(op) for op in ("add_scalar", "sub_scalar", "mul_scalar", "div_scalar")})
TORCH.update({
    "leaky_relu": lambda a, x: F.leaky_relu(x, a["negative_slope"]),
    "elu": lambda a, x: F.elu(x, a["alpha"]),
    "hardsigmoid": t_hardsigmoid,
    "gelu": lambda a, x: F.gelu(x, approximate=a["approximate"]),
    "pow_scalar": lambda a, x: torch.pow(x, py_scalar(num(a["exponent"]), dname(x))),
    "clamp": lambda a, x: torch.clamp(x, *[None if a[k] is None else py_scalar(num(a[k]), dname(x))
                                           for k in ("min", "max")]),
    "add": lambda a, x, y: torch.add(x, y, alpha=py_scalar(a["alpha"], "int64")),
    "sub": lambda a, x, y: torch.sub(x, y, alpha=py_scalar(a["alpha"], "int64")),
    "where": lambda a, c, x, y: torch.where(c, x, y),
    "sum": lambda a, x: torch.sum(x, dim=dims(a["axes"], x), keepdim=a["keepdim"]),
    "mean": lambda a, x: torch.mean(x, dim=dims(a["axes"], x), keepdim=a["keepdim"]),
    "prod": t_prod,
    "amax": lambda a, x: torch.amax(x, dim=dims(a["axes"], x), keepdim=a["keepdim"]),
    "amin": lambda a, x: torch.amin(x, dim=dims(a["axes"], x), keepdim=a["keepdim"]),
    "var": lambda a, x: torch.var(x, dim=dims(a["axes"], x), correction=a["correction"], keepdim=a["keepdim"]),
    "std": lambda a, x: torch.std(x, dim=dims(a["axes"], x), correction=a["correction"], keepdim=a["keepdim"]),
    "logsumexp": lambda a, x: torch.logsumexp(x, dim=dims(a["axes"], x), keepdim=a["keepdim"]),
    "argmax": lambda a, x: torch.argmax(x, dim=a["axis"], keepdim=a["keepdim"]),
    "argmin": lambda a, x: torch.argmin(x, dim=a["axis"], keepdim=a["keepdim"]),
    "softmax": lambda a, x: torch.softmax(x, a["axis"]),
    "log_softmax": lambda a, x: torch.log_softmax(x, a["axis"]),
    "sum_to": lambda a, x: x.sum_to_size(a["shape"]),
    "matmul": lambda a, x, y: torch.matmul(x, y),
    "reshape": lambda a, x: torch.reshape(x, a["shape"]),
    "permute": lambda a, x: x.permute(a["order"]),
    "transpose": lambda a, x: torch.transpose(x, a["a"], a["b"]),
    "narrow": lambda a, x: torch.narrow(x, a["axis"], a["start"], a["length"]),
    "slice": t_slice,
    "expand": lambda a, x: x.expand(a["shape"]),
    "squeeze": lambda a, x: torch.squeeze(x) if a["axis"] is None else torch.squeeze(x, a["axis"]),
    "unsqueeze": lambda a, x: torch.unsqueeze(x, a["axis"]),
    "flatten": lambda a, x: torch.flatten(x, a["start"], a["end"]),
    "contiguous": lambda a, x: x.contiguous(),
    "cast": lambda a, x: x.to(TD[a["dtype"]]),
    "select": lambda a, x: torch.select(x, a["axis"], a["index"]),
    "concat": lambda a, *xs: torch.cat(xs, a["axis"]),
    "stack": lambda a, *xs: torch.stack(xs, a["axis"]),
    "split": lambda a, x: torch.split(x, a["sizes"], a["axis"]),
    "chunk": lambda a, x: torch.chunk(x, a["n"], a["axis"]),
    "gather": lambda a, x, i: torch.gather(x, a["axis"], i),
    "index_select": lambda a, x, i: torch.index_select(x, a["axis"], i),
    "scatter_add": lambda a, x, i, s: torch.scatter_add(x, a["axis"], i, s),
    "pad": t_pad,
    "one_hot": lambda a, x: F.one_hot(x, a["num_classes"]),
    "tril": lambda a, x: torch.tril(x, a["diagonal"]),
    "triu": lambda a, x: torch.triu(x, a["diagonal"]),
    "full": lambda a: torch.full(a["shape"], num(a["value"]), dtype=TD[a["dtype"]]),
    "arange": lambda a: torch.arange(a["start"], a["end"], a["step"], dtype=TD[a["dtype"]]),
    "linspace": lambda a: torch.linspace(a["start"], a["end"], a["steps"], dtype=TD[a["dtype"]]),
    "eye": lambda a: torch.eye(a["n"], dtype=TD[a["dtype"]]),
    "conv1d": lambda a, x, w, b=None: F.conv1d(x, w, b, a["stride"], a["padding"], a["dilation"], a["groups"]),
    "conv2d": t_conv2d,
    "conv_transpose2d": lambda a, x, w, b=None: F.conv_transpose2d(
        x, w, b, a["stride"], a["padding"], a["output_padding"], a["groups"], a["dilation"]),
    "max_pool2d": lambda a, x: F.max_pool2d(x, a["kernel"], a["stride"], a["padding"], a["dilation"],
                                            ceil_mode=a["ceil_mode"]),
    "avg_pool2d": lambda a, x: F.avg_pool2d(x, a["kernel"], a["stride"], a["padding"], a["ceil_mode"],
                                            a["count_include_pad"]),
    "adaptive_avg_pool2d": lambda a, x: F.adaptive_avg_pool2d(x, a["output_size"]),
    "allclose": lambda a, x, y: torch.tensor(torch.allclose(x, y, a["rtol"], a["atol"])),
    "equal": lambda a, x, y: torch.tensor(torch.equal(x, y)),
    # in-place: the operand itself afterwards
    "fill_": lambda a, x: x.fill_(num(a["value"])),
    "add_": lambda a, x, y: x.add_(y, alpha=py_scalar(a["alpha"], "int64")),
    "mul_": lambda a, x: x.mul_(py_scalar(num(a["value"]), dname(x))),
    "copy_": lambda a, x, y: x.copy_(y),
})


# ---- braid's deliberate differences ----

def _values(case, xs):
    """The operands whose dtypes promote together (where's condition does not)."""
    return xs[1:] if case["op"] == "where" else xs


def _mixed_0d(case, xs):
    vs = _values(case, xs)
    return any(x.ndim == 0 for x in vs) and any(x.ndim > 0 for x in vs)


def _promoted(case, ts):
    lead = ts[:1] if case["op"] == "where" else []
    vs = ts[len(lead):]
    d = TD[ref.promote(*[dname(t) for t in vs])]
    return lead + [t.to(d) for t in vs]


def _as_float32(case, ts):
    return [t.to(torch.float32) if dname(t) not in FLOATS else t for t in ts]


def _pad_by_axis(case, ts):
    """Reflect/replicate padding one axis at a time through PyTorch's 1-d kernel in float64."""
    a, x = case["args"], ts[0]
    pads = a["pads"]
    if len(pads) % 2 or len(pads) > 2 * x.dim():
        raise RuntimeError("bad pads")
    r = x.to(torch.float64)
    for i in range(len(pads) // 2):
        ax, (lo, hi) = x.dim() - 1 - i, pads[2 * i:2 * i + 2]
        moved = r.movedim(ax, -1)
        n = moved.shape[-1]
        if n == 0 or min(lo, hi) < 0 or (a["mode"] == "reflect" and max(lo, hi) >= n):
            raise RuntimeError("padding too large for the axis")
        flat = moved.reshape(1, -1, n)
        if flat.numel():
            flat = F.pad(flat, [lo, hi], mode=a["mode"])
        else:  # PyTorch's kernel refuses empty batches
            flat = torch.zeros(1, 0, n + lo + hi, dtype=flat.dtype)
        r = flat.reshape(*moved.shape[:-1], n + lo + hi).movedim(-1, ax)
    return r.to(x.dtype)


def _wrapped(case, ts):
    """Negative indices made positive, as braid reads them."""
    a, x = case["args"], ts[0]
    size = x.shape[a["axis"]] if x.dim() else 1
    out = list(ts)
    out[1] = torch.where(ts[1] < 0, ts[1] + size, ts[1])
    return out


def _has_negative_index(case, xs):
    return xs[1].size > 0 and xs[1].min() < 0


def _torch_refuses_pad(a, x):
    pads = a["pads"]
    if len(pads) % 2 or len(pads) > 2 * x.ndim:
        return False
    sizes = []
    for i in range(len(pads) // 2):
        n, lo, hi = x.shape[x.ndim - 1 - i], pads[2 * i], pads[2 * i + 1]
        if max(-lo, 0) + max(-hi, 0) > n:
            return True
        sizes.append(n + lo + hi)
    return any(p > 0 for p in pads) and min(sizes) <= 0


def _axis_len(case, x):
    a = case["args"]["axis"]
    return x.shape[a] if -x.ndim <= a < x.ndim else -1


def _alpha_as_product(case, ts):
    a, b = ts
    m = torch.mul(b, py_scalar(case["args"]["alpha"], dname(b)))
    d = TD[ref.promote(dname(a), dname(m))]
    return (torch.add if case["op"] == "add" else torch.sub)(a.to(d), m.to(d))


def _not_one_float(case, xs):
    d = xs[0].dtype.name
    return d not in FLOATS or any(x.dtype.name != d for x in xs)


def _empty_batch(case, xs):
    return xs[0].ndim == (3 if case["op"] == "conv1d" else 4) and xs[0].shape[0] == 0


def _batch_of_one(case, ts):
    """The op on a batch of one zero input, cut to the empty batch: PyTorch's argument checks and
    output shape for an empty batch."""
    x = ts[0]
    return TORCH[case["op"]](case["args"], x.new_zeros((1,) + tuple(x.shape[1:])), *ts[1:])[:0]


def _empty_window(case, xs):
    try:
        return ref_conv.max_pool_empty_window(case["args"], xs[0])
    except ref.Reject:
        return False


def _bitwise_equal(case, ts):
    """torch.equal on the bits of two float operands of one dtype: braid's equal."""
    it = torch.int32 if ts[0].dtype == torch.float32 else torch.int64
    return torch.tensor(torch.equal(*[t.contiguous().view(it) for t in ts]))


def _add_alpha_product(case, ts):
    x, y = ts
    return x.add_(torch.mul(y, py_scalar(case["args"]["alpha"], dname(y))))


CONV_POOL = ("conv1d", "conv2d", "conv_transpose2d", "max_pool2d", "avg_pool2d", "adaptive_avg_pool2d")
def _pow_at_the_ends(t, e):
    """PyTorch's x ** e with pow's values at -inf and -0.0 for e = ±0.5 (C's pow: +inf, +0 for 0.5;
    +0, +inf for -0.5)."""
    r = torch.pow(t, e)
    r = torch.where(t == -math.inf, torch.tensor(math.inf if e > 0 else 0.0, dtype=t.dtype), r)
    return torch.where((t == 0) & torch.signbit(t), torch.tensor(0.0 if e > 0 else math.inf, dtype=t.dtype), r)


Known = collections.namedtuple("Known", "ops when reason adapt")
# adapt(case, torch operands) returns PyTorch's result under braid's semantics (None: no check).
# ops is a tuple of op names; when(case, numpy operands) says whether the difference applies.
KNOWN_DIFFERENCES = [
    Known(tuple(BINARY_T) + ("add", "sub", "where"), _mixed_0d,
          "PyTorch lets a 0-d tensor act like a Python scalar in type promotion; braid promotes by "
          "dtype alone, whatever the rank",
          lambda c, ts: TORCH[c["op"]](c["args"], *_promoted(c, ts))),
    Known(("silu", "gelu", "elu", "leaky_relu", "softplus", "hardsigmoid", "hardswish"),
          lambda c, xs: xs[0].dtype.name not in FLOATS,
          "PyTorch's activation kernels refuse integer and bool input; braid computes every "
          "floating-only unary op in float32 for them",
          lambda c, ts: TORCH[c["op"]](c["args"], *_as_float32(c, ts))),
    Known(("mean", "var", "std", "softmax", "log_softmax"),
          lambda c, xs: xs[0].dtype.name not in FLOATS,
          "PyTorch refuses integer and bool input here; braid computes in float32",
          lambda c, ts: TORCH[c["op"]](c["args"], *_as_float32(c, ts))),
    Known(("sum_to",), lambda c, xs: xs[0].dtype.name in ("int32", "bool"),
          "PyTorch's sum_to_size returns its input unchanged (keeping int32/bool) when nothing is "
          "summed; braid always gives sum's dtype, int64",
          lambda c, ts: TORCH["sum_to"](c["args"], *ts).to(torch.int64)),
    Known(("clamp",),
          lambda c, xs: None not in (c["args"]["min"], c["args"]["max"])
          and num(c["args"]["min"]) > num(c["args"]["max"]),
          "braid refuses clamp with min > max (a caller's mistake with no right answer, see ops.h); "
          "PyTorch sets every element to max",
          None),
    Known(("pow",), lambda c, xs: all(x.dtype.kind in "biu" for x in xs) and (xs[1] < 0).any(),
          "braid refuses integers to negative integer powers, as NumPy does; PyTorch computes "
          "them (1, -1 or 0) when the exponent is a tensor and refuses them when it is a scalar",
          None),
    Known(("pow_scalar",),
          lambda c, xs: num(c["args"]["exponent"]) in (0.5, -0.5) and xs[0].dtype.kind == "f"
          and bool(((xs[0] == -np.inf) | ((xs[0] == 0) & np.signbit(xs[0]))).any()),
          "braid's x ** 0.5 and x ** -0.5 equal pow at -inf and -0.0 (+inf, +0; +0, +inf); PyTorch "
          "computes them as sqrt and rsqrt (NaN, -0.0; NaN, -inf): Note [Pow's special cases]",
          lambda c, ts: _pow_at_the_ends(ts[0], num(c["args"]["exponent"]))),
    Known(("matmul",), lambda c, xs: xs[0].dtype != xs[1].dtype,
          "PyTorch's matmul requires equal dtypes; braid promotes the operands like other binary ops",
          lambda c, ts: torch.matmul(*_promoted(c, ts))),
    Known(("sign",), lambda c, xs: xs[0].dtype.kind == "f" and np.isnan(xs[0]).any(),
          "PyTorch 1.13's sign(NaN) is 0; braid keeps NaN, as NumPy does",
          lambda c, ts: torch.where(torch.isnan(ts[0]), ts[0], torch.sign(ts[0]))),
    Known(("softplus",),
          lambda c, xs: xs[0].dtype.name == "float64" and ((xs[0] > 20) & (xs[0] < 40)).any(),
          "PyTorch's softplus returns x itself above its threshold 20 (off by up to 1e-9 "
          "relative); braid computes log1p(exp(x)) exactly",
          lambda c, ts: torch.where(ts[0] > 20, ts[0] + torch.log1p(torch.exp(-ts[0])), F.softplus(ts[0]))),
    Known(("pad",), lambda c, xs: c["args"]["mode"] != "constant",
          "PyTorch's reflect/replicate padding exists only for float tensors of rank 2-5 with "
          "1-3 padded axes (and a batch/channel layout); braid pads any dtype and rank",
          _pad_by_axis),
    Known(("pad",), lambda c, xs: c["args"]["mode"] == "constant" and _torch_refuses_pad(c["args"], xs[0]),
          "PyTorch crops before padding, so it refuses a negative pad larger than the axis even "
          "when the positive pad on the other side makes up for it, and it refuses an empty "
          "result along a padded axis when some pad is positive; braid defines out[j] = "
          "x[j - before] (or the value) for any non-negative result size",
          None),
    Known(("div_scalar",), lambda c, xs: c["args"]["reverse"],
          "PyTorch computes s / x as s * reciprocal(x): one more rounding, and 0 * inf = NaN "
          "where 1 / x overflows; braid divides",
          lambda c, ts: torch.div(torch.tensor(py_scalar(num(c["args"]["scalar"]), dname(ts[0])),
                                               dtype=TD[c["expect"]["outputs"][0]["dtype"]]), ts[0])),
    Known(("concat",), lambda c, xs: any(x.shape == (0,) for x in xs),
          "PyTorch's cat skips 1-d empty tensors (a legacy rule), whatever the other ranks and "
          "the axis; braid requires equal ranks and a valid axis",
          None),
    Known(("expand",), lambda c, xs: 0 in c["args"]["shape"]
          and -1 in c["args"]["shape"][:len(c["args"]["shape"]) - xs[0].ndim],
          "PyTorch 1.13 lets -1 through on a new leading axis when the result is empty, giving a "
          "tensor with a negative size (a PyTorch bug); braid refuses -1 on new axes",
          None),
    Known(("gather", "scatter_add"), lambda c, xs: xs[1].size == 0,
          "PyTorch skips its index shape checks when the index is empty; braid checks them",
          None),
    Known(("narrow",), lambda c, xs: xs[0].ndim > 0 and _axis_len(c, xs[0]) == 0,
          "PyTorch wraps narrow's start like an axis index, so start -1 passes on an empty axis; "
          "braid requires -size <= start <= size",
          None),
    Known(("argmax", "argmin"), lambda c, xs: xs[0].dtype.name == "bool",
          "PyTorch has no argmax/argmin kernel for bool; braid ranks false below true",
          lambda c, ts: TORCH[c["op"]](c["args"], ts[0].to(torch.int32))),
    Known(("add", "sub"), lambda c, xs: c["args"]["alpha"] != 1,
          "braid computes add/sub with alpha as a +- (b * alpha), the product under its scalar "
          "rule (so an integer tensor with a fractional alpha gives float32 and bool * 2 gives "
          "int64); PyTorch refuses a fractional alpha for integer results and keeps bool",
          lambda c, ts: _alpha_as_product(c, ts)),
    Known(("matmul",), lambda c, xs: "bool" in (xs[0].dtype.name, xs[1].dtype.name),
          "PyTorch refuses bool matmul only when its kernel runs, so empty products pass; braid "
          "always refuses bool",
          None),
    Known(("tril", "triu"), lambda c, xs: xs[0].ndim < 2 and xs[0].size == 0,
          "PyTorch skips its rank check for empty tensors; braid requires 2 dimensions",
          None),
    Known(("gather", "index_select", "scatter_add"), _has_negative_index,
          "braid reads negative indices from the end, as Python does; PyTorch rejects them",
          lambda c, ts: TORCH[c["op"]](c["args"], *_wrapped(c, ts))),
    Known(CONV_POOL, _not_one_float,
          "braid's convolutions and pooling take floating-point operands of one dtype; PyTorch's CPU "
          "kernels check dtypes one by one: conv1d/conv2d run int32 and int64, conv_transpose2d and "
          "avg_pool2d int64, the slow float64 path adds a bias of any dtype, and nothing is checked "
          "when the input is empty",
          None),
    Known(("conv1d", "conv2d", "conv_transpose2d"), _empty_batch,
          "PyTorch takes a shortcut for an empty batch that skips argument checks (output_padding, "
          "dtypes, empty spatial axes) and fails on an internal view when groups > 1; braid checks "
          "an empty batch as it checks a batch of one",
          _batch_of_one),
    Known(("max_pool2d",), _empty_window,
          "braid refuses a dilated max_pool2d window whose taps all fall into the padding (it has no "
          "maximum); PyTorch gives -inf there",
          None),
    Known(("adaptive_avg_pool2d",),
          lambda c, xs: c["args"]["output_size"] == [1, 1] and (0 in xs[0].shape[-2:] or xs[0].ndim > 4),
          "PyTorch computes an output size of (1, 1) through mean(), skipping the checks of every "
          "other size: an empty spatial axis gives NaN, and inputs of rank 5 and more pass; braid "
          "refuses both",
          None),
    Known(("allclose",), lambda c, xs: xs[0].dtype != xs[1].dtype,
          "PyTorch's allclose requires equal dtypes; braid promotes the operands like other binary "
          "ops (comparing a float32 result with a float64 reference is a common use)",
          lambda c, ts: torch.tensor(torch.allclose(*_promoted(c, ts), c["args"]["rtol"], c["args"]["atol"]))),
    Known(("equal",), lambda c, xs: xs[0].dtype != xs[1].dtype,
          "PyTorch 1.13's equal promotes operands of different dtypes and compares values; braid's "
          "equal requires the same dtype (see ops.h)",
          None),
    Known(("equal",), lambda c, xs: xs[0].dtype == xs[1].dtype and xs[0].dtype.kind == "f",
          "braid's equal compares bytes, so a NaN equals a NaN with the same bits and 0.0 differs "
          "from -0.0; PyTorch compares values",
          _bitwise_equal),
    Known(("add_",), lambda c, xs: c["args"]["alpha"] != 1,
          "braid's add_ with alpha adds b * alpha, the product under its scalar rule, as add does "
          "(so bool += 2 * bool gives int64 and is refused in place); PyTorch keeps bool, and "
          "refuses a fractional alpha for integer tensors",
          _add_alpha_product),
]


# ---- comparing ----


def run(fn, case, ts):
    """fn's (PyTorch's) outputs as a list of tensors, or the exception it raised."""
    try:
        r = fn(case, ts)
    except Exception as e:  # noqa: BLE001 - any refusal counts as one
        return e
    return list(r) if isinstance(r, (tuple, list)) else [r]


def plain(case, ts):
    return TORCH[case["op"]](case["args"], *ts)


def differs(expect, got):
    """None when PyTorch's result matches the expectation, else a description of the difference."""
    if isinstance(got, Exception):
        if "error" in expect:
            return None
        return f"PyTorch rejects: {type(got).__name__}: {str(got).splitlines()[0][:160]}"
    if "error" in expect:
        return "PyTorch accepts: " + ", ".join(f"{dname(t)}{list(t.shape)}" for t in got)
    outs = expect["outputs"]
    if len(outs) != len(got):
        return f"{len(got)} outputs, expected {len(outs)}"
    for k, (o, t) in enumerate(zip(outs, got)):
        if dname(t) != o["dtype"] or list(t.shape) != o["shape"]:
            return f"output {k}: {dname(t)}{list(t.shape)}, expected {o['dtype']}{o['shape']}"
        want = np.frombuffer(bytes.fromhex(o["data"]), dtype=o["dtype"]).reshape(o["shape"])
        have = t.detach().contiguous().numpy()
        if o["dtype"] not in FLOATS:
            bad = have != want
        else:
            w, h = want.astype(np.float64), have.astype(np.float64)
            with np.errstate(all="ignore"):
                close = np.abs(h - w) <= o["atol"] + o["rtol"] * np.abs(w)
            bad = ~np.where(np.isnan(w), np.isnan(h), np.where(np.isinf(w), h == w, close))
        if bad.any():
            i = tuple(int(j) for j in np.argwhere(bad)[0])
            return (f"output {k}: {int(bad.sum())} of {bad.size} values differ, first at {list(i)}: "
                    f"PyTorch {have[i]!r}, expected {want[i]!r} (rtol {o['rtol']}, atol {o['atol']})")
    return None


def check_file(path):
    torch.set_num_threads(1)
    stats = collections.defaultdict(lambda: [0, 0, 0])  # op: cases, known, mismatches
    known_hits = collections.Counter()
    shown = 0
    with open(path) as f:
        next(f)
        for line in f:
            case = json.loads(line)
            op = case["op"]
            decoded = [decode(s) for s in case["inputs"]]
            xs, ts = [d[0] for d in decoded], [d[1] for d in decoded]
            stats[op][0] += 1
            problem = differs(case["expect"], run(plain, case, ts))
            if problem is None:
                continue
            for n, k in enumerate(KNOWN_DIFFERENCES):
                if op in k.ops and k.when(case, xs):
                    # fresh operands: an in-place op has written into the first ones
                    fresh = [decode(s)[1] for s in case["inputs"]]
                    if k.adapt is None or differs(case["expect"], run(k.adapt, case, fresh)) is None:
                        stats[op][1] += 1
                        known_hits[n] += 1
                        break
            else:
                stats[op][2] += 1
                shown += 1
                if shown <= 50:
                    print(f"MISMATCH case {case['id']} {op} args={json.dumps(case['args'])} "
                          f"inputs={[(x.dtype.name, list(x.shape)) for x in xs]}: {problem}")
    print(f"\n{'op':<14}{'cases':>7}{'known':>7}{'mismatch':>10}")
    for op, (n, k, m) in stats.items():
        print(f"{op:<14}{n:>7}{k:>7}{m:>10}")
    total = sum(s[2] for s in stats.values())
    print("\nknown differences used:")
    for n, k in enumerate(KNOWN_DIFFERENCES):
        print(f"  {known_hits[n]:>5}  {'/'.join(k.ops[:3])}{'...' if len(k.ops) > 3 else ''}: {k.reason}")
    print(f"\n{total} unexplained mismatches in {sum(s[0] for s in stats.values())} cases")
    return 1 if total else 0
