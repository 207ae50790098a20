# Case generators for convolution and pooling, whole-tensor comparisons (allclose, equal) and in-place
# updates (fill_, add_, mul_, copy_); gen_cases.py registers them in its op table. Each returns
# (args, [Input, ...]) as the generators there do. Sizes stay small (spatial 0 to 7, channels 1 to 4,
# kernels 1 to 3), so the tap-by-tap NumPy references stay fast.
import math

import numpy as np

from ref_inplace import close_margin
from values import DTYPES, FLOATS, INTS

# ---- convolution and pooling ----


def nn_dtype(g):
    """Mostly float32/float64; integer and bool inputs appear now and then to show their refusal."""
    return g.dtype() if g.chance(0.15) else g.pick(FLOATS)


def other_dtype(g, d, p=0.03):
    """d, or with probability p another dtype (operands of a convolution must agree)."""
    return g.pick([t for t in DTYPES if t != d]) if g.chance(p) else d


def spatial_size(g):
    return 0 if g.chance(0.03) else g.int(1, 7)


def batch_shape(g, c, spatial):
    """(N, C, *spatial) or the unbatched (C, *spatial); now and then a rank the op refuses."""
    shape = [c] + spatial
    if not g.chance(0.2):
        shape = [g.pick([0, 1, 1, 1, 2, 2, 3])] + shape
    if g.chance(0.03):
        shape = shape[1:] if g.chance(0.5) else [1] + shape
    return shape


