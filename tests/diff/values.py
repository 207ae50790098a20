# Seeded random inputs for braid's differential test (gen_cases.py): shapes, broadcast pairs,
# values with special floats mixed in, and the strided views (permute, slice, expand) that the C++
# runner rebuilds. Python's own `random` makes every choice, so both NumPy versions the generator
# runs under produce identical inputs for a seed; NumPy only stores the values.
import math
import random

import numpy as np

DTYPES = ("float32", "float64", "int64", "int32", "bool")
FLOATS = ("float32", "float64")
INTS = ("int64", "int32")
# Large enough to overflow when squared or multiplied together, small enough that a handful of them
# add up without overflowing (the expected result must not depend on summation order).
HUGE = {"float32": 1e30, "float64": 1e300}
DENORMAL = {"float32": 1e-40, "float64": 1e-310}
MAX_HUGE_PER_TENSOR = 2


class Input:
    """One tensor operand: the spec the runner rebuilds it from, and the NumPy array the op sees."""

    def __init__(self, base, view):
        self.base = base
        self.view = view
        self.value = apply_view(base, view)

    def spec(self):
        return {"dtype": self.base.dtype.name, "shape": list(self.base.shape),
                "data": self.base.tobytes().hex(), "view": self.view}


def apply_view(base, view):
    if view is None:
        return base
    if view["kind"] == "permute":
        return base.transpose(view["order"])
    if view["kind"] == "slice":
        a = view["axis"]
        return base[(slice(None),) * a + (slice(view["start"], view["end"], view["step"]),)]
    return np.broadcast_to(base, view["shape"])


