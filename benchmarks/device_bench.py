#!/usr/bin/env python3
"""Runs braid-device-bench (benchmarks/device_bench.cpp) and the same workloads in PyTorch on the same
device in one run, and prints a markdown table: time per iteration, achieved TFLOP/s, and the ratio
braid / PyTorch (time; goal <= 1.0 for the steps, throughput >= 0.95x for GEMM). For the GPT-2 step
it also prints the model FLOP utilisation against --peak-tflops (H100 SXM bf16 dense: 989).

  python3 benchmarks/device_bench.py --build-dir build --device cuda            # the GPU table
  /usr/bin/python3 benchmarks/device_bench.py --build-dir build --device cpu --small  # a CPU check

PyTorch runs what braid runs: the same shapes, the same models (ResNet-50 as torchvision lays it
out, built here so torchvision is not needed; GPT-2-small as pre-norm nn.TransformerEncoderLayer
blocks under a causal mask), autocast(bfloat16) for the AMP steps, float32 matmul without TF32
except in the rows that say TF32 (braid's set_float32_matmul_precision("high"), PyTorch's allow_tf32).
On a GPU the ResNet-50 AMP step runs channels-last in both: braid by itself, PyTorch asked to
(model and input in torch.channels_last, its recommended AMP recipe).

--json FILE keeps the rows with the run's device, date, commit and command; --markdown prints
benchmarks/README.md's block (`python3 benchmarks/update_readme.py device_bench_h200` puts the
committed results/device_bench_h200.json in place).
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

import torch
from torch import nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import readme_tables  # noqa: E402


def sync(dev):
    if dev.type == "cuda":
        torch.cuda.synchronize()


class Ms(float):
    """A median time per iteration in ms, with .host: the median time until the host had issued the
    iteration, before the device synchronisation (close to the time itself: bound by the host)."""

    def __new__(cls, ms, host):
        m = super().__new__(cls, ms)
        m.host = host
        return m


def median_ms(dev, body, repeats):
    for _ in range(3):
        body()
    sync(dev)
    ms, host = [], []
    for _ in range(repeats):
        t = time.perf_counter()
        body()
        host.append(1000 * (time.perf_counter() - t))
        sync(dev)
        ms.append(1000 * (time.perf_counter() - t))
    return Ms(statistics.median(ms), statistics.median(host))


def autocast(dev, on=True):
    return torch.autocast(device_type=dev.type, dtype=torch.bfloat16, enabled=on)


def gemm(dev, small, repeats):
    out = {}
    for n in ([256, 512] if small else [4096, 8192]):
        a, b = torch.randn(n, n, device=dev), torch.randn(n, n, device=dev)
        flop = 2.0 * n ** 3
        if dev.type == "cuda":
            torch.backends.cuda.matmul.allow_tf32 = False
        out[f"gemm_f32_{n}"] = (median_ms(dev, lambda: a @ b, repeats), flop)
        if dev.type == "cuda":
            torch.backends.cuda.matmul.allow_tf32 = True
            out[f"gemm_tf32_{n}"] = (median_ms(dev, lambda: a @ b, repeats), flop)
            torch.backends.cuda.matmul.allow_tf32 = False

        def bf16():
            with autocast(dev):
                return a @ b
        out[f"gemm_bf16_{n}"] = (median_ms(dev, bf16, repeats), flop)
    return out


CONV_SHAPES = [("stem7x7", 3, 64, 7, 2, 224), ("s1_3x3", 64, 64, 3, 1, 56), ("s1_1x1_expand", 64, 256, 1, 1, 56),
               ("s2_3x3", 128, 128, 3, 1, 28), ("s3_3x3", 256, 256, 3, 1, 14), ("s3_1x1_reduce", 1024, 256, 1, 1, 14),
               ("s4_3x3", 512, 512, 3, 1, 7)]


def conv(dev, small, repeats):
    out = {}
    batch = 2 if small else 64
    for name, cin, cout, k, stride, hw in CONV_SHAPES:
        if small:
            hw, cin, cout = max(hw // 4, k), max(cin // 4, 3), cout // 4
        x = torch.randn(batch, cin, hw, hw, device=dev, requires_grad=True)
        w = (0.05 * torch.randn(cout, cin, k, k, device=dev)).requires_grad_()
        pad = k // 2
        o = (hw + 2 * pad - k) // stride + 1

        def step():
            y = torch.nn.functional.conv2d(x, w, None, stride, pad)
            y.sum().backward()
            x.grad = None
            w.grad = None
        out[f"conv_fwd_bwd_{name}"] = (median_ms(dev, step, repeats), 3.0 * 2.0 * batch * cout * o * o * cin * k * k)
    return out


class Bottleneck(nn.Module):
    def __init__(self, cin, width, stride):
        super().__init__()
        cout = width * 4
        self.body = nn.Sequential(
            nn.Conv2d(cin, width, 1, bias=False), nn.BatchNorm2d(width), nn.ReLU(),
            nn.Conv2d(width, width, 3, stride, 1, bias=False), nn.BatchNorm2d(width), nn.ReLU(),
            nn.Conv2d(width, cout, 1, bias=False), nn.BatchNorm2d(cout))
        self.short = (nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))
                      if stride != 1 or cin != cout else None)

    def forward(self, x):
        return torch.relu(self.body(x) + (self.short(x) if self.short is not None else x))


def resnet50(classes=1000):
    layers = [nn.Conv2d(3, 64, 7, 2, 3, bias=False), nn.BatchNorm2d(64), nn.ReLU(), nn.MaxPool2d(3, 2, 1)]
    c = 64
    for stage, blocks in enumerate([3, 4, 6, 3]):
        width = 64 << stage
        for b in range(blocks):
            layers.append(Bottleneck(c, width, 2 if stage > 0 and b == 0 else 1))
            c = width * 4
    return nn.Sequential(*layers, nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(c, classes))


def resnet50_step(dev, small, repeats, amp):
    batch, hw = (2, 64) if small else (64, 224)
    torch.manual_seed(0)
    model = resnet50().to(dev)
    assert sum(p.numel() for p in model.parameters()) == 25557032
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-4)
    x = torch.randn(batch, 3, hw, hw, device=dev)
    if amp and dev.type == "cuda":
        # braid's AMP step runs channels-last on a GPU (Note [Channels-last training]); PyTorch's fastest
        # AMP recipe does too, by asking for it.
        model = model.to(memory_format=torch.channels_last)
        x = x.to(memory_format=torch.channels_last)
    y = torch.randint(0, 1000, (batch,), device=dev)

    def step():
        with autocast(dev, amp):
            loss = nn.functional.cross_entropy(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    flop = 3.0 * 2.0 * 4.09e9 * batch * (hw * hw) / (224.0 * 224.0)
    return {("resnet50_step_amp_bf16" if amp else "resnet50_step_f32"): (median_ms(dev, step, repeats), flop)}


class CausalLM(nn.Module):
    def __init__(self, vocab, ctx, d, heads, layers):
        super().__init__()
        self.tok, self.pos = nn.Embedding(vocab, d), nn.Embedding(ctx, d)
        self.blocks = nn.ModuleList([nn.TransformerEncoderLayer(d, heads, 4 * d, 0.0, "gelu", 1e-5, True, True)
                                     for _ in range(layers)])
        self.ln, self.head = nn.LayerNorm(d), nn.Linear(d, vocab, bias=False)

    def forward(self, ids):
        t = ids.shape[1]
        h = self.tok(ids) + self.pos(torch.arange(t, device=ids.device))
        mask = torch.triu(torch.full((t, t), float("-inf"), device=ids.device), 1)
        for b in self.blocks:
            h = b(h, mask)
        return self.head(self.ln(h))


def gpt2_step(dev, small, repeats, amp):
    vocab, d, heads, layers, batch, seq = (1000, 128, 4, 2, 2, 64) if small else (50257, 768, 12, 12, 8, 1024)
    torch.manual_seed(0)
    model = CausalLM(vocab, seq, d, heads, layers).to(dev)
    opt = torch.optim.Adam(model.parameters(), lr=3e-4)
    ids = torch.randint(0, vocab, (batch, seq), device=dev)
    target = torch.randint(0, vocab, (batch * seq,), device=dev)

    def step():
        with autocast(dev, amp):
            loss = nn.functional.cross_entropy(model(ids).reshape(batch * seq, vocab), target)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    n = sum(p.numel() for p in model.parameters()) - vocab * d - seq * d
    tokens = batch * seq
    flop = 6.0 * n * tokens + 12.0 * layers * seq * d * tokens
    return {("gpt2_step_amp_bf16" if amp else "gpt2_step_f32"): (median_ms(dev, step, repeats), flop)}


def braid_results(exe, device, suite, small, repeats, amp):
    cmd = [exe, "--device", device, "--suite", suite, "--repeats", str(repeats)] + (["--small"] if small else [])
    cmd += [] if amp else ["--amp", "off"]
    res = subprocess.run(cmd, capture_output=True, text=True)
    if res.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed:\n{res.stderr}")
    rows = [json.loads(line) for line in res.stdout.splitlines() if line.startswith("{")]
    return {r["name"]: (Ms(r["ms"], r.get("host_ms")), r["flop"]) for r in rows}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build-dir", default="build")
    ap.add_argument("--exe", help="braid-device-bench to run (default: BUILD_DIR/benchmarks/braid-device-bench)")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--suites", default="gemm,conv,resnet50,gpt2")
    ap.add_argument("--small", action="store_true")
    ap.add_argument("--amp", default="bf16", choices=["bf16", "off"])
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument("--threads", type=int, default=0, help="CPU threads for both (0: leave as is)")
    ap.add_argument("--peak-tflops", type=float, default=989.0, help="the device's dense bf16 peak, for MFU")
    ap.add_argument("--json", default="", help="also keep the rows and the run's provenance here")
    ap.add_argument("--markdown", action="store_true", help="print the README's block: provenance, then the table")
    args = ap.parse_args()
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    exe = args.exe or os.path.join(root, args.build_dir, "benchmarks", "braid-device-bench")
    if args.threads:
        torch.set_num_threads(args.threads)
        os.environ["BRAID_NUM_THREADS"] = str(args.threads)
    dev = torch.device(args.device)
    amp = args.amp == "bf16"
    name = torch.cuda.get_device_name(dev) if dev.type == "cuda" else f"CPU, {torch.get_num_threads()} threads"
    print(f"# device: {name}; torch {torch.__version__}{'; --small shapes' if args.small else ''}", file=sys.stderr)
    suites = {"gemm": lambda: gemm(dev, args.small, args.repeats), "conv": lambda: conv(dev, args.small, args.repeats),
              "resnet50": lambda: resnet50_step(dev, args.small, args.repeats, amp),
              "gpt2": lambda: gpt2_step(dev, args.small, args.repeats, amp)}
    rows = []
    for suite in args.suites.split(","):
        ours = braid_results(exe, args.device, suite, args.small, args.repeats, amp)
        theirs = suites[suite]()
        for key in sorted(set(ours) | set(theirs)):
            b, t = ours.get(key), theirs.get(key)
            row = {"workload": key, "braid_ms": b[0] if b else None, "torch_ms": t[0] if t else None,
                   "braid_tflops": b[1] / b[0] / 1e9 if b else None, "torch_tflops": t[1] / t[0] / 1e9 if t else None,
                   "braid_host_ms": getattr(b[0], "host", None) if b else None,
                   "torch_host_ms": getattr(t[0], "host", None) if t else None}
            if key.startswith("gpt2") and b:
                row["goal"] = f"MFU {100 * b[1] / b[0] / 1e9 / args.peak_tflops:.1f}% of {args.peak_tflops:g} TFLOP/s"
            rows.append(row)
    saved = {"meta": readme_tables.provenance(machine=f"{name}, PyTorch {torch.__version__}"),
             "device": name + (", --small shapes" if args.small else ""), "rows": rows}
    if args.json:
        readme_tables.save(args.json, **saved)
    readme_tables.emit("device_bench", saved, args.markdown)

if __name__ == "__main__":
    main()
