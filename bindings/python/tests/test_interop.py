"""Memory shared with NumPy (array interface) and with other libraries (DLPack) without copies, and
PyTorch interop in Debian's interpreter (torch 1.13, NumPy 1.24). Sharing is checked by writing
through one side and reading through the other."""

import gc
import os
import pickle
import shutil
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import braid

DTYPES = [
    (np.float32, braid.float32),
    (np.float64, braid.float64),
    (np.int64, braid.int64),
    (np.int32, braid.int32),
    (np.bool_, braid.bool),
]


def sample(npdtype, shape=(3, 4)):
    a = np.arange(int(np.prod(shape))).reshape(shape)
    return (a % 2 == 1) if npdtype is np.bool_ else a.astype(npdtype)


# ---------------------------------------------------------------- from_numpy


def test_from_numpy_shares_memory_both_ways():
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    t = braid.from_numpy(a)
    assert t.shape == (3, 4) and t.dtype == braid.float32
    assert t.data_ptr() == a.__array_interface__["data"][0]
    a[0, 0] = 100.0
    assert t[0, 0].item() == 100.0
    t[1, 1] = -5.0
    assert a[1, 1] == -5.0
    t += 1  # an in-place op through braid's kernels
    np.testing.assert_array_equal(a[2], [9, 10, 11, 12])


def test_from_numpy_keeps_the_array_alive():
    a = np.arange(1000, dtype=np.float64)
    expected = a.copy()
    refs = sys.getrefcount(a)
    t = braid.from_numpy(a)
    assert sys.getrefcount(a) == refs + 1  # the tensor's storage holds a reference
    del a
    gc.collect()
    _ = [np.full(1000, -1.0) for _ in range(10)]  # reuse freed memory, if it were freed
    np.testing.assert_array_equal(t.numpy(), expected)
    np.testing.assert_array_equal((t * 2).numpy(), expected * 2)


def test_from_numpy_releases_the_array_with_the_tensor():
    a = np.zeros(4)
    refs = sys.getrefcount(a)
    t = braid.from_numpy(a)
    v = t[1:]  # a view shares the storage, and so the reference
    del t
    gc.collect()
    assert sys.getrefcount(a) == refs + 1
    del v
    gc.collect()
    assert sys.getrefcount(a) == refs


@pytest.mark.parametrize("index", [(slice(None), slice(None, None, 2)), (slice(1, None), slice(1, 3)), "T",
                                   (slice(None, None, 2), 1)], ids=str)
