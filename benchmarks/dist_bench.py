#!/usr/bin/env python3
"""Runs braid-allreduce-bench under mpiexec and prints the data-parallel communication tables.

All numbers come from one invocation: the all-reduce sweep and the link constants (2 ranks), the
zoo models' training steps on 2 ranks and on 1 rank, and the ring cost model fitted to this run's
link constants. Usage: python3 benchmarks/dist_bench.py [--build-dir build] (see --help).
--markdown prints benchmarks/README.md's block, provenance first (`python3 benchmarks/update_readme.py
dist_bench` prints the committed results/distbench_2ranks.json so).
"""

import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXE = "benchmarks/braid-allreduce-bench"
MODELS = ["resnet", "cnn"]
PREDICT_RANKS = [8, 16, 32, 64, 128, 256, 512]
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import readme_tables  # noqa: E402

LARGE = 4 << 20  # "large buffer" for the fraction-of-ideal goal
GOAL_IDEAL = 0.75


def sh(cmd, env=None, **kw):
    return subprocess.run(cmd, check=True, text=True, cwd=ROOT, env=env, **kw)


def build(build_dir):
    """Configures a release tree if there is none and brings the benchmark up to date."""
    if not os.path.exists(os.path.join(ROOT, build_dir, "meson-private", "coredata.dat")):
        sh(["meson", "setup", build_dir, "-Dbuildtype=release", "-Dbenchmarks=enabled"], stdout=sys.stderr)
    options = json.loads(sh(["meson", "introspect", build_dir, "--buildoptions"], capture_output=True).stdout)
    values = {o["name"]: o["value"] for o in options}
    if values.get("buildtype") != "release" or values.get("b_sanitize", "none") != "none":
        print(f"warning: {build_dir} is buildtype={values.get('buildtype')} b_sanitize={values.get('b_sanitize')};"
              " numbers are only meaningful from a release build", file=sys.stderr)
    sh(["ninja", "-C", build_dir, EXE], stdout=sys.stderr)
    return os.path.join(ROOT, build_dir, EXE)


def load1():
    with open("/proc/loadavg") as f:
        return float(f.read().split()[0])


def wait_for_quiet(max_load, max_wait):
    """Waits (30 s steps) for the 1-minute load average to drop below max_load; returns it."""
    deadline = time.time() + max_wait
    while load1() >= max_load and time.time() < deadline:
        print(f"load average {load1():.2f} >= {max_load}; waiting 30 s", file=sys.stderr)
        time.sleep(30)
    if load1() >= max_load:
        print(f"warning: load average still {load1():.2f} after {max_wait} s; measuring anyway", file=sys.stderr)
    return load1()


def machine():
    fields = {}
    for line in sh(["lscpu"], capture_output=True).stdout.splitlines():
        key, _, value = line.partition(":")
        fields[key.strip()] = value.strip()
    try:  # MPICH names its version and device; another MPI gets the launcher's first line
        lines = sh(["mpichversion"], capture_output=True).stdout.splitlines()
        mpi = " ".join(line.split(":", 1)[1].strip() for line in lines
                       if line.startswith(("MPICH Version:", "MPICH Device:")))
        mpi = "MPICH " + mpi
    except (OSError, subprocess.CalledProcessError):
        mpi = sh(["mpiexec", "--version"], capture_output=True).stdout.splitlines()[0].strip()
    return {"cpu": fields.get("Model name", "?"), "cores": fields.get("CPU(s)", str(os.cpu_count())), "mpi": mpi,
            "date": datetime.date.today().isoformat()}


def run(exe, ranks, threads, args):
    """One program run; ranks = 0 runs it plainly (a world of one, no MPI)."""
    env = dict(os.environ, BRAID_NUM_THREADS=str(threads))
    cmd = ([exe] if ranks == 0 else ["mpiexec", "-n", str(ranks), exe]) + [str(a) for a in args]
    print("running: BRAID_NUM_THREADS=%d %s" % (threads, " ".join(os.path.relpath(c, ROOT) if c == exe else c
                                                                   for c in cmd)), file=sys.stderr)
    out = sh(cmd, env=env, capture_output=True).stdout
    return [json.loads(line) for line in out.splitlines() if line.startswith("{")]


