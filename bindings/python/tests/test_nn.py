"""braid.nn from Python: every common layer's forward against a NumPy reference computed from the
layer's own weights, Python subclasses of nn.Module (registration, state dicts, C++ calling their
forward, exceptions, gradients against finite differences), losses, nn.functional and nn.init."""

import math

import numpy as np
import pytest

import braid
import braid.nn.functional as F
from braid import nn


def npy(t):
    return t.detach().numpy()


def close(t, expected, rtol=1e-5, atol=1e-6):
    got = npy(t)
    expected = np.asarray(expected)
    assert got.shape == expected.shape, (got.shape, expected.shape)
    np.testing.assert_allclose(got, expected, rtol=rtol, atol=atol)


def randomize(module, rng, scale=1.0):
    """Gives every floating parameter and buffer random values (through load_state_dict), so that
    the reference below reads nontrivial weights; returns the new state as float64 arrays."""
    sd = {k: v.numpy() for k, v in module.state_dict().items()}
    new = {}
    for k, v in sd.items():
        if v.dtype.kind == "f":
            new[k] = (rng.standard_normal(v.shape) * scale).astype(v.dtype)
            if "running_var" in k:
                new[k] = np.abs(new[k]) + np.asarray(0.5, v.dtype)
        else:
            new[k] = v.copy()  # a 0-d array (num_batches_tracked) stays 0-d
    module.load_state_dict(new)
    return {k: np.asarray(v, np.float64) for k, v in module.state_dict().items()}


# ---------------------------------------------------------------- NumPy references


def np_conv2d(x, w, b, stride=1, padding=0):
    xp = np.pad(x, ((0, 0), (0, 0), (padding, padding), (padding, padding)))
    kh, kw = w.shape[2:]
    win = np.lib.stride_tricks.sliding_window_view(xp, (kh, kw), axis=(2, 3))[:, :, ::stride, ::stride]
    out = np.einsum("nchwij,ocij->nohw", win, w)
    return out if b is None else out + b[None, :, None, None]


def np_pool(x, k, stride, padding=0, fn=np.max, pad_value=-np.inf):
    xp = np.pad(x, ((0, 0), (0, 0), (padding, padding), (padding, padding)), constant_values=pad_value)
    win = np.lib.stride_tricks.sliding_window_view(xp, (k, k), axis=(2, 3))[:, :, ::stride, ::stride]
    return fn(win, axis=(-1, -2))


def np_sigmoid(x):
    return 1 / (1 + np.exp(-x))


def np_log_softmax(x, axis=-1):
    m = x.max(axis, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(axis, keepdims=True))


# ---------------------------------------------------------------- layers


def test_linear_forward_from_its_weights(rng):
    braid.manual_seed(0)
    layer = nn.Linear(5, 3)
    w, b = npy(layer.weight), npy(layer.bias)
    assert w.shape == (3, 5) and b.shape == (3,)
    assert layer.weight.requires_grad and layer.bias.requires_grad
    bound = 1 / math.sqrt(5)  # PyTorch's default initialisation: U(-1/sqrt(in), 1/sqrt(in))
    assert np.abs(w).max() <= bound and np.abs(b).max() <= bound
    x = rng.standard_normal((4, 5)).astype(np.float32)
    close(layer(braid.tensor(x)), x @ w.T + b)
    x3 = rng.standard_normal((2, 4, 5)).astype(np.float32)
    close(layer(braid.tensor(x3)), x3 @ w.T + b)
    nb = nn.Linear(in_features=5, out_features=2, bias=False)
    assert nb.bias is None
    assert [n for n, _ in nb.named_parameters()] == ["weight"]
    close(nb(braid.tensor(x)), x @ npy(nb.weight).T)
    with pytest.raises(ValueError):
        layer(braid.ones(4, 6))


def test_conv2d_forward_with_padding_stride_and_no_bias(rng):
    conv = nn.Conv2d(2, 3, 3, padding=1, stride=2, bias=False)
    assert [n for n, _ in conv.named_parameters()] == ["weight"]
    w = npy(conv.weight)
    assert w.shape == (3, 2, 3, 3)
    x = rng.standard_normal((2, 2, 7, 6)).astype(np.float32)
    y = conv(braid.tensor(x))
    close(y, np_conv2d(x.astype(np.float64), w.astype(np.float64), None, stride=2, padding=1), rtol=1e-4, atol=1e-5)
    assert y.shape == (2, 3, 4, 3)
    conv_b = nn.Conv2d(in_channels=2, out_channels=4, kernel_size=3)
    st = randomize(conv_b, rng)
    close(conv_b(braid.tensor(x)), np_conv2d(x.astype(np.float64), st["weight"], st["bias"]), rtol=1e-4, atol=1e-5)
    same = nn.Conv2d(2, 3, 3, padding="same")
    assert same(braid.tensor(x)).shape == (2, 3, 7, 6)
    with pytest.raises(ValueError, match="Conv2d"):
        conv_b(braid.ones(1, 3, 5, 5))


