#!/usr/bin/env bash
# Builds braid with the CUDA backend here (a release tree of its own, build-gpu/, without oneDNN:
# the GPU checks compare CUDA with the CPU backend's own kernels, and oneDNN's 40 MB library would not
# fit in what the device tool carries) and packs what a GPU machine without braid's
# dependencies needs to run its GPU checks into build/bundle/: the test programs and braid-train,
# libbraid.so and every shared library they load that is not part of the CUDA toolkit (OpenBLAS, MPICH,
# protobuf, the ONNX library, libstdc++ and glibc with its loader, for machines whose glibc is older),
# compressed, plus Fashion-MNIST and the ONNX backend test data. scripts/gpu_check.sh runs it there.
#
#   ./scripts/gpu_bundle.sh            # then, with the device tool:
#   run(command="bash scripts/gpu_check.sh", carry=["build/bundle"])
#
# The device tool carries at most 64 MiB; the script prints the bundle's size and fails above 56 MiB.
set -euo pipefail
cd "$(dirname "$0")/.."
build=${BRAID_GPU_BUILD:-build-gpu}
jobs=${BRAID_JOBS:-2}

if [[ ! -f "$build/meson-private/coredata.dat" ]]; then
  meson setup "$build" -Dbuildtype=release -Dwerror=true -Dcuda=enabled -Ddnnl=disabled -Dtests=enabled \
    -Dbenchmarks=enabled
fi
grep -q '#define BRAID_HAVE_CUDA' "$build/include/braid/config.h" ||
  { echo "gpu_bundle: $build is configured without CUDA (meson configure $build -Dcuda=enabled)" >&2; exit 1; }
ninja -C "$build" -j "$jobs"

out=build/bundle  # where scripts/gpu_check.sh looks, whichever tree made it
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
rm -rf "$out"
mkdir -p "$out" "$stage/bin" "$stage/lib"

# Only the programs scripts/gpu_check.sh runs (its suite list and the distributed checks): all of
# braid's tests together would not fit in what the device tool carries.
# BRAID_BUNDLE_TESTS="" carries braid-train alone (with BRAID_BUNDLE_TRAIN_IMAGES=60000 and
# BRAID_BUNDLE_ONNX_DATA=0: the main job on all of Fashion-MNIST, within the 64 MiB).
checked=(${BRAID_BUNDLE_TESTS-cuda_backend cuda_half cuda_fused cuda_conv cuda_matmul cuda_attention tensor ops_golden gradcheck autograd loss optim conv layers sequence_layers
  checkpoint device amp onnx_module onnx_conformance differential nccl distributed pipeline amp_distributed})
programs=("$build/model_zoo/braid-train" "$build/benchmarks/braid-device-bench")
for t in "${checked[@]}"; do programs+=("$build/tests/test_$t"); done
((${#checked[@]} > 0)) || programs=("$build/model_zoo/braid-train")
for p in "${programs[@]}"; do
  if [[ -f "$p" && -x "$p" ]]; then cp "$p" "$stage/bin/"; fi
done
[[ " ${checked[*]} " == *" differential "* ]] && cp "$build"/tests/diff_cases.jsonl "$stage/bin/"
# MPICH's launcher, for the checks at 2 ranks on the one GPU (the machine's own MPI, if any, is
# another implementation that braid's programs cannot talk to).
for p in mpiexec.hydra hydra_pmi_proxy; do
  if command -v "$p" >/dev/null; then cp "$(command -v "$p")" "$stage/bin/"; fi
done

# Every library the programs load, except the CUDA toolkit's (the GPU machine has its own, matching
# its driver) and the kernel's vDSO. glibc and the loader come along for machines with an older one.
{ ldd "$build/libbraid.so" "$build/libbraid_cuda.so" "$stage"/bin/* 2>/dev/null || true; } | awk '/=>/ && $3 ~ /^\// {print $3}' | sort -u |
  grep -Ev '/(libcuda|libcudart|libcublas|libcublasLt|libcudnn[a-z_]*|libnccl|libnvrtc|libnvJitLink)\.so' |
  while read -r lib; do cp -L "$lib" "$stage/lib/"; done
cp -L "$build/libbraid.so" "$stage/lib/"
cp -L "$build/libbraid_cuda.so" "$stage/lib/"  # the CUDA backend, opened beside libbraid.so on first use
cp -L /lib64/ld-linux-x86-64.so.2 "$stage/lib/"
strip --strip-unneeded "$stage"/lib/*.so* "$stage"/bin/test_* "$stage"/bin/braid-* 2>/dev/null || true
tar -C "$stage" -cJf "$out/programs.tar.xz" bin lib

# Data the GPU run reads: Fashion-MNIST (already compressed) and the ONNX backend test suite.
if [[ -d /usr/share/datasets/fashion-mnist ]]; then
  # The first BRAID_BUNDLE_TRAIN_IMAGES (default 30,000) of the 60,000 training images, to fit what the
  # device tool carries; the 10,000 test images are all there, so accuracy is comparable.
  mkdir -p "$out/fashion-mnist"
  cp /usr/share/datasets/fashion-mnist/t10k-*.gz "$out/fashion-mnist/"
  python3 - "$out/fashion-mnist" "${BRAID_BUNDLE_TRAIN_IMAGES:-30000}" <<'PY'
import gzip, struct, sys
out, n = sys.argv[1], int(sys.argv[2])
for name, item in (("train-images-idx3-ubyte.gz", 28 * 28), ("train-labels-idx1-ubyte.gz", 1)):
    data = gzip.open("/usr/share/datasets/fashion-mnist/" + name).read()
    header = 16 if item > 1 else 8
    count = min(n, struct.unpack(">I", data[4:8])[0])
    body = data[:4] + struct.pack(">I", count) + data[8:header] + data[header:header + count * item]
    with gzip.open(f"{out}/{name}", "wb", compresslevel=9) as f:
        f.write(body)
PY
fi
if [[ -d /usr/share/libonnx-testdata && ${BRAID_BUNDLE_ONNX_DATA:-1} != 0 ]]; then
  tar -C /usr/share -cJf "$out/libonnx-testdata.tar.xz" libonnx-testdata
fi
git rev-parse HEAD >"$out/commit"

size=$(du -sm "$out" | cut -f1)
echo "gpu_bundle: $out is ${size} MiB (the device tool carries 64 MiB)"
du -sh "$out"/*
if ((size > 56)); then  # the working tree travels too (about 6 MiB)
  echo "gpu_bundle: too large to carry" >&2
  exit 1
fi
