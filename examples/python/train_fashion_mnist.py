#!/usr/bin/env python3
"""braid-train's main job in Python: the model zoo's small CNN (model_zoo/models.cpp, small_cnn)
trained data-parallel on the real Fashion-MNIST (Debian's dataset-fashion-mnist), with a one-line
progress report on rank 0, the test accuracy after every epoch and a checkpoint at the end.

    PYTHONPATH=build/bindings/python mpiexec -n 2 python3 examples/python/train_fashion_mnist.py --epochs 1
    PYTHONPATH=build/bindings/python python3 examples/python/train_fashion_mnist.py --limit 6400   # one process

As braid-train: --batch-size is the global batch, split evenly over the ranks (each rank's
DataLoader yields its shard of every global batch), so N ranks follow the one-process run step for
step; Adam (lr 2e-3) or SGD (lr 0.05, Nesterov momentum 0.9, weight decay 5e-4) under a cosine
schedule with warmup; metrics are summed over the ranks, and rank 0 alone prints and saves.

Preemption (Note [Preemption] in braid/distributed/preemption.h): on SIGUSR1 or SIGTERM every rank
finishes the same step, rank 0 writes the checkpoint with the loader's position, and the script
exits with braid.distributed.REQUEUE_EXIT_CODE (75), which model_zoo/slurm/python.sbatch turns into a
requeue; --resume OUT/checkpoint.braid (or --auto-resume) continues mid-epoch, bitwise as if
nothing had happened.
"""

import argparse
import os
import sys
import time

import braid
from braid import data, nn, optim

# Fashion-MNIST's pixel mean and standard deviation over the training set (as braid-train).
MEAN, STD = 0.2860, 0.3530


class SmallCNN(nn.Module):
    """The zoo's small_cnn, written in Python: two conv(3x3, no bias)-BatchNorm-ReLU-maxpool stages
    (16 and 32 channels) and two Linear layers, for (N, 1, 28, 28) images. 206,970 parameters."""

    def __init__(self, in_channels=1, classes=10):
        super().__init__()
        self.stage1 = self._stage(in_channels, 16)
        self.stage2 = self._stage(16, 32)
        self.fc1 = nn.Linear(32 * 7 * 7, 128)
        self.fc2 = nn.Linear(128, classes)

    @staticmethod
    def _stage(cin, cout):
        return nn.Sequential(nn.Conv2d(cin, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout), nn.ReLU(),
                             nn.MaxPool2d(2))

    def forward(self, x):
        x = self.stage2(self.stage1(x)).flatten(1)
        return self.fc2(braid.relu(self.fc1(x)))


def sum_over_ranks(values):
    """Sums a few numbers over the ranks, so that rank 0 reports the whole job's metrics."""
    t = braid.tensor(values, dtype=braid.float64)
    braid.distributed.all_reduce(t)
    return t.tolist()


def evaluate(model, loader):
    """Every rank evaluates its shard of the test set; the sums are reduced over the ranks."""
    model.eval()
    loss = correct = seen = 0.0
    with braid.no_grad():
        for x, y in loader:
            if x.shape[0] == 0:
                continue
            logits = model(x)
            loss += nn.functional.cross_entropy(logits, y, reduction="sum").item()
            correct += (logits.argmax(1) == y).sum().item()
            seen += x.shape[0]
    model.train()
    loss, correct, seen = sum_over_ranks([loss, correct, seen])
    return loss / seen, correct / seen


