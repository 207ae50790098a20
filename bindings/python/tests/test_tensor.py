"""braid.Tensor from Python: creation, dtypes and devices, the Python protocol (operators, indexing,
reductions, views), autograd and errors. Every expected value comes from NumPy, a closed form, or
central finite differences in float64."""

import operator
import subprocess
import sys

import numpy as np
import pytest

import braid


def close(t, expected, rtol=1e-6, atol=1e-6):
    """t (a braid.Tensor) has expected's shape and values."""
    got = t.detach().numpy()
    expected = np.asarray(expected)
    assert got.shape == expected.shape, (got.shape, expected.shape)
    np.testing.assert_allclose(got, expected, rtol=rtol, atol=atol)


def equal(t, expected):
    got = t.detach().numpy()
    expected = np.asarray(expected)
    assert got.shape == expected.shape, (got.shape, expected.shape)
    np.testing.assert_array_equal(got, expected)


# ---------------------------------------------------------------- creation


def test_zeros_ones_full_shapes_and_values():
    equal(braid.zeros(2, 3), np.zeros((2, 3), np.float32))
    equal(braid.zeros((2, 3)), np.zeros((2, 3), np.float32))
    equal(braid.ones([4]), np.ones(4, np.float32))
    equal(braid.ones(2, 2, dtype=braid.int64), np.ones((2, 2), np.int64))
    equal(braid.full((2, 3), 3.5), np.full((2, 3), 3.5, np.float32))
    equal(braid.full((3,), 7, dtype=braid.int32), np.full(3, 7, np.int32))
    assert braid.zeros(2, 3).dtype == braid.float32
    assert braid.zeros(0, 3).shape == (0, 3)


def test_arange_integer_and_float_forms():
    t = braid.arange(5)
    assert t.dtype == braid.int64
    equal(t, np.arange(5))
    equal(braid.arange(2, 11, 3), np.arange(2, 11, 3))
    f = braid.arange(0, 1, 0.25)
    assert f.dtype == braid.float32
    close(f, np.arange(0, 1, 0.25, dtype=np.float32))


def test_linspace_and_eye_match_numpy():
    close(braid.linspace(-1.0, 2.0, 7), np.linspace(-1.0, 2.0, 7, dtype=np.float32))
    close(braid.linspace(0, 1, 5, dtype=braid.float64), np.linspace(0, 1, 5), rtol=1e-15)
    equal(braid.eye(4), np.eye(4, dtype=np.float32))
    equal(braid.eye(3, dtype=braid.int64), np.eye(3, dtype=np.int64))


def test_rand_range_and_randn_moments():
    braid.manual_seed(0)
    u = braid.rand(20000).numpy()
    assert u.dtype == np.float32
    assert u.min() >= 0.0 and u.max() < 1.0
    assert abs(u.mean() - 0.5) < 0.01  # sd of the mean: 0.29 / sqrt(20000) = 0.002
    assert abs(u.var() - 1 / 12) < 0.005
    n = braid.randn(100, 200).numpy()
    assert n.shape == (100, 200)
    assert abs(n.mean()) < 0.02 and abs(n.std() - 1.0) < 0.02
    r = braid.randint(3, 9, (5000,)).numpy()
    assert r.dtype == np.int64 and r.min() == 3 and r.max() == 8


def test_manual_seed_and_generator_reproduce():
    braid.manual_seed(42)
    a = braid.randn(6).numpy()
    braid.manual_seed(42)
    b = braid.randn(6).numpy()
    np.testing.assert_array_equal(a, b)
    g1, g2 = braid.Generator(7), braid.Generator(7)
    np.testing.assert_array_equal(braid.rand(5, generator=g1).numpy(), braid.rand(5, generator=g2).numpy())


@pytest.mark.parametrize("data, dtype, npdtype", [
    ([[1.0, 2.0], [3.0, 4.5]], braid.float32, np.float32),  # Python floats: float32, as in PyTorch
    ([[1, 2], [3, 4]], braid.int64, np.int64),  # Python ints: int64
    ([True, False, True], braid.bool, np.bool_),
    ([1, 2.5], braid.float32, np.float32),  # mixed ints and floats: float32
    (3.25, braid.float32, np.float32),
    (7, braid.int64, np.int64),
])
def test_tensor_from_python_data_uses_pytorch_default_dtypes(data, dtype, npdtype):
    t = braid.tensor(data)
    assert t.dtype == dtype
    equal(t, np.array(data, dtype=npdtype))


def test_tensor_from_numpy_keeps_dtype_and_copies():
    a = np.arange(6, dtype=np.float64).reshape(2, 3)
    t = braid.tensor(a)
    assert t.dtype == braid.float64
    a[0, 0] = 100.0
    assert t[0, 0].item() == 0.0  # a copy
    assert braid.tensor(np.array([1, 2], np.int32)).dtype == braid.int32
    assert braid.tensor(np.array([1, 2], np.uint8)).dtype == braid.int64


