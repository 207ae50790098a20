#!/usr/bin/env python3
# Writes braid's differential test cases: seeded random inputs for every public tensor op with the
# results PyTorch's semantics give (computed by NumPy, with braid's documented deviations), as JSON
# Lines for the C++ runner. --check-torch runs every case through PyTorch too, to keep the NumPy
# emulation honest. Non-finite floats in "args" are written as the strings "nan", "inf", "-inf".
#
#   python3 tests/diff/gen_cases.py --seed S --count N --out FILE [--ops add,sum,...] [--check-torch]
import argparse
import json
import math
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import numpy as np  # noqa: E402

import gen_extra  # noqa: E402
import ref  # noqa: E402
import ref_conv  # noqa: E402
import ref_inplace  # noqa: E402
import ref_shape  # noqa: E402
from ref import Reject  # noqa: E402
from values import DTYPES, FLOATS, INTS, Gen  # noqa: E402

# ---- per-op generators: each returns (args, [Input, ...]) ----

UNARY = ("neg abs exp log log1p expm1 sqrt rsqrt square reciprocal sin cos tanh sigmoid relu silu "
         "hardswish softplus erf asin acos atan sign floor ceil round logical_not isnan leaky_relu "
         "elu hardsigmoid gelu").split()
# Inputs mostly inside the function's domain, so NaN is not the usual answer.
DOMAIN = {"log": "pos", "log1p": "pos", "sqrt": "pos", "rsqrt": "pos", "asin": "unit", "acos": "unit"}
UNARY_ARGS = {
    "leaky_relu": lambda g: {"negative_slope": g.pick([0.01, 0.01, 0.2, 0.0, -0.5, 1.5])},
    "elu": lambda g: {"alpha": g.pick([1.0, 1.0, 0.5, 2.0, -1.0])},
    "hardsigmoid": lambda g: dict(zip(("alpha", "beta"), g.pick(
        [(1 / 6, 0.5), (1 / 6, 0.5), (0.2, 0.5), (1.0, 0.0), (-0.25, 0.3)]))),
    "gelu": lambda g: {"approximate": g.pick(["none", "tanh"])},
}
BINARY = "add sub mul div pow maximum minimum eq ne lt le gt ge logical_and logical_or logical_xor".split()
SCALAR = "add_scalar sub_scalar mul_scalar div_scalar".split()
# Whole numbers in and out of int32's range, fractions, non-finite values: braid's scalar rule
# decides between integer and float32 results for integer tensors.
SCALARS = [1.0, 1.0, -1.0, 0.0, 2.0, -3.0, 7.0, 100.0, 1e6, 0.5, -2.5, 0.1, 1e-3, 3e9, -3e9, 1e30,
           math.nan, math.inf, -math.inf]
REDUCE = "sum mean prod amax amin var std logsumexp".split()


def gen_unary(op):
    def gen(g):
        x = g.tensor(g.dtype(), g.shape(), DOMAIN.get(op, "any"))
        return UNARY_ARGS.get(op, lambda g: {})(g), [x]
    return gen


def gen_pow_scalar(g):
    d = g.dtype()
    if d in FLOATS or g.chance(0.5):
        e = g.pick([2.0, 3.0, 0.0, 1.0, -1.0, -2.0, 0.5, -0.5, 1.5, 2.5, -3.0, 1 / 3, 4.0, 0.25])
    else:  # small whole exponents keep integer powers of [-8, 8] in range
        e = float(g.int(-2, 4))
    return {"exponent": e}, [g.tensor(d, g.shape())]


def gen_clamp(g):
    bounds = [None, -1.0, 0.0, 0.5, 2.0, -2.5, 3.0, 3e9, math.inf, -math.inf]
    lo, hi = g.pick(bounds), g.pick(bounds)
    if lo is None and hi is None and g.chance(0.8):
        lo = -1.0
    return {"min": lo, "max": hi}, [g.tensor(g.dtype(), g.shape())]


def two_dtypes(g, p_same=0.6):
    da = g.dtype()
    return da, da if g.chance(p_same) else g.dtype()


