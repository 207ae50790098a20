#!/usr/bin/env python3
"""Times one training step of the model zoo's CNN and ResNet-style CNN at batch 64 in braid
(benchmarks/train_step.cpp through Google Benchmark) and the same models in PyTorch, in one run with
the same thread count, and prints a markdown table with the ratio braid / PyTorch (goal <= 1.0).

Needs PyTorch for /usr/bin/python3 (Debian's python3-torch). Usage:
  /usr/bin/python3 benchmarks/train_step.py --build-dir build-bench [--threads 2]
"""

import argparse
import json
import os
import subprocess
import time

import torch
from torch import nn


def small_cnn():
    def stage(i, o):
        return [nn.Conv2d(i, o, 3, 1, 1, bias=False), nn.BatchNorm2d(o), nn.ReLU(), nn.MaxPool2d(2)]
    return nn.Sequential(*stage(1, 16), *stage(16, 32), nn.Flatten(), nn.Linear(32 * 7 * 7, 128), nn.ReLU(),
                         nn.Linear(128, 10))


class Residual(nn.Module):
    def __init__(self, body, shortcut):
        super().__init__()
        self.body, self.shortcut = body, shortcut

    def forward(self, x):
        return self.body(x) + (self.shortcut(x) if self.shortcut is not None else x)


def resnet(width=16):
    def block(i, o, s):
        body = nn.Sequential(nn.Conv2d(i, o, 3, s, 1, bias=False), nn.BatchNorm2d(o), nn.ReLU(),
                             nn.Conv2d(o, o, 3, 1, 1, bias=False), nn.BatchNorm2d(o))
        short = None if s == 1 and i == o else nn.Sequential(nn.Conv2d(i, o, 1, s, 0, bias=False), nn.BatchNorm2d(o))
        return nn.Sequential(Residual(body, short), nn.ReLU())
    layers = [nn.Conv2d(3, width, 3, 1, 1, bias=False), nn.BatchNorm2d(width), nn.ReLU()]
    c = width
    for stage in range(3):
        o = width << stage
        layers.append(block(c, o, 2 if stage > 0 else 1))
        c = o
    return nn.Sequential(*layers, nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(c, 10))


def torch_step_ms(model, shape, repeats=30):
    torch.manual_seed(0)
    x, y = torch.randn(*shape), torch.randint(0, 10, (shape[0],))
    opt = torch.optim.Adam(model.parameters())
    loss_fn = nn.CrossEntropyLoss()

    def step():
        loss = loss_fn(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        return loss.item()
    for _ in range(5):
        step()
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        step()
        times.append(time.perf_counter() - t)
    times.sort()
    return 1000 * times[len(times) // 2]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build-dir", default="build-bench")
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    exe = os.path.join(root, args.build_dir, "benchmarks", "braid-train-step")
    env = dict(os.environ, BRAID_NUM_THREADS=str(args.threads))
    out = subprocess.run([exe, "--benchmark_format=json", "--benchmark_repetitions=5",
                          "--benchmark_report_aggregates_only=true"], env=env, check=True, capture_output=True,
                         text=True).stdout
    braid_ms = {}
    for b in json.loads(out)["benchmarks"]:
        if b.get("aggregate_name") == "median":
            braid_ms[b["run_name"].split("/")[1]] = b["real_time"]
    torch.set_num_threads(args.threads)
    rows = [("cnn", small_cnn(), (64, 1, 28, 28)), ("resnet", resnet(), (64, 3, 32, 32))]
    print(f"| model (batch 64, {args.threads} threads) | braid ms/step | PyTorch {torch.__version__} ms/step "
          f"| braid / PyTorch |")
    print("|---|---|---|---|")
    for name, model, shape in rows:
        t = torch_step_ms(model, shape)
        print(f"| {name} | {braid_ms[name]:.1f} | {t:.1f} | {braid_ms[name] / t:.2f} |")


if __name__ == "__main__":
    main()
