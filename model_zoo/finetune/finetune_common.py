"""What the model zoo's fine-tuning scripts share (finetune_cnn.py, finetune_text.py): the command
line, the three ways of training a pretrained backbone with a new head, and the data-parallel loop
with progress, evaluation after every epoch, checkpoint, preemption and resume.

The three modes, so that a script's runs answer "does pretraining pay?" on the same small subset:
  finetune  the pretrained backbone and a new head train together, the backbone at its own (smaller)
            learning rate: two parameter groups in one optimizer.
  probe     a linear classifier on the frozen pretrained features: the backbone runs once over the
            data (no gradients) and only the head trains, on those features.
  scratch   the same architecture with its weights re-initialised, every weight at the head's rate.

Training is data-parallel under mpiexec or srun (DistributedDataParallel; --batch-size is the
global batch, split over the ranks, so N ranks follow the one-process run step for step), with a
cosine schedule after a warmup. Each epoch ends with the validation accuracy and a checkpoint
(model, optimizer, schedule, the loader's position); on SIGUSR1 or SIGTERM every rank finishes the
same step, rank 0 writes the checkpoint and the script exits with braid.distributed.REQUEUE_EXIT_CODE
for the job script to requeue (model_zoo/slurm/python.sbatch); --auto-resume continues from it, at
this or another world size.
"""

import argparse
import os
import signal
import sys
import time

import braid
from braid import data, nn, optim

MODES = ("finetune", "probe", "scratch")


def arguments(description, defaults):
    """The shared command line; defaults maps option names to each script's own defaults, and
    defaults["probe"] to the probe's (its head trains on features computed once, so it can afford
    the epochs that a linear classifier needs to converge). parse(ap) fills in the mode's."""
    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("--mode", choices=MODES, default="finetune",
                    help="finetune: backbone and head; probe: a linear head on frozen features; scratch: re-initialised")
    ap.add_argument("--train-size", type=int, default=1000, help="labelled training examples")
    ap.add_argument("--epochs", type=int, default=None, help=f"default {defaults['epochs']} ({defaults['probe']['epochs']} for probe)")
    ap.add_argument("--batch-size", type=int, default=32, help="the global batch, split over the ranks")
    ap.add_argument("--lr", type=float, default=None,
                    help=f"the head's learning rate, every weight's in scratch (default {defaults['lr']:g}; "
                         f"{defaults['probe']['lr']:g} for probe)")
    ap.add_argument("--backbone-lr", type=float, default=defaults["backbone_lr"], help="the backbone's, in finetune mode")
    ap.add_argument("--weight-decay", type=float, default=0.01, help="AdamW's decoupled weight decay")
    ap.add_argument("--seed", type=int, default=0, help="the subset, the head's initialisation and the data order")
    ap.add_argument("--threads", type=int, default=0, help="threads per rank (0: cores / local ranks)")
    ap.add_argument("--out", default="", help="checkpoint, ONNX file and results (default runs/<script>-<mode>)")
    ap.add_argument("--resume", default="", help="continue from this checkpoint")
    ap.add_argument("--auto-resume", action="store_true", help="continue from OUT/checkpoint.braid when it exists")
    ap.add_argument("--preempt-at-step", type=int, default=0,
                    help="rank 0 sends itself SIGUSR1 after this global step (tests the preemption path)")
    ap.add_argument("--no-export", action="store_true", help="skip the ONNX export and the onnxruntime check")
    ap.add_argument("--model-cache", default=braid.knob_value("BRAID_MODEL_CACHE"),
                    help="where scripts/setup_pretrained.sh put the models, vocabulary and data")
    ap.set_defaults(mode_defaults=defaults)
    return ap


def parse(ap, script):
    """Parses the command line; fills in the mode's defaults and the output folder, and --auto-resume."""
    args = ap.parse_args()
    # Caught from the start: a preemption warning while the job loads stops it after its first step.
    braid.distributed.catch_preemption_signals()
    d = dict(args.mode_defaults, **(args.mode_defaults["probe"] if args.mode == "probe" else {}))
    args.epochs = d["epochs"] if args.epochs is None else args.epochs
    args.lr = d["lr"] if args.lr is None else args.lr
    args.out = args.out or os.path.join("runs", "finetune", f"{script}-{args.mode}")
    if args.auto_resume and not args.resume and os.path.exists(os.path.join(args.out, "checkpoint.braid")):
        args.resume = os.path.join(args.out, "checkpoint.braid")
    return args


