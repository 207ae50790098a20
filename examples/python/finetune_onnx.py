#!/usr/bin/env python3
"""Fine-tuning an ONNX model in braid: load it with a frozen backbone, replace its head for a new
label set, train the head on a small real dataset, export the result and check it in onnxruntime.

    PYTHONPATH=build/bindings/python python3 examples/python/finetune_onnx.py

1. The ONNX model: the model zoo's small CNN (an nn.Sequential of braid layers) trained briefly on
   Fashion-MNIST's first five classes (T-shirt/top, Trouser, Pullover, Dress, Coat) and exported
   with braid.onnx.export (--pretrained PATH uses an existing file of the same layout instead).
   (The pretrained models of scripts/setup_pretrained.sh are OCR and text models, no fit for
   28x28 images.)
2. braid.onnx.load(path, frozen=True): every initialiser is a parameter that does not require
   gradients. to_sequential() cuts the graph into segments that share those weights; the last
   segment (the old five-class Gemm) is dropped and a new nn.Linear head for the other five
   classes (Sandal, Shirt, Sneaker, Bag, Ankle boot) goes in its place.
3. The head trains on 2,000 training images of the new classes (the backbone stays in eval mode,
   so its BatchNorm keeps the pretrained statistics); accuracy on all 5,000 test images of them.
4. braid.onnx.export of the combined model (the imported segments have no layer exporter, so export
   traces them), then onnxruntime runs the file, which must give braid's logits and accuracy.
"""

import argparse
import os
import time

import numpy as np

import braid
from braid import data, nn, optim

MEAN, STD = 0.2860, 0.3530  # Fashion-MNIST's pixel mean and std (as braid-train)
CLASSES = ["T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt", "Sneaker", "Bag", "Ankle boot"]
OLD, NEW = [0, 1, 2, 3, 4], [5, 6, 7, 8, 9]


def small_cnn(classes):
    """The zoo's small_cnn (model_zoo/models.cpp) as an nn.Sequential of braid layers."""
    def stage(cin, cout):
        return nn.Sequential(nn.Conv2d(cin, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout), nn.ReLU(),
                             nn.MaxPool2d(2))
    return nn.Sequential(stage(1, 16), stage(16, 32), nn.Flatten(), nn.Linear(32 * 7 * 7, 128), nn.ReLU(),
                         nn.Linear(128, classes))


def subset(dataset, classes, limit=0):
    """The normalised images of the given classes and their labels renumbered 0..len(classes)-1; the
    first `limit` of them when limit > 0."""
    y = dataset.targets().numpy()
    idx = np.nonzero(np.isin(y, classes))[0]
    if limit:
        idx = idx[:limit]
    relabel = np.full(10, -1, np.int64)
    relabel[classes] = np.arange(len(classes))
    x = dataset.inputs()[braid.from_numpy(idx)]
    return (x - MEAN) / STD, braid.from_numpy(relabel[y[idx]])


def train(model, params, x, y, epochs, lr, batch_size=64):
    opt = optim.Adam(params, lr=lr)
    loader = data.DataLoader((x, y), batch_size=batch_size, shuffle=True)
    for epoch in range(epochs):
        total = correct = seen = 0.0
        for xb, yb in loader:
            logits = model(xb)
            loss = nn.functional.cross_entropy(logits, yb)
            opt.zero_grad()
            loss.backward()
            opt.step()
            total += loss.item() * xb.shape[0]
            correct += (logits.detach().argmax(1) == yb).sum().item()
            seen += xb.shape[0]
        print(f"  epoch {epoch + 1}/{epochs}: train loss {total / seen:.4f} acc {correct / seen:.4f}")


def accuracy(model, x, y):
    with braid.no_grad():
        logits = model(x)
    return (logits.argmax(1) == y).float().mean().item(), logits


