#!/usr/bin/python3
"""Golden values for tests/test_ops_golden.cpp, computed with NumPy (and Python's math module for
erf/erfc), independently of braid. Run with Debian's /usr/bin/python3 (NumPy 1.24):

    /usr/bin/python3 tests/data/make_golden.py > tests/data/golden.txt

Format (one case per block, whitespace-separated tokens, '#' starts a comment line):

    case OP/DTYPE/DETAIL       OP (before the first '/') selects the braid op in the C++ table
    param KEY V1 V2 ...        op arguments (numbers or words); a key with no values is an empty list
    input DTYPE SHAPE LAYOUT V1 V2 ...
    output DTYPE SHAPE V1 V2 ...
    tol RTOL ATOL              pass when |got - want| <= ATOL + RTOL * |want| (NaN must meet NaN)
    end

DTYPE is float32/float64/int64/int32/bool, or float16bits/bfloat16bits for the raw bit patterns of a
cast. SHAPE is 'scalar' or sizes joined by ','. LAYOUT says how the C++ side builds the input:
  c  the values are the input, row-major;
  t  the values are the transpose (last two axes swapped) of the input; C++ reads them and takes
     mT(), so the op sees a non-contiguous view with the shape the NumPy reference used;
  s  the values hold the input interleaved with junk along the last axis (size doubled); C++ takes
     slice(-1, 0, 2n, 2), a view with stride 2 in the last axis. Junk is NaN for floats so that a
     kernel that ignores strides fails loudly.
Float32 references are computed in float64 from the float32-rounded inputs and written unrounded.

Tolerances: float64 rtol 1e-12, float32 rtol 1e-6 by default, with the per-op overrides below
(each says why). Integer, bool and cast results must be exact.
"""
import math
import sys

import numpy as np

SEED = 20240601
rng = np.random.default_rng(SEED)

EPS32 = float(np.finfo(np.float32).eps)  # 2^-23
EPS64 = float(np.finfo(np.float64).eps)  # 2^-52
F32_MAX = float(np.finfo(np.float32).max)

# Default tolerances per output dtype.
DEFAULT_TOL = {"float64": (1e-12, 1e-14), "float32": (1e-6, 1e-7)}
# Per-op float32 overrides (rtol, atol).
F32_TOL = {
    # Polynomial/vectorised float32 transcendentals are accurate to a few ulp; 2e-6 is ~17 ulp.
    "exp": (2e-6, 0.0),
    "tanh": (2e-6, 0.0),  # atol 0: tanh(1e-4) must be right in relative terms too
    "erf": (2e-6, 0.0),
    "sigmoid": (2e-6, 0.0),  # sigmoid(-30) = 9.4e-14 must be right in relative terms
    "expm1": (2e-6, 0.0),  # expm1(1e-6) must not be computed as exp(x) - 1
    "log1p": (2e-6, 0.0),  # log1p(1e-6) likewise
    "softplus": (2e-6, 0.0),  # softplus(-50) = 1.9e-22
    "elu": (2e-6, 1e-7),
    "silu": (2e-6, 1e-7),
    # x * Phi(x) in float32: Phi's absolute error ~eps32 becomes ~|x| eps32 in the product where
    # Phi is tiny (gelu_tanh(-6) = -8e-11 comes out as ~-2e-7); 8 eps32 covers |x| <= 8.
    "gelu": (2e-6, 8 * 2.0 ** -23),
    "pow_scalar": (2e-6, 0.0),
    "pow": (2e-6, 0.0),
    # Absolute error of float32 sin/cos after argument reduction is ~ulp(1); near their zeros the
    # relative error is unbounded, so an absolute term is needed.
    "sin": (2e-6, 2e-7),
    "cos": (2e-6, 2e-7),
}
F64_TOL = {
    # sin/cos near zeros: the same absolute argument as for float32.
    "sin": (1e-12, 1e-15),
    "cos": (1e-12, 1e-15),
}

out_lines = []


def dtype_name(a):
    return {np.float32: "float32", np.float64: "float64", np.int64: "int64", np.int32: "int32",
            np.bool_: "bool"}[a.dtype.type]


def shape_str(shape):
    return "scalar" if len(shape) == 0 else ",".join(str(int(d)) for d in shape)


def fmt(v, kind):
    if kind in ("int64", "int32", "float16bits", "bfloat16bits"):
        return str(int(v))
    if kind == "bool":
        return "1" if v else "0"
    v = float(v)
    if math.isnan(v):
        return "nan"
    if math.isinf(v):
        return "inf" if v > 0 else "-inf"
    # 9 significant digits round-trip any float32 input; references and float64 values need 17.
    return ("%.9g" if kind == "float32" else "%.17g") % v


def values_str(a, kind):
    return " ".join(fmt(v, kind) for v in np.asarray(a).reshape(-1))


class Case:
    def __init__(self, name):
        self.name = name
        self.params = []
        self.inputs = []
        self.outputs = []
        self.tol = None

    def param(self, key, *values):
        self.params.append((key, values))
        return self

    def input(self, a, layout="c"):
        a = np.asarray(a)
        kind = dtype_name(a)
        if layout == "t":
            assert a.ndim >= 2
            stored = np.ascontiguousarray(np.swapaxes(a, -1, -2))
        elif layout == "s":
            assert a.ndim >= 1
            wide = list(a.shape)
            wide[-1] *= 2
            junk = np.nan if a.dtype.kind == "f" else (-999 if a.dtype.kind == "i" else True)
            stored = np.full(wide, junk, dtype=a.dtype)
            stored[..., ::2] = a
        else:
            stored = a
        self.inputs.append((kind, stored.shape, layout, stored))
        return self

    def output(self, a, kind):
        """a: the reference values (float64 for floating kinds); kind: the dtype braid must return."""
        a = np.asarray(a)
        if kind == "float32":
            a = a.astype(np.float64)
            # Results beyond float32's range must come out as infinities.
            # (2^128 - 2^103 is half an ulp above float32's largest value: from there on, round to inf.)
            with np.errstate(invalid="ignore"):
                a = np.where(np.abs(a) >= 2.0 ** 128 - 2.0 ** 103, np.copysign(np.inf, a), a)
        self.outputs.append((kind, a.shape, a))
        return self

    def tolerance(self, rtol, atol):
        self.tol = (rtol, atol)
        return self

    def write(self):
        lines = ["case " + self.name]
        for key, values in self.params:
            lines.append(" ".join(["param", key] + [v if isinstance(v, str) else fmt(v, "int64" if isinstance(v, (int, np.integer)) and not isinstance(v, bool) else "float64") for v in values]))
        for kind, shape, layout, stored in self.inputs:
            lines.append(("input %s %s %s %s" % (kind, shape_str(shape), layout, values_str(stored, kind))).rstrip())
        for kind, shape, a in self.outputs:
            # Float32 references are float64 numbers (not rounded to float32): print all 17 digits.
            lines.append(("output %s %s %s" % (kind, shape_str(shape), values_str(a, "float64" if kind == "float32" else kind))).rstrip())
        if self.tol is None:
            kinds = [k for k, _, _ in self.outputs]
            op = self.name.split("/")[0]
            if "float32" in kinds:
                self.tol = F32_TOL.get(op, DEFAULT_TOL["float32"])
            elif "float64" in kinds:
                self.tol = F64_TOL.get(op, DEFAULT_TOL["float64"])
            else:
                self.tol = (0.0, 0.0)
        lines.append("tol %s %s" % (fmt(self.tol[0], "float64"), fmt(self.tol[1], "float64")))
        lines.append("end")
        out_lines.extend(lines)


def case(name):
    c = Case(name)
    cases.append(c)
    return c


cases = []


def f32(a):
    return np.asarray(a, dtype=np.float32)


def f64(a):
    return np.asarray(a, dtype=np.float64)


def uniform(shape, lo, hi, dt):
    return rng.uniform(lo, hi, size=shape).astype(dt)


def ref64(a):
    """float32 input promoted exactly to float64 for the reference computation."""
    return np.asarray(a).astype(np.float64)


def dt_name(dt):
    return "float32" if dt == np.float32 else "float64"


# ---------------------------------------------------------------------------------------------
# Unary ops
# ---------------------------------------------------------------------------------------------
def erf_vec(x):
    return np.vectorize(math.erf, otypes=[np.float64])(x)


def erfc_vec(x):
    return np.vectorize(math.erfc, otypes=[np.float64])(x)


def softplus_ref(x):
    # log(1 + e^x) = max(x, 0) + log1p(e^-|x|), exact in float64 for the whole range.
    return np.maximum(x, 0) + np.log1p(np.exp(-np.abs(x)))


