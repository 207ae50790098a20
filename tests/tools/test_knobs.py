"""Note [Knobs]: every BRAID_* environment variable braid reads is declared once, in the table of
src/core/knobs.cpp; the README's table is that table; print_config shows what is in effect; a bad
value is an error naming the variable."""
import os
import re
import subprocess
import sys
from pathlib import Path

SOURCE = Path(__file__).resolve().parents[2]
BUILD = Path(os.environ.get("BRAID_TEST_BUILD_DIR", SOURCE / "build")).resolve()
TRAIN = BUILD / "model_zoo" / "braid-train"
sys.path.insert(0, str(SOURCE / "scripts"))
import update_readme_knobs  # noqa: E402


def train(*args, **env):
    return subprocess.run([str(TRAIN), *args], env={**os.environ, **env}, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, timeout=120)


def table_names(markdown):
    return re.findall(r"^\| `(BRAID_[A-Z_]+)` \|", markdown, re.M)


def test_the_readme_table_is_the_generated_one():
    readme = (SOURCE / "README.md").read_text()
    mine = update_readme_knobs.readme_table(readme).group(1)
    assert mine == update_readme_knobs.generated(BUILD), \
        "README.md's table of knobs is stale: run python3 scripts/update_readme_knobs.py"
    assert len(table_names(mine)) >= 14


def test_no_braid_variable_is_read_outside_the_table():
    """No getenv (C++, CUDA) or os.environ (the Python package, the zoo's scripts) of a BRAID_
    variable anywhere but src/core/knobs.cpp."""
    pattern = re.compile(r'(getenv\s*\(\s*"BRAID_|os\.environ(\.get)?\s*[\[(]\s*["\']BRAID_|os\.getenv\(\s*["\']BRAID_)')
    offenders = []
    for top in ["src", "layers", "distributed", "onnx", "model_zoo", "tools", "include", "examples",
                "bindings/python/braid", "bindings/python/src"]:
        for p in (SOURCE / top).rglob("*"):
            if p.suffix not in {".cpp", ".h", ".cu", ".cuh", ".py"} or "cuda_emu" in p.parts:
                continue
            if p == SOURCE / "src" / "core" / "knobs.cpp":
                continue
            for n, line in enumerate(p.read_text(errors="replace").splitlines(), 1):
                if pattern.search(line):
                    offenders.append(f"{p.relative_to(SOURCE)}:{n}: {line.strip()}")
    assert not offenders, "read these through the knob table (Note [Knobs]):\n" + "\n".join(offenders)


def test_every_knob_named_in_the_sources_is_in_the_table():
    declared = set(table_names(update_readme_knobs.generated(BUILD)))
    used = set()
    for top in ["src", "layers", "distributed", "onnx", "model_zoo", "tools"]:
        for p in (SOURCE / top).rglob("*"):
            if p.suffix in {".cpp", ".h", ".cu"} and "cuda_emu" not in p.parts:
                used |= set(re.findall(r'knob_(?:env|flag|count|number|text|value)\("(BRAID_[A-Z_]+)"', p.read_text()))
    assert used, "no knob reads found: the pattern no longer matches the sources"
    assert used <= declared, f"read but not declared: {sorted(used - declared)}"


def test_print_config_shows_the_values_in_effect():
    out = train("--print-config", BRAID_TIMEOUT="7", BRAID_CPU_FUSED="0", BRAID_NUM_THREADS="3").stdout
    assert "BRAID_TIMEOUT = 7  [set]" in out
    assert "BRAID_CPU_FUSED = 0  [set]" in out
    assert "BRAID_NUM_THREADS = 3  [set]" in out
    assert "BRAID_NCCL_ABORT_GRACE = 30  [default]" in out
    home = os.environ.get("HOME", "")
    out = train("--print-config", BRAID_MODEL_CACHE="", BRAID_NUM_THREADS="2").stdout
    assert f"BRAID_MODEL_CACHE = {home}/.cache/braid/models  [default]" in out  # empty counts as unset


def test_a_bad_value_is_an_error_naming_the_variable():
    p = train("--limit", "16", "--epochs", "1", BRAID_NUM_THREADS="two")
    assert p.returncode != 0
    assert "BRAID_NUM_THREADS='two': expected a positive integer" in p.stdout
    p = train("--limit", "16", "--epochs", "1", BRAID_TIMEOUT="-1")
    assert p.returncode != 0
    assert "BRAID_TIMEOUT='-1': expected a positive number of seconds" in p.stdout