def test_conv2d_without_bias_has_bias_none():
    assert nn.Conv2d(2, 3, 3, bias=False).bias is None


def test_pooling_layers(rng):
    x = rng.standard_normal((2, 3, 6, 7)).astype(np.float32)
    X = braid.tensor(x)
    close(nn.MaxPool2d(2)(X), np_pool(x, 2, 2), rtol=0)
    close(nn.MaxPool2d(kernel_size=3, stride=2, padding=1)(X), np_pool(x, 3, 2, 1), rtol=0)
    close(nn.AvgPool2d(2, stride=1)(X), np_pool(x, 2, 1, fn=np.mean))
    close(nn.AvgPool2d(3)(X), np_pool(x, 3, 3, fn=np.mean))
    # count_include_pad (the default): zeros of the padding count in each window's mean
    close(nn.AvgPool2d(3, stride=1, padding=1)(X), np_pool(x, 3, 1, 1, fn=np.mean, pad_value=0.0))
    close(nn.AdaptiveAvgPool2d(1)(X), x.mean((2, 3), keepdims=True))


def test_batchnorm2d_train_and_eval(rng):
    bn = nn.BatchNorm2d(3)
    st = randomize(bn, rng)
    assert sorted(st) == ["bias", "num_batches_tracked", "running_mean", "running_var", "weight"]
    assert [n for n, _ in bn.named_buffers()] == ["running_mean", "running_var", "num_batches_tracked"]
    x = (rng.standard_normal((4, 3, 5, 5)) * 2 + 1).astype(np.float32)
    xd = x.astype(np.float64)
    assert bn.training
    y = bn(braid.tensor(x))
    mean, var = xd.mean((0, 2, 3)), xd.var((0, 2, 3))
    shape = (1, 3, 1, 1)
    ref = (xd - mean.reshape(shape)) / np.sqrt(var.reshape(shape) + 1e-5) * st["weight"].reshape(shape) \
        + st["bias"].reshape(shape)
    close(y, ref, rtol=1e-4, atol=1e-5)
    n = x.size / 3
    close(bn.running_mean, 0.9 * st["running_mean"] + 0.1 * mean, rtol=1e-5)
    close(bn.running_var, 0.9 * st["running_var"] + 0.1 * var * n / (n - 1), rtol=1e-5)  # unbiased
    assert bn.num_batches_tracked.item() == 1

    bn.eval()
    assert not bn.training
    rm, rv = npy(bn.running_mean).astype(np.float64), npy(bn.running_var).astype(np.float64)
    y = bn(braid.tensor(x))
    ref = (xd - rm.reshape(shape)) / np.sqrt(rv.reshape(shape) + 1e-5) * st["weight"].reshape(shape) \
        + st["bias"].reshape(shape)
    close(y, ref, rtol=1e-4, atol=1e-5)
    np.testing.assert_array_equal(npy(bn.running_mean), rm.astype(np.float32))  # eval does not update
    assert bn.num_batches_tracked.item() == 1


def test_batchnorm_state_dict_round_trip_through_numpy():
    bn = nn.BatchNorm2d(3)
    bn(braid.randn(4, 3, 2, 2))
    sd = {k: v.numpy().copy() for k, v in bn.state_dict().items()}
    other = nn.BatchNorm2d(3)
    other.load_state_dict(sd)
    assert other.num_batches_tracked.item() == 1
    np.testing.assert_array_equal(npy(other.running_mean), sd["running_mean"])


def test_layernorm(rng):
    ln = nn.LayerNorm([4, 5])
    st = randomize(ln, rng)
    x = rng.standard_normal((3, 4, 5)).astype(np.float32)
    xd = x.astype(np.float64)
    mean, var = xd.mean((1, 2), keepdims=True), xd.var((1, 2), keepdims=True)
    close(ln(braid.tensor(x)), (xd - mean) / np.sqrt(var + 1e-5) * st["weight"] + st["bias"], rtol=1e-4, atol=1e-5)
    ln1 = nn.LayerNorm(5, eps=1e-3, elementwise_affine=False)
    assert ln1.parameters() == []
    mean, var = xd.mean(-1, keepdims=True), xd.var(-1, keepdims=True)
    close(ln1(braid.tensor(x)), (xd - mean) / np.sqrt(var + 1e-3), rtol=1e-4, atol=1e-5)


