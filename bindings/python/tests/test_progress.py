"""braid.progress.Progress: the one-line report of rate and ETA that the training scripts print
(braid::data::ProgressBar, which braid-train draws too), on a Python stream."""

import io
import re

import pytest

import braid


class Clock:
    def __init__(self):
        self.t = 100.0

    def __call__(self):
        return self.t


def test_progress_reports_rate_eta_and_metrics_in_a_log():
    clock = Clock()
    out = io.StringIO()  # not a terminal: plain lines, at most one per 10 s
    bar = braid.progress.Progress("epoch 1/2", total=40, stream=out, clock=clock)
    clock.t += 5.0
    bar.update(10, 320, {"loss": 1.5})
    assert out.getvalue() == ""  # under 10 s since the start
    clock.t += 6.0  # 11 s: 10 of 40 steps, 320 images
    bar.update(10, 320, {"loss": 1.25})
    line = out.getvalue()
    # 320 images in 11 s is 29 img/s; a quarter done in 11 s leaves 33 s.
    assert re.fullmatch(r"epoch 1/2 \[######\.{18}\]  25% 10/40 29 img/s eta 00:33 loss 1\.2500\n", line), line
    clock.t += 33.0
    bar.update(40, 1280, {"loss": 0.5}, final=True)
    last = out.getvalue().splitlines()[-1]
    assert re.fullmatch(r"epoch 1/2 \[#{24}\] 100% 40/40 29 img/s took 00:44 loss 0\.5000", last), last


class Terminal(io.StringIO):
    def isatty(self):
        return True


def test_progress_redraws_in_place_on_a_terminal_and_reaches_pythons_stdout(capsys):
    clock = Clock()
    out = Terminal()
    bar = braid.progress.Progress("fit", 4, unit="ex/s", stream=out, clock=clock)
    clock.t += 0.1
    bar.update(1, 8)
    assert out.getvalue() == ""  # under 0.2 s since the start
    clock.t += 0.3
    bar.update(2, 16, {"acc": 0.5})
    assert out.getvalue() == "\rfit [############............]  50% 2/4 40 ex/s eta 00:00 acc 0.5000\x1b[K"
    braid.progress.Progress("to stdout", 1, clock=clock).update(1, 3, None, final=True)
    assert capsys.readouterr().out.startswith("to stdout [#")  # sys.stdout, which pytest captures
    with pytest.raises(TypeError, match="metrics must be a dict"):
        bar.update(3, 24, [("loss", 1.0)], final=True)
