#!/usr/bin/env python3
"""Ring cost model against measured all-reduce times at 2 to 16 ranks.

Reads braid-allreduce-bench records (JSON lines from `sweep` and `comm` runs, one set per rank
count) from a results folder, fits the ring model's constants on the 2-rank run (alpha: a 4-byte
MPI_Sendrecv exchange; beta: the 64 MiB exchange per byte; gamma: the add loop per byte; o: braid's
barrier minus MPI's), and prints a markdown table of predicted T(p, n) = o + 2(p-1) alpha +
2 (p-1)/p n beta + (p-1)/p n gamma against what braid, MPI_Allreduce and the ideal ring measured.

    python3 benchmarks/dist_scaling.py benchmarks/results/h100-host-openmpi [--markdown]

--markdown prints benchmarks/README.md's block, provenance first, from the folder's meta.json.
"""
import argparse
import glob
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import readme_tables  # noqa: E402


def load(folder):
    """{p: [records]} from sweep_p*.jsonl / comm_p*.jsonl (a {"kind": "ranks"} line switches p)."""
    runs = {}
    for path in sorted(glob.glob(os.path.join(folder, "*.jsonl"))):
        name = os.path.basename(path)
        p = None
        digits = "".join(c for c in name.split("_p")[1].split("_")[0].split(".")[0] if c.isdigit())
        if digits:
            p = int(digits)
        for line in open(path):
            line = line.strip()
            if not line.startswith("{"):
                continue
            r = json.loads(line)
            if r["kind"] == "ranks":
                p = r["p"]
                continue
            runs.setdefault(p, []).append(r)
    return runs


def model(rs):
    sr = {r["bytes"]: r["seconds"] for r in rs if r["kind"] == "sendrecv"}
    add = {r["bytes"]: r["seconds"] for r in rs if r["kind"] == "add"}
    bar = next(r for r in rs if r["kind"] == "barrier")
    big = max(sr)
    return {
        "alpha": sr[min(sr)],
        "beta": sr[big] / big,
        "gamma": add[max(add)] / max(add),
        "o": max(0.0, bar["braid"] - bar["mpi"]),
    }


def predict(m, p, n):
    return m["o"] + 2 * (p - 1) * m["alpha"] + 2 * (p - 1) / p * n * (m["beta"]) + (p - 1) / p * n * m["gamma"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("folder")
    ap.add_argument("--markdown", action="store_true", help="print the README's block: provenance (FOLDER/meta.json) first")
    args = ap.parse_args()
    runs = load(args.folder)
    if args.markdown:
        print("\n".join(readme_tables.meta_lines(readme_tables.load(os.path.join(args.folder, "meta.json")))) + "\n")
    m = model(runs[2])
    print(f"Constants from the 2-rank run: alpha = {m['alpha'] * 1e6:.2f} µs, beta = {m['beta'] * 1e9:.3f} ns/B "
          f"({1 / m['beta'] / 1e9:.1f} GB/s), gamma = {m['gamma'] * 1e9:.3f} ns/B, o = {m['o'] * 1e6:.2f} µs.\n")
    print("| ranks p | buffer | predicted o + T(p, n) ms | braid ms | MPI_Allreduce ms | ideal ring ms | "
          "braid / predicted | braid / MPI |")
    print("|---:|---|---:|---:|---:|---:|---:|---:|")
    for p in sorted(k for k in runs if k):
        rs = runs[p]
        rows = []
        for r in rs:
            if r["kind"] == "allreduce" and r["bytes"] in (1 << 20, 64 << 20):
                rows.append((f"{r['bytes'] >> 20} MiB", r["bytes"], r))
            if r["kind"] == "gradients":
                n = sum(r["bucket_bytes"])
                label = "ResNet-18 gradients (44.6 MiB)" if r["model"] == "resnet18" else f"zoo {r['model']} gradients ({n // 1000} KB)"
                rows.append((label, n, r))
        for label, n, r in rows:
            pred = predict(m, p, n)
            print(f"| {p} | {label} | {pred * 1e3:.3f} | {r['braid'] * 1e3:.3f} | {r['mpi'] * 1e3:.3f} | "
                  f"{r['ideal'] * 1e3:.3f} | {r['braid'] / pred:.2f} | {r['braid'] / r['mpi']:.2f} |")


if __name__ == "__main__":
    main()