def pad_of(g, k):
    """Padding up to half the kernel, sometimes beyond (which pooling refuses and convolution takes)."""
    return g.int(0, k + 1) if g.chance(0.06) else g.int(0, k // 2)


def stride_of(g):
    return 0 if g.chance(0.01) else g.int(1, 3)


def dilation_of(g):
    return g.pick([1, 1, 1, 1, 1, 2, 2, 3])


def pair(g, fn):
    return [fn(g), fn(g)]


def conv_channels(g):
    """(channels of x, C_in as the weight has it, C_out, groups), groups dividing both channel counts;
    now and then x's channel count is off by one, or groups does not divide C_out."""
    groups = g.pick([1, 1, 1, 2, 2, 3, 4])
    c_in, c_out = groups * g.int(1, 4 // groups), groups * g.int(1, 4 // groups)
    fault = g.chance(0.06)
    if fault and (groups == 1 or g.chance(0.5)):
        return c_in + (1 if c_in == 1 or g.chance(0.5) else -1), c_in, c_out, groups
    return c_in, c_in, c_out + (1 if fault else 0), groups


def conv_operands(g, c_in, w_shape, bias_size, spatial):
    """x (rarely NaN or infinite, never huge, so sums cannot depend on their order), a finite weight
    (a NaN or infinity there would meet the zero padding and make 0 * inf part of the answer), and an
    optional bias."""
    d = nn_dtype(g)
    x = g.tensor(d, batch_shape(g, c_in, [spatial_size(g) for _ in range(spatial)]), "rare")
    w = g.tensor(other_dtype(g, d), w_shape, "finite")
    if not g.chance(0.6):
        return [x, w]
    size = bias_size + 1 if g.chance(0.03) else bias_size
    return [x, w, g.tensor(other_dtype(g, d), [size], "rare")]


def gen_conv1d(g):
    c_x, c_in, c_out, groups = conv_channels(g)
    k = g.int(1, 3)
    args = {"stride": stride_of(g), "padding": pad_of(g, k), "dilation": dilation_of(g), "groups": groups}
    return args, conv_operands(g, c_x, [c_out, c_in // groups, k], c_out, 1)


def gen_conv2d(g):
    c_x, c_in, c_out, groups = conv_channels(g)
    k = [g.int(1, 3), g.int(1, 3)]
    if g.chance(0.3):  # braid's {top, bottom, left, right} form
        padding = [pad_of(g, k[0]), pad_of(g, k[0]), pad_of(g, k[1]), pad_of(g, k[1])]
    else:
        padding = [pad_of(g, k[0]), pad_of(g, k[1])]
    args = {"stride": pair(g, stride_of), "padding": padding, "dilation": pair(g, dilation_of), "groups": groups}
    return args, conv_operands(g, c_x, [c_out, c_in // groups] + k, c_out, 2)


def gen_conv_transpose2d(g):
    c_x, c_in, c_out, groups = conv_channels(g)
    if c_out % groups:  # the transposed weight's fault: C_in rows that groups does not divide
        c_x = c_in = c_in + 1
    k = [g.int(1, 3), g.int(1, 3)]
    stride, dilation = pair(g, stride_of), pair(g, dilation_of)
    # output_padding below max(stride, dilation), now and then at it (refused)
    out_pad = [max(s, dl) if g.chance(0.03) else 0 if g.chance(0.5) else g.int(0, max(s, dl) - 1)
               for s, dl in zip(stride, dilation)]
    args = {"stride": stride, "padding": [pad_of(g, k[0]), pad_of(g, k[1])], "output_padding": out_pad,
            "groups": groups, "dilation": dilation}
    # weight (C_in, C_out / groups, kH, kW)
    return args, conv_operands(g, c_x, [c_in, c_out // groups] + k, c_out // groups * groups, 2)


def pool_input(g, profile):
    """(N, C, H, W) or (C, H, W). Averages get no huge values: +huge and -huge in one window cancel
    in an order-dependent way, which only a tolerance scaled to huge would cover."""
    return g.tensor(nn_dtype(g), batch_shape(g, g.int(1, 4), [spatial_size(g), spatial_size(g)]), profile)


def pool_window(g):
    k = [g.int(1, 3), g.int(1, 3)]
    return {"kernel": k, "stride": [] if g.chance(0.3) else pair(g, stride_of),
            "padding": [pad_of(g, k[0]), pad_of(g, k[1])]}


def gen_max_pool2d(g):
    args = pool_window(g)
    args.update({"dilation": pair(g, dilation_of), "ceil_mode": g.chance(0.4)})
    return args, [pool_input(g, "any")]


def gen_avg_pool2d(g):
    args = pool_window(g)
    args.update({"ceil_mode": g.chance(0.4), "count_include_pad": g.chance(0.5)})
    return args, [pool_input(g, "nohuge")]


def gen_adaptive_avg_pool2d(g):
    def out_size(g):
        return -1 if g.chance(0.03) else 0 if g.chance(0.05) else g.int(1, 7)
    size = [1, 1] if g.chance(0.15) else pair(g, out_size)  # PyTorch computes (1, 1) through mean()
    return {"output_size": size}, [pool_input(g, "nohuge")]


# ---- whole-tensor comparisons ----

RTOLS = [1e-5, 1e-5, 1e-3, 0.1, 0.0, 1e-8]
ATOLS = [1e-8, 1e-8, 1e-5, 0.0, 0.5, 2.0]


def as_dtype(v, d):
    """Float64 values in dtype d; integer targets get whole numbers in [-8, 8] (no NaN to convert)."""
    v = np.asarray(v, dtype=np.float64)
    if d == "bool":
        return v != 0
    if d in INTS:
        return np.clip(np.round(np.nan_to_num(v)), -8, 8).astype(d)
    with np.errstate(all="ignore"):
        return v.astype(d)


def derived(a, shape):
    """Values of the given shape taken from operand a where the shapes broadcast (the first element
    along axes the shape does not have), or None."""
    try:
        common = np.broadcast_shapes(a.shape, tuple(shape))
    except ValueError:
        return None
    lead = len(common) - len(shape)
    idx = (0,) * lead + tuple(slice(0, 1) if s == 1 else slice(None) for s in shape)
    if 0 in common[:lead]:
        return None
    v = np.broadcast_to(a, common)[idx]
    return np.array(v, dtype=np.float64) if v.shape == tuple(shape) else None


def gen_allclose(g):
    if g.chance(0.6):
        sa = g.shape()
        sb = list(sa)
    else:
        sa, sb = g.broadcast_shapes(2)
    da = g.dtype()
    db = da if g.chance(0.85) else g.dtype()
    a = g.tensor(da, sa)
    rtol, atol = g.pick(RTOLS), g.pick(ATOLS)
    if g.chance(0.02):
        rtol, atol = g.pick([(-1e-5, atol), (rtol, -1e-8)])
    t = derived(a.value, sb)
    if t is None:
        return {"rtol": rtol, "atol": atol}, [a, g.tensor(db, sb)]
    # Move some elements by 0.3 or 3 times their bound (or 1e-3 relative where the bound is 0), and
    # make a few NaN or infinite.
    p = g.pick([0.0, 0.0, 0.1, 0.5])
    flat = t.reshape(-1)
    for i in range(flat.size):
        if g.chance(p) and math.isfinite(flat[i]):
            v = flat[i]
            bound = atol + rtol * abs(v)
            step = bound if bound > 0 else max(abs(v), 1.0) * 1e-3
            flat[i] = v + g.pick([-3, -0.3, 0.3, 3]) * step
        elif g.chance(0.01):
            flat[i] = g.pick([math.nan, math.inf, -math.inf])
    b = g.input_of(as_dtype(t, db), 0.5)
    # No element may sit so near its bound that the dtype the test runs in could decide it:
    # widen the tolerances until none does.
    for _ in range(8):
        if rtol < 0 or atol < 0 or close_margin(a.value, b.value, rtol, atol)[1].min(initial=np.inf) > 1e-4:
            break
        rtol, atol = rtol * 1.25, atol * 1.25
    return {"rtol": rtol, "atol": atol}, [a, b]


def gen_equal(g):
    da = g.dtype()
    a = g.tensor(da, g.shape())
    t = np.array(a.value)
    kind = g.pick(["same", "same", "same", "same", "changed", "changed", "dtype", "shape", "random"])
    if kind == "random":
        return {}, [a, g.tensor(g.dtype(), g.shape())]
    if kind == "changed" and t.size:
        flat = t.reshape(-1)
        i = g.int(0, flat.size - 1)
        if da == "bool":
            flat[i] = not flat[i]
        elif da in INTS:
            flat[i] += 1
        else:  # a zero changes sign only: equal values, different bytes
            flat[i] = -flat[i] if flat[i] == 0 or g.chance(0.3) else flat[i] + 1
    elif kind == "dtype":
        t = as_dtype(t, g.pick([d for d in DTYPES if d != da]))
    elif kind == "shape":
        t = t.reshape([1] + list(t.shape)) if g.chance(0.5) or t.ndim == 0 else t.reshape(-1)[:max(t.size - 1, 0)]
    return {}, [a, g.input_of(t, 0.5)]


# ---- in-place updates ----


def inplace_target(g, d, shape):
    """The tensor an in-place op writes into, often an expanded view (writing into one is refused
    unless it is empty, fill_ excepted)."""
    if g.chance(0.12):
        return g.tensor(d, shape, view_p=1.0, view_kind="expand")
    return g.tensor(d, shape, view_p=0.4)


def source_shape(g, shape):
    """A shape that broadcasts to shape (a suffix with some axes 1); now and then one that does not,
    or only in the other direction."""
    s = [1 if g.chance(0.3) else n for n in shape[g.int(0, len(shape)):]]
    if g.chance(0.06):
        grow = [i for i, n in enumerate(s) if n == 1]
        if grow and g.chance(0.5):
            s[g.pick(grow)] = 3
        else:
            s = [2] + list(shape)
    return s


def gen_fill_(g):
    values = [0.0, 1.0, -2.5, 2.5, 7.0, -0.0, 0.1, 1e-40, 1e-310, 3e9, -3e9, 1e30, 1e300, -1e300,
              math.nan, math.inf, -math.inf]
    return {"value": g.pick(values)}, [inplace_target(g, g.dtype(), g.shape())]


def gen_add_(g):
    shape = g.shape()
    dx = g.dtype()
    do = dx if g.chance(0.75) else g.dtype()
    alpha = g.pick([1.0, 1.0, 1.0, 1.0, 2.0, -1.0, 0.5, 0.0, 1.5, 0.1])
    return {"alpha": alpha}, [inplace_target(g, dx, shape), g.tensor(do, source_shape(g, shape))]


def gen_mul_(g):
    values = [2.0, -1.0, 0.5, 0.0, -3.0, 1.0, 0.1, 1e6, 3e9, 1e30, math.nan, math.inf, -math.inf]
    return {"value": g.pick(values)}, [inplace_target(g, g.dtype(), g.shape())]


def gen_copy_(g):
    shape = g.shape()
    dx = g.dtype()
    ds = dx if g.chance(0.5) else g.dtype()
    # float to integer is undefined behaviour in C++ for NaN, infinities and out-of-range values
    profile = "finite" if ds in FLOATS and dx in INTS else "any"
    return {}, [inplace_target(g, dx, shape), g.tensor(ds, source_shape(g, shape), profile)]
