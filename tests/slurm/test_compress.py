"""braid-train --compress and --local-sgd under mpiexec -n 2 (DistributedDataParallel's communication
hooks, braid/distributed/comm_hooks.h; LocalSGD, local_sgd.h): top-K of every entry trains to the
all-reduce's weights bit for bit, top-K of 1% sends what its formula says (k values and k int32
indices from each rank, gathered), and a spec it cannot read is refused with the forms it takes;
--ps 1 with --dynamic-batches at staleness 0 trains as DDP too; local SGD with H = 1 and outer SGD at rate 1 trains as data parallelism does (to rounding: SGD's
update is linear in the gradient), with H = 4 sends a quarter of the bytes, its checkpoint holds
the last synchronised parameters, and an epoch ends with a sync. Checkpoints are read with braid's
Python module; runs through mpiexec, so it needs no Slurm."""

import os
import re
import shutil
import subprocess

import numpy as np

from conftest import BUILD

TRAIN = os.path.join(BUILD, "model_zoo", "braid-train")
ARGS = ["--model", "mlp", "--limit", "1024", "--epochs", "1", "--batch-size", "64", "--threads", "1"]


def train(out, *extra, ok=True):
    cmd = ["mpiexec", "-n", "2", TRAIN, *ARGS, "--out", str(out), *extra]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300,
                       env=dict(os.environ, OMP_NUM_THREADS="1", BRAID_NUM_THREADS="1", BRAID_TIMEOUT="120"))
    if ok:
        assert r.returncode == 0, f"{' '.join(cmd)}: exit {r.returncode}\n{r.stdout[-2000:]}\n{r.stderr[-2000:]}"
    return r


def weights(braid, folder):
    ck = braid.checkpoint.load(str(folder / "checkpoint.braid"))
    return {k: t.numpy().copy() for k, t in ck.tensors.items() if k.startswith("model.")}


def test_topk_of_every_entry_is_the_all_reduce_bit_for_bit(braid_py, tmp_path):
    train(tmp_path / "plain")
    log = train(tmp_path / "topk", "--compress", "topk:1").stdout
    assert "between the replicas: top-k (ratio 1)" in log, log
    plain, topk = weights(braid_py, tmp_path / "plain"), weights(braid_py, tmp_path / "topk")
    assert plain.keys() == topk.keys()
    for k in plain:
        np.testing.assert_array_equal(topk[k], plain[k], err_msg=k)


def test_topk_sends_k_values_and_indices_per_rank(braid_py, tmp_path):
    log = train(tmp_path / "sparse", "--compress", "topk:0.01").stdout
    # The MLP's 235,146 parameters in one bucket: k = round(0.01 n) = 2,351 float32 values and int32
    # indices from each of the 2 ranks, gathered: 2 x 2,351 x 8 bytes per step.
    m = re.search(r"communication: [\d.]+ KB per step per rank in collectives \(([\d.]+) KB all-reduce, ([\d.]+) KB "
                  r"all-gather\)", log)
    assert m, log
    assert float(m.group(2)) == round(2 * 2351 * 8 / 1024, 1), m.group(0)
    assert float(m.group(1)) < 0.1, m.group(0)  # only the metrics' few numbers
    plain = train(tmp_path / "plain").stdout
    dense = re.search(r"\(([\d.]+) KB all-reduce", plain)
    assert float(dense.group(1)) == round(235146 * 4 / 1024, 1), plain


def test_a_bad_spec_is_refused_naming_the_forms(tmp_path):
    r = train(tmp_path / "bad", "--compress", "topk:2", ok=False)
    assert r.returncode != 0
    assert "--compress 'topk:2' is not one of none, fp16, bf16, topk:RATIO, dgc:RATIO" in r.stdout + r.stderr
    r = train(tmp_path / "bad2", "--compress", "dgc:0.01", ok=False)
    assert "use --optimizer sgd" in r.stdout + r.stderr