def sigmoid_ref(x):
    # 1/(1+e^-x) for x >= 0, e^x/(1+e^x) below: no cancellation anywhere.
    e = np.exp(-np.abs(x))
    return np.where(x >= 0, 1 / (1 + e), e / (1 + e))


GELU_K = math.sqrt(2 / math.pi)
UNARY = {
    "neg": lambda x: -x,
    "abs": np.abs,
    "exp": np.exp,
    "log": np.log,
    "log1p": np.log1p,
    "expm1": np.expm1,
    "sqrt": np.sqrt,
    "rsqrt": lambda x: 1 / np.sqrt(x),
    "square": lambda x: x * x,
    "reciprocal": lambda x: 1 / x,
    "sin": np.sin,
    "cos": np.cos,
    "tanh": np.tanh,
    "sigmoid": sigmoid_ref,
    "relu": lambda x: np.maximum(x, 0),
    "silu": lambda x: x * sigmoid_ref(x),
    "softplus": softplus_ref,
    "erf": erf_vec,
    # Exact GELU x * Phi(x) = x/2 * erfc(-x/sqrt2): erfc avoids the cancellation of 1 + erf(.) < 0.
    "gelu_none": lambda x: 0.5 * x * erfc_vec(-x / math.sqrt(2)),
    "gelu_tanh": lambda x: 0.5 * x * (1 + np.tanh(GELU_K * (x + 0.044715 * x ** 3))),
    "sign": np.sign,
    "floor": np.floor,
    "ceil": np.ceil,
    "round": np.round,  # NumPy rounds half to even, as torch.round
}

# Domains (lo, hi) for random inputs, and hand-picked edge values appended to one case per op.
DOMAIN = {
    "log": (0.01, 100), "sqrt": (0, 100), "rsqrt": (0.01, 100), "log1p": (-0.9, 10),
    "reciprocal": (0.1, 10), "exp": (-10, 10), "expm1": (-5, 5), "sin": (-10, 10), "cos": (-10, 10),
    "gelu_none": (-5, 5), "gelu_tanh": (-5, 5),
}
EDGES = {
    "neg": [0.0, -0.0, 1e30, -3.5],
    "abs": [0.0, -0.0, -1e-30, 7.25],
    "exp": [-80, -50, -20, -1, 0, 1e-7, 1, 20, 50, 80, 88],
    "log": [1, 2.718281828459045, 1e-30, 1e30, 0.5, 1.0000001],
    "log1p": [0, 1e-6, -1e-6, 1e-20, 3.0, -0.5],
    "expm1": [0, 1e-6, -1e-6, 1e-20, 2.0, -20.0],
    "sqrt": [0, 1, 4, 2, 1e-30, 1e30],
    "rsqrt": [1, 4, 0.25, 2, 1e-20, 1e20],
    "square": [0, -3, 1.5, 1e10],
    "reciprocal": [1, -2, 0.5, 1e-10, 3],
    "sin": [0, 0.5, -1.25, 1e-5, 3.0],
    "cos": [0, 0.5, -1.25, 1e-5, 3.0],
    "tanh": [0, 1e-4, -1e-4, 0.3, -0.6, 0.625, 0.7, 1, -5, 9, 10, -20, 30],
    "sigmoid": [-30, -20, -5, -1e-3, 0, 1e-3, 5, 20, 30],
    "relu": [0, -0.0, -1e-30, 2.5],
    "silu": [-30, -5, 0, 5, 30],
    "softplus": [-50, -20, -1, 0, 1e-4, 1, 20, 30, 50],
    "erf": [0, 1e-4, -1e-4, 0.5, -1, 2, -3, 5, 1e-8],
    "gelu_none": [0, -6, -3, -1, 1e-3, 1, 3, 6],
    "gelu_tanh": [0, -6, -3, -1, 1e-3, 1, 3, 6],
    "sign": [0, -0.0, -2, 3, -1e-30, 1e30],
    "floor": [-2.5, -1.0, -0.5, -0.0, 0.0, 0.5, 1.0, 2.7, -1e10 - 0.5],
    "ceil": [-2.5, -1.0, -0.5, 0.0, 0.5, 1.0, 2.7, 1e10 + 0.5],
    # Half-way cases go to the even neighbour; 0.49999997 (the float32 below 0.5) must give 0, and
    # 2^23 + 1 must stay itself (floor(x + 0.5) gets both wrong in float32).
    "round": [-2.5, -1.5, -0.5, 0.5, 1.5, 2.5, 3.5, 0.49999997, -0.49999997, 8388609.0, 2.4999, -7.6],
}


def unary_cases():
    for op, fn in UNARY.items():
        base = op.split("_")[0] if op.startswith("gelu") else op
        lo, hi = DOMAIN.get(op, (-4, 4))
        for dt in (np.float32, np.float64):
            d = dt_name(dt)
            # 1) a 2-d contiguous input with the edge values, 2) a transposed view, 3) a strided view.
            x = np.concatenate([np.asarray(EDGES.get(op, []), dtype=dt), uniform((12,), lo, hi, dt)])
            x = x.reshape(1, -1) if x.size % 4 else x.reshape(-1, 4)
            layouts = [("edges", x, "c"), ("transposed", uniform((3, 5), lo, hi, dt), "t"),
                       ("strided", uniform((2, 3, 4), lo, hi, dt), "s")]
            for tag, arr, layout in layouts:
                c = case("%s/%s/%s" % (base, d, op[5:] + "_" + tag if base == "gelu" else tag))
                if op.startswith("gelu"):
                    c.param("approximate", op.split("_")[1])
                c.input(arr, layout)
                with np.errstate(all="ignore"):
                    c.output(fn(ref64(arr)), d)
        # Integer input: neg/abs/square/relu/sign/floor/ceil/round keep int64, float ops give float32.
        xi = np.array([[-3, -1, 0], [2, 5, 7]], dtype=np.int64)
        if op in ("neg", "abs", "square", "relu", "sign", "floor", "ceil", "round"):
            case("%s/int64/keeps_dtype" % base).input(xi).output(fn(xi), "int64")
        elif op in ("exp", "sin", "tanh", "sigmoid", "sqrt"):
            xp = np.abs(xi) if op == "sqrt" else xi
            case("%s/int64/promotes_to_float32" % base).input(xp).output(fn(xp.astype(np.float64)), "float32")

    # Float32 exp over its whole useful range: -80..80 in steps of 0.5, plus overflow to inf.
    x = np.concatenate([np.arange(-80, 80.5, 0.5), [88.5, 89.5, 100.0, -np.inf, np.inf, np.nan]]).astype(np.float32)
    case("exp/float32/range_-80_80_overflow").input(x).output(np.exp(ref64(x)), "float32")
    # tanh/sigmoid/softplus over a wide range in float32.
    x = np.linspace(-30, 30, 121).astype(np.float32)
    case("sigmoid/float32/range_-30_30").input(x).output(sigmoid_ref(ref64(x)), "float32")
    case("tanh/float32/range_-30_30").input(x).output(np.tanh(ref64(x)), "float32")
    x = np.linspace(-50, 50, 101).astype(np.float32)
    case("softplus/float32/range_-50_50").input(x).output(softplus_ref(ref64(x)), "float32")
    x = np.linspace(-6, 6, 97).astype(np.float32)
    case("erf/float32/range_-6_6").input(x).output(erf_vec(ref64(x)), "float32")

    # Parameterised unary ops.
    for dt in (np.float32, np.float64):
        d = dt_name(dt)
        x = np.concatenate([[-3.0, -1.0, -1e-3, 0.0, 1e-3, 2.0], uniform((10,), -4, 4, dt)]).astype(dt).reshape(4, 4)
        r = ref64(x)
        case("leaky_relu/%s/slope_0.01" % d).param("negative_slope", 0.01).input(x).output(np.where(r > 0, r, 0.01 * r), d)
        case("leaky_relu/%s/slope_0.2_transposed" % d).param("negative_slope", 0.2).input(x, "t").output(np.where(r > 0, r, 0.2 * r), d)
        case("elu/%s/alpha_1" % d).param("alpha", 1.0).input(x).output(np.where(r > 0, r, np.expm1(r)), d)
        case("elu/%s/alpha_0.7_strided" % d).param("alpha", 0.7).input(x, "s").output(np.where(r > 0, r, 0.7 * np.expm1(r)), d)
        xp = np.concatenate([[0.0, 1.0, 4.0, 0.25], uniform((8,), 0.1, 5, dt)]).astype(dt).reshape(3, 4)
        rp = ref64(xp)
        for p in (2.0, 2.5, 0.5, -1.0, 3.0, 0.0, -0.5):
            name = "pow_scalar/%s/p_%g" % (d, p)
            with np.errstate(divide="ignore"):
                c = case(name).param("exponent", p).input(xp).output(np.power(rp, p), d)
        xn = np.array([[-2.0, -1.5, -1.0, 0.0], [0.5, 1.0, 3.0, -0.25]], dtype=dt)
        for p in (2.0, 3.0):  # integer exponents of negative bases are real
            case("pow_scalar/%s/negative_base_p_%g" % (d, p)).param("exponent", p).input(xn, "t").output(np.power(ref64(xn), p), d)
        xc = uniform((3, 5), -2, 2, dt)
        rc = ref64(xc)
        case("clamp/%s/both" % d).param("min", -0.5).param("max", 0.75).input(xc).output(np.clip(rc, -0.5, 0.75), d)
        case("clamp/%s/min_only" % d).param("min", 0.25).param("max", "none").input(xc, "t").output(np.maximum(rc, 0.25), d)
        case("clamp/%s/max_only" % d).param("min", "none").param("max", -0.1).input(xc, "s").output(np.minimum(rc, -0.1), d)
        xnan = np.array([np.nan, -1.0, 0.3, 2.0, np.inf, -np.inf], dtype=dt)
        # NaN passes through clamp (torch.clamp and numpy.clip both propagate it).
        case("clamp/%s/nan_inf" % d).param("min", -0.5).param("max", 0.5).input(xnan).output(np.clip(ref64(xnan), -0.5, 0.5), d)
    xi = np.array([-5, -1, 0, 3, 9], dtype=np.int64)
    case("clamp/int64/keeps_dtype").param("min", -2.0).param("max", 4.0).input(xi).output(np.clip(xi, -2, 4), "int64")

    # logical_not and isnan.
    xb = np.array([[0.0, -0.0, 1.5], [np.nan, -2.0, np.inf]], dtype=np.float32)
    case("logical_not/float32/basic").input(xb).output(np.logical_not(xb), "bool")
    case("logical_not/bool/basic").input(np.array([True, False, True])).output(np.array([False, True, False]), "bool")
    case("isnan/float32/basic").input(xb, "t").output(np.isnan(xb), "bool")
    case("isnan/float64/basic").input(xb.astype(np.float64)).output(np.isnan(xb), "bool")
    case("isnan/int64/all_false").input(np.array([1, 2], dtype=np.int64)).output(np.array([False, False]), "bool")


