#!/usr/bin/env python3
"""Runs braid-bench once and prints a markdown table of braid against its baselines.

Every ratio comes from the same run of the same process (matmul vs. cblas_sgemm, elementwise vs.
memcpy), taking the median of a few repetitions, because on a shared or virtual machine numbers taken
minutes apart differ more than the ratios we want to see. Usage: python3 benchmarks/run.py [--build-dir build]
"""

import argparse
import json
import os
import subprocess
import sys

MATMUL_SIZES = [256, 512, 1024, 2048]
MATMUL_GOAL = 0.95
# op -> (benchmark name, memcpy baseline moving the same bytes)
ELEMENTWISE = [
    ("add", "add_braid", f"memcpy_bytes/{3 << 26}"),
    ("mul", "mul_braid", f"memcpy_bytes/{3 << 26}"),
    ("exp", "exp_braid", f"memcpy_bytes/{2 << 26}"),
    ("add_ (in place, no allocation)", "add_inplace_braid", f"memcpy_bytes/{3 << 26}"),
]
ELEMENTWISE_GOAL = 0.6
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def sh(cmd, **kw):
    return subprocess.run(cmd, check=True, text=True, **kw)


def build(build_dir):
    """Configures a release tree if there is none and brings braid-bench up to date."""
    if not os.path.exists(os.path.join(build_dir, "meson-private", "coredata.dat")):
        sh(["meson", "setup", build_dir, "-Dbuildtype=release", "-Dbenchmarks=enabled"], cwd=ROOT,
           stdout=sys.stderr)
    options = json.loads(sh(["meson", "introspect", build_dir, "--buildoptions"], cwd=ROOT,
                            capture_output=True).stdout)
    values = {o["name"]: o["value"] for o in options}
    if values.get("buildtype") != "release" or values.get("b_sanitize", "none") != "none":
        print(f"warning: {build_dir} is buildtype={values.get('buildtype')} b_sanitize={values.get('b_sanitize')};"
              " numbers are only meaningful from a release build", file=sys.stderr)
    sh(["ninja", "-C", build_dir, "benchmarks/braid-bench"], cwd=ROOT, stdout=sys.stderr)
    return os.path.join(ROOT, build_dir, "benchmarks", "braid-bench"), values.get("buildtype")


def machine():
    """CPU model and core count from lscpu (the benchmark's own context lacks the model name)."""
    fields = {}
    try:
        for line in sh(["lscpu"], capture_output=True).stdout.splitlines():
            key, _, value = line.partition(":")
            fields[key.strip()] = value.strip()
    except (OSError, subprocess.CalledProcessError):
        pass
    cores = fields.get("CPU(s)", str(os.cpu_count()))
    return fields.get("Model name", "unknown CPU"), cores, fields


def medians(report):
    """run_name -> the median aggregate (or the single run when there was one repetition)."""
    out = {}
    for b in report["benchmarks"]:
        if b.get("run_type") == "aggregate" and b.get("aggregate_name") != "median":
            continue
        name = b.get("run_name", b["name"])
        out[name[: -len("/real_time")] if name.endswith("/real_time") else name] = b
    return out


def seconds(b):
    scale = {"ns": 1e-9, "us": 1e-6, "ms": 1e-3, "s": 1.0}[b.get("time_unit", "ns")]
    return b["real_time"] * scale


def verdict(ratio, goal):
    return "ok" if ratio >= goal else "**below goal**"


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--build-dir", default="build")
    parser.add_argument("--repetitions", type=int, default=5)
    parser.add_argument("--save-json", metavar="PATH", help="also write the raw Google Benchmark JSON here")
    parser.add_argument("--load-json", metavar="PATH", help="print the table of a saved run instead of running")
    parser.add_argument("--filter", default="", help="passed on as --benchmark_filter")
    args = parser.parse_args()

    if args.load_json:
        with open(args.load_json) as f:
            report = json.load(f)
        return print_tables(report, report["context"].get("braid_build_type", "?"))
    exe, buildtype = build(args.build_dir)
    cmd = [exe, "--benchmark_format=json", f"--benchmark_repetitions={args.repetitions}",
           "--benchmark_report_aggregates_only=true", "--benchmark_enable_random_interleaving=true"]
    if args.filter:
        cmd.append(f"--benchmark_filter={args.filter}")
    print("running: " + " ".join(os.path.relpath(c, ROOT) if c == exe else c for c in cmd), file=sys.stderr)
    report = json.loads(sh(cmd, capture_output=True).stdout)
    model, cores, _ = machine()
    report["context"].update(cpu_model=model, cpu_cores=cores, braid_build_type=buildtype)
    report["context"]["repetitions"] = args.repetitions
    if args.save_json:
        with open(args.save_json, "w") as f:
            json.dump(report, f, indent=1)
    return print_tables(report, buildtype)


def print_tables(report, buildtype):
    ctx = report["context"]
    runs = medians(report)
    model, cores = ctx.get("cpu_model"), ctx.get("cpu_cores")
    if model is None:
        model, cores, _ = machine()

    print(f"Machine: {model}, {cores} cores ({ctx.get('num_cpus')} CPUs seen by the benchmark,"
          f" {ctx.get('mhz_per_cpu')} MHz); braid threads: {ctx.get('braid_num_threads')},"
          f" OpenBLAS threads: {ctx.get('openblas_num_threads')}; braid build: {buildtype};"
          f" median of {ctx.get('repetitions', '?')} repetitions, wall-clock time.")
    print()
    print(f"| matmul float32 (N×N)·(N×N) | braid GFLOP/s | cblas_sgemm GFLOP/s | braid / cblas | goal ≥ {MATMUL_GOAL} |")
    print("|---|---:|---:|---:|---|")
    for n in MATMUL_SIZES:
        b, c = runs.get(f"matmul_braid/{n}"), runs.get(f"matmul_cblas/{n}")
        if not (b and c):
            continue
        flop = 2.0 * n ** 3
        gb, gc = flop / seconds(b) / 1e9, flop / seconds(c) / 1e9
        print(f"| N = {n} | {gb:.1f} | {gc:.1f} | {gb / gc:.2f} | {verdict(gb / gc, MATMUL_GOAL)} |")
    print()
    print(f"| elementwise, 16M float32 | braid GB/s | memcpy GB/s (same bytes) | braid / memcpy | goal ≥ {ELEMENTWISE_GOAL} |")
    print("|---|---:|---:|---:|---|")
    for label, name, base in ELEMENTWISE:
        b, m = runs.get(name), runs.get(base)
        if not (b and m):
            continue
        bb, bm = b["bytes_per_second"] / 1e9, m["bytes_per_second"] / 1e9
        goal = verdict(bb / bm, ELEMENTWISE_GOAL) if "in place" not in label else "(diagnostic)"
        print(f"| {label} | {bb:.1f} | {bm:.1f} | {bb / bm:.2f} | {goal} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
