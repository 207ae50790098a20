"""Training from Python: optimizers, the DataLoader over a Python Dataset, checkpoints and ONNX,
against NumPy, onnxruntime and the same model built from C++ layers."""

import os
import subprocess
import sys

import numpy as np
import pytest

import braid
from braid import data, nn, optim


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(6, 12)
        self.fc2 = nn.Linear(12, 4)

    def forward(self, x):
        return self.fc2(braid.relu(self.fc1(x)))


def _data(n=32, seed=0):
    rng = np.random.RandomState(seed)
    return rng.randn(n, 6).astype(np.float32), rng.randint(0, 4, n).astype(np.int64)


def test_python_module_trains_like_the_same_cpp_model():
    braid.manual_seed(1)
    py = Net()
    cpp = nn.Sequential(nn.Linear(6, 12), nn.ReLU(), nn.Linear(12, 4))
    sd = py.state_dict()
    cpp.load_state_dict({"0.weight": sd["fc1.weight"], "0.bias": sd["fc1.bias"], "2.weight": sd["fc2.weight"],
                         "2.bias": sd["fc2.bias"]})
    x, y = _data()
    opts = [optim.SGD(m.parameters(), lr=0.05, momentum=0.9, weight_decay=1e-3) for m in (py, cpp)]
    for step in range(5):
        for m, opt in zip((py, cpp), opts):
            opt.zero_grad()
            nn.functional.cross_entropy(m(braid.from_numpy(x)), braid.from_numpy(y)).backward()
            opt.step()
    got = py.state_dict()
    want = cpp.state_dict()
    for a, b in [("fc1.weight", "0.weight"), ("fc1.bias", "0.bias"), ("fc2.weight", "2.weight"), ("fc2.bias", "2.bias")]:
        np.testing.assert_allclose(got[a], want[b], rtol=0, atol=1e-6)


