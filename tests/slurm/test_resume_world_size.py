"""Restarting a data-parallel run at another world size (Note [Preemption]): braid-train stopped
after step 10 of 32 at 2 ranks and resumed at 1, 2 and 4 ranks ends with the weights of an
uninterrupted one-process run, to float32 reassociation. The loader's position is a global batch,
the same samples at every world size; a resume that repeated or skipped one batch of the 64-sample
global batches would move the weights by far more than the tolerance (checked below by resuming
from a checkpoint one step off).

Runs through mpiexec, so it needs no Slurm; the model is the zoo's MLP, since the CNN's BatchNorm
computes per-rank statistics without --sync-bn and so differs from one process by design.
Checkpoints are read with braid's Python module.
"""

import os
import shutil
import subprocess

import pytest

from conftest import BUILD

TRAIN = os.path.join(BUILD, "model_zoo", "braid-train")
ARGS = ["--limit", "1024", "--epochs", "2", "--batch-size", "64", "--threads", "1", "--model", "mlp"]


def train(out, ranks, *extra):
    cmd = [TRAIN, *ARGS, "--out", str(out), *extra]
    if ranks > 1:
        cmd = ["mpiexec", "-n", str(ranks), *cmd]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300,
                       env=dict(os.environ, OMP_NUM_THREADS="1", BRAID_NUM_THREADS="1"))
    assert r.returncode == 0, f"{' '.join(cmd)}: exit {r.returncode}\n{r.stdout[-2000:]}\n{r.stderr[-2000:]}"
    return r.stdout


def weights(braid, path):
    ck = braid.checkpoint.load(str(path))
    return ck, {k: t.numpy().copy() for k, t in ck.tensors.items() if k.startswith("model.")}


def rel_diff(a, b):
    import numpy as np
    return max(float(np.abs(a[k] - b[k]).max() / (np.abs(a[k]).max() + 1e-12)) for k in a)


def test_a_run_stopped_at_2_ranks_resumes_at_1_2_and_4(braid_py, tmp_path):
    train(tmp_path / "one", 1)
    _, reference = weights(braid_py, tmp_path / "one" / "checkpoint.braid")

    stopped = tmp_path / "stopped"
    out = train(stopped, 2, "--stop-at-step", "10")
    assert "stopped after step 10" in out, out
    ck, _ = weights(braid_py, stopped / "checkpoint.braid")
    assert (ck.integers["step"], ck.integers["loader.epoch"], ck.integers["loader.batch"]) == (10, 0, 10)

    for ranks in (1, 2, 4):
        run = tmp_path / f"resumed-{ranks}"
        shutil.copytree(stopped, run)
        out = train(run, ranks, "--resume", str(run / "checkpoint.braid"))
        assert "at step 10 (epoch 1, batch 10 of 16)" in out, out
        ck, w = weights(braid_py, run / "checkpoint.braid")
        assert ck.integers["step"] == 32, ck.integers
        assert rel_diff(w, reference) < 1e-4, f"resumed at {ranks} ranks: weights differ by {rel_diff(w, reference)}"

    # The tolerance tells a right resume from one a batch off: resuming from the checkpoint of step 9
    # while claiming step 10's position (skipping one global batch) moves the weights far more.
    off = tmp_path / "off"
    train(off, 2, "--stop-at-step", "9")
    ck9 = braid_py.checkpoint.load(str(off / "checkpoint.braid"))
    ck9.integers["loader.batch"] = 10
    ck9.integers["step"] = 10
    braid_py.checkpoint.save(str(off / "checkpoint.braid"), ck9)
    train(off, 1, "--resume", str(off / "checkpoint.braid"))
    _, w = weights(braid_py, off / "checkpoint.braid")
    assert rel_diff(w, reference) > 1e-3, "skipping a batch went unnoticed at this tolerance"


