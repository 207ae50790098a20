"""The Python examples run end to end on real data (Fashion-MNIST from Debian's
dataset-fashion-mnist) in a quick configuration: data-parallel training under mpiexec -n 2 reaches a
known accuracy and writes a checkpoint and an ONNX file, and ONNX fine-tuning improves on its random
head with onnxruntime agreeing with braid."""

import os
import re
import shutil
import subprocess
import sys

import pytest

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
DATA = "/usr/share/datasets/fashion-mnist"

pytestmark = pytest.mark.skipif(not os.path.isdir(DATA), reason=f"no Fashion-MNIST at {DATA} (dataset-fashion-mnist)")


def run(cmd, timeout=300):
    env = dict(os.environ, OMP_NUM_THREADS="1")
    r = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
    assert r.returncode == 0, f"{' '.join(cmd)} failed ({r.returncode}):\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
    return r.stdout


@pytest.mark.skipif(shutil.which("mpiexec") is None, reason="no mpiexec")
def test_fashion_mnist_example_two_ranks(tmp_path):
    out = run(["mpiexec", "-n", "2", sys.executable, "examples/python/train_fashion_mnist.py", "--epochs", "1",
               "--limit", "3200", "--out", str(tmp_path), "--export-onnx", str(tmp_path / "cnn.onnx")])
    acc = float(re.search(r"final test accuracy ([0-9.]+)", out).group(1))
    assert acc >= 0.75, out  # 0.79 measured for this configuration; chance is 0.10
    assert (tmp_path / "checkpoint.braid").stat().st_size > 0
    ort = pytest.importorskip("onnxruntime")
    import numpy as np

    import braid

    sess = ort.InferenceSession(str(tmp_path / "cnn.onnx"), providers=["CPUExecutionProvider"])
    images = braid.data.load_mnist(DATA, False).inputs()[:64]
    (logits,) = sess.run(None, {"input": images.numpy()})
    assert logits.shape == (64, 10) and np.isfinite(logits).all()


def test_onnx_finetuning_example(tmp_path):
    pytest.importorskip("onnxruntime")
    out = run([sys.executable, "examples/python/finetune_onnx.py", "--pretrain-limit", "3000", "--train-limit", "1000",
               "--epochs", "2", "--out", str(tmp_path)])
    before = float(re.search(r"before fine-tuning[^0-9]*([0-9.]+)", out).group(1)) if "before fine-tuning" in out else 0.2
    after = float(re.search(r"test accuracy after fine-tuning: ([0-9.]+)", out).group(1))
    ort_acc = float(re.search(r"onnxruntime [0-9.]+: accuracy ([0-9.]+)", out).group(1))
    assert after >= 0.4 and after > before + 0.15, out  # 0.51 measured; a random 5-way head gives about 0.2
    assert ort_acc == pytest.approx(after, abs=1e-3), out
    assert "backbone weights unchanged by fine-tuning: True" in out