def sum_over_ranks(values):
    t = braid.tensor(values, dtype=braid.float64)
    braid.distributed.all_reduce(t)
    return t.tolist()


class Split:
    """A labelled split: x (a tensor whose first axis is the example) and y (int64 labels)."""

    def __init__(self, x, y):
        self.x, self.y = x, y

    def __len__(self):
        return self.x.shape[0]


def features_of(forward_backbone, split, batch=256):
    """The frozen backbone's features of a split (probe mode), computed once, without gradients."""
    outs = []
    with braid.no_grad():
        for i in range(0, len(split), batch):
            outs.append(forward_backbone(split.x[i:i + batch]).detach())
    return Split(braid.cat(outs, 0), split.y)


def evaluate(forward, split, rank, size, batch=256):
    """Accuracy and mean loss of forward on a split; each rank takes its shard, the sums are reduced."""
    loader = data.DataLoader((split.x, split.y), batch_size=batch, num_shards=size, shard=rank)
    loss = correct = seen = 0.0
    with braid.no_grad():
        for x, y in loader:
            if x.shape[0] == 0:
                continue
            logits = forward(x)
            loss += nn.functional.cross_entropy(logits, y, reduction="sum").item()
            correct += (logits.argmax(1) == y).sum().item()
            seen += x.shape[0]
    loss, correct, seen = sum_over_ranks([loss, correct, seen])
    return correct / seen, loss / seen


def sync_state(model):
    """Rank 0's buffers (BatchNorm statistics, which each rank updates from its own shard) on every
    rank, so that every rank evaluates, saves and exports the same model."""
    for b in model.buffers():
        braid.distributed.broadcast(b, src=0)


