#!/usr/bin/python3
"""Reference values for tests/test_conv.cpp, computed by PyTorch (torch.nn.functional) in float64,
independently of braid. Run with Debian's /usr/bin/python3 (PyTorch 1.13):

    /usr/bin/python3 tests/data/make_conv_reference.py

It writes conv_reference.txt (convolutions) and conv_pool_reference.txt (pooling) beside itself,
two files so that each stays small.

Each case runs one op forward on random inputs, then backward from a random output gradient, and
records the inputs, the output and every input's gradient. Format (whitespace-separated tokens):

    case OP/NAME          OP (before the '/') selects the braid op
    param KEY V1 V2 ...   op arguments as integers (booleans as 0/1)
    tensor NAME SHAPE V1 V2 ...
    end

Tensor names: inputs x, weight, bias (absent when the op has none) and grad_out; results out,
grad_x, grad_weight, grad_bias. SHAPE is sizes joined by ','. Values are written with repr, so
they round-trip exactly; the test compares with rtol 1e-10 (float64 sums in another order).
"""
import os

import torch
import torch.nn.functional as F

torch.manual_seed(20240602)
torch.set_default_dtype(torch.float64)


def fmt(t):
    t = t.detach().contiguous()
    shape = ",".join(str(s) for s in t.shape)
    return shape + " " + " ".join(repr(float(v)) for v in t.reshape(-1).tolist())


def emit(name, params, inputs, fn):
    """inputs: dict name -> tensor (x, weight, bias); fn(**inputs) -> output."""
    leaves = {k: v.clone().requires_grad_(True) for k, v in inputs.items()}
    out = fn(**leaves)
    grad_out = torch.randn(out.shape)
    out.backward(grad_out)
    lines = ["case " + name]
    for key, vals in params.items():
        vals = vals if isinstance(vals, (list, tuple)) else [vals]
        lines.append("param " + key + " " + " ".join(str(int(v)) for v in vals))
    for k, v in inputs.items():
        lines.append("tensor " + k + " " + fmt(v))
    lines.append("tensor grad_out " + fmt(grad_out))
    lines.append("tensor out " + fmt(out))
    for k, v in leaves.items():
        lines.append("tensor grad_" + k + " " + fmt(v.grad))
    lines.append("end")
    OUT.write("\n".join(lines) + "\n")


def conv2d_case(name, x_shape, w_shape, bias=True, stride=(1, 1), padding=(0, 0), dilation=(1, 1), groups=1):
    inputs = {"x": torch.randn(x_shape), "weight": torch.randn(w_shape)}
    if bias:
        inputs["bias"] = torch.randn(w_shape[0])

    def fn(x, weight, bias=None):
        if len(padding) == 4:  # {top, bottom, left, right}: F.pad takes the last axis first
            x = F.pad(x, (padding[2], padding[3], padding[0], padding[1]))
            return F.conv2d(x, weight, bias, stride, 0, dilation, groups)
        return F.conv2d(x, weight, bias, stride, padding, dilation, groups)

    emit("conv2d/" + name, {"stride": stride, "padding": padding, "dilation": dilation, "groups": groups}, inputs, fn)


def conv2d_same_case(name, x_shape, w_shape, dilation):
    # braid spells padding='same' as conv2d(padding=conv_padding_same(kernel, dilation)).
    inputs = {"x": torch.randn(x_shape), "weight": torch.randn(w_shape), "bias": torch.randn(w_shape[0])}
    emit("conv2d_same/" + name, {"dilation": dilation}, inputs,
         lambda x, weight, bias: F.conv2d(x, weight, bias, 1, "same", dilation))


def conv1d_case(name, x_shape, w_shape, bias=True, stride=1, padding=0, dilation=1, groups=1):
    inputs = {"x": torch.randn(x_shape), "weight": torch.randn(w_shape)}
    if bias:
        inputs["bias"] = torch.randn(w_shape[0])
    emit("conv1d/" + name, {"stride": stride, "padding": padding, "dilation": dilation, "groups": groups}, inputs,
         lambda x, weight, bias=None: F.conv1d(x, weight, bias, stride, padding, dilation, groups))


def conv_transpose2d_case(name, x_shape, w_shape, bias=True, stride=(1, 1), padding=(0, 0), output_padding=(0, 0),
                          groups=1, dilation=(1, 1)):
    inputs = {"x": torch.randn(x_shape), "weight": torch.randn(w_shape)}
    if bias:
        inputs["bias"] = torch.randn(w_shape[1] * groups)
    emit("conv_transpose2d/" + name,
         {"stride": stride, "padding": padding, "output_padding": output_padding, "groups": groups,
          "dilation": dilation}, inputs,
         lambda x, weight, bias=None: F.conv_transpose2d(x, weight, bias, stride, padding, output_padding, groups,
                                                         dilation))


def max_pool2d_case(name, x_shape, kernel, stride, padding=(0, 0), dilation=(1, 1), ceil_mode=False):
    emit("max_pool2d/" + name,
         {"kernel": kernel, "stride": stride, "padding": padding, "dilation": dilation, "ceil_mode": ceil_mode},
         {"x": torch.randn(x_shape)}, lambda x: F.max_pool2d(x, kernel, stride, padding, dilation, ceil_mode))


def avg_pool2d_case(name, x_shape, kernel, stride, padding=(0, 0), ceil_mode=False, count_include_pad=True):
    emit("avg_pool2d/" + name,
         {"kernel": kernel, "stride": stride, "padding": padding, "ceil_mode": ceil_mode,
          "count_include_pad": count_include_pad},
         {"x": torch.randn(x_shape)}, lambda x: F.avg_pool2d(x, kernel, stride, padding, ceil_mode, count_include_pad))


