# Reference results for braid's differential test, elementwise ops, reductions and matmul (shape,
# indexing and creation ops are in ref_shape.py): one NumPy function per op that returns what
# PyTorch's semantics, with braid's documented deviations, give for the operands, or raises Reject
# where they refuse the input. Floats are computed in float64 and rounded to the result dtype; each
# output carries the tolerance that legitimate differences in rounding need.
import math

import numpy as np

from values import FLOATS, INTS

ORDER = ("bool", "int32", "int64", "float32", "float64")
EPS = {"float32": 2.0 ** -23, "float64": 2.0 ** -52}
# Results within a few times the smallest normal may come through denormal intermediates (flushed
# or short of precision): an absolute slack every float output gets.
TINY = {"float32": 2.0 ** -124, "float64": 2.0 ** -1020}
# Correctly rounded operations and those with one or two extra roundings.
RTOL_ARITH = {"float32": 1e-6, "float64": 1e-12}
# Library transcendentals are good to a few ulps; float32 ones come from vectorised polynomials.
RTOL_TRANS = {"float32": 4e-6, "float64": 1e-12}


class Reject(Exception):
    """The reference refuses the input; kind is the error class braid must throw, or "any"."""

    def __init__(self, kind="any"):
        super().__init__(kind)
        self.kind = kind


class Out:
    """One expected output: the values in the result dtype and the tolerance for floats."""

    def __init__(self, value, dtype, rtol=0.0, atol=0.0):
        with np.errstate(all="ignore"):
            self.value = np.array(np.asarray(value).astype(dtype), order="C")  # keeps 0-d
        self.dtype = dtype
        floating = dtype in FLOATS
        self.rtol = float(rtol) if floating else 0.0
        self.atol = float(atol) + TINY[dtype] if floating else 0.0


def promote(*dtypes):
    return max(dtypes, key=ORDER.index)


def is_float(d):
    return d in FLOATS


def f64(x, via=None):
    """x as float64; via rounds through another dtype first (an int tensor entering a float32 op)."""
    x = np.asarray(x)
    return (x.astype(via) if via else x).astype(np.float64)


def max_abs(*xs):
    """The largest finite magnitude among the operands (0 if none): the scale of rounding errors."""
    m = 0.0
    for x in xs:
        x = np.asarray(x, dtype=np.float64)
        fin = np.abs(x[np.isfinite(x)])
        if fin.size:
            m = max(m, float(fin.max()))
    return m


def whole_fits(v, d):
    """braid's scalar rule: a whole number within the integer type acts as a Python int."""
    lim = {"int32": 2 ** 31, "int64": 2 ** 63, "bool": 2 ** 63}[d]
    return math.isfinite(v) and v == math.trunc(v) and -lim <= v < lim


def scalar_dtype(d, v):
    """The result dtype of tensor dtype d combined with the C++ double v under braid's rule."""
    if is_float(d):
        return d
    if whole_fits(v, d):
        return "int64" if d == "bool" else d
    return "float32"


def norm_axis(a, nd, extra=0):
    """Axis a of a rank-nd tensor (nd + extra positions for ops that insert an axis)."""
    n = max(nd + extra, 1)
    if not -n <= a < n:
        raise Reject("IndexError")
    return a % n


def norm_axes(axes, nd):
    """Reduction axes: [] is every axis; a 0-d tensor takes 0 and -1 and reduces nothing."""
    if not axes:
        return tuple(range(nd))
    out = [norm_axis(a, nd) for a in axes]
    if len(set(out)) != len(out):
        raise Reject()
    return tuple(out) if nd else ()


def broadcast(*shapes):
    try:
        return tuple(np.broadcast_shapes(*[tuple(s) for s in shapes]))
    except ValueError:
        raise Reject() from None


# ---- elementwise unary ----

def _sigmoid(x):
    e = np.exp(-np.abs(x))
    return np.where(x >= 0, 1 / (1 + e), e / (1 + e))


_erf_obj = np.frompyfunc(math.erf, 1, 1)
_erfc_obj = np.frompyfunc(math.erfc, 1, 1)


def _erf(x):
    return np.asarray(_erf_obj(x), dtype=np.float64)


def _erfc(x):
    return np.asarray(_erfc_obj(x), dtype=np.float64)


def _gelu(x, approximate):
    if approximate == "tanh":
        # 0.5 x (1 + tanh(u)) = x sigmoid(2u): no cancellation for negative x
        u = math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3)
        return x * _sigmoid(2 * u)
    return 0.5 * x * _erfc(-x / math.sqrt(2))