def fit(args, name, model, groups, train, val, forward, set_mode, log):
    """Trains model (its parameter groups: dicts as optim.AdamW takes them) on train, data-parallel,
    evaluating on val after every epoch. forward(x) gives the logits of a batch; set_mode() puts the
    model in the mode its training wants (e.g. a frozen backbone's BatchNorm in eval mode). Returns
    the validation accuracy of every epoch this run trained."""
    info = braid.distributed.world_info()
    rank, size, lead = info.rank, info.size, info.rank == 0
    if args.batch_size % size:
        raise SystemExit(f"{name}: --batch-size {args.batch_size} (the global batch) must divide evenly over {size} ranks")
    ckpt_path = os.path.join(args.out, "checkpoint.braid")
    loader = data.DataLoader((train.x, train.y), batch_size=args.batch_size // size, shuffle=True, drop_last=True,
                             seed=args.seed, num_shards=size, shard=rank)
    ddp = braid.distributed.DistributedDataParallel(model)  # broadcasts rank 0's weights  # noqa: F841
    opt = optim.AdamW(groups, lr=args.lr, weight_decay=args.weight_decay)
    steps_per_epoch = len(loader)
    total = steps_per_epoch * args.epochs
    schedule = optim.CosineWithWarmup(opt, max(1, total // 10), total, 0.0)
    parts = (("model.", model), ("optim.", opt), ("sched.", schedule), ("loader.", loader))

    def save(step):
        if lead:  # the file appears whole or not at all (braid.checkpoint.save writes and renames)
            os.makedirs(args.out, exist_ok=True)
            ck = braid.checkpoint.Checkpoint()
            for prefix, obj in parts:
                braid.checkpoint.store(ck, prefix, obj)
            ck.integers["step"] = step
            braid.checkpoint.save(ckpt_path, ck)
        braid.distributed.barrier()  # no rank leaves (and ends the job) before the file is there

    step_count = 0
    if args.resume:
        ck = braid.checkpoint.load(args.resume)
        for prefix, obj in parts:
            braid.checkpoint.restore(ck, prefix, obj)
        step_count = ck.integers["step"]
        log(f"resumed from {args.resume} at step {step_count} (epoch {loader.epoch() + 1}, batch {loader.batch()} "
            f"of {steps_per_epoch}) on {size} rank{'s' if size > 1 else ''}")
    trainable = sum(p.numel() for g in groups for p in g["params"])
    rates = ", ".join(f"{g.get('lr', args.lr):g}" for g in groups)
    log(f"{name}: {args.mode}, {trainable:,} trainable parameters in {len(groups)} group"
        f"{'s' if len(groups) > 1 else ''} (lr {rates}), "
        f"{len(train)} training examples, batch {args.batch_size} over {size} rank{'s' if size > 1 else ''} "
        f"({braid.get_num_threads()} thread{'s' if braid.get_num_threads() > 1 else ''} each), {args.epochs} epochs")

    history = []
    for epoch in range(loader.epoch(), args.epochs):
        set_mode()
        bar = braid.progress.Progress(f"epoch {epoch + 1}/{args.epochs}", steps_per_epoch, unit="ex/s") if lead else None
        local, job = [0.0, 0.0, 0.0], [0.0, 0.0, 0.0]
        for step, (x, y) in enumerate(loader, start=loader.batch()):
            logits = forward(x)  # DDP hooks the parameters: calling the model is enough
            loss = nn.functional.cross_entropy(logits, y)
            opt.zero_grad()
            loss.backward()  # DDP averages the gradients over the ranks here
            opt.step()
            schedule.step()
            step_count += 1
            local = [local[0] + loss.item() * x.shape[0], local[1] + (logits.detach().argmax(1) == y).sum().item(),
                     local[2] + x.shape[0]]
            if (step + 1) % 5 == 0 or step + 1 == steps_per_epoch:
                job = [a + b for a, b in zip(job, sum_over_ranks(local))]
                local = [0.0, 0.0, 0.0]
                if bar:
                    bar.update(step + 1, int(job[2]), {"loss": job[0] / job[2], "acc": job[1] / job[2]})
            if lead and step_count == args.preempt_at_step:
                os.kill(os.getpid(), signal.SIGUSR1)
            if braid.distributed.preemption_requested(step=step_count):  # every rank stops after the same step
                save(step_count)
                sig = braid.distributed.preemption_signal() or "a peer rank's signal"
                print(f"{name}: rank {rank}: {sig} at step {step_count} (epoch {epoch + 1}, batch {step + 1} of "
                      f"{steps_per_epoch}); checkpoint {ckpt_path}; exiting with code "
                      f"{braid.distributed.REQUEUE_EXIT_CODE} for the job script to requeue", file=sys.stderr, flush=True)
                sys.exit(braid.distributed.REQUEUE_EXIT_CODE)
        if bar:
            bar.update(steps_per_epoch, int(job[2]), {"loss": job[0] / max(job[2], 1), "acc": job[1] / max(job[2], 1)},
                       final=True)
        model.eval()
        sync_state(model)
        acc, vloss = evaluate(forward, val, rank, size)
        history.append(acc)
        log(f"epoch {epoch + 1}: train loss {job[0] / max(job[2], 1):.4f} acc {job[1] / max(job[2], 1):.4f} | "
            f"validation loss {vloss:.4f} acc {acc:.4f}")
        save(step_count)
    model.eval()
    sync_state(model)
    return history


def results_row(args, name, path, fields):
    """Appends one row to OUT/../results.csv (rank 0): what the zoo README's tables are made from."""
    import csv
    import fcntl

    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    header = ["script", "mode", "train_size", "epochs", "seed", "ranks"] + list(fields)
    row = [name, args.mode, args.train_size, args.epochs, args.seed, braid.distributed.world_info().size] + list(fields.values())
    with open(path, "a+", newline="") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        f.seek(0)
        empty = not f.read(1)
        w = csv.writer(f)
        if empty:
            w.writerow(header)
        w.writerow(row)


def lead_logger():
    lead = braid.distributed.world_info().rank == 0
    return (lambda msg: print(msg, flush=True)) if lead else (lambda msg: None)

