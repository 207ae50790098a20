"""braid-onnx (tools/braid_onnx.cpp), run as a user runs it: inspect, run and bench on a small model
written with the onnx package, its outputs checked against onnxruntime's."""

import os
import re
import subprocess

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

BUILD = os.path.abspath(os.environ.get("BRAID_TEST_BUILD_DIR", os.path.join(os.path.dirname(__file__), "../../build")))
TOOL = os.path.join(BUILD, "tools", "braid-onnx")


def tool(*args, expect=0):
    r = subprocess.run([TOOL, *map(str, args)], capture_output=True, text=True, timeout=300,
                       env=dict(os.environ, BRAID_NUM_THREADS="1"))
    assert r.returncode == expect, f"braid-onnx {' '.join(map(str, args))}: exit {r.returncode}\n{r.stdout}\n{r.stderr}"
    return r.stdout + r.stderr


def small_cnn(path, extra_node=None):
    """x [N, 3, 8, 8] -> Conv 3x3 -> Relu -> GlobalAveragePool -> Flatten -> Gemm -> logits [N, 5],
    and the Relu output as a second output, features."""
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.standard_normal((4, 3, 3, 3)).astype(np.float32), "w")
    b = numpy_helper.from_array(rng.standard_normal(4).astype(np.float32), "b")
    fw = numpy_helper.from_array(rng.standard_normal((5, 4)).astype(np.float32), "fw")
    fb = numpy_helper.from_array(rng.standard_normal(5).astype(np.float32), "fb")
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1], name="conv"),
             helper.make_node("Relu", ["c"], ["features"], name="relu"),
             helper.make_node("GlobalAveragePool", ["features"], ["p"]),
             helper.make_node("Flatten", ["p"], ["f"]),
             helper.make_node("Gemm", ["f", "fw", "fb"], ["logits"], transB=1)]
    outputs = [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["N", 5]),
               helper.make_tensor_value_info("features", TensorProto.FLOAT, ["N", 4, 8, 8])]
    opsets = [helper.make_opsetid("", 17)]
    if extra_node is not None:
        nodes.append(extra_node)
        outputs.append(helper.make_tensor_value_info(extra_node.output[0], TensorProto.FLOAT, None))
        opsets.append(helper.make_opsetid(extra_node.domain, 1))
    g = helper.make_graph(nodes, "small_cnn", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, 8, 8])],
                          outputs, [w, b, fw, fb])
    # The onnx package's own IR version (14 for onnx 1.23), as a new user's file would have.
    model = helper.make_model(g, opset_imports=opsets, producer_name="braid-test")
    onnx.save(model, str(path))
    return path


def test_inspect_lists_inputs_outputs_opsets_and_ops(tmp_path):
    out = tool("inspect", small_cnn(tmp_path / "m.onnx"))
    assert re.search(r"x\s+float32\s+\[N, 3, 8, 8\]", out), out
    assert re.search(r"logits\s+float32\s+\[N, 5\]", out), out
    assert "ai.onnx 17" in out and "producer braid-test" in out, out
    assert "weights: 4 tensors, 137 elements" in out, out  # 108 + 4 + 20 + 5
    for op in ("Conv", "Relu", "GlobalAveragePool", "Flatten", "Gemm"):
        assert re.search(rf"^\s+{op}\s+1$", out, re.M), (op, out)
    assert "preflight: braid can run every node" in out, out


def test_inspect_reports_what_braid_cannot_run(tmp_path):
    foo = helper.make_node("Foo", ["logits"], ["y"], domain="com.example", name="custom")
    out = tool("inspect", small_cnn(tmp_path / "m.onnx", foo), expect=2)
    assert "ops: 5 nodes of 5 types" in out, out  # the standard ones
    assert "contrib ops (domains other than ai.onnx): 1 node of 1 type" in out, out
    assert re.search(r"^\s+com\.example:Foo\s+1  not run by braid$", out, re.M), out
    problems = out.split("preflight:")[1]
    assert "preflight: 1 problem" in out and "op 'com.example.Foo' is not supported" in problems, out
    assert "braid runs no op of domain 'com.example'" in problems and "braid-onnx ops all" in problems, out


def test_inspect_lists_onnxruntime_contrib_ops_apart(tmp_path):
    """A node of onnxruntime's com.microsoft domain, as its quantizer and transformer optimizer write
    them, is listed with the contrib ops and named with its domain by the preflight."""
    gelu = helper.make_node("FastGelu", ["logits"], ["y"], domain="com.microsoft", name="gelu")
    out = tool("inspect", small_cnn(tmp_path / "m.onnx", gelu))
    assert re.search(r"^\s+com\.microsoft:FastGelu\s+1$", out, re.M), out  # run by braid: no mark
    tok = helper.make_node("Tokenizer", ["logits"], ["y"], domain="com.microsoft", name="tok")
    out = tool("inspect", small_cnn(tmp_path / "m.onnx", tok), expect=2)
    assert re.search(r"^\s+com\.microsoft:Tokenizer\s+1  not run by braid$", out, re.M), out
    assert re.search(r"^\s+Conv\s+1$", out, re.M), out
    assert re.search(r"Tokenizer 'tok': op 'com.microsoft.Tokenizer' is not supported: "
                     r"braid runs \d+ ops of domain 'com.microsoft' \(`braid-onnx ops com.microsoft` lists them\)", out), out


