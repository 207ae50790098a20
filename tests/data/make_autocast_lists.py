#!/usr/bin/python3
"""Writes autocast_lists.txt: torch.autocast's op lists for CUDA, read from PyTorch's own test lists
(torch.testing._internal.autocast_test_lists.AutocastTestLists, the lists test_cuda.py checks), for
tests/test_amp_lists.cpp, which holds braid's autocast to them op by op.

Run with Debian's /usr/bin/python3 (python3-torch):  /usr/bin/python3 tests/data/make_autocast_lists.py

Each line is `<list> <op>`: lower (the op returns the autocast dtype for float32 input), float32 (it
returns float32 for half input), promote (it returns the widest floating dtype of its inputs, which
autocast casts to) or builtin_promote (the op's own type promotion, which autocast relies on).
"""
import os
import sys
import types

import torch

# autocast_test_lists imports one flag from common_utils, whose own imports (expecttest, ...) are test
# tooling this script does not need: a stand-in module supplies the flag.
common_utils = types.ModuleType("torch.testing._internal.common_utils")
common_utils.TEST_WITH_ROCM = False
common_utils.TestCase = object
sys.modules["torch.testing._internal.common_utils"] = common_utils
from torch.testing._internal.autocast_test_lists import AutocastTestLists  # noqa: E402

lists = AutocastTestLists(torch.device("meta"))  # shapes only: the lists are what is wanted
groups = {
    "lower": ["torch_fp16", "nn_fp16", "methods_fp16", "linalg_fp16"],
    "float32": ["torch_fp32", "nn_fp32", "methods_fp32"],
    "promote": ["torch_need_autocast_promote"],
    "builtin_promote": ["torch_expect_builtin_promote", "methods_expect_builtin_promote"],
}
out = os.path.join(os.path.dirname(os.path.abspath(__file__)), "autocast_lists.txt")
seen = set()
with open(out, "w") as f:
    f.write(f"# torch.autocast's CUDA op lists (PyTorch {torch.__version__}); made by make_autocast_lists.py\n")
    for group, names in groups.items():
        for attr in names:
            for entry in getattr(lists, attr, []):
                key = (group, entry[0])
                if key not in seen:
                    seen.add(key)
                    f.write(f"{group} {entry[0]}\n")
print(f"wrote {len(seen)} entries to {out}")
