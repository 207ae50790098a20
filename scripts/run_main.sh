#!/usr/bin/env bash
# The README's main job: builds braid (release) in build/ and runs braid-train data-parallel on
# BRAID_RANKS (default 2) local MPI ranks with `mpiexec`, which trains the model zoo's CNN on the
# real Fashion-MNIST (installed by Debian's dataset-fashion-mnist) for 3 epochs with a progress
# bar, evaluates on the test set each epoch, and writes a checkpoint, a CSV log and an SVG plot
# under runs/fashion-mnist/. Arguments are passed on to braid-train (--help). BRAID_RANKS=1 runs
# one plain process instead.
set -euo pipefail
cd "$(dirname "$0")/.."

jobs=${BRAID_JOBS:-2}
if [[ -f build/meson-private/coredata.dat ]]; then
  # Keeps options that run_tests.sh set (werror, tests) so that the two commands share one build.
  meson setup --reconfigure build -Dbuildtype=release -Db_sanitize=none >/dev/null ||
    meson setup --wipe build -Dbuildtype=release
else
  rm -rf build
  meson setup build -Dbuildtype=release
fi
ninja -C build -j "$jobs" model_zoo/braid-train
ranks=${BRAID_RANKS:-2}
if [[ "$ranks" == 1 ]]; then
  exec ./build/model_zoo/braid-train "$@"
fi
exec mpiexec -n "$ranks" ./build/model_zoo/braid-train "$@"