def test_sgd_step_matches_numpy():
    braid.manual_seed(2)
    lin = nn.Linear(3, 2)
    w0, b0 = lin.weight.detach().numpy().copy(), lin.bias.detach().numpy().copy()
    x = np.random.RandomState(3).randn(5, 3).astype(np.float32)
    t = np.random.RandomState(4).randn(5, 2).astype(np.float32)
    opt = optim.SGD(lin.parameters(), lr=0.1)
    nn.MSELoss()(lin(braid.from_numpy(x)), braid.from_numpy(t)).backward()
    opt.step()
    r = x @ w0.T + b0 - t  # d/dout of mean((out - t)^2) is 2 r / r.size
    g = 2 * r / r.size
    np.testing.assert_allclose(lin.weight.detach().numpy(), w0 - 0.1 * g.T @ x, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(lin.bias.detach().numpy(), b0 - 0.1 * g.sum(0), rtol=1e-5, atol=1e-6)


def test_adam_keywords_and_param_groups():
    net = Net()
    opt = optim.Adam([{"params": net.fc1.parameters(), "lr": 1e-4}, {"params": net.fc2.parameters()}], lr=1e-2,
                     betas=(0.8, 0.95), weight_decay=0.01)
    groups = opt.groups()
    assert [g["lr"] for g in groups] == [1e-4, 1e-2]
    assert groups[1]["beta1"] == pytest.approx(0.8) and groups[1]["beta2"] == pytest.approx(0.95)
    with pytest.raises(TypeError, match="unknown option 'learning_rate'"):
        optim.Adam(net.parameters(), learning_rate=1e-3)


class Squares(data.Dataset):
    def __len__(self):
        return 10

    def __getitem__(self, i):
        return np.array([i, i * i], np.float32), i % 3


def test_dataloader_over_a_python_dataset():
    batches = list(data.DataLoader(Squares(), batch_size=4))
    assert [b[0].shape for b in batches] == [(4, 2), (4, 2), (2, 2)]
    xs = np.concatenate([b[0].numpy() for b in batches])
    np.testing.assert_array_equal(xs, np.array([[i, i * i] for i in range(10)], np.float32))
    np.testing.assert_array_equal(np.concatenate([b[1].numpy() for b in batches]), np.arange(10) % 3)
    # Shuffled: every example once per epoch, in another order.
    loader = data.DataLoader(Squares(), batch_size=3, shuffle=True, seed=4)
    seen = np.concatenate([x.numpy()[:, 0] for x, _ in loader])
    assert sorted(seen.tolist()) == list(range(10)) and seen.tolist() != list(range(10))


class Broken(data.Dataset):
    def __len__(self):
        return 4

    def __getitem__(self, i):
        if i == 2:
            raise KeyError(f"no example {i}")
        return np.zeros(1, np.float32), 0


def test_exception_in_dataset_reaches_the_caller_unchanged():
    with pytest.raises(KeyError, match="no example 2"):
        for _ in data.DataLoader(Broken(), batch_size=1):
            pass


class NoSuperInit(data.Dataset):
    def __init__(self, n):  # no super().__init__(), as PyTorch's Dataset allows
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return np.full(2, i, np.float32), i


def test_the_loader_keeps_its_python_dataset_and_names_what_is_wrong():
    import gc
    import weakref

    ds = NoSuperInit(5)
    loader = data.DataLoader(ds, batch_size=2, prefetch=3)
    assert loader.dataset is ds and len(loader) == 3
    alive = weakref.ref(ds)
    del ds
    gc.collect()
    assert alive() is not None, "the loader let its Python dataset go"
    assert [y.tolist() for _, y in loader] == [[0, 1], [2, 3], [4]]
    del loader  # stops the prefetch thread, then lets the dataset go
    gc.collect()
    assert alive() is None, "a dataset outlived its loader"
    with pytest.raises(TypeError, match="expected a braid.data.Dataset or \\(inputs, targets\\), got int"):
        data.DataLoader(3)
    with pytest.raises(ValueError, match="must be \\(inputs, targets\\), got 3 items"):
        data.DataLoader((np.zeros(2),) * 3)
    with pytest.raises(TypeError, match="unknown option 'batch_sz'; known: batch_size, device, drop_last"):
        data.DataLoader((np.zeros(2), np.zeros(2)), batch_sz=1)
    with pytest.raises(TypeError, match="transform 0 is a str"):
        data.DataLoader((np.zeros(2), np.zeros(2)), transforms=["flip"])
    with pytest.raises(TypeError, match=r"Dataset.__getitem__ must return \(input, target\), got int"):
        list(data.DataLoader(type("Bare", (NoSuperInit,), {"__getitem__": lambda self, i: i})(2)))


def test_dataloader_over_arrays_shares_nothing_it_should_not():
    x, y = _data(12)
    loader = data.DataLoader((x, y), batch_size=5, drop_last=True)
    assert len(loader) == 2
    got = np.concatenate([b.numpy() for b, _ in loader])
    np.testing.assert_array_equal(got, x[:10])


def test_checkpoint_resume_continues_bitwise(tmp_path):
    x, y = _data()

    def step(m, opt):
        opt.zero_grad()
        nn.functional.cross_entropy(m(braid.from_numpy(x)), braid.from_numpy(y)).backward()
        opt.step()

    braid.manual_seed(9)
    a = Net()
    opt_a = optim.Adam(a.parameters(), lr=1e-2)
    for _ in range(2):
        step(a, opt_a)
    ck = braid.checkpoint.Checkpoint()
    braid.checkpoint.store(ck, "model", a)
    braid.checkpoint.store(ck, "optimizer", opt_a)
    path = str(tmp_path / "run.braid")
    braid.checkpoint.save(path, ck)
    for _ in range(2):
        step(a, opt_a)

    b = Net()
    opt_b = optim.Adam(b.parameters(), lr=1e-2)
    loaded = braid.checkpoint.load(path)
    braid.checkpoint.restore(loaded, "model", b)
    braid.checkpoint.restore(loaded, "optimizer", opt_b)
    for _ in range(2):
        step(b, opt_b)
    for name, v in a.state_dict().items():
        np.testing.assert_array_equal(b.state_dict()[name], v)
    with pytest.raises(RuntimeError, match="missing.braid"):  # the message names the file
        braid.checkpoint.load(str(tmp_path / "missing.braid"))


def test_onnx_export_runs_in_onnxruntime(tmp_path):
    ort = pytest.importorskip("onnxruntime")
    braid.manual_seed(4)
    model = nn.Sequential(nn.Conv2d(1, 4, 3, padding=1, bias=False), nn.BatchNorm2d(4), nn.ReLU(), nn.Flatten(),
                          nn.Linear(4 * 5 * 5, 3))
    model.eval()
    x = braid.randn(2, 1, 5, 5)
    path = str(tmp_path / "m.onnx")
    braid.onnx.export(model, x, path)
    sess = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    for batch in (2, 7):  # the batch axis stays symbolic
        xb = braid.randn(batch, 1, 5, 5)
        (want,) = sess.run(None, {"input": xb.numpy()})
        np.testing.assert_allclose(model(xb).detach().numpy(), want, rtol=1e-4, atol=1e-5)
    back = braid.onnx.load(path)
    np.testing.assert_allclose(back(x).detach().numpy(), model(x).detach().numpy(), rtol=1e-5, atol=1e-6)


class Attention(nn.Module):
    """A hand-written forward: exported by tracing the ops it runs."""

    def __init__(self):
        super().__init__()
        self.qkv = nn.Linear(8, 24)
        self.out = nn.Linear(8, 3)
        self.temperature = nn.Parameter(braid.ones(1) * 2.0)

    def forward(self, x):  # (N, T, 8)
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        att = braid.softmax(q @ k.transpose(1, 2) / self.temperature, -1)
        h = (att @ v).mean(dim=1)
        return self.out(braid.gelu(h)) + h[:, :3] * 0.5


def test_python_forward_exports_by_tracing(tmp_path):
    ort = pytest.importorskip("onnxruntime")
    braid.manual_seed(8)
    model = Attention()
    path = str(tmp_path / "att.onnx")
    braid.onnx.export(model, braid.randn(2, 5, 8), path)
    sess = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    x = braid.randn(4, 5, 8)  # another batch size: the batch axis stays symbolic
    (want,) = sess.run(None, {"input": x.numpy()})
    np.testing.assert_allclose(model(x).detach().numpy(), want, rtol=1e-4, atol=1e-5)
    back = braid.onnx.load(path)
    assert sorted(n for n, _ in back.named_parameters()) == sorted(n for n, _ in model.named_parameters())


def test_untraceable_forward_is_refused(tmp_path):
    class HostValue(nn.Module):
        def forward(self, x):
            return x * float(x.max())  # read on the host: tracing would bake it in

    with pytest.raises(NotImplementedError, match="does not reproduce its forward"):
        braid.onnx.export(HostValue(), braid.randn(2, 3), str(tmp_path / "bad.onnx"))
    assert not (tmp_path / "bad.onnx").exists()


def test_dataloader_applies_transforms():
    x = np.arange(2 * 1 * 2 * 2, dtype=np.float32).reshape(2, 1, 2, 2)
    y = np.array([0, 1], np.int64)
    loader = data.DataLoader((x, y), batch_size=2, transforms=[data.Normalize([1.5], [2.0])])
    (got, _), = list(loader)
    np.testing.assert_allclose(got.numpy(), (x - 1.5) / 2.0, rtol=1e-6)


def test_partitioner_stages_compose_to_the_model():
    """profile_layers + partition + stage_layers from Python: the stages, run one after another, give
    the whole model's output (they share its layers)."""
    braid.manual_seed(6)
    model = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 32), nn.Tanh(), nn.Linear(32, 4))
    x = braid.randn(5, 8)
    layers = braid.distributed.profile_layers(model, x, 2)
    assert len(layers) == 5
    plan = braid.distributed.partition(layers, 2)
    assert list(plan.first_layer)[0] == 0 and len(plan.first_layer) == 2
    stages = [braid.distributed.stage_layers(model, plan, s) for s in range(2)]
    assert sum(len(s) for s in stages) == 5
    y = stages[1](stages[0](x))
    np.testing.assert_array_equal(y.detach().numpy(), model(x).detach().numpy())


