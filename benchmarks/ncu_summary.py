#!/usr/bin/env python3
"""Sums the kernel times of an Nsight Compute CSV (ncu --csv --metrics gpu__time_duration.sum) by
kernel name and prints a markdown table: the kernels that take the most device time, their launch
counts and their share. scripts/gpu_check.sh writes such a CSV with BRAID_CHECK_PROFILE=SUITE.

  python3 benchmarks/ncu_summary.py ncu.csv [--steps N] [--top 25]
"""
import argparse
import collections
import csv
import io
import sys


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("csv")
    ap.add_argument("--steps", type=int, default=1, help="steps the profiled run made (per-step times)")
    ap.add_argument("--top", type=int, default=25)
    a = ap.parse_args()
    text = open(a.csv, encoding="utf-8", errors="replace").read()
    start = text.find('"ID"')
    if start < 0:
        sys.exit(f"{a.csv}: no ncu CSV table in it")
    total = collections.Counter()
    count = collections.Counter()
    for row in csv.DictReader(io.StringIO(text[start:])):
        if row.get("Metric Name") != "gpu__time_duration.sum":
            continue
        scale = {"ns": 1e-6, "nsecond": 1e-6, "us": 1e-3, "usecond": 1e-3, "ms": 1.0, "msecond": 1.0,
                 "s": 1e3, "second": 1e3}.get(row.get("Metric Unit", ""), None)
        if scale is None:
            continue
        name = row.get("Kernel Name", "?")
        name = name.split("(")[0] if not name.startswith("void ") else name[5:].split("(")[0]
        total[name] += float(row["Metric Value"].replace(",", "")) * scale
        count[name] += 1
    all_ms = sum(total.values())
    print(f"{sum(count.values())} kernels, {all_ms:.2f} ms of device time in all, "
          f"{all_ms / a.steps:.2f} ms per step over {a.steps} step(s)\n")
    print("| kernel | launches | ms | share |")
    print("|---|---:|---:|---:|")
    for name, ms in total.most_common(a.top):
        print(f"| `{name[:90]}` | {count[name]} | {ms:.2f} | {100 * ms / all_ms:.1f}% |")


if __name__ == "__main__":
    main()
