#!/usr/bin/env python3
"""Counts individual GoogleTest cases over one or more Meson build trees for scripts/run_tests.sh.

`meson test` counts test *programs*; CI wants test *cases*, so this reads each tree's
meson-logs/testlog.junit.xml (where Meson copies every gtest case) and cross-checks it against
meson-logs/testlog.json, because the junit file alone shows a program that crashed or leaked after its
cases passed, or timed out, as passing. The last line printed is `N passed, N failed[, N skipped]`.
"""

import argparse
import json
import os
import re
import subprocess
import sys
import xml.etree.ElementTree as ET
from collections import OrderedDict

# Meson's per-program results that mean the program failed (see mesonbuild/mtest.py TestResult).
BAD_RESULTS = {"FAIL", "ERROR", "TIMEOUT", "INTERRUPT", "UNEXPECTEDPASS"}


def meson_tests(tree):
    """The tests Meson knows in tree, as dicts with name and workdir."""
    out = subprocess.run(["meson", "introspect", tree, "--tests"], check=True, capture_output=True, text=True)
    return json.loads(out.stdout)


def clean_gtest_xml(tree):
    """Removes the per-program gtest XML files of an earlier run.

    Meson passes --gtest_output=xml:<name>.xml and parses that file after the program exits without
    checking its age, so a program that crashes before writing it would report the previous run's passes.
    """
    for t in meson_tests(tree):
        if t.get("protocol") != "gtest":
            continue
        base = t.get("workdir") or tree
        path = os.path.join(base, t["name"] + ".xml")
        if os.path.exists(path):
            os.remove(path)


def case_outcome(case):
    """'passed', 'failed' or 'skipped' for one junit <testcase>."""
    if case.find("failure") is not None or case.find("error") is not None:
        return "failed"
    # gtest marks skipped cases with <skipped>, disabled ones with status="notrun".
    if case.find("skipped") is not None or case.get("status") == "notrun":
        return "skipped"
    return "passed"


class Tally:
    def __init__(self):
        self.rows = OrderedDict()  # (tree, test program) -> {"passed": n, "failed": n, "skipped": n}
        self.failures = []  # "tree: program/case" strings

    def add(self, tree, program, outcome, label):
        counts = self.rows.setdefault((tree, program), {"passed": 0, "failed": 0, "skipped": 0})
        counts[outcome] += 1
        if outcome == "failed":
            self.failures.append(f"{tree}: {label}")

    def total(self, outcome):
        return sum(c[outcome] for c in self.rows.values())


def read_program_results(tree):
    """Meson's verdict per test program, from testlog.json (one JSON object per line)."""
    path = os.path.join(tree, "meson-logs", "testlog.json")
    results = OrderedDict()
    with open(path) as f:
        for line in f:
            line = line.strip()
            if line:
                entry = json.loads(line)
                results[entry["name"]] = entry
    return results


GTEST_LINE = re.compile(r"^\[\s*(RUN|OK|FAILED|SKIPPED)\s*\] ([\w/]+)\.([\w/]+)(?: \(|$)")


def count_from_stdout(tree, name, entry, tally):
    """Counts the cases of a gtest program that crashed or timed out, from its console output.

    The case that was running when it died (a RUN line with no verdict) counts as failed. Returns
    False when the output names no case, so the caller counts the program as one failure instead.
    """
    verdicts = OrderedDict()
    for line in (entry.get("stdout") or "").splitlines():
        m = GTEST_LINE.match(line.strip())
        if m:
            kind, suite, case = m.groups()
            verdicts[(suite, case)] = kind
    if not verdicts:
        return False
    why = f"{entry['result']}, exit status {entry.get('returncode')}"
    for (suite, case), kind in verdicts.items():
        outcome = {"OK": "passed", "SKIPPED": "skipped"}.get(kind, "failed")
        label = f"{name} {suite}.{case}" + (f" (was running when the program ended: {why})" if kind == "RUN" else "")
        tally.add(tree, name, outcome, label)
    if all(kind in ("OK", "SKIPPED") for kind in verdicts.values()):
        tally.add(tree, name, "failed", f"{name}: ended {why} outside any test case")
    return True


