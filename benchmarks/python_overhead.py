#!/usr/bin/env python3
"""The cost of driving braid from Python (issue 14), against PyTorch eager in the same process and
against braid's own C++, with the same thread count on every side:

1. a loop of 10,000 small tensor ops on 16-element float32 tensors (add, mul, relu, sum and a scalar
   accumulate, 2,000 times), forward only and with requires_grad plus backward() at the end:
   microseconds per op, braid / PyTorch (goal <= 1.0);
2. one training step of the model zoo's small CNN at batch 64 (forward, cross-entropy, backward,
   Adam step, loss.item()) from Python, against the same step in PyTorch and against braid's C++
   step (benchmarks/train_step.cpp's braid-train-step, run as a subprocess): braid from Python /
   braid from C++ (goal <= 1.05);
3. where a small op's time goes in braid: the operator (`a + b`), the generated function called
   directly (`braid._swig._core.add(a, b)`), a wrapped call that returns a Tensor and computes
   nothing (`Tensor_contiguous` of a contiguous tensor: argument conversion, GIL release, the new
   Python object), and the same ops from C++ (a few lines compiled here against the build's
   libbraid.so with g++, skipped when that fails).

PyTorch is Debian's python3-torch, so this runs under /usr/bin/python3 (CPython 3.11, as the
extension is built for):

  PYTHONPATH=build/bindings/python /usr/bin/python3 benchmarks/python_overhead.py --build-dir build \\
      [--threads 1 2] [--json results.json]

A training step is timed as Google Benchmark times braid-train-step, for every engine: each
repetition builds the model and optimizer afresh and runs steps for --min-time seconds (cold first
step included), its mean step time counts, and the median over --reps repetitions is kept (a median
of single steps would hide the slow steps that a mean counts). Op loops keep their fastest
repetition. The engines take turns for --rounds rounds (braid, PyTorch, C++), each keeping its best,
because this shared VM's timings drift.
"""

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def parse_args():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--build-dir", default="build", help="the braid build (braid-train-step, libbraid.so)")
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--ops", type=int, default=10000, help="ops per small-op loop (a multiple of 5)")
    ap.add_argument("--op-reps", type=int, default=15, help="repetitions of each small-op loop (minimum kept)")
    ap.add_argument("--reps", type=int, default=5, help="training-step repetitions per round (median kept)")
    ap.add_argument("--min-time", type=float, default=0.5, help="seconds per training-step repetition")
    ap.add_argument("--rounds", type=int, default=3, help="rounds of taking turns (best kept)")
    ap.add_argument("--no-cpp", action="store_true", help="skip the compiled C++ small-op loop")
    ap.add_argument("--json", default="", help="also write the results here")
    ap.add_argument("--step-only", default="", choices=["", "braid", "braid_py", "torch"],
                    help="(internal) time one engine's training step in this process and print the ms")
    return ap.parse_args()


ARGS = parse_args()
# The thread count is set before either library starts its thread pool, then per measurement by
# braid.set_num_threads and torch.set_num_threads (which share libgomp's pool settings).
os.environ.setdefault("OMP_NUM_THREADS", str(max(ARGS.threads)))

# braid first: its libbraid brings the OpenMP build of OpenBLAS (Note [One thread pool]). Debian's
# NumPy and PyTorch link libopenblas.so.0 by the same name, so whichever is imported first decides
# which build the whole process uses, and with the pthread build first braid's 2-thread step varies
# between 20 and 150 ms (its pool and OpenMP's fight), against 16 ms.
import braid  # noqa: E402
from braid import nn as bnn  # noqa: E402
from braid._swig import _core as bcx  # noqa: E402  (the extension module itself)

import numpy as np  # noqa: E402
# A process that times braid's training step alone does not load PyTorch at all.
torch = None if ARGS.step_only in ("braid", "braid_py") else __import__("torch")

# ---- 1. small ops ----


def small_loop(relu, iters, a, b, acc):
    """5 ops per iteration: add, mul, relu, sum (to a 0-d tensor), and adding it to acc."""
    for _ in range(iters):
        c = a + b
        d = c * a
        e = relu(d)
        s = e.sum()
        acc = acc + s
    return acc