def adaptive_case(name, x_shape, size):
    emit("adaptive_avg_pool2d/" + name, {"output_size": size}, {"x": torch.randn(x_shape)},
         lambda x: F.adaptive_avg_pool2d(x, size))


HERE = os.path.dirname(os.path.abspath(__file__))
OUT = open(os.path.join(HERE, "conv_reference.txt"), "w")
OUT.write("# Written by make_conv_reference.py; do not edit.\n")
conv2d_case("basic", (2, 3, 6, 5), (4, 3, 3, 3))
conv2d_case("no_bias", (2, 3, 5, 5), (4, 3, 3, 3), bias=False)
conv2d_case("stride2_pad1", (2, 3, 7, 6), (4, 3, 3, 3), stride=(2, 2), padding=(1, 1))
conv2d_case("rect_kernel_mixed", (2, 2, 7, 8), (3, 2, 2, 3), stride=(2, 1), padding=(0, 1), dilation=(1, 2))
conv2d_case("dilation2", (1, 2, 8, 8), (3, 2, 3, 3), padding=(2, 2), dilation=(2, 2))
conv2d_case("groups2", (2, 4, 4, 5), (4, 2, 3, 3), padding=(1, 1), groups=2)
conv2d_case("depthwise", (2, 3, 6, 6), (3, 1, 3, 3), stride=(2, 2), padding=(1, 1), groups=3)
conv2d_case("depthwise_multiplier2", (2, 3, 5, 5), (6, 1, 3, 3), padding=(1, 1), groups=3)
conv2d_case("pointwise", (2, 4, 3, 4), (5, 4, 1, 1))
conv2d_case("asymmetric_padding", (2, 2, 5, 6), (3, 2, 2, 3), padding=(0, 1, 2, 1))
conv2d_case("batch1", (1, 3, 5, 5), (2, 3, 3, 3), padding=(1, 1))
conv2d_same_case("even_kernel", (2, 2, 6, 5), (3, 2, 4, 2), (1, 1))
conv2d_same_case("dilated", (1, 2, 7, 7), (2, 2, 3, 2), (2, 3))
conv1d_case("basic", (2, 3, 9), (4, 3, 3))
conv1d_case("stride_pad_dilation", (2, 3, 11), (4, 3, 3), stride=2, padding=2, dilation=2)
conv1d_case("groups_no_bias", (2, 4, 8), (6, 2, 2), bias=False, padding=1, groups=2)
conv_transpose2d_case("basic", (2, 3, 4, 4), (3, 2, 3, 3))
conv_transpose2d_case("stride2_outpad1", (2, 3, 4, 3), (3, 2, 3, 3), stride=(2, 2), padding=(1, 1),
                      output_padding=(1, 1))
conv_transpose2d_case("groups2_no_bias", (2, 4, 3, 4), (4, 2, 2, 3), bias=False, stride=(2, 1), groups=2)
conv_transpose2d_case("dilation2", (1, 2, 4, 4), (2, 3, 3, 2), padding=(1, 0), dilation=(2, 2))
conv_transpose2d_case("outpad_below_dilation", (1, 2, 3, 3), (2, 2, 2, 2), stride=(1, 1), dilation=(3, 3),
                      output_padding=(2, 1))
# Stride equal to the kernel: the tiles path (Note [Transposed convolution without overlap]). Drawn
# from a saved state of the generator, so that the cases after these keep their values.
_state = torch.get_rng_state()
conv_transpose2d_case("tiles_2x2_stride2", (2, 3, 4, 5), (3, 4, 2, 2), stride=(2, 2))
conv_transpose2d_case("tiles_3x2_no_bias", (1, 2, 3, 3), (2, 3, 3, 2), bias=False, stride=(3, 2))
torch.set_rng_state(_state)
OUT.close()
OUT = open(os.path.join(HERE, "conv_pool_reference.txt"), "w")
OUT.write("# Written by make_conv_reference.py; do not edit.\n")
max_pool2d_case("k2s2", (2, 3, 6, 6), (2, 2), (2, 2))
max_pool2d_case("k3s2p1", (2, 2, 7, 7), (3, 3), (2, 2), padding=(1, 1))
max_pool2d_case("dilation2", (1, 2, 8, 7), (2, 3), (1, 2), padding=(1, 1), dilation=(2, 2))
max_pool2d_case("ceil_mode", (2, 2, 7, 6), (3, 2), (2, 2), ceil_mode=True)
max_pool2d_case("ceil_mode_pad", (1, 2, 6, 6), (3, 3), (2, 2), padding=(1, 1), ceil_mode=True)
avg_pool2d_case("k2s2", (2, 3, 6, 6), (2, 2), (2, 2))
avg_pool2d_case("k3s2p1_include_pad", (2, 2, 7, 6), (3, 3), (2, 2), padding=(1, 1))
avg_pool2d_case("k3s2p1_exclude_pad", (2, 2, 7, 6), (3, 3), (2, 2), padding=(1, 1), count_include_pad=False)
avg_pool2d_case("ceil_include_pad", (1, 2, 6, 7), (3, 2), (2, 2), padding=(1, 1), ceil_mode=True)
avg_pool2d_case("ceil_exclude_pad", (1, 2, 6, 7), (3, 2), (2, 2), padding=(1, 1), ceil_mode=True,
                count_include_pad=False)
adaptive_case("non_divisible", (2, 2, 5, 7), (3, 4))
adaptive_case("divisible", (2, 3, 6, 6), (3, 2))
adaptive_case("global", (2, 3, 4, 5), (1, 1))
adaptive_case("upsampling", (1, 2, 3, 3), (5, 4))
OUT.close()
