#!/usr/bin/env bash
# Regenerates docs/onnx_coverage.md: runs the ONNX backend-test-suite driver
# (tests/test_onnx_conformance.cpp) of a built tree and writes its op coverage table.
# usage: scripts/onnx_coverage.sh [BUILD_DIR]   (default: build)
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
ninja -C "$build" tests/test_onnx_conformance >/dev/null
mkdir -p docs
BRAID_ONNX_COVERAGE=docs/onnx_coverage.md "$build/tests/test_onnx_conformance" --gtest_brief=1 | grep -A5 '^ONNX conformance'
echo "wrote docs/onnx_coverage.md"