def test_from_numpy_strided_arrays_are_viewed(index):
    base = np.arange(48, dtype=np.float64).reshape(6, 8)
    a = base.T if index == "T" else base[index]
    assert not a.flags.c_contiguous or a.ndim == 1
    t = braid.from_numpy(a)
    assert t.shape == a.shape
    assert t.stride() == tuple(s // a.itemsize for s in a.strides)
    np.testing.assert_array_equal(t.numpy(), a)
    np.testing.assert_array_equal((t + 0).numpy(), a)  # a kernel reading the strides
    t.fill_(-3.0)
    assert (a == -3.0).all()
    assert (base == -3.0).sum() == a.size  # nothing outside the view was touched


def test_from_numpy_refuses_negative_strides_and_other_types():
    a = np.arange(6.0)
    with pytest.raises(ValueError, match="negative stride"):
        braid.from_numpy(a[::-1])
    with pytest.raises(ValueError):
        braid.from_numpy(np.arange(12.0).reshape(3, 4)[:, ::-2])
    with pytest.raises(TypeError):
        braid.from_numpy(np.zeros(3, np.uint8))
    with pytest.raises(TypeError):
        braid.from_numpy([1.0, 2.0])
    np.testing.assert_array_equal(braid.from_numpy(a[::-1].copy()).numpy(), a[::-1])


@pytest.mark.parametrize("npdtype, dtype", DTYPES + [(np.float16, braid.float16)], ids=lambda x: str(x))
def test_from_numpy_dtypes(npdtype, dtype):
    a = sample(npdtype)
    t = braid.from_numpy(a)
    assert t.dtype == dtype
    back = t.numpy()
    assert back.dtype == a.dtype
    np.testing.assert_array_equal(back, a)
    assert np.shares_memory(back, a)


def test_zero_d_and_empty_arrays():
    assert braid.from_numpy(np.array(2.5)).item() == 2.5
    assert braid.from_numpy(np.array(2.5)).shape == ()
    e = braid.from_numpy(np.zeros((0, 3), np.float32))
    assert e.shape == (0, 3) and e.numpy().shape == (0, 3)


def test_as_tensor_shares_and_tensor_copies():
    a = np.arange(4.0)
    s = braid.as_tensor(a)
    c = braid.tensor(a)
    a[0] = 9.0
    assert s[0].item() == 9.0
    assert c[0].item() == 0.0
    assert braid.as_tensor(a[::-1]).tolist() == [3.0, 2.0, 1.0, 9.0]  # negative strides: a copy


# ---------------------------------------------------------------- numpy() and the array interface


def test_numpy_shares_memory_and_outlives_the_tensor():
    t = braid.tensor(np.arange(6.0).reshape(2, 3))
    n = t.numpy()
    assert n.__array_interface__["data"][0] == t.data_ptr()
    n[0, 0] = 42.0
    assert t[0, 0].item() == 42.0
    t[1, 2] = -1.0
    assert n[1, 2] == -1.0
    del t
    gc.collect()
    np.testing.assert_array_equal(n, [[42.0, 1.0, 2.0], [3.0, 4.0, -1.0]])


def test_array_interface_of_views():
    a = np.arange(24, dtype=np.float32).reshape(4, 6)
    t = braid.from_numpy(a)
    for view, ref in [(t.T, a.T), (t[1:, ::2], a[1:, ::2]), (t[:, 2], a[:, 2]), (t[None, 0], a[None, 0])]:
        n = np.asarray(view)
        np.testing.assert_array_equal(n, ref)
        assert [s for s, k in zip(n.strides, n.shape) if k > 1] == [s for s, k in zip(ref.strides, ref.shape) if k > 1]
        assert np.shares_memory(n, a)
    e = t[:, :1].expand(4, 3)
    np.testing.assert_array_equal(np.asarray(e), np.broadcast_to(a[:, :1], (4, 3)))
    assert np.asarray(e).strides[1] == 0


def test_numpy_of_a_tensor_that_requires_grad_raises():
    t = braid.ones(3, requires_grad=True)
    with pytest.raises(RuntimeError):
        t.numpy()
    with pytest.raises(RuntimeError):
        np.asarray(t)  # as torch: the array interface refuses too
    np.testing.assert_array_equal(t.detach().numpy(), np.ones(3, np.float32))
    f = t.numpy(force=True)
    np.testing.assert_array_equal(f, np.ones(3, np.float32))


def test_numpy_ufuncs_read_tensors():
    x = np.linspace(-2, 2, 9)
    t = braid.tensor(x)
    np.testing.assert_array_equal(np.exp(t), np.exp(x))
    np.testing.assert_array_equal(np.maximum(t, 0.5), np.maximum(x, 0.5))


def test_pickle_round_trip():
    t = braid.tensor(np.arange(6.0).reshape(2, 3)).T
    u = pickle.loads(pickle.dumps(t))
    assert u.dtype == braid.float64
    np.testing.assert_array_equal(u.numpy(), np.arange(6.0).reshape(2, 3).T)
    g = pickle.loads(pickle.dumps(braid.ones(2, requires_grad=True)))
    assert g.requires_grad


# ---------------------------------------------------------------- DLPack with NumPy


def test_numpy_from_dlpack_shares_memory():
    t = braid.tensor(np.arange(6.0, dtype=np.float32).reshape(2, 3))
    n = np.from_dlpack(t)
    assert n.dtype == np.float32 and n.shape == (2, 3)
    assert n.__array_interface__["data"][0] == t.data_ptr()
    t[0, 1] = 9.0
    assert n[0, 1] == 9.0
    del t
    gc.collect()
    np.testing.assert_array_equal(n, [[0, 9, 2], [3, 4, 5]])  # the capsule keeps the memory alive


def test_numpy_from_dlpack_of_a_strided_view():
    a = np.arange(12.0).reshape(3, 4)
    t = braid.from_numpy(a)
    for view, ref in [(t.T, a.T), (t[:, 1::2], a[:, 1::2]), (t[1:], a[1:])]:
        n = np.from_dlpack(view)
        np.testing.assert_array_equal(n, ref)
        assert n.strides == ref.strides and np.shares_memory(n, a)


def test_braid_from_dlpack_of_numpy_shares_memory():
    a = np.zeros((2, 3), np.float32)
    t = braid.from_dlpack(a)
    assert t.data_ptr() == a.__array_interface__["data"][0]
    a[1, 2] = 3.0
    assert t[1, 2].item() == 3.0
    t[0, 0] = -1.0
    assert a[0, 0] == -1.0
    del a
    gc.collect()
    np.testing.assert_array_equal(t.numpy(), [[-1, 0, 0], [0, 0, 3]])
    s = np.arange(20.0).reshape(4, 5)[1:, ::2]
    np.testing.assert_array_equal(braid.from_dlpack(s).numpy(), s)


@pytest.mark.parametrize("npdtype, dtype", DTYPES, ids=[d.__name__ for d, _ in DTYPES])
def test_dlpack_round_trip_dtypes(npdtype, dtype):
    a = sample(npdtype)
    t = braid.from_dlpack(a)
    assert t.dtype == dtype
    np.testing.assert_array_equal(t.numpy(), a)
    back = np.from_dlpack(t)
    assert back.dtype == a.dtype
    np.testing.assert_array_equal(back, a)
    assert np.shares_memory(back, a)


def test_dlpack_capsules_and_device():
    t = braid.tensor([1.0, 2.0])
    assert t.__dlpack_device__() == (1, 0)  # kDLCPU, device 0
    cap = t.__dlpack__()
    u = braid.from_dlpack(cap)
    u[0] = 5.0
    assert t[0].item() == 5.0
    with pytest.raises(TypeError):
        braid.from_dlpack(cap)  # a capsule is consumed once
    c = braid.from_dlpack(t.__dlpack__(copy=True))
    c[1] = 0.0
    assert t[1].item() == 2.0


# ---------------------------------------------------------------- PyTorch (Debian's python3)

SYSTEM_PYTHON = "/usr/bin/python3"

TORCH_SCRIPT = textwrap.dedent(r"""
    import gc
    import sys
    try:
        import numpy as np
        import torch
        from torch.utils import dlpack as tdl
    except Exception as e:  # not braid's business: the test skips
        print("SKIP:", type(e).__name__, e)
        sys.exit(0)
    import braid

    assert np.__version__.startswith("1."), np.__version__

    # braid -> torch (torch 1.13 calls __dlpack_device__ and then __dlpack__)
    t = braid.tensor(np.arange(6.0, dtype=np.float32).reshape(2, 3))
    x = tdl.from_dlpack(t)
    assert x.dtype == torch.float32 and tuple(x.shape) == (2, 3)
    assert x.data_ptr() == t.data_ptr()
    np.testing.assert_array_equal(x.numpy(), np.arange(6.0).reshape(2, 3))
    x[0, 0] = 42.0
    assert t[0, 0].item() == 42.0
    t[1, 2] = -7.0
    assert x[1, 2].item() == -7.0
    del t
    gc.collect()
    assert x[1, 2].item() == -7.0

    # torch -> braid, including a strided view
    y = torch.arange(12, dtype=torch.float64).reshape(3, 4)
    b = braid.from_dlpack(y)
    assert b.dtype == braid.float64 and b.data_ptr() == y.data_ptr()
    y[1, 1] = 100.0
    assert b[1, 1].item() == 100.0
    b[2, 3] = -1.0
    assert y[2, 3].item() == -1.0
    s = braid.from_dlpack(y.t()[:, 1:])
    np.testing.assert_array_equal(s.numpy(), y.t()[:, 1:].numpy())

    for tdt, bdt in [(torch.float32, braid.float32), (torch.float64, braid.float64),
                     (torch.int64, braid.int64), (torch.int32, braid.int32)]:
        src = (torch.arange(6) - 2).to(tdt).reshape(2, 3)
        bt = braid.from_dlpack(src)
        assert bt.dtype == bdt, (tdt, bt.dtype)
        back = tdl.from_dlpack(bt)
        assert back.dtype == tdt and torch.equal(back, src) and back.data_ptr() == src.data_ptr()

    # braid's NumPy interop under NumPy 1.x
    a = np.arange(4.0)
    ba = braid.from_numpy(a)
    a[0] = 5.0
    assert ba[0].item() == 5.0
    n = ba.numpy()
    n[3] = -2.0
    assert a[3] == -2.0
    np.testing.assert_array_equal(np.asarray(braid.tensor([1.5, 2.5])), [1.5, 2.5])
    print("torch interop ok", torch.__version__, np.__version__)
""")


def _system_python_env():
    env = dict(os.environ)
    env["PYTHONPATH"] = os.path.dirname(os.path.dirname(os.path.abspath(braid.__file__)))
    env.pop("PYTHONHOME", None)
    return env


def _system_python_version():
    """Skips unless SYSTEM_PYTHON exists and is the Python version the extension was built for."""
    if not shutil.which(SYSTEM_PYTHON):
        pytest.skip(f"{SYSTEM_PYTHON} is not installed")
    probe = subprocess.run([SYSTEM_PYTHON, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
                           capture_output=True, text=True, timeout=60)
    ours = "%d.%d" % sys.version_info[:2]
    if probe.returncode != 0 or probe.stdout.strip() != ours:
        pytest.skip(f"{SYSTEM_PYTHON} is Python {probe.stdout.strip() or '?'}; the braid extension is built for {ours}")


def test_torch_interop_via_dlpack_in_system_python():
    _system_python_version()
    r = subprocess.run([SYSTEM_PYTHON, "-c", TORCH_SCRIPT], capture_output=True, text=True, timeout=180,
                       env=_system_python_env())
    if r.returncode == 0 and r.stdout.startswith("SKIP:"):
        pytest.skip(f"torch does not import in {SYSTEM_PYTHON}: {r.stdout.strip()}")
    assert r.returncode == 0, f"rc={r.returncode}\n{r.stdout}\n{r.stderr[-3000:]}"
    assert "torch interop ok" in r.stdout


def test_import_braid_under_numpy_1_in_system_python():
    _system_python_version()
    probe = subprocess.run([SYSTEM_PYTHON, "-c", "import numpy; print(numpy.__version__)"],
                           capture_output=True, text=True, timeout=60,
                           env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"})
    if probe.returncode != 0:
        pytest.skip(f"numpy does not import in {SYSTEM_PYTHON}: {probe.stderr.strip()[-300:]}")
    npver = probe.stdout.strip()
    if not npver.startswith("1."):
        pytest.skip(f"{SYSTEM_PYTHON} has NumPy {npver}, not 1.x")
    code = ("import numpy as np, braid; t = braid.from_numpy(np.arange(3.0)); "
            "print(braid.nn.Linear(2, 1).weight.shape, (t * 2).numpy().tolist())")
    r = subprocess.run([SYSTEM_PYTHON, "-c", code], capture_output=True, text=True, timeout=60,
                       env=_system_python_env())
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.split() == ["(1,", "2)", "[0.0,", "2.0,", "4.0]"]


def test_dlpack_1_0_with_numpy_2_is_writable_both_ways():
    """NumPy 2 asks for DLPack 1.0's versioned capsule: the array it makes over a braid tensor is
    writable and shares memory; a read-only NumPy array comes into braid as a copy."""
    if tuple(int(v) for v in np.__version__.split(".")[:2]) < (2, 1):
        pytest.skip(f"NumPy {np.__version__} asks for legacy capsules only")
    t = braid.arange(6, dtype=braid.float32).reshape(2, 3)
    a = np.from_dlpack(t)
    assert a.flags.writeable
    a[1, 2] = -4.0
    assert t[1, 2].item() == -4.0
    capsule = t.__dlpack__(max_version=(1, 0))
    assert "dltensor_versioned" in repr(capsule)
    frozen = np.arange(3.0)
    frozen.flags.writeable = False
    c = braid.from_dlpack(frozen)
    np.testing.assert_array_equal(c.numpy(), [0.0, 1.0, 2.0])
    c[0] = 9.0  # a copy: the read-only array is untouched
    assert frozen[0] == 0.0


def test_int8_and_uint8_storage_tensors_come_back_as_themselves():
    # Quantised values (ONNX's int8/uint8) are braid storage dtypes: casts wrap between integers
    # as NumPy's astype does, saturate from floats, and numpy()/DLPack give the same type back.
    t = braid.tensor([1, 2, 300, -1])
    u = t.to(braid.uint8)
    assert u.dtype == braid.uint8 and u.dtype.itemsize == 1
    np.testing.assert_array_equal(u.numpy(), np.array([1, 2, 300, -1]).astype(np.uint8))
    assert u.numpy().dtype == np.uint8
    s = braid.tensor([-200.0, -3.7, 3.7, 200.0]).to(braid.int8)
    np.testing.assert_array_equal(s.numpy(), np.array([-128, -3, 3, 127], np.int8))
    back = np.from_dlpack(s)
    assert back.dtype == np.int8
    np.testing.assert_array_equal(back, [-128, -3, 3, 127])
    d = braid.from_dlpack(np.array([7, 250], np.uint8))
    assert d.dtype == braid.uint8
    assert d.to(braid.int32).numpy().tolist() == [7, 250]
    with pytest.raises(TypeError, match="storage type"):
        s + s


# ---------------------------------------------------------------- one thread pool

PTHREAD_OPENBLAS = "/usr/lib/x86_64-linux-gnu/openblas-pthread/libopenblas.so.0"
BLAS_PROBE = textwrap.dedent("""
    import ctypes, sys, warnings
    if sys.argv[1] == "pthread-first":  # as NumPy or PyTorch linked to Debian's default OpenBLAS would
        ctypes.CDLL(sys.argv[2], mode=ctypes.RTLD_GLOBAL)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        import braid
    print([str(w.message) for w in caught if w.category is RuntimeWarning])
""")


@pytest.mark.skipif(not all(os.path.exists(p) for p in (PTHREAD_OPENBLAS, PTHREAD_OPENBLAS.replace("pthread", "openmp"))),
                    reason="needs both of Debian's OpenBLAS builds (braid links the OpenMP one when it is there)")
def test_import_warns_when_another_openblas_pool_came_first():
    # Note [One thread pool]: braid links OpenBLAS's OpenMP build; the pthread build loaded first is
    # the one the process uses, and OpenBLAS itself reports it (openblas_get_parallel).
    runs = {how: subprocess.run([sys.executable, "-c", BLAS_PROBE, how, PTHREAD_OPENBLAS], capture_output=True,
                                text=True, timeout=120, env=os.environ) for how in ("pthread-first", "braid-first")}
    for how, r in runs.items():
        assert r.returncode == 0, (how, r.stderr)
    assert "runs its own pthread pool" in runs["pthread-first"].stdout
    assert runs["braid-first"].stdout.strip() == "[]"