def test_ops_lists_what_braid_runs():
    out = tool("ops")
    header, *rows = out.strip().splitlines()
    count = int(header.split()[0])
    assert count == len(rows) and count >= 150, out[:500]
    names = [r.split()[0] for r in rows]
    assert names == sorted(names) and {"Conv", "Gemm", "LSTM", "DynamicQuantizeLinear"} <= set(names)
    assert re.search(r"^  Conv\s+1 on$", out, re.M), out
    assert tool("ops", "all").startswith("ai.onnx")
    out = tool("ops", "com.example", expect=2)
    assert "braid runs no op of domain 'com.example'" in out, out


def test_a_domain_imported_twice_at_one_version_loads(tmp_path):
    """Model-merging scripts write the default domain twice at one version; onnxruntime runs such a
    file, and so does braid. Two versions of one domain are refused, naming both."""
    model = onnx.load(str(small_cnn(tmp_path / "m.onnx")))
    model.opset_import.append(helper.make_opsetid("", 17))
    onnx.save(model, str(tmp_path / "twice.onnx"))
    ort.InferenceSession(str(tmp_path / "twice.onnx"), providers=["CPUExecutionProvider"])  # the reference accepts it
    assert "preflight: braid can run every node" in tool("inspect", tmp_path / "twice.onnx")
    model.opset_import[-1].version = 16
    onnx.save(model, str(tmp_path / "conflict.onnx"))
    out = tool("inspect", tmp_path / "conflict.onnx", expect=3)
    assert "opset domain 'ai.onnx' is imported twice, at versions 17 and 16" in out, out


def test_run_matches_onnxruntime_and_compares_with_references(tmp_path):
    model = small_cnn(tmp_path / "m.onnx")
    x = np.random.default_rng(1).standard_normal((3, 3, 8, 8)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    out = tool("run", model, "--input", f"x={tmp_path / 'x.npy'}", "--out", tmp_path / "braid")
    assert re.search(r"logits\s+float32 \[3, 5\]", out), out
    logits, features = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"]).run(None, {"x": x})
    np.testing.assert_allclose(np.load(tmp_path / "braid" / "logits.npy"), logits, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(np.load(tmp_path / "braid" / "features.npy"), features, rtol=1e-5, atol=1e-5)

    ref = tmp_path / "ort"
    ref.mkdir()
    np.save(ref / "logits.npy", logits)
    np.save(ref / "features.npy", features)
    out = tool("run", model, "--input", f"x={tmp_path / 'x.npy'}", "--compare", ref)
    assert "all outputs match" in out and len(re.findall(r"\bok: max", out)) == 2, out

    bad = logits.copy()
    bad[1, 2] += 0.01
    np.save(tmp_path / "bad.npy", bad)
    out = tool("run", model, "--input", f"x={tmp_path / 'x.npy'}", "--expect", f"logits={tmp_path / 'bad.npy'}", expect=1)
    assert re.search(r"logits\s+MISMATCH: max \|diff\| 0\.01", out), out


def test_random_inputs_follow_dims_and_seed(tmp_path):
    model = small_cnn(tmp_path / "m.onnx")
    tool("run", model, "--dim", "N=4", "--seed", "7", "--out", tmp_path / "a")
    tool("run", model, "--dim", "N=4", "--seed", "7", "--out", tmp_path / "b")
    out = tool("run", model, "--shape", "x=2x3x8x8", "--seed", "8", "--out", tmp_path / "c")
    a, b, c = (np.load(tmp_path / d / "logits.npy") for d in "abc")
    assert a.shape == (4, 5) and c.shape == (2, 5), (a.shape, c.shape)
    np.testing.assert_array_equal(a, b)
    assert not np.allclose(a[:2], c), "another seed gave the same random input"
    assert "(random)" in out


def test_bench_times_each_batch_size_and_profiles_op_types(tmp_path):
    out = tool("bench", small_cnn(tmp_path / "m.onnx"), "--batch-sizes", "1,4", "--iters", "3")
    rows = re.findall(r"^\s+(\d+)\s+([0-9.]+)\s+([0-9.]+)\s+([0-9.]+)\s+([0-9.]+)$", out, re.M)
    assert [int(r[0]) for r in rows] == [1, 4], out
    assert all(float(r[2]) <= float(r[1]) <= float(r[3]) for r in rows), out  # min <= median <= p90
    profile = out.split("profile at batch 4")[1]
    # The Relu runs as the convolution's epilogue in inference (Note [Fusing activations into Conv]).
    for op in (r"Conv\+Relu", "Gemm"):
        assert re.search(rf"^{op}\s+1\.0\s", profile, re.M), (op, out)


def test_errors_name_what_was_wrong(tmp_path):
    model = small_cnn(tmp_path / "m.onnx")
    out = tool("run", tmp_path / "missing.onnx", expect=3)
    assert "missing.onnx" in out, out
    np.save(tmp_path / "y.npy", np.zeros((1, 3, 8, 8), np.float32))
    out = tool("run", model, "--input", f"y={tmp_path / 'y.npy'}", expect=3)
    assert "no input 'y'" in out, out
    out = tool("run", model, "--input", f"x={tmp_path / 'y.npy'}", "--expect", "nope=x.npy", expect=3)
    assert "'nope'" in out and "not an output" in out, out
    out = tool("frobnicate", model, expect=3)
    assert "unknown command 'frobnicate'" in out, out
