# Reference results for braid's differential test, convolution and pooling (conv1d, conv2d,
# conv_transpose2d, max_pool2d, avg_pool2d, adaptive_avg_pool2d): torch.nn.functional's semantics
# computed by NumPy in float64 as sums over kernel taps, or Reject where PyTorch (or braid, where
# check_torch.py lists a difference) refuses the input. The sums are written tap by tap rather than
# through a 0/1 weight matrix so that an infinity reaches only the outputs whose window holds it.
import numpy as np

from ref import EPS, RTOL_ARITH, Out, Reject, is_float, max_abs


def _batched(x, spatial):
    """x as (N, C, *spatial), and whether it came without the N axis (PyTorch's unbatched form)."""
    if x.ndim == spatial + 1:
        return x[None], True
    if x.ndim != spatial + 2:
        raise Reject()
    return x, False


def _check_float(*ts):
    """braid's convolution and pooling take floating-point tensors of one dtype (PyTorch's CPU
    kernels also take some integer dtypes, see check_torch.py)."""
    d = ts[0].dtype.name
    if not is_float(d) or any(t.dtype.name != d for t in ts):
        raise Reject()
    return d


def _check_bias(bias, c_out, d):
    if bias is not None and (bias.dtype.name != d or bias.shape != (c_out,)):
        raise Reject()


def _check_window(stride, dilation, pads=()):
    if min(stride) < 1 or min(dilation) < 1 or min(pads, default=0) < 0:
        raise Reject()


def _empty_spatial(x):
    """An empty spatial axis is refused (PyTorch refuses it unless the batch is empty, see
    check_torch.py)."""
    if 0 in x.shape[2:]:
        raise Reject()


def _finish(out, unbatched, d, x, w, bias, terms):
    """The output in x's dtype, with the bias added and a tolerance for sums of terms products."""
    if bias is not None:
        with np.errstate(all="ignore"):
            out = out + bias.astype(np.float64).reshape((-1,) + (1,) * (out.ndim - 2))
    eps = EPS[d]
    atol = 2 * terms * eps * max_abs(x) * max_abs(w) + 2 * eps * max_abs(bias if bias is not None else 0.0)
    return [Out(out[0] if unbatched else out, d, RTOL_ARITH[d], atol)]