def count_tree(tree, tally):
    results = read_program_results(tree)
    junit_path = os.path.join(tree, "meson-logs", "testlog.junit.xml")
    suites = ET.parse(junit_path).getroot().iter("testsuite") if os.path.exists(junit_path) else []
    # Meson names a gtest program's suites "<project>.<program>.<gtest suite>".
    by_program = {}
    names = sorted(results, key=len, reverse=True)  # longest first, so "ops" does not claim "ops.grad"
    for suite in suites:
        full = suite.get("name", "")
        for name in names:
            marker = "." + name + "."
            pos = full.find(marker)
            if pos >= 0:
                by_program.setdefault(name, []).append((full[pos + len(marker):], suite))
                break

    for name, entry in results.items():
        result = entry["result"]
        gtest_suites = by_program.get(name, [])
        failed_cases = 0
        for suite_name, suite in gtest_suites:
            for case in suite.iter("testcase"):
                outcome = case_outcome(case)
                failed_cases += outcome == "failed"
                tally.add(tree, name, outcome, f"{name} {suite_name}.{case.get('name')}")
        if not gtest_suites and result in BAD_RESULTS and count_from_stdout(tree, name, entry, tally):
            pass  # a gtest program that died before writing its XML; its console log named the cases
        elif not gtest_suites:
            # Not a gtest program, or one that printed nothing usable: one result for the program.
            outcome = "skipped" if result == "SKIP" else "failed" if result in BAD_RESULTS else "passed"
            tally.add(tree, name, outcome, f"{name} ({result}, exit status {entry.get('returncode')})")
        elif result in BAD_RESULTS and failed_cases == 0:
            # Every case passed but the program did not (a sanitizer report at exit, a timeout, a crash in
            # a destructor): count the program itself as one failure.
            tally.add(tree, name, "failed",
                      f"{name}: all cases passed but the program ended {result} (exit status {entry.get('returncode')})")


def print_times(trees, tree_times, slowest):
    """Each tree's wall time (as run_tests.sh measured it) and the slowest tests over every tree, from
    Meson's per-program durations: where CI's time goes, so that it stays inside its budget."""
    if tree_times:
        print("==== wall time per tree")
        for t in tree_times:
            tree, text = t.split(":", 1)
            print(f"  {tree}: {text.strip()}")
    timed = []
    for tree in trees:
        try:
            results = read_program_results(tree)
        except (OSError, ValueError):
            continue
        timed += [(float(e.get("duration") or 0), tree, name) for name, e in results.items()]
    if timed and slowest > 0:
        timed.sort(reverse=True)
        print(f"==== the {min(slowest, len(timed))} slowest tests")
        for seconds, tree, name in timed[:slowest]:
            print(f"  {seconds:8.1f} s  {tree}: {name}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("trees", nargs="+", help="Meson build directories")
    parser.add_argument("--clean-gtest-xml", action="store_true",
                        help="remove stale gtest XML files in the trees and exit")
    parser.add_argument("--step-failure", action="append", default=[], metavar="TREE:MESSAGE",
                        help="a configure/build step that failed in TREE; counted as one failure")
    parser.add_argument("--tree-time", action="append", default=[], metavar="TREE:TEXT",
                        help="the wall time of TREE's steps, printed above the count")
    parser.add_argument("--slowest", type=int, default=10, help="how many of the slowest tests to list")
    args = parser.parse_args()

    if args.clean_gtest_xml:
        for tree in args.trees:
            clean_gtest_xml(tree)
        return 0

    tally = Tally()
    broken = {s.split(":", 1)[0]: s for s in args.step_failure}
    for tree in args.trees:
        if tree in broken:
            tally.add(tree, "[build]", "failed", broken[tree].split(":", 1)[1].strip())
            continue
        try:
            count_tree(tree, tally)
        except (OSError, ET.ParseError, ValueError) as e:
            tally.add(tree, "[logs]", "failed", f"cannot read test logs: {e}")
    for s in args.step_failure:
        if s.split(":", 1)[0] not in args.trees:
            tally.add("?", "[build]", "failed", s)

    if not tally.rows:
        tally.add("-", "[none]", "failed", "no test ran")

    # One line per test program (Meson test), the trees side by side, so that the summary stays short;
    # the failed cases are named below it.
    trees = list(OrderedDict.fromkeys(t for t, _ in tally.rows))
    programs = list(OrderedDict.fromkeys(p for _, p in tally.rows))
    width = max(len(p) for p in programs)
    print("==== test cases per program (passed/failed/skipped)")
    print(f"{'program':<{width}}  " + "  ".join(f"{t:>16}" for t in trees))
    for s in programs:
        cells = []
        for t in trees:
            c = tally.rows.get((t, s))
            cells.append(f"{c['passed']}/{c['failed']}/{c['skipped']}" if c else "-")
        print(f"{s:<{width}}  " + "  ".join(f"{c:>16}" for c in cells))
    if tally.failures:
        print(f"==== {len(tally.failures)} failed:")
        for f in tally.failures[:100]:
            print("  " + f)
        if len(tally.failures) > 100:
            print(f"  ... and {len(tally.failures) - 100} more")

    print_times(args.trees, args.tree_time, args.slowest)
    passed, failed, skipped = tally.total("passed"), tally.total("failed"), tally.total("skipped")
    sys.stdout.flush()
    line = f"{passed} passed, {failed} failed" + (f", {skipped} skipped" if skipped else "")
    print(line, flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