def gen_binary(op):
    def gen(g):
        sa, sb = g.broadcast_shapes(2)
        da, db = two_dtypes(g)
        args = {}
        if op in ("add", "sub"):
            args["alpha"] = g.pick([1.0, 1.0, 1.0, 1.0, 2.0, -1.0, 0.5, 0.0, 1.5, 0.1])
        return args, [g.tensor(da, sa), g.tensor(db, sb)]
    return gen


def gen_scalar(g):
    return {"scalar": g.pick(SCALARS), "reverse": g.chance(0.3)}, [g.tensor(g.dtype(), g.shape())]


def gen_where(g):
    sc, sa, sb = g.broadcast_shapes(3)
    da, db = two_dtypes(g)
    return {}, [g.tensor("bool", sc), g.tensor(da, sa), g.tensor(db, sb)]


def gen_axes(g, nd):
    """Reduction axes: all ([]), a random subset (some negative), rarely out of range or repeated."""
    if g.chance(0.25):
        return []
    n = max(nd, 1)
    axes = [a - n if g.chance(0.3) else a for a in g.shuffled(range(n))[:g.int(1, n)]]
    if g.chance(0.05):
        axes.append(g.pick([n, -n - 1]))
    elif g.chance(0.03):
        axes.append(axes[0])
    return axes


def gen_reduce(op):
    def gen(g):
        shape = g.shape()
        numel = int(np.prod(shape, dtype=np.int64))
        # var/std: no huge values (their squares overflow in an order-dependent way)
        profile = {"prod": "prod", "var": "nohuge", "std": "nohuge"}.get(op, "any")
        x = g.tensor(g.dtype(), shape, profile, limit=numel)
        args = {"axes": gen_axes(g, len(shape)), "keepdim": g.chance(0.4)}
        if op in ("var", "std"):
            args["correction"] = g.pick([0, 1, 1, 2])
        return args, [x]
    return gen


def gen_arg(g):
    shape = g.shape()
    return {"axis": g.axis(len(shape)), "keepdim": g.chance(0.4)}, [g.tensor(g.dtype(), shape)]


def gen_softmax(g):
    shape = g.shape()
    return {"axis": g.axis(len(shape))}, [g.tensor(g.dtype(), shape)]


def gen_sum_to(g):
    shape = g.shape()
    target = [1 if g.chance(0.4) else s for s in shape[g.int(0, len(shape)):]]
    if g.chance(0.05):
        if target and any(s != 1 for s in target):
            i = g.pick([i for i, s in enumerate(target) if s != 1])
            target[i] += 1
        else:
            target = [2] + shape
    return {"shape": target}, [g.tensor(g.dtype(), shape)]


def gen_matmul(g):
    m, k, n = g.size(5), g.size(5), g.size(5)
    out = [g.size(4) for _ in range(g.int(0, 2))]
    ba = [1 if g.chance(0.3) else s for s in out[g.int(0, len(out)):]]
    bb = [1 if g.chance(0.3) else s for s in out[g.int(0, len(out)):]]
    form = g.pick(["vv", "vm", "mv", "mm", "bb", "bb", "vb", "bv"])
    sa = {"v": [k], "m": [m, k], "b": ba + [m, k]}[form[0]]
    sb = {"v": [k], "m": [k, n], "b": bb + [k, n]}[form[1]]
    if g.chance(0.05):
        sb[-2 if len(sb) > 1 else -1] = k + 1
    if g.chance(0.03):
        sa = []
    da, db = two_dtypes(g, 0.85)
    return {}, [g.tensor(da, sa, "nohuge"), g.tensor(db, sb, "nohuge")]


def shape_with_numel(g, numel):
    """A random shape holding numel elements (with size-1 axes sprinkled in)."""
    if numel == 0:
        shape = g.shape(1)
        shape[g.int(0, len(shape) - 1)] = 0
        return shape
    factors, p, rest = [], 2, numel
    while rest > 1:
        while rest % p == 0:
            factors.append(p)
            rest //= p
        p += 1
    rank = g.int(1 if numel > 1 else 0, 4)
    shape = [1] * rank
    for f in factors:
        shape[g.int(0, rank - 1)] *= f
    return shape


def gen_reshape(g):
    shape = g.shape()
    numel = int(np.prod(shape, dtype=np.int64))
    target = shape_with_numel(g, numel)
    if target and g.chance(0.4):
        target[g.int(0, len(target) - 1)] = -1
    if g.chance(0.05):
        target = target + [2] if g.chance(0.5) or not target else target[:-1] + [-1, -1]
    return {"shape": target}, [g.tensor(g.dtype(), shape)]