def measure(exe, max_mib, trials, steps):
    records = run(exe, 2, 1, ["sweep", max_mib])
    # Training runs go round-robin over the configurations, so that a burst of background load
    # falls on one trial of each rather than on every trial of one.
    configs = [(m, ranks, threads, 25) for m in MODELS for ranks, threads in [(2, 1), (0, 1), (0, 2)]]
    configs.append(("resnet", 2, 1, 0.05))  # small buckets: one 25 MiB bucket cannot overlap backward
    for _ in range(trials):
        for model, ranks, threads, bucket in configs:
            records += run(exe, ranks, threads, ["train", model, 32, steps, 5, bucket])
    # p = 4 on 2 cores is oversubscribed; measured only to show how far that is from the model.
    records += run(exe, 4, 1, ["comm", "resnet"])
    return records


# ---------------------------------------------------------------------------------------------
# Cost model


def fit_link(records):
    """alpha from the smallest exchange; beta from a line through the exchanges of 64 KiB and more,
    fitted to relative error so that the small ones count as much as 64 MiB; gamma from the add
    loop over 64 MiB; o = braid's fixed cost per collective (barrier, braid minus MPI)."""
    sr = {r["bytes"]: r["seconds"] for r in records if r["kind"] == "sendrecv"}
    add = {r["bytes"]: r["seconds"] for r in records if r["kind"] == "add"}
    bar = next(r for r in records if r["kind"] == "barrier")
    # Weighted least squares of t = a + b n with weights 1 / t^2.
    pts = [(n, t, 1 / t ** 2) for n, t in sr.items() if n >= 1 << 16]
    sw = sum(w for _, _, w in pts)
    mn = sum(w * n for n, _, w in pts) / sw
    mt = sum(w * t for _, t, w in pts) / sw
    beta = sum(w * (n - mn) * (t - mt) for n, t, w in pts) / sum(w * (n - mn) ** 2 for n, _, w in pts)
    return {"alpha": sr[min(sr)], "beta": beta, "gamma": add[max(add)] / max(add),
            "gamma_cached": add[min(add)] / min(add), "o": bar["braid"] - bar["mpi"]}


def ring_time(link, p, n):
    """T(p, n) = 2(p-1) alpha + 2 (p-1)/p n beta + (p-1)/p n gamma, n in bytes."""
    return 2 * (p - 1) * link["alpha"] + (p - 1) / p * n * (2 * link["beta"] + link["gamma"])


# ---------------------------------------------------------------------------------------------
# Tables


def us(s):
    return f"{s * 1e6:,.1f}" if s < 1e-3 else f"{s * 1e6:,.0f}"


def ms(s):
    return f"{s * 1e3:.2f}"


def size(n):
    return f"{n >> 20} MiB" if n >= 1 << 20 else f"{n >> 10} KiB"


def train_medians(records):
    """(model, ranks, threads, bucket_mb) -> the median over trials of every timing field."""
    groups = {}
    for r in records:
        if r["kind"] == "train":
            groups.setdefault((r["model"], r["ranks"], r["threads"], r["bucket_mb"]), []).append(r)
    out = {}
    for key, rs in groups.items():
        m = dict(rs[0])
        for field, value in rs[0].items():
            if isinstance(value, float):
                m[field] = statistics.median(r[field] for r in rs)
        m["trials"] = len(rs)
        out[key] = m
    return out