def test_a_sharded_run_resumes_at_other_world_sizes_and_stages(braid_py, tmp_path):
    """--zero-stage: each rank writes its shard and rank 0 joins them into checkpoint.braid, in the
    unsharded format (Note [Checkpoints of a sharded run]), so a ZeRO stage 2 run stopped at step 10
    of 32 at 2 ranks resumes at 1 rank without sharding, at 2 ranks at stage 3 and at 4 ranks at
    stage 1, each ending with the uninterrupted one-process run's weights, as the unsharded resume
    does (the same tolerance)."""
    train(tmp_path / "one", 1)
    _, reference = weights(braid_py, tmp_path / "one" / "checkpoint.braid")
    stopped = tmp_path / "stopped"
    out = train(stopped, 2, "--stop-at-step", "10", "--zero-stage", "2")
    assert "stopped after step 10" in out, out
    ck, _ = weights(braid_py, stopped / "checkpoint.braid")
    assert (ck.integers["step"], ck.integers["loader.batch"]) == (10, 10)
    assert any(k.startswith("optim.state.") for k in ck.tensors), sorted(ck.tensors)[:10]  # Adam's, joined
    for ranks, stage in ((1, 0), (2, 3), (4, 1)):
        run = tmp_path / f"resumed-{ranks}-zero{stage}"
        shutil.copytree(stopped, run)
        out = train(run, ranks, "--resume", str(run / "checkpoint.braid"), "--zero-stage", str(stage))
        assert "at step 10 (epoch 1, batch 10 of 16)" in out, out
        ck, w = weights(braid_py, run / "checkpoint.braid")
        assert ck.integers["step"] == 32, ck.integers
        assert rel_diff(w, reference) < 1e-4, f"{ranks} ranks, stage {stage}: weights differ by {rel_diff(w, reference)}"


def joined_shards(braid, manifest):
    """The whole model's parameters joined in Python from a sharded run's rank files (each holds, per
    parameter, its piece of the flattened tensor at "model.<name>.offset", and the shape), and the
    rank files themselves: independent of ShardedDataParallel::unshard."""
    import numpy as np
    m = braid.checkpoint.load(str(manifest))
    files = [braid.checkpoint.load(str(manifest.parent / m.strings[f"file.{r}"])) for r in range(m.integers["ranks"])]
    flat, shapes, covered = {}, {}, {}
    for ck in files:
        for k, t in ck.tensors.items():
            if not k.startswith("model.") or k.endswith(".shape"):
                continue
            shape = tuple(int(d) for d in ck.tensors[k + ".shape"].numpy())
            piece, off = t.numpy().reshape(-1), ck.integers[k + ".offset"]
            flat.setdefault(k, np.zeros(int(np.prod(shape)), piece.dtype))[off:off + piece.size] = piece
            shapes[k], covered[k] = shape, covered.get(k, 0) + piece.size
    assert all(covered[k] == flat[k].size for k in flat), covered
    return {k: v.reshape(shapes[k]) for k, v in flat.items()}, files