def time_small_loop(lib, grad, ops, reps):
    """Microseconds per op of small_loop (forward, and with grad the backward() at the end), the
    minimum over reps; with grad also the backward's share."""
    iters = ops // 5
    if lib == "braid":
        braid.manual_seed(0)
        a, b = braid.randn(16, requires_grad=grad), braid.randn(16, requires_grad=grad)
        acc0, relu = braid.zeros(()), braid.relu
    else:
        torch.manual_seed(0)
        a, b = torch.randn(16, requires_grad=grad), torch.randn(16, requires_grad=grad)
        acc0, relu = torch.zeros(()), torch.relu
    best, best_bwd = float("inf"), 0.0
    small_loop(relu, 100, a, b, acc0)  # warm-up
    for _ in range(reps):
        t0 = time.perf_counter()
        acc = small_loop(relu, iters, a, b, acc0)
        t1 = time.perf_counter()
        if grad:
            acc.backward()
        t2 = time.perf_counter()
        if grad:
            a.grad = None
            b.grad = None
        if t2 - t0 < best:
            best, best_bwd = t2 - t0, t2 - t1
        del acc
    return 1e6 * best / ops, 1e6 * best_bwd / ops


def time_call(fn, n=20000, reps=7):
    """Microseconds per call of fn() (which makes n // 10 calls of ten statements), the minimum over reps."""
    best = float("inf")
    for _ in range(reps):
        t = time.perf_counter()
        fn(n // 10)
        best = min(best, time.perf_counter() - t)
    return 1e6 * best / n


def op_breakdown():
    """What one braid add costs from Python, layer by layer, next to PyTorch's."""
    a, b = braid.randn(16), braid.randn(16)
    ta, tb = torch.randn(16), torch.randn(16)
    add, contig = bcx.add, bcx.Tensor_contiguous

    def op(n):
        for _ in range(n):
            a + b; a + b; a + b; a + b; a + b; a + b; a + b; a + b; a + b; a + b  # noqa: E702

    def direct(n):
        for _ in range(n):
            add(a, b); add(a, b); add(a, b); add(a, b); add(a, b); add(a, b); add(a, b); add(a, b); add(a, b); add(a, b)  # noqa: E702,E501

    def fixed(n):
        for _ in range(n):
            contig(a); contig(a); contig(a); contig(a); contig(a); contig(a); contig(a); contig(a); contig(a); contig(a)  # noqa: E702,E501

    def torch_op(n):
        for _ in range(n):
            ta + tb; ta + tb; ta + tb; ta + tb; ta + tb; ta + tb; ta + tb; ta + tb; ta + tb; ta + tb  # noqa: E702

    return {"braid a + b": time_call(op), "braid _core.add(a, b)": time_call(direct),
            "braid _core.Tensor_contiguous(a) (a call that computes nothing)": time_call(fixed),
            "PyTorch a + b": time_call(torch_op)}


CPP_LOOP = r"""
// The small-op loop of benchmarks/python_overhead.py in C++ (compiled and run by that script).
#include <braid/braid.h>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
using namespace braid;
static Tensor loop(int iters, const Tensor& a, const Tensor& b, Tensor acc) {
  for (int i = 0; i < iters; ++i) {
    Tensor c = add(a, b);
    Tensor d = mul(c, a);
    Tensor e = relu(d);
    Tensor s = sum(e);
    acc = add(acc, s);
  }
  return acc;
}
int main(int argc, char** argv) {
  set_num_threads(std::atoi(argv[1]));
  const int ops = std::atoi(argv[2]), reps = std::atoi(argv[3]), iters = ops / 5;
  for (int grad = 0; grad < 2; ++grad) {
    manual_seed(0);
    Tensor a = randn({16}), b = randn({16});
    a.set_requires_grad(grad), b.set_requires_grad(grad);
    loop(100, a, b, zeros({}));
    double best = 1e30, best_bwd = 0;
    for (int r = 0; r < reps; ++r) {
      auto t0 = std::chrono::steady_clock::now();
      Tensor acc = loop(iters, a, b, zeros({}));
      auto t1 = std::chrono::steady_clock::now();
      if (grad) acc.backward();
      auto t2 = std::chrono::steady_clock::now();
      const double total = std::chrono::duration<double>(t2 - t0).count();
      if (total < best) best = total, best_bwd = std::chrono::duration<double>(t2 - t1).count();
    }
    std::printf("%s %.6f %.6f\n", grad ? "grad" : "forward", 1e6 * best / ops, 1e6 * best_bwd / ops);
  }
  // One op at a time, for the breakdown.
  Tensor a = randn({16}), b = randn({16});
  const int n = 200000;
  double best = 1e30;
  for (int r = 0; r < 7; ++r) {
    auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < n; ++i) { Tensor c = add(a, b); }
    best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  std::printf("add %.6f 0\n", 1e6 * best / n);
}
"""


def build_cpp_loop(build_dir, tmp):
    """Compiles CPP_LOOP against the build's libbraid.so; returns the program's path or a reason."""
    cxx = shutil.which(os.environ.get("CXX", "g++"))
    lib = os.path.join(build_dir, "libbraid.so")
    if not cxx or not os.path.exists(lib):
        return None, f"no C++ compiler or no {lib}"
    src, exe = os.path.join(tmp, "small_ops.cpp"), os.path.join(tmp, "small_ops")
    with open(src, "w") as f:
        f.write(CPP_LOOP)
    cmd = [cxx, "-O2", "-std=c++20", "-I" + os.path.join(ROOT, "include"), "-I" + os.path.join(build_dir, "include"),
           src, "-o", exe, "-L" + build_dir, "-lbraid", "-Wl,-rpath," + os.path.abspath(build_dir)]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        return None, "compiling the C++ loop failed: " + (r.stderr.strip().splitlines() or ["?"])[-1]
    return exe, ""


def run_cpp_loop(exe, threads, ops, reps):
    env = dict(os.environ, BRAID_NUM_THREADS=str(threads), OMP_NUM_THREADS=str(threads))
    out = subprocess.run([exe, str(threads), str(ops), str(reps)], env=env, capture_output=True, text=True,
                         check=True).stdout
    return {k: (float(a), float(b)) for k, a, b in (line.split() for line in out.strip().splitlines())}


# ---- 2. the training step ----


def braid_small_cnn():
    def stage(i, o):
        return bnn.Sequential(bnn.Conv2d(i, o, 3, padding=1, bias=False), bnn.BatchNorm2d(o), bnn.ReLU(),
                              bnn.MaxPool2d(2))
    return bnn.Sequential(stage(1, 16), stage(16, 32), bnn.Flatten(), bnn.Linear(32 * 7 * 7, 128), bnn.ReLU(),
                          bnn.Linear(128, 10))


class BraidPyCNN(bnn.Module):
    """The same CNN with its forward written in Python (examples/python/train_fashion_mnist.py)."""

    def __init__(self):
        super().__init__()
        seq = braid_small_cnn()
        self.stage1, self.stage2, self.fc1, self.fc2 = seq[0], seq[1], seq[3], seq[5]

    def forward(self, x):
        return self.fc2(braid.relu(self.fc1(self.stage2(self.stage1(x)).flatten(1))))


def torch_small_cnn():
    tnn = torch.nn

    def stage(i, o):
        return [tnn.Conv2d(i, o, 3, 1, 1, bias=False), tnn.BatchNorm2d(o), tnn.ReLU(), tnn.MaxPool2d(2)]
    return tnn.Sequential(*stage(1, 16), *stage(16, 32), tnn.Flatten(), tnn.Linear(32 * 7 * 7, 128), tnn.ReLU(),
                          tnn.Linear(128, 10))


def make_step(kind):
    if kind == "torch":
        torch.manual_seed(0)
        model = torch_small_cnn()
        x, y = torch.randn(64, 1, 28, 28), torch.randint(0, 10, (64,))
        opt = torch.optim.Adam(model.parameters())
        loss_fn = torch.nn.functional.cross_entropy

        def step():
            loss = loss_fn(model(x), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            return loss.item()
        return step
    braid.manual_seed(0)  # as braid-train-step
    model = braid_small_cnn() if kind == "braid" else BraidPyCNN()
    x, y = braid.randn(64, 1, 28, 28), braid.randint(0, 10, (64,))
    opt = braid.optim.Adam(model.parameters())
    loss_fn = bnn.functional.cross_entropy

    def step():
        loss = loss_fn(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        return loss.item()
    return step


def time_steps(kind, reps, min_time):
    """Milliseconds per step as Google Benchmark measures braid-train-step: each repetition builds the
    model and optimizer afresh and runs steps until min_time seconds have passed (the first, cold
    step included); the mean step time of each repetition, and the median over reps."""
    means = []
    for _ in range(reps):
        step = make_step(kind)
        n, t0 = 0, time.perf_counter()
        while True:
            step()
            n += 1
            elapsed = time.perf_counter() - t0
            if elapsed >= min_time:
                break
        means.append(1000 * elapsed / n)
    return statistics.median(means)


def cpp_step_ms(build_dir, threads, reps, min_time):
    exe = os.path.join(build_dir, "benchmarks", "braid-train-step")
    if not os.path.exists(exe):
        return None
    env = dict(os.environ, BRAID_NUM_THREADS=str(threads), OMP_NUM_THREADS=str(threads))
    out = subprocess.run([exe, "--benchmark_filter=train_step/cnn", "--benchmark_format=json",
                          f"--benchmark_repetitions={reps}", f"--benchmark_min_time={min_time}",
                          "--benchmark_report_aggregates_only=true"],
                         env=env, check=True, capture_output=True, text=True).stdout
    for b in json.loads(out)["benchmarks"]:
        if b.get("aggregate_name") == "median":
            return b["real_time"]
    return None


# ---- the run ----


def set_threads(n):
    braid.set_num_threads(n)
    if torch is not None:
        torch.set_num_threads(n)


def step_in_own_process(kind, threads):
    """One engine's training step, timed in a process of its own: two libraries' thread pools in
    one process slow each other's multi-threaded steps down (braid's 2-thread step took 33 ms next
    to PyTorch's and 16 ms alone), which is not what a user who runs one of them sees."""
    env = dict(os.environ, OMP_NUM_THREADS=str(threads))
    out = subprocess.run([sys.executable, os.path.abspath(__file__), "--step-only", kind, "--threads", str(threads),
                          "--reps", str(ARGS.reps), "--min-time", str(ARGS.min_time)],
                         env=env, check=True, capture_output=True, text=True).stdout
    return float(out.strip().splitlines()[-1])


def measure(threads, cpp_exe):
    set_threads(threads)
    res = {"threads": threads}
    loops = {}
    for r in range(ARGS.rounds):
        for lib in ("braid", "torch"):
            for grad in (False, True):
                key = (lib, grad)
                t = time_small_loop(lib, grad, ARGS.ops, max(1, ARGS.op_reps // ARGS.rounds))
                if key not in loops or t[0] < loops[key][0]:
                    loops[key] = t
    res["loop"] = {f"{lib}{'_grad' if g else ''}": {"us_per_op": v[0], "backward_us_per_op": v[1]}
                   for (lib, g), v in loops.items()}
    if cpp_exe:
        c = run_cpp_loop(cpp_exe, threads, ARGS.ops, ARGS.op_reps)
        res["loop"]["cpp"] = {"us_per_op": c["forward"][0], "backward_us_per_op": 0.0}
        res["loop"]["cpp_grad"] = {"us_per_op": c["grad"][0], "backward_us_per_op": c["grad"][1]}
        res["cpp_add_us"] = c["add"][0]
    res["add_breakdown_us"] = op_breakdown()

    best = {}
    for r in range(ARGS.rounds):
        for name in ("braid", "braid_py", "torch"):
            ms = step_in_own_process(name, threads)
            best[name] = min(best.get(name, float("inf")), ms)
        ms = cpp_step_ms(ARGS.build_dir, threads, ARGS.reps, ARGS.min_time)
        if ms is not None:
            best["cpp"] = min(best.get("cpp", float("inf")), ms)
    res["step_ms"] = best
    return res


def report(results, meta):
    lines = [f"braid {braid.__version__} (Python {platform.python_version()}), PyTorch {torch.__version__}, "
             f"NumPy {np.__version__}; {meta['cpu']}; OMP_NUM_THREADS={meta['omp']}", ""]
    lines.append("| small-op loop (16-element float32, 10,000 ops) | threads | braid µs/op | PyTorch µs/op "
                 "| braid / PyTorch (goal ≤ 1.0) | braid from C++ µs/op |")
    lines.append("|---|---:|---:|---:|---:|---:|")
    for r in results:
        L = r["loop"]
        for grad, label in ((False, "forward only"), (True, "requires_grad, forward + backward()")):
            k = "_grad" if grad else ""
            b, t = L["braid" + k]["us_per_op"], L["torch" + k]["us_per_op"]
            cpp = f"{L['cpp' + k]['us_per_op']:.3f}" if "cpp" + k in L else "–"
            note = ""
            if grad:
                note = (f" (backward {L['braid_grad']['backward_us_per_op']:.2f} / "
                        f"{L['torch_grad']['backward_us_per_op']:.2f})")
            lines.append(f"| {label}{note} | {r['threads']} | {b:.3f} | {t:.3f} | {b / t:.2f} | {cpp} |")
    lines.append("")
    lines.append("| training step, small CNN, batch 64, Adam | threads | braid from Python ms | PyTorch ms "
                 "| braid C++ ms (braid-train-step) | braid Python / PyTorch | braid Python / braid C++ (goal ≤ 1.05) |")
    lines.append("|---|---:|---:|---:|---:|---:|---:|")
    for r in results:
        s = r["step_ms"]
        for key, label in (("braid", "nn.Sequential (forward in C++)"), ("braid_py", "nn.Module subclass (forward in Python)")):
            cpp = s.get("cpp")
            lines.append(f"| {label} | {r['threads']} | {s[key]:.1f} | {s['torch']:.1f} | "
                         f"{cpp:.1f} | {s[key] / s['torch']:.2f} | {s[key] / cpp:.2f} |" if cpp else
                         f"| {label} | {r['threads']} | {s[key]:.1f} | {s['torch']:.1f} | – | "
                         f"{s[key] / s['torch']:.2f} | – |")
    lines.append("")
    lines.append("| one add of two 16-element tensors | threads | µs |")
    lines.append("|---|---:|---:|")
    for r in results:
        for k, v in r["add_breakdown_us"].items():
            lines.append(f"| {k} | {r['threads']} | {v:.3f} |")
        if "cpp_add_us" in r:
            lines.append(f"| braid add(a, b) from C++ | {r['threads']} | {r['cpp_add_us']:.3f} |")
    return "\n".join(lines)


def main():
    meta = {"date": time.strftime("%Y-%m-%d"), "python": sys.executable, "omp": os.environ.get("OMP_NUM_THREADS"),
            "torch": torch.__version__, "braid": braid.__version__, "numpy": np.__version__, "ops": ARGS.ops}
    try:
        with open("/proc/cpuinfo") as f:
            model = next((l.split(":", 1)[1].strip() for l in f if l.startswith("model name")), "?")
    except OSError:
        model = platform.processor()
    meta["cpu"] = f"{model}, {os.cpu_count()} cores"
    with tempfile.TemporaryDirectory() as tmp:
        cpp_exe, why = (None, "--no-cpp") if ARGS.no_cpp else build_cpp_loop(ARGS.build_dir, tmp)
        if why:
            print(f"(no C++ small-op loop: {why})", file=sys.stderr)
        results = [measure(t, cpp_exe) for t in ARGS.threads]
    print(report(results, meta))
    if ARGS.json:
        with open(ARGS.json, "w") as f:
            json.dump({"meta": meta, "results": results}, f, indent=2)


if __name__ == "__main__":
    if ARGS.step_only:
        set_threads(ARGS.threads[0])
        print(time_steps(ARGS.step_only, ARGS.reps, ARGS.min_time))
    else:
        main()