def test_embedding(rng):
    emb = nn.Embedding(10, 4)
    w = npy(emb.weight)
    idx = np.array([[1, 2, 9], [0, 9, 3]])
    close(emb(braid.tensor(idx)), w[idx], rtol=0)
    pad = nn.Embedding(6, 3, padding_idx=2)
    np.testing.assert_array_equal(npy(pad.weight)[2], np.zeros(3, np.float32))
    with pytest.raises(IndexError):
        emb(braid.tensor([10]))


def test_dropout(rng):
    braid.manual_seed(5)
    x = rng.standard_normal((50, 40)).astype(np.float32) + 5
    d = nn.Dropout(0.25)
    d.eval()
    np.testing.assert_array_equal(npy(d(braid.tensor(x))), x)  # eval: the identity
    d.train()
    y = npy(d(braid.tensor(x)))
    kept = y != 0
    np.testing.assert_allclose(y[kept], x[kept] / 0.75, rtol=1e-6)
    assert abs(1 - kept.mean() - 0.25) < 0.04  # 2000 draws: sd 0.01
    np.testing.assert_array_equal(npy(F.dropout(braid.tensor(x), 0.5, False)), x)


def test_activations(rng):
    x = rng.standard_normal((3, 7)) * 3
    X = braid.tensor(x)
    close(nn.ReLU()(X), np.maximum(x, 0), rtol=0)
    erf = np.vectorize(math.erf)
    close(nn.GELU()(X), 0.5 * x * (1 + erf(x / math.sqrt(2))), rtol=1e-10)
    tanh_gelu = 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3)))
    close(nn.GELU(approximate="tanh")(X), tanh_gelu, rtol=1e-10)
    close(nn.Sigmoid()(X), np_sigmoid(x), rtol=1e-10)
    close(nn.Tanh()(X), np.tanh(x), rtol=1e-10)
    close(nn.Softmax(dim=1)(X), np.exp(np_log_softmax(x, 1)), rtol=1e-10)
    close(nn.Softmax(0)(X), np.exp(np_log_softmax(x, 0)), rtol=1e-10)
    close(nn.LeakyReLU(0.2)(X), np.where(x > 0, x, 0.2 * x), rtol=1e-12)
    close(nn.SiLU()(X), x * np_sigmoid(x), rtol=1e-10)


def test_flatten_and_identity(rng):
    x = rng.standard_normal((2, 3, 4, 5))
    X = braid.tensor(x)
    close(nn.Flatten()(X), x.reshape(2, -1), rtol=0)
    close(nn.Flatten(0, 2)(X), x.reshape(24, 5), rtol=0)
    close(nn.Identity()(X), x, rtol=0)


def test_lstm_shapes_and_one_layer_reference(rng):
    lstm = nn.LSTM(3, 5, num_layers=2, batch_first=True)
    assert [n for n, _ in lstm.named_parameters()] == [
        "weight_ih_l0", "weight_hh_l0", "bias_ih_l0", "bias_hh_l0",
        "weight_ih_l1", "weight_hh_l1", "bias_ih_l1", "bias_hh_l1"]
    assert lstm.weight_ih_l0.shape == (20, 3) and lstm.weight_hh_l1.shape == (20, 5)
    out, h, c = lstm.forward_all(braid.randn(2, 7, 3))
    assert out.shape == (2, 7, 5) and h.shape == (2, 2, 5) and c.shape == (2, 2, 5)
    assert lstm(braid.randn(2, 7, 3)).shape == (2, 7, 5)

    one = nn.LSTM(3, 4)  # (L, N, H_in)
    st = randomize(one, rng, scale=0.5)
    x = rng.standard_normal((6, 2, 3)).astype(np.float32)
    hh = np.zeros((2, 4))
    cc = np.zeros((2, 4))
    outs = []
    for t in range(6):  # PyTorch's gate order: input, forget, cell, output
        g = x[t] @ st["weight_ih_l0"].T + st["bias_ih_l0"] + hh @ st["weight_hh_l0"].T + st["bias_hh_l0"]
        i, f, gg, o = np.split(g, 4, axis=1)
        cc = np_sigmoid(f) * cc + np_sigmoid(i) * np.tanh(gg)
        hh = np_sigmoid(o) * np.tanh(cc)
        outs.append(hh)
    out, h, c = one.forward_all(braid.tensor(x))
    close(out, np.stack(outs), rtol=1e-4, atol=1e-5)
    close(h, hh[None], rtol=1e-4, atol=1e-5)
    close(c, cc[None], rtol=1e-4, atol=1e-5)


