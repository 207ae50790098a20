"""The preemption tests' hold (Note [Holding for a preemption test]), without Slurm: braid-train under
mpiexec -n 2 with BRAID_TEST_HOLD_AT_STEPS waits after that step until a rank is signalled; a signal
to one rank alone stops both after exactly that step (the hold polls the flag over the world), and
the checkpoint records it. A malformed list is refused naming the variable."""

import os
import re
import signal
import subprocess
import time

import pytest

from conftest import BUILD

TRAIN = os.path.join(BUILD, "model_zoo", "braid-train")
ARGS = ["--limit", "1024", "--epochs", "2", "--batch-size", "64", "--threads", "1", "--model", "mlp"]
ENV = dict(os.environ, OMP_NUM_THREADS="1", BRAID_NUM_THREADS="1", BRAID_TIMEOUT="120")


def test_a_signal_to_one_rank_stops_both_at_the_held_step(braid_py, tmp_path):
    out = tmp_path / "held"
    cmd = ["mpiexec", "-n", "2", TRAIN, *ARGS, "--out", str(out)]
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                         env=dict(ENV, BRAID_TEST_HOLD_AT_STEPS="7"))
    lines, pids = [], {}
    deadline = time.time() + 120  # only a hang reaches it: the job holds until it is signalled
    try:
        for line in p.stdout:
            lines.append(line)
            pids.update({int(r): int(pid) for r, pid in re.findall(r"rank (\d+) = pid (\d+)", line)})
            if "braid: holding after step 7 for a preemption signal" in line:
                break
            assert time.time() < deadline, "".join(lines)
        assert 1 in pids, "".join(lines)
        os.kill(pids[1], signal.SIGUSR1)  # rank 1 alone
        rest, _ = p.communicate(timeout=120)
    finally:
        if p.poll() is None:
            p.kill()
    text = "".join(lines) + rest
    assert p.returncode == 75, text  # braid::distributed::kRequeueExitCode
    assert re.search(r"rank 1: SIGUSR1 caught at step 7 \(epoch 1, batch 7 of 16\)", text), text
    assert re.search(r"rank 0: a peer rank was signalled at step 7 ", text), text
    ck = braid_py.checkpoint.load(str(out / "checkpoint.braid"))
    assert (ck.integers["step"], ck.integers["loader.batch"]) == (7, 7), ck.integers


def test_a_malformed_hold_list_is_refused_naming_the_variable(tmp_path):
    r = subprocess.run([TRAIN, *ARGS, "--out", str(tmp_path / "bad")], capture_output=True, text=True, timeout=120,
                       env=dict(ENV, BRAID_TEST_HOLD_AT_STEPS="3,x"))
    assert r.returncode != 0
    assert "BRAID_TEST_HOLD_AT_STEPS: expected steps as non-negative integers separated by commas, got '3,x'" in \
        r.stderr, r.stderr
