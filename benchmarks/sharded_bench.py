"""Sharded data parallelism's memory and traffic against ZeRO's formulas: runs braid-sharded-bench
plainly and under `mpiexec -n 2` and `-n 4` and prints the Markdown table that benchmarks/README.md
records (one row per ranks x mode: model-state bytes per rank counted from the tensors held and as
the allocator's live bytes, the formula, their ratio, the peak bytes during a step, ring elements
sent per step over Psi, and the step time against DistributedDataParallel's in the same run).

    python3 benchmarks/sharded_bench.py [build dir] [width] [layers] [steps]
"""
import json
import subprocess
import sys
from pathlib import Path


def run(build, ranks, args):
    exe = str(Path(build) / "benchmarks" / "braid-sharded-bench")
    cmd = ([exe] if ranks == 1 else ["mpiexec", "-n", str(ranks), exe]) + args
    out = subprocess.run(cmd, stdout=subprocess.PIPE, text=True, check=True,
                         env={**__import__("os").environ, "BRAID_NUM_THREADS": "1"}).stdout
    return [json.loads(line) for line in out.splitlines() if line.startswith("{")]


def main():
    build = sys.argv[1] if len(sys.argv) > 1 else "build"
    args = sys.argv[2:] or ["512", "8", "5"]
    rows = [r for n in (1, 2, 4) for r in run(build, n, args)]
    psi = rows[0]["psi"]
    mib = 1024.0 * 1024.0
    print(f"Psi = {psi:,} parameters (float32, Adam); bytes per rank in MiB.\n")
    print("| ranks | mode | formula | counted | live after the step | counted / formula | peak in a step "
          "| ring elements / Psi | step vs DDP |")
    print("|---:|---|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['ranks']} | {r['mode']} | {r['formula_bytes'] / mib:.2f} | {r['counted_bytes'] / mib:.2f} | "
              f"{r['live_bytes'] / mib:.2f} | {r['counted_bytes'] / r['formula_bytes']:.3f} | "
              f"{r['peak_bytes'] / mib:.2f} | {r['bus_over_psi']:.3f} | {r['vs_ddp']:.2f} |")


if __name__ == "__main__":
    main()
