#!/usr/bin/env python3
"""The cost of braid's Python layer, A/B between two builds of the package (a change to the bindings
against the commit before it), in the same run: microseconds per call of the operations whose Python
code the change moved (operators, len/bool/indexing, a C++ layer and a Python module called from
Python, state_dict, keyword construction of an optimizer and a loader, a loader's epoch over NumPy
arrays). The builds take turns for --rounds rounds, each keeping its fastest repetition of each
operation, and the table gives B / A.

  python3 benchmarks/python_layer_ab.py --a /work/old/build/bindings/python --b build/bindings/python
"""

import argparse
import json
import subprocess
import sys

# Runs inside one build's interpreter: prints {name: best microseconds per call}.
PROBE = r"""
import json, sys, time
import numpy as np
import braid
from braid import nn, optim, data
braid.set_num_threads(1)
braid.manual_seed(0)
a, b, s = braid.randn(16), braid.randn(16), braid.tensor([1.0])
lin = nn.Linear(16, 16)
class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(16, 32), nn.Linear(32, 4)
    def forward(self, x):
        return self.fc2(braid.relu(self.fc1(x)))
net, x = Net(), braid.randn(8, 16)
xs, ys = np.random.default_rng(0).standard_normal((1024, 16)).astype(np.float32), np.zeros(1024, np.int64)
params = net.parameters()
def epoch():
    for _ in data.DataLoader((xs, ys), batch_size=32, shuffle=True):
        pass
cases = {
    "a + b": lambda: a + b, "a * 2.5": lambda: a * 2.5, "a + 1": lambda: a + 1,
    "braid.relu(a)": lambda: braid.relu(a), "a.sum()": lambda: a.sum(), "a[2:5]": lambda: a[2:5],
    "len(a)": lambda: len(a), "bool(s)": lambda: bool(s), "a.requires_grad": lambda: a.requires_grad,
    "nn.Linear(16, 16)(x)": lambda: lin(x), "Python module (2 Linear)": lambda: net(x),
    "net.state_dict()": lambda: net.state_dict(),
    "optim.SGD(params, lr=0.1, momentum=0.9)": lambda: optim.SGD(params, lr=0.1, momentum=0.9),
    "DataLoader epoch (1024 x 16, batch 32)": epoch,
}
reps, out = int(sys.argv[1]), {}
for name, fn in cases.items():
    n = 1
    while True:  # calls per repetition: at least 20 ms of work
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        if time.perf_counter() - t0 > 0.02:
            break
        n *= 4
    best = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        best = min(best, (time.perf_counter() - t0) / n)
    out[name] = best * 1e6
print(json.dumps(out))
"""


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--a", required=True, help="PYTHONPATH of build A (before)")
    ap.add_argument("--b", required=True, help="PYTHONPATH of build B (after)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--reps", type=int, default=7, help="repetitions per operation per round (fastest kept)")
    ap.add_argument("--json", default="", help="also write the results here")
    args = ap.parse_args()
    best = {"a": {}, "b": {}}
    for r in range(args.rounds):
        for side in ("a", "b"):
            env = {"PYTHONPATH": getattr(args, side), "OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin"}
            res = subprocess.run([sys.executable, "-c", PROBE, str(args.reps)], capture_output=True, text=True,
                                 env=env, check=True)
            for k, v in json.loads(res.stdout).items():
                best[side][k] = min(v, best[side].get(k, float("inf")))
        print(f"round {r + 1}/{args.rounds} done", file=sys.stderr, flush=True)
    print("| operation | A (µs) | B (µs) | B / A |\n|---|---:|---:|---:|")
    for k, va in best["a"].items():
        vb = best["b"][k]
        print(f"| {k} | {va:.2f} | {vb:.2f} | {vb / va:.2f} |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(best, f, indent=1)


if __name__ == "__main__":
    main()
