"""The session's Slurm cluster (tests/slurm/cluster.py): started once, stopped at the end; every test
skips with the reason when Slurm cannot start here."""

import os
import shutil
import sys
import tempfile

import pytest

sys.path.insert(0, os.path.dirname(__file__))
from cluster import SlurmCluster, SlurmUnavailable  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BUILD = os.path.abspath(os.environ.get("BRAID_TEST_BUILD_DIR", os.path.join(ROOT, "build")))


@pytest.fixture(scope="session")
def slurm():
    root = tempfile.mkdtemp(prefix="braid-slurm-")
    cluster = SlurmCluster(root)
    try:
        cluster.start()
    except SlurmUnavailable as e:
        pytest.skip(f"Slurm cannot start here: {e}")
    yield cluster
    cluster.stop()


@pytest.fixture(scope="session")
def braid_py():
    """braid's Python module from the build, which reads the checkpoints; the tests that run braid-train
    under mpiexec skip without it or without mpiexec."""
    pkg = os.path.join(BUILD, "bindings", "python")
    if not os.path.isdir(os.path.join(pkg, "braid")):
        pytest.skip(f"the Python module is not built in {BUILD}; it reads the checkpoints")
    if shutil.which("mpiexec") is None:
        pytest.skip("no mpiexec")
    sys.path.insert(0, pkg)
    import braid
    return braid


@pytest.fixture
def job_env(tmp_path):
    """What every job gets: the build's braid-train, data on this machine, one thread per rank."""
    return {"BRAID_BUILD_DIR": BUILD, "BRAID_TIMEOUT": "120"}


@pytest.fixture(autouse=True)
def no_job_left(request):
    """After each test, its jobs are gone: a failed test must not leave a job holding the node (one
    held for a signal that never came would keep every later job pending)."""
    yield
    if "slurm" in request.fixturenames:
        request.getfixturevalue("slurm").cancel_all()
