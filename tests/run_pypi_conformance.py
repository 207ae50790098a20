#!/usr/bin/env python3
"""Runs braid's ONNX conformance driver (tests/test_onnx_conformance.cpp) on the backend node suite of
the onnx package that pip installed (newer than Debian's libonnx-testdata), written to a temporary
folder by scripts/write_onnx_node_suite.py, with tests/onnx_conformance_exclusions_pypi.txt.

    run_pypi_conformance.py DRIVER SOURCE_ROOT [gtest arguments...]

Without the onnx package the driver runs on an empty folder, where its one data test skips.
"""

import os
import subprocess
import sys
import tempfile

driver, root, rest = sys.argv[1], sys.argv[2], sys.argv[3:]
tmp = tempfile.mkdtemp(prefix="braid-onnx-node-suite-")
r = subprocess.run([sys.executable, os.path.join(root, "scripts", "write_onnx_node_suite.py"), tmp],
                   capture_output=True, text=True)
if r.returncode != 0:
    print(f"run_pypi_conformance: could not write the suite (is the onnx package installed?):\n{r.stderr[-2000:]}")
else:
    print(r.stdout.strip())
env = dict(os.environ, BRAID_ONNX_TESTDATA=tmp,
           BRAID_ONNX_EXCLUSIONS=os.path.join(root, "tests", "onnx_conformance_exclusions_pypi.txt"))
code = subprocess.run([driver, *rest], env=env).returncode
subprocess.run(["rm", "-rf", tmp])
sys.exit(code)