def test_a_stage_3_run_resumes_from_its_shards_alone(braid_py, tmp_path):
    """Note [Resuming from a sharded run]: every rank's shard file carries the run's state, so a ZeRO
    stage 3 run stopped at step 10 of 32 at 2 ranks resumes from its checkpoint.shards alone
    (checkpoint.braid deleted) at 1 rank unsharded, 2 ranks at stage 2 and 4 ranks at stage 3, each
    ending with the uninterrupted one-process run's weights; a folder --resume whose checkpoint.braid
    is a step behind the shards (a job killed between the two writes) takes the shards; a stage-0
    run's checkpoint resumes at stage 3. Uninterrupted, stage 3 at 2 ranks ends with the one-process
    weights and evaluates (units gathered under no_grad) to its test loss and accuracy."""
    import csv
    train(tmp_path / "one", 1)
    _, reference = weights(braid_py, tmp_path / "one" / "checkpoint.braid")
    train(tmp_path / "whole", 2, "--zero-stage", "3")
    _, w = weights(braid_py, tmp_path / "whole" / "checkpoint.braid")
    assert rel_diff(w, reference) < 1e-4, f"stage 3 uninterrupted: weights differ by {rel_diff(w, reference)}"
    logs = [list(csv.DictReader(open(tmp_path / run / "log.csv"))) for run in ("one", "whole")]
    assert len(logs[0]) == len(logs[1]) == 2, logs
    for a, b in zip(*logs):
        assert abs(float(a["test_loss"]) - float(b["test_loss"])) < 1e-4 * float(a["test_loss"]), (a, b)
        assert abs(float(a["test_accuracy"]) - float(b["test_accuracy"])) <= 2e-4, (a, b)  # 2 of 10,000 images

    stopped = tmp_path / "stopped"
    out = train(stopped, 2, "--stop-at-step", "10", "--zero-stage", "3")
    assert "stopped after step 10" in out, out
    joined, files = joined_shards(braid_py, stopped / "checkpoint.shards")
    for ck in files:
        assert (ck.integers["step"], ck.integers["loader.batch"], ck.integers["zero_stage"]) == (10, 10, 3)
    _, plain = weights(braid_py, stopped / "checkpoint.braid")
    assert set(joined) == set(plain) and all((joined[k] == plain[k]).all() for k in plain)
    for ranks, stage in ((1, 0), (2, 2), (4, 3)):
        run = tmp_path / f"shards-{ranks}-zero{stage}"
        shutil.copytree(stopped, run)
        os.remove(run / "checkpoint.braid")
        out = train(run, ranks, "--resume", str(run / "checkpoint.shards"), "--zero-stage", str(stage))
        assert f"resumed from {run / 'checkpoint.shards'} at step 10 (epoch 1, batch 10 of 16)" in out, out
        ck, w = weights(braid_py, run / "checkpoint.braid")
        assert ck.integers["step"] == 32, ck.integers
        assert rel_diff(w, reference) < 1e-4, f"{ranks} ranks, stage {stage}: weights differ by {rel_diff(w, reference)}"
        # The unsharded run's checkpoint.braid supersedes the shards, which it removes.
        assert (stage == 0) == (not list(run.glob("checkpoint.shards*"))), sorted(os.listdir(run))

    behind = tmp_path / "behind"
    train(behind, 2, "--stop-at-step", "9", "--zero-stage", "3")
    run = tmp_path / "killed-between-writes"
    shutil.copytree(stopped, run)
    shutil.copy(behind / "checkpoint.braid", run / "checkpoint.braid")
    out = train(run, 2, "--resume", str(run), "--zero-stage", "3")
    assert f"resumed from {run / 'checkpoint.shards'} at step 10 " in out, out
    _, w = weights(braid_py, run / "checkpoint.braid")
    assert rel_diff(w, reference) < 1e-4, f"folder resume: weights differ by {rel_diff(w, reference)}"

    plain_run = tmp_path / "plain"
    train(plain_run, 2, "--stop-at-step", "10")
    out = train(plain_run, 4, "--resume", str(plain_run), "--zero-stage", "3")
    assert f"resumed from {plain_run / 'checkpoint.braid'} at step 10 " in out, out
    _, w = weights(braid_py, plain_run / "checkpoint.braid")
    assert rel_diff(w, reference) < 1e-4, f"stage 0 -> 3: weights differ by {rel_diff(w, reference)}"



