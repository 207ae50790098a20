#!/usr/bin/env bash
# A longer differential run than CI's: writes COUNT cases for each of several seeds with
# tests/diff/gen_cases.py and runs braid's differential test on each file (BRAID_DIFF_CASES).
# Usage: scripts/diff_long.sh [BUILD_DIR] [COUNT] [SEEDS...]   (defaults: build 50000 2 3 4)
# With build-asan as BUILD_DIR the cases run under AddressSanitizer and UBSan.
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
count=${2:-50000}
shift $(($# < 2 ? $# : 2))
seeds=("$@")
((${#seeds[@]})) || seeds=(2 3 4)

ninja -C "$build" tests/test_differential >/dev/null
status=0
for seed in "${seeds[@]}"; do
  file=$(mktemp --suffix=.jsonl)
  start=$(date +%s)
  python3 tests/diff/gen_cases.py --seed "$seed" --count "$count" --out "$file"
  echo "== seed $seed: $count cases written in $(($(date +%s) - start)) s"
  if ! BRAID_DIFF_CASES="$file" BRAID_NUM_THREADS=2 "$build/tests/test_differential" --gtest_brief=1; then
    status=1
    echo "== seed $seed: disagreements (the case file is kept: $file)"
  else
    rm -f "$file"
  fi
done
exit $status