def _conv(x, w, stride, pads, dilation, groups):
    """x (N, C, H, W), w (C_out, C / groups, kH, kW) in float64; pads (top, bottom, left, right)."""
    n = x.shape[0]
    c_out, cg, kh, kw = w.shape
    (sh, sw), (dh, dw) = stride, dilation
    xp = np.pad(x, ((0, 0), (0, 0), tuple(pads[:2]), tuple(pads[2:])))
    ho = (xp.shape[2] - dh * (kh - 1) - 1) // sh + 1
    wo = (xp.shape[3] - dw * (kw - 1) - 1) // sw + 1
    xg = xp.reshape(n, groups, cg, *xp.shape[2:])
    wg = w.reshape(groups, c_out // groups, cg, kh, kw)
    out = np.zeros((n, groups, c_out // groups, ho, wo))
    with np.errstate(all="ignore"):
        for i in range(kh):
            for j in range(kw):
                win = xg[..., i * dh:i * dh + (ho - 1) * sh + 1:sh, j * dw:j * dw + (wo - 1) * sw + 1:sw]
                out += np.einsum("ngchw,goc->ngohw", win, wg[..., i, j])
    return out.reshape(n, c_out, ho, wo)


def _conv_nd(spatial, x, w, bias, stride, pads, dilation, groups):
    """conv1d (as conv2d over a height of 1) and conv2d after their argument forms are unified."""
    xb, unbatched = _batched(x, spatial)
    d = _check_float(xb, w)
    if w.ndim != spatial + 2 or groups < 1:
        raise Reject()
    _check_window(stride, dilation, pads)
    c_out = w.shape[0]
    if c_out % groups or xb.shape[1] != w.shape[1] * groups:
        raise Reject()
    _check_bias(bias, c_out, d)
    if spatial == 1:
        xb, w = xb[:, :, None], w[:, :, None]
    for a in range(2):
        span = dilation[a] * (w.shape[2 + a] - 1) + 1
        if xb.shape[2 + a] + pads[2 * a] + pads[2 * a + 1] < span:
            raise Reject()  # the kernel is larger than the padded input
    _empty_spatial(xb)
    out = _conv(xb.astype(np.float64), w.astype(np.float64), stride, pads, dilation, groups)
    if spatial == 1:
        out = out[:, :, 0]
    return _finish(out, unbatched, d, x, w, bias, w.shape[1] * w.shape[2] * w.shape[3])


def ref_conv1d(args, x, w, bias=None):
    p = args["padding"]
    return _conv_nd(1, x, w, bias, (1, args["stride"]), (0, 0, p, p), (1, args["dilation"]), args["groups"])


def ref_conv2d(args, x, w, bias=None):
    p = list(args["padding"])
    if len(p) not in (2, 4):
        raise Reject()
    pads = p if len(p) == 4 else [p[0], p[0], p[1], p[1]]
    return _conv_nd(2, x, w, bias, args["stride"], pads, args["dilation"], args["groups"])


def ref_conv_transpose2d(args, x, w, bias=None):
    """The adjoint of conv2d: every input element adds its products with the kernel into the output
    window it came from; padding crops the output, output_padding extends it at the end."""
    xb, unbatched = _batched(x, 2)
    d = _check_float(xb, w)
    stride, pad, out_pad, dilation, groups = (args["stride"], args["padding"], args["output_padding"],
                                              args["dilation"], args["groups"])
    if w.ndim != 4 or groups < 1:
        raise Reject()
    _check_window(stride, dilation, pad)
    n, c, h, wd = xb.shape
    if min(out_pad) < 0 or any(op >= max(s, dl) for op, s, dl in zip(out_pad, stride, dilation)):
        raise Reject()  # output_padding must be smaller than the stride or the dilation
    if w.shape[0] != c or c % groups:
        raise Reject()
    cog, kh, kw = w.shape[1:]
    c_out = cog * groups
    _check_bias(bias, c_out, d)
    size = [(n_in - 1) * s - 2 * p + dl * (k - 1) + op + 1
            for n_in, s, p, dl, k, op in zip((h, wd), stride, pad, dilation, (kh, kw), out_pad)]
    if min(size) < 1:
        raise Reject()
    _empty_spatial(xb)
    (sh, sw), (dh, dw) = stride, dilation
    canvas = np.zeros((n, groups, cog, (h - 1) * sh + dh * (kh - 1) + 1 + out_pad[0],
                       (wd - 1) * sw + dw * (kw - 1) + 1 + out_pad[1]))
    xg = xb.astype(np.float64).reshape(n, groups, c // groups, h, wd)
    wg = w.astype(np.float64).reshape(groups, c // groups, cog, kh, kw)
    with np.errstate(all="ignore"):
        for i in range(kh):
            for j in range(kw):
                canvas[..., i * dh:i * dh + (h - 1) * sh + 1:sh, j * dw:j * dw + (wd - 1) * sw + 1:sw] += \
                    np.einsum("ngchw,gco->ngohw", xg, wg[..., i, j])
    out = canvas[..., pad[0]:pad[0] + size[0], pad[1]:pad[1] + size[1]].reshape(n, c_out, *size)
    return _finish(out, unbatched, d, x, w, bias, c // groups * kh * kw)


# ---- pooling ----

def pool_out(n_in, k, s, p, dl, ceil_mode):
    """PyTorch's pooling output size: with ceil_mode the count rounds up, but the last window must
    start inside the input or its left padding."""
    out = (n_in + 2 * p - dl * (k - 1) - 1 + (s - 1 if ceil_mode else 0)) // s + 1
    if ceil_mode and (out - 1) * s >= n_in + p:
        out -= 1
    return out


def _pool_geometry(args, x):
    """x as (N, C, H, W) checked for max/avg pooling, and per axis (in, out, k, stride, pad, dilation)."""
    xb, unbatched = _batched(x, 2)
    k = list(args["kernel"])
    s = list(args["stride"]) or k
    p, dl = list(args["padding"]), list(args.get("dilation", [1, 1]))
    if any(len(v) != 2 for v in (k, s, p, dl)) or min(k) < 1:
        raise Reject()
    _check_window(s, dl, p)
    if any(pi > ki // 2 for pi, ki in zip(p, k)):
        raise Reject()  # PyTorch: padding at most half the kernel
    if 0 in xb.shape[1:]:
        raise Reject()  # only the batch may be empty
    axes = [(n, pool_out(n, *v, args["ceil_mode"]), *v) for n, v in zip(xb.shape[2:], zip(k, s, p, dl))]
    if min(a[1] for a in axes) < 1:
        raise Reject()
    return xb, unbatched, axes


def _taps(n_in, n_out, k, s, p, dl):
    """Input positions of every window's taps, (out, k), clipped into range, and which are real."""
    idx = np.arange(n_out)[:, None] * s - p + np.arange(k)[None, :] * dl
    return np.clip(idx, 0, n_in - 1), (idx >= 0) & (idx < n_in)


def _windows(xb, axes):
    """(N, C, out_h, out_w, k_h, k_w) tap values and the (out_h, out_w, k_h, k_w) mask of real taps."""
    (ih, vh), (iw, vw) = [_taps(*a) for a in axes]
    g = xb.astype(np.float64)[:, :, ih[:, None, :, None], iw[None, :, None, :]]
    return g, vh[:, None, :, None] & vw[None, :, None, :]


def _misses_input(axes):
    """Whether some dilated window has all its taps in the padding."""
    return any(not _taps(*a)[1].any(axis=1).all() for a in axes)


def max_pool_empty_window(args, x):
    """Whether max_pool2d has a window without a maximum (braid refuses it; see check_torch.py)."""
    return _misses_input(_pool_geometry(args, x)[2])


def ref_max_pool2d(args, x):
    _check_float(x)
    xb, unbatched, axes = _pool_geometry(args, x)
    if _misses_input(axes):
        raise Reject()
    g, real = _windows(xb, axes)
    out = np.where(real, g, -np.inf).max(axis=(-2, -1), initial=-np.inf)  # NaN wins, as in PyTorch
    return [Out(out[0] if unbatched else out, x.dtype.name)]


def ref_avg_pool2d(args, x):
    d = _check_float(x)
    xb, unbatched, axes = _pool_geometry(args, x)
    g, real = _windows(xb, axes)
    with np.errstate(all="ignore"):
        total = np.where(real, g, 0.0).sum(axis=(-2, -1))
    # PyTorch's divisor: the window clipped to the padded input (count_include_pad), else the
    # number of input elements in it
    div = []
    for n_in, n_out, k, s, p, _ in axes:
        start = np.arange(n_out) * s - p
        end = np.minimum(start + k, n_in + p)
        div.append(end - start if args["count_include_pad"] else np.minimum(end, n_in) - np.maximum(start, 0))
    with np.errstate(all="ignore"):
        out = total / (div[0][:, None] * div[1][None, :])
    k = args["kernel"]
    return [Out(out[0] if unbatched else out, d, RTOL_ARITH[d], 2 * k[0] * k[1] * EPS[d] * max_abs(x))]


def ref_adaptive_avg_pool2d(args, x):
    xb, unbatched = _batched(x, 2)
    d = _check_float(x)
    size = list(args["output_size"])
    if len(size) != 2 or min(size) < 0 or 0 in xb.shape[2:]:
        raise Reject()
    # window i along an axis of n inputs: [floor(i n / out), ceil((i + 1) n / out))
    bounds = [[(i * n // o, -(-(i + 1) * n // o)) for i in range(o)] for n, o in zip(xb.shape[2:], size)]
    xf = xb.astype(np.float64)
    out = np.zeros(xb.shape[:2] + tuple(size))
    with np.errstate(all="ignore"):
        for i, (h0, h1) in enumerate(bounds[0]):
            for j, (w0, w1) in enumerate(bounds[1]):
                out[:, :, i, j] = xf[:, :, h0:h1, w0:w1].sum(axis=(-2, -1)) / ((h1 - h0) * (w1 - w0))
    terms = max([(h1 - h0) * (w1 - w0) for h0, h1 in bounds[0] for w0, w1 in bounds[1]], default=0)
    return [Out(out[0] if unbatched else out, d, RTOL_ARITH[d], 2 * terms * EPS[d] * max_abs(x))]
