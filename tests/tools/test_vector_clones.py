"""Note [Vector clones] (src/backend/cpu/fast_math.h) in the built library: the float32 polynomial
kernels have AVX2 (x86-64-v3) and AVX-512 (x86-64-v4) copies, and those copies compute their fused
multiply-adds with the instruction, never through libm's fmaf (a call per element: the AVX2 copies
did that while they were compiled for plain "avx2", which does not include FMA). Read from the
disassembly of libbraid with binutils' objdump."""

import os
import platform
import re
import shutil
import subprocess

import pytest

BUILD = os.path.abspath(os.environ.get("BRAID_TEST_BUILD_DIR", os.path.join(os.path.dirname(__file__), "../../build")))


def functions_calling_fmaf():
    lib = os.path.join(BUILD, "libbraid.so")
    if platform.machine() != "x86_64" or shutil.which("objdump") is None or not os.path.exists(lib):
        pytest.skip("needs an x86-64 libbraid.so and objdump")
    text = subprocess.run(["objdump", "-d", "--no-show-raw-insn", lib], capture_output=True, text=True,
                          check=True).stdout
    clones, calls, name = {"arch_x86_64_v3": 0, "arch_x86_64_v4": 0}, {}, None
    for line in text.splitlines():
        m = re.match(r"^[0-9a-f]+ <(.+)>:$", line)
        if m:
            name = m.group(1)
            for arch in clones:
                clones[arch] += name.endswith("." + arch)
        elif name and re.search(r"call\s.*<fmaf@plt>", line):
            calls[name] = calls.get(name, 0) + 1
    return clones, calls


def test_the_avx2_and_avx512_copies_fuse_multiply_adds_in_hardware():
    clones, calls = functions_calling_fmaf()
    # exp, tanh, sigmoid, erf, softmax, layer norm, GELU and the rest each have both copies.
    assert clones["arch_x86_64_v3"] >= 10 and clones["arch_x86_64_v4"] >= 10, clones
    vector = {f: n for f, n in calls.items() if f.endswith((".arch_x86_64_v3", ".arch_x86_64_v4"))}
    assert vector == {}, f"vector copies calling libm's fmaf: {vector}"
    # The baseline copies do call it (same bits, slower): the scan does see such calls.
    assert any(f.endswith(".default") for f in calls), sorted(calls)[:5]