# ---------------------------------------------------------------------------------------------
# Binary ops with broadcasting
# ---------------------------------------------------------------------------------------------
BROADCASTS = [  # (tag, shape a, shape b, layout a, layout b)
    ("same", (3, 4), (3, 4), "c", "c"),
    ("row", (3, 4), (4,), "c", "c"),
    ("col", (3, 4), (3, 1), "c", "c"),
    ("outer", (2, 1, 3), (4, 1), "c", "c"),
    ("scalar_b", (2, 3), (), "c", "c"),
    ("scalar_a", (), (2, 3), "c", "c"),
    ("transposed_a", (4, 3), (3,), "t", "c"),
    ("both_transposed", (3, 5), (3, 5), "t", "t"),
    ("strided", (2, 5), (1, 5), "s", "s"),
]

BINARY = {
    "add": lambda a, b: a + b,
    "sub": lambda a, b: a - b,
    "mul": lambda a, b: a * b,
    "div": lambda a, b: a / b,
    "pow": np.power,
    "maximum": np.maximum,
    "minimum": np.minimum,
}
COMPARE = {"eq": np.equal, "ne": np.not_equal, "lt": np.less, "le": np.less_equal, "gt": np.greater,
           "ge": np.greater_equal}
LOGICAL = {"logical_and": np.logical_and, "logical_or": np.logical_or, "logical_xor": np.logical_xor}


def binary_cases():
    for op, fn in BINARY.items():
        for dt in (np.float32, np.float64):
            d = dt_name(dt)
            for tag, sa, sb, la, lb in BROADCASTS:
                if op == "pow":
                    a, b = uniform(sa, 0.1, 3, dt), uniform(sb, -2, 2, dt)
                elif op == "div":
                    a, b = uniform(sa, -3, 3, dt), uniform(sb, 0.5, 3, dt) * np.where(rng.random(sb) < 0.5, -1, 1).astype(dt)
                else:
                    a, b = uniform(sa, -3, 3, dt), uniform(sb, -3, 3, dt)
                la2 = la if len(sa) >= (2 if la == "t" else 1) else "c"
                lb2 = lb if len(sb) >= (2 if lb == "t" else 1) else "c"
                c = case("%s/%s/%s" % (op, d, tag)).input(a, la2).input(b, lb2)
                c.output(fn(ref64(a), ref64(b)), d)
                # Cancellation in add/sub: an absolute term relative to the operands' size.
                if op in ("add", "sub") and d == "float32":
                    c.tolerance(1e-6, 4 * EPS32 * 3)
    for dt in (np.float32, np.float64):
        d = dt_name(dt)
        a, b = uniform((2, 3), -3, 3, dt), uniform((3,), -3, 3, dt)
        case("add/%s/alpha_-2.5" % d).param("alpha", -2.5).input(a).input(b).output(ref64(a) - 2.5 * ref64(b), d).tolerance(
            1e-6 if d == "float32" else 1e-12, 40 * (EPS32 if d == "float32" else EPS64))
        case("sub/%s/alpha_3" % d).param("alpha", 3.0).input(a).input(b).output(ref64(a) - 3.0 * ref64(b), d).tolerance(
            1e-6 if d == "float32" else 1e-12, 40 * (EPS32 if d == "float32" else EPS64))
        # NaN propagates through maximum/minimum from either side (numpy.maximum, torch.maximum).
        a = np.array([np.nan, 1.0, np.nan, -np.inf, 2.0, 0.0], dtype=dt)
        b = np.array([1.0, np.nan, np.nan, 5.0, np.inf, -0.0], dtype=dt)
        case("maximum/%s/nan_propagates" % d).input(a).input(b).output(np.maximum(a, b), d)
        case("minimum/%s/nan_propagates" % d).input(a).input(b).output(np.minimum(a, b), d)
        # Division edge cases: x/0 = +-inf, 0/0 = nan.
        a = np.array([1.0, -1.0, 0.0, 6.0], dtype=dt)
        b = np.array([0.0, 0.0, 0.0, -4.0], dtype=dt)
        with np.errstate(all="ignore"):
            case("div/%s/by_zero" % d).input(a).input(b).output(a / b, d)
        # pow special values: 0^0 = 1, 0^-1 = inf, negative base with integer exponent.
        a = np.array([0.0, 0.0, -2.0, -2.0, 4.0, 1.0], dtype=dt)
        b = np.array([0.0, -1.0, 3.0, 2.0, 0.5, np.nan], dtype=dt)
        with np.errstate(all="ignore"):
            case("pow/%s/special_values" % d).input(a).input(b).output(np.power(ref64(a), ref64(b)), d)

    # Integer arithmetic keeps int64; int/int is true division into float32 (torch semantics).
    ai = np.array([[7, -7, 0], [9, 100, -3]], dtype=np.int64)
    bi = np.array([2, 3, -5], dtype=np.int64)
    case("add/int64/broadcast").input(ai).input(bi).output(ai + bi, "int64")
    case("sub/int64/broadcast").input(ai).input(bi).output(ai - bi, "int64")
    case("mul/int64/broadcast").input(ai).input(bi).output(ai * bi, "int64")
    case("div/int64/true_division").input(ai).input(bi).output(ai.astype(np.float64) / bi, "float32")
    case("div/int32/true_division").input(ai.astype(np.int32)).input(bi.astype(np.int32)).output(ai.astype(np.float64) / bi, "float32")
    case("maximum/int64/broadcast").input(ai).input(bi).output(np.maximum(ai, bi), "int64")
    case("minimum/int64/broadcast").input(ai).input(bi).output(np.minimum(ai, bi), "int64")
    bp = np.array([2, 3, 0], dtype=np.int64)
    case("pow/int64/broadcast").input(ai).input(bp).output(np.power(ai, bp), "int64")
    # Mixed dtypes promote: int32 + float32 -> float32, int64 + float64 -> float64, bool + int64 -> int64.
    a32 = np.array([1, -2, 3], dtype=np.int32)
    bf = np.array([0.5, 0.25, -1.5], dtype=np.float32)
    case("add/mixed/int32_float32").input(a32).input(bf).output(a32 + ref64(bf), "float32")
    case("mul/mixed/int64_float64").input(ai).input(bi.astype(np.float64) * 0.5).output(ai * (bi * 0.5), "float64")
    bb = np.array([True, False, True])
    case("add/mixed/bool_int64").input(bb).input(bi).output(bb.astype(np.int64) + bi, "int64")
    case("add/mixed/float32_float64").input(bf).input(np.array([1e-10, 2.0, 3.0])).output(ref64(bf) + np.array([1e-10, 2.0, 3.0]), "float64")
    # Two bools stay bool under add (logical or), as in PyTorch; sub of two bools is an error (test_errors).
    case("add/bool/bool_gives_bool").input(bb).input(np.array([True, True, False])).output(np.array([True, True, True]), "bool")

    # Comparisons (bool output), mixed dtypes and NaN (every comparison with NaN is false but ne).
    for op, fn in COMPARE.items():
        a = np.array([[1.0, 2.0, np.nan, -1.0], [3.0, 2.0, 0.0, np.inf]], dtype=np.float32)
        b = np.array([2.0, 2.0, np.nan, -np.inf], dtype=np.float32)
        case("%s/float32/broadcast_nan" % op).input(a).input(b).output(fn(a, b), "bool")
        ai2 = np.array([[1, 2, 3], [4, 5, 6]], dtype=np.int64)
        bf2 = np.array([[1.5], [5.0]], dtype=np.float64)
        case("%s/mixed/int64_float64" % op).input(ai2).input(bf2).output(fn(ai2, bf2), "bool")
        x = uniform((4, 3), -1, 1, np.float64)
        y = uniform((4, 3), -1, 1, np.float64)
        y[0, 0], y[1, 2], y[3, 1] = x[0, 0], x[1, 2], x[3, 1]  # some equal pairs
        case("%s/float64/transposed" % op).input(x, "t").input(y, "t").output(fn(x, y), "bool")
    for op, fn in LOGICAL.items():
        a = np.array([[True, False, True, False]])
        b = np.array([[True], [False]])
        case("%s/bool/broadcast" % op).input(a).input(b).output(fn(a, b), "bool")
        af = np.array([0.0, -0.0, 2.5, np.nan, 0.0], dtype=np.float32)
        bf3 = np.array([1, 0, 0, 0, 0], dtype=np.int64)
        case("%s/mixed/float32_int64" % op).input(af).input(bf3).output(fn(af, bf3), "bool")

    # where(cond, a, b) with three-way broadcasting and promotion.
    cond = np.array([[True], [False], [True]])
    a = uniform((1, 4), -1, 1, np.float32)
    b = uniform((3, 4), -1, 1, np.float32)
    case("where/float32/broadcast").input(cond).input(a).input(b).output(np.where(cond, ref64(a), ref64(b)), "float32")
    a64 = uniform((3, 4), -1, 1, np.float64)
    case("where/float64/transposed").input(np.array([[True, False, False, True]] * 3)).input(a64, "t").input(np.float64(0.5)).output(
        np.where(np.array([[True, False, False, True]] * 3), a64, 0.5), "float64")
    ai3 = np.array([1, 2, 3], dtype=np.int64)
    case("where/mixed/int64_float32").input(np.array([True, False, True])).input(ai3).input(np.array([0.5, 0.5, 0.5], dtype=np.float32)).output(
        np.array([1.0, 0.5, 3.0]), "float32")
    case("where/int64/scalar_cond").input(np.array(False)).input(ai3).input(-ai3).output(-ai3, "int64")