def test_layer_repr_describes_the_layer():
    assert repr(nn.Linear(2, 3)) == "Linear(in_features=2, out_features=3, bias=True)"


# ---------------------------------------------------------------- Python modules


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(4, 5)
        self.fc2 = nn.Linear(5, 2)
        self.scale = nn.Parameter(braid.ones(2))
        self.note = "not registered"

    def forward(self, x):
        return self.fc2(braid.tanh(self.fc1(x))) * self.scale


def np_net(sd, x):
    h = np.tanh(x @ sd["fc1.weight"].T + sd["fc1.bias"])
    return (h @ sd["fc2.weight"].T + sd["fc2.bias"]) * sd["scale"]


def test_python_module_registers_children_and_parameters():
    net = Net()
    assert [n for n, _ in net.named_parameters()] == ["scale", "fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"]
    assert len(net.parameters()) == 5
    assert net.num_parameters() == 4 * 5 + 5 + 5 * 2 + 2 + 2
    assert [n for n, _ in net.named_children()] == ["fc1", "fc2"]
    assert sorted(net.state_dict()) == ["fc1.bias", "fc1.weight", "fc2.bias", "fc2.weight", "scale"]
    assert net.note == "not registered"
    assert isinstance(net.scale, nn.Parameter) and net.scale.requires_grad
    assert "fc1" in repr(net) and "Linear" in repr(net)

    class Outer(nn.Module):
        def __init__(self):
            super().__init__()
            self.body = Net()
            self.heads = nn.ModuleList([nn.Linear(2, 1), nn.Linear(2, 1, bias=False)])

        def forward(self, x):
            return self.heads[0](self.body(x))

    outer = Outer()
    assert [n for n, _ in outer.named_parameters()] == [
        "body.scale", "body.fc1.weight", "body.fc1.bias", "body.fc2.weight", "body.fc2.bias",
        "heads.0.weight", "heads.0.bias", "heads.1.weight"]
    descendants = [n for n, _ in outer.named_modules() if n]  # ("", outer) itself is checked below
    assert descendants == ["body", "body.fc1", "body.fc2", "heads", "heads.0", "heads.1"]


def test_children_and_modules_are_the_layers_themselves():
    net = Net()
    seq = nn.Sequential(net, nn.Linear(2, 2), nn.ReLU())
    kids = seq.children()
    assert kids[0] is net
    assert isinstance(kids[1], nn.Linear) and isinstance(kids[2], nn.ReLU)
    assert sum(isinstance(m, nn.Linear) for m in seq.modules()) == 3  # net.fc1, net.fc2, seq[1]


def test_named_modules_starts_with_the_module_itself():
    net = Net()
    names = [n for n, _ in net.named_modules()]
    assert names == ["", "fc1", "fc2"]


def test_python_module_attribute_rules():
    class Early(nn.Module):
        def __init__(self):
            self.fc = nn.Linear(2, 2)  # before super().__init__()
            super().__init__()

        def forward(self, x):
            return x

    with pytest.raises(AttributeError):
        Early()
    with pytest.raises(TypeError):
        nn.Module()  # abstract
    net = Net()
    net.scale = nn.Parameter(braid.full((2,), 3.0))  # re-assignment copies into the registered tensor
    assert len(net.parameters()) == 5
    np.testing.assert_array_equal(npy(dict(net.named_parameters())["scale"]), [3.0, 3.0])
    with pytest.raises(TypeError):
        net.fc1 = 5  # a registered child cannot become a number
    net.fc2 = nn.Linear(5, 3)  # re-assigning a child replaces it
    assert net.fc2.weight.shape == (3, 5)
    assert dict(net.named_parameters())["fc2.weight"].shape == (3, 5)


