#!/usr/bin/env bash
# Builds the ONNX loader's libFuzzer target with clang (loader instrumented, the rest of braid from
# the build tree) and runs it from a seed corpus: ONNX test-suite models plus the hostile files
# that tests/test_onnx_loader writes.
#   scripts/fuzz_onnx.sh BUILD_DIR [RUNS]     RUNS executions (default 20000), or
#   scripts/fuzz_onnx.sh BUILD_DIR -max_total_time=600   any libFuzzer flags, for a longer run
# Exit status 77 (skipped) when clang with libFuzzer is not installed.
set -euo pipefail
build=$(cd "${1:?usage: fuzz_onnx.sh BUILD_DIR [RUNS | libFuzzer flags]}" && pwd)
shift
root=$(cd "$(dirname "$0")/.." && pwd)
clang=$(command -v clang++ || true)
if [[ -z "$clang" ]]; then
  echo "fuzz_onnx: clang++ is not installed (apt-get install clang); skipped"
  exit 77
fi
work="$build/fuzz"
mkdir -p "$work/corpus"
exe="$work/fuzz_onnx_loader"
if [[ ! -x "$exe" || "$root/onnx/loader.cpp" -nt "$exe" || "$root/tests/fuzz/fuzz_onnx_loader.cpp" -nt "$exe" ]]; then
  "$clang" -std=c++20 -O1 -g -fsanitize=fuzzer,address,undefined -DONNX_ML=1 -DONNX_NAMESPACE=onnx \
    -I"$root/include" -I"$build/include" -I"$root/src" \
    "$root/tests/fuzz/fuzz_onnx_loader.cpp" "$root/onnx/loader.cpp" \
    -L"$build" -lbraid -Wl,-rpath,"$build" -lonnx_proto -lprotobuf -o "$exe"
fi
# Seeds: a spread of the test suite's models (small ones) and the unit test's hostile files.
seeds=/usr/share/libonnx-testdata/data
if [[ -d "$seeds" ]]; then
  for m in node/test_conv_with_strides_padding node/test_add node/test_if node/test_loop11 node/test_gather_0 \
           node/test_reshape_reordered_all_dims simple/test_single_relu_model pytorch-converted/test_Conv2d; do
    [[ -f "$seeds/$m/model.onnx" ]] && cp "$seeds/$m/model.onnx" "$work/corpus/$(echo "$m" | tr / _).onnx"
  done
fi
find "${TMPDIR:-/tmp}" -maxdepth 2 -path '*braid_onnx_*' -name '*.onnx' -size -64k -exec cp {} "$work/corpus/" \; 2>/dev/null || true
if [[ $# -eq 0 || "$1" =~ ^[0-9]+$ ]]; then
  runs=${1:-20000}
  set -- -runs="$runs" -seed=1
fi
export ASAN_OPTIONS=detect_leaks=0:allocator_may_return_null=1
"$exe" -rss_limit_mb=2048 -malloc_limit_mb=512 -timeout=10 "$@" "$work/corpus"