def normalized(dataset, limit=0):
    """The dataset's images normalised with Fashion-MNIST's mean and std, and its labels; the first
    `limit` examples when limit > 0. (Normalising once here is what braid-train's per-batch
    data.Normalize transform computes.)"""
    x, y = dataset.inputs(), dataset.targets()
    if 0 < limit < x.shape[0]:
        x, y = x[:limit], y[:limit]
    return (x - MEAN) / STD, y


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", default="/usr/share/datasets/fashion-mnist", help="folder with the idx files")
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--batch-size", type=int, default=64, help="the global batch, split over the ranks")
    ap.add_argument("--limit", type=int, default=0, help="train on the first N training images only (0: all)")
    ap.add_argument("--optimizer", choices=("adam", "sgd"), default="adam")
    ap.add_argument("--lr", type=float, default=0.0, help="0: 2e-3 for Adam, 0.05 for SGD (as braid-train)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=0, help="threads per rank (0: cores / local ranks)")
    ap.add_argument("--out", default="runs/fashion-mnist-py", help="where rank 0 writes checkpoint.braid")
    ap.add_argument("--export-onnx", default="", help="also write the trained model here as ONNX (rank 0)")
    ap.add_argument("--resume", default="", help="continue from this checkpoint (mid-epoch after a preemption)")
    ap.add_argument("--auto-resume", action="store_true",
                    help="continue from OUT/checkpoint.braid when it exists (what a requeued job wants)")
    args = ap.parse_args()
    # Caught from the start: a preemption warning while the job loads stops it after its first step.
    braid.distributed.catch_preemption_signals()
    ckpt_path = os.path.join(args.out, "checkpoint.braid")
    if args.auto_resume and not args.resume and os.path.exists(ckpt_path):
        args.resume = ckpt_path

    info = braid.distributed.init()
    rank, size = info.rank, info.size
    lead = rank == 0
    if args.batch_size % size:
        raise SystemExit(f"--batch-size {args.batch_size} (the global batch) must divide evenly over {size} ranks")
    if args.threads > 0:
        braid.set_num_threads(args.threads)
    lr = args.lr or (2e-3 if args.optimizer == "adam" else 0.05)
    braid.manual_seed(args.seed)

    train_x, train_y = normalized(data.load_mnist(args.data, True), args.limit)
    test_x, test_y = normalized(data.load_mnist(args.data, False))
    # Each rank takes its shard of every global batch; the last, short global batch is left out so
    # that every step averages equal shares.
    train_loader = data.DataLoader((train_x, train_y), batch_size=args.batch_size // size, shuffle=True,
                                   drop_last=True, seed=args.seed, num_shards=size, shard=rank)
    test_loader = data.DataLoader((test_x, test_y), batch_size=500, num_shards=size, shard=rank)

    model = SmallCNN()
    ddp = braid.distributed.DistributedDataParallel(model)  # broadcasts rank 0's weights
    if args.optimizer == "adam":
        opt = optim.Adam(model.parameters(), lr=lr)
    else:
        opt = optim.SGD(model.parameters(), lr=lr, momentum=0.9, nesterov=True, weight_decay=5e-4)
    steps_per_epoch = len(train_loader)
    total_steps = steps_per_epoch * args.epochs
    schedule = optim.CosineWithWarmup(opt, min(200, total_steps // 10), total_steps, lr * 0.01)

    def save_checkpoint(step):
        # Everything a resumed run needs to go on bitwise: the loader's (epoch, global batch) means
        # the same samples at any world size. Rank 0 writes; the file appears whole or not at all.
        if not lead:
            return
        os.makedirs(args.out, exist_ok=True)
        ck = braid.checkpoint.Checkpoint()
        for prefix, obj in (("model.", model), ("optim.", opt), ("sched.", schedule), ("loader.", train_loader)):
            braid.checkpoint.store(ck, prefix, obj)
        ck.integers["step"] = step
        braid.checkpoint.save(ckpt_path, ck)

    step_count = 0
    if args.resume:
        ck = braid.checkpoint.load(args.resume)
        for prefix, obj in (("model.", model), ("optim.", opt), ("sched.", schedule), ("loader.", train_loader)):
            braid.checkpoint.restore(ck, prefix, obj)
        step_count = ck.integers["step"]
        if lead:
            print(f"resumed from {args.resume} at step {step_count} (epoch {train_loader.epoch() + 1}, "
                  f"batch {train_loader.batch()} of {steps_per_epoch})")

    if lead:
        n_params = sum(p.numel() for p in model.parameters())
        print(f"train_fashion_mnist.py: SmallCNN ({n_params} parameters), {args.optimizer} lr {lr:g}, "
              f"batch {args.batch_size}, {args.epochs} epochs, {train_x.shape[0]} train / {test_x.shape[0]} test images")
        print(f"{size} rank{'s' if size > 1 else ''} (launcher: {info.launcher}), {args.batch_size // size} images "
              f"per rank per step, {braid.get_num_threads()} threads per rank", flush=True)

    model.train()
    started = time.perf_counter()
    test_acc = float("nan")
    for epoch in range(train_loader.epoch(), args.epochs):
        bar = braid.progress.Progress(f"epoch {epoch + 1}/{args.epochs}", steps_per_epoch) if lead else None
        local = [0.0, 0.0, 0.0]  # loss * n, correct, seen since the last reduction
        job = [0.0, 0.0, 0.0]
        for step, (x, y) in enumerate(train_loader, start=train_loader.batch()):
            logits = ddp(x)
            loss = nn.functional.cross_entropy(logits, y)
            opt.zero_grad()
            loss.backward()  # DDP averages the gradients over the ranks here
            opt.step()
            schedule.step()
            n = x.shape[0]
            local[0] += loss.item() * n
            local[1] += (logits.detach().argmax(1) == y).sum().item()
            local[2] += n
            step_count += 1
            if (step + 1) % 20 == 0 or step + 1 == steps_per_epoch:
                job = [a + b for a, b in zip(job, sum_over_ranks(local))]
                local = [0.0, 0.0, 0.0]
                if bar:
                    bar.update(step + 1, int(job[2]), {"loss": job[0] / job[2], "acc": job[1] / job[2]})
            if braid.distributed.preemption_requested(step=step_count):  # every rank stops after the same step
                save_checkpoint(step_count)
                braid.distributed.barrier()  # no rank exits (and gets the job killed) before the file is written
                sig = braid.distributed.preemption_signal() or "a peer rank's signal"
                print(f"train_fashion_mnist.py: rank {rank}: {sig} at step {step_count} (epoch {epoch + 1}, batch "
                      f"{step + 1} of {steps_per_epoch}); checkpoint {ckpt_path}; exiting with code "
                      f"{braid.distributed.REQUEUE_EXIT_CODE} for the job script to requeue", file=sys.stderr, flush=True)
                sys.exit(braid.distributed.REQUEUE_EXIT_CODE)
        train_loss, train_acc = job[0] / max(job[2], 1), job[1] / max(job[2], 1)
        if bar:
            bar.update(steps_per_epoch, int(job[2]), {"loss": train_loss, "acc": train_acc}, final=True)
        # BatchNorm's running statistics are each rank's own (DDP averages gradients, not buffers),
        # so the ranks differ by their last batches; evaluate rank 0's model, the one saved below.
        for b in model.buffers():
            braid.distributed.broadcast(b, src=0)
        test_loss, test_acc = evaluate(model, test_loader)
        if lead:
            print(f"epoch {epoch + 1}: train loss {train_loss:.4f} acc {train_acc:.4f} | "
                  f"test loss {test_loss:.4f} acc {test_acc:.4f}", flush=True)
        save_checkpoint(step_count)

    if lead:
        print(f"final test accuracy {test_acc:.4f} after {time.perf_counter() - started:.1f} s; checkpoint {ckpt_path}")
        if args.export_onnx:
            # For (N, 1, 28, 28) images normalised as above; N stays symbolic. SmallCNN has no layer
            # exporter of its own, so its Python forward is traced.
            braid.onnx.export(model, test_x[:1], args.export_onnx)
            print(f"exported the trained model to {args.export_onnx} (ONNX opset 17)")


if __name__ == "__main__":
    main()