def test_reassigned_parameter_attribute_is_the_registered_tensor():
    net = Net()
    net.scale = nn.Parameter(braid.full((2,), 3.0))
    registered = dict(net.named_parameters())["scale"]
    assert net.scale.data_ptr() == registered.data_ptr()
    with braid.no_grad():
        registered.fill_(5.0)  # what an optimizer step does
    np.testing.assert_array_equal(npy(net.scale), [5.0, 5.0])


def test_state_dict_round_trip_with_numpy(rng):
    braid.manual_seed(3)
    net = Net()
    x = rng.standard_normal((3, 4)).astype(np.float32)
    # braid tensors, as PyTorch's state_dict() gives torch tensors: detached, sharing the module's memory
    assert all(isinstance(v, braid.Tensor) and v.dtype == braid.float32 and not v.requires_grad
               for v in net.state_dict().values())
    sd = {k: v.numpy() for k, v in net.state_dict().items()}
    sd64 = {k: v.astype(np.float64) for k, v in sd.items()}
    close(net(braid.tensor(x)), np_net(sd64, x), rtol=1e-5)

    new = {k: (rng.standard_normal(v.shape)).astype(np.float32) for k, v in sd.items()}
    net.load_state_dict(new)
    for k, v in net.state_dict().items():
        np.testing.assert_array_equal(v, new[k])
    close(net(braid.tensor(x)), np_net({k: v.astype(np.float64) for k, v in new.items()}, x), rtol=1e-5)

    other = Net()
    other.load_state_dict(net.state_dict())
    close(other(braid.tensor(x)), npy(net(braid.tensor(x))), rtol=0)


def test_state_dict_tensors_share_parameter_memory():
    net = Net()
    sd = net.state_dict()
    sd["fc1.bias"][0] = 7.0
    assert net.fc1.bias[0].item() == 7.0


def test_load_state_dict_errors_name_the_entry(rng):
    net = Net()
    before = {k: v.numpy().copy() for k, v in net.state_dict().items()}
    full = {k: np.full(v.shape, 0.5, np.float32) for k, v in before.items()}
    missing = {k: v for k, v in full.items() if k != "fc2.bias"}
    with pytest.raises(ValueError, match="fc2.bias"):
        net.load_state_dict(missing)
    with pytest.raises(ValueError, match="unexpected_key"):
        net.load_state_dict(dict(full, unexpected_key=np.zeros(2, np.float32)))
    with pytest.raises(ValueError, match="fc2.bias"):
        net.load_state_dict(dict(full, **{"fc2.bias": np.zeros(3, np.float32)}))
    for k, v in net.state_dict().items():  # nothing was written by the failed loads
        np.testing.assert_array_equal(v, before[k])
    net.load_state_dict(missing, strict=False)
    sd = net.state_dict()
    np.testing.assert_array_equal(sd["fc1.weight"], full["fc1.weight"])
    np.testing.assert_array_equal(sd["fc2.bias"], before["fc2.bias"])


def test_sequential_calls_the_python_forward_from_cpp(rng):
    net = Net()
    randomize(net, rng)
    seq = nn.Sequential(net, nn.ReLU())
    assert len(seq) == 2 and seq[0] is net and isinstance(seq[1], nn.ReLU)
    assert [n for n, _ in seq.named_parameters()][:2] == ["0.scale", "0.fc1.weight"]
    x = braid.tensor(rng.standard_normal((6, 4)).astype(np.float32))
    expected = np.maximum(npy(net(x)), 0)
    np.testing.assert_array_equal(npy(seq(x)), expected)
    assert (expected > 0).any() and (expected == 0).any()
    del net  # Sequential keeps the Python module alive
    np.testing.assert_array_equal(npy(seq(x)), expected)


def test_exception_in_python_forward_crosses_cpp_unchanged():
    class Boom(Exception):
        pass

    class Bad(nn.Module):
        def __init__(self):
            super().__init__()

        def forward(self, x):
            raise Boom("raised in forward")

    seq = nn.Sequential(nn.ReLU(), Bad(), nn.ReLU())
    with pytest.raises(Boom, match="raised in forward"):
        seq(braid.ones(2))
    with pytest.raises(KeyError):
        class K(Bad):
            def forward(self, x):
                return {}["missing"]

        nn.Sequential(K())(braid.ones(2))
    np.testing.assert_array_equal(npy(nn.Sequential(nn.ReLU())(braid.tensor([-1.0, 2.0]))), [0.0, 2.0])


