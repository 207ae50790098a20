"""An installed braid, used the three ways a cluster's users use it: CMake's find_package, pkg-config,
and the Lmod module; each builds the README's example (and the data-parallel example) from outside
the source tree and checks the printed numbers against NumPy. The tree is used only after it has
been moved from where it was installed (conftest.py)."""
import os
import shutil
import subprocess

import pytest

from conftest import (BUILD, PYTHON, SOURCE, check_ddp_output, check_readme_example_output, clean_env,
                      readme_block, run)

MPIEXEC = shutil.which("mpiexec")


def elf_files(root):
    for p in sorted(root.rglob("*")):
        if p.is_file() and not p.is_symlink() and p.read_bytes()[:4] == b"\x7fELF":
            yield p


def test_nothing_installed_names_the_build_or_the_prefix(installed):
    """Programs and extensions reach libbraid.so relative to $ORIGIN, and no installed file mentions
    the source or build tree (which a centre does not keep) or the prefix it was installed into."""
    elves = list(elf_files(installed.root))
    assert any(p.name == "braid-train" for p in elves) and any(p.name == "libbraid.so" for p in elves)
    for p in elves:
        dynamic = run(["readelf", "-d", p]).stdout
        for line in dynamic.splitlines():
            if "RUNPATH" in line or "RPATH" in line:
                paths = line.split("[", 1)[1].rstrip("]").split(":")
                for path in paths:
                    assert path.startswith("$ORIGIN") or path.startswith("/usr/lib"), \
                        f"{p.relative_to(installed.root)} has run path {path}"
        if p.parent.name == "bin" or p.name.startswith("_") or p.name == "libbraid_cuda.so":
            assert "$ORIGIN" in dynamic, f"{p.relative_to(installed.root)} has no $ORIGIN run path"
    pc = (installed.libdir / "pkgconfig" / "braid.pc").read_text()
    assert pc.startswith("prefix=${pcfiledir}/"), \
        f"braid.pc names its prefix ({pc.splitlines()[0]}): configure with -Dpkgconfig.relocatable=true"
    forbidden = [str(SOURCE).encode(), str(BUILD.resolve()).encode()]
    for p in installed.root.rglob("*"):
        if p.is_file():
            data = p.read_bytes()
            for f in forbidden:
                assert f not in data, f"{p.relative_to(installed.root)} names {f.decode()}"


def test_installed_programs_run_from_the_moved_tree(installed):
    out = run([installed.root / "bin" / "braid-train", "--help"], env=clean_env()).stdout
    assert out.startswith("usage: braid-train")
    out = run([installed.root / "bin" / "braid-zoo", "list"], env=clean_env()).stdout
    assert "resnet50" in out.lower()
    out = run([installed.root / "bin" / "braid-onnx", "--help"], env=clean_env()).stdout
    assert "braid-onnx inspect" in out


def test_the_python_module_imports_from_the_moved_tree(installed):
    code = ("import braid, numpy; t = braid.arange(10, dtype=braid.float64) * 0.5; "
            "print(braid.__file__); print(float(t.sum().item()))")
    out = run([PYTHON, "-c", code], env=clean_env(PYTHONPATH=installed.python)).stdout.split()
    assert out[0].startswith(str(installed.python))
    assert float(out[1]) == 22.5  # 0.5 * (0 + 1 + ... + 9)


@pytest.fixture(scope="module")
def cmake_build(installed, consumer_project, tmp_path_factory):
    build = tmp_path_factory.mktemp("cmake-build")
    env = clean_env()
    run(["cmake", "-S", consumer_project, "-B", build, f"-DCMAKE_PREFIX_PATH={installed.root}",
         "-DCMAKE_BUILD_TYPE=Release"], env=env)
    run(["cmake", "--build", build, "-j", "2"], env=env)
    return build


def test_cmake_finds_braid_and_builds_the_readme_example(cmake_build):
    check_readme_example_output(run([cmake_build / "demo"], env=clean_env()).stdout)


@pytest.mark.skipif(MPIEXEC is None, reason="no mpiexec")
def test_cmake_builds_the_data_parallel_example_that_runs_on_two_ranks(cmake_build):
    out = run([MPIEXEC, "-n", "2", cmake_build / "ddp_regression"], env=clean_env(), timeout=300).stdout
    check_ddp_output(out, ranks=2)