def test_local_sgd_averages_every_h_steps_and_checkpoints_the_last_sync(braid_py, tmp_path):
    sgd = ["--optimizer", "sgd"]
    train(tmp_path / "ddp", *sgd)
    log = train(tmp_path / "h1", *sgd, "--local-sgd", "1", "--outer", "sgd", "--outer-lr", "1").stdout
    assert "local SGD: parameters averaged every 1 steps (outer sgd, rate 1)" in log, log
    ddp, h1 = weights(braid_py, tmp_path / "ddp"), weights(braid_py, tmp_path / "h1")
    for k in ddp:
        np.testing.assert_allclose(h1[k], ddp[k], rtol=0, atol=1e-5 * np.abs(ddp[k]).max(), err_msg=k)
    log = train(tmp_path / "h4", *sgd, "--local-sgd", "4").stdout
    m = re.search(r"\(([\d.]+) KB all-reduce", log)
    assert float(m.group(1)) == round(235146 * 4 / 4 / 1024, 1), log
    # Stopped at step 10 (H = 4: the last synchronisation after step 8), the checkpoint's parameters
    # are step 8's synchronised ones, which a run stopped at step 8 also writes.
    train(tmp_path / "at8", *sgd, "--local-sgd", "4", "--stop-at-step", "8")
    train(tmp_path / "at10", *sgd, "--local-sgd", "4", "--stop-at-step", "10")
    at8, at10 = weights(braid_py, tmp_path / "at8"), weights(braid_py, tmp_path / "at10")
    for k in at8:
        if k.startswith("model."):
            np.testing.assert_array_equal(at10[k], at8[k], err_msg=k)
    ck = braid_py.checkpoint.load(str(tmp_path / "at10" / "checkpoint.braid"))
    assert (ck.integers["localsgd.syncs"], ck.integers["step"]) == (2, 10)
    # H = 5 over the epoch's 16 steps: syncs after steps 5, 10 and 15, and one at the epoch's end so
    # that the evaluated and saved model is the average (the checkpoint's parameters its anchor).
    train(tmp_path / "h5", *sgd, "--local-sgd", "5")
    ck = braid_py.checkpoint.load(str(tmp_path / "h5" / "checkpoint.braid"))
    assert (ck.integers["localsgd.syncs"], ck.integers["localsgd.local_steps"]) == (4, 0)


def test_a_synchronous_parameter_server_trains_as_data_parallelism(braid_py, tmp_path):
    """--ps 1 at 3 ranks: one server and two workers, each on its half of every global batch; the
    server adds the two gradients, halves them and steps Adam, as the all-reduce's average does for
    two ranks, so the final weights are DDP's at 2 ranks bit for bit. --staleness 2 with rank 1
    slowed ends too, with every worker on the servers' variables (the C++ tests check the bound)."""
    train(tmp_path / "ddp")
    cmd = ["mpiexec", "-n", "3", TRAIN, *ARGS, "--out", str(tmp_path / "ps"), "--ps", "1"]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300,
                       env=dict(os.environ, OMP_NUM_THREADS="1", BRAID_NUM_THREADS="1", BRAID_TIMEOUT="120"))
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert "1 server and 2 workers, synchronous" in r.stdout, r.stdout
    ddp, ps = weights(braid_py, tmp_path / "ddp"), weights(braid_py, tmp_path / "ps")
    assert ddp.keys() == ps.keys()
    for k in ddp:
        np.testing.assert_array_equal(ps[k], ddp[k], err_msg=k)
    cmd = cmd[:cmd.index("--out") + 1] + [str(tmp_path / "ssp"), "--ps", "1", "--staleness", "2", "--slow-rank", "1:5"]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300,
                       env=dict(os.environ, OMP_NUM_THREADS="1", BRAID_NUM_THREADS="1", BRAID_TIMEOUT="120"))
    assert r.returncode == 0 and "staleness 2" in r.stdout, r.stdout[-2000:] + r.stderr[-2000:]


def test_dynamic_batches_at_staleness_0_train_as_data_parallelism(braid_py, tmp_path):
    """--ps 1 --dynamic-batches 1 at 3 ranks: the two workers claim the micro-batches of one order
    (Note [Claimed batches]); round r is micro-batches 2r and 2r + 1, the halves of global batch r
    that DDP's two ranks take, added in that order, so the weights are DDP's at 2 ranks bit for bit
    whichever worker computed which. With staleness 2 and rank 1 slowed the run ends as well."""
    train(tmp_path / "ddp")
    env = dict(os.environ, OMP_NUM_THREADS="1", BRAID_NUM_THREADS="1", BRAID_TIMEOUT="120")
    for name, extra in (("claims", []), ("claims2", ["--staleness", "2", "--slow-rank", "1:5"])):
        cmd = ["mpiexec", "-n", "3", TRAIN, *ARGS, "--out", str(tmp_path / name), "--ps", "1", "--dynamic-batches", "1",
               *extra]
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)
        assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
        assert "1 server and 2 workers, " + ("staleness 2" if extra else "synchronous") + ", dynamic batches" in r.stdout
    ddp, claims = weights(braid_py, tmp_path / "ddp"), weights(braid_py, tmp_path / "claims")
    assert ddp.keys() == claims.keys()
    for k in ddp:
        np.testing.assert_array_equal(claims[k], ddp[k], err_msg=k)
    log = (tmp_path / "claims2" / "log.csv").read_text().splitlines()
    assert log[-1].split(",")[:2] == ["16", "1"], log  # 1024 / 64 rounds, one epoch
    r = subprocess.run([TRAIN, *ARGS, "--out", str(tmp_path / "x"), "--dynamic-batches", "1"], capture_output=True,
                       text=True, timeout=60, env=env)
    assert r.returncode != 0 and "--dynamic-batches hands out the batches of parameter-server training; add --ps S" \
        in r.stderr, r.stderr