# op: (float64 function of (x, args), rtol table, absolute error term per dtype (None: 0))
FLOAT_UNARY = {
    "exp": (lambda x, a: np.exp(x), RTOL_TRANS, None),
    "log": (lambda x, a: np.log(x), RTOL_TRANS, None),
    "log1p": (lambda x, a: np.log1p(x), RTOL_TRANS, None),
    "expm1": (lambda x, a: np.expm1(x), RTOL_TRANS, None),
    "sqrt": (lambda x, a: np.sqrt(x), RTOL_ARITH, None),
    "rsqrt": (lambda x, a: 1 / np.sqrt(x), RTOL_ARITH, None),
    "reciprocal": (lambda x, a: 1 / x, RTOL_ARITH, None),
    # after argument reduction the absolute error is about ulp(1), unbounded relative near zeros
    "sin": (lambda x, a: np.sin(x), RTOL_TRANS, {"float32": 2e-7, "float64": 1e-15}),
    "cos": (lambda x, a: np.cos(x), RTOL_TRANS, {"float32": 2e-7, "float64": 1e-15}),
    "tanh": (lambda x, a: np.tanh(x), RTOL_TRANS, None),
    "sigmoid": (lambda x, a: _sigmoid(x), RTOL_TRANS, None),
    # x / (1 + exp(-x)) gives -0 once exp(-x) overflows, though x e^x is still ~1e-37 (float32)
    "silu": (lambda x, a: x * _sigmoid(x), RTOL_TRANS, {"float32": 1e-36, "float64": 1e-305}),
    # (x + 3) and x / 6 + 0.5 forms differ by a rounding of ~3 ulp(1) near x = -3
    "hardswish": (lambda x, a: x * np.clip(x + 3, 0, 6) / 6, RTOL_ARITH,
                  {"float32": 8 * EPS["float32"], "float64": 8 * EPS["float64"]}),
    "softplus": (lambda x, a: np.maximum(x, 0) + np.log1p(np.exp(-np.abs(x))), RTOL_TRANS, None),
    "erf": (lambda x, a: _erf(x), RTOL_TRANS, None),
    "asin": (lambda x, a: np.arcsin(x), RTOL_TRANS, None),
    "acos": (lambda x, a: np.arccos(x), RTOL_TRANS, None),
    "atan": (lambda x, a: np.arctan(x), RTOL_TRANS, None),
    "leaky_relu": (lambda x, a: np.where(x > 0, x, x * a["negative_slope"]), RTOL_ARITH, None),
    # exp(x) - 1 and expm1(x) differ by ~ulp(1) times alpha for small negative x
    "elu": (lambda x, a: np.where(x > 0, x, a["alpha"] * np.expm1(np.minimum(x, 0))), RTOL_TRANS, "alpha"),
    "hardsigmoid": (lambda x, a: np.clip(a["alpha"] * x + a["beta"], 0, 1), RTOL_ARITH, "beta"),
    # 1 + erf / 1 + tanh cancel for negative x: absolute error ~ |x| ulp(1), |x| < 8 where it matters
    "gelu": (lambda x, a: _gelu(x, a["approximate"]), RTOL_TRANS,
             {"float32": 8 * EPS["float32"], "float64": 16 * EPS["float64"]}),
}

EXACT_UNARY = {
    "neg": np.negative, "abs": np.abs, "floor": np.floor, "ceil": np.ceil, "round": np.round,
    "relu": lambda x: np.where((x > 0) | np.isnan(x), x, np.zeros((), x.dtype)),
    "sign": np.sign,
    "square": lambda x: x * x,
}


def ref_unary(op, args, x):
    d = x.dtype.name
    if op in ("logical_not", "isnan"):
        return [Out(x == 0 if op == "logical_not" else np.isnan(f64(x)), "bool")]
    if op in FLOAT_UNARY:
        fn, rtols, abs_term = FLOAT_UNARY[op]
        rd = d if is_float(d) else "float32"
        with np.errstate(all="ignore"):
            r = fn(f64(x, rd), args)
        if abs_term == "alpha":
            atol = 2 * EPS[rd] * abs(args["alpha"])
        elif abs_term == "beta":
            atol = 4 * EPS[rd] * max(1.0, abs(args["beta"]))
        else:
            atol = abs_term[rd] if abs_term else 0.0
        return [Out(r, rd, rtols[rd], atol)]
    if d == "bool":
        if op in ("neg", "abs", "relu", "floor", "ceil", "round"):
            raise Reject()
        if op == "square":
            return [Out(x.astype(np.int64), "int64")]
        return [Out(x, "bool")]  # sign
    with np.errstate(all="ignore"):
        return [Out(EXACT_UNARY[op](x), d)]


