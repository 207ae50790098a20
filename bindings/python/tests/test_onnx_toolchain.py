"""onnxruntime's own tools on models braid exports, and braid on what they write: the transformer
optimizer (com.microsoft fused ops), dynamic quantisation (DynamicQuantizeLinear, MatMulInteger,
ConvInteger) and the 4-bit weight quantizer (MatMulNBits); braid's outputs against onnxruntime's on
the same files."""
import os

import numpy as np
import pytest

import braid
from braid import nn

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")
quantization = pytest.importorskip("onnxruntime.quantization")
transformers_optimizer = pytest.importorskip("onnxruntime.transformers.optimizer")


def ops_of(path):
    return sorted({(n.domain or "ai.onnx", n.op_type) for n in onnx.load(str(path)).graph.node})


def same_as_onnxruntime(path, x, rtol=1e-4, atol=1e-4):
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    (want,) = ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"]).run(None, {"input": x.numpy()})
    (got,) = braid.onnx.load(str(path), frozen=True).run([x])
    np.testing.assert_allclose(got.numpy(), want, rtol=rtol, atol=atol, err_msg=str(path))
    return got.numpy(), want


class Encoder(nn.Module):
    """A BERT-shaped block: a Transformer encoder layer with GELU and a classification head."""

    def __init__(self):
        super().__init__()
        self.layer = nn.TransformerEncoderLayer(32, 4, dim_feedforward=64, dropout=0.0, activation="gelu",
                                                batch_first=True)
        self.head = nn.Linear(32, 3)

    def forward(self, x):
        return self.head(self.layer(x))


@pytest.fixture(scope="module")
def encoder(tmp_path_factory):
    braid.manual_seed(0)
    model = Encoder()
    model.eval()
    x = braid.randn(2, 7, 32)
    path = tmp_path_factory.mktemp("toolchain") / "encoder.onnx"
    braid.onnx.export(model, x, str(path))
    return path, x


@pytest.fixture(scope="module")
def optimized(encoder):
    """The transformer optimizer's file: its fusions in Python (opt_level 0: no onnxruntime pass,
    which would need PyTorch to look for a GPU), which also folds the weights' Transposes."""
    path, _ = encoder
    out = path.with_name("encoder_opt.onnx")
    transformers_optimizer.optimize_model(str(path), model_type="bert", num_heads=4, hidden_size=32,
                                          opt_level=0).save_model_to_file(str(out))
    return out


def test_the_transformer_optimizer_then_dynamic_quantization(encoder, optimized):
    path, x = encoder
    assert ("com.microsoft", "Gelu") in ops_of(optimized)
    same_as_onnxruntime(optimized, x)
    quantized = path.with_name("encoder_opt_q.onnx")
    quantization.quantize_dynamic(str(optimized), str(quantized), weight_type=quantization.QuantType.QInt8,
                                  extra_options={"DefaultTensorType": onnx.TensorProto.FLOAT})
    assert {("ai.onnx", "DynamicQuantizeLinear"), ("ai.onnx", "MatMulInteger")} <= set(ops_of(quantized))
    got, want = same_as_onnxruntime(quantized, x)
    assert np.abs(got - want).max() <= 1e-5  # the same integer arithmetic


def test_the_4bit_quantizer_on_the_encoder(encoder, optimized):
    path, x = encoder
    nbits = pytest.importorskip("onnxruntime.quantization.matmul_nbits_quantizer")
    quantizer = nbits.MatMulNBitsQuantizer(onnx.load(str(optimized)), bits=4, block_size=16, is_symmetric=False)
    quantizer.process()
    out = path.with_name("encoder_4bit.onnx")
    quantizer.model.save_model_to_file(str(out))
    assert ("com.microsoft", "MatMulNBits") in ops_of(out)
    same_as_onnxruntime(out, x)


def test_dynamic_quantization_of_a_cnn(tmp_path):
    braid.manual_seed(1)
    model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2), nn.Conv2d(8, 8, 3, padding=1),
                          nn.ReLU(), nn.Flatten(), nn.Linear(8 * 4 * 4, 5))
    model.eval()
    x = braid.randn(2, 3, 8, 8)
    path = tmp_path / "cnn.onnx"
    braid.onnx.export(model, x, str(path))
    quantized = tmp_path / "cnn_q.onnx"
    quantization.quantize_dynamic(str(path), str(quantized), weight_type=quantization.QuantType.QUInt8,
                                  op_types_to_quantize=["Conv", "MatMul", "Gemm"])
    ops = set(ops_of(quantized))
    assert ("ai.onnx", "ConvInteger") in ops and ("ai.onnx", "DynamicQuantizeLinear") in ops, ops
    same_as_onnxruntime(quantized, x)


