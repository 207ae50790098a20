#!/usr/bin/python3
"""Writes half_reference.txt: elementwise ops and reductions of float16 tensors computed by NumPy
and of bfloat16 tensors computed by PyTorch, for tests/test_half_arithmetic.cpp (Note [Half
arithmetic] in src/backend/backend.h: each element computed in float32, rounded once; reductions
accumulated in float32).

Run with Debian's /usr/bin/python3 (python3-numpy, python3-torch):
    /usr/bin/python3 tests/data/make_half_reference.py

Each line is `<dtype> <name> <values...>` over a (4, 16) grid, row-major; x and y are the inputs, the
reductions run over axis 1. Values print exactly (every float16 and bfloat16 is a float64).
"""
import os

import numpy as np
import torch

rng = np.random.default_rng(7)
x64 = rng.uniform(-3, 3, size=(4, 16))
y64 = rng.uniform(0.25, 3, size=(4, 16)) * rng.choice([-1, 1], size=(4, 16))

lines = []


def emit(dtype, name, values):
    flat = np.asarray(values, dtype=np.float64).reshape(-1)
    lines.append(f"{dtype} {name} " + " ".join(repr(float(v)) for v in flat))


# float16: NumPy's half loops convert to float32, compute and round once.
x, y = x64.astype(np.float16), y64.astype(np.float16)
emit("float16", "x", x)
emit("float16", "y", y)
for name, fn in [("add", np.add), ("sub", np.subtract), ("mul", np.multiply), ("div", np.divide),
                 ("maximum", np.maximum)]:
    emit("float16", name, fn(x, y))
emit("float16", "sqrt", np.sqrt(np.abs(x)))
emit("float16", "exp", np.exp(x))
emit("float16", "tanh", np.tanh(x))
emit("float16", "sum", np.sum(x, axis=1, dtype=np.float32).astype(np.float16))
emit("float16", "mean", np.mean(x, axis=1, dtype=np.float32).astype(np.float16))
emit("float16", "amax", np.max(x, axis=1))

# bfloat16: PyTorch's CPU kernels widen to float32, compute and round once.
xb, yb = torch.tensor(x64).to(torch.bfloat16), torch.tensor(y64).to(torch.bfloat16)
emit("bfloat16", "x", xb.double().numpy())
emit("bfloat16", "y", yb.double().numpy())
for name, fn in [("add", torch.add), ("sub", torch.sub), ("mul", torch.mul), ("div", torch.div),
                 ("maximum", torch.maximum)]:
    emit("bfloat16", name, fn(xb, yb).double().numpy())
emit("bfloat16", "sqrt", torch.sqrt(xb.abs()).double().numpy())
emit("bfloat16", "exp", torch.exp(xb).double().numpy())
emit("bfloat16", "tanh", torch.tanh(xb).double().numpy())
emit("bfloat16", "sum", xb.float().sum(1).to(torch.bfloat16).double().numpy())
emit("bfloat16", "mean", xb.float().mean(1).to(torch.bfloat16).double().numpy())
emit("bfloat16", "amax", torch.amax(xb, 1).double().numpy())

out = os.path.join(os.path.dirname(os.path.abspath(__file__)), "half_reference.txt")
with open(out, "w") as f:
    f.write(f"# made by make_half_reference.py (NumPy {np.__version__}, PyTorch {torch.__version__})\n")
    f.write("\n".join(lines) + "\n")
print(f"wrote {len(lines)} lines to {out}")
