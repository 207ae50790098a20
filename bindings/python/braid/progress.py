"""braid.progress: the one-line progress report of braid's training scripts, the same line that the
model zoo's braid-train prints (braid/data/progress.h), for Python training loops.

    bar = braid.progress.Progress("epoch 1/3", total=len(loader))
    for step, (x, y) in enumerate(loader):
        ...
        bar.update(step + 1, images_seen, {"loss": running_loss})
    bar.update(len(loader), images_seen, {"loss": running_loss}, final=True)

Progress(label, total, unit="img/s", stream=None, clock=None) writes to stream (sys.stdout when
None). On a terminal the line is redrawn in place (at most every 0.2 s); in a log (a batch job's
output) a plain line is written every 10 s, so a Slurm job's output stays readable.
"""

from ._swig.data import ProgressBar as Progress  # noqa: F401
