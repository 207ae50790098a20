# Reference results for braid's differential test, shape, indexing and creation ops: what PyTorch's
# semantics (with braid's documented deviations) give, or Reject where they refuse the input. Data
# movement is exact; only scatter_add (float sums), arange and linspace need a tolerance.
import math

import numpy as np

from ref import EPS, RTOL_ARITH, Out, Reject, is_float, max_abs, norm_axis, promote
from values import INTS

# ---- shape and indexing ----


def ref_reshape(args, x):
    shape = list(args["shape"])
    if shape.count(-1) > 1 or any(s < -1 for s in shape):
        raise Reject()
    if -1 in shape:
        known = int(np.prod([s for s in shape if s != -1], dtype=np.int64))
        if known == 0 or x.size % known:
            raise Reject()  # with a 0 elsewhere the -1 is ambiguous
        shape[shape.index(-1)] = x.size // known
    if int(np.prod(shape, dtype=np.int64)) != x.size:
        raise Reject()
    return [Out(x.reshape(shape), x.dtype.name)]


def ref_permute(args, x):
    order = args["order"]
    if len(order) != x.ndim:
        raise Reject()
    order = [norm_axis(a, x.ndim) for a in order]
    if len(set(order)) != len(order):
        raise Reject()
    return [Out(x.transpose(order) if x.ndim else x, x.dtype.name)]


def ref_transpose(args, x):
    a, b = norm_axis(args["a"], x.ndim), norm_axis(args["b"], x.ndim)
    return [Out(np.swapaxes(x, a, b) if x.ndim else x, x.dtype.name)]


def _take(x, a, sl):
    return x[(slice(None),) * a + (sl,)]


def ref_narrow(args, x):
    if x.ndim == 0:
        raise Reject()
    a = norm_axis(args["axis"], x.ndim)
    n, start, length = x.shape[a], args["start"], args["length"]
    if not -n <= start <= n:
        raise Reject()
    if start < 0:
        start += n
    if length < 0 or start + length > n:
        raise Reject()
    return [Out(_take(x, a, slice(start, start + length)), x.dtype.name)]


def ref_slice(args, x):
    if x.ndim == 0:
        raise Reject()
    a = norm_axis(args["axis"], x.ndim)
    if args["step"] < 1:
        raise Reject()
    return [Out(_take(x, a, slice(args["start"], args["end"], args["step"])), x.dtype.name)]


def ref_expand(args, x):
    shape = list(args["shape"])
    lead = len(shape) - x.ndim
    if lead < 0 or any(s < 0 for s in shape[:lead]):
        raise Reject()
    for i, n in enumerate(x.shape):
        s = shape[lead + i]
        if s == -1:
            shape[lead + i] = n
        elif s != n and (n != 1 or s < 0):
            raise Reject()
    return [Out(np.broadcast_to(x, shape), x.dtype.name)]


def ref_squeeze(args, x):
    if args["axis"] is None:
        return [Out(x.reshape([n for n in x.shape if n != 1]), x.dtype.name)]
    a = norm_axis(args["axis"], x.ndim)
    if x.ndim and x.shape[a] == 1:
        x = np.squeeze(x, a)
    return [Out(x, x.dtype.name)]


def ref_unsqueeze(args, x):
    return [Out(np.expand_dims(x, norm_axis(args["axis"], x.ndim, extra=1)), x.dtype.name)]


def ref_flatten(args, x):
    s, e = norm_axis(args["start"], x.ndim), norm_axis(args["end"], x.ndim)
    if s > e:
        raise Reject()
    if x.ndim == 0:
        return [Out(x.reshape(1), x.dtype.name)]
    shape = list(x.shape[:s]) + [int(np.prod(x.shape[s:e + 1], dtype=np.int64))] + list(x.shape[e + 1:])
    return [Out(x.reshape(shape), x.dtype.name)]


def ref_cast(args, x):
    # float to integer truncates toward zero; the generator keeps such inputs finite and in range
    return [Out(x, args["dtype"])]


def ref_select(args, x):
    if x.ndim == 0:
        raise Reject()
    a = norm_axis(args["axis"], x.ndim)
    i = args["index"]
    if not -x.shape[a] <= i < x.shape[a]:
        raise Reject("IndexError")
    return [Out(np.take(x, i, axis=a), x.dtype.name)]


