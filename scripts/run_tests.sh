#!/usr/bin/env bash
# Builds braid twice and runs every unit test in both trees: build/ (release, -Wall -Wextra -Werror)
# and build-asan/ (AddressSanitizer + UndefinedBehaviorSanitizer). CI reads only the last line, the
# count of individual GoogleTest cases over both trees, so nothing may be printed after it.
set -uo pipefail
cd "$(dirname "$0")/.."

jobs=${BRAID_JOBS:-2}  # CI has 2 cores; more jobs would only thrash memory
start=$(date +%s)
failed_steps=()
tree_times=()

# Note [Compiler cache]
# Meson compiles through ccache when it is on PATH (install_deps.sh installs it), with the cache in
# the user's home, outside the clone, so that a fresh clone of an unchanged tree recompiles nothing.
# A clone can sit anywhere: paths under it are rewritten relative (base_dir), and the compile
# directory is left out of the hash of -g builds (the sanitizer tree), whose debug information then
# names the first clone's directory.
export CCACHE_BASEDIR=${CCACHE_BASEDIR:-$PWD}
export CCACHE_NOHASHDIR=${CCACHE_NOHASHDIR:-1}
export CCACHE_MAXSIZE=${CCACHE_MAXSIZE:-8G}

# setup_tree DIR OPTIONS...: configure DIR afresh, or reconfigure it in place so that a repeat run only
# recompiles what changed; wipe it when reconfiguring fails (e.g. a Meson upgrade).
setup_tree() {
  local dir=$1
  shift
  if [[ -f "$dir/meson-private/coredata.dat" ]]; then
    meson setup --reconfigure "$dir" "$@" || meson setup --wipe "$dir" "$@"
  else
    rm -rf "$dir"
    meson setup "$dir" "$@"
  fi
}

# run_tree NAME DIR TIMEOUT_MULTIPLIER OPTIONS...: build and test one tree; a failed step is recorded,
# not fatal, so that the other tree still runs and the count still comes out.
run_tree() {
  local name=$1 dir=$2 mult=$3
  shift 3
  local t0 t1 t2
  t0=$(date +%s)
  echo "==== $name: configure ($*)"
  # A log or gtest XML left by an earlier run would be counted as this run's result.
  rm -f "$dir/meson-logs/testlog.json" "$dir/meson-logs/testlog.junit.xml"
  if ! setup_tree "$dir" "$@"; then
    failed_steps+=("$name: meson setup failed")
    return
  fi
  echo "==== $name: build"
  if ! ninja -C "$dir" -j "$jobs"; then
    failed_steps+=("$name: build failed")
    return
  fi
  python3 scripts/test_summary.py --clean-gtest-xml "$dir"
  t1=$(date +%s)
  echo "==== $name: test"
  # --no-rebuild: the tree was just built, and a failed rebuild here would pass unnoticed. meson's exit
  # status is not used: the summary reads every test's result from the logs.
  meson test -C "$dir" --no-rebuild --print-errorlogs --num-processes "$jobs" --timeout-multiplier "$mult" || true
  # The ONNX backend test suite's counts (tests/test_onnx_conformance.cpp prints them).
  grep -h -A4 '^ONNX conformance:' "$dir/meson-logs/testlog.txt" 2>/dev/null || true
  t2=$(date +%s)
  tree_times+=(--tree-time "$name: configure and build $((t1 - t0)) s, tests $((t2 - t1)) s, in all $((t2 - t0)) s")
}

# pkgconfig.relocatable is the project's default; named here too so that a tree configured before
# it was (reconfigured in place) installs a relocatable braid.pc, which tests/install checks.
run_tree build build "${BRAID_TIMEOUT_MULTIPLIER:-4}" \
  -Dbuildtype=release -Dwerror=true -Db_sanitize=none -Dtests=enabled -Dbenchmarks=enabled -Dpkgconfig.relocatable=true

export ASAN_OPTIONS=detect_leaks=1
export UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1
# No CUDA here: nvcc's objects and the sanitizers do not mix (the release tree builds the backend); no
# Python module either: an ASan-built extension cannot load into an uninstrumented interpreter.
run_tree build-asan build-asan "${BRAID_ASAN_TIMEOUT_MULTIPLIER:-10}" \
  -Dbuildtype=debugoptimized -Db_sanitize=address,undefined -Db_lundef=false -Dtests=enabled -Dbenchmarks=disabled \
  -Dcuda=disabled -Dpython=disabled

if command -v ccache >/dev/null; then ccache --show-stats 2>/dev/null | grep -E 'Hits|Misses|Cache size' || true; fi
echo "==== run_tests.sh took $(($(date +%s) - start)) s"
args=("${tree_times[@]+"${tree_times[@]}"}")
for s in "${failed_steps[@]+"${failed_steps[@]}"}"; do
  args+=(--step-failure "$s")
done
python3 scripts/test_summary.py "${args[@]+"${args[@]}"}" build build-asan