class Gen:
    """The random choices of one case, seeded by (seed, case id) so cases are independent."""

    def __init__(self, seed, case_id):
        self.r = random.Random(f"{seed}:{case_id}")

    def chance(self, p):
        return self.r.random() < p

    def pick(self, seq):
        return seq[self.r.randrange(len(seq))]

    def int(self, lo, hi):
        return self.r.randint(lo, hi)

    def uniform(self, lo, hi):
        return self.r.uniform(lo, hi)

    def shuffled(self, seq):
        seq = list(seq)
        self.r.shuffle(seq)
        return seq

    def dtype(self, choices=DTYPES):
        # Floats get most cases: they carry the special values and the rounding questions.
        weights = {"float32": 3, "float64": 3, "int64": 1.2, "int32": 1.2, "bool": 1}
        return self.r.choices(choices, [weights[d] for d in choices])[0]

    def size(self, hi=7):
        u = self.r.random()
        return 0 if u < 0.1 else 1 if u < 0.35 else self.r.randint(2, hi)

    def rank(self, lo=0, hi=4):
        while True:
            r = self.r.choices((0, 1, 2, 3, 4), (0.15, 0.2, 0.3, 0.2, 0.15))[0]
            if lo <= r <= hi:
                return r

    def shape(self, lo=0, hi=4):
        return [self.size() for _ in range(self.rank(lo, hi))]

    def axis(self, ndim, p_bad=0.05):
        """An axis of a tensor of rank ndim, sometimes negative, sometimes out of range."""
        n = max(ndim, 1)  # 0-d tensors accept axes 0 and -1
        if self.chance(p_bad):
            return self.pick([n, n + 1, -n - 1])
        a = self.int(0, n - 1)
        return a - n if self.chance(0.3) else a

    def values(self, dtype, n, profile="any", limit=None):
        """n values for a base tensor. profile narrows the floats where a reference would otherwise
        depend on evaluation order or hit undefined behaviour; limit bounds products (see prod)."""
        r = self.r
        if dtype == "bool":
            p = self.pick([0.1, 0.5, 0.9])
            return np.array([r.random() < p for _ in range(n)], dtype=np.bool_)
        if dtype in INTS:
            if profile == "prod":
                # Products of up to 2401 factors must fit int64: mostly +-1 and 0, +-2 only when
                # the operand is small enough that 2^numel cannot overflow.
                pool = [-1, 0, 1, 1, -1] + ([2, -2] if limit is not None and limit <= 60 else [])
                return np.array([self.pick(pool) for _ in range(n)], dtype=dtype)
            return np.array([r.randint(-8, 8) for _ in range(n)], dtype=dtype)
        specials = [math.nan, math.inf, -math.inf, 0.0, -0.0, DENORMAL[dtype], -DENORMAL[dtype]]
        if profile in ("any", "pos", "unit"):
            specials += [HUGE[dtype], -HUGE[dtype]]
        elif profile == "finite":
            specials = [0.0, -0.0, DENORMAL[dtype]]
        elif profile == "prod":
            specials = [math.nan, math.inf, -math.inf, 0.0, -0.0, 1.0, -1.0]
        # "rare": the specials without huge values, seldom (convolution inputs, where one NaN or
        # infinity spreads over a whole window of outputs)
        p_special = self.pick([0.0, 0.0, 0.0, 0.01, 0.05] if profile == "rare" else [0.0, 0.0, 0.05, 0.2, 0.5])
        nice = self.chance(0.3)  # halves and whole numbers: ties for round, equal pairs for eq
        # now and then a wider spread, to reach saturation and overflow (exp, softplus, tanh)
        sigma = self.pick([2.0, 2.0, 2.0, 10.0, 40.0])
        # prod: magnitudes e^[-L, L] with L * numel <= 60, so partial products stay far from
        # float32's range whatever the order of multiplication.
        span = min(1.5, 60.0 / max(limit or 1, 1))
        out, huge = [], 0
        for _ in range(n):
            if r.random() < p_special:
                v = self.pick(specials)
                if abs(v) == HUGE[dtype]:
                    huge += 1
                    if huge > MAX_HUGE_PER_TENSOR:
                        v = 0.0
                out.append(v)
                continue
            if profile == "prod":
                v = math.exp(r.uniform(-span, span)) * (1 if r.random() < 0.5 else -1)
            elif profile == "unit":
                v = r.uniform(-1.1, 1.1)
            else:
                v = r.gauss(0.0, sigma)
                if profile == "pos" and r.random() < 0.8:
                    v = abs(v)
            out.append(round(v * 2) / 2 if nice else v)
        return np.array(out, dtype=np.float64).astype(dtype)

    def tensor(self, dtype, shape, profile="any", view_p=0.6, limit=None, view_kind=None):
        """An Input with the given operand shape, often reached through a view (with 0-d operands,
        which have none, about half of all inputs); view_kind prefers one kind of view."""
        view, base_shape = self.view(shape, view_kind) if self.chance(view_p) else (None, list(shape))
        n = int(np.prod(base_shape, dtype=np.int64))
        base = self.values(dtype, n, profile, limit).reshape(base_shape)
        return Input(base, view)

    def index_tensor(self, shape, size, dtype="int64", p_bad=0.05, negative=True):
        """Indices in [0, size) (or counted from the end, in [-size, 0), with negative), with one
        out of range now and then."""
        n = int(np.prod(shape, dtype=np.int64))
        p_neg = 0.2 if negative else 0.0
        vals = [(self.int(0, size - 1) - (size if self.chance(p_neg) else 0)) if size > 0 else 0
                for _ in range(n)]
        if n and (size == 0 or self.chance(p_bad)):
            vals[self.int(0, n - 1)] = self.pick([size, -size - 1, size + 3] if negative else [size, -1])
        return self.input_of(np.array(vals, dtype=dtype).reshape(shape), 0.3)

    def input_of(self, vals, view_p):
        """An Input whose operand holds exactly vals, reached through a permute or slice view with
        probability about view_p (an expanded view cannot show arbitrary values)."""
        view, base_shape = self.view(list(vals.shape)) if self.chance(view_p) else (None, list(vals.shape))
        if view is None or view["kind"] == "expand":
            return Input(vals, None)
        # Build the base backwards from the operand; elements the view skips stay 0.
        base = np.zeros(base_shape, dtype=vals.dtype)
        apply_view(base, view)[...] = vals
        return Input(base, view)

    def view(self, shape, kind=None):
        """A view whose result has the given shape, and the base shape it starts from; kind asks for
        one kind of view where the shape allows it."""
        nd = len(shape)
        kinds = []
        if nd >= 2:
            kinds.append("permute")
        if nd >= 1:
            kinds.append("slice")
            if any(s != 1 for s in shape):
                kinds.append("expand")
        if not kinds:
            return None, list(shape)
        kind = kind if kind in kinds else self.pick(kinds)
        if kind == "permute":
            order = self.shuffled(range(nd))
            base = [0] * nd
            for i, p in enumerate(order):
                base[p] = shape[i]
            return {"kind": "permute", "order": order}, base
        if kind == "expand":
            axes = [a for a in range(nd) if shape[a] != 1]
            chosen = [a for a in axes if self.chance(0.6)] or [self.pick(axes)]
            base = [1 if a in chosen else s for a, s in enumerate(shape)]
            return {"kind": "expand", "shape": list(shape)}, base
        a = self.int(0, nd - 1)
        n, k, s = shape[a], self.pick([1, 2, 3]), self.int(0, 2)
        if n > 0:
            length = s + (n - 1) * k + 1 + self.int(0, k - 1)
            e = self.pick([s + (n - 1) * k + 1, length, length + self.int(1, 5)])
        else:
            length = self.int(0, 3)
            s = self.int(0, length)
            e = self.pick([s, max(s - 1, 0)])
        # Negative positions count from the end, as in Python; -0 would mean 0, so only e < length.
        if s < length and self.chance(0.3):
            s -= length
        if e < length and self.chance(0.3):
            e -= length
        base = list(shape)
        base[a] = length
        return {"kind": "slice", "axis": a, "start": s, "end": e, "step": k}, base

    def broadcast_shapes(self, count, p_bad=0.05):
        """count shapes that broadcast together (rank differences, size-1 axes); with p_bad two of
        them clash on an axis instead."""
        out = self.shape()
        shapes = []
        for _ in range(count):
            k = len(out) if self.chance(0.6) else self.int(0, len(out))
            s = [1 if self.chance(0.3) else d for d in out[len(out) - k:]]
            shapes.append(s)
        if self.chance(p_bad):
            i, j = self.shuffled(range(count))[:2]
            x, y = self.pick([(2, 3), (0, 2), (3, 0), (4, 5), (2, 7)])
            for s, v in ((i, x), (j, y)):
                shapes[s] = shapes[s] or [1]
                shapes[s][-1] = v
        return shapes
