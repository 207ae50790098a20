#!/usr/bin/env python3
"""The current tables of benchmarks/README.md, in one format.

Every marked table in the README sits between `<!-- table: NAME -->` and `<!-- /table -->` and
starts with four lines saying where it came from:

    - Machine: ...
    - Date: ...
    - Commit: ...
    - Command: `the command that measures it again`

A benchmark script keeps what it measured in a results file (its --json, with that provenance under
"meta") and prints the block from it (--markdown); `benchmarks/update_readme.py` puts a block
between its markers. The renderers of the scripts whose rows are plain numbers live here, so that a
table can be printed from a committed results file without PyTorch or onnxruntime:

    python3 benchmarks/readme_tables.py KIND RESULTS.json      # KIND: onnx_bench, train_step, ...
"""
import datetime
import json
import os
import platform
import shlex
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
META_KEYS = ("machine", "date", "commit", "command")


def provenance(machine=None, command=None):
    """This run's provenance: the machine, now, the checkout's commit and the command line."""
    try:
        commit = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"], capture_output=True,
                                text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", ROOT, "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True).stdout.strip()
        commit += " (with uncommitted changes)" if dirty else ""
    except (OSError, subprocess.CalledProcessError):
        commit = "unknown (not a git checkout)"
    if machine is None:
        machine = f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, {platform.system()}"
    if command is None:
        script = os.path.relpath(os.path.abspath(sys.argv[0]), ROOT)
        command = " ".join(["python3", script] + [shlex.quote(a) for a in sys.argv[1:]
                                                   if a not in ("--markdown",)])
    return {"machine": machine, "date": datetime.datetime.now().strftime("%Y-%m-%d %H:%M"), "commit": commit,
            "command": command}


def meta_lines(meta):
    missing = [k for k in META_KEYS if not meta.get(k)]
    if missing:
        raise ValueError(f"table provenance lacks {', '.join(missing)}: {meta}")
    return [f"- Machine: {meta['machine']}", f"- Date: {meta['date']}", f"- Commit: {meta['commit']}",
            f"- Command: `{meta['command']}`"]


def table(header, align, rows):
    """A markdown table: header cells, one alignment per column ('l' or 'r'), rows of cells."""
    assert len(header) == len(align) and all(len(r) == len(header) for r in rows), (header, rows)
    out = ["| " + " | ".join(header) + " |", "|" + "|".join("---:" if a == "r" else "---" for a in align) + "|"]
    out += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    return out


def block(meta, *parts):
    """The text between a table's markers: the provenance, then each part (a list of lines) after a blank."""
    lines = meta_lines(meta)
    for part in parts:
        lines += [""] + list(part)
    return "\n".join(lines) + "\n"


def save(path, meta, **content):
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
        json.dump({"meta": meta, **content}, f, indent=1)
        f.write("\n")


def load(path):
    with open(path) as f:
        return json.load(f)


def verdict(ratio, goal):
    return f"<= {goal} {'met' if ratio <= goal else '**not met**'}"


# --- renderers: a results file's content -> the README block ------------------------------------

def onnx_bench(saved):
    """benchmarks/onnx_bench.py: median latency per model and batch, braid against onnxruntime."""
    ort = saved.get("onnxruntime", "")
    rows = [[r["model"], "x".join(map(str, r["input"])).replace("xtokensx", " x ") +
             (" tokens" if "tokens" in r["input"] else ""),
             f"{r['braid_ms']:.2f}", f"{r['onnxruntime_ms']:.2f}", f"{r['ratio']:.2f}x"] for r in saved["rows"]]
    return block(saved["meta"], table(["model", "input", "braid (ms)", f"onnxruntime {ort} (ms)",
                                       "braid / onnxruntime"], "llrrr", rows))


def train_step(saved):
    """benchmarks/train_step.py: one training step at batch 64, braid against PyTorch."""
    rows = [[r["model"], f"{r['braid_ms']:.1f}", f"{r['torch_ms']:.1f}", f"{r['braid_ms'] / r['torch_ms']:.2f}",
             verdict(r["braid_ms"] / r["torch_ms"], r["goal"])] for r in saved["rows"]]
    return block(saved["meta"], table([f"model (batch 64, {saved['threads']} threads)", "braid ms/step",
                                       f"PyTorch {saved['torch']} ms/step", "braid / PyTorch", "goal"],
                                      "lrrrl", rows))


