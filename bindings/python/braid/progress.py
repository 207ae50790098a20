"""braid.progress: the one-line progress report of braid's training scripts (what the model zoo's
braid-train prints, model_zoo/progress.h), for Python training loops.

    bar = braid.progress.Progress("epoch 1/3", total=len(loader))
    for step, (x, y) in enumerate(loader):
        ...
        bar.update(step + 1, images_seen, {"loss": running_loss})
    bar.update(len(loader), images_seen, {"loss": running_loss}, final=True)

On a terminal the line is redrawn in place (at most every 0.2 s); in a log (a batch job's output)
a plain line is written every 10 s, so a Slurm job's output stays readable.
"""

import sys
import time


class Progress:
    """done/total, a bar, the rate in items per second, the ETA (the time taken once final) and the
    running metrics, on one line."""

    def __init__(self, label, total, unit="img/s", stream=None):
        self.label, self.total, self.unit = label, total, unit
        self.stream = stream or sys.stdout
        self.tty = self.stream.isatty()
        self.start = self.last = time.perf_counter()

    def update(self, done, items, metrics=None, final=False):
        now = time.perf_counter()
        if not final and (done >= self.total or now - self.last < (0.2 if self.tty else 10.0)):
            return
        self.last = now
        elapsed = now - self.start
        frac = done / self.total if self.total else 1.0
        eta = elapsed * (1 - frac) / frac if frac > 0 else 0.0
        shown = elapsed if final else eta
        bar = ("#" * int(frac * 24)).ljust(24, ".")
        line = (f"{self.label} [{bar}] {int(frac * 100):3d}% {done}/{self.total} {items / max(elapsed, 1e-9):.0f} "
                f"{self.unit} {'took' if final else 'eta'} {int(shown) // 60:02d}:{int(shown) % 60:02d}")
        line += "".join(f" {k} {v:.4f}" for k, v in (metrics or {}).items())
        self.stream.write(("\r" if self.tty else "") + line + ("\n" if final or not self.tty else "\x1b[K"))
        self.stream.flush()
