# Reference results for braid's differential test, whole-tensor comparisons (allclose, equal: a C++
# bool, written as a 0-d bool tensor) and in-place updates (fill_, add_, mul_, copy_: the first
# operand's contents afterwards, in its own dtype and shape), or Reject where PyTorch's rules, with
# braid's documented deviations, refuse the input.
import math

import numpy as np

from ref import RTOL_ARITH, Out, Reject, broadcast, is_float, ref_binary, ref_scalar
from values import INTS

# ---- whole-tensor comparisons ----


def close_margin(a, b, rtol, atol):
    """Per element of the broadcast operands: whether |a - b| <= atol + rtol |b| (with equal
    infinities close, NaN never, and an infinite difference never, as torch.isclose), and how far
    the difference is from the bound, relative to it (inf where no rounding can change the answer)."""
    a, b = np.broadcast_arrays(a.astype(np.float64), b.astype(np.float64))
    with np.errstate(all="ignore"):
        diff = np.abs(a - b)
        bound = atol + rtol * np.abs(b)
        close = (a == b) | (np.isfinite(diff) & (diff <= bound))
        margin = np.where((a != b) & np.isfinite(diff) & (bound > 0), np.abs(diff - bound) / bound, np.inf)
    return close, margin


def ref_allclose(args, a, b):
    rtol, atol = args["rtol"], args["atol"]
    if not (rtol >= 0 and atol >= 0):
        raise Reject()  # PyTorch refuses negative (and NaN) tolerances
    broadcast(a.shape, b.shape)
    # braid promotes mixed dtypes (PyTorch refuses them, see check_torch.py); the generator keeps
    # every difference far from its bound, so the dtype the test is computed in does not matter
    close, _ = close_margin(a, b, rtol, atol)
    return [Out(np.bool_(close.all()), "bool")]


def ref_equal(args, a, b):
    """braid's equal: the same shape, the same dtype and the same bytes (so NaN equals a NaN with
    the same bits and 0.0 differs from -0.0, where PyTorch compares values; see check_torch.py)."""
    same = (a.shape == b.shape and a.dtype == b.dtype
            and np.ascontiguousarray(a).tobytes() == np.ascontiguousarray(b).tobytes())
    return [Out(np.bool_(same), "bool")]


# ---- in-place updates ----


def overlapping(x):
    """Whether x is an expanded view whose elements share memory (a stride-0 axis of size 2 or
    more, and some elements): PyTorch refuses to write into it, fill_ excepted, which writes one
    value everywhere. The NumPy operand of an expanded view has the same zero strides."""
    return x.size > 0 and any(st == 0 and n > 1 for st, n in zip(x.strides, x.shape))


def can_cast(src, dst):
    """PyTorch's rule for writing a result back in place: never floating into integer or bool,
    nor integer into bool."""
    kind = {"bool": 0, "int32": 1, "int64": 1, "float32": 2, "float64": 2}
    return kind[src] <= kind[dst]


def _written(r, x):
    """An in-place result: r (an Out in the result type) checked and cast back to x's dtype."""
    d = x.dtype.name
    if r.value.shape != x.shape or not can_cast(r.dtype, d):
        raise Reject()
    if not is_float(d):
        return [Out(r.value, d)]
    return [Out(r.value, d, max(r.rtol, RTOL_ARITH[d]), r.atol)]


def ref_fill_(args, x):
    v, d = args["value"], x.dtype.name
    # PyTorch converts the value with an overflow check: integers take finite values in range
    # (truncated), float32 takes finite values up to its largest, bool takes anything
    if d in INTS:
        lim = 2.0 ** (31 if d == "int32" else 63)
        if not (math.isfinite(v) and -lim <= v < lim):
            raise Reject()
        v = math.trunc(v)
    elif d == "float32" and math.isfinite(v) and abs(v) > float(np.finfo(np.float32).max):
        raise Reject()
    elif d == "bool":
        v = v != 0
    return [Out(np.full(x.shape, v, dtype=np.float64 if is_float(d) else d), d)]


def ref_add_(args, x, other):
    if overlapping(x):
        raise Reject()
    r = ref_binary("add", args, x, other)[0]
    return _written(r, x)


def ref_mul_(args, x):
    if overlapping(x):
        raise Reject()
    r = ref_scalar("mul_scalar", {"scalar": args["value"], "reverse": False}, x)[0]
    return _written(r, x)


def ref_copy_(args, x, src):
    if overlapping(x) or broadcast(x.shape, src.shape) != x.shape:
        raise Reject()
    # float to integer truncates; the generator keeps such sources finite and in range
    return [Out(np.broadcast_to(src, x.shape), x.dtype.name)]