# ---------------------------------------------------------------------------------------------
# Reductions, softmax
# ---------------------------------------------------------------------------------------------
def sum_bound(x, axes, keepdim):
    """An absolute error bound for a float sum: n * eps * sum |x| over each group."""
    return np.sum(np.abs(ref64(x)), axis=axes, keepdims=keepdim)


def reduction_cases():
    shapes = [((2, 3, 4), "c"), ((5, 6), "t"), ((3, 4), "s")]
    axis_sets = {3: [(), (0,), (1,), (2,), (0, 2), (-1,), (0, 1, 2)], 2: [(), (0,), (1,), (-2,)]}
    for dt in (np.float32, np.float64):
        d = dt_name(dt)
        eps = EPS32 if dt == np.float32 else EPS64
        for shape, layout in shapes:
            x = uniform(shape, -2, 2, dt)
            r = ref64(x)
            n_ax = len(shape)
            for axes in axis_sets[n_ax]:
                ax = tuple(axes) if axes else None
                for keepdim in (False, True):
                    tag = "%s_axes%s%s" % (layout, "_".join(str(a) for a in axes) or "all", "_keep" if keepdim else "")
                    n = int(np.prod([shape[a] for a in axes])) if axes else int(np.prod(shape))
                    bound = float(np.max(sum_bound(x, ax, keepdim))) * n * eps
                    case("sum/%s/%s" % (d, tag)).param("axes", *axes).param("keepdim", int(keepdim)).input(x, layout).output(
                        np.sum(r, axis=ax, keepdims=keepdim), d).tolerance(1e-12 if d == "float64" else 1e-6, bound)
                    if keepdim and axes not in ((0,), (-2,)):
                        continue  # the rest of the reductions: fewer axis sets are enough
                    case("mean/%s/%s" % (d, tag)).param("axes", *axes).param("keepdim", int(keepdim)).input(x, layout).output(
                        np.mean(r, axis=ax, keepdims=keepdim), d).tolerance(1e-12 if d == "float64" else 1e-6, bound / n)
                    case("amax/%s/%s" % (d, tag)).param("axes", *axes).param("keepdim", int(keepdim)).input(x, layout).output(
                        np.amax(r, axis=ax, keepdims=keepdim), d).tolerance(0, 0)
                    case("amin/%s/%s" % (d, tag)).param("axes", *axes).param("keepdim", int(keepdim)).input(x, layout).output(
                        np.amin(r, axis=ax, keepdims=keepdim), d).tolerance(0, 0)
                    xp = (np.abs(x) * 0.5 + 0.75).astype(dt)  # products of numbers near 1 stay in range
                    case("prod/%s/%s" % (d, tag)).param("axes", *axes).param("keepdim", int(keepdim)).input(xp, layout).output(
                        np.prod(ref64(xp), axis=ax, keepdims=keepdim), d).tolerance(2 * n * eps, 0)
                    for corr in (0, 1):
                        if n - corr <= 0:
                            continue
                        vr = np.var(r, axis=ax, ddof=corr, keepdims=keepdim)
                        tol = (1e-10 if d == "float64" else 2e-5, 0)
                        case("var/%s/%s_corr%d" % (d, tag, corr)).param("axes", *axes).param("correction", corr).param(
                            "keepdim", int(keepdim)).input(x, layout).output(vr, d).tolerance(*tol)
                        case("std/%s/%s_corr%d" % (d, tag, corr)).param("axes", *axes).param("correction", corr).param(
                            "keepdim", int(keepdim)).input(x, layout).output(np.sqrt(vr), d).tolerance(*tol)
                    if axes:
                        m = np.max(r, axis=ax, keepdims=True)
                        lse = np.log(np.sum(np.exp(r - m), axis=ax, keepdims=True)) + m
                        if not keepdim:
                            lse = np.squeeze(lse, axis=ax)
                        case("logsumexp/%s/%s" % (d, tag)).param("axes", *axes).param("keepdim", int(keepdim)).input(x, layout).output(
                            lse, d).tolerance(1e-12 if d == "float64" else 2e-6, 4 * eps)
            for axis in range(-n_ax, n_ax):
                m = np.max(r, axis=axis, keepdims=True)
                e = np.exp(r - m)
                sm = e / np.sum(e, axis=axis, keepdims=True)
                lsm = (r - m) - np.log(np.sum(e, axis=axis, keepdims=True))
                case("softmax/%s/%s_axis%d" % (d, layout, axis)).param("axis", axis).input(x, layout).output(sm, d).tolerance(
                    1e-12 if d == "float64" else 4e-6, 0)
                case("log_softmax/%s/%s_axis%d" % (d, layout, axis)).param("axis", axis).input(x, layout).output(lsm, d).tolerance(
                    1e-12 if d == "float64" else 2e-6, 8 * eps)

        # Stability: large values must not overflow (logsumexp, softmax, log_softmax).
        big = np.array([[1000.0, 1000.5, 999.0, -1000.0], [-1e4, -1e4 + 1, -1e4 + 2, -1e4 + 3], [88.0, 89.0, 90.0, 0.0]], dtype=dt)
        rb = ref64(big)
        m = rb.max(axis=1, keepdims=True)
        lse = (np.log(np.sum(np.exp(rb - m), axis=1, keepdims=True)) + m)
        case("logsumexp/%s/large_values" % d).param("axes", 1).param("keepdim", 0).input(big).output(lse[:, 0], d).tolerance(
            1e-12 if d == "float64" else 1e-6, 0)
        case("softmax/%s/large_values" % d).param("axis", 1).input(big).output(np.exp(rb - lse), d).tolerance(
            1e-12 if d == "float64" else 1e-5, 1e-30)
        case("log_softmax/%s/large_values" % d).param("axis", -1).input(big).output(rb - lse, d).tolerance(
            1e-12 if d == "float64" else 1e-6, 1e-3 if d == "float32" else 1e-10)
        # Infinite entries: -inf contributes nothing; a row of only -inf has logsumexp -inf; +inf gives +inf.
        inf_in = np.array([[0.0, -np.inf, 1.0], [-np.inf, -np.inf, -np.inf], [np.inf, 0.0, 1.0]], dtype=dt)
        with np.errstate(all="ignore"):
            want = np.array([np.log(1 + math.e), -np.inf, np.inf])
        case("logsumexp/%s/infinities" % d).param("axes", -1).param("keepdim", 0).input(inf_in).output(want, d)
        # Softmax with -inf entries (masked attention): they get probability 0.
        masked = np.array([[0.0, -np.inf, 1.0, -np.inf]], dtype=dt)
        sm = np.array([[1 / (1 + math.e), 0.0, math.e / (1 + math.e), 0.0]])
        case("softmax/%s/masked_-inf" % d).param("axis", 1).input(masked).output(sm, d)

    # argmax/argmin: ties resolve to the first index (numpy.argmax, torch.argmax).
    tie = np.array([[1.0, 3.0, 3.0, 0.0], [2.0, 2.0, 2.0, 2.0], [-1.0, -5.0, 4.0, -5.0]], dtype=np.float32)
    for op, fn in (("argmax", np.argmax), ("argmin", np.argmin)):
        for axis in (0, 1, -1):
            for keepdim in (False, True):
                want = fn(tie, axis=axis)
                if keepdim:
                    want = np.expand_dims(want, axis)
                case("%s/float32/ties_axis%d%s" % (op, axis, "_keep" if keepdim else "")).param("axis", axis).param(
                    "keepdim", int(keepdim)).input(tie).output(want, "int64")
        x = uniform((3, 4, 5), -1, 1, np.float64)
        for axis in (0, 1, 2):
            case("%s/float64/3d_axis%d" % (op, axis)).param("axis", axis).param("keepdim", 0).input(x).output(fn(x, axis=axis), "int64")
        x = uniform((4, 6), -1, 1, np.float32)
        case("%s/float32/transposed" % op).param("axis", 1).param("keepdim", 0).input(x, "t").output(fn(x, axis=1), "int64")
        # NaN counts as the extreme (numpy.argmax/argmin and torch return the first NaN).
        xn = np.array([[1.0, np.nan, 3.0, np.nan], [2.0, 1.0, 0.0, -1.0]], dtype=np.float32)
        case("%s/float32/nan_first" % op).param("axis", 1).param("keepdim", 0).input(xn).output(fn(xn, axis=1), "int64")
        xi = np.array([[3, 9, 9, -1], [0, 0, -7, -7]], dtype=np.int64)
        case("%s/int64/ties" % op).param("axis", 1).param("keepdim", 0).input(xi).output(fn(xi, axis=1), "int64")

    # Integer reductions: sums and products accumulate in int64; amax/amin keep the dtype; mean -> float32.
    xi = np.array([[1, -2, 3], [40, 50, -60]], dtype=np.int32)
    case("sum/int32/to_int64").param("axes", 1).param("keepdim", 0).input(xi).output(np.sum(xi, axis=1, dtype=np.int64), "int64")
    case("sum/int64/all").param("axes").param("keepdim", 0).input(xi.astype(np.int64)).output(np.sum(xi), "int64")
    case("sum/bool/counts").param("axes", 0).param("keepdim", 0).input(np.array([[True, False], [True, True], [False, False]])).output(
        np.array([2, 1]), "int64")
    case("prod/int64/axis0").param("axes", 0).param("keepdim", 0).input(xi.astype(np.int64)).output(np.prod(xi.astype(np.int64), axis=0), "int64")
    case("amax/int32/keeps_dtype").param("axes", 1).param("keepdim", 0).input(xi).output(np.amax(xi, axis=1), "int32")
    case("amin/int64/keeps_dtype").param("axes", 0).param("keepdim", 1).input(xi.astype(np.int64)).output(
        np.amin(xi, axis=0, keepdims=True), "int64")
    case("mean/int64/to_float32").param("axes", 1).param("keepdim", 0).input(xi.astype(np.int64)).output(
        np.mean(xi.astype(np.float64), axis=1), "float32")
    # A long float32 sum: full((1000, 1000), 0.1f) summed. Naive sequential float32 accumulation is
    # off by ~1%; pairwise/blocked summation (NumPy, PyTorch) stays within 1e-5 of the exact value.
    case("sum_full/float32/million_tenths").param("shape", 1000, 1000).param("value", 0.1).param("dtype", "float32").output(
        np.float64(np.float32(0.1)) * 1e6, "float32").tolerance(1e-5, 0)
    case("sum_full/float32/rows_of_tenths").param("shape", 4, 250000).param("value", 0.1).param("dtype", "float32").param(
        "axes", 1).output(np.full(4, np.float64(np.float32(0.1)) * 250000), "float32").tolerance(1e-5, 0)
    # amax with NaN: NaN propagates (numpy.amax, torch.amax).
    xn = np.array([[1.0, np.nan, 3.0], [4.0, 5.0, 6.0]], dtype=np.float32)
    case("amax/float32/nan_propagates").param("axes", 1).param("keepdim", 0).input(xn).output(np.amax(xn, axis=1), "float32")
    case("amin/float32/nan_propagates").param("axes", 1).param("keepdim", 0).input(xn).output(np.amin(xn, axis=1), "float32")