def test_tensor_dtype_argument_is_exact():
    # float64 requested: no detour through float32 (0.1 is not a float32 number)
    assert braid.tensor([0.1], dtype=braid.float64).item() == 0.1
    assert braid.tensor([0.1]).item() == float(np.float32(0.1))
    equal(braid.tensor([1, 2], dtype=braid.float32), np.array([1, 2], np.float32))
    t = braid.tensor([1.0, 2.0], requires_grad=True)
    assert t.requires_grad and t.is_leaf


# ---------------------------------------------------------------- dtypes and devices


def test_dtype_objects():
    assert repr(braid.float32) == "braid.float32"
    assert str(braid.int64) == "braid.int64"
    assert repr(braid.bool) == "braid.bool"
    assert braid.float is braid.float32 and braid.double is braid.float64 and braid.long is braid.int64
    assert braid.float32 != braid.float64
    assert braid.float64.is_floating_point and not braid.int32.is_floating_point
    dtypes = (braid.float32, braid.float64, braid.int64, braid.int32, braid.bool, braid.float16)
    assert [d.itemsize for d in dtypes] == [4, 8, 8, 4, 1, 2]
    assert braid.promote_types(braid.int32, braid.float32) == braid.float32
    assert braid.promote_types(braid.int32, braid.int64) == braid.int64
    assert braid.promote_types(braid.bool, braid.int32) == braid.int32
    assert braid.promote_types(braid.float32, braid.float64) == braid.float64


def test_device_objects():
    d = braid.device("cpu")
    assert d.type == "cpu"
    assert d == "cpu" and d == braid.device("cpu")
    assert "cpu" in repr(d)
    t = braid.ones(2)
    assert t.device.type == "cpu"
    assert t.device == d
    assert not t.is_cuda
    assert braid.ones(2, device="cpu").device.type == "cpu"
    assert hash(braid.device("cpu")) == hash(braid.device("cpu"))


def test_conversions_between_dtypes():
    a = np.array([1.7, -2.5, 0.0, 3.0])
    t = braid.tensor(a)
    equal(t.to(braid.int64), a.astype(np.int64))  # truncation toward zero, as NumPy's astype
    equal(t.long(), a.astype(np.int64))
    equal(t.float(), a.astype(np.float32))
    equal(t.bool(), a.astype(bool))
    assert t.double().dtype == braid.float64 and t.int().dtype == braid.int32
    assert t.to("cpu", braid.float32).dtype == braid.float32
    assert t.to(braid.ones(1, dtype=braid.int32)).dtype == braid.int32
    c = t.to(braid.float64, copy=True)
    c[0] = 0.0
    assert t[0].item() == 1.7


# ---------------------------------------------------------------- attributes