def test_checkpoint_views_keep_their_checkpoint_alive(tmp_path):
    # ck.integers and friends are views into the C++ checkpoint (writes go through), so a view of a
    # temporary, braid.checkpoint.load(path).integers, must keep the checkpoint alive.
    import gc
    import weakref

    ck = braid.checkpoint.Checkpoint()
    ck.integers["step"] = 7
    ck.tensors["w"] = braid.tensor([1.0, 2.0])
    path = str(tmp_path / "c.braid")
    braid.checkpoint.save(path, ck)
    loaded = braid.checkpoint.load(path)
    alive = weakref.ref(loaded)
    integers, tensors = loaded.integers, loaded.tensors
    del loaded
    gc.collect()
    assert alive() is not None, "the views let their checkpoint go"
    assert integers["step"] == 7 and tensors["w"].tolist() == [1.0, 2.0]
    integers["step"] = 8  # a write through the view reaches the checkpoint
    assert alive().integers["step"] == 8
    assert braid.checkpoint.load(path).integers["step"] == 7
    del integers, tensors
    gc.collect()
    assert alive() is None, "a checkpoint outlived its last view"


def test_options_are_positional_in_pytorch_order_too():
    # Note [Options as keywords]: values after the function's own arguments fill the options struct's
    # fields in declaration order, which is PyTorch's positional order (SGD's lr, momentum; the
    # DataLoader's batch_size, shuffle).
    x, y = np.arange(10, dtype=np.float32).reshape(10, 1), np.arange(10)
    assert len(data.DataLoader((x, y), 4)) == 3  # ceil(10 / 4)
    assert len(data.DataLoader((x, y), 4, False, True)) == 2  # drop_last
    assert [t.tolist() for _, t in data.DataLoader((x, y), 5, False)] == [[0, 1, 2, 3, 4], [5, 6, 7, 8, 9]]
    w = nn.Linear(1, 1)
    group = optim.SGD(w.parameters(), 0.25, 0.5).groups()[0]
    assert (group["lr"], group["momentum"], group["dampening"]) == (0.25, 0.5, 0.0)
    assert optim.Adam(w.parameters(), 0.01, (0.8, 0.7)).groups()[0]["beta2"] == 0.7
    with pytest.raises(TypeError, match="option 'batch_size' given both positionally and as a keyword"):
        data.DataLoader((x, y), 4, batch_size=2)
    with pytest.raises(TypeError, match="SGD: 7 option values given positionally, it has 6 options"):
        optim.SGD(w.parameters(), 0.1, 0.9, 0.0, 0.0, False, False, 1)