def pretrain(path, train_set, test_set, limit):
    """The ONNX model of step 1: the small CNN on the first five classes, one epoch."""
    x, y = subset(train_set, OLD, limit)
    tx, ty = subset(test_set, OLD)
    braid.manual_seed(0)
    model = small_cnn(len(OLD))
    print(f"pretraining the small CNN on {x.shape[0]} images of {', '.join(CLASSES[c] for c in OLD)}")
    model.train()
    train(model, model.parameters(), x, y, epochs=1, lr=2e-3)
    model.eval()
    acc, _ = accuracy(model, tx, ty)
    print(f"  test accuracy on the {tx.shape[0]} test images of those classes: {acc:.4f}")
    braid.onnx.export(model, tx[:1], path)
    print(f"  exported {path}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", default="/usr/share/datasets/fashion-mnist")
    ap.add_argument("--out", default="runs/finetune-onnx", help="folder for the .onnx files")
    ap.add_argument("--pretrained", default="", help="an existing ONNX model of the small CNN's layout")
    ap.add_argument("--pretrain-limit", type=int, default=12000, help="pretraining images (of the first 5 classes)")
    ap.add_argument("--train-limit", type=int, default=2000, help="fine-tuning images (of the new classes)")
    ap.add_argument("--epochs", type=int, default=5)
    ap.add_argument("--lr", type=float, default=1e-2)
    args = ap.parse_args()
    started = time.perf_counter()
    os.makedirs(args.out, exist_ok=True)
    train_set = data.load_mnist(args.data, True)
    test_set = data.load_mnist(args.data, False)

    # 1. The ONNX model.
    path = args.pretrained or os.path.join(args.out, "pretrained.onnx")
    if not args.pretrained:
        pretrain(path, train_set, test_set, args.pretrain_limit)

    # 2. Loaded with a frozen backbone; the old head replaced by a new one.
    imported = braid.onnx.load(path, frozen=True)
    assert not any(p.requires_grad for p in imported.parameters())
    segments = list(imported.to_sequential())  # share the imported weights
    backbone = nn.Sequential(*segments[:-1])   # everything but the last Gemm
    x, y = subset(train_set, NEW, args.train_limit)
    tx, ty = subset(test_set, NEW)
    features = backbone(x[:1]).shape[1]
    braid.manual_seed(1)
    head = nn.Linear(features, len(NEW))
    model = nn.Sequential(backbone, head)
    trainable = [n for n, p in model.named_parameters() if p.requires_grad]
    print(f"loaded {path}: {len(segments)} segments, {sum(p.numel() for p in imported.parameters())} frozen "
          f"parameters; new head Linear({features}, {len(NEW)}) for {', '.join(CLASSES[c] for c in NEW)}; "
          f"trainable: {trainable}")
    model.eval()  # the backbone's BatchNorm keeps its pretrained statistics; the head has no mode
    before, _ = accuracy(model, tx, ty)
    print(f"test accuracy before fine-tuning (random head): {before:.4f}")

    # 3. Train the head.
    t = time.perf_counter()
    print(f"fine-tuning the head on {x.shape[0]} images, {args.epochs} epochs, Adam lr {args.lr:g}")
    train(model, head.parameters(), x, y, epochs=args.epochs, lr=args.lr)
    after, logits = accuracy(model, tx, ty)
    print(f"test accuracy after fine-tuning: {after:.4f} on {tx.shape[0]} test images "
          f"({time.perf_counter() - t:.1f} s of fine-tuning)")
    frozen_ok = all(np.array_equal(a, imported.state_dict()[n]) for n, a in
                    braid.onnx.load(path).state_dict().items())
    print(f"backbone weights unchanged by fine-tuning: {frozen_ok}")

    # 4. Export, and check in onnxruntime. The imported segments have no layer exporter of their
    # own, so braid.onnx.export traces them (Note [Export by tracing] in onnx/trace_export.cpp).
    out_path = os.path.join(args.out, "finetuned.onnx")
    braid.onnx.export(model, tx[:1], out_path)
    print(f"exported {out_path}")

    import onnxruntime as ort

    sess = ort.InferenceSession(out_path, providers=["CPUExecutionProvider"])
    (ort_logits,) = sess.run(None, {"input": tx.numpy()})
    ort_acc = float((ort_logits.argmax(1) == ty.numpy()).mean())
    diff = float(np.abs(ort_logits - logits.numpy()).max())
    print(f"onnxruntime {ort.__version__}: accuracy {ort_acc:.4f}, max |logit difference| from braid {diff:.2e}")
    assert diff < 1e-3 and abs(ort_acc - after) < 1e-3, "onnxruntime disagrees with braid"
    print(f"done in {time.perf_counter() - started:.1f} s")


if __name__ == "__main__":
    main()