def _pow(a, b):
    """C's pow, which some NumPy versions replace by sqrt for exponent 0.5 (pow(-inf, 0.5) is
    +inf, sqrt(-inf) NaN; pow(-0.0, -0.5) is +inf, 1 / sqrt(-0.0) -inf)."""
    a, b = np.broadcast_arrays(np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64))
    r = np.power(a, b)
    fraction = np.isfinite(b) & (b != np.trunc(b))
    r = np.where(fraction & (a == -np.inf), np.where(b > 0, np.inf, 0.0), r)
    return np.where(fraction & (a == 0) & (b < 0), np.inf, r)


def ref_pow_scalar(args, x):
    e = args["exponent"]
    d = x.dtype.name
    rd = scalar_dtype(d, e)
    if rd in INTS:
        if e < 0:
            raise Reject()  # PyTorch: integers to negative integer powers are not allowed
        return [Out(x.astype(np.int64) ** int(e), rd)]
    # PyTorch rounds the exponent to the tensor's float type. x^0.5 and x^-0.5 are pow's, at -inf
    # and -0.0 too (Note [Pow's special cases]; PyTorch's sqrt/rsqrt differ there, check_torch.py)
    with np.errstate(all="ignore"):
        r = _pow(f64(x, rd), float(np.float64(e).astype(rd)))
    return [Out(r, rd, RTOL_TRANS[rd])]


def ref_clamp(args, x):
    lo, hi = args["min"], args["max"]
    if lo is None and hi is None:
        raise Reject()
    if lo is not None and hi is not None and lo > hi:
        raise Reject()  # braid refuses min > max, where PyTorch sets every element to max (see ops.h)
    d = x.dtype.name
    rd = d
    for b in (lo, hi):
        if b is not None:
            rd = promote(rd, scalar_dtype(d, b))
    with np.errstate(all="ignore"):
        r = f64(x, rd)
        if lo is not None:
            r = np.where(r < float(np.float64(lo).astype(rd)), float(np.float64(lo).astype(rd)), r)
        if hi is not None:
            r = np.where(r > float(np.float64(hi).astype(rd)), float(np.float64(hi).astype(rd)), r)
    return [Out(r, rd)]


# ---- elementwise binary ----

COMPARE = {"eq": np.equal, "ne": np.not_equal, "lt": np.less, "le": np.less_equal,
           "gt": np.greater, "ge": np.greater_equal}
LOGICAL = {"logical_and": np.logical_and, "logical_or": np.logical_or,
           "logical_xor": np.logical_xor}


def ref_binary(op, args, a, b):
    alpha = args.get("alpha", 1.0)
    if op == "sub" and "bool" in (a.dtype.name, b.dtype.name):
        raise Reject()  # PyTorch refuses subtraction with any bool operand, whatever alpha
    if alpha != 1:
        # braid computes a +- (b * alpha), the product under the scalar rule
        b = ref_scalar("mul_scalar", {"scalar": alpha, "reverse": False}, b)[0].value
    shape = broadcast(a.shape, b.shape)
    da, db = a.dtype.name, b.dtype.name
    d = promote(da, db)
    a, b = np.broadcast_to(a, shape), np.broadcast_to(b, shape)
    if op in COMPARE:
        return [Out(COMPARE[op](a.astype(d), b.astype(d)), "bool")]
    if op in LOGICAL:
        return [Out(LOGICAL[op](a != 0, b != 0), "bool")]
    if op == "pow" and d == "bool":
        raise Reject()
    if op == "div":
        d = d if is_float(d) else "float32"
    with np.errstate(all="ignore"):
        if op in ("add", "sub"):
            sign = 1 if op == "add" else -1
            if d == "bool":
                return [Out(a | b, "bool")]
            if not is_float(d):
                return [Out(a.astype(np.int64) + sign * b.astype(np.int64), d)]
            # PyTorch rounds a + alpha * b once where braid rounds alpha * b first
            atol = 0.0 if abs(alpha) in (0, 0.5, 1, 2) else EPS[d] * max_abs(b)
            return [Out(f64(a, d) + sign * f64(b, d), d, RTOL_ARITH[d], atol)]
        if op == "mul":
            if d == "bool":
                return [Out(a & b, "bool")]
            if not is_float(d):
                return [Out(a.astype(np.int64) * b.astype(np.int64), d)]
            return [Out(f64(a, d) * f64(b, d), d, RTOL_ARITH[d])]
        if op == "div":
            return [Out(f64(a, d) / f64(b, d), d, RTOL_ARITH[d])]
        if op == "pow":
            if not is_float(d):
                if (b < 0).any():
                    raise Reject()  # braid and NumPy refuse integers to negative integer powers
                return [Out(a.astype(np.int64) ** b.astype(np.int64), d)]
            return [Out(_pow(f64(a, d), f64(b, d)), d, RTOL_TRANS[d])]
        if op in ("maximum", "minimum"):
            fn = np.maximum if op == "maximum" else np.minimum
            return [Out(fn(a.astype(d), b.astype(d)), d)]
    raise AssertionError(op)


