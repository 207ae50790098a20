"""onnxruntime's com.microsoft operators in braid (onnx/ops_contrib.cpp), each checked against
onnxruntime itself: a small graph per op made with onnx.helper, random inputs, onnxruntime's
outputs as the reference (its docs/ContribOperators.md gives the semantics)."""
import numpy as np
import pytest

import braid

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

MS = "com.microsoft"
F32 = TensorProto.FLOAT
TYPES = {np.float32: TensorProto.FLOAT, np.int8: TensorProto.INT8, np.uint8: TensorProto.UINT8, np.int32: TensorProto.INT32,
         np.int64: TensorProto.INT64}


def check(tmp_path, op, inputs, n_outputs=1, attrs=None, initializers=None, domain=MS, rtol=1e-5, atol=1e-5,
          compare=None, grad=False):
    """Runs one node of `op` with `inputs` (name -> array; None: an empty optional input) in
    onnxruntime and in braid, and compares every output (or those in `compare`)."""
    names = [("" if v is None else k) for k, v in inputs.items()]
    feeds = {k: v for k, v in inputs.items() if v is not None and k not in (initializers or {})}
    # n_outputs: a count, or the output names with "" for an optional output left out
    outs = [f"y{i}" for i in range(n_outputs)] if isinstance(n_outputs, int) else list(n_outputs)
    node = helper.make_node(op, names, outs, domain=domain, **(attrs or {}))
    graph = helper.make_graph(
        [node], "contrib",
        [helper.make_tensor_value_info(k, TYPES[v.dtype.type], list(v.shape)) for k, v in feeds.items()],
        [helper.make_empty_tensor_value_info(o) for o in outs if o],
        [numpy_helper.from_array(v, k) for k, v in (initializers or {}).items()])
    opsets = [helper.make_opsetid("", 17)] + ([helper.make_opsetid(MS, 1)] if domain == MS else [])
    path = tmp_path / f"{op}.onnx"
    onnx.save(helper.make_model(graph, opset_imports=opsets, ir_version=9), str(path))
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL  # the node as written
    want = ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"]).run(None, feeds)
    module = braid.onnx.load(str(path), frozen=True)
    got = module.run([braid.from_numpy(np.ascontiguousarray(v)) for v in feeds.values()])
    for i in compare if compare is not None else range(len(want)):
        np.testing.assert_allclose(got[i].numpy(), want[i], rtol=rtol, atol=atol, err_msg=f"{op} output {i}")
    return got, want


@pytest.fixture
def r():
    return np.random.default_rng(7)


def f32(r, *shape, scale=1.0):
    return (r.standard_normal(shape) * scale).astype(np.float32)


def test_gelu_family(tmp_path, r):
    x, b = f32(r, 2, 3, 8, scale=2), f32(r, 8)
    check(tmp_path, "Gelu", {"X": x})
    check(tmp_path, "BiasGelu", {"A": x, "B": b})
    check(tmp_path, "FastGelu", {"X": x})
    check(tmp_path, "FastGelu", {"X": x, "bias": b})
    check(tmp_path, "QuickGelu", {"X": x})
    check(tmp_path, "QuickGelu", {"X": x}, attrs={"alpha": 1.5})


def test_bias_add(tmp_path, r):
    """onnxruntime has BiasAdd on CUDA only: the reference is its documented sum, in NumPy."""
    x, bias, skip = f32(r, 2, 5, 8), f32(r, 8), f32(r, 2, 5, 8)
    node = helper.make_node("BiasAdd", ["X", "bias", "skip"], ["Y"], domain=MS)
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info(k, F32, list(v.shape))
                                            for k, v in {"X": x, "bias": bias, "skip": skip}.items()],
                              [helper.make_tensor_value_info("Y", F32, None)])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(MS, 1)]),
              str(tmp_path / "b.onnx"))
    (y,) = braid.onnx.load(str(tmp_path / "b.onnx")).run([braid.from_numpy(v) for v in (x, bias, skip)])
    np.testing.assert_allclose(y.numpy(), x + bias + skip, rtol=1e-6)


