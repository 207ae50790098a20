#!/usr/bin/env python3
"""Times one epoch of the main job as users run it: braid-train on Fashion-MNIST (60,000 images,
batch 64, the model zoo's CNN, Adam at 0.002, shuffled, normalised, batches from the DataLoader
with its prefetch thread) in one process with 2 threads and as 2 MPI ranks of 1 thread, and the same
model, optimiser and data in PyTorch (a torch DataLoader over the decoded images, 2 threads), in
one run. Reports each one's training time of the epoch (braid-train's own timer; start-up and the
test pass excluded) and the ratios. Issue 17's goal: one process no slower than 2 ranks.

--json FILE keeps the times with the run's machine, date, commit and command; --markdown prints
benchmarks/README.md's block (`python3 benchmarks/update_readme.py main_job` puts the committed
results/main_job.json in place). Needs Debian's dataset-fashion-mnist and PyTorch for
/usr/bin/python3 (python3-torch). Usage:
  /usr/bin/python3 benchmarks/main_job.py --build-dir build [--rounds 2] [--json FILE] [--markdown]
"""

import argparse
import gzip
import os
import re
import subprocess
import sys
import tempfile
import time

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from train_step import small_cnn  # noqa: E402  (the zoo's CNN, as train_step.py builds it)
import readme_tables  # noqa: E402

DATA = "/usr/share/datasets/fashion-mnist"
IMAGES = 60000


def braid_epoch_s(exe, ranks, threads):
    """Seconds of braid-train's training epoch, from its last progress line's rate."""
    cmd = [exe, "--epochs", "1", "--threads", str(threads), "--data", DATA]
    if ranks > 1:
        cmd = ["mpiexec", "-n", str(ranks)] + cmd
    with tempfile.TemporaryDirectory(prefix="braid_main_job_") as out:
        text = subprocess.run(cmd + ["--out", out], check=True, capture_output=True, text=True, cwd=out).stdout
    rates = re.findall(r"(\d+)/\1 (\d+) img/s took", text.replace("\r", "\n"))
    if not rates:
        raise RuntimeError(f"no epoch rate in braid-train's output:\n{text[-2000:]}")
    return IMAGES / float(rates[-1][1])


def idx(path):
    with gzip.open(path, "rb") as f:
        raw = f.read()
    dims = raw[3]
    shape = [int.from_bytes(raw[4 + 4 * i:8 + 4 * i], "big") for i in range(dims)]
    return np.frombuffer(raw, np.uint8, offset=4 + 4 * dims).reshape(shape)


def torch_epoch_s(threads):
    torch.set_num_threads(threads)
    torch.manual_seed(0)
    x = (torch.from_numpy(idx(f"{DATA}/train-images-idx3-ubyte.gz").copy()).float().div_(255).sub_(0.2860)
         .div_(0.3530).unsqueeze(1))
    y = torch.from_numpy(idx(f"{DATA}/train-labels-idx1-ubyte.gz").astype(np.int64))
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=64, shuffle=True)
    model = small_cnn()
    opt = torch.optim.Adam(model.parameters(), lr=0.002)
    loss_fn = torch.nn.CrossEntropyLoss()
    start = time.perf_counter()
    for xb, yb in loader:
        loss = loss_fn(model(xb), yb)
        opt.zero_grad()
        loss.backward()
        opt.step()
        loss.item()  # braid-train reads each step's loss for its progress line
    return time.perf_counter() - start


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build-dir", default="build")
    ap.add_argument("--rounds", type=int, default=2, help="alternating rounds; each configuration's best counts")
    ap.add_argument("--json", default="", help="also keep the times and the run's provenance here")
    ap.add_argument("--markdown", action="store_true", help="print the README's block: provenance, then the table")
    args = ap.parse_args()
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    exe = os.path.join(root, args.build_dir, "model_zoo", "braid-train")
    for need, what in ((exe, "braid-train: build braid first (ninja -C BUILD)"),
                       (f"{DATA}/train-images-idx3-ubyte.gz", "Fashion-MNIST: apt-get install dataset-fashion-mnist")):
        if not os.path.exists(need):
            sys.exit(f"main_job.py: {need} is missing ({what})")
    best = {}
    runs = [("braid, 1 process x 2 threads", lambda: braid_epoch_s(exe, 1, 2)),
            ("braid, 2 ranks x 1 thread", lambda: braid_epoch_s(exe, 2, 1)),
            (f"PyTorch {torch.__version__}, 1 process x 2 threads", lambda: torch_epoch_s(2))]
    for r in range(args.rounds):
        for name, run in runs:
            s = run()
            print(f"# round {r + 1}: {name}: {s:.2f} s", file=sys.stderr)
            best[name] = min(best.get(name, float("inf")), s)
    saved = {"meta": readme_tables.provenance(command=f"/usr/bin/python3 benchmarks/main_job.py --build-dir "
                                                       f"{args.build_dir}"),
             "images": IMAGES, "rows": [{"name": name, "seconds": best[name]} for name, _ in runs]}
    if args.json:
        readme_tables.save(args.json, **saved)
    readme_tables.emit("main_job", saved, args.markdown)

if __name__ == "__main__":
    main()