def test_python_module_gradients_vs_finite_differences(rng):
    net = Net()
    randomize(net, rng)
    net.to(braid.float64)
    assert all(p.dtype == braid.float64 for p in net.parameters())
    assert net.scale.dtype == braid.float64 and net.fc1.weight.dtype == braid.float64
    x = rng.standard_normal((3, 4))
    loss = (net(braid.tensor(x)) ** 2).sum()
    sd = {k: v.numpy().copy() for k, v in net.state_dict().items()}
    np.testing.assert_allclose(loss.item(), (np_net(sd, x) ** 2).sum(), rtol=1e-12)
    loss.backward()
    grads = {n: npy(p.grad) for n, p in net.named_parameters()}
    eps = 1e-6
    for name, value in sd.items():
        num = np.zeros_like(value)
        for i in np.ndindex(value.shape):
            plus, minus = dict(sd), dict(sd)
            plus[name], minus[name] = value.copy(), value.copy()
            plus[name][i] += eps
            minus[name][i] -= eps
            num[i] = ((np_net(plus, x) ** 2).sum() - (np_net(minus, x) ** 2).sum()) / (2 * eps)
        np.testing.assert_allclose(grads[name], num, rtol=1e-6, atol=1e-8, err_msg=name)
    net.zero_grad()
    assert all(p.grad is None or not npy(p.grad).any() for p in net.parameters())


def test_train_eval_modes_propagate():
    seq = nn.Sequential(Net(), nn.Dropout(0.5), nn.BatchNorm1d(2))
    assert seq.training and all(m.training for m in seq)
    seq.eval()
    assert not seq.training and not any(m.training for m in seq)
    assert seq.train() is seq and seq[1].training


# ---------------------------------------------------------------- losses


@pytest.fixture
def logits_targets(rng):
    return rng.standard_normal((6, 5)), np.array([0, 3, 4, 1, 3, 2])


def test_cross_entropy_loss(logits_targets):
    x, t = logits_targets
    X, T = braid.tensor(x), braid.tensor(t)
    lp = np_log_softmax(x)
    nll = -lp[np.arange(6), t]
    close(nn.CrossEntropyLoss()(X, T), nll.mean(), rtol=1e-12)
    close(nn.CrossEntropyLoss(reduction="sum")(X, T), nll.sum(), rtol=1e-12)
    close(nn.CrossEntropyLoss(reduction="none")(X, T), nll, rtol=1e-12)
    w = np.arange(1.0, 6.0)
    close(nn.CrossEntropyLoss(weight=braid.tensor(w))(X, T), (w[t] * nll).sum() / w[t].sum(), rtol=1e-12)
    keep = t != 3
    close(nn.CrossEntropyLoss(ignore_index=3)(X, T), nll[keep].mean(), rtol=1e-12)
    eps = 0.1
    smooth = (1 - eps) * nll + eps * (-lp).mean(1)
    close(nn.CrossEntropyLoss(label_smoothing=eps)(X, T), smooth.mean(), rtol=1e-12)
    p = np.exp(np_log_softmax(np.random.default_rng(1).standard_normal((6, 5))))
    close(nn.CrossEntropyLoss()(X, braid.tensor(p)), -(p * lp).sum(1).mean(), rtol=1e-12)  # probabilities
    close(F.cross_entropy(X, T, reduction="sum"), nll.sum(), rtol=1e-12)
    with pytest.raises(ValueError):
        nn.CrossEntropyLoss()(X, braid.tensor(t[:4]))


def test_nll_mse_l1_losses(logits_targets, rng):
    x, t = logits_targets
    lp = np_log_softmax(x)
    close(nn.NLLLoss()(braid.tensor(lp), braid.tensor(t)), -lp[np.arange(6), t].mean(), rtol=1e-12)
    close(nn.NLLLoss(reduction="sum")(braid.tensor(lp), braid.tensor(t)), -lp[np.arange(6), t].sum(), rtol=1e-12)
    y = rng.standard_normal(x.shape)
    X, Y = braid.tensor(x), braid.tensor(y)
    close(nn.MSELoss()(X, Y), ((x - y) ** 2).mean(), rtol=1e-12)
    close(nn.MSELoss(reduction="sum")(X, Y), ((x - y) ** 2).sum(), rtol=1e-12)
    close(nn.MSELoss(reduction="none")(X, Y), (x - y) ** 2, rtol=1e-12)
    close(nn.L1Loss()(X, Y), np.abs(x - y).mean(), rtol=1e-12)
    close(nn.L1Loss(reduction="sum")(X, Y), np.abs(x - y).sum(), rtol=1e-12)
    close(F.mse_loss(X, Y), ((x - y) ** 2).mean(), rtol=1e-12)
    d = x - y
    close(nn.SmoothL1Loss(beta=0.5)(X, Y), np.where(np.abs(d) < 0.5, 0.5 * d ** 2 / 0.5, np.abs(d) - 0.25).mean(),
          rtol=1e-12)
    with pytest.raises(ValueError, match="mse"):
        nn.MSELoss()(X, Y[:3])