def memory(saved):
    """benchmarks/memory.py: peak resident memory of training steps and inference, whole and working."""
    parts = []
    for key, what, peer in (("training", "training step, batch 64", "PyTorch"),
                            ("inference", "inference, batch 8", "onnxruntime")):
        rows = []
        for r in saved[key]:
            b, bb, p, pb = r["braid_mib"], r["braid_base_mib"], r["peer_mib"], r["peer_base_mib"]
            rows.append([r["name"], f"{b:.0f} ({bb:.0f})", f"{p:.0f} ({pb:.0f})", f"{r.get('whole', b / p):.2f}",
                         f"{r.get('working', (b - bb) / (p - pb)):.2f}"])
        parts.append(table([f"{what}, {saved['threads']} threads", "braid peak MiB (baseline)",
                            f"{peer} peak MiB (baseline)", f"braid / {peer} whole", f"braid / {peer} working"],
                           "lrrrr", rows))
    return block(saved["meta"], *parts)


def main_job(saved):
    """benchmarks/main_job.py: one epoch of the main job, one process against 2 ranks and PyTorch."""
    rows = [[r["name"], f"{r['seconds']:.2f}", f"{saved['images'] / r['seconds']:,.0f}"] for r in saved["rows"]]
    one, two, pt = (r["seconds"] for r in saved["rows"][:3])  # one process, 2 ranks, PyTorch
    return block(saved["meta"], table(["one epoch of Fashion-MNIST, batch 64, 2 cores", "training s", "img/s"],
                                      "lrr", rows),
                 [f"One process / 2 ranks: {one / two:.2f} (goal <= 1.0, {'met' if one <= two else '**not met**'}); "
                  f"braid one process / PyTorch: {one / pt:.2f}."])


def device_bench(saved):
    """benchmarks/device_bench.py: workloads on one device, braid against PyTorch in the same run."""
    def num(x, digits):
        return "n/a" if x is None else f"{x:,.{digits}f}"

    def sig3(x):  # TFLOP/s to three significant figures
        return "n/a" if x is None else f"{x:.{max(0, 2 - len(str(int(x))) + 1)}f}" if x < 100 else f"{x:.0f}"
    # The host's time to issue an iteration (device_bench.py's Ms.host), where the run measured it.
    host = any(r.get("braid_host_ms") is not None for r in saved["rows"])
    rows = []
    for r in saved["rows"]:
        b, t, d = r.get("braid_ms"), r.get("torch_ms"), r.get("digits", 3)
        ratio = "n/a" if b is None or t is None else f"{r.get('ratio', b / t):.2f}"
        row = [r["workload"], r.get("braid_text") or num(b, d), r.get("torch_text") or num(t, d),
               r.get("braid_tflops_text") or sig3(r.get("braid_tflops")),
               r.get("torch_tflops_text") or sig3(r.get("torch_tflops")), ratio]
        if host:
            row.append(f"{num(r.get('braid_host_ms'), d)} / {num(r.get('torch_host_ms'), d)}")
        rows.append(row + [r.get("goal", "")])
    head = [f"workload ({saved['device']})", "braid ms", "PyTorch ms", "braid TFLOP/s", "PyTorch TFLOP/s",
            "braid / PyTorch (time)"] + (["host ms to issue (braid / PyTorch)"] if host else []) + ["goal"]
    return block(saved["meta"], table(head, "lrrrrr" + ("r" if host else "") + "l", rows))


def emit(kind, saved, markdown):
    """Prints a script's table: with --markdown the README block (provenance first), else the table alone."""
    text = RENDERERS[kind](saved)
    sys.stdout.write(text if markdown else text.split("\n\n", 1)[1])


RENDERERS = {"onnx_bench": onnx_bench, "train_step": train_step, "memory": memory, "main_job": main_job,
             "device_bench": device_bench}


if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[1] not in RENDERERS:
        sys.exit(f"usage: readme_tables.py {{{','.join(RENDERERS)}}} RESULTS.json")
    sys.stdout.write(RENDERERS[sys.argv[1]](load(sys.argv[2])))
