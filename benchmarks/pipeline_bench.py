#!/usr/bin/env python3
"""Pipeline benchmark: runs braid-pipeline-bench under mpiexec and prints the markdown tables that
benchmarks/README.md records (bubble against GPipe's formula, peak memory, partitioner predicted
against measured, throughput against data parallelism), and writes the Gantt charts.

    python3 benchmarks/pipeline_bench.py --build-dir build [--ranks 2] [--gantt-dir benchmarks]
    python3 benchmarks/pipeline_bench.py --build-dir build --ranks 2 --bubble-only --wide   # 1024-wide stages
"""
import argparse
import json
import os
import subprocess
import sys


def run(build, ranks, mode, gantt_dir):
    exe = os.path.join(build, "benchmarks", "braid-pipeline-bench")
    cmd = ["mpiexec", "-n", str(ranks), exe, mode] + ([gantt_dir] if gantt_dir else [])
    env = dict(os.environ, BRAID_NUM_THREADS="1", OMP_WAIT_POLICY="passive")
    print("running:", " ".join(cmd), file=sys.stderr)
    out = subprocess.run(cmd, env=env, check=True, capture_output=True, text=True).stdout
    return [json.loads(l) for l in out.splitlines() if l.startswith("{")]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build-dir", default="build")
    ap.add_argument("--ranks", type=int, nargs="+", default=[2, 4])
    ap.add_argument("--gantt-dir", default="")
    ap.add_argument("--wide", action="store_true", help="the bubble table on 1024-wide layers (bubble-wide)")
    ap.add_argument("--bubble-only", action="store_true", help="only the bubble table")
    args = ap.parse_args()
    subprocess.run(["ninja", "-C", args.build_dir, "benchmarks/braid-pipeline-bench"], check=True,
                   stdout=subprocess.DEVNULL)
    load = os.getloadavg()[0]
    print(f"1-minute load average at start: {load:.2f}\n")
    print("**Bubble**: measured from the gathered timeline (1 − time in forward and backward / (K × step time)), "
          "median of 5 steps, against each schedule's closed form (GPipe and 1F1B (K−1)/(M+K−1), interleaved with "
          "V = 2 (K−1)/(VM+K−1), ZB-H1 (K−1)/(3M+K−1)) and the validator's simulation.\n")
    print("| K | M | schedule | measured | formula | simulated | measured − formula (points) |")
    print("|---:|---:|---|---:|---:|---:|---:|")
    for k in args.ranks:
        for r in run(args.build_dir, k, "bubble-wide" if args.wide else "bubble", args.gantt_dir):
            print(f"| {k} | {r['M']} | {r['schedule']} | {r['measured']:.3f} | {r['formula']:.3f} | "
                  f"{r['simulated']:.3f} | {100 * (r['measured'] - r['formula']):+.1f} |")
    if args.bubble_only:
        print(f"\n1-minute load average at the end: {os.getloadavg()[0]:.2f}")
        return
    print("\n**Peak memory of a step** (M = 8 micro-batches of 64 rows, 8 × Linear 256 + Tanh): "
          "tensor storage alive at the step's high point, less what was alive at its start.\n")
    print("| K | schedule | recompute | stage 0 MB | largest stage MB |")
    print("|---:|---|---|---:|---:|")
    for k in args.ranks:
        for r in run(args.build_dir, k, "memory", ""):
            print(f"| {k} | {r['schedule']} | {r['recompute']} | {r['peak_bytes_stage0'] / 1e6:.2f} | "
                  f"{r['peak_bytes_max_stage'] / 1e6:.2f} |")
    print("\n**Partitioner**: zoo resnet, micro-batch 16, 1F1B with M = 4; predicted = the profile's forward + "
          "backward of the stage's layers per micro-batch; measured = the stage's forward + backward time per "
          "micro-batch in the pipeline (median of 5 steps).\n")
    print("| K | stage | predicted ms | measured ms | measured / predicted |")
    print("|---:|---:|---:|---:|---:|")
    for k in args.ranks:
        for r in run(args.build_dir, k, "partition", ""):
            print(f"| {k} | {r['stage']} | {r['predicted_s'] * 1e3:.2f} | {r['measured_s'] * 1e3:.2f} | "
                  f"{r['measured_s'] / r['predicted_s']:.2f} |")
    print("\n**Throughput**: zoo resnet, global batch 64, SGD; the pipeline (partitioned, 1F1B, M = 4) against "
          "DistributedDataParallel on the same ranks (batch 64 / K per rank); median of 6 steps.\n")
    print("| K | pipeline ms/step | data-parallel ms/step | pipeline samples/s | data-parallel samples/s | pipeline / data-parallel |")
    print("|---:|---:|---:|---:|---:|---:|")
    for k in args.ranks:
        for r in run(args.build_dir, k, "throughput", ""):
            print(f"| {k} | {r['pipeline_step_s'] * 1e3:.1f} | {r['data_parallel_step_s'] * 1e3:.1f} | "
                  f"{r['pipeline_samples_per_s']:.0f} | {r['data_parallel_samples_per_s']:.0f} | "
                  f"{r['pipeline_samples_per_s'] / r['data_parallel_samples_per_s']:.2f} |")
    print(f"\n1-minute load average at the end: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