def test_bce_with_logits_loss(rng):
    x = rng.standard_normal((4, 3)) * 4
    t = (rng.uniform(size=(4, 3)) > 0.5).astype(np.float64)
    X, T = braid.tensor(x), braid.tensor(t)
    ls, lns = -np.log1p(np.exp(-x)), -np.log1p(np.exp(x))  # log sigmoid(x), log (1 - sigmoid(x))
    per = -(t * ls + (1 - t) * lns)
    close(nn.BCEWithLogitsLoss()(X, T), per.mean(), rtol=1e-12)
    close(nn.BCEWithLogitsLoss(reduction="none")(X, T), per, rtol=1e-12)
    pw = np.array([1.0, 2.0, 0.5])
    close(nn.BCEWithLogitsLoss(pos_weight=braid.tensor(pw))(X, T), (-(pw * t * ls + (1 - t) * lns)).mean(),
          rtol=1e-12)
    w = rng.uniform(size=(4, 3))
    close(nn.BCEWithLogitsLoss(weight=braid.tensor(w), reduction="sum")(X, T), (w * per).sum(), rtol=1e-12)
    big = braid.tensor([100.0, -100.0])  # stable for large |x|
    close(nn.BCEWithLogitsLoss(reduction="none")(big, braid.tensor([0.0, 1.0])), [100.0, 100.0], rtol=1e-12)


def test_loss_gradient_vs_closed_form(logits_targets):
    x, t = logits_targets
    X = braid.tensor(x, requires_grad=True)
    nn.CrossEntropyLoss()(X, braid.tensor(t)).backward()
    onehot = np.eye(5)[t]
    close(X.grad, (np.exp(np_log_softmax(x)) - onehot) / 6, rtol=1e-10)


# ---------------------------------------------------------------- nn.functional


def test_functional_ops(rng):
    x = rng.standard_normal((4, 5))
    w = rng.standard_normal((3, 5))
    b = rng.standard_normal(3)
    X = braid.tensor(x)
    close(F.linear(X, braid.tensor(w), braid.tensor(b)), x @ w.T + b, rtol=1e-12)
    close(F.linear(X, braid.tensor(w)), x @ w.T, rtol=1e-12)
    close(F.relu(X), np.maximum(x, 0), rtol=0)
    close(F.softmax(X, 1), np.exp(np_log_softmax(x, 1)), rtol=1e-12)
    close(F.log_softmax(X, 0), np_log_softmax(x, 0), rtol=1e-12)
    close(F.sigmoid(X), np_sigmoid(x), rtol=1e-12)
    close(F.gelu(X, approximate="tanh"),
          0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3))), rtol=1e-12)
    np.testing.assert_array_equal(npy(F.one_hot(braid.tensor([0, 3, 1]), 4)), np.eye(4, dtype=np.int64)[[0, 3, 1]])
    close(F.pad(X, [1, 2]), np.pad(x, ((0, 0), (1, 2))), rtol=0)
    img = rng.standard_normal((1, 2, 6, 6))
    k = rng.standard_normal((3, 2, 3, 3))
    close(F.conv2d(braid.tensor(img), braid.tensor(k), None, [2, 2], [1, 1]), np_conv2d(img, k, None, 2, 1),
          rtol=1e-10)
    close(F.max_pool2d(braid.tensor(img), [2, 2]), np_pool(img, 2, 2), rtol=0)
    close(F.avg_pool2d(braid.tensor(img), [3, 3], [1, 1]), np_pool(img, 3, 1, fn=np.mean), rtol=1e-12)


def test_functional_softmax_takes_dim_keyword():
    x = np.array([[1.0, 2.0, 3.0]])
    close(F.softmax(braid.tensor(x), dim=1), np.exp(np_log_softmax(x, 1)), rtol=1e-12)


def test_functional_conv2d_and_pool_take_ints():
    img = np.arange(36.0).reshape(1, 1, 6, 6)
    k = np.ones((1, 1, 3, 3))
    close(F.conv2d(braid.tensor(img), braid.tensor(k), stride=1, padding=1), np_conv2d(img, k, None, 1, 1))
    close(F.max_pool2d(braid.tensor(img), 2), np_pool(img, 2, 2))