# ---------------------------------------------------------------------------------------------
# matmul
# ---------------------------------------------------------------------------------------------
def matmul_cases():
    specs = [  # (tag, shape a, shape b, layout a, layout b)
        ("2d", (3, 4), (4, 5), "c", "c"),
        ("2d_square_32", (32, 32), (32, 32), "c", "c"),
        ("2d_a_transposed", (7, 5), (5, 6), "t", "c"),
        ("2d_b_transposed", (7, 5), (5, 6), "c", "t"),
        ("2d_both_transposed", (33, 17), (17, 9), "t", "t"),
        ("2d_strided", (4, 3), (3, 5), "s", "c"),
        ("batched", (2, 3, 4), (2, 4, 5), "c", "c"),
        ("batched_transposed", (3, 4, 6), (3, 6, 2), "t", "t"),
        ("broadcast_batch", (2, 1, 3, 4), (3, 4, 5), "c", "c"),
        ("broadcast_2d_b", (4, 3, 5), (5, 2), "c", "c"),
        ("broadcast_2d_a", (3, 5), (4, 5, 2), "c", "c"),
        ("vec_vec", (6,), (6,), "c", "c"),
        ("vec_mat", (4,), (4, 5), "c", "c"),
        ("mat_vec", (3, 4), (4,), "c", "c"),
        ("batched_vec", (2, 3, 4), (4,), "c", "c"),
        ("vec_batched", (4,), (2, 4, 5), "c", "c"),
        ("k1_outer", (5, 1), (1, 3), "c", "c"),
        ("large_k", (3, 257), (257, 2), "c", "c"),
    ]
    for dt in (np.float64, np.float32):
        d = dt_name(dt)
        eps = EPS32 if dt == np.float32 else EPS64
        for tag, sa, sb, la, lb in specs:
            a, b = uniform(sa, -1, 1, dt), uniform(sb, -1, 1, dt)
            ra, rb = ref64(a), ref64(b)
            want = np.matmul(ra, rb)
            k = sa[-1]
            # gamma_k bound: |error| <= k * eps * (|A| @ |B|).
            bound = float(np.max(np.matmul(np.abs(ra), np.abs(rb)))) * k * eps
            case("matmul/%s/%s" % (d, tag)).input(a, la).input(b, lb).output(want, d).tolerance(0, bound)
    ai = np.array([[1, 2, 3], [4, 5, 6]], dtype=np.int64)
    bi = np.array([[7, 8], [9, 10], [11, -12]], dtype=np.int64)
    case("matmul/int64/2d").input(ai).input(bi).output(ai @ bi, "int64")
    a32 = np.array([[1, 2], [3, 4]], dtype=np.int32)
    case("matmul/mixed/int32_float32").input(a32).input(np.array([[0.5, -1.0], [2.0, 0.25]], dtype=np.float32)).output(
        a32 @ np.array([[0.5, -1.0], [2.0, 0.25]]), "float32")
    # Exact small integers: the result must be exact in float32 too.
    e = np.arange(12, dtype=np.float32).reshape(3, 4)
    case("matmul/float32/exact_integers").input(e).input(e.T.copy(), "t").output(ref64(e) @ ref64(e).T, "float32").tolerance(0, 0)