def gen_permute(g):
    shape = g.shape()
    nd = len(shape)
    order = [a - nd if g.chance(0.3) else a for a in g.shuffled(range(nd))]
    if g.chance(0.05):
        order = g.pick([order + [0], order[:-1], [nd] + order[1:], order[:1] * nd])
    return {"order": order}, [g.tensor(g.dtype(), shape)]


def gen_transpose(g):
    shape = g.shape()
    return {"a": g.axis(len(shape)), "b": g.axis(len(shape))}, [g.tensor(g.dtype(), shape)]


def axis_ok(a, nd):
    return -max(nd, 1) <= a < max(nd, 1)


def axis_size(shape, a):
    """The size along axis a; a stand-in where the axis is out of range or the tensor 0-d."""
    nd = len(shape)
    return shape[a % nd] if nd and axis_ok(a, nd) else 1 if not nd else 3


# A case carries at most one deliberate fault besides an out-of-range axis, and none with it, so
# that the error class an expectation names is the only one braid can raise.


def gen_narrow(g):
    shape = g.shape()
    a = g.axis(len(shape))
    n = axis_size(shape, a)
    start = g.int(-n, n)
    length = g.int(0, n - start % max(n, 1)) if start < n else 0
    if axis_ok(a, len(shape)) and g.chance(0.08):
        length, start = g.pick([(length + 1, start), (-1, start), (0, n + 1), (0, -n - 1)])
    return {"axis": a, "start": start, "length": length}, [g.tensor(g.dtype(), shape)]


def gen_slice(g):
    shape = g.shape()
    a = g.axis(len(shape))
    n = axis_size(shape, a)
    step = 0 if g.chance(0.03) else g.pick([1, 1, 2, 3])
    return ({"axis": a, "start": g.int(-n - 3, n + 3), "end": g.int(-n - 3, n + 3), "step": step},
            [g.tensor(g.dtype(), shape)])


def gen_expand(g):
    shape = g.shape()
    target = [g.pick([s, -1]) if s != 1 else g.pick([1, -1, 0, 2, 3, 5]) for s in shape]
    target = [g.size(4) for _ in range(g.int(0, 2))] + target
    if g.chance(0.05):
        bad = [i for i, s in enumerate(shape) if s > 1]
        if bad:
            target[len(target) - len(shape) + g.pick(bad)] += 1
        else:
            target = [-1] + target
    return {"shape": target}, [g.tensor(g.dtype(), shape)]


def gen_squeeze(g):
    shape = g.shape()
    return {"axis": None if g.chance(0.3) else g.axis(len(shape))}, [g.tensor(g.dtype(), shape)]


def gen_unsqueeze(g):
    shape = g.shape()
    n = len(shape) + 1
    a = g.pick([n, -n - 1]) if g.chance(0.05) else g.int(-n, n - 1)
    return {"axis": a}, [g.tensor(g.dtype(), shape)]


def gen_flatten(g):
    shape = g.shape()
    return {"start": g.axis(len(shape)), "end": g.axis(len(shape))}, [g.tensor(g.dtype(), shape)]


def gen_contiguous(g):
    return {}, [g.tensor(g.dtype(), g.shape(), view_p=0.8)]


def gen_cast(g):
    src, dst = g.dtype(), g.dtype()
    # float to integer is undefined behaviour in C++ for NaN, infinities and out-of-range values
    profile = "finite" if src in FLOATS and dst in INTS else "any"
    return {"dtype": dst}, [g.tensor(src, g.shape(), profile)]


def gen_select(g):
    shape = g.shape()
    a = g.axis(len(shape))
    n = axis_size(shape, a)
    i = g.pick([n, -n - 1]) if g.chance(0.05) or n == 0 else g.int(-n, n - 1)
    return {"axis": a, "index": i}, [g.tensor(g.dtype(), shape)]