# ---------------------------------------------------------------- nn.init


def test_init_kaiming_and_xavier_bounds():
    braid.manual_seed(6)
    w = braid.empty(60, 40)  # fan_in 40, fan_out 60
    for kwargs, bound in [({}, math.sqrt(2) * math.sqrt(3 / 40)),  # leaky_relu, a=0: gain sqrt(2)
                          ({"a": math.sqrt(5)}, math.sqrt(2 / 6) * math.sqrt(3 / 40)),
                          ({"mode": "fan_out", "nonlinearity": "relu"}, math.sqrt(2) * math.sqrt(3 / 60))]:
        r = nn.init.kaiming_uniform_(w, **kwargs)
        v = npy(w)
        assert r.data_ptr() == w.data_ptr()  # in place, and returned
        assert np.abs(v).max() <= bound * (1 + 1e-6)
        assert np.abs(v).max() > 0.95 * bound  # 2400 draws reach the edges
        assert abs(v.mean()) < 0.05 * bound and abs(v.var() - bound ** 2 / 3) < 0.1 * bound ** 2 / 3
    nn.init.xavier_uniform_(w, gain=2.0)
    bound = 2.0 * math.sqrt(6 / 100)
    assert bound * 0.95 < np.abs(npy(w)).max() <= bound * (1 + 1e-6)
    nn.init.kaiming_normal_(w, nonlinearity="relu")
    assert abs(npy(w).std() - math.sqrt(2 / 40)) < 0.05 * math.sqrt(2 / 40)


def test_init_gain_fans_and_constants():
    assert nn.init.calculate_gain("relu") == pytest.approx(math.sqrt(2))
    assert nn.init.calculate_gain("tanh") == pytest.approx(5 / 3)
    assert nn.init.calculate_gain("leaky_relu", 0.2) == pytest.approx(math.sqrt(2 / (1 + 0.2 ** 2)))
    assert nn.init.calculate_gain("sigmoid") == 1.0
    assert tuple(nn.init.calculate_fan_in_and_fan_out(braid.empty(4, 3, 5, 5))) == (75, 100)
    w = braid.empty(3, 4)
    nn.init.constant_(w, 0.25)
    np.testing.assert_array_equal(npy(w), np.full((3, 4), 0.25, np.float32))
    layer = nn.Linear(3, 2)
    nn.init.zeros_(layer.weight)  # a parameter that requires grad: filled outside the graph
    assert layer.weight.requires_grad
    np.testing.assert_array_equal(npy(layer(braid.ones(1, 3))), npy(layer.bias)[None])


# ---------------------------------------------------------------- help text


def test_docstrings_come_from_the_headers():
    assert "depthwise convolution" in nn.Conv2d.__doc__  # layers.h's /// comment on Conv2d
    assert "x W^T + b" in nn.Linear.__doc__
    assert "gain * sqrt(3 / fan)" in nn.init.kaiming_uniform_.__doc__
    assert "numpy.matmul" in braid.matmul.__doc__
    assert "ignore_index" in F.cross_entropy.__doc__


def test_constructors_document_their_parameters_and_defaults():
    # help(nn.Conv2d) shows what to pass, with the header's names and defaults (SWIG's autodoc)
    doc = nn.Conv2d.__init__.__doc__
    for part in ("in_channels", "out_channels", "kernel_size", "stride=1", "padding=0", "groups=1", "bias=True"):
        assert part in doc, (part, doc)
    assert "momentum=0.1" in nn.BatchNorm2d.__init__.__doc__ and "eps=1e-5" in nn.BatchNorm2d.__init__.__doc__
    assert "num_heads" in nn.MultiheadAttention.__init__.__doc__


def test_forward_mistakes_are_named():
    class NoForward(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(2, 2)

    class ReturnsInt(nn.Module):
        def forward(self, x):
            return 3

    m = NoForward()
    with pytest.raises(NotImplementedError, match="NoForward does not define forward"):
        m(braid.ones(1, 2))
    with pytest.raises(NotImplementedError, match="NoForward does not define forward"):
        nn.Sequential(m)(braid.ones(1, 2))  # called from C++
    with pytest.raises(TypeError, match="ReturnsInt.forward returned int"):
        nn.Sequential(ReturnsInt())(braid.ones(1))