def ref_concat(args, *xs):
    x0 = xs[0]
    if any(x.ndim == 0 for x in xs) or any(x.ndim != x0.ndim for x in xs):
        raise Reject()
    a = norm_axis(args["axis"], x0.ndim)
    for x in xs:
        if any(x.shape[d] != x0.shape[d] for d in range(x0.ndim) if d != a):
            raise Reject()
    d = promote(*[x.dtype.name for x in xs])
    return [Out(np.concatenate([x.astype(d) for x in xs], axis=a), d)]


def ref_stack(args, *xs):
    if any(x.shape != xs[0].shape for x in xs):
        raise Reject()
    a = norm_axis(args["axis"], xs[0].ndim, extra=1)
    d = promote(*[x.dtype.name for x in xs])
    return [Out(np.stack([x.astype(d) for x in xs], axis=a), d)]


def ref_split(args, x):
    if x.ndim == 0:
        raise Reject()
    a = norm_axis(args["axis"], x.ndim)
    sizes = args["sizes"]
    if any(s < 0 for s in sizes) or sum(sizes) != x.shape[a]:
        raise Reject()
    bounds = np.cumsum([0] + sizes)
    return [Out(_take(x, a, slice(int(lo), int(hi))), x.dtype.name) for lo, hi in zip(bounds, bounds[1:])]


