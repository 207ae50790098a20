#!/usr/bin/env bash
# The README's main job: builds braid (release) in build/ and runs the example that fits a small model
# with autograd, printing its loss as it falls. Only the example and the library are compiled, so
# the main command does not pay for the test suite. Arguments are passed on to braid-fit (steps).
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
ninja -C build -j "$jobs" examples/braid-fit
./build/examples/braid-fit "$@"