# ---------------------------------------------------------------------------------------------
# Shape and indexing ops
# ---------------------------------------------------------------------------------------------
def torch_pad_constant(x, pads, value):
    """torch.nn.functional.pad in constant mode; negative pads crop."""
    out = x
    for p in range(len(pads) // 2):
        axis = x.ndim - 1 - p
        before, after = pads[2 * p], pads[2 * p + 1]
        sl = [slice(None)] * x.ndim
        sl[axis] = slice(max(0, -before), out.shape[axis] - max(0, -after))
        out = out[tuple(sl)]
        width = [(0, 0)] * x.ndim
        width[axis] = (max(0, before), max(0, after))
        out = np.pad(out, width, mode="constant", constant_values=value)
    return out


def torch_pad(x, pads, mode, value=0.0):
    if mode == "constant":
        return torch_pad_constant(x, pads, value)
    width = [(0, 0)] * x.ndim
    for p in range(len(pads) // 2):
        width[x.ndim - 1 - p] = (pads[2 * p], pads[2 * p + 1])
    return np.pad(x, width, mode={"reflect": "reflect", "replicate": "edge"}[mode])


def shape_cases():
    for dt in (np.float32, np.int64):
        d = "float32" if dt == np.float32 else "int64"
        a = (rng.integers(-50, 50, size=(2, 3)) if dt == np.int64 else uniform((2, 3), -1, 1, dt)).astype(dt)
        b = (rng.integers(-50, 50, size=(2, 4)) if dt == np.int64 else uniform((2, 4), -1, 1, dt)).astype(dt)
        c = (rng.integers(-50, 50, size=(2, 1)) if dt == np.int64 else uniform((2, 1), -1, 1, dt)).astype(dt)
        case("concat/%s/axis1" % d).param("axis", 1).input(a).input(b).input(c).output(np.concatenate([a, b, c], 1), d)
        case("concat/%s/axis-1_transposed" % d).param("axis", -1).input(a).input(b.T.copy().T, "c").input(np.ascontiguousarray(a), "t").output(
            np.concatenate([a, b, a], -1), d)
        case("concat/%s/axis0" % d).param("axis", 0).input(a).input(a[::-1].copy()).output(np.concatenate([a, a[::-1]], 0), d)
        case("stack/%s/axis0" % d).param("axis", 0).input(a).input(a * 2).output(np.stack([a, a * 2], 0), d)
        case("stack/%s/axis1" % d).param("axis", 1).input(a).input(a * 3).input(a, "t").output(np.stack([a, a * 3, a], 1), d)
        case("stack/%s/axis-1" % d).param("axis", -1).input(a).input(a - 1).output(np.stack([a, a - 1], -1), d)
    # concat promotes mixed dtypes (torch.cat).
    case("concat/mixed/int32_float32").param("axis", 0).input(np.array([1, 2], dtype=np.int32)).input(
        np.array([0.5], dtype=np.float32)).output(np.array([1.0, 2.0, 0.5]), "float32")
    case("concat/float64/strided").param("axis", 0).input(uniform((2, 3), -1, 1, np.float64), "s").input(
        uniform((1, 3), -1, 1, np.float64))
    cs = cases[-1]
    cs.output(np.concatenate([cs.inputs[0][3][..., ::2], cs.inputs[1][3]], 0), "float64")

    x = uniform((4, 6), -1, 1, np.float32)
    for sizes, axis in (((1, 2, 3), 1), ((2, 0, 2), 0), ((6,), -1), ((4, 2), -1)):
        c = case("split/float32/sizes_%s_axis%d" % ("_".join(map(str, sizes)), axis)).param("sizes", *sizes).param("axis", axis).input(x)
        bounds = np.cumsum(sizes)[:-1]
        for piece in np.split(x, bounds, axis=axis):
            c.output(ref64(piece), "float32")
    c = case("split/int64/transposed").param("sizes", 3, 1).param("axis", 0).input(np.arange(12, dtype=np.int64).reshape(4, 3), "t")
    xt = np.arange(12, dtype=np.int64).reshape(4, 3)
    c.output(xt[:3], "int64").output(xt[3:], "int64")
    for n in (3, 4):
        c = case("chunk/float64/n%d" % n).param("n", n).param("axis", 1).input(uniform((2, 7), -1, 1, np.float64))
        xc = c.inputs[0][3]
        step = -(-7 // n)
        for at in range(0, 7, step):
            c.output(xc[:, at:at + step], "float64")

    # gather (torch.gather): out[i][j] = x[index[i][j]][j] on axis 0, x[i][index[i][j]] on axis 1.
    x = uniform((3, 4), -1, 1, np.float32)
    idx0 = np.array([[0, 2, 1, 2], [1, 1, 0, 0]], dtype=np.int64)
    case("gather/float32/axis0").param("axis", 0).input(x).input(idx0).output(np.take_along_axis(ref64(x), idx0, 0), "float32")
    idx1 = np.array([[3, 0], [1, 1], [2, 0]], dtype=np.int64)
    case("gather/float32/axis1").param("axis", 1).input(x).input(idx1).output(np.take_along_axis(ref64(x), idx1, 1), "float32")
    case("gather/float32/axis1_transposed_int32").param("axis", -1).input(x, "t").input(idx1.astype(np.int32)).output(
        np.take_along_axis(ref64(x), idx1, 1), "float32")
    # torch allows an index smaller than the input along the other axes.
    idx_small = np.array([[2], [0]], dtype=np.int64)
    case("gather/float32/smaller_index").param("axis", 1).input(x).input(idx_small).output(
        np.take_along_axis(ref64(x)[:2, :], idx_small, 1), "float32")
    x3 = np.arange(24, dtype=np.int64).reshape(2, 3, 4)
    i3 = rng.integers(0, 3, size=(2, 5, 4))
    case("gather/int64/3d_axis1").param("axis", 1).input(x3).input(i3.astype(np.int64)).output(np.take_along_axis(x3, i3, 1), "int64")

    # index_select: whole slices along an axis, repeated indices allowed.
    x = uniform((4, 5), -1, 1, np.float64)
    for axis, idx in ((0, [3, 0, 3]), (1, [4, 1]), (-1, [0, 0, 0, 2])):
        case("index_select/float64/axis%d" % axis).param("axis", axis).input(x).input(np.array(idx, dtype=np.int64)).output(
            np.take(x, idx, axis=axis), "float64")
    case("index_select/float64/transposed").param("axis", 0).input(x, "t").input(np.array([1, 2], dtype=np.int64)).output(
        x[[1, 2]], "float64")
    case("index_select/int32/int32_index").param("axis", 1).input(x.astype(np.int32) + np.arange(20, dtype=np.int32).reshape(4, 5)).input(
        np.array([2, 2], dtype=np.int32))
    cs = cases[-1]
    cs.output(np.take(cs.inputs[0][3], [2, 2], axis=1), "int32")

    # scatter_add with colliding indices: every contribution to the same slot is summed.
    base = uniform((3, 4), -1, 1, np.float64)
    src = uniform((2, 4), -1, 1, np.float64)
    idx = np.array([[0, 1, 2, 0], [0, 1, 0, 0]], dtype=np.int64)
    want = base.copy()
    for i in range(2):
        for j in range(4):
            want[idx[i, j], j] += src[i, j]
    case("scatter_add/float64/axis0_collisions").param("axis", 0).input(base).input(idx).input(src).output(want, "float64")
    base1 = np.zeros((2, 3), dtype=np.float32)
    src1 = np.arange(1, 9, dtype=np.float32).reshape(2, 4)
    idx1 = np.array([[2, 2, 2, 0], [1, 0, 1, 1]], dtype=np.int64)
    want1 = np.zeros((2, 3))
    for i in range(2):
        for j in range(4):
            want1[i, idx1[i, j]] += src1[i, j]
    case("scatter_add/float32/axis1_collisions").param("axis", 1).input(base1).input(idx1).input(src1).output(want1, "float32")
    # A thousand ones scattered into 3 slots (with a fixed pattern) must give exact counts.
    idx_many = (np.arange(1000) % 3).astype(np.int64).reshape(1000, 1)
    counts = np.bincount(idx_many[:, 0], minlength=3).astype(np.float64).reshape(3, 1)
    case("scatter_add/float32/many_collisions").param("axis", 0).input(np.zeros((3, 1), np.float32)).input(idx_many).input(
        np.ones((1000, 1), np.float32)).output(counts, "float32").tolerance(0, 0)
    bi = np.array([10, 20, 30], dtype=np.int64)
    case("scatter_add/int64/1d").param("axis", 0).input(bi).input(np.array([2, 2, 0, 1, 2], dtype=np.int64)).input(
        np.array([1, 2, 3, 4, 5], dtype=np.int64)).output(np.array([13, 24, 38]), "int64")

    # pad (torch.nn.functional.pad order: last axis first).
    x = uniform((2, 3, 4), -1, 1, np.float32)
    for pads, mode, value in (((1, 2), "constant", 0.0), ((2, 1, 0, 1), "constant", -1.5), ((1, 1, 1, 1, 1, 1), "constant", 7.0),
                              ((-1, 1), "constant", 0.0), ((1, 0, -1, -1), "constant", 3.0),
                              ((2, 3), "reflect", 0.0), ((1, 2, 2, 1), "reflect", 0.0), ((3, 3), "reflect", 0.0),
                              ((2, 3), "replicate", 0.0), ((1, 2, 2, 1), "replicate", 0.0), ((5, 0, 0, 4), "replicate", 0.0)):
        tag = "%s_%s" % (mode, "_".join(str(p) for p in pads))
        case("pad/float32/%s" % tag).param("pads", *pads).param("mode", mode).param("value", value).input(x).output(
            torch_pad(ref64(x), list(pads), mode, value), "float32")
    xt = uniform((3, 5), -1, 1, np.float64)
    case("pad/float64/reflect_transposed").param("pads", 2, 2, 1, 1).param("mode", "reflect").param("value", 0.0).input(xt, "t").output(
        torch_pad(xt, [2, 2, 1, 1], "reflect"), "float64")
    xi = np.arange(6, dtype=np.int64).reshape(2, 3)
    case("pad/int64/constant").param("pads", 1, 1).param("mode", "constant").param("value", 9.0).input(xi).output(
        torch_pad(xi, [1, 1], "constant", 9), "int64")

    # one_hot.
    labels = np.array([[0, 3], [2, 1], [3, 3]], dtype=np.int64)
    eye4 = np.eye(4, dtype=np.int64)
    case("one_hot/int64/inferred").param("num_classes", -1).param("dtype", "int64").input(labels).output(eye4[labels], "int64")
    case("one_hot/int64/num_classes6_float32").param("num_classes", 6).param("dtype", "float32").input(labels).output(
        np.eye(6)[labels], "float32")
    case("one_hot/int32/labels").param("num_classes", 5).param("dtype", "int64").input(np.array([4, 0, 2], dtype=np.int32)).output(
        np.eye(5, dtype=np.int64)[[4, 0, 2]], "int64")

    # tril / triu, square, wide, tall, batched and transposed.
    for shape, layout in (((4, 4), "c"), ((3, 5), "c"), ((5, 3), "t"), ((2, 3, 4), "c")):
        x = uniform(shape, -1, 1, np.float64)
        for diag in (-1, 0, 1, 2):
            tag = "%s_%s_d%d" % ("x".join(map(str, shape)), layout, diag)
            case("tril/float64/%s" % tag).param("diagonal", diag).input(x, layout).output(np.tril(x, diag), "float64")
            case("triu/float64/%s" % tag).param("diagonal", diag).input(x, layout).output(np.triu(x, diag), "float64")
    xi = np.arange(1, 10, dtype=np.int64).reshape(3, 3)
    case("tril/int64/keeps_dtype").param("diagonal", 0).input(xi).output(np.tril(xi), "int64")


# ---------------------------------------------------------------------------------------------
# Casts and creation
# ---------------------------------------------------------------------------------------------
def f16_bits(x):
    return np.asarray(x, dtype=np.float64).astype(np.float16).view(np.uint16).astype(np.int64)


def bf16_bits(x):
    """float -> bfloat16 by hand: round the float32 bit pattern to nearest even at bit 16."""
    out = []
    for v in np.asarray(x, dtype=np.float32).reshape(-1):
        bits = int(np.asarray(v, dtype=np.float32).view(np.uint32))
        if math.isnan(float(v)):
            out.append((bits >> 16) | 0x40)  # a quiet NaN, sign kept
            continue
        lsb = (bits >> 16) & 1
        out.append(((bits + 0x7FFF + lsb) >> 16) & 0xFFFF)
    return np.array(out, dtype=np.int64).reshape(np.shape(x))


def bf16_value(bits):
    return (np.asarray(bits, dtype=np.uint32) << 16).astype(np.uint32).view(np.float32).astype(np.float64)


def cast_cases():
    # float -> int truncates toward zero (C++ static_cast, numpy astype).
    x = np.array([-2.7, -1.0, -0.5, -0.0, 0.0, 0.5, 0.99, 1.9, 2.5, 123456.9, -99999.99], dtype=np.float32)
    for to in ("int64", "int32"):
        case("cast/float32/to_%s_truncates" % to).param("dtype", to).input(x).output(x.astype(getattr(np, to)), to)
    x64 = np.array([-3.9999999, 2 ** 40 + 0.5, -(2 ** 40) - 0.75, 1e-300], dtype=np.float64)
    case("cast/float64/to_int64_truncates").param("dtype", "int64").input(x64).output(x64.astype(np.int64), "int64")
    # float -> bool: non-zero (NaN included) is true.
    xb = np.array([0.0, -0.0, 1e-30, -2.0, np.nan, np.inf], dtype=np.float32)
    case("cast/float32/to_bool").param("dtype", "bool").input(xb).output(xb.astype(np.bool_), "bool")
    case("cast/int64/to_bool").param("dtype", "bool").input(np.array([0, 5, -1], dtype=np.int64)).output(np.array([False, True, True]), "bool")
    case("cast/bool/to_float32").param("dtype", "float32").input(np.array([True, False, True])).output(np.array([1.0, 0.0, 1.0]), "float32")
    case("cast/bool/to_int64").param("dtype", "int64").input(np.array([True, False])).output(np.array([1, 0]), "int64")
    # int -> float; int64 -> float32 rounds to nearest even (2^24 + 1 -> 2^24).
    xi = np.array([0, -7, 2 ** 24 + 1, 2 ** 24 + 3, 2 ** 53 + 1, -(2 ** 31)], dtype=np.int64)
    case("cast/int64/to_float32").param("dtype", "float32").input(xi).output(xi.astype(np.float32).astype(np.float64), "float32").tolerance(0, 0)
    case("cast/int64/to_float64").param("dtype", "float64").input(xi).output(xi.astype(np.float64), "float64").tolerance(0, 0)
    xs = np.array([2 ** 31 - 1, -(2 ** 31), 0, 12345], dtype=np.int64)
    case("cast/int64/to_int32").param("dtype", "int32").input(xs).output(xs.astype(np.int32), "int32")
    case("cast/int32/to_int64").param("dtype", "int64").input(xs.astype(np.int32)).output(xs, "int64")
    # float64 -> float32 rounds to nearest; float32 -> float64 is exact.
    xd = np.array([0.1, 1 / 3, 1e-40, 3.5e38, -1e39, 1 + 2 ** -24, 1 + 3 * 2 ** -25], dtype=np.float64)
    with np.errstate(over="ignore"):
        case("cast/float64/to_float32").param("dtype", "float32").input(xd).output(xd.astype(np.float32).astype(np.float64), "float32").tolerance(0, 0)
    xf = uniform((3, 4), -10, 10, np.float32)
    case("cast/float32/to_float64_transposed").param("dtype", "float64").input(xf, "t").output(ref64(xf), "float64").tolerance(0, 0)

    # float16: bit patterns from NumPy's float16 (IEEE binary16, round to nearest even).
    vals = [1.0, 0.5, -2.0, 65504.0, 65519.99, 65520.0, 2.0 ** -24, 2.0 ** -25, 2.0 ** -25 * 1.5, 2.0 ** -14, 6.0e-8,
            1 + 2.0 ** -11, 1 + 3 * 2.0 ** -11, 1 + 2.0 ** -10, 0.1, 1 / 3, -0.0, np.inf, -np.inf, 1e6, 3.14159265]
    x = np.array(vals, dtype=np.float32)
    with np.errstate(over="ignore"):
        bits = f16_bits(x)
        back = np.asarray(x, dtype=np.float64).astype(np.float16).astype(np.float64)
    case("cast_half/float32/bits").param("dtype", "float16").input(x).output(bits, "float16bits")
    case("cast_half/float32/roundtrip").param("dtype", "float16").input(x).output(back, "float32").tolerance(0, 0)
    case("cast_half/float32/nan").param("dtype", "float16").input(np.array([np.nan], np.float32)).output(np.array([np.nan]), "float32")
    # Double rounding: 1 + 2^-11 + 2^-40 is just above a float16 tie, so it rounds up (to 1 + 2^-10);
    # rounding it to float32 first (which gives the tie 1 + 2^-11) and then to float16 gives 1.0.
    xd = np.array([1 + 2.0 ** -11 + 2.0 ** -40, 2049.0 + 2.0 ** -30], dtype=np.float64)
    case("cast_half/float64/no_double_rounding").param("dtype", "float16").input(xd).output(f16_bits(xd), "float16bits")
    # bfloat16: the upper 16 bits of the float32, rounded to nearest even (computed by hand above).
    vals = [1.0, 1.00390625, 1.005859375, 1.0078125, 1.01171875, -3.0, 3.4e38, 1e-40, 0.1, 65504.0, -0.0, np.inf]
    x = np.array(vals, dtype=np.float32)
    bits = bf16_bits(x)
    case("cast_bf16/float32/bits").param("dtype", "bfloat16").input(x).output(bits, "bfloat16bits")
    case("cast_bf16/float32/roundtrip").param("dtype", "bfloat16").input(x).output(bf16_value(bits), "float32").tolerance(0, 0)

    # Creation: arange and linspace, values start + i*step.
    for start, end, step, dt in ((0, 5, 1, "int64"), (0, 1, 0.1, "float64"), (5, -3, -1.5, "float32"), (-2, 2, 0.5, "float32"),
                                 (10, 0, -3, "int64"), (0.5, 3, 1, "float64"), (1, 1, 1, "float32")):
        want = np.arange(start, end, step, dtype=np.float64)
        case("arange/%s/%g_%g_%g" % (dt, start, end, step)).param("start", float(start)).param("end", float(end)).param(
            "step", float(step)).param("dtype", dt).output(want, dt).tolerance(*( (1e-12, 1e-15) if dt == "float64" else (1e-6, 1e-7) if dt == "float32" else (0, 0)))
    for start, end, steps, dt in ((0, 1, 5, "float32"), (-1, 1, 11, "float64"), (2, -3, 4, "float64"), (3, 3, 1, "float32"),
                                  (0, 1, 0, "float32"), (0, 10, 11, "int64"), (0, 1, 1000, "float64")):
        want = np.linspace(start, end, steps, dtype=np.float64)
        if dt == "int64":
            want = want.astype(np.int64)
        case("linspace/%s/%g_%g_%d" % (dt, start, end, steps)).param("start", float(start)).param("end", float(end)).param(
            "steps", steps).param("dtype", dt).output(want, dt).tolerance(*((1e-12, 1e-15) if dt == "float64" else (1e-6, 1e-7) if dt == "float32" else (0, 0)))
    for n, dt in ((3, "float32"), (1, "int64"), (0, "float64")):
        case("eye/%s/n%d" % (dt, n)).param("n", n).param("dtype", dt).output(np.eye(n), dt)


def edge_shape_cases():
    """Empty tensors, 0-d tensors and other degenerate shapes."""
    e = np.zeros((0, 3), dtype=np.float32)
    case("exp/float32/empty").input(e).output(np.exp(ref64(e)), "float32")
    case("add/float32/empty_broadcast").input(e).input(np.ones(3, np.float32)).output(np.ones((0, 3)), "float32")
    s = np.float64(0.75)
    case("exp/float64/scalar").input(np.array(s)).output(np.exp(s), "float64")
    case("add/float64/scalars").input(np.array(s)).input(np.array(-2.0)).output(np.array(s - 2.0), "float64")
    case("sum/float64/scalar").param("axes").param("keepdim", 0).input(np.array(s)).output(np.array(s), "float64")
    case("softmax/float64/scalar").param("axis", 0).input(np.array(s)).output(np.array(1.0), "float64")
    # Reductions over an axis of size 0: sum is 0, prod is 1, mean is 0/0 = nan (numpy and torch).
    case("sum/float32/empty_axis").param("axes", 0).param("keepdim", 0).input(e).output(np.zeros(3), "float32")
    case("prod/float32/empty_axis").param("axes", 0).param("keepdim", 0).input(e).output(np.ones(3), "float32")
    case("mean/float32/empty_axis").param("axes", 0).param("keepdim", 0).input(e).output(np.full(3, np.nan), "float32")
    case("sum/float32/empty_other_axis").param("axes", 1).param("keepdim", 1).input(e).output(np.zeros((0, 1)), "float32")
    # var with n <= correction divides by zero: nan (0/0), as numpy (ddof=1 of one value) and torch.
    x1 = np.array([[1.5], [2.0], [-3.0]], dtype=np.float64)
    case("var/float64/single_value_corr1").param("axes", 1).param("correction", 1).param("keepdim", 0).input(x1).output(
        np.full(3, np.nan), "float64")
    # Integer input to float reductions and softmax is computed in float32.
    xi = np.array([[1, 2, 3], [4, 6, 8]], dtype=np.int64)
    case("var/int64/to_float32").param("axes", 1).param("correction", 1).param("keepdim", 0).input(xi).output(
        np.var(xi.astype(np.float64), axis=1, ddof=1), "float32")
    xs = xi.astype(np.float64)
    es = np.exp(xs - xs.max(axis=1, keepdims=True))
    case("softmax/int64/to_float32").param("axis", 1).input(xi).output(es / es.sum(axis=1, keepdims=True), "float32").tolerance(4e-6, 0)
    # matmul with an empty inner dimension is all zeros; with an empty outer one it is empty.
    case("matmul/float32/k0").input(np.zeros((2, 0), np.float32)).input(np.zeros((0, 3), np.float32)).output(np.zeros((2, 3)), "float32")
    case("matmul/float64/m0").input(np.zeros((0, 3))).input(np.ones((3, 2))).output(np.zeros((0, 2)), "float64")
    case("matmul/float64/batch0").input(np.zeros((0, 2, 3))).input(np.ones((3, 2))).output(np.zeros((0, 2, 2)), "float64")
    # concat with an empty piece; index_select with an empty index.
    a = uniform((2, 3), -1, 1, np.float32)
    case("concat/float32/empty_piece").param("axis", 1).input(np.zeros((2, 0), np.float32)).input(a).output(ref64(a), "float32")
    case("index_select/float32/empty_index").param("axis", 1).input(a).input(np.zeros(0, np.int64)).output(np.zeros((2, 0)), "float32")
    # tril/triu with diagonals beyond the matrix.
    m = uniform((3, 4), -1, 1, np.float64)
    for diag in (5, -5):
        case("tril/float64/diag_%d" % diag).param("diagonal", diag).input(m).output(np.tril(m, diag), "float64")
        case("triu/float64/diag_%d" % diag).param("diagonal", diag).input(m).output(np.triu(m, diag), "float64")
    # Integer true division by zero: +-inf and nan in float32.
    with np.errstate(all="ignore"):
        case("div/int64/by_zero").input(np.array([1, -1, 0], np.int64)).input(np.zeros(3, np.int64)).output(
            np.array([1.0, -1.0, 0.0]) / 0.0, "float32")
    # arange element counts: ceil((end - start) / step) in float64, exactly as numpy.arange.
    for start, end, step in ((0, 10, 0.1), (1, 2.2, 0.4), (-1, 1, 2 / 3)):
        want = np.arange(start, end, step, dtype=np.float64)
        case("arange/float32/count_%g_%g_%g" % (start, end, step)).param("start", float(start)).param("end", float(end)).param(
            "step", float(step)).param("dtype", "float32").output(want, "float32").tolerance(1e-6, 1e-6)


def main():
    unary_cases()
    edge_shape_cases()
    binary_cases()
    reduction_cases()
    matmul_cases()
    shape_cases()
    cast_cases()
    names = [c.name for c in cases]
    dup = {n for n in names if names.count(n) > 1}
    assert not dup, "duplicate case names: %s" % sorted(dup)
    out_lines.append("# generated by tests/data/make_golden.py (seed %d, numpy %s); do not edit" % (SEED, np.__version__))
    for c in cases:
        c.write()
    sys.stdout.write("\n".join(out_lines) + "\n")
    sys.stderr.write("%d cases\n" % len(cases))


if __name__ == "__main__":
    main()
