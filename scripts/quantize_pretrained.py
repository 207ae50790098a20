#!/usr/bin/env python3
"""Derives the quantised models of braid's pretrained-model test from the float ones in the cache.

    quantize_pretrained.py --cache DIR

minilm_l3_int8: <cache>/minilm_l3/model.onnx quantised dynamically by onnxruntime's quantiser
(onnxruntime.quantization.quantize_dynamic, int8 weights per tensor): what a user who wants int8
inference of a transformer on CPU runs. Its MatMuls become DynamicQuantizeLinear + MatMulInteger
(+ Cast/Mul for the scales), all standard ONNX ops. The file goes to
<cache>/minilm_l3_int8/model.onnx with source.txt saying how it was made; an existing file made
from the same float model by the same onnxruntime version is kept. scripts/make_pretrained_refs.py
then writes onnxruntime's outputs for it like for every other model.
"""

import argparse
import hashlib
import os
import sys

import onnxruntime as ort
from onnxruntime.quantization import QuantType, quantize_dynamic

DERIVED = {"minilm_l3_int8": "minilm_l3"}


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--cache", required=True)
    args = ap.parse_args()
    for name, base in DERIVED.items():
        src = os.path.join(args.cache, base, "model.onnx")
        if not os.path.isfile(src):
            print(f"  {name}: no {base}/model.onnx, skipped")
            continue
        folder = os.path.join(args.cache, name)
        dest = os.path.join(folder, "model.onnx")
        stamp = (f"derived from: {base}/model.onnx sha256 {sha256(src)}\n"
                 f"by: onnxruntime {ort.__version__} quantize_dynamic(weight_type=QInt8, per_channel=False)\n")
        source = os.path.join(folder, "source.txt")
        if os.path.isfile(dest) and os.path.isfile(source) and open(source).read().startswith(stamp):
            print(f"  {name}: present")
            continue
        os.makedirs(folder, exist_ok=True)
        quantize_dynamic(src, dest + ".tmp", weight_type=QuantType.QInt8, per_channel=False)
        os.replace(dest + ".tmp", dest)
        with open(source, "w") as f:
            f.write(stamp + f"sha256: {sha256(dest)}\n")
        print(f"  {name}: quantised {base} ({os.path.getsize(dest) >> 20} MiB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
