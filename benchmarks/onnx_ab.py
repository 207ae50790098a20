#!/usr/bin/env python3
"""Paired A/B of a switch in braid's code, in one process: an ONNX model loaded once through the
Python module (frozen, so that it runs as inference), run in pairs with an environment variable
unset and set (the order alternating from pair to pair), the code under test reading the variable
on each call. Prints each side's median and the median of the per-pair ratios (set / unset) with
its quartiles.

On an otherwise idle machine (a build beside it makes any timing meaningless). Runs a minute apart
in separate processes moved by 10% either way on this project's shared VM; the
paired ratio repeats to within 1% (benchmarks/README.md, run Z). The switch itself is a temporary
`getenv` in the code being measured: this script only flips it.

usage: PYTHONPATH=build/bindings/python BRAID_NUM_THREADS=2 \\
       python3 benchmarks/onnx_ab.py MODEL.onnx VARIABLE [--value 1] [--pairs 800] [--input 1x3x224x224 | tokens:1x32]
"""
import argparse
import os
import statistics
import time

import numpy as np

import braid
import braid.onnx


def inputs(model_inputs, spec):
    if spec.startswith("tokens:"):
        batch, length = (int(v) for v in spec[len("tokens:"):].split("x"))
        ids = np.tile((1000 + np.arange(length)).astype(np.int64), (batch, 1))
        ones = np.ones((batch, length), np.int64)
        return [braid.from_numpy(ids), braid.from_numpy(ones)][:model_inputs]
    shape = [int(v) for v in spec.split("x")]
    return [braid.from_numpy(np.random.default_rng(0).random(shape, dtype=np.float32))]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("model")
    ap.add_argument("variable")
    ap.add_argument("--value", default="1")
    ap.add_argument("--pairs", type=int, default=800)
    ap.add_argument("--input", default="tokens:1x32")
    args = ap.parse_args()
    m = braid.onnx.load(args.model, frozen=True)
    xs = inputs(len(m.input_names()), args.input)
    for _ in range(20):
        m.run(xs)
    times = ([], [])
    for i in range(args.pairs):
        for side in ((0, 1) if i % 2 == 0 else (1, 0)):
            if side:
                os.environ[args.variable] = args.value
            else:
                os.environ.pop(args.variable, None)
            t0 = time.perf_counter()
            m.run(xs)
            times[side].append(time.perf_counter() - t0)
    os.environ.pop(args.variable, None)
    ratios = sorted(b / a for a, b in zip(*times))
    q = lambda f: ratios[int(f * (len(ratios) - 1))]
    print(f"{args.variable} unset {statistics.median(times[0]) * 1e3:.3f} ms, set {statistics.median(times[1]) * 1e3:.3f} ms;"
          f" paired set/unset median {q(0.5):.3f} (quartiles {q(0.25):.3f}, {q(0.75):.3f})")


if __name__ == "__main__":
    main()