def test_fused_matmul(tmp_path, r):
    a, b = f32(r, 2, 4, 6), f32(r, 2, 6, 5)
    check(tmp_path, "FusedMatMul", {"A": a, "B": b}, attrs={"alpha": 0.5})
    check(tmp_path, "FusedMatMul", {"A": np.ascontiguousarray(a.transpose(0, 2, 1)), "B": b},
          attrs={"transA": 1, "alpha": 1.25})
    check(tmp_path, "FusedMatMul", {"A": a, "B": np.ascontiguousarray(b.transpose(0, 2, 1))}, attrs={"transB": 1})


@pytest.mark.parametrize("activation,attrs", [("Relu", {}), ("Tanh", {}), ("Sigmoid", {}),
                                              ("LeakyRelu", {"activation_alpha": 0.2})])
def test_fused_gemm(tmp_path, r, activation, attrs):
    check(tmp_path, "FusedGemm", {"A": f32(r, 4, 6), "B": f32(r, 5, 6), "C": f32(r, 5)},
          attrs={"transB": 1, "alpha": 0.75, "beta": 2.0, "activation": activation, **attrs})


@pytest.mark.parametrize("activation,params", [("Relu", None), ("LeakyRelu", [0.1]), ("Clip", [-0.5, 0.5]),
                                               ("HardSigmoid", [0.2, 0.5])])
def test_fused_conv(tmp_path, r, activation, params):
    attrs = {"activation": activation, "pads": [1, 1, 1, 1], "strides": [1, 1]}
    if params is not None:
        attrs["activation_params"] = params
    check(tmp_path, "FusedConv", {"X": f32(r, 2, 3, 6, 6), "W": f32(r, 4, 3, 3, 3), "B": f32(r, 4)}, attrs=attrs,
          rtol=1e-4, atol=1e-5)


def test_fused_conv_adds_z_before_the_activation(tmp_path, r):
    check(tmp_path, "FusedConv", {"X": f32(r, 1, 2, 5, 5), "W": f32(r, 3, 2, 3, 3), "B": f32(r, 3),
                                  "Z": f32(r, 1, 3, 3, 3)}, attrs={"activation": "Relu"}, rtol=1e-4)


def test_skip_layer_normalization(tmp_path, r):
    x, skip, gamma, beta, bias = f32(r, 2, 4, 8), f32(r, 2, 4, 8), f32(r, 8), f32(r, 8), f32(r, 8)
    # output and the input + skip + bias sum (outputs 1 and 2, the statistics, are for training)
    check(tmp_path, "SkipLayerNormalization", {"input": x, "skip": skip, "gamma": gamma, "beta": beta, "bias": bias},
          n_outputs=4, attrs={"epsilon": 1e-5}, compare=[0, 3])
    check(tmp_path, "SkipLayerNormalization", {"input": x, "skip": skip, "gamma": gamma})


def test_simplified_layer_normalizations(tmp_path, r):
    x, skip, gamma, bias = f32(r, 2, 4, 8), f32(r, 2, 4, 8), f32(r, 8), f32(r, 8)
    check(tmp_path, "SimplifiedLayerNormalization", {"X": x, "scale": gamma}, attrs={"epsilon": 1e-6}, domain="")
    got, want = check(tmp_path, "SkipSimplifiedLayerNormalization",
                      {"input": x, "skip": skip, "gamma": gamma, "bias": bias}, n_outputs=["y0", "", "", "y3"],
                      attrs={"epsilon": 1e-6}, compare=[])
    np.testing.assert_allclose(got[0].numpy(), want[0], rtol=1e-5, atol=1e-5)  # output
    np.testing.assert_allclose(got[1].numpy(), want[1], rtol=1e-6)  # input + skip + bias (graph output 2)


def test_matmul_integer_to_float(tmp_path, r):
    a = r.integers(0, 255, (3, 7)).astype(np.uint8)
    b = r.integers(-128, 127, (7, 5)).astype(np.int8)
    inits = {"a_scale": np.float32(0.02), "b_scale": np.float32(0.005), "a_zp": np.uint8(128), "b_zp": np.int8(3),
             "bias": f32(r, 5)}
    inputs = {"A": a, "B": b, "a_scale": inits["a_scale"], "b_scale": inits["b_scale"], "a_zp": inits["a_zp"],
              "b_zp": inits["b_zp"], "bias": inits["bias"]}
    inits.update(A=a, B=b)  # the integer operands as weights (braid's Python takes no 8-bit arrays)
    check(tmp_path, "MatMulIntegerToFloat", {k: np.asarray(v) for k, v in inputs.items()},
          initializers={k: np.asarray(v) for k, v in inits.items()})
    # B's scale and zero point per column, as the quantizer's per-channel mode writes them
    inits.update(b_scale=np.linspace(0.001, 0.01, 5).astype(np.float32), b_zp=np.array([0, 1, -2, 3, 0], np.int8))
    inputs.update(b_scale=inits["b_scale"], b_zp=inits["b_zp"])
    check(tmp_path, "MatMulIntegerToFloat", {k: np.asarray(v) for k, v in inputs.items()},
          initializers={k: np.asarray(v) for k, v in inits.items()})


