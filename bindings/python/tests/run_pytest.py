#!/usr/bin/env python3
"""Runs braid's pytest suite for `meson test`.

Meson's gtest protocol passes --gtest_output=xml:PATH and folds the JUnit file it finds there into
its own log, which is what scripts/test_summary.py counts; pytest writes that file with --junitxml.
Under mpiexec only rank 0 writes it (every rank runs every test, as the C++ distributed tests do).
"""

import os
import sys

args, xml = [], None
for a in sys.argv[1:]:
    if a.startswith("--gtest_output=xml:"):
        xml = a.split(":", 1)[1]
    else:
        args.append(a)
rank = int(os.environ.get("PMI_RANK", os.environ.get("OMPI_COMM_WORLD_RANK", "0")))
cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--rootdir", os.path.dirname(__file__)]
if xml and rank == 0:
    cmd.append("--junitxml=" + xml)
os.execv(sys.executable, cmd + args)