def gen_concat(g):
    shape = g.shape(1) if g.chance(0.95) else []
    nd = len(shape)
    a = g.axis(nd)
    count = g.int(1, 4)
    d0 = g.dtype()
    shapes = []
    for _ in range(count):
        s = list(shape)
        if nd and -nd <= a < nd:
            s[a] = g.pick([0, 1, 2, 3, 4])
        shapes.append(s)
    if axis_ok(a, nd) and g.chance(0.05):
        s = shapes[g.int(0, count - 1)]
        if nd >= 2:
            s[(a + 1) % nd] += 1
        else:
            s.append(2)
    return {"axis": a}, [g.tensor(d0 if g.chance(0.7) else g.dtype(), s) for s in shapes]


def gen_stack(g):
    shape = g.shape(0, 3)
    n = len(shape) + 1
    a = g.pick([n, -n - 1]) if g.chance(0.05) else g.int(-n, n - 1)
    shapes = [list(shape) for _ in range(g.int(1, 4))]
    if -n <= a < n and g.chance(0.05):
        shapes[-1] = shapes[-1] + [2]
    d0 = g.dtype()
    return {"axis": a}, [g.tensor(d0 if g.chance(0.7) else g.dtype(), s) for s in shapes]


def gen_split(g):
    shape = g.shape(1) if g.chance(0.95) else []
    a = g.axis(len(shape))
    n = axis_size(shape, a)
    cuts = sorted(g.int(0, n) for _ in range(g.int(0, 3)))
    sizes = [hi - lo for lo, hi in zip([0] + cuts, cuts + [n])]
    if axis_ok(a, len(shape)) and g.chance(0.05):
        sizes[-1] += g.pick([1, -1])
    return {"sizes": sizes, "axis": a}, [g.tensor(g.dtype(), shape)]


def gen_chunk(g):
    shape = g.shape(1) if g.chance(0.95) else []
    a = g.axis(len(shape))
    n = g.pick([0, -1]) if axis_ok(a, len(shape)) and g.chance(0.03) else g.int(1, 5)
    return {"n": n, "axis": a}, [g.tensor(g.dtype(), shape)]


def index_shape(g, shape, a):
    """An index shape for gather/scatter_add, no larger than shape except along axis a, and
    whether it was made to break that rule."""
    nd = len(shape)
    out = [g.int(0, 4) if d == a % max(nd, 1) else g.int(0, s) for d, s in enumerate(shape)]
    if axis_ok(a, nd) and g.chance(0.03):
        return (out + [1] if g.chance(0.5) else [s + 1 for s in out]), True
    return out, False


def gen_gather(g):
    shape = g.shape()
    a = g.axis(len(shape))
    ishape, bad = index_shape(g, shape, a)
    index = g.index_tensor(ishape, axis_size(shape, a), p_bad=0 if bad else 0.05)
    return {"axis": a}, [g.tensor(g.dtype(), shape), index]


def gen_index_select(g):
    shape = g.shape()
    a = g.axis(len(shape))
    ishape = [] if g.chance(0.15) or not shape and g.chance(0.5) else [g.int(0, 6) if shape else 1]
    index = g.index_tensor(ishape, axis_size(shape, a), g.pick(INTS))
    return {"axis": a}, [g.tensor(g.dtype(), shape), index]


def gen_scatter_add(g):
    shape = g.shape()
    a = g.axis(len(shape))
    ishape, bad = index_shape(g, shape, a)
    sshape = [s + (g.int(0, 2) if g.chance(0.5) else 0) for s in ishape]
    d = g.dtype()
    if not bad and axis_ok(a, len(shape)) and g.chance(0.05):
        bad, d_src = True, g.pick([t for t in DTYPES if t != d])
    else:
        d_src = d
    index = g.index_tensor(ishape, axis_size(shape, a), p_bad=0 if bad else 0.05)
    src = g.tensor(d_src, sshape)
    return {"axis": a}, [g.tensor(d, shape), index, src]