def print_tables(records, info, markdown=False):
    link = fit_link(records)
    if markdown:
        print("\n".join(readme_tables.meta_lines({
            "machine": f"{info['cpu']}, {info['cores']} cores, {info['mpi']}", "date": info["date"],
            "commit": info.get("commit", "not recorded"),
            "command": info.get("command", "python3 benchmarks/dist_bench.py --build-dir build")})))
        print()
    print(f"Machine: {info['cpu']}, {info['cores']} cores, {info['mpi']}, measured {info['date']}; "
          f"1-minute load average {info['load_before']:.2f} before the run, {info['load_after']:.2f} after.")
    print()
    bar = next(r for r in records if r["kind"] == "barrier")
    print("**1. All-reduce, sum of float32, 2 ranks** (median of the slowest rank's time; p90 in brackets):")
    print()
    print("| size | braid µs | MPI_Allreduce µs | ideal ring µs | braid, deterministic µs | braid / MPI "
          f"(goal ≤ 1) | ideal / braid (goal ≥ {GOAL_IDEAL} from {size(LARGE)}) | model T(2, n) µs |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    misses_mpi, misses_ideal = [], []
    for r in (r for r in records if r["kind"] == "allreduce"):
        n, b, m, i = r["bytes"], r["braid"], r["mpi"], r["ideal"]
        vs_mpi, vs_ideal = b / m, i / b
        mark_mpi = "" if vs_mpi <= 1 else " **miss**"
        mark_ideal = "" if n < LARGE or vs_ideal >= GOAL_IDEAL else " **miss**"
        if vs_mpi > 1:
            misses_mpi.append(size(n))
        if n >= LARGE and vs_ideal < GOAL_IDEAL:
            misses_ideal.append(size(n))
        print(f"| {size(n)} | {us(b)} ({us(r['braid_p90'])}) | {us(m)} ({us(r['mpi_p90'])}) | {us(i)} | "
              f"{us(r['braid_ring'])} | {vs_mpi:.2f}{mark_mpi} | {vs_ideal:.2f}{mark_ideal} | "
              f"{us(ring_time(link, 2, n))} |")
    print()
    print(f"braid slower than MPI_Allreduce at: {', '.join(misses_mpi) or 'none'}; below {GOAL_IDEAL} of the ideal "
          f"at {size(LARGE)} and above: {', '.join(misses_ideal) or 'none'}. A barrier (no data) takes "
          f"{us(bar['braid'])} µs in braid (p90 {us(bar['braid_p90'])}) and {us(bar['mpi'])} µs as MPI_Barrier: "
          "braid's fixed cost per collective.")
    print()

    g = next(r for r in records if r["kind"] == "gradients" and r["model"] == "resnet18")
    total = g["params"] * 4
    print(f"**2. ResNet-18 gradients**, {g['params']:,} float32 in {g['tensors']} tensors ({total / 2**20:.1f} MiB), "
          f"2 ranks; braid: buckets of {', '.join(f'{b / 2**20:.1f}' for b in g['bucket_bytes'])} MiB, "
          "all_reduce_async(Average) each, then all waited:")
    print()
    print("| | ms | GB/s (bytes / time) | ideal / this |")
    print("|---|---:|---:|---:|")
    for label, key in [("braid, DDP buckets", "braid"), ("one MPI_Allreduce", "mpi"), ("ideal ring", "ideal")]:
        print(f"| {label} | {ms(g[key])} (p90 {ms(g[key + '_p90'])}) | {total / g[key] / 1e9:.2f} | "
              f"{g['ideal'] / g[key]:.2f} |")
    print(f"| model T(2, n) | {ms(ring_time(link, 2, total))} | | |")
    print()

    tm = train_medians(records)
    trials = next(iter(tm.values()))["trials"]
    print(f"**3. Training step**, batch 32 per rank, SGD, 1×28×28 random input, mean of "
          f"{next(iter(tm.values()))['steps']} steps after 5 warm-up, median of {trials} trials; "
          "2 ranks run 1 thread each:")
    print()
    rows = [(model, bucket, tm[(model, 2, 1, bucket)]) for model in MODELS for bucket in (25, 0.05)
            if (model, 2, 1, bucket) in tm]

    def label(model, bucket, two):
        return f"{model} ({two['grad_bytes'] / 1e3:.0f} KB)" + ("" if bucket == 25 else f", buckets ≤ {bucket} MiB")

    print("| model (gradient) | 1 rank, 1 thread ms | 1 rank, 2 threads ms | 2 ranks ms | 2 ranks / 1 rank 1 thread "
          "| samples/s, 2 ranks vs faster 1 rank |")
    print("|---|---:|---:|---:|---:|---:|")
    for model, bucket, two in rows:
        one1, one2 = tm[(model, 1, 1, 25)], tm[(model, 1, 2, 25)]
        # Against the faster single-process setting: 2 threads is not always the faster one.
        best = min(one1["step"], one2["step"])
        speed = (2 * two["batch"] / two["step"]) / (one1["batch"] / best)
        print(f"| {label(model, bucket, two)} | {ms(one1['step'])} | {ms(one2['step'])} | {ms(two['step'])} | "
              f"{two['step'] / one1['step']:.2f} | {speed:.2f}× |")
    print()
    print("| model (gradient) | buckets | forward ms (1 rank / 2 ranks) | backward ms | backward ends apart ms "
          "| exposed, mean of ranks ms | exposed, last rank ms | comm alone µs | hidden (last rank) "
          "| hidden (mean of ranks) |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for model, bucket, two in rows:
        one = tm[(model, 1, 1, 25)]
        hidden_last = 1 - two["exposed_last"] / two["comm_alone"]
        hidden_mean = 1 - two["exposed_mean"] / two["comm_alone"]
        print(f"| {label(model, bucket, two)} | {two['buckets']} | {ms(one['forward'])} / {ms(two['forward'])} | "
              f"{ms(one['backward'])} / {ms(two['backward'])} | {ms(two['skew'])} | {ms(two['exposed_mean'])} | "
              f"{ms(two['exposed_last'])} | {us(two['comm_alone'])} | {hidden_last:.2f} | {hidden_mean:.2f} |")
    print()
    print("hidden = 1 − exposed / comm alone; backward on 2 ranks includes the exposed wait.")
    print()

    print(f"**4. Ring cost model**: alpha = {link['alpha'] * 1e6:.2f} µs (MPI_Sendrecv of 4 B), "
          f"beta = {link['beta'] * 1e9:.3f} ns/B ({1 / link['beta'] / 1e9:.1f} GB/s, fitted to "
          f"exchanges of 64 KiB–64 MiB), gamma = {link['gamma'] * 1e9:.3f} ns/B (add loop over 64 MiB on both "
          f"ranks at once; "
          f"{link['gamma_cached'] * 1e9:.3f} ns/B over 1 MiB in cache), braid's fixed cost per collective "
          f"o = {us(link['o'])} µs (barrier, braid − MPI).")
    print()
    res, one = tm[("resnet", 2, 1, 25)], tm[("resnet", 1, 1, 25)]
    n, t1, tb = res["grad_bytes"], one["step"], one["backward"]
    r18 = next(r for r in records if r["kind"] == "gradients" and r["model"] == "resnet18")["params"] * 4
    p4 = next((r for r in records if r["kind"] == "gradients" and r["model"] == "resnet" and r["ranks"] == 4), None)
    print(f"Predicted resnet step (batch 32 per rank, 1 thread per rank): compute = the 1-rank step, "
          f"{ms(t1)} ms, of which backward {ms(tb)} ms; communication = o + T(p, {n / 1e3:.0f} KB).")
    print()
    print(f"| ranks p | o + T(p, {n / 1e3:.0f} KB) µs | measured comm µs | step, no overlap ms "
          f"| step, full overlap ms | measured step ms | efficiency (no overlap) "
          f"| o + T(p) for ResNet-18's {r18 / 2**20:.1f} MiB, ms |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for p in [2, 4] + PREDICT_RANKS:
        comm = link["o"] + ring_time(link, p, n)
        no_ovl, ovl = t1 + comm, t1 + max(0.0, comm - tb)
        meas_comm, meas_step = "", ""
        if p == 2:
            meas_comm, meas_step = us(res["comm_alone"]), ms(res["step"])
        if p == 4 and p4:
            meas_comm = f"{us(p4['braid'])} (4 ranks on 2 cores)"
        print(f"| {p} | {us(comm)} | {meas_comm} | {ms(no_ovl)} | {ms(ovl)} | {meas_step} | {t1 / no_ovl:.3f} | "
              f"{ms(link['o'] + ring_time(link, p, r18))} |")
    return 0


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--build-dir", "--build", dest="build_dir", default="build")
    parser.add_argument("--max-mib", type=int, default=128, help="largest all-reduce (MiB)")
    parser.add_argument("--trials", type=int, default=3, help="runs of each training configuration")
    parser.add_argument("--steps", type=int, default=20, help="timed training steps per run")
    parser.add_argument("--max-load", type=float, default=1.0, help="wait for a lower 1-minute load average")
    parser.add_argument("--max-wait", type=float, default=600, help="seconds to wait for it at most")
    parser.add_argument("--save-json", metavar="PATH", help="also write the raw records here")
    parser.add_argument("--load-json", metavar="PATH", help="print the tables of a saved run instead of running")
    parser.add_argument("--markdown", action="store_true", help="print the README's block: provenance, then the tables")
    args = parser.parse_args()

    if args.load_json:
        with open(args.load_json) as f:
            saved = json.load(f)
        return print_tables(saved["records"], saved["info"], args.markdown)
    exe = build(args.build_dir)
    info = machine()
    run = readme_tables.provenance()
    info.update(commit=run["commit"], command=run["command"])
    info["load_before"] = wait_for_quiet(args.max_load, args.max_wait)
    records = measure(exe, args.max_mib, args.trials, args.steps)
    info["load_after"] = load1()
    if args.save_json:
        with open(args.save_json, "w") as f:
            json.dump({"info": info, "records": records}, f, indent=1)
    return print_tables(records, info, args.markdown)


if __name__ == "__main__":
    sys.exit(main())
