#!/usr/bin/env python3
"""Predicted DistributedDataParallel step time on 8 to 1,024 GPUs with NCCL, for ResNet-50 and a
GPT-2-small-shaped model, from braid's own buckets and an alpha-beta model of NCCL's all-reduce.

No machine here has more than one GPU, so this is a model, not a measurement. What it takes:

- The buckets, as braid makes them: `braid-device-bench --device cpu --suite buckets` runs one
  backward of each model under DistributedDataParallel with its default options (25 MiB buckets,
  launched in order, the reverse of registration) and records each bucket's bytes and when it became
  ready, as a fraction of backward (results/ddp_buckets.jsonl, measured on the CPU: the fractions
  follow each layer's share of the backward work, which is similar on a GPU). They are rescaled so
  that the last bucket is ready when backward ends: on the CPU, what follows the last gradient is
  DistributedDataParallel's own copy of the averaged gradients back (15% of backward for GPT-2's
  622 MiB there, a fraction of a millisecond on a GPU), and a bucket ready at the very end is the
  case with nothing left to hide it behind.
- The compute of one step on one GPU (forward + backward; --resnet50-ms, --gpt2-ms). Until braid's
  own step has been timed on an H100 (benchmarks/device_bench.py), these are assumptions: ResNet-50
  at batch 64 in 24.6 ms (2,600 images/s), GPT-2 small at 8 x 1,024 tokens in 17.8 ms (7.0 TFLOP at
  40% of an H100's 989 TFLOP/s in bfloat16); backward is two thirds of it.
- The network, per GPU, with NCCL's achievable fraction eta = 0.8 of each link's bandwidth:
  NVLink 4 through NVSwitch inside a node of 8 GPUs (450 GB/s per direction, 1 us per ring step);
  InfiniBand NDR between nodes (400 Gb/s = 50 GB/s per direction per adapter, 5 us per step), either
  one adapter per GPU (rail-optimised, as in DGX H100: a ring crossing nodes spreads over all 8, so
  its bottleneck is min(450, 8 x 50) GB/s) or one adapter per node (8 x less between nodes).
- NCCL's two algorithms, of which it picks the faster (as its tuner does):
  ring: T = o + 2 (p - 1) a + 2 (p - 1) / p * n / B, with a the slowest step's latency;
  tree: T = o + 2 (g - 1) a_nvlink + 2 log2(nodes) a_ib + 2 (p - 1) / p * n / B,
  where B is eta times the bottleneck bandwidth and o = 15 us (the launch of the collective and
  braid's two events).
- The overlap braid's DistributedDataParallel gets: bucket j is launched when it is ready and after
  bucket j - 1 (in order), and runs on the one communication stream after the bucket before it
  (Note [The NCCL group]); what is left after backward has ended is exposed.

    python3 benchmarks/gpu_scaling.py [--buckets benchmarks/results/ddp_buckets.jsonl]
"""
import argparse
import json
import math
import os
import sys

GPUS_PER_NODE = 8
NVLINK_BW, NVLINK_A = 450e9, 1e-6
IB_BW, IB_A = 50e9, 5e-6
ETA, O = 0.8, 15e-6


def allreduce_seconds(p, n, nics_per_node):
    """NCCL's all-reduce of n bytes over p GPUs: the faster of ring and tree."""
    if p == 1:
        return 0.0
    nodes = max(1, p // GPUS_PER_NODE)
    g = min(p, GPUS_PER_NODE)
    if nodes == 1:
        bw, a = NVLINK_BW, NVLINK_A
    else:
        bw, a = min(NVLINK_BW, IB_BW * nics_per_node), IB_A
    bandwidth = 2 * (p - 1) / p * n / (ETA * bw)
    ring = O + 2 * (p - 1) * a + bandwidth
    tree = O + 2 * (g - 1) * NVLINK_A + 2 * math.log2(nodes) * IB_A + bandwidth
    return min(ring, tree)


def ddp_step(buckets, compute_s, p, nics_per_node, wire_factor=1.0):
    """(step seconds, exposed seconds, communication seconds) for one step at p GPUs."""
    backward = compute_s * 2 / 3
    forward = compute_s - backward
    last = max(b["ready"] for b in buckets)
    launch = free = 0.0
    comm = 0.0
    for b in buckets:
        launch = max(launch, b["ready"] / last * backward)
        t = allreduce_seconds(p, b["bytes"] * wire_factor, nics_per_node)
        start = max(launch, free)
        free = start + t
        comm += t
    exposed = max(0.0, free - backward)
    return forward + backward + exposed, exposed, comm


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    ap = argparse.ArgumentParser()
    ap.add_argument("--buckets", default=os.path.join(here, "results", "ddp_buckets.jsonl"))
    ap.add_argument("--resnet50-ms", type=float, default=24.6)
    ap.add_argument("--gpt2-ms", type=float, default=17.8)
    ap.add_argument("--markdown", action="store_true",
                    help="print the README's block: provenance (the buckets' BUCKETS.meta.json) first")
    args = ap.parse_args()
    if args.markdown:
        sys.path.insert(0, here)
        import readme_tables
        meta = readme_tables.load(os.path.splitext(args.buckets)[0] + ".meta.json")
        meta["command"] = readme_tables.provenance()["command"]
        print("\n".join(readme_tables.meta_lines(meta)))
    models = {}
    for line in open(args.buckets):
        if line.startswith("{"):
            r = json.loads(line)
            models[r["model"]] = r
    compute = {"resnet50": args.resnet50_ms / 1e3, "gpt2_small": args.gpt2_ms / 1e3}
    labels = {"resnet50": "ResNet-50, batch 64 per GPU", "gpt2_small": "GPT-2 small, 8 x 1,024 tokens per GPU"}
    for name in ("resnet50", "gpt2_small"):
        r = models[name]
        total = sum(b["bytes"] for b in r["buckets"])
        c = compute[name]
        print(f"\n{labels[name]}: {r['parameters'] / 1e6:.1f} M parameters, {total / 2**20:.1f} MiB of gradients in "
              f"{len(r['buckets'])} buckets; compute {c * 1e3:.1f} ms per step (backward {c * 2 / 3 * 1e3:.1f} ms)\n")
        print("| GPUs | nodes | adapters per node | all-reduce of all buckets ms | exposed ms | step ms | "
              "efficiency | exposed with bfloat16 wire ms | efficiency, bfloat16 wire | no overlap: efficiency |")
        print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
        for p in (8, 16, 32, 64, 128, 256, 512, 1024):
            for nics in ((8,) if p == GPUS_PER_NODE else (8, 1)):
                step, exposed, comm = ddp_step(r["buckets"], c, p, nics)
                step16, exposed16, _ = ddp_step(r["buckets"], c, p, nics, wire_factor=0.5)
                print(f"| {p} | {max(1, p // GPUS_PER_NODE)} | {nics} | {comm * 1e3:.2f} | {exposed * 1e3:.2f} | "
                      f"{step * 1e3:.2f} | {c / step:.3f} | {exposed16 * 1e3:.2f} | {c / step16:.3f} | "
                      f"{c / (c + comm):.3f} |")


if __name__ == "__main__":
    main()
