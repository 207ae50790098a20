#!/usr/bin/env bash
# Runs one of the CUDA tests against the host emulation of the CUDA runtime, cuBLAS and NCCL
# (tools/cuda_emu): the CUDA backend's parity suite and the NCCL group at a world of one, on a
# machine without a GPU. The first test to get here builds the emulation into BUILD_DIR/cuda_emu
# (again whenever libbraid.so or the test's source is newer than it); the others wait for it.
#   tests/cuda_emu_test.sh BUILD_DIR test_nccl|test_cuda_backend [gtest arguments...]
set -euo pipefail
build=$(cd "$1" && pwd)
prog=$2
shift 2
emu="$build/cuda_emu"
mkdir -p "$emu"
(
  flock 9
  src=$(cd "$(dirname "$0")/.." && pwd)
  # Stale when braid or the test changed, or a source the emulation compiles itself (the backend's, the
  # NCCL group's, the emulation's own), which an incremental build of libbraid.so does not relink.
  newer=$(find "$src/src/backend/cuda" "$src/tools/cuda_emu" "$src/distributed" -newer "$emu/libbraid.so" \
    \( -path "$src/src/backend/cuda/*" -o -path "$src/tools/cuda_emu/*" -o -name 'nccl*.cpp' -o -name 'nccl*.h' \) -print -quit 2>/dev/null || true)
  if [[ ! -x "$emu/$prog" || ! -f "$emu/libbraid.so" || -n $newer || "$build/libbraid.so" -nt "$emu/libbraid.so" ||
    "$(dirname "$0")/cuda_parity.h" -nt "$emu/$prog" || "$(dirname "$0")/$prog.cpp" -nt "$emu/$prog" ]]; then
    EMU_DIR="$emu" "$(dirname "$0")/../tools/cuda_emu/build.sh" "$build" >"$emu/build.log" 2>&1 ||
      { cat "$emu/build.log" >&2; exit 1; }
  fi
) 9>"$emu/.lock"
# The emulated libbraid.so, which the programs find by their run path, not the one of the tree.
unset LD_LIBRARY_PATH
exec "$emu/$prog" "$@"