def gen_pad(g):
    shape = g.shape()
    nd = len(shape)
    mode = g.pick(["constant", "constant", "reflect", "replicate"])
    k = g.int(1, nd) if nd else 1
    if mode == "constant":
        pads = [g.int(-2, 3) for _ in range(2 * k)]
    else:  # mostly within what reflect allows (pad < size), sometimes beyond
        top = [3 if g.chance(0.15) else max(shape[nd - 1 - i // 2] - 1, 0) if nd else 3 for i in range(2 * k)]
        pads = [g.int(0, min(t, 3)) for t in top]
    if g.chance(0.05):
        pads = pads[:-1] if g.chance(0.5) else pads + [1, 1]
    d = g.dtype()
    values = [0.0, 0.0, 1.5, -2.0, 7.0] + ([math.nan, -math.inf] if d in FLOATS else [])
    return {"pads": pads, "mode": mode, "value": g.pick(values)}, [g.tensor(d, shape)]


def gen_one_hot(g):
    shape = g.shape(0, 3)
    c = g.int(1, 6)
    labels = g.index_tensor(shape, c, negative=False)
    num = g.pick([c, c, -1, -1, c + 2])
    return {"num_classes": num}, [labels]


def gen_tri(g):
    shape = g.shape(2) if g.chance(0.9) else g.shape(0, 1)
    return {"diagonal": g.int(-4, 4)}, [g.tensor(g.dtype(), shape)]


def gen_full(g):
    shape = g.shape()
    if shape and g.chance(0.03):
        shape[0] = -1
    d = g.dtype()
    values = [0.0, 1.0, -2.5, 2.5, 7.0, 1e6]
    if d in FLOATS or d == "bool":
        values += [0.1, -0.0, 1e30, math.nan, math.inf, -math.inf]
    return {"shape": shape, "value": g.pick(values), "dtype": d}, []


def gen_arange(g):
    d = g.dtype(("float32", "float64", "int64", "int32"))
    count = g.int(0, 10)
    if d in FLOATS and g.chance(0.4):  # exact arithmetic: end may sit on the grid and is excluded
        start = float(g.int(-5, 5))
        step = g.pick([1.0, 0.5, -1.0, 2.0, 0.25, -0.5])
        end = start + step * count
    elif d in FLOATS:
        # end well between two grid points, so the length does not hang on how it is computed
        start = g.pick([0.0, round(g.uniform(-5, 5), 3)])
        step = g.pick([1.0, 0.3, -0.7, 0.1])
        end = start + step * (count - g.uniform(0.1, 0.9))
    else:
        start = float(g.int(-5, 5))
        step = float(g.pick([1, 1, 2, 3, -1, -2]))
        end = start + step * count - g.pick([0.0, math.copysign(1.0, step)]) * (count > 0)
    if g.chance(0.05):
        step = g.pick([0.0, -step])
    return {"start": start, "end": end, "step": step, "dtype": d}, []


def gen_linspace(g):
    d = g.dtype(("float32", "float64", "int64", "int32"))
    steps = -1 if g.chance(0.03) else g.int(0, 8)
    if d in FLOATS:
        start, end = round(g.uniform(-10, 10), 2), round(g.uniform(-10, 10), 2)
    else:  # whole steps, so every formula gives the same integers
        start = float(g.int(-10, 10))
        end = start + g.int(-3, 3) * max(steps - 1, 0)
    return {"start": start, "end": end, "steps": steps, "dtype": d}, []


def gen_eye(g):
    return {"n": -1 if g.chance(0.03) else g.int(0, 6), "dtype": g.dtype()}, []


# op name: (generator, reference taking (args, *operands))
OPS = {}
for _op in UNARY:
    OPS[_op] = (gen_unary(_op), lambda a, x, _op=_op: ref.ref_unary(_op, a, x))
OPS["pow_scalar"] = (gen_pow_scalar, ref.ref_pow_scalar)
OPS["clamp"] = (gen_clamp, ref.ref_clamp)
for _op in BINARY:
    OPS[_op] = (gen_binary(_op), lambda a, x, y, _op=_op: ref.ref_binary(_op, a, x, y))
for _op in SCALAR:
    OPS[_op] = (gen_scalar, lambda a, x, _op=_op: ref.ref_scalar(_op, a, x))
OPS["where"] = (gen_where, ref.ref_where)
for _op in REDUCE:
    OPS[_op] = (gen_reduce(_op), lambda a, x, _op=_op: ref.ref_reduce(_op, a, x))
for _op in ("argmax", "argmin"):
    OPS[_op] = (gen_arg, lambda a, x, _op=_op: ref.ref_arg(_op, a, x))
for _op in ("softmax", "log_softmax"):
    OPS[_op] = (gen_softmax, lambda a, x, _op=_op: ref.ref_softmax(_op, a, x))
OPS["sum_to"] = (gen_sum_to, ref.ref_sum_to)
OPS["matmul"] = (gen_matmul, ref.ref_matmul)
for _op, _gen in [("reshape", gen_reshape), ("permute", gen_permute), ("transpose", gen_transpose),
                  ("narrow", gen_narrow), ("slice", gen_slice), ("expand", gen_expand),
                  ("squeeze", gen_squeeze), ("unsqueeze", gen_unsqueeze), ("flatten", gen_flatten),
                  ("cast", gen_cast), ("select", gen_select),
                  ("concat", gen_concat), ("stack", gen_stack), ("split", gen_split),
                  ("chunk", gen_chunk), ("gather", gen_gather), ("index_select", gen_index_select),
                  ("scatter_add", gen_scatter_add), ("pad", gen_pad), ("one_hot", gen_one_hot),
                  ("full", gen_full), ("arange", gen_arange), ("linspace", gen_linspace),
                  ("eye", gen_eye)]:
    OPS[_op] = (_gen, getattr(ref_shape, "ref_" + _op))
OPS["contiguous"] = (gen_contiguous, lambda a, x: [ref.Out(x, x.dtype.name)])
for _op in ("tril", "triu"):
    OPS[_op] = (gen_tri, lambda a, x, _op=_op: ref_shape.ref_tri(_op, a, x))
# convolution and pooling, whole-tensor comparisons and in-place updates (generators in gen_extra.py)
for _mod, _ops in [(ref_conv, ("conv1d", "conv2d", "conv_transpose2d", "max_pool2d", "avg_pool2d",
                               "adaptive_avg_pool2d")),
                   (ref_inplace, ("allclose", "equal", "fill_", "add_", "mul_", "copy_"))]:
    for _op in _ops:
        OPS[_op] = (getattr(gen_extra, "gen_" + _op), getattr(_mod, "ref_" + _op))


# ---- writing ----

def json_args(v):
    """Strict JSON for args: non-finite floats become strings."""
    if isinstance(v, dict):
        return {k: json_args(x) for k, x in v.items()}
    if isinstance(v, list):
        return [json_args(x) for x in v]
    if isinstance(v, float) and not math.isfinite(v):
        return "nan" if math.isnan(v) else "inf" if v > 0 else "-inf"
    return v


def out_spec(o):
    return {"dtype": o.dtype, "shape": list(o.value.shape), "data": o.value.tobytes().hex(),
            "rtol": o.rtol, "atol": o.atol}


def make_case(seed, case_id, op):
    gen, reference = OPS[op]
    g = Gen(seed, case_id)
    args, inputs = gen(g)
    try:
        expect = {"outputs": [out_spec(o) for o in reference(args, *[i.value for i in inputs])]}
    except Reject as r:
        expect = {"error": r.kind}
    return {"id": case_id, "op": op, "args": json_args(args), "inputs": [i.spec() for i in inputs],
            "expect": expect}


def main():
    p = argparse.ArgumentParser(description="Write braid differential test cases.")
    p.add_argument("--seed", type=int, required=True)
    p.add_argument("--count", type=int, required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--ops", help="comma-separated subset of ops (default: all)")
    p.add_argument("--check-torch", action="store_true",
                   help="also run every case through PyTorch and compare with the emulation")
    a = p.parse_args()
    ops = a.ops.split(",") if a.ops else list(OPS)
    unknown = [o for o in ops if o not in OPS]
    if unknown:
        p.error("unknown ops: " + ", ".join(unknown))
    t0 = time.time()
    with open(a.out, "w") as f:
        header = {"format": "braid-diff-1", "seed": a.seed, "count": a.count, "numpy": np.__version__}
        f.write(json.dumps(header) + "\n")
        for i in range(a.count):
            f.write(json.dumps(make_case(a.seed, i, ops[i % len(ops)]), allow_nan=False) + "\n")
    print(f"wrote {a.count} cases for {len(ops)} ops to {a.out} in {time.time() - t0:.1f} s")
    if a.check_torch:
        try:
            import check_torch
        except ImportError as e:
            sys.exit(f"--check-torch needs PyTorch ({e}); run it with /usr/bin/python3")
        sys.exit(check_torch.check_file(a.out))


if __name__ == "__main__":
    main()