def test_dynamic_quantize_matmul(tmp_path, r):
    b = r.integers(-128, 127, (6, 4)).astype(np.int8)
    inits = {"B": b, "b_scale": np.asarray(np.float32(0.01)), "b_zp": np.asarray(np.int8(0)), "bias": f32(r, 4)}
    check(tmp_path, "DynamicQuantizeMatMul", {"A": f32(r, 3, 6), **inits}, initializers=inits, rtol=1e-5, atol=1e-5)


def test_quantize_and_dequantize_linear_of_the_domain(tmp_path, r):
    x = f32(r, 4, 5)
    inits = {"s": np.asarray(np.float32(0.05)), "zp": np.asarray(np.uint8(120))}
    got, want = check(tmp_path, "QuantizeLinear", {"x": x, **inits}, initializers=inits, compare=[])
    np.testing.assert_array_equal(got[0].to(braid.int32).numpy(), want[0].astype(np.int32))
    inits["q"] = r.integers(0, 255, (4, 5)).astype(np.uint8)
    check(tmp_path, "DequantizeLinear", {"q": inits["q"], "s": inits["s"], "zp": inits["zp"]}, initializers=inits)


def test_the_composites_train(tmp_path, r):
    """A contrib op replacing a standard one still trains: SkipLayerNormalization's gamma gets the
    gradient of the same graph written with standard ops, computed here in float64 by NumPy."""
    x, skip, gamma, beta = f32(r, 2, 3, 8), f32(r, 2, 3, 8), f32(r, 8), f32(r, 8)
    inits = {"gamma": gamma, "beta": beta}
    node = helper.make_node("SkipLayerNormalization", ["x", "skip", "gamma", "beta"], ["y"], domain=MS,
                            epsilon=1e-5)
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", F32, [2, 3, 8]),
                                            helper.make_tensor_value_info("skip", F32, [2, 3, 8])],
                              [helper.make_tensor_value_info("y", F32, None)],
                              [numpy_helper.from_array(v, k) for k, v in inits.items()])
    path = tmp_path / "train.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(MS, 1)]),
              str(path))
    m = braid.onnx.load(str(path))
    (y,) = m.run([braid.from_numpy(x), braid.from_numpy(skip)])
    y.sum().backward()
    grads = {name: p.grad.numpy() for name, p in m.named_parameters()}
    s = (x + skip).astype(np.float64)
    normed = (s - s.mean(-1, keepdims=True)) / np.sqrt(s.var(-1, keepdims=True) + 1e-5)
    np.testing.assert_allclose(grads["gamma"], normed.sum((0, 1)), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(grads["beta"], np.full(8, 6.0), rtol=1e-6)


def quantized(r, shape, dtype):
    lo, hi = (0, 256) if dtype == np.uint8 else (-128, 128)
    return r.integers(lo, hi, shape).astype(dtype)


def check_quantized(tmp_path, op, inputs, attrs=None):
    """The QLinear ops, every input a weight (braid's Python takes no 8-bit arrays): braid's output
    within one quantisation step of onnxruntime's (both round the same float result half to even;
    their float arithmetic may differ in the last place), and equal in almost every element."""
    inits = {k: np.asarray(v) for k, v in inputs.items() if v is not None}
    got, want = check(tmp_path, op, {k: (None if v is None else np.asarray(v)) for k, v in inputs.items()},
                      attrs=attrs, initializers=inits, compare=[])
    g, w = got[0].to(braid.int32).numpy(), want[0].astype(np.int32)
    assert g.shape == w.shape
    assert np.abs(g - w).max() <= 1, (op, np.abs(g - w).max())
    assert (g == w).mean() >= 0.95, (op, (g == w).mean())


@pytest.mark.parametrize("dtype", [np.uint8, np.int8])
@pytest.mark.parametrize("op", ["QLinearAdd", "QLinearMul"])
def test_qlinear_binary(tmp_path, r, op, dtype):
    zero = dtype(128 if dtype == np.uint8 else 0)
    check_quantized(tmp_path, op, {
        "A": quantized(r, (2, 3, 4), dtype), "A_scale": np.float32(0.03), "A_zp": dtype(zero + 1),
        "B": quantized(r, (4,), dtype), "B_scale": np.float32(0.02), "B_zp": zero,
        "C_scale": np.float32(0.05 if op == "QLinearAdd" else 0.4), "C_zp": dtype(zero - 2)})


@pytest.mark.parametrize("dtype", [np.uint8, np.int8])
def test_qlinear_activations(tmp_path, r, dtype):
    zero = dtype(128 if dtype == np.uint8 else 0)
    q = {"X": quantized(r, (3, 5), dtype), "X_scale": np.float32(0.05), "X_zp": zero,
         "Y_scale": np.float32(1 / 256), "Y_zp": dtype(0 if dtype == np.uint8 else -128)}
    check_quantized(tmp_path, "QLinearSigmoid", q)
    q.update(Y_scale=np.float32(0.05), Y_zp=zero)
    check_quantized(tmp_path, "QLinearLeakyRelu", q, attrs={"alpha": 0.1})


def test_qlinear_concat(tmp_path, r):
    check_quantized(tmp_path, "QLinearConcat", {
        "Y_scale": np.float32(0.04), "Y_zp": np.uint8(120),
        "X0": quantized(r, (2, 3), np.uint8), "X0_scale": np.float32(0.03), "X0_zp": np.uint8(128),
        "X1": quantized(r, (2, 2), np.uint8), "X1_scale": np.float32(0.05), "X1_zp": np.uint8(100)}, attrs={"axis": 1})


@pytest.mark.parametrize("channels_last", [0, 1])
def test_qlinear_global_average_pool(tmp_path, r, channels_last):
    check_quantized(tmp_path, "QLinearGlobalAveragePool", {
        "X": quantized(r, (2, 3, 4, 5), np.uint8), "x_scale": np.float32(0.02), "x_zp": np.uint8(128),
        "y_scale": np.float32(0.01), "y_zp": np.uint8(128)}, attrs={"channels_last": channels_last})


def pack_nibbles(v):
    """4-bit values (last axis even) packed two to a byte, the first in the low bits."""
    v = v.astype(np.uint8)
    return (v[..., 0::2] | (v[..., 1::2] << 4)).astype(np.uint8)


@pytest.mark.parametrize("k,block,with_zero", [(64, 32, True), (40, 16, False), (48, 16, True)])
def test_matmul_nbits(tmp_path, r, k, block, with_zero):
    """4-bit blocked weights as ContribOperators.md lays them out (K not a multiple of the block
    included): braid equals onnxruntime, and both equal the dequantised product in NumPy."""
    n, blocks = 6, -(-k // block)
    values = r.integers(0, 16, (n, blocks * block))
    scales = (r.random((n, blocks)) * 0.1 + 0.01).astype(np.float32)
    zeros = r.integers(0, 16, (n, blocks))
    inits = {"B": pack_nibbles(values).reshape(n, blocks, block // 2), "scales": scales.reshape(-1)}
    if with_zero:
        inits["zero_points"] = pack_nibbles(np.pad(zeros, ((0, 0), (0, blocks % 2)))).reshape(-1)
    a = f32(r, 3, k)
    got, want = check(tmp_path, "MatMulNBits", {"A": a, **inits}, initializers=inits,
                      attrs={"K": k, "N": n, "bits": 4, "block_size": block}, rtol=1e-4, atol=1e-4)
    z = zeros if with_zero else np.full((n, blocks), 8)
    w = ((values.reshape(n, blocks, block) - z[..., None]) * scales[..., None]).reshape(n, -1)[:, :k]
    np.testing.assert_allclose(got[0].numpy(), a.astype(np.float64) @ w.T, rtol=1e-4, atol=1e-4)


def test_the_4bit_quantizer_of_onnxruntime(tmp_path, r):
    """The real tool: onnxruntime's MatMulNBitsQuantizer turns a float MatMul into MatMulNBits; braid
    runs the file it writes as onnxruntime does."""
    q = pytest.importorskip("onnxruntime.quantization.matmul_nbits_quantizer")
    k, n = 64, 16
    w = f32(r, k, n)
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "mm",
                              [helper.make_tensor_value_info("x", F32, [2, k])],
                              [helper.make_tensor_value_info("y", F32, [2, n])], [numpy_helper.from_array(w, "w")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    for symmetric in (False, True):
        quant = q.MatMulNBitsQuantizer(model, bits=4, block_size=32, is_symmetric=symmetric)
        quant.process()
        path = tmp_path / f"nbits_{symmetric}.onnx"
        quant.model.save_model_to_file(str(path))
        ops = [(nd.domain, nd.op_type) for nd in onnx.load(str(path)).graph.node]
        assert ops == [(MS, "MatMulNBits")], ops
        x = f32(r, 2, k)
        so = ort.SessionOptions()
        so.intra_op_num_threads = 1
        (want,) = ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"]).run(None, {"x": x})
        (got,) = braid.onnx.load(str(path), frozen=True).run([braid.from_numpy(x)])
        np.testing.assert_allclose(got.numpy(), want, rtol=1e-4, atol=1e-4)
        exact = x @ w  # a 4-bit weight: near the float product, not equal to it
        assert 0 < np.abs(want - exact).max() < 0.25 * np.abs(exact).max()


def test_matmul_nbits_8bit(tmp_path, r):
    n, k, block = 5, 32, 16
    values = r.integers(0, 256, (n, k))
    scales = (r.random((n, 2)) * 0.01).astype(np.float32)
    zeros = r.integers(0, 256, (n, 2))
    inits = {"B": values.astype(np.uint8).reshape(n, 2, block), "scales": scales.reshape(-1),
             "zero_points": zeros.astype(np.uint8).reshape(-1)}
    a = f32(r, 4, k)
    got, _ = check(tmp_path, "MatMulNBits", {"A": a, **inits}, initializers=inits,
                   attrs={"K": k, "N": n, "bits": 8, "block_size": block}, rtol=1e-4, atol=1e-4)
    w = ((values.reshape(n, 2, block) - zeros[..., None]) * scales[..., None]).reshape(n, k)
    np.testing.assert_allclose(got[0].numpy(), a.astype(np.float64) @ w.T, rtol=1e-4, atol=1e-4)


def rotary_caches(positions, rot):
    inv = 1.0 / (10000 ** (np.arange(0, rot, 2) / rot))
    angles = np.arange(positions)[:, None] * inv[None]
    return np.cos(angles).astype(np.float32), np.sin(angles).astype(np.float32)


@pytest.mark.parametrize("layout,interleaved,rot", [("bsh", 0, 8), ("bsh", 1, 8), ("bnsd", 0, 8), ("bsh", 0, 4),
                                                    ("bnsd", 1, 4)])
def test_rotary_embedding(tmp_path, r, layout, interleaved, rot):
    b, s, heads, d = 2, 5, 3, 8
    x = f32(r, b, s, heads * d) if layout == "bsh" else f32(r, b, heads, s, d)
    cos, sin = rotary_caches(16, rot)
    pos = r.integers(0, 16, (b, s)).astype(np.int64)
    attrs = {"interleaved": interleaved, "num_heads": heads if layout == "bsh" else 0}
    if rot != d:
        attrs["rotary_embedding_dim"] = rot
        attrs["num_heads"] = heads
    inits = {"position_ids": pos, "cos_cache": cos, "sin_cache": sin}
    check(tmp_path, "RotaryEmbedding", {"input": x, **inits}, initializers=inits, attrs=attrs, rtol=1e-5, atol=1e-5)


def test_rotary_embedding_at_an_offset(tmp_path, r):
    """position_ids of one value: positions offset + 0..S-1, as during generation with a cache."""
    x = f32(r, 1, 4, 16)
    cos, sin = rotary_caches(32, 8)
    inits = {"position_ids": np.array([7], np.int64), "cos_cache": cos, "sin_cache": sin}
    check(tmp_path, "RotaryEmbedding", {"input": x, **inits}, initializers=inits, attrs={"num_heads": 2})


@pytest.mark.parametrize("with_segments,with_mask", [(True, True), (False, True), (True, False)])
def test_embed_layer_normalization(tmp_path, r, with_segments, with_mask):
    b, s, h, vocab = 2, 6, 8, 20
    ids = r.integers(0, vocab, (b, s)).astype(np.int32)
    inits = {"word_embedding": f32(r, vocab, h), "position_embedding": f32(r, 16, h),
             "segment_embedding": f32(r, 2, h) if with_segments else None, "gamma": f32(r, h), "beta": f32(r, h)}
    mask = np.ones((b, s), np.int32)
    mask[1, 4:] = 0
    inputs = {"input_ids": ids, "segment_ids": r.integers(0, 2, (b, s)).astype(np.int32) if with_segments else None,
              **inits, "mask": mask if with_mask else None}
    check(tmp_path, "EmbedLayerNormalization", inputs, n_outputs=3 if with_mask else ["y0", "", "y2"],
          attrs={"epsilon": 1e-5}, initializers={k: v for k, v in inits.items() if v is not None})


@pytest.mark.parametrize("variant", ["plain", "bias", "padding", "lengths", "attention_bias", "causal", "past"])
def test_multi_head_attention(tmp_path, r, variant):
    b, s, l, heads, d = 2, 4, 5, 2, 4
    hidden = heads * d
    inputs = {"query": f32(r, b, s, hidden), "key": f32(r, b, l, hidden), "value": f32(r, b, l, hidden)}
    attrs = {"num_heads": heads}
    n_outputs = 1
    if variant == "bias":
        inputs["bias"] = f32(r, 3 * hidden)
    if variant == "padding":
        mask = np.ones((b, l), np.int32)
        mask[1, 3:] = 0
        inputs.update(bias=None, key_padding_mask=mask)
    if variant == "lengths":
        inputs.update(bias=None, key_padding_mask=np.array([5, 2], np.int32))
    if variant == "attention_bias":
        inputs.update(bias=None, key_padding_mask=None, attention_bias=f32(r, 1, heads, s, l))
    if variant == "causal":
        inputs["key"], inputs["value"] = f32(r, b, s, hidden), f32(r, b, s, hidden)
        attrs["unidirectional"] = 1
    if variant == "past":
        inputs.update(bias=None, key_padding_mask=None, attention_bias=None, past_key=f32(r, b, heads, 3, d),
                      past_value=f32(r, b, heads, 3, d))
        n_outputs = 3
    check(tmp_path, "MultiHeadAttention", inputs, n_outputs=n_outputs, attrs=attrs, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("variant", ["plain", "raw_mask", "lengths", "causal_past", "qkv_sizes", "scale"])
def test_attention(tmp_path, r, variant):
    b, s, heads, d, width = 2, 5, 2, 4, 6
    hidden = heads * d
    inits = {"weights": f32(r, width, 3 * hidden, scale=0.5), "bias": f32(r, 3 * hidden)}
    inputs = {"input": f32(r, b, s, width), **inits}
    attrs = {"num_heads": heads}
    n_outputs = 1
    if variant == "raw_mask":
        mask = np.ones((b, s), np.int32)
        mask[0, 3:] = 0
        inputs["mask_index"] = mask
    if variant == "lengths":
        inputs["mask_index"] = np.array([5, 3], np.int32)
    if variant == "causal_past":
        inputs.update(mask_index=None, past=f32(r, 2, b, heads, 2, d))
        attrs["unidirectional"] = 1
        n_outputs = 2
    if variant == "qkv_sizes":
        inits["weights"], inits["bias"] = f32(r, width, 2 * hidden + 2 * heads), f32(r, 2 * hidden + 2 * heads)
        inputs.update(inits)
        attrs["qkv_hidden_sizes"] = [hidden, hidden, 2 * heads]
    if variant == "scale":
        attrs["scale"] = 0.3
    check(tmp_path, "Attention", inputs, n_outputs=n_outputs, attrs=attrs, initializers=inits, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("variant", ["float", "quantized", "per_column", "transposed"])
def test_qgemm(tmp_path, r, variant):
    m, k, n = 3, 8, 5
    inits = {"A": quantized(r, (m, k), np.uint8), "a_scale": np.asarray(np.float32(0.02)),
             "a_zp": np.asarray(np.uint8(128)), "B": quantized(r, (k, n), np.int8),
             "b_scale": np.asarray(np.float32(0.01)), "b_zp": np.asarray(np.int8(0)),
             "C": r.integers(-500, 500, (n,)).astype(np.int32)}
    attrs = {"alpha": 1.0}
    if variant == "per_column":
        inits["b_scale"] = np.linspace(0.005, 0.02, n).astype(np.float32)
        inits["b_zp"] = np.zeros(n, np.int8)
    if variant == "transposed":
        inits["B"] = np.ascontiguousarray(inits["B"].T)
        attrs["transB"] = 1
    if variant == "quantized":
        inits.update(y_scale=np.asarray(np.float32(0.05)), y_zp=np.asarray(np.uint8(100)))
        check_quantized(tmp_path, "QGemm", inits, attrs=attrs)
    else:
        check(tmp_path, "QGemm", inits, initializers=inits, attrs=attrs, rtol=1e-5, atol=1e-5)


def test_qattention(tmp_path, r):
    b, s, heads, d, width = 2, 5, 2, 4, 6
    mask = np.array([5, 3], np.int32)
    inits = {"input": quantized(r, (b, s, width), np.uint8), "weight": quantized(r, (width, 3 * heads * d), np.int8),
             "bias": f32(r, 3 * heads * d), "input_scale": np.asarray(np.float32(0.02)),
             "weight_scale": np.asarray(np.float32(0.01)), "mask_index": mask,
             "input_zero_point": np.asarray(np.uint8(128)), "weight_zero_point": np.asarray(np.int8(0))}
    check(tmp_path, "QAttention", inits, initializers=inits, attrs={"num_heads": heads}, rtol=1e-4, atol=1e-5)


def test_qembed_layer_normalization(tmp_path, r):
    b, s, h, vocab = 2, 6, 8, 20
    tables = {"word_embedding": (vocab, h), "position_embedding": (16, h), "segment_embedding": (2, h),
              "gamma": (h,), "beta": (h,)}
    inits = {f"{k}_quant": quantized(r, shape, np.uint8) for k, shape in tables.items()}
    inits.update({f"{k}_scale": np.asarray(np.float32(0.01 + 0.01 * i)) for i, k in enumerate(tables)})
    inits.update({f"{k}_zero_point": np.asarray(np.uint8(120 + i)) for i, k in enumerate(tables)})
    mask = np.ones((b, s), np.int32)
    mask[0, 4:] = 0
    inputs = {"input_ids": r.integers(0, vocab, (b, s)).astype(np.int32),
              "segment_ids": r.integers(0, 2, (b, s)).astype(np.int32),
              **{f"{k}_quant": inits[f"{k}_quant"] for k in tables}, "mask": mask,
              **{f"{k}_scale": inits[f"{k}_scale"] for k in tables},
              **{f"{k}_zero_point": inits[f"{k}_zero_point"] for k in tables}}
    check(tmp_path, "QEmbedLayerNormalization", inputs, n_outputs=2, attrs={"epsilon": 1e-5}, initializers=inits,
          rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("variant", ["prompt", "padded_prompt", "decode", "packed"])
def test_group_query_attention(tmp_path, r, variant):
    b, s, heads, kv, d = 2, 4, 4, 2, 8
    past = 3 if variant == "decode" else 0
    if variant == "decode":
        s = 1  # one new token per sequence after the past (onnxruntime takes more only for one sequence)
    lengths = np.full(b, past + s - 1, np.int32)
    if variant == "padded_prompt":
        lengths[1] = 2  # the second sequence is 3 tokens long, padded on the right
    inputs = {"query": f32(r, b, s, heads * d), "key": f32(r, b, s, kv * d), "value": f32(r, b, s, kv * d)}
    if variant == "packed":
        inputs = {"query": f32(r, b, s, (heads + 2 * kv) * d), "key": None, "value": None}
    if variant == "decode":
        inputs.update(past_key=f32(r, b, kv, past, d), past_value=f32(r, b, kv, past, d))
    else:
        inputs.update(past_key=None, past_value=None)
    inits = {"seqlens_k": lengths, "total_sequence_length": np.asarray(np.int32(past + s))}
    inputs.update(inits)
    got, want = check(tmp_path, "GroupQueryAttention", inputs, n_outputs=3, initializers=inits,
                      attrs={"num_heads": heads, "kv_num_heads": kv}, compare=[1, 2], rtol=1e-5, atol=1e-5)
    y, ref = got[0].numpy(), want[0]
    if variant == "padded_prompt":  # the padded positions' outputs are not defined
        y, ref = y[:, :3], ref[:, :3]
    np.testing.assert_allclose(y, ref, rtol=1e-4, atol=1e-5)
