#!/usr/bin/env python3
"""Activation memory of a training step under autocast: what one forward (and its loss) keeps alive
for backward, braid against PyTorch's autocast on the same models, in one run.

braid runs on the shadow device (the CPU's kernels behind a device of its own), whose capability
set chooses the autocast rule (Note [Autocast] in src/ops/autocast.cpp): BRAID_SHADOW_CAPS=cuda is
the GPU's (the products return bfloat16, so activations are half), =cpu the CPU's (they return
float32). The bytes are memory_allocated(device) after the forward and the loss minus before: every
tensor the graph keeps for backward, plus the outputs. PyTorch (Debian's /usr/bin/python3,
python3-torch) counts the bytes of the distinct storages its autograd graph saves
(torch.autograd.graph.saved_tensors_hooks), under torch.autocast("cpu", bfloat16), whose products
return bfloat16 as its CUDA autocast's do. Each configuration is a fresh process.

Models: a small ResNet-style CNN (conv-BN-ReLU blocks, max pooling, a linear head) at batch 32 on
32x32 images, and two Transformer encoder layers (d_model 256, 4 heads, feed-forward 1024) at batch
16 of 128 tokens with a linear head. Usage:
  python3 benchmarks/amp_memory.py [--build build] [--markdown]
"""
import argparse
import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))

# One model definition, written once for both engines' nn modules (same names and arguments).
MODELS = r"""
def cnn(nn):
    return nn.Sequential(nn.Conv2d(3, 32, 3, 1, 1), nn.BatchNorm2d(32), nn.ReLU(), nn.Conv2d(32, 32, 3, 1, 1),
                         nn.BatchNorm2d(32), nn.ReLU(), nn.MaxPool2d(2), nn.Conv2d(32, 64, 3, 1, 1),
                         nn.BatchNorm2d(64), nn.ReLU(), nn.Conv2d(64, 64, 3, 1, 1), nn.BatchNorm2d(64), nn.ReLU(),
                         nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(64, 10))

def encoder(nn):
    return nn.Sequential(nn.TransformerEncoderLayer(256, 4, 1024, 0.0, batch_first=True),
                         nn.TransformerEncoderLayer(256, 4, 1024, 0.0, batch_first=True), nn.Flatten(),
                         nn.Linear(128 * 256, 10))

SHAPES = {"cnn": (32, 3, 32, 32), "encoder": (16, 128, 256)}
"""

BRAID = MODELS + r"""
import braid
nn = braid.nn
dev = braid.Device.parse("shadow")
name, amp = sys.argv[1], sys.argv[2] == "1"
model = {"cnn": cnn, "encoder": encoder}[name](nn)
model.to(dev)
x = braid.randn(list(SHAPES[name])).to(dev)
y = braid.randint(0, 10, [SHAPES[name][0]]).to(dev)
before = braid.memory_allocated(dev)
with braid.autocast(braid.bfloat16, enabled=amp):
    loss = nn.functional.cross_entropy(model(x), y)
print(braid.memory_allocated(dev) - before)
loss.backward()
"""

TORCH = MODELS + r"""
import torch
nn = torch.nn
name, amp = sys.argv[1], sys.argv[2] == "1"
torch.manual_seed(0)
model = {"cnn": cnn, "encoder": encoder}[name](nn)
x = torch.randn(*SHAPES[name])
y = torch.randint(0, 10, (SHAPES[name][0],))
saved = {}
def pack(t):
    s = t.untyped_storage() if hasattr(t, "untyped_storage") else t.storage()
    saved[s.data_ptr()] = s.nbytes()
    return t
with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=amp):
        out = model(x)
        loss = nn.functional.cross_entropy(out, y)
print(sum(saved.values()) + out.nelement() * out.element_size())
loss.backward()
"""


def run(cmd, env=None):
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
    if r.returncode != 0:
        sys.exit(f"{' '.join(cmd[:2])} failed:\n{r.stderr[-2000:]}")
    return int(r.stdout.strip().splitlines()[-1])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default="build")
    ap.add_argument("--markdown", action="store_true")
    args = ap.parse_args()
    build = os.path.abspath(args.build)
    env = dict(os.environ, PYTHONPATH=os.path.join(build, "bindings", "python"), BRAID_NUM_THREADS="2")
    rows = {}
    for name in ("cnn", "encoder"):
        r = {}
        for label, caps, amp in (("braid float32", "cpu", "0"), ("braid autocast, CPU rule", "cpu", "1"),
                                 ("braid autocast, GPU rule", "cuda", "1")):
            r[label] = run([sys.executable, "-c", "import sys\n" + BRAID, name, amp], dict(env, BRAID_SHADOW_CAPS=caps))
        for label, amp in (("PyTorch float32", "0"), ("PyTorch autocast", "1")):
            r[label] = run(["/usr/bin/python3", "-c", "import sys\n" + TORCH, name, amp])
        rows[name] = r
    if not args.markdown:
        print(json.dumps(rows, indent=1))
        return
    labels = list(rows["cnn"])
    print("| model | " + " | ".join(labels) + " | braid GPU rule / PyTorch autocast |")
    print("|---" * (len(labels) + 2) + "|")
    for name, r in rows.items():
        cells = [f"{r[k] / 2**20:.1f} MiB" for k in labels]
        ratio = r["braid autocast, GPU rule"] / r["PyTorch autocast"]
        print(f"| {name} | " + " | ".join(cells) + f" | {ratio:.2f} |")


if __name__ == "__main__":
    main()
