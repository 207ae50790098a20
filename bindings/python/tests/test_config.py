"""braid's knobs from Python (Note [Knobs]): the same table and values as braid-train --print-config."""
import os
import subprocess
import sys

import pytest

import braid


def in_fresh_process(code, **env):
    """Knobs are read once per process, so a changed environment needs a new one."""
    return subprocess.run([sys.executable, "-c", "import braid; " + code], env={**os.environ, **env},
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=120)


def test_knobs_are_the_table():
    names = [k["name"] for k in braid.knobs()]
    assert names[0] == "BRAID_NUM_THREADS" and "BRAID_TIMEOUT" in names and "BRAID_MODEL_CACHE" in names
    assert len(names) == len(set(names))
    timeout = next(k for k in braid.knobs() if k["name"] == "BRAID_TIMEOUT")
    assert timeout["type"] == "seconds" and timeout["default"] == "600" and not timeout["for_tests"]


def test_knob_value_is_the_environment_or_the_default():
    out = in_fresh_process("print(braid.knob_value('BRAID_TIMEOUT'), braid.knob_value('BRAID_NCCL'))",
                           BRAID_TIMEOUT="9").stdout.split()
    assert out == ["9", "1"]
    out = in_fresh_process("print(braid.knob_value('BRAID_MODEL_CACHE'))", BRAID_MODEL_CACHE="/data/models").stdout
    assert out.strip() == "/data/models"


def test_print_config_matches_braid_train(capsys):
    braid.print_config()
    printed = capsys.readouterr().out
    assert printed == braid.config_string()
    for k in braid.knobs():
        assert f"  {k['name']} = " in printed


def test_an_unknown_knob_is_refused():
    with pytest.raises(ValueError, match="BRAID_NO_SUCH.*is not one of braid's knobs"):
        braid.knob_value("BRAID_NO_SUCH")