def ref_chunk(args, x):
    if x.ndim == 0 or args["n"] <= 0:
        raise Reject()
    a = norm_axis(args["axis"], x.ndim)
    n, size = args["n"], x.shape[a]
    if size == 0:  # PyTorch gives n empty pieces
        return [Out(x, x.dtype.name) for _ in range(n)]
    step = -(-size // n)
    return [Out(_take(x, a, slice(lo, lo + step)), x.dtype.name) for lo in range(0, size, step)]


def _wrap(index, size):
    """braid's index rule: values in [-size, size), negative ones counting from the end."""
    index = index.astype(np.int64)
    if index.size and (index.min() < -size or index.max() >= size):
        raise Reject("IndexError")
    return np.where(index < 0, index + size, index)


def _check_index_shape(x, a, index, others):
    if index.ndim != x.ndim or any(o.ndim != x.ndim for o in others):
        raise Reject()
    for d in range(x.ndim):
        if (d != a and index.shape[d] > x.shape[d]) or any(index.shape[d] > o.shape[d] for o in others):
            raise Reject()


def _as_1d(t):
    """PyTorch's gather and scatter_add treat every 0-d operand as 1-d of size 1."""
    return t.reshape(1) if t.ndim == 0 else t


def ref_gather(args, x, index):
    a = norm_axis(args["axis"], x.ndim)
    if index.dtype.name != "int64":
        raise Reject()
    x1, i1 = _as_1d(x), _as_1d(index)
    _check_index_shape(x1, a, i1, [])
    idx = _wrap(i1, x1.shape[a])
    sub = x1[tuple(slice(None) if d == a else slice(0, i1.shape[d]) for d in range(x1.ndim))]
    return [Out(np.take_along_axis(sub, idx, axis=a).reshape(index.shape), x.dtype.name)]


def ref_index_select(args, x, index):
    a = norm_axis(args["axis"], x.ndim)
    if index.dtype.name not in INTS or index.ndim > 1:
        raise Reject()
    if x.ndim == 0:
        if index.size != 1:
            raise Reject()
        _wrap(index, 1)
        return [Out(x, x.dtype.name)]
    return [Out(np.take(x, _wrap(index.reshape(-1), x.shape[a]), axis=a), x.dtype.name)]


def ref_scatter_add(args, x, index, src):
    a = norm_axis(args["axis"], x.ndim)
    d = x.dtype.name
    if index.dtype.name != "int64" or src.dtype.name != d:
        raise Reject()
    x1, i1, s1 = _as_1d(x), _as_1d(index), _as_1d(src)
    _check_index_shape(x1, a, i1, [s1])
    ct = np.float64 if is_float(d) else np.int64
    out = x1.astype(ct)
    pos = list(np.indices(i1.shape))
    pos[a] = _wrap(i1, x1.shape[a])
    with np.errstate(all="ignore"):
        np.add.at(out, tuple(pos), s1[tuple(slice(0, n) for n in i1.shape)].astype(ct))
    out = out.reshape(x.shape)
    if d == "bool":
        return [Out(out != 0, d)]
    if not is_float(d):
        return [Out(out, d)]
    # duplicate indices accumulate in an unspecified order
    return [Out(out, d, RTOL_ARITH[d], 2 * (i1.shape[a] + 1) * EPS[d] * max_abs(x, src))]


def ref_pad(args, x):
    pads, mode = args["pads"], args["mode"]
    if len(pads) % 2 or len(pads) > 2 * x.ndim:
        raise Reject()
    d = x.dtype.name
    if mode != "constant":
        width = [(0, 0)] * x.ndim
        for i in range(len(pads) // 2):
            a, (lo, hi) = x.ndim - 1 - i, pads[2 * i:2 * i + 2]
            n = x.shape[a]
            if lo < 0 or hi < 0 or n == 0 or (mode == "reflect" and not (lo < n and hi < n)):
                raise Reject()
            width[a] = (lo, hi)
        return [Out(np.pad(x, width, mode="reflect" if mode == "reflect" else "edge"), d)]
    # out[j] = x[j - before] where that exists, else the value: negative pads crop
    shape, src, dst = list(x.shape), [slice(None)] * x.ndim, [slice(None)] * x.ndim
    for i in range(len(pads) // 2):
        a, (lo, hi) = x.ndim - 1 - i, pads[2 * i:2 * i + 2]
        n = x.shape[a]
        if n + lo + hi < 0:
            raise Reject()
        shape[a] = n + lo + hi
        first, last = max(-lo, 0), max(n - max(-hi, 0), max(-lo, 0))
        src[a] = slice(first, last)
        dst[a] = slice(max(lo, 0), max(lo, 0) + last - first)
    out = np.full(shape, _fill_value(args["value"], d), dtype=x.dtype)
    out[tuple(dst)] = x[tuple(src)]
    return [Out(out, d)]


def ref_one_hot(args, labels):
    c = args["num_classes"]
    if labels.dtype.name != "int64":
        raise Reject()
    if c == -1:
        if labels.size == 0:
            raise Reject()
        c = int(labels.max()) + 1
    if labels.size and (labels.min() < 0 or labels.max() >= c):
        raise Reject()
    return [Out(labels[..., None] == np.arange(c), "int64")]


def ref_tri(op, args, x):
    if x.ndim < 2:
        raise Reject()
    rows, cols, k = x.shape[-2], x.shape[-1], args["diagonal"]
    mask = np.tri(rows, cols, k, dtype=bool) if op == "tril" else ~np.tri(rows, cols, k - 1, dtype=bool)
    return [Out(np.where(mask, x, np.zeros((), x.dtype)), x.dtype.name)]


# ---- creation ----

def _fill_value(v, d):
    return (v != 0) if d == "bool" else math.trunc(v) if d in INTS else v


def ref_full(args):
    if any(s < 0 for s in args["shape"]):
        raise Reject()
    d = args["dtype"]
    value = _fill_value(args["value"], d)
    return [Out(np.full(args["shape"], value, dtype=np.float64 if is_float(d) else d), d)]


def ref_arange(args):
    start, end, step, d = args["start"], args["end"], args["step"], args["dtype"]
    if step == 0 or (end - start) * step < 0:
        raise Reject()
    n = max(0, math.ceil((end - start) / step))
    r = start + np.arange(n, dtype=np.float64) * step
    if not is_float(d):
        return [Out(r, d)]
    # computed in the result type instead of double: an error of a few ulps of the largest value
    return [Out(r, d, RTOL_ARITH[d], 4 * EPS[d] * max(abs(start), abs(end), abs(step)))]


def ref_linspace(args):
    start, end, steps, d = args["start"], args["end"], args["steps"], args["dtype"]
    if steps < 0:
        raise Reject()
    if steps == 1:
        r = np.array([start], dtype=np.float64)
    else:
        # PyTorch's formula: from the start for the first half, from the end for the second
        step = (end - start) / max(steps - 1, 1)
        i = np.arange(steps, dtype=np.float64)
        r = np.where(i < steps // 2, start + step * i, end - step * (steps - 1 - i))
    if not is_float(d):
        return [Out(np.trunc(r), d)]
    return [Out(r, d, RTOL_ARITH[d], 4 * EPS[d] * max(abs(start), abs(end)))]


def ref_eye(args):
    if args["n"] < 0:
        raise Reject()
    return [Out(np.eye(args["n"]), args["dtype"])]