def test_a_compressed_run_resumes_with_its_error_feedback_bit_for_bit(braid_py, tmp_path):
    """Note [Hook state in checkpoints]: each rank writes its hook's state (DGC's residual and
    velocity, PowerSGD's error and Q) next to the checkpoint. Two epochs of 16 steps (the hooks
    compress from step 16, after the first epoch's warm-up); a run stopped at step 20 and resumed
    ends with the uninterrupted run's weights bit for bit. Without those files the resume says that
    error feedback starts from zero, and the weights then differ."""
    for spec, extra in (("dgc:0.01", ["--optimizer", "sgd", "--epochs", "2"]), ("powersgd:2", ["--epochs", "2"])):
        name = spec.replace(":", "_")
        log = train(tmp_path / f"{name}-full", "--compress", spec, *extra).stdout
        if spec.startswith("dgc"):
            # After the first epoch's warm-up each rank sends k = 2,351 values and int32 indices,
            # gathered from 2 ranks (and the epoch's few metrics): 2 x 2,351 x 8 bytes per step.
            m = re.search(r"after the hook's warm-up \(steps 17 to 32\): ([\d.]+) KB per step", log)
            assert m and float(m.group(1)) == round(2 * 2351 * 8 / 1024, 1), log
        stopped = tmp_path / f"{name}-stopped"
        train(stopped, "--compress", spec, *extra, "--stop-at-step", "20")
        assert sorted(p.name for p in stopped.glob("checkpoint.hook.rank*.braid")) == [
            "checkpoint.hook.rank0.braid", "checkpoint.hook.rank1.braid"]
        for lose in (False, True):
            run = tmp_path / f"{name}-resumed-{lose}"
            shutil.copytree(stopped, run)
            if lose:
                for p in run.glob("checkpoint.hook.rank*.braid"):
                    p.unlink()
            out = train(run, "--compress", spec, *extra, "--resume", str(run / "checkpoint.braid")).stdout
            assert ("error feedback starts from zero: no " in out) == lose, out
            full, resumed = weights(braid_py, tmp_path / f"{name}-full"), weights(braid_py, run)
            same = all(np.array_equal(full[k], resumed[k]) for k in full)
            assert same != lose, f"{spec}: resumed {'without' if lose else 'with'} the hook files"


def test_a_parameter_server_run_stops_and_resumes_bit_for_bit(braid_py, tmp_path):
    """Note [Parameter-server checkpoints], at 3 ranks over two epochs of 16 steps: on static shards
    (synchronous) and with dynamic batches (staleness 0), a run stopped at step 10 writes the
    servers' file of step 10 and checkpoint.braid, and resumed from the folder ends with the
    uninterrupted run's weights bit for bit; a checkpoint of another layout is refused by name."""
    env = dict(os.environ, OMP_NUM_THREADS="1", BRAID_NUM_THREADS="1", BRAID_TIMEOUT="120")

    def ps(out, *extra, ranks=3):
        cmd = ["mpiexec", "-n", str(ranks), TRAIN, *ARGS, "--epochs", "2", "--out", str(out), "--ps", "1", *extra]
        return subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)

    for mode in ([], ["--dynamic-batches", "1"]):
        name = "dynamic" if mode else "static"
        r = ps(tmp_path / f"{name}-full", *mode)
        assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
        run = tmp_path / f"{name}-stopped"
        r = ps(run, *mode, "--stop-at-step", "10")
        assert r.returncode == 0 and "stopped after step 10 (--stop-at-step)" in r.stdout, r.stdout + r.stderr[-2000:]
        assert sorted(p.name for p in run.iterdir()) == ["checkpoint.braid", "checkpoint.ps0.step10.braid", "log.csv"]
        r = ps(run, *mode, "--resume", str(run))
        assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
        assert sorted(p.name for p in run.glob("checkpoint.ps*")) == ["checkpoint.ps0.step32.braid"]
        full, resumed = weights(braid_py, tmp_path / f"{name}-full"), weights(braid_py, run)
        assert full.keys() == resumed.keys()
        for k in full:
            np.testing.assert_array_equal(resumed[k], full[k], err_msg=f"{name} {k}")
    r = ps(tmp_path / "other", "--ps", "2", "--resume", str(tmp_path / "static-stopped"))
    assert r.returncode != 0 and "is not a checkpoint of parameter-server training with 2 server(s), 1 workers" in \
        r.stderr, r.stderr[-2000:]
