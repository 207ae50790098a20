"""EasyBuild builds braid from the tarball that `meson dist` makes, offline, into a temporary prefix:
packaging/easybuild/braid-0.1.0.eb, the SYSTEM-toolchain variant whose dependencies are the OS's
packages (osdependencies, checked by EasyBuild with dpkg), with Meson and Ninja the OS's too
(--filter-deps). Its sanity check runs braid-train and braid-onnx and imports the Python module
from the installed prefix; the test then loads the module EasyBuild wrote in a clean shell and
builds and runs the README's example against it."""
import importlib.util
import os
import shutil

import pytest

from conftest import BUILD, PYTHON, SOURCE, check_readme_example_output, run

LMOD_INIT = "/usr/share/lmod/lmod/init/bash"
RECIPE = SOURCE / "packaging" / "easybuild" / "braid-0.1.0.eb"


def skip_reason():
    if importlib.util.find_spec("easybuild") is None:
        return "EasyBuild is not installed for this python3 (scripts/install_deps.sh installs it)"
    if not os.path.exists(LMOD_INIT):
        return "Lmod is not installed (Debian's lmod; EasyBuild needs a modules tool)"
    if not (SOURCE / ".git").exists() or shutil.which("git") is None:
        return "not a git checkout: `meson dist` makes its tarball from git"
    return None


def eb(recipe, tmp_path, sources, timeout):
    """Runs EasyBuild on recipe with every path under tmp_path; returns (exit status, output)."""
    meson_version = run(["meson", "--version"]).stdout.strip()
    paths = {p: tmp_path / p for p in ["install", "build", "tmp", "repo"]}
    cmd = [PYTHON, "-m", "easybuild.main", recipe, f"--sourcepath={sources}",
           f"--installpath={paths['install']}", f"--buildpath={paths['build']}", f"--tmpdir={paths['tmp']}",
           f"--repositorypath={paths['repo']}", "--filter-deps=Meson,Ninja", "--modules-tool=Lmod",
           "--parallel=2", "--allow-use-as-root-and-accept-consequences"]
    env = dict(os.environ)
    # MesonNinja reads Meson's version from the variable a Meson module would set; Meson is the OS's.
    env["EBVERSIONMESON"] = meson_version
    # The build's paths are relative to the build directory, as in CI's trees: the compiler cache
    # (Note [Compiler cache] in scripts/run_tests.sh) serves it when its base is the build path.
    env["CCACHE_BASEDIR"] = str(tmp_path)
    env["CCACHE_NOHASHDIR"] = "1"
    script = f"source {LMOD_INIT} && " + " ".join(f"'{c}'" for c in cmd)
    p = run(["bash", "--noprofile", "--norc", "-c", script], env=env, timeout=timeout, check=False)
    return p.returncode, p.stdout


needs_easybuild = pytest.mark.skipif(skip_reason() is not None, reason=str(skip_reason()))


@needs_easybuild
def test_easybuild_refuses_a_machine_without_the_os_dependencies(tmp_path):
    """The recipe's osdependencies are checked (with dpkg here) before anything is built."""
    recipe = tmp_path / "braid-0.1.0.eb"
    text = RECIPE.read_text()
    assert "osdependencies = [\n" in text
    recipe.write_text(text.replace("osdependencies = [\n", "osdependencies = [\n    'braid-no-such-package',\n"))
    status, out = eb(recipe, tmp_path, tmp_path, timeout=600)
    assert status != 0
    assert "braid-no-such-package" in out and "OS dependencies" in out, out[-3000:]


@needs_easybuild
def test_easybuild_builds_braid_from_the_dist_tarball(tmp_path, consumer_project):
    version = run(["meson", "introspect", BUILD, "--projectinfo"]).stdout
    assert '"version": "0.1.0"' in version, "the recipe's version must follow the project's"
    # The committed tree (HEAD); --allow-dirty so that a developer's uncommitted edits do not stop it.
    run(["meson", "dist", "-C", BUILD, "--no-tests", "--formats", "xztar", "--allow-dirty"], timeout=300)
    sources = tmp_path / "sources"
    sources.mkdir()
    shutil.copy(BUILD / "meson-dist" / "braid-0.1.0.tar.xz", sources)
    status, out = eb(RECIPE, tmp_path, sources, timeout=3000)
    assert status == 0 and "COMPLETED: Installation ended successfully" in out, out[-4000:]
    for command in ["braid-train --help", "braid-onnx --help", "python3 -c 'import braid; print(braid.__version__)'"]:
        assert f"result for command '{command}': OK" in out, f"sanity check {command!r} did not pass:\n{out[-4000:]}"
    install = tmp_path / "install"
    prefix = install / "software" / "braid" / "0.1.0"
    assert (prefix / "lib" / "cmake" / "braid" / "braidConfig.cmake").is_file()
    module = install / "modules" / "all" / "braid" / "0.1.0.lua"
    assert module.is_file(), f"EasyBuild wrote no module file at {module}"

    # The module EasyBuild wrote, in a shell with nothing set: pkg-config finds braid through it.
    script = f"""
set -e
source {LMOD_INIT}
module use {install / 'modules' / 'all'}
module load braid/0.1.0
c++ -std=c++20 {consumer_project}/demo.cpp -o {tmp_path}/demo $(pkg-config --cflags --libs braid)
echo "demo: $({tmp_path}/demo)"
echo "python: $({PYTHON} -c 'import braid; print(braid.__file__)')"
"""
    out = run(["env", "-i", f"HOME={os.environ.get('HOME', '/root')}", "PATH=/usr/bin:/bin",
               "bash", "--noprofile", "--norc", "-c", script]).stdout
    lines = {l.split(": ", 1)[0]: l.split(": ", 1)[1] for l in out.splitlines() if ": " in l}
    check_readme_example_output(lines["demo"])
    assert lines["python"].startswith(str(prefix))