def test_stage_3_exports_the_gathered_model_and_refuses_fp16(tmp_path):
    """At stage 3 each unit's parameters are freed outside its forward; at the end braid-train gathers
    them back (Replicas::finish) before --export-onnx, so the ONNX file is the one DistributedDataParallel
    writes at the same world size, byte for byte (reduce-scatter and all-reduce sum 2 ranks' gradients
    alike). --amp fp16 (loss scaling) is refused up front with sharding."""
    for name, extra in (("ddp", []), ("zero3", ["--zero-stage", "3"])):
        train(tmp_path / name, 2, "--epochs", "1", "--export-onnx", str(tmp_path / f"{name}.onnx"), *extra)
    assert (tmp_path / "zero3.onnx").read_bytes() == (tmp_path / "ddp.onnx").read_bytes()
    r = subprocess.run([TRAIN, *ARGS, "--out", str(tmp_path / "fp16"), "--zero-stage", "2", "--amp", "fp16"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 1 and "--amp fp16 needs loss scaling" in r.stderr, r.stderr
    assert not (tmp_path / "fp16").exists(), "refused before any work"

def merged_stage_weights(braid, folder):
    """The whole model's weights from a pipelined run's per-stage checkpoints."""
    import glob
    first = braid.checkpoint.load(str(folder / "checkpoint.stage0.braid"))
    stages = first.integers["pipeline.stages"]
    files = sorted(glob.glob(str(folder / "checkpoint.stage*.braid")))
    assert len(files) == stages, f"{folder}: {files} for {stages} stages"  # no stale files of another run
    out = {}
    for s in range(stages):
        ck = braid.checkpoint.load(str(folder / f"checkpoint.stage{s}.braid"))
        assert (ck.integers["pipeline.stage"], ck.integers["pipeline.stages"]) == (s, stages)
        out.update({k: t.numpy().copy() for k, t in ck.tensors.items() if k.startswith("model.")})
    return out, stages


def test_a_pipelined_run_resumes_with_another_stage_count(braid_py, tmp_path):
    """Note [Resuming with another stage count]: the per-stage checkpoints of a K-stage run are merged
    and cut again for K' stages. 1F1B runs the same micro-batches through the same layers in the same
    order whatever the cuts, so the result equals the uninterrupted run's bit for bit."""
    args = ["--pipeline-stages"]
    common = ["--limit", "1024", "--epochs", "2", "--batch-size", "64", "--micro-batches", "4"]

    def pipe(out, stages, *extra):
        cmd = ["mpiexec", "-n", str(stages), TRAIN, *common, "--threads", "1", *args, str(stages), "--out", str(out),
               *extra]
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=300,
                           env=dict(os.environ, OMP_NUM_THREADS="1", BRAID_NUM_THREADS="1"))
        assert r.returncode == 0, f"{' '.join(cmd)}: exit {r.returncode}\n{r.stdout[-2000:]}\n{r.stderr[-2000:]}"
        return r.stdout

    pipe(tmp_path / "ref", 2)
    reference, _ = merged_stage_weights(braid_py, tmp_path / "ref")
    # At an epoch's end, and mid-epoch (step 10 of the first epoch's 16, as a preemption leaves it).
    for before, after, stop in ((2, 4, "--stop-after"), (2, 3, "--stop-after"), (4, 2, "--stop-after"),
                                (2, 4, "--stop-at-step"), (4, 3, "--stop-at-step")):
        run = tmp_path / f"{before}-to-{after}{stop}"
        out = pipe(run, before, stop, "1" if stop == "--stop-after" else "10")
        if stop == "--stop-at-step":
            assert "stopped after step 10 (--stop-at-step; epoch 1, batch 10 of 16)" in out, out
        out = pipe(run, after, "--resume", str(run))
        assert f"resuming the {before}-stage run" in out and f"with {after} stages" in out, out
        weights, stages = merged_stage_weights(braid_py, run)
        assert stages == after
        assert set(weights) == set(reference)
        same = [k for k in reference if (weights[k] == reference[k]).all()]
        assert len(same) == len(reference), f"{before} -> {after} stages: {sorted(set(reference) - set(same))} differ"


def test_a_sharded_pipeline_grid_stops_and_resumes_bitwise(braid_py, tmp_path):
    """--zero-stage across the replicas of a 2 x 2 grid: every replica writes its shard of its stage and
    the first joins them, so the stage files are those of data parallelism, byte for byte. Stopped at
    step 10 at stage 2, the run resumes at stage 1 on the same grid, ending with the uninterrupted
    run's weights bit for bit, and on one replica of 2 stages without sharding, ending with them to
    float32 reassociation (one replica sums what two averaged). The MLP, since BatchNorm's
    statistics are per replica."""
    common = ["--model", "mlp", "--limit", "1024", "--epochs", "2", "--batch-size", "64", "--micro-batches", "4",
              "--threads", "1", "--pipeline-stages", "2"]

    def pipe(out, ranks, *extra):
        cmd = ["mpiexec", "-n", str(ranks), TRAIN, *common, "--out", str(out), *extra]
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=300,
                           env=dict(os.environ, OMP_NUM_THREADS="1", BRAID_NUM_THREADS="1"))
        assert r.returncode == 0, f"{' '.join(cmd)}: exit {r.returncode}\n{r.stdout[-2000:]}\n{r.stderr[-2000:]}"
        return r.stdout

    pipe(tmp_path / "ddp", 4)
    pipe(tmp_path / "zero2", 4, "--zero-stage", "2")
    for s in (0, 1):
        name = f"checkpoint.stage{s}.braid"
        assert (tmp_path / "zero2" / name).read_bytes() == (tmp_path / "ddp" / name).read_bytes(), name
    reference, _ = merged_stage_weights(braid_py, tmp_path / "ddp")
    for ranks, extra in ((4, ["--zero-stage", "1"]), (2, [])):
        run = tmp_path / f"resumed-{ranks}"
        out = pipe(run, 4, "--zero-stage", "2", "--stop-at-step", "10")
        assert "stopped after step 10" in out, out
        pipe(run, ranks, "--resume", str(run), *extra)
        weights, _ = merged_stage_weights(braid_py, run)
        assert set(weights) == set(reference)
        if ranks == 4:
            differ = sorted(k for k in reference if not (weights[k] == reference[k]).all())
            assert not differ, f"resumed at stage 1: {differ} differ"
        else:
            assert rel_diff(weights, reference) < 1e-4, f"resumed on one replica: {rel_diff(weights, reference)}"