@pytest.mark.parametrize("per_channel", [False, True])
def test_dynamic_quantization_of_an_lstm_tagger(tmp_path, per_channel):
    """An LSTM tagger (token embeddings, a bidirectional LSTM, a tag per token). quantize_dynamic
    turns the LSTM into com.microsoft.DynamicQuantizeLSTM. braid dequantises its
    int8 weights and runs the float LSTM, where onnxruntime also quantises the input and the hidden
    state to uint8 at each product: the outputs agree to that quantisation's error (here about 1% of
    their range), and both stay as close to the float model."""
    braid.manual_seed(2)
    # braid's layers in a Sequential export as ONNX's own LSTM (a Python forward would be traced
    # into its primitive ops, which the quantizer does not see as an LSTM)
    model = nn.Sequential(nn.Embedding(30, 16), nn.LSTM(16, 12, batch_first=True, bidirectional=True),
                          nn.Linear(24, 5))
    model.eval()
    ids = braid.tensor(np.random.default_rng(3).integers(0, 30, (2, 9)), dtype=braid.int64)
    path = tmp_path / "tagger.onnx"
    braid.onnx.export(model, ids, str(path))
    # onnxruntime's recommended preprocessing folds the exported gate reordering into the weights
    prepared = tmp_path / "tagger_pre.onnx"
    from onnxruntime.quantization.shape_inference import quant_pre_process
    quant_pre_process(str(path), str(prepared), skip_symbolic_shape=True)
    quantized = tmp_path / "tagger_q.onnx"
    quantization.quantize_dynamic(str(prepared), str(quantized), weight_type=quantization.QuantType.QInt8,
                                  per_channel=per_channel)  # a scale per gate column, or one per direction
    assert ("com.microsoft", "DynamicQuantizeLSTM") in ops_of(quantized)
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    (want,) = ort.InferenceSession(str(quantized), so, providers=["CPUExecutionProvider"]).run(
        None, {"input": ids.numpy()})
    (got,) = braid.onnx.load(str(quantized), frozen=True).run([ids])
    float_out = model(ids).detach().numpy()
    span = np.abs(float_out).max()
    assert np.abs(got.numpy() - want).max() <= 0.02 * span, (np.abs(got.numpy() - want).max(), span)
    assert np.abs(got.numpy() - float_out).max() <= 0.02 * span


CACHE = braid.knob_value("BRAID_MODEL_CACHE")
MINILM = os.path.join(CACHE, "minilm_l3", "model.onnx")


@pytest.mark.skipif(not os.path.exists(MINILM), reason=f"no {MINILM}: run scripts/setup_pretrained.sh")
def test_the_transformer_optimizer_on_a_pretrained_encoder(tmp_path):
    """The real thing: the pretrained MiniLM encoder (a PyTorch export from a PyPI package) through
    onnxruntime's transformer optimizer, which fuses it into com.microsoft's EmbedLayerNormalization,
    Attention, SkipLayerNormalization and BiasGelu; braid runs the result as onnxruntime does, with
    a padded second sentence, and then the optimized file dynamically quantized (QEmbedLayerNormalization,
    QAttention, DynamicQuantizeLinear + MatMulInteger)."""
    optimized = tmp_path / "minilm_opt.onnx"
    transformers_optimizer.optimize_model(MINILM, model_type="bert", num_heads=0, hidden_size=0,
                                          opt_level=0).save_model_to_file(str(optimized))
    fused = {op for domain, op in ops_of(optimized) if domain == "com.microsoft"}
    assert {"EmbedLayerNormalization", "Attention", "SkipLayerNormalization", "BiasGelu"} <= fused, fused
    quantized = tmp_path / "minilm_opt_int8.onnx"
    quantization.quantize_dynamic(str(optimized), str(quantized), weight_type=quantization.QuantType.QInt8,
                                  extra_options={"DefaultTensorType": onnx.TensorProto.FLOAT})
    assert {"QEmbedLayerNormalization", "QAttention"} <= {op for d, op in ops_of(quantized) if d == "com.microsoft"}
    for path in (optimized, quantized):
        so = ort.SessionOptions()
        so.intra_op_num_threads = 1
        sess = ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
        ids = (np.arange(32).reshape(2, 16) % 1000 + 1000).astype(np.int64)
        mask = np.ones((2, 16), np.int64)
        mask[1, 11:] = 0
        feeds = {i.name: mask if "mask" in i.name else ids for i in sess.get_inputs()}
        want = sess.run(None, feeds)
        got = braid.onnx.load(str(path), frozen=True).run([braid.tensor(feeds[i.name], dtype=braid.int64)
                                                            for i in sess.get_inputs()])
        assert len(got) == len(want)
        # The quantized file: an activation within a float32 rounding of a quantisation boundary
        # lands one uint8 step apart in the two libraries (the fused ops' outputs agree to 1e-5
        # layer by layer), which moves the last layer's outputs by up to about 1% of their range.
        tolerance = 1e-4 if path == optimized else 1e-2
        for g, w in zip(got, want):
            np.testing.assert_allclose(g.numpy(), w, rtol=tolerance, atol=tolerance, err_msg=str(path))
