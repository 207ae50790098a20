#!/usr/bin/env python3
"""Times one training step (forward, cross-entropy, backward, Adam) at batch 64 of the model zoo's
MLP, CNN and ResNet-style CNN and of a small BERT-style Transformer encoder (2 layers, width 128,
4 heads, 32 tokens) in braid (benchmarks/train_step.cpp through Google Benchmark) and the same models
in PyTorch, in one run with the same thread count, and prints a markdown table with the ratio
braid / PyTorch (goals: <= 0.9 for the MLP and the CNN, <= 1.0 for the ResNet and the Transformer).

--json FILE keeps the rows with the run's machine, date, commit and command; --markdown prints
benchmarks/README.md's block (`python3 benchmarks/update_readme.py train_step` puts the committed
results/train_step.json in place). Needs PyTorch for /usr/bin/python3 (Debian's python3-torch). Usage:
  /usr/bin/python3 benchmarks/train_step.py --build-dir build-bench [--threads 2] [--json FILE] [--markdown]
"""

import argparse
import json
import os
import subprocess
import sys
import time

import torch
from torch import nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import readme_tables  # noqa: E402


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


class Encoder(nn.Module):
    """The zoo's transformer_encoder (model_zoo/models.cpp) at train_step.cpp's small_encoder():
    word + position + token-type embeddings, LayerNorm and dropout, post-norm GELU layers, the mean
    over the tokens, a linear head."""

    def __init__(self, vocab=8000, d=128, layers=2, heads=4, ff=512, positions=64, classes=10):
        super().__init__()
        self.words, self.positions, self.types = nn.Embedding(vocab, d), nn.Embedding(positions, d), nn.Embedding(2, d)
        self.norm, self.drop = nn.LayerNorm(d, eps=1e-12), nn.Dropout(0.1)
        self.layers = nn.ModuleList(nn.TransformerEncoderLayer(d, heads, ff, 0.1, activation="gelu",
                                                               layer_norm_eps=1e-12, batch_first=True)
                                    for _ in range(layers))
        self.head = nn.Linear(d, classes)
        self.vocab = vocab

    def forward(self, ids):
        pos = torch.arange(ids.shape[1])
        x = self.drop(self.norm(self.words(ids) + self.positions(pos) + self.types(torch.zeros_like(pos))))
        for layer in self.layers:
            x = layer(x)
        return self.head(x.mean(1))


def mlp():
    return nn.Sequential(nn.Flatten(), nn.Linear(784, 256), nn.ReLU(), nn.Linear(256, 128), nn.ReLU(),
                         nn.Linear(128, 10))


def torch_step_ms(model, shape, repeats=30):
    torch.manual_seed(0)
    x = torch.randint(0, model.vocab, shape) if isinstance(model, Encoder) else torch.randn(*shape)
    y = torch.randint(0, 10, (shape[0],))
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
    ap.add_argument("--rounds", type=int, default=3, help="alternating rounds; each engine's best median counts")
    ap.add_argument("--json", default="", help="also keep the rows and the run's provenance here")
    ap.add_argument("--markdown", action="store_true", help="print the README's block: provenance, then the table")
    args = ap.parse_args()
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    exe = os.path.join(root, args.build_dir, "benchmarks", "braid-train-step")
    env = dict(os.environ, BRAID_NUM_THREADS=str(args.threads))
    torch.set_num_threads(args.threads)
    rows = [("mlp", mlp(), (64, 1, 28, 28), 0.9), ("cnn", small_cnn(), (64, 1, 28, 28), 0.9),
            ("resnet", resnet(), (64, 3, 32, 32), 1.0), ("transformer", Encoder(), (64, 32), 1.0)]
    # The engines take turns for --rounds rounds and each keeps its best median: this VM's timings
    # move from minute to minute, and a slow minute should not decide a ratio.
    braid_ms, torch_ms = {}, {}
    for _ in range(args.rounds):
        out = subprocess.run([exe, "--benchmark_format=json", "--benchmark_repetitions=5",
                              "--benchmark_report_aggregates_only=true"], env=env, check=True, capture_output=True,
                             text=True).stdout
        for b in json.loads(out)["benchmarks"]:
            if b.get("aggregate_name") == "median":
                name = b["run_name"].split("/")[1]
                braid_ms[name] = min(braid_ms.get(name, float("inf")), b["real_time"])
        for name, model, shape, _goal in rows:
            torch_ms[name] = min(torch_ms.get(name, float("inf")), torch_step_ms(model, shape))
    saved = {"meta": readme_tables.provenance(command=f"/usr/bin/python3 benchmarks/train_step.py --build-dir "
                                                       f"{args.build_dir} --threads {args.threads}"),
             "threads": args.threads, "torch": torch.__version__,
             "rows": [{"model": name, "braid_ms": braid_ms[name], "torch_ms": torch_ms[name], "goal": goal}
                      for name, _model, _shape, goal in rows]}
    if args.json:
        readme_tables.save(args.json, **saved)
    readme_tables.emit("train_step", saved, args.markdown)

if __name__ == "__main__":
    main()
