#!/usr/bin/env python3
"""Derives the quantised models of braid's pretrained-model test from the float ones in the cache.

    quantize_pretrained.py --cache DIR

minilm_l3_int8: <cache>/minilm_l3/model.onnx quantised dynamically by onnxruntime's quantiser
(onnxruntime.quantization.quantize_dynamic, int8 weights per tensor): what a user who wants int8
inference of a transformer on CPU runs. Its MatMuls become DynamicQuantizeLinear + MatMulInteger
(+ Cast/Mul for the scales), all standard ONNX ops.
ppocr_cls_qdq: <cache>/ppocr_cls/model.onnx quantised statically (quantize_static) in the QDQ
format that exporters and onnxruntime's tools write for CNNs: QuantizeLinear/DequantizeLinear pairs
around every float op, weights int8 per output channel, activations uint8, calibrated on 8
seeded standard-normal images.
Each file goes to <cache>/<name>/model.onnx with source.txt saying how it was made; an existing
file made from the same float model by the same onnxruntime version is kept. scripts/make_pretrained_refs.py
then writes onnxruntime's outputs for it like for every other model.
"""

import argparse
import os
import sys

import numpy as np
import onnx
import onnxruntime as ort
from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_dynamic, quantize_static

from make_pretrained_refs import sha256  # the same script folder


class Images(CalibrationDataReader):
    """8 seeded standard-normal images of the model's input shape (batch 1)."""

    def __init__(self, path, shape):
        name = onnx.load(path).graph.input[0].name
        rng = np.random.default_rng(0)
        self.feeds = [{name: rng.standard_normal(shape).astype(np.float32)} for _ in range(8)]

    def get_next(self):
        return self.feeds.pop(0) if self.feeds else None


def dynamic_int8(src, dest):
    quantize_dynamic(src, dest, weight_type=QuantType.QInt8, per_channel=False)


def static_qdq(src, dest):
    quantize_static(src, dest, Images(src, (1, 3, 48, 192)), quant_format=QuantFormat.QDQ, per_channel=True,
                    weight_type=QuantType.QInt8, activation_type=QuantType.QUInt8)


# name -> (float model, how, what source.txt says)
DERIVED = {
    "minilm_l3_int8": ("minilm_l3", dynamic_int8, "quantize_dynamic(weight_type=QInt8, per_channel=False)"),
    "ppocr_cls_qdq": ("ppocr_cls", static_qdq, "quantize_static(QDQ, per_channel=True, QInt8 weights, QUInt8 "
                      "activations, 8 seeded normal images)"),
}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--cache", required=True)
    args = ap.parse_args()
    for name, (base, how, what) in DERIVED.items():
        src = os.path.join(args.cache, base, "model.onnx")
        if not os.path.isfile(src):
            print(f"  {name}: no {base}/model.onnx, skipped")
            continue
        folder = os.path.join(args.cache, name)
        dest = os.path.join(folder, "model.onnx")
        stamp = (f"derived from: {base}/model.onnx sha256 {sha256(src)}\n"
                 f"by: onnxruntime {ort.__version__} {what}\n")
        source = os.path.join(folder, "source.txt")
        if os.path.isfile(dest) and os.path.isfile(source) and open(source).read().startswith(stamp):
            print(f"  {name}: present")
            continue
        os.makedirs(folder, exist_ok=True)
        how(src, dest + ".tmp")
        os.replace(dest + ".tmp", dest)
        with open(source, "w") as f:
            f.write(stamp + f"sha256: {sha256(dest)}\n")
        print(f"  {name}: quantised {base} ({os.path.getsize(dest) >> 20} MiB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
