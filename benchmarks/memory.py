#!/usr/bin/env python3
"""Peak resident memory of a training step and of an ONNX inference, braid against its peers, in one
run on the same machine.

Training: 20 steps (forward, cross-entropy, backward, Adam) at batch 64 of benchmarks/train_step.py's
models, braid through braid-train-step (benchmarks/train_step.cpp) and PyTorch through the same
models in train_step.py. Inference: 20 runs at batch 8 of benchmarks/onnx_bench.py's models, braid
through braid-onnx-bench and onnxruntime through an InferenceSession. Each measurement is a fresh
process; its peak resident set (VmHWM) comes from the kernel when it exits (wait4's ru_maxrss). Each
engine's baseline is measured too: the peers' processes report their resident set after their
imports, before any model exists, and braid's programs are run once doing nothing (its libraries
loaded, no model), so that the table shows the working memory (peak minus baseline) of each engine
next to the whole processes.

Needs PyTorch for /usr/bin/python3 (Debian's python3-torch) and onnxruntime for the python3 first
on PATH (both installed by scripts/install_deps.sh with BRAID_WITH_TORCH=1). --json FILE keeps the
peaks with the run's machine, date, commit and command; --markdown prints benchmarks/README.md's block
(`python3 benchmarks/update_readme.py memory` puts the committed results/memory.json in place). Usage:
  python3 benchmarks/memory.py [--build build] [--threads 2] [--json FILE] [--markdown]
"""
import argparse
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
TRAIN = {"mlp": (64, 1, 28, 28), "cnn": (64, 1, 28, 28), "resnet": (64, 3, 32, 32), "transformer": (64, 32)}

TORCH_STEP = r"""
import os, sys
sys.path.insert(0, {here!r})
import torch
import train_step as ts
def rss():
    return int([l for l in open('/proc/self/status') if l.startswith('VmRSS')][0].split()[1])
base = rss()
torch.set_num_threads({threads})
model = {{"mlp": ts.mlp, "cnn": ts.small_cnn, "resnet": ts.resnet, "transformer": ts.Encoder}}[{name!r}]()
shape = {shape!r}
x = torch.randint(0, model.vocab, shape) if {name!r} == "transformer" else torch.randn(*shape)
y = torch.randint(0, 10, (shape[0],))
opt = torch.optim.Adam(model.parameters())
for _ in range(20):
    loss = torch.nn.functional.cross_entropy(model(x), y)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
print(base)
"""

ORT_RUN = r"""
import numpy as np
def rss():
    return int([l for l in open('/proc/self/status') if l.startswith('VmRSS')][0].split()[1])
import onnxruntime as ort
base = rss()
o = ort.SessionOptions()
o.intra_op_num_threads, o.inter_op_num_threads = {threads}, 1
s = ort.InferenceSession({path!r}, o, providers=["CPUExecutionProvider"])
shape = {shape!r}
if shape[1] == "tokens":  # the text encoders' int64 inputs, as onnx_bench.py feeds them
    import sys
    sys.path.insert(0, {here!r})
    from onnx_bench import token_feeds
    feeds = token_feeds(s, (shape[0], shape[2]))
else:
    feeds = {{s.get_inputs()[0].name: np.random.default_rng(0).standard_normal(shape).astype(np.float32)}}
for _ in range(20):
    s.run(None, feeds)
print(base)
"""


def run_peak(cmd, env=None, may_fail=False):
    """Runs cmd in a fresh process and returns (peak RSS MiB, stdout); ru_maxrss is in KiB on Linux."""
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    _, status, usage = os.wait4(p.pid, 0)
    out, err = p.stdout.read(), p.stderr.read()
    if os.waitstatus_to_exitcode(status) and not may_fail:
        raise SystemExit(f"memory.py: {' '.join(cmd)} failed:\n{err}")
    return usage.ru_maxrss / 1024, out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", default="build")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json", default="", help="also keep the peaks and the run's provenance here")
    ap.add_argument("--markdown", action="store_true", help="print the README's block: provenance, then the tables")
    args = ap.parse_args()
    sys.path.insert(0, HERE)
    import readme_tables  # noqa: E402
    env = dict(os.environ, BRAID_NUM_THREADS=str(args.threads))
    step = os.path.join(args.build, "benchmarks", "braid-train-step")
    onnx_bench = os.path.join(args.build, "benchmarks", "braid-onnx-bench")

    # braid's baselines: the programs with their libraries loaded and nothing run.
    step_base, _ = run_peak([step, "--benchmark_filter=^$"], env)
    onnx_base, _ = run_peak([onnx_bench], env, may_fail=True)  # prints its usage and exits
    saved = {"meta": readme_tables.provenance(), "threads": args.threads, "training": [], "inference": []}
    for name, shape in TRAIN.items():
        b, _ = run_peak([step, f"--benchmark_filter=^train_step/{name}/", "--benchmark_min_time=0.01",
                         "--benchmark_repetitions=1"], env)
        t, out = run_peak(["/usr/bin/python3", "-c", TORCH_STEP.format(here=HERE, threads=args.threads, name=name,
                                                                     shape=shape)])
        saved["training"].append({"name": name, "braid_mib": b, "braid_base_mib": step_base, "peer_mib": t,
                                  "peer_base_mib": int(out.split()[-1]) / 1024})

    from onnx_bench import MODELS  # noqa: E402  (the same models and shapes as the latency table)

    tmp = tempfile.mkdtemp(prefix="braid_memory_")
    for name, (path, sample) in MODELS.items():
        if path is None:  # the ResNet-18 built from braid's layers, exported as onnx_bench.py does
            path = os.path.join(tmp, "resnet18.onnx")
            subprocess.run([onnx_bench, "export-resnet18", path], check=True, capture_output=True)
        if not os.path.exists(path):
            print(f"# {name}: {path} missing; skipped", file=sys.stderr)
            continue
        shape = (8, *sample)
        spec = f"tokens:8x{sample[1]}" if sample[0] == "tokens" else "x".join(map(str, shape))
        b, _ = run_peak([onnx_bench, "time", path, spec, "20"], env)
        o, out = run_peak([sys.executable, "-c", ORT_RUN.format(threads=args.threads, path=path, shape=shape,
                                                                here=HERE)])
        label = spec.replace("tokens:8x", "8 x ") + (" tokens" if sample[0] == "tokens" else "")
        saved["inference"].append({"name": f"{name} {label}", "braid_mib": b, "braid_base_mib": onnx_base,
                                   "peer_mib": o, "peer_base_mib": int(out.split()[-1]) / 1024})
    if args.json:
        readme_tables.save(args.json, **saved)
    readme_tables.emit("memory", saved, args.markdown)

if __name__ == "__main__":
    main()