def test_a_stage_1_pipeline_grid_resumes_with_another_stage_count(braid_py, tmp_path):
    """--zero-stage 1 on a 2 x 2 grid (2 replicas of 2 stages) stopped at step 10 of 32: its joined
    stage files resume on 1 replica of 4 stages (merged and cut again, Note [Resuming with another
    stage count]) and on the same grid at stage 1, ending with the uninterrupted unsharded 2 x 2 run's
    weights, to float32 reassociation and bit for bit."""
    common = ["--model", "mlp", "--limit", "1024", "--epochs", "2", "--batch-size", "64", "--micro-batches", "4",
              "--threads", "1"]

    def pipe(out, stages, *extra):
        cmd = ["mpiexec", "-n", "4", TRAIN, *common, "--pipeline-stages", str(stages), "--out", str(out), *extra]
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=300,
                           env=dict(os.environ, OMP_NUM_THREADS="1", BRAID_NUM_THREADS="1"))
        assert r.returncode == 0, f"{' '.join(cmd)}: exit {r.returncode}\n{r.stdout[-2000:]}\n{r.stderr[-2000:]}"
        return r.stdout

    pipe(tmp_path / "ddp", 2)
    reference, _ = merged_stage_weights(braid_py, tmp_path / "ddp")
    for stages, extra in ((4, []), (2, ["--zero-stage", "1"])):
        run = tmp_path / f"resumed-{stages}"
        out = pipe(run, 2, "--zero-stage", "1", "--stop-at-step", "10")
        assert "stopped after step 10 (--stop-at-step; epoch 1, batch 10 of 16)" in out, out
        out = pipe(run, stages, "--resume", str(run), *extra)
        weights, saved = merged_stage_weights(braid_py, run)
        assert saved == stages and set(weights) == set(reference)
        if stages == 2:
            differ = sorted(k for k in reference if not (weights[k] == reference[k]).all())
            assert not differ, f"resumed at stage 1: {differ} differ"
        else:
            assert "resuming the 2-stage run" in out and "with 4 stages" in out, out
            assert rel_diff(weights, reference) < 1e-4, f"resumed on 1 x 4: {rel_diff(weights, reference)}"