def ref_scalar(op, args, x):
    """add/sub/mul/div_scalar: x op s, or s op x with reverse; s follows braid's scalar rule."""
    s, rev = args["scalar"], args["reverse"]
    d = x.dtype.name
    rd = scalar_dtype(d, s)
    if op == "sub_scalar" and d == "bool":
        raise Reject()
    if op == "div_scalar" and not is_float(rd):
        rd = "float32"
    with np.errstate(all="ignore"):
        if not is_float(rd):
            xi, si = x.astype(np.int64), int(s)
            l, r = (si, xi) if rev else (xi, si)
            v = {"add_scalar": lambda: l + r, "sub_scalar": lambda: l - r,
                 "mul_scalar": lambda: l * r}[op]()
            return [Out(v, rd)]
        # PyTorch rounds the scalar to the result type; an exact double computation differs by
        # that rounding, which matters in absolute terms for sums.
        sr = float(np.float64(s).astype(rd))
        xf = f64(x, rd)
        l, r = (sr, xf) if rev else (xf, sr)
        v = {"add_scalar": lambda: l + r, "sub_scalar": lambda: l - r,
             "mul_scalar": lambda: l * r, "div_scalar": lambda: l / r}[op]()
        atol = abs(sr - s) if op in ("add_scalar", "sub_scalar") and math.isfinite(s) else 0.0
        return [Out(v, rd, RTOL_ARITH[rd], atol)]


def ref_where(args, c, a, b):
    if c.dtype.name != "bool":
        raise Reject()
    shape = broadcast(c.shape, a.shape, b.shape)
    d = promote(a.dtype.name, b.dtype.name)
    return [Out(np.where(np.broadcast_to(c, shape), a.astype(d), b.astype(d)), d)]


# ---- reductions ----

def _reduction(args, x):
    axes = norm_axes(args["axes"], x.ndim)
    n = int(np.prod([x.shape[a] for a in axes], dtype=np.int64))
    return axes, args["keepdim"], n


def ref_reduce(op, args, x):
    """sum mean prod amax amin var std logsumexp."""
    axes, keep, n = _reduction(args, x)
    d = x.dtype.name
    if op in ("sum", "prod") and not is_float(d):
        fn = np.sum if op == "sum" else np.prod
        return [Out(fn(x.astype(np.int64), axis=axes, keepdims=keep), "int64")]
    if op in ("amax", "amin"):
        if any(x.shape[a] == 0 for a in axes):
            raise Reject()
        fn = np.max if op == "amax" else np.min
        return [Out(fn(x, axis=axes, keepdims=keep), d)]
    rd = d if is_float(d) else "float32"
    xf, eps = f64(x, rd), EPS[rd]
    with np.errstate(all="ignore"):
        if op == "sum":
            # reassociation: each partial sum may be off by eps times its size
            return [Out(np.sum(xf, axis=axes, keepdims=keep), rd, RTOL_ARITH[rd], 2 * n * eps * max_abs(xf))]
        if op == "mean":
            r = np.sum(xf, axis=axes, keepdims=keep) / n  # 0 / 0: the mean of nothing is NaN
            return [Out(r, rd, RTOL_ARITH[rd], 2 * eps * max_abs(xf))]
        if op == "prod":
            return [Out(np.prod(xf, axis=axes, keepdims=keep), rd, max(RTOL_ARITH[rd], 2 * n * eps))]
        if op == "logsumexp":
            if n == 0:
                r = np.log(np.sum(np.exp(xf), axis=axes, keepdims=keep))
            else:
                m = np.max(xf, axis=axes, keepdims=True)
                m = np.where(np.isinf(m), 0, m)  # all -inf gives -inf, any +inf gives +inf
                r = np.log(np.sum(np.exp(xf - m), axis=axes, keepdims=True)) + m
                if not keep:
                    r = r.reshape(np.sum(xf, axis=axes).shape)
            return [Out(r, rd, RTOL_TRANS[rd], 4 * (n + 2) * eps)]
        # var, std: two-pass in float64, divided by max(0, n - c) as PyTorch and NumPy do (no
        # degrees of freedom left gives NaN for a zero sum of squares, inf otherwise)
        c = args["correction"]
        mean = np.mean(xf, axis=axes, keepdims=True) if n else 0.0
        m2 = np.sum((xf - mean) ** 2, axis=axes, keepdims=keep)
        if n <= c:
            # Whether the sum of squares is zero (NaN) or not (inf) is decided in the result's
            # precision, where the squares of denormal deviations underflow to 0.
            m2 = np.sum((x.astype(rd) - np.mean(x.astype(rd), axis=axes, keepdims=True).astype(rd)) ** 2,
                        axis=axes, keepdims=keep) if n else m2
        v = m2 / max(n - c, 0)
        # float32 accumulation may be off by n ulps of the mean square (more than of the variance
        # where the mean is large); for std that error shrinks by 2 std, or to its root near 0
        dv = 4 * n * eps * np.sum(xf ** 2, axis=axes, keepdims=keep) / max(n, 1)
        if op == "var":
            return [Out(v, rd, RTOL_TRANS[rd], _finite_max(dv))]
        return [Out(np.sqrt(v), rd, RTOL_TRANS[rd], _finite_max(dv / (np.sqrt(v) + np.sqrt(dv))))]


