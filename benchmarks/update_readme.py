#!/usr/bin/env python3
"""Replaces a table of benchmarks/README.md between its markers with what its script prints.

Each current table sits between `<!-- table: NAME -->` and `<!-- /table -->` (format:
benchmarks/readme_tables.py). TABLES says how each is printed from its committed results file, so

    python3 benchmarks/update_readme.py                  # every table from benchmarks/results/
    python3 benchmarks/update_readme.py NAME             # one of them
    python3 benchmarks/update_readme.py NAME FILE        # NAME from a script's --markdown output (- for stdin)
    python3 benchmarks/update_readme.py --check          # exit status 1 if a table is not its results file's

After a new measurement: run the script with --json benchmarks/results/... (or paste its --markdown
output with the third form), then commit the results file and the README together.
"""
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "benchmarks" / "README.md"
MARKER = re.compile(r"<!-- table: ([a-z0-9_]+) -->\n(.*?)<!-- /table -->", re.S)

# name -> the command (from the repository's root) that prints the table from committed results.
TABLES = {
    "onnx_bench": ["benchmarks/readme_tables.py", "onnx_bench", "benchmarks/results/onnx_latency.json"],
    "onnx_contrib": ["benchmarks/readme_tables.py", "onnx_bench", "benchmarks/results/onnx_contrib_latency.json"],
    "train_step": ["benchmarks/readme_tables.py", "train_step", "benchmarks/results/train_step.json"],
    "memory": ["benchmarks/readme_tables.py", "memory", "benchmarks/results/memory.json"],
    "main_job": ["benchmarks/readme_tables.py", "main_job", "benchmarks/results/main_job.json"],
    "device_bench_h200": ["benchmarks/readme_tables.py", "device_bench", "benchmarks/results/device_bench_h200.json"],
    "dist_bench": ["benchmarks/dist_bench.py", "--load-json", "benchmarks/results/distbench_2ranks.json",
                   "--markdown"],
    "dist_scaling": ["benchmarks/dist_scaling.py", "benchmarks/results/h100-host-openmpi", "--markdown"],
    "gpu_scaling": ["benchmarks/gpu_scaling.py", "--markdown"],
}


def tables(text):
    """{name: body} of every marked table, in the README's order."""
    found = {}
    for m in MARKER.finditer(text):
        if m.group(1) in found:
            raise SystemExit(f"benchmarks/README.md: table {m.group(1)} is marked twice")
        found[m.group(1)] = m.group(2)
    return found


def generated(name):
    return subprocess.run([sys.executable, *TABLES[name]], cwd=ROOT, stdout=subprocess.PIPE, text=True,
                          check=True).stdout


def replace(text, name, body):
    if name not in tables(text):
        raise SystemExit(f"benchmarks/README.md has no <!-- table: {name} --> ... <!-- /table -->")
    body = body if body.endswith("\n") else body + "\n"
    return MARKER.sub(lambda m: m.group(0) if m.group(1) != name else
                      f"<!-- table: {name} -->\n{body}<!-- /table -->", text)


def main(argv):
    text = README.read_text()
    if argv == ["--check"]:
        stale = [n for n in TABLES if tables(text).get(n) != generated(n)]
        for n in stale:
            print(f"benchmarks/README.md: table {n} differs from `python3 {' '.join(TABLES[n])}`")
        return 1 if stale else 0
    if len(argv) == 2:
        body = sys.stdin.read() if argv[1] == "-" else Path(argv[1]).read_text()
        text = replace(text, argv[0], body)
    else:
        for name in argv or TABLES:
            if name not in TABLES:
                raise SystemExit(f"unknown table '{name}'; known: {', '.join(TABLES)}")
            text = replace(text, name, generated(name))
    README.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
