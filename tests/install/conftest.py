"""braid installed as a centre installs it: `meson install` of the build tree into a staging
directory, then moved elsewhere before any test uses it, so every test also checks that the
installed tree is relocatable (Note [A relocatable install] in the top-level meson.build)."""
import dataclasses
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

BUILD = Path(os.environ.get("BRAID_TEST_BUILD_DIR", Path(__file__).resolve().parents[2] / "build"))
SOURCE = Path(__file__).resolve().parents[2]
README = SOURCE / "README.md"


def run(cmd, *, env=None, cwd=None, timeout=600, check=True):
    """Runs cmd, returning its CompletedProcess; a failure shows the command and what it printed."""
    p = subprocess.run([str(c) for c in cmd], env=env, cwd=cwd, timeout=timeout,
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if check and p.returncode != 0:
        pytest.fail(f"{' '.join(map(str, cmd))} exited with {p.returncode}:\n{p.stdout[-6000:]}")
    return p


def clean_env(**extra):
    """A user's shell with nothing of braid's build in it: system directories only."""
    env = {"PATH": "/usr/bin:/bin", "HOME": os.environ.get("HOME", "/root"), "LANG": "C.UTF-8"}
    env.update({k: str(v) for k, v in extra.items()})
    return env


def build_option(name):
    options = json.loads(run(["meson", "introspect", BUILD, "--buildoptions"]).stdout)
    return next(o["value"] for o in options if o["name"] == name)


@dataclasses.dataclass
class Installed:
    root: Path      # the prefix, after the move
    libdir: Path
    python: Path    # the site-packages directory holding braid/
    modulefiles: Path


@pytest.fixture(scope="session")
def installed(tmp_path_factory):
    base = tmp_path_factory.mktemp("install")
    stage = base / "stage"
    run(["meson", "install", "-C", BUILD, "--no-rebuild", "--quiet", "--destdir", stage])
    prefix = build_option("prefix")
    root = base / "moved" / "braid"
    root.parent.mkdir()
    shutil.move(stage / prefix.lstrip("/"), root)
    shutil.rmtree(stage)
    libdir = root / build_option("libdir")
    pythons = sorted(root.glob("lib/python3*/site-packages"))
    assert (libdir / "libbraid.so").is_file(), f"no libbraid.so in {libdir}"
    assert len(pythons) == 1, f"expected one site-packages under {root}/lib, found {pythons}"
    return Installed(root, libdir, pythons[0], root / build_option("datadir") / "modulefiles")


def readme_block(language, after):
    """The first ```language block of README.md after the heading `after`."""
    text = README.read_text()
    start = text.index(after)
    m = re.compile(r"```" + language + r"\n(.*?)```", re.S).search(text, start)
    assert m, f"README.md has no ```{language} block after {after!r}"
    return m.group(1)


@pytest.fixture(scope="session")
def consumer_project(tmp_path_factory):
    """A CMake project outside the source tree: the README's CMakeLists.txt and C++ example, plus
    examples/ddp_regression.cpp as a second program of the same project."""
    d = tmp_path_factory.mktemp("consumer")
    cmake = readme_block("cmake", "## Installing on a cluster")
    cmake += "add_executable(ddp_regression ddp_regression.cpp)\n"
    cmake += "target_link_libraries(ddp_regression PRIVATE braid::braid)\n"
    (d / "CMakeLists.txt").write_text(cmake)
    (d / "demo.cpp").write_text(readme_block("cpp", "## Using braid"))
    shutil.copy(SOURCE / "examples" / "ddp_regression.cpp", d)
    return d


def readme_example_expected():
    """The README example's loss and gradient, computed with NumPy in float64."""
    w = np.linspace(-0.5, 0.5, 6).reshape(3, 2)
    x = np.linspace(-1.0, 1.0, 12).reshape(4, 3)
    h = np.tanh(x @ w)
    loss = np.mean((h - 0.5) ** 2)
    grad = x.T @ ((h - 0.5) * 2 / h.size * (1 - h * h))
    return loss, grad.ravel()


def check_readme_example_output(out):
    m = re.search(r"loss ([-0-9.e]+), grad .*values=\[([^\]]*)\]", out)
    assert m, f"unexpected output of the README example: {out!r}"
    loss, grad = readme_example_expected()
    assert float(m.group(1)) == pytest.approx(loss, abs=2e-6)
    got = np.array([float(v) for v in m.group(2).split(",")])
    np.testing.assert_allclose(got, grad, rtol=1e-5, atol=1e-6)


def ddp_expected(steps=50, lr=0.2):
    """examples/ddp_regression.cpp's result: full-batch gradient descent on all 64 rows, NumPy."""
    s = np.linspace(-1.0, 1.0, 64).reshape(64, 1)
    x = np.sin(s @ np.array([[1.0, 2.0, 3.0]]))
    y = x @ np.array([[1.5], [-2.0], [0.5]]) + 0.3 + 0.1 * np.cos(5 * s)
    w, b = np.zeros((3, 1)), 0.0
    for _ in range(steps):
        r = x @ w + b - y
        loss = np.mean(r ** 2)
        w, b = w - lr * 2 * x.T @ r / 64, b - lr * 2 * np.mean(r)
    return loss, np.append(w.ravel(), b)


def check_ddp_output(out, ranks):
    m = re.search(r"ranks (\d+) steps 50 loss ([-0-9.e]+)\s+weight ([-0-9.e]+) ([-0-9.e]+) ([-0-9.e]+) bias ([-0-9.e]+)", out)
    assert m, f"unexpected output of ddp_regression: {out!r}"
    assert int(m.group(1)) == ranks
    loss, params = ddp_expected()
    assert float(m.group(2)) == pytest.approx(loss, rel=1e-9)
    np.testing.assert_allclose([float(m.group(i)) for i in range(3, 7)], params, rtol=1e-9, atol=1e-12)


PYTHON = Path(sys.executable)