def _finite_max(a):
    a = np.asarray(a, dtype=np.float64)
    a = a[np.isfinite(a)]
    return float(a.max()) if a.size else 0.0


def ref_arg(op, args, x):
    a = norm_axis(args["axis"], x.ndim)
    if x.ndim == 0:
        return [Out(np.int64(0), "int64")]
    if x.shape[a] == 0:
        raise Reject()
    fn = np.argmax if op == "argmax" else np.argmin
    return [Out(fn(x, axis=a, keepdims=args["keepdim"]), "int64")]


def ref_softmax(op, args, x):
    a = norm_axis(args["axis"], x.ndim)
    d = x.dtype.name
    rd = d if is_float(d) else "float32"
    xf = f64(x, rd)
    if x.ndim == 0:
        a = None
    n = x.shape[a] if a is not None else 1
    if n == 0:
        return [Out(xf, rd)]
    with np.errstate(all="ignore"):
        m = np.max(xf, axis=a, keepdims=True)
        s = np.sum(np.exp(xf - m), axis=a, keepdims=True)
        if op == "softmax":
            # x - max is rounded: exp of it is off by |x - max| ulps (up to where exp underflows)
            spread = min(2 * max_abs(xf), 110.0 if rd == "float32" else 750.0)
            return [Out(np.exp(xf - m) / s, rd, max(RTOL_TRANS[rd], (spread + 4 * (n + 2)) * EPS[rd]))]
        return [Out(xf - m - np.log(s), rd, RTOL_TRANS[rd], 4 * (n + 2) * EPS[rd])]


def ref_sum_to(args, x):
    shape, xs = list(args["shape"]), x.shape
    lead = x.ndim - len(shape)
    if lead < 0 or any(s != 1 and s != xs[lead + i] for i, s in enumerate(shape)):
        raise Reject()
    axes = tuple(range(lead)) + tuple(lead + i for i, s in enumerate(shape) if s == 1 and xs[lead + i] != 1)
    if not axes:  # nothing to sum: the values as they are, in sum's dtype
        d = x.dtype.name
        return [Out(x.reshape(shape), d if is_float(d) else "int64")]
    r = ref_reduce("sum", {"axes": list(axes), "keepdim": True}, x)[0]
    r.value = r.value.reshape(shape)
    return [r]


def ref_matmul(args, a, b):
    if a.ndim == 0 or b.ndim == 0:
        raise Reject()
    d = promote(a.dtype.name, b.dtype.name)
    if d == "bool":
        raise Reject()
    ct = np.float64 if is_float(d) else np.int64
    try:
        with np.errstate(all="ignore"):
            r = np.matmul(a.astype(ct), b.astype(ct))
    except ValueError:
        raise Reject() from None
    if not is_float(d):
        return [Out(r, d)]
    k = a.shape[-1]
    return [Out(r, d, RTOL_ARITH[d], 2 * k * EPS[d] * max_abs(a) * max_abs(b))]