def test_shape_ndim_len_size_stride():
    a = np.zeros((2, 3, 4), np.float32)
    t = braid.zeros(2, 3, 4)
    assert t.shape == (2, 3, 4) and isinstance(t.shape, tuple)
    assert t.ndim == 3 and t.dim() == 3
    assert len(t) == 2
    assert t.size() == (2, 3, 4) and t.size(1) == 3 and t.size(-1) == 4
    assert t.numel() == 24
    assert t.stride() == tuple(s // a.itemsize for s in a.strides)
    assert t.stride(0) == 12
    tt = t.permute(2, 0, 1)
    assert tt.stride() == tuple(s // a.itemsize for s in a.transpose(2, 0, 1).strides)
    assert not tt.is_contiguous() and tt.contiguous().is_contiguous()
    with pytest.raises(TypeError):
        len(braid.tensor(1.0))


def test_repr_shows_shape_dtype_and_values():
    r = repr(braid.tensor([[1, 2], [3, 4]]))
    assert "shape=[2, 2]" in r and "int64" in r and "1, 2, 3, 4" in r
    assert "requires_grad" in repr(braid.ones(2, requires_grad=True))
    assert str(braid.tensor([1.5])) == repr(braid.tensor([1.5]))


def test_item_and_python_number_conversions():
    f = braid.tensor(2.5).item()
    assert type(f) is float and f == 2.5
    i = braid.tensor([7]).item()
    assert type(i) is int and i == 7
    b = braid.tensor(True).item()
    assert type(b) is bool and b is True
    assert type(braid.tensor(3, dtype=braid.int32).item()) is int
    assert float(braid.tensor(1.25)) == 1.25 and int(braid.tensor(9)) == 9
    assert bool(braid.tensor([0.0])) is False
    assert [2, 3, 4][braid.tensor(1)] == 3  # __index__
    with pytest.raises(ValueError):
        braid.tensor([1.0, 2.0]).item()
    with pytest.raises(ValueError):
        bool(braid.tensor([1, 2]))


def test_tolist_and_iteration():
    a = np.arange(12).reshape(2, 3, 2)
    assert braid.tensor(a).tolist() == a.tolist()
    assert braid.tensor([True, False]).tolist() == [True, False]
    assert braid.tensor(2.5).tolist() == 2.5
    assert braid.tensor(a).permute(2, 0, 1).tolist() == a.transpose(2, 0, 1).tolist()
    assert [x.item() for x in braid.tensor([5, 6, 7])] == [5, 6, 7]


# ---------------------------------------------------------------- operators

BINARY = [
    ("+", operator.add), ("-", operator.sub), ("*", operator.mul), ("/", operator.truediv),
]
COMPARE = [
    ("<", operator.lt), ("<=", operator.le), (">", operator.gt), (">=", operator.ge),
    ("==", operator.eq), ("!=", operator.ne),
]


@pytest.fixture
def ab(rng):
    a = rng.standard_normal((3, 4)).astype(np.float32)
    b = (rng.standard_normal((3, 4)) + 3).astype(np.float32)
    b[0, 0] = a[0, 0]  # an equal pair for == and <=
    return a, b


@pytest.mark.parametrize("name, op", BINARY, ids=[n for n, _ in BINARY])
def test_arithmetic_matches_numpy(ab, name, op):
    a, b = ab
    A, B = braid.tensor(a), braid.tensor(b)
    close(op(A, B), op(a, b))
    close(op(A, 2.5), op(a, np.float32(2.5)))
    close(op(2.5, A), op(np.float32(2.5), a))
    close(op(A, 3), op(a, np.float32(3)))
    close(op(3, A), op(np.float32(3), a))
    close(op(A, B[1]), op(a, b[1]))  # broadcasting
    close(op(A[:, :1], B), op(a[:, :1], b))
    assert op(2.5, A).dtype == braid.float32


@pytest.mark.parametrize("name, op", COMPARE, ids=[n for n, _ in COMPARE])
def test_comparisons_match_numpy(ab, name, op):
    a, b = ab
    A, B = braid.tensor(a), braid.tensor(b)
    r = op(A, B)
    assert r.dtype == braid.bool
    equal(r, op(a, b))
    equal(op(A, 0.5), op(a, np.float32(0.5)))
    equal(op(0.5, A), op(np.float32(0.5), a))
    I = braid.tensor([1, 2, 3])
    equal(op(I, 2), op(np.array([1, 2, 3]), 2))
    equal(op(2, I), op(2, np.array([1, 2, 3])))
    equal(op(I, 2.5), op(np.array([1, 2, 3]), 2.5))


def test_power_matmul_and_unary(ab):
    a, b = ab
    A, B = braid.tensor(a), braid.tensor(b)
    pos = np.abs(b) + np.float32(0.1)
    close(braid.tensor(pos) ** A, pos ** a, rtol=1e-5)
    close(A ** 2, a ** 2)
    close(braid.tensor(pos) ** 0.5, np.sqrt(pos), rtol=1e-6)
    close(2 ** A, np.float32(2) ** a, rtol=1e-6)
    close(A @ B.T, a @ b.T, rtol=1e-5)
    close(A.T @ B, a.T @ b, rtol=1e-5)
    v = np.arange(4, dtype=np.float32)
    close(A @ braid.tensor(v), a @ v, rtol=1e-5)  # matrix @ vector
    batch = np.arange(24, dtype=np.float32).reshape(2, 4, 3)
    close(A @ braid.tensor(batch), a @ batch, rtol=1e-5)  # broadcast batch axes
    equal(-A, -a)
    equal(abs(A), np.abs(a))
    assert +A is A


def test_logical_operators_on_bool():
    p = np.array([True, True, False, False])
    q = np.array([True, False, True, False])
    P, Q = braid.tensor(p), braid.tensor(q)
    equal(P & Q, p & q)
    equal(P | Q, p | q)
    equal(P ^ Q, p ^ q)
    equal(~P, ~p)
    equal(P & True, p & True)
    equal(False | P, False | p)
    equal(True ^ P, True ^ p)
    A = braid.tensor([1.0, -2.0, 3.0, -4.0])
    equal((A > 0) & (A < 2), np.array([True, False, False, False]))


def test_logical_operators_refuse_integers():
    # PyTorch computes & | ^ ~ bitwise on integers; braid has no bitwise ops, so it refuses them
    # rather than computing a logical result silently.
    I = braid.tensor([1, 2, 3])
    with pytest.raises(TypeError):
        I & I
    with pytest.raises(TypeError):
        I | 1
    with pytest.raises(TypeError):
        ~I


def test_numpy_operands_give_tensors(ab):
    a, b = ab
    A = braid.tensor(a)
    for r, ref in [(np.float32(2) * A, 2 * a), (A * np.float64(0.5), a * 0.5), (np.float64(1) - A, 1 - a),
                   (A + b, a + b), (b + A, b + a), (b @ A.T, b @ a.T), (A @ b.T, a @ b.T)]:
        assert isinstance(r, braid.Tensor)
        close(r, ref, rtol=1e-5)
    assert (A + b).dtype == braid.float32
    assert (A + b.astype(np.float64)).dtype == braid.float64  # tensor-tensor promotion
    assert isinstance(np.float64(0.0) < A, braid.Tensor)


def test_type_promotion_examples_from_the_note():
    I = braid.tensor([1, 2, 3])
    i = np.array([1, 2, 3])
    r = I + 2
    assert r.dtype == braid.int64
    equal(r, i + 2)
    assert (2 * I).dtype == braid.int64
    r = I + 2.5
    assert r.dtype == braid.float32
    close(r, i + 2.5)
    r = I / braid.tensor([2, 4, 4])
    assert r.dtype == braid.float32
    close(r, i / np.array([2, 4, 4]))
    assert (I / 2).dtype == braid.float32 and (2 / I).dtype == braid.float32
    close(2 / I, 2 / i)
    assert (I.int() + I).dtype == braid.int64
    assert (I.int() + I.int()).dtype == braid.int32
    assert (I + braid.ones(3)).dtype == braid.float32
    assert (braid.ones(3) + braid.ones(3, dtype=braid.float64)).dtype == braid.float64
    P = braid.tensor([True, False, True])
    assert (P + 1).dtype == braid.int64
    equal(P + 1, np.array([2, 1, 2]))
    assert (P * P).dtype == braid.bool
    # Python scalars as in PyTorch: a Python float makes an integer tensor float32, even when whole.
    assert (I * 2.0).dtype == braid.float32
    close(I * 2.0, i * 2.0)
    assert (I ** 2).dtype == braid.int64
    equal(I ** 2, i ** 2)
    assert (I ** 0.5).dtype == braid.float32
    close(I ** 0.5, np.sqrt(i))
    equal(2 ** I, 2 ** i)
    with pytest.raises(ValueError):
        I ** -1  # integers to negative integer powers, as NumPy
    with pytest.raises(TypeError):
        P - P  # sub refuses bool, as PyTorch
    assert I.sum().dtype == braid.int64 and P.sum().item() == 2
    assert I.mean().dtype == braid.float32 and I.mean().item() == 2.0


def test_inplace_operators_update_the_same_tensor(ab):
    a, b = ab
    A = braid.tensor(a)
    ptr, obj = A.data_ptr(), A
    A += braid.tensor(b)
    A -= 1.5
    A *= 2
    A /= braid.tensor(b)
    assert A is obj and A.data_ptr() == ptr
    close(A, (a + b - np.float32(1.5)) * 2 / b, rtol=1e-5)
    I = braid.tensor([4, 6])
    I += 2
    I *= braid.tensor([2, 3])
    I -= 1
    equal(I, np.array([11, 23]))
    assert I.dtype == braid.int64


def test_inplace_int_division_and_float_results_are_type_errors():
    I = braid.tensor([4, 6])
    with pytest.raises(TypeError):
        I /= 2
    with pytest.raises(TypeError):
        I += 0.5
    with pytest.raises(TypeError):
        I *= braid.tensor([1.0, 2.0])
    B = braid.tensor([True, False])
    with pytest.raises(TypeError):
        B *= 2
    equal(I, np.array([4, 6]))  # nothing was written
    equal(B, np.array([True, False]))


def test_inplace_on_a_view_writes_the_base():
    base = braid.zeros(4, 6)
    v = base[1:3, ::2]
    v += 5
    v *= 2
    expected = np.zeros((4, 6), np.float32)
    expected[1:3, ::2] = 10
    equal(base, expected)


# ---------------------------------------------------------------- indexing

A3 = np.arange(60, dtype=np.float32).reshape(3, 4, 5)

INDICES = [
    (slice(1, 3), slice(None, None, 2)),
    (Ellipsis, 0),
    None,
    (None, 1, None, slice(1, 3)),
    -1,
    (1, -2),
    (0, Ellipsis, 1),
    (Ellipsis, None),
    (slice(-2, None),),
    (slice(10, 20),),
    (1, slice(3, 1)),
    (slice(None), slice(1, None, 3), 4),
    [2, 0, 2],
    [-1, 0],
    (slice(None), [3, 1, 3]),
    (slice(None), slice(None), [4, 0]),
    np.array([[0, 1], [2, 2]]),
    A3 > 30,
    A3[:, :, 0] > 20,
    (slice(None), A3[0, :, 0] > 4),
    (0, np.array([True, False, True, False])),
    np.int64(2),
]


@pytest.mark.parametrize("index", INDICES, ids=range(len(INDICES)))
def test_getitem_matches_numpy(index):
    equal(braid.tensor(A3)[index], A3[index])


def test_getitem_with_tensor_indices():
    T = braid.tensor(A3)
    equal(T[braid.tensor([2, 0])], A3[[2, 0]])
    equal(T[:, braid.tensor([[1, 3], [0, 0]])], A3[:, [[1, 3], [0, 0]]])
    equal(T[braid.tensor(1)], A3[1])
    equal(T[braid.tensor(A3 > 40)], A3[A3 > 40])
    equal(T[1][2][3], A3[1, 2, 3])


@pytest.mark.parametrize("index", [3, -4, (0, 4), (0, 0, 5), [0, 3], (0, 0, 0, 0)], ids=str)
def test_getitem_out_of_range_is_index_error(index):
    with pytest.raises(IndexError):
        braid.tensor(A3)[index]


def test_getitem_unsupported_indices():
    T = braid.tensor(A3)
    with pytest.raises(TypeError):
        T[1.5]
    with pytest.raises(IndexError):
        T[braid.tensor([True, False])]  # mask shape does not match
    with pytest.raises(ValueError):
        T[::-1]  # braid's views have non-negative strides


def test_basic_slices_are_views():
    a = np.arange(24, dtype=np.float32).reshape(4, 6)
    base = braid.tensor(a)
    for index in [(slice(1, 3), slice(None, None, 2)), (Ellipsis, 0), 2, (None, slice(None), 1)]:
        v = base[index]
        v.fill_(-1.0)
        a[index] = -1.0
        equal(base, a)
    row = base[3]
    base[3, 1] = 42.0
    assert row[1].item() == 42.0  # and writes to the base show in the view


def test_setitem_scalar_tensor_and_sequence():
    a = np.zeros((4, 6), np.float32)
    t = braid.zeros(4, 6)
    t[1:3, ::2] = 7.0
    a[1:3, ::2] = 7.0
    t[0] = braid.tensor(np.arange(6, dtype=np.float32))
    a[0] = np.arange(6)
    t[:, -1] = braid.tensor([1.0, 2.0, 3.0, 4.0])
    a[:, -1] = [1, 2, 3, 4]
    t[..., 1] = [9, 8, 7, 6]
    a[..., 1] = [9, 8, 7, 6]
    t[3, 3] = 5
    a[3, 3] = 5
    t[2:] = braid.tensor([0.5])  # broadcast
    a[2:] = 0.5
    equal(t, a)
    i = braid.zeros(3, dtype=braid.int64)
    i[1] = 2.7  # truncation toward zero, as PyTorch
    equal(i, np.array([0, 2, 0]))
    with pytest.raises(ValueError):
        t[0] = braid.ones(5)


# ---------------------------------------------------------------- reductions


@pytest.fixture
def x3(rng):
    return rng.standard_normal((3, 4, 5))


@pytest.mark.parametrize("dim, keepdim", [(None, False), (1, False), (-1, True), ((0, 2), False), ((0, 2), True)])
def test_sum_mean_amax_amin_match_numpy(x3, dim, keepdim):
    T = braid.tensor(x3)
    kw = dict(axis=dim, keepdims=keepdim)
    close(T.sum(dim, keepdim=keepdim), x3.sum(**kw), rtol=1e-12)
    close(T.mean(dim=dim, keepdim=keepdim), x3.mean(**kw), rtol=1e-12)
    close(T.amax(dim, keepdim), x3.max(**kw), rtol=0)
    close(T.amin(dim, keepdim), x3.min(**kw), rtol=0)
    close(T.prod(dim, keepdim), x3.prod(**kw), rtol=1e-12)
    close(braid.sum(T, dim, keepdim=keepdim), x3.sum(**kw), rtol=1e-12)
    close(braid.mean(T, dim, keepdim=keepdim), x3.mean(**kw), rtol=1e-12)
    close(T.logsumexp(dim, keepdim), np.log(np.exp(x3).sum(**kw)), rtol=1e-12)


@pytest.mark.parametrize("correction", [0, 1, 2])
def test_var_std_with_correction(x3, correction):
    T = braid.tensor(x3)
    close(T.var(1, correction=correction), x3.var(1, ddof=correction), rtol=1e-12)
    close(T.std((0, 2), correction=correction, keepdim=True), x3.std((0, 2), ddof=correction, keepdims=True),
          rtol=1e-12)
    close(T.var(correction=correction), x3.var(ddof=correction), rtol=1e-12)
    close(braid.var(T, 0), x3.var(0, ddof=1), rtol=1e-12)
    close(T.var(2, unbiased=False), x3.var(2), rtol=1e-12)


def test_argmax_argmin_and_max_with_dim(x3):
    T = braid.tensor(x3)
    assert T.argmax().item() == x3.argmax()
    assert T.argmin().item() == x3.argmin()
    equal(T.argmax(1), x3.argmax(1))
    equal(T.argmax(2, keepdim=True), x3.argmax(2, keepdims=True))
    equal(braid.argmin(T, 0), x3.argmin(0))
    assert T.argmax(1).dtype == braid.int64
    assert T.max().item() == x3.max() and T.min().item() == x3.min()
    values, indices = T.max(dim=1)  # (values, indices), as torch.max(x, dim)
    equal(values, x3.max(1))
    equal(indices, x3.argmax(1))
    m = T.min(2, keepdim=True)
    equal(m.values, x3.min(2, keepdims=True))
    equal(m.indices, x3.argmin(2, keepdims=True))
    equal(T.max(braid.zeros(5, dtype=braid.float64)), np.maximum(x3, 0))


def test_reductions_of_integer_and_bool():
    i = np.array([[1, 2, 3], [4, 5, 6]])
    I = braid.tensor(i)
    equal(I.sum(0), i.sum(0))
    assert I.sum().item() == 21 and I.sum().dtype == braid.int64
    equal(I.amax(1), i.max(1))
    assert I.amax(1).dtype == braid.int64
    close(I.mean(1), i.mean(1))
    assert braid.tensor([True, True, False]).sum().item() == 2
    assert braid.tensor([0, 3]).any() and not braid.tensor([0, 3]).all()


def test_elementwise_functions_match_numpy(rng):
    x = rng.uniform(0.1, 0.9, (4, 3))
    T = braid.tensor(x)
    for f, ref in [(braid.exp, np.exp), (braid.log, np.log), (braid.sqrt, np.sqrt), (braid.sin, np.sin),
                   (braid.tanh, np.tanh), (braid.sigmoid, lambda v: 1 / (1 + np.exp(-v))), (braid.asin, np.arcsin),
                   (braid.log1p, np.log1p), (braid.reciprocal, lambda v: 1 / v)]:
        close(f(T), ref(x), rtol=1e-12)
    close(T.exp(), np.exp(x), rtol=1e-12)
    close(T.clamp(0.3, 0.6), np.clip(x, 0.3, 0.6), rtol=0)
    close(T.clamp(min=0.5), np.maximum(x, 0.5), rtol=0)
    close(T.softmax(1), np.exp(x) / np.exp(x).sum(1, keepdims=True), rtol=1e-12)
    close(T.log_softmax(0), x - np.log(np.exp(x).sum(0, keepdims=True)), rtol=1e-12)
    close(braid.where(T > 0.5, T, -T), np.where(x > 0.5, x, -x), rtol=0)


# ---------------------------------------------------------------- shape operations


def test_reshape_view_permute_transpose(x3):
    T = braid.tensor(x3)
    equal(T.reshape(4, 15), x3.reshape(4, 15))
    equal(T.reshape((-1, 5)), x3.reshape(-1, 5))
    equal(braid.reshape(T, 12, 5), x3.reshape(12, 5))
    v = T.view(12, 5)
    equal(v, x3.reshape(12, 5))
    assert v.data_ptr() == T.data_ptr()
    equal(T.permute(2, 0, 1), x3.transpose(2, 0, 1))
    equal(T.permute((1, 0, 2)), x3.transpose(1, 0, 2))
    equal(T.transpose(0, 2), x3.swapaxes(0, 2))
    equal(T.T, x3.T)
    equal(T.mT, np.swapaxes(x3, -1, -2))
    equal(T[0].T, x3[0].T)
    with pytest.raises(ValueError):
        T.permute(2, 0, 1).view(-1)  # not expressible as a view: view refuses, reshape copies
    equal(T.permute(2, 0, 1).reshape(-1), x3.transpose(2, 0, 1).reshape(-1))
    with pytest.raises(ValueError):
        T.reshape(7, 7)


def test_expand_squeeze_unsqueeze_flatten(x3):
    col = x3[:, :1, :]
    C = braid.tensor(col)
    equal(C.expand(3, 4, 5), np.broadcast_to(col, (3, 4, 5)))
    equal(C.expand(-1, 4, -1), np.broadcast_to(col, (3, 4, 5)))
    assert C.expand(3, 4, 5).stride(1) == 0
    equal(C.squeeze(), col.squeeze())
    equal(C.squeeze(1), col.squeeze(1))
    assert C.squeeze(0).shape == (3, 1, 5)
    T = braid.tensor(x3)
    equal(T.unsqueeze(1), x3[:, None])
    equal(T.unsqueeze(-1), x3[..., None])
    equal(T.flatten(), x3.reshape(-1))
    equal(T.flatten(1), x3.reshape(3, -1))
    equal(T.flatten(0, 1), x3.reshape(12, 5))


def test_cat_stack_split_chunk(x3):
    T = braid.tensor(x3)
    equal(braid.cat([T, T * 2], dim=1), np.concatenate([x3, x3 * 2], 1))
    equal(braid.cat((T, T), 0), np.concatenate([x3, x3], 0))
    equal(braid.stack([T, T * 2], dim=-1), np.stack([x3, x3 * 2], -1))
    equal(braid.stack([T[0], T[1]]), np.stack([x3[0], x3[1]]))
    for got, ref in zip(T.split(2, dim=2), np.split(x3, [2, 4], 2), strict=True):
        equal(got, ref)
    for got, ref in zip(braid.split(T, [1, 3], 1), np.split(x3, [1], 1), strict=True):
        equal(got, ref)
    for got, ref in zip(T.chunk(2, dim=2), np.split(x3, [3], 2), strict=True):
        equal(got, ref)
    assert [c.shape for c in braid.chunk(T, 3, 1)] == [(3, 2, 5), (3, 2, 5)]  # ceil(4 / 3) per chunk
    with pytest.raises(ValueError):
        braid.cat([T, braid.zeros(2, 2, dtype=braid.float64)])


# ---------------------------------------------------------------- autograd


def test_backward_of_a_small_expression_closed_form():
    x = np.array([1.0, -2.0, 3.0], np.float32)
    X = braid.tensor(x, requires_grad=True)
    y = (X * X * 3 + 2 * X).sum()
    assert y.requires_grad and not y.is_leaf and y.grad_fn is not None
    assert X.is_leaf and X.grad_fn is None and X.grad is None
    y.backward()
    close(X.grad, 6 * x + 2)
    (X * X).sum().backward()  # gradients accumulate
    close(X.grad, 6 * x + 2 + 2 * x)
    X.grad = None
    assert X.grad is None


def test_backward_with_explicit_gradient_and_retain_grad():
    q = braid.tensor([1.0, 2.0, 3.0], requires_grad=True)
    r = q * q
    r.retain_grad()
    r.backward(braid.tensor([1.0, 0.5, 2.0]))
    close(q.grad, 2 * np.array([1, 2, 3]) * np.array([1.0, 0.5, 2.0]))
    close(r.grad, [1.0, 0.5, 2.0])
    with pytest.raises(ValueError):
        (braid.ones(3, requires_grad=True) * 2).backward()  # a non-scalar needs its gradient


def composite(w, v, lib):
    """A function of a matrix and a vector made of many ops; lib is braid or a NumPy shim."""
    h = lib.tanh(w @ v)
    return (h ** 2).sum() + lib.sigmoid(v).prod() + (lib.exp(w) / (1 + v * v)).mean() + (w[1:, ::2] * 3).sum()


class _NP:
    tanh = staticmethod(np.tanh)
    exp = staticmethod(np.exp)

    @staticmethod
    def sigmoid(x):
        return 1 / (1 + np.exp(-x))


def numeric_grad(f, x, eps=1e-6):
    g = np.zeros_like(x)
    for i in np.ndindex(x.shape):
        xp, xm = x.copy(), x.copy()
        xp[i] += eps
        xm[i] -= eps
        g[i] = (f(xp) - f(xm)) / (2 * eps)
    return g


def test_gradient_of_a_composite_function_vs_finite_differences(rng):
    w0 = rng.standard_normal((3, 4))
    v0 = rng.standard_normal(4)
    W = braid.tensor(w0, requires_grad=True)
    V = braid.tensor(v0, requires_grad=True)
    assert W.dtype == braid.float64
    out = composite(W, V, braid)

    np.testing.assert_allclose(out.item(), composite(w0, v0, _NP), rtol=1e-12)
    out.backward()
    np.testing.assert_allclose(W.grad.numpy(), numeric_grad(lambda w: composite(w, v0, _NP), w0), rtol=1e-6, atol=1e-8)
    np.testing.assert_allclose(V.grad.numpy(), numeric_grad(lambda v: composite(w0, v, _NP), v0), rtol=1e-6, atol=1e-8)


def test_gradient_through_indexing_and_reductions(rng):
    a = rng.standard_normal((3, 4))
    X = braid.tensor(a, requires_grad=True)
    (X[1, ::2] * 2).sum().backward()
    g = np.zeros_like(a)
    g[1, ::2] = 2
    close(X.grad, g)
    Y = braid.tensor(a, requires_grad=True)
    Y[:, [2, 0, 2]].sum().backward()
    np.testing.assert_array_equal(Y.grad.numpy(), np.tile([1.0, 0.0, 2.0, 0.0], (3, 1)))
    Z = braid.tensor(a, requires_grad=True)
    (Z.var(1).sum() + Z.amax(0).sum()).backward()
    expected = 2 * (a - a.mean(1, keepdims=True)) / (a.shape[1] - 1)
    expected[a.argmax(0), np.arange(4)] += 1
    close(Z.grad, expected, rtol=1e-12)


def test_no_grad_and_detach():
    x = braid.tensor([1.0, 2.0], requires_grad=True)
    with braid.no_grad():
        y = x * 2
        assert not braid.is_grad_enabled()
    assert braid.is_grad_enabled()
    assert not y.requires_grad
    close(y, [2.0, 4.0])

    @braid.no_grad()
    def double(t):
        return t * 2

    assert not double(x).requires_grad
    assert (x * 2).requires_grad
    d = x.detach()
    assert not d.requires_grad and d.data_ptr() == x.data_ptr()
    with braid.no_grad():
        x += 1  # in-place update of a leaf outside grad mode (an optimizer step)
    close(d, [2.0, 3.0])  # detach shares storage
    with braid.enable_grad():
        assert braid.is_grad_enabled()


def test_requires_grad_rules():
    with pytest.raises(TypeError):
        braid.tensor([1, 2]).requires_grad_()  # only floating tensors
    x = braid.ones(2, requires_grad=True)
    with pytest.raises(ValueError):
        x += 1  # a leaf that requires grad is not modified in place under grad mode
    close(x, [1.0, 1.0])


# ---------------------------------------------------------------- errors


def test_shape_mismatch_is_value_error_naming_the_op():
    a = braid.ones(3, 4)
    with pytest.raises(ValueError, match="matmul"):
        a @ a
    with pytest.raises(ValueError, match="add"):
        a + braid.ones(5)
    with pytest.raises(ValueError, match="reshape"):
        a.reshape(5, 5)
    with pytest.raises(ValueError, match="concat"):
        braid.cat([a, braid.ones(2, 2)])


def test_wrong_dtype_is_type_error():
    with pytest.raises(TypeError):
        braid.tensor([True]) - braid.tensor([False])
    with pytest.raises(TypeError):
        braid.ones(2).bfloat16().numpy()  # NumPy has no bfloat16
    with pytest.raises(TypeError):
        braid.ones(2) + "a"
    with pytest.raises(TypeError):
        braid.ones(2).__index__()


def test_out_of_range_is_index_error():
    t = braid.ones(2, 3)
    with pytest.raises(IndexError):
        t.sum(5)
    with pytest.raises(IndexError):
        t[2]
    with pytest.raises(IndexError):
        t.transpose(0, 3)
    with pytest.raises(IndexError):
        t.size(4)


def test_errors_never_abort_the_interpreter():
    # A batch of misuse in a fresh interpreter: each must raise a Python exception, none may crash it.
    code = r"""
import numpy as np, braid
cases = [
    lambda: braid.ones(2, 3) @ braid.ones(2, 3),
    lambda: braid.ones(2)[5],
    lambda: braid.ones(2).sum(3),
    lambda: braid.tensor([1]).requires_grad_(),
    lambda: braid.ones(2).item(),
    lambda: braid.ones(0).reshape(-1, 0),
    lambda: braid.ones(3).view(2, 2),
    lambda: braid.from_numpy(np.zeros(3)[::-1]),
    lambda: braid.ones(2, 2).expand(3, 3),
    lambda: braid.cat([]),
    lambda: braid.ones(2).to("cuda:99"),
    lambda: (braid.ones(2, requires_grad=True) * 2).backward(),
    lambda: braid.ones(2).backward(),
    lambda: braid.full((2,), 1e30, dtype=braid.int32),
    lambda: braid.ones(2).__dlpack_device__() and 1 / 0,
]
for i, case in enumerate(cases):
    try:
        case()
    except Exception:
        pass
    else:
        raise SystemExit(f"case {i} raised nothing")
print("survived", len(cases))
"""
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "survived 15" in r.stdout


def test_bool_mask_assignment_matches_numpy():
    a = np.arange(-6, 6, dtype=np.float32).reshape(3, 4)
    t = braid.tensor(a)
    t[t < 0] = 0.5
    want = a.copy()
    want[want < 0] = 0.5
    np.testing.assert_array_equal(t.numpy(), want)
    rows = np.array([True, False, True])
    t2 = braid.tensor(a)
    t2[braid.tensor(rows)] = braid.full((4,), -1.0)
    want2 = a.copy()
    want2[rows] = -1.0
    np.testing.assert_array_equal(t2.numpy(), want2)
    with pytest.raises(IndexError):
        t2[braid.tensor([True, False])] = 1.0


def test_grad_ready_hook_sees_the_accumulated_gradient_once():
    w = braid.tensor([0.5, -1.0, 2.0], requires_grad=True)
    seen = []
    hook = braid.autograd.add_grad_ready_hook(w, lambda: seen.append(w.grad.numpy().copy()))
    ((w * w).sum() + w.sum()).backward()  # w is used twice: the hook fires once, after both
    assert len(seen) == 1
    np.testing.assert_allclose(seen[0], 2 * np.array([0.5, -1.0, 2.0]) + 1, rtol=1e-6)
    braid.autograd.remove_grad_ready_hook(w, hook)

    def boom():
        raise KeyError("from a hook")

    braid.autograd.add_grad_ready_hook(w, boom)
    with pytest.raises(KeyError, match="from a hook"):
        (w * 3).sum().backward()
