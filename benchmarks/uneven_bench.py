#!/usr/bin/env python3
"""Training on uneven clusters: braid-train's communication strategies on the main job (the zoo's CNN
on Fashion-MNIST), each with and without one rank slowed by a sleep per step (--slow-rank), one run
each, and the markdown table benchmarks/README.md records: bytes per step and rank (the counters
braid-train prints), steps per second, the time to a test accuracy and the final accuracy.

    python3 benchmarks/uneven_bench.py --build-dir build --ranks 4 [--limit 20000] [--epochs 3]
        [--slow-ms 40] [--target 0.9] [--only "DDP,PS sync"]

Steps per second count every rank's optimizer steps (the workers' pushes for a parameter server)
over the run's wall time, evaluation included; 4 ranks on a 2-core machine are oversubscribed, so
compare rows with each other, not with a cluster.
"""
import argparse
import csv
import os
import re
import subprocess
import sys
import tempfile
import time

METHODS = [
    ("DDP (all-reduce)", []),
    # One server: the global batch is 64 rounded down to a multiple of the workers (63 for 3).
    ("parameter server, synchronous", ["--ps", "1", "--staleness", "0"]),
    ("parameter server, staleness 2", ["--ps", "1", "--staleness", "2"]),
    ("parameter server, asynchronous", ["--ps", "1", "--staleness", "-1"]),
    # Workers claim micro-batches from the server (Note [Claimed batches]): a slow one takes fewer.
    ("parameter server, staleness 2, dynamic batches",
     ["--ps", "1", "--staleness", "2", "--dynamic-batches", "1"]),
    # Nesterov at rate 1.0 with momentum 0.7: at H = 50 at or below DDP's loss on two seeds at 2 and
    # 4 ranks (benchmarks/README.md, "Local SGD and DiLoCo"); DiLoCo's momentum 0.9 overshoots here.
    ("local SGD, H = 10 (Nesterov outer)",
     ["--local-sgd", "10", "--outer", "nesterov", "--outer-lr", "1.0", "--outer-momentum", "0.7"]),
    ("local SGD, H = 50 (Nesterov outer)",
     ["--local-sgd", "50", "--outer", "nesterov", "--outer-lr", "1.0", "--outer-momentum", "0.7"]),
    ("DDP, SGD (DGC's baseline: DGC keeps SGD's momentum in its hook)", ["--optimizer", "sgd"]),
    ("DGC top-0.1% (SGD)", ["--compress", "dgc:0.001", "--optimizer", "sgd"]),
    ("PowerSGD rank 2", ["--compress", "powersgd:2"]),
]


def run(build, ranks, args, out):
    exe = os.path.join(build, "model_zoo", "braid-train")
    cmd = ["mpiexec", "-n", str(ranks), exe, "--threads", "1", "--out", out, *args]
    env = dict(os.environ, BRAID_NUM_THREADS="1", OMP_WAIT_POLICY="passive", BRAID_TIMEOUT="600")
    start = time.time()
    r = subprocess.run(cmd, env=env, capture_output=True, text=True)
    wall = time.time() - start
    if r.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed:\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}")
    return r.stdout.replace("\r", "\n"), wall


def summarise(out_dir, stdout, wall, ranks, target):
    with open(os.path.join(out_dir, "log.csv")) as f:
        rows = list(csv.DictReader(f))
    steps = int(rows[-1]["step"])
    ps = re.search(r"(\d+) server\w* and (\d+) workers", stdout)
    trainers = int(ps.group(2)) if ps else ranks
    m = re.search(r"communication: ([\d.]+) KB per step", stdout)
    warm = re.search(r"after the hook's warm-up \(steps [\d]+ to [\d]+\): ([\d.]+) KB per step", stdout)
    reached = [float(r["seconds"]) for r in rows if float(r["test_accuracy"]) >= target]
    return {"kb": float(m.group(1)) if m else float("nan"), "kb_warm": float(warm.group(1)) if warm else None, "steps_per_s": steps * trainers / wall,
            "to_target": reached[0] if reached else None, "final": float(rows[-1]["test_accuracy"]), "loss": float(rows[-1]["test_loss"]), "wall": wall}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build-dir", default="build")
    ap.add_argument("--ranks", type=int, default=4)
    ap.add_argument("--limit", type=int, default=0)
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--slow-ms", type=int, default=40)
    ap.add_argument("--target", type=float, default=0.9)
    ap.add_argument("--no-build", action="store_true", help="run the build folder's braid-train as it is (a copy)")
    ap.add_argument("--only", default="", help="comma-separated names (or parts of names) of methods to run")
    args = ap.parse_args()
    if not args.no_build:
        subprocess.run(["ninja", "-C", args.build_dir, "model_zoo/braid-train"], check=True, stdout=subprocess.DEVNULL)
    common = ["--epochs", str(args.epochs)] + (["--limit", str(args.limit)] if args.limit else [])
    wanted = [m.strip() for m in args.only.split(",") if m.strip()]
    print(f"1-minute load average at start: {os.getloadavg()[0]:.2f}\n")
    print(f"| method | rank {args.ranks - 1} slowed {args.slow_ms} ms/step | KB per step and rank | steps/s (all ranks) "
          f"| time to {args.target:.0%} test accuracy | final test accuracy | final test loss | wall s |")
    print("|---|---|---:|---:|---:|---:|---:|---:|")
    with tempfile.TemporaryDirectory() as tmp:
        for name, extra in METHODS:
            if wanted and not any(w in name for w in wanted):
                continue
            if "--ps" in extra:
                extra = extra + ["--batch-size", str(64 // (args.ranks - 1) * (args.ranks - 1))]
            for slow in (False, True):
                out = os.path.join(tmp, f"{len(os.listdir(tmp))}")
                flags = common + extra + (["--slow-rank", f"{args.ranks - 1}:{args.slow_ms}"] if slow else [])
                stdout, wall = run(args.build_dir, args.ranks, flags, out)
                s = summarise(out, stdout, wall, args.ranks, args.target)
                warm = f" ({s['kb_warm']:.1f} after warm-up)" if s["kb_warm"] is not None else ""
                reach = f"{s['to_target']:.0f} s" if s["to_target"] is not None else "not reached"
                print(f"| {name} | {'yes' if slow else 'no'} | {s['kb']:.1f}{warm} | {s['steps_per_s']:.1f} | {reach} | "
                      f"{s['final']:.4f} | {s['loss']:.4f} | {s['wall']:.0f} |", flush=True)
    print(f"\n1-minute load average at the end: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