def test_cmake_package_checks_the_version_and_the_components(installed, tmp_path):
    (tmp_path / "CMakeLists.txt").write_text(
        "cmake_minimum_required(VERSION 3.20)\nproject(probe CXX)\n"
        "find_package(braid 0.1 REQUIRED)\n"
        "message(STATUS \"probe: ${braid_VERSION} mpi=${braid_MPI} cuda=${braid_HAVE_CUDA}\")\n"
        "get_target_property(deps braid::braid IMPORTED_LINK_DEPENDENT_LIBRARIES)\n"
        "message(STATUS \"probe deps: ${deps}\")\n"
        "find_package(braid 0.1 QUIET COMPONENTS fortran)\n"
        "message(STATUS \"probe fortran found: ${braid_FOUND}\")\n"
        "find_package(braid 0.2 QUIET)\n"
        "message(STATUS \"probe 0.2 found: ${braid_FOUND}\")\n")
    out = run(["cmake", "-S", tmp_path, "-B", tmp_path / "b", f"-DCMAKE_PREFIX_PATH={installed.root}"],
              env=clean_env()).stdout
    assert "probe: 0.1.0 mpi=MPICH" in out
    assert "libmpich" in out and "libopenblas" in out
    assert "probe fortran found: 0" in out  # a component braid does not have
    assert "probe 0.2 found: 0" in out  # 0.x: another minor version is not compatible


def test_pkg_config_builds_the_readme_example(installed, consumer_project, tmp_path):
    env = clean_env(PKG_CONFIG_PATH=installed.libdir / "pkgconfig")
    flags = run(["pkg-config", "--cflags", "--libs", "braid"], env=env).stdout.split()
    assert f"-L{installed.libdir}" in [f.replace("/pkgconfig/../../..", "") for f in flags] or \
        any(os.path.realpath(f[2:]) == str(installed.libdir) for f in flags if f.startswith("-L"))
    run(["c++", "-std=c++20", consumer_project / "demo.cpp", "-o", tmp_path / "demo", *flags,
         f"-Wl,-rpath,{installed.libdir}"], env=env)
    check_readme_example_output(run([tmp_path / "demo"], env=clean_env()).stdout)


LMOD_INIT = "/usr/share/lmod/lmod/init/bash"


@pytest.mark.skipif(not os.path.exists(LMOD_INIT), reason="Lmod is not installed (Debian's lmod)")
def test_the_lmod_module_sets_up_a_clean_shell(installed, consumer_project, tmp_path):
    """`module load braid` in a shell with nothing set: the programs, pkg-config, CMake and Python
    find the installed braid through what the module sets, and nothing else."""
    script = f"""
set -e
source {LMOD_INIT}
module use {installed.modulefiles}
module load braid
module show braid 2>&1 | grep -E 'whatis|depends' | sed 's/^/show: /'
echo "train: $(command -v braid-train)"
c++ -std=c++20 {consumer_project}/demo.cpp -o {tmp_path}/demo_pc $(pkg-config --cflags --libs braid)
echo "pkg-config: $({tmp_path}/demo_pc)"
cmake -S {consumer_project} -B {tmp_path}/cmake -DCMAKE_BUILD_TYPE=Release > /dev/null
cmake --build {tmp_path}/cmake -j 2 --target demo > /dev/null
echo "cmake: $({tmp_path}/cmake/demo)"
echo "python: $({PYTHON} -c 'import braid; print(braid.__file__)')"
module unload braid
echo "unloaded: $(command -v braid-train || echo none) ${{PYTHONPATH:-empty}}"
"""
    out = run(["env", "-i", f"HOME={os.environ.get('HOME', '/root')}", "PATH=/usr/bin:/bin",
               "bash", "--noprofile", "--norc", "-c", script]).stdout
    lines = {l.split(": ", 1)[0]: l.split(": ", 1)[1] for l in out.splitlines() if ": " in l}
    assert lines["train"] == str(installed.root / "bin" / "braid-train")
    check_readme_example_output(lines["pkg-config"])
    check_readme_example_output(lines["cmake"])
    assert lines["python"].startswith(str(installed.python))
    assert lines["unloaded"] == "none empty"
    assert "MPI: MPICH" in out
