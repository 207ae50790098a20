#!/usr/bin/env bash
# The GPU checks, run on a lent GPU machine from the repository root with build/bundle carried
# (scripts/gpu_bundle.sh makes it here). Writes every log under $OUT (default: gpu-results/):
#   nvidia-smi.txt       the device
#   cuda_backend.txt     the backend parity suite (every primitive and dtype against the CPU backend)
#   suite-<name>.txt     the unit tests with every tensor on cuda:0 (BRAID_TEST_DEVICE=cuda)
#   nccl.txt             the NCCL group at a world of one, and its watchdog (tests/test_nccl.cpp)
#   suite-*-np2.txt      the distributed suites at 2 ranks sharing the GPU (CUDA tensors staged
#                        through MPI, since NCCL refuses two ranks on one GPU)
#   main-job.txt         braid-train --device cuda on Fashion-MNIST, and --amp bf16; -np2: data-
#                        parallel and pipeline runs at 2 ranks on the one GPU
#   summary.txt          one line per step: passed / failed
#   device_bench.md      GEMM, convolution, ResNet-50 and GPT-2-small steps against PyTorch
#
# BRAID_CHECK_DEVICE=shadow runs the same steps on the shadow device: a dry run of the recipe on a
# machine without a GPU (the CUDA parity suite then skips with its reason).
set -uo pipefail
cd "$(dirname "$0")/.."
dev=${BRAID_CHECK_DEVICE:-cuda}
root=$(pwd)
out=${OUT:-$root/gpu-results}
bundle=${BRAID_GPU_BUNDLE:-$root/build/bundle}
mkdir -p "$out"
summary="$out/summary.txt"
: >"$summary"
note() { echo "$*" | tee -a "$summary"; }

[[ -f "$bundle/programs.tar.xz" ]] || { note "no bundle at $bundle: run scripts/gpu_bundle.sh and carry build/bundle"; exit 2; }
work=$(mktemp -d)
tar -C "$work" -xJf "$bundle/programs.tar.xz"
[[ -f "$bundle/libonnx-testdata.tar.xz" && ! -d /usr/share/libonnx-testdata ]] &&
  tar -C /usr/share -xJf "$bundle/libonnx-testdata.tar.xz" 2>/dev/null
data=/usr/share/datasets/fashion-mnist
if [[ ! -d $data && -d "$bundle/fashion-mnist" ]]; then
  mkdir -p /usr/share/datasets 2>/dev/null && ln -s "$bundle/fashion-mnist" "$data" 2>/dev/null || data="$bundle/fashion-mnist"
fi
# The test programs read their reference files from the checkout they were built in.
built_in=$(cd "$root" && pwd)
[[ -d /work/main/tests || -e /work/main ]] || { mkdir -p /work && ln -s "$root" /work/main; }

# CUDA libraries: the machine's own (the toolkit's, or the ones PyTorch ships in its wheels).
cuda_dirs=$(find / \( -path /proc -o -path /sys \) -prune -o \( -name 'libcublas.so.13*' -o -name 'libcudnn.so.9*' \
  -o -name 'libcudart.so.13*' -o -name 'libnccl.so.2*' \) ! -type d -print 2>/dev/null | xargs -r -n1 dirname | sort -u | tr '\n' ':')
libs="$work/lib:${cuda_dirs}${LD_LIBRARY_PATH:-}"
# Programs run with the machine's loader when its glibc is new enough, else with the carried one.
run_prog() {
  if LD_LIBRARY_PATH="$libs" "$work/bin/test_device" --gtest_list_tests >/dev/null 2>&1; then
    LD_LIBRARY_PATH="$libs" "$@"
  else
    "$work/lib/ld-linux-x86-64.so.2" --library-path "$libs:/usr/lib/x86_64-linux-gnu:/lib/x86_64-linux-gnu" "$@"
  fi
}
export BRAID_NUM_THREADS=${BRAID_NUM_THREADS:-8} OMP_WAIT_POLICY=passive

{ nvidia-smi; nvcc --version; echo "bundle of $(cat "$bundle/commit" 2>/dev/null); checked from $built_in on $(date -u)"; } \
  >"$out/nvidia-smi.txt" 2>&1

step() {  # step NAME LOG [--direct] CMD...: runs one program (--direct: not through run_prog)
  local name=$1 log=$2 runner=run_prog
  shift 2
  if [[ $1 == --direct ]]; then runner=; shift; fi
  if $runner "$@" >"$log" 2>&1; then note "PASS $name"; else note "FAIL $name (see $(basename "$log"))"; fi
  grep -E '^\[  (PASSED|FAILED|SKIPPED) +\] [0-9]+ tests?|^\[  FAILED  \] [A-Za-z].*[^)]$' "$log" | sed "s/^/    /" >>"$summary"
}

step cuda_backend "$out/cuda_backend.txt" "$work/bin/test_cuda_backend"
# The families CI runs on the shadow device (Note [Tests on the shadow device] in tests/meson.build).
# BRAID_CHECK_SUITES="tensor conv" reruns only those (and "differential" the differential test).
suites=${BRAID_CHECK_SUITES:-tensor ops_golden gradcheck autograd loss optim conv layers sequence_layers checkpoint \
  device amp onnx_module onnx_conformance differential}
for t in $suites; do
  [[ $t != differential && -x "$work/bin/test_$t" ]] || continue
  BRAID_TEST_DEVICE=$dev step "suite $t on $dev" "$out/suite-$t.txt" "$work/bin/test_$t"
done
if [[ " $suites " == *" differential "* && -x "$work/bin/test_differential" ]]; then
  BRAID_DIFF_CASES="$work/bin/diff_cases.jsonl" BRAID_TEST_DEVICE=$dev \
    step "differential on $dev" "$out/suite-differential.txt" "$work/bin/test_differential"
fi
[[ -x "$work/bin/test_nccl" ]] && step "NCCL group, world of one" "$out/nccl.txt" "$work/bin/test_nccl"
# Two ranks on the one GPU: DDP, SyncBatchNorm and pipeline equivalence with device tensors.
# The launcher runs with the machine's loader and passes the library path on to the ranks.
mpirun=(--direct env LD_LIBRARY_PATH="$libs" "$work/bin/mpiexec.hydra" -launcher fork -n 2)
if [[ -x "$work/bin/mpiexec.hydra" ]]; then
  for t in distributed pipeline amp_distributed; do
    [[ -x "$work/bin/test_$t" ]] || continue
    BRAID_TEST_DEVICE=$dev BRAID_NUM_THREADS=4 step "suite $t at 2 ranks on one $dev" "$out/suite-$t-np2.txt" \
      "${mpirun[@]}" "$work/bin/test_$t"
  done
else
  note "SKIP 2-rank checks: no mpiexec.hydra in the bundle"
fi

# The main job on the GPU: three epochs of the CNN, float32 and bfloat16 mixed precision.
epochs=${BRAID_CHECK_EPOCHS:-3}
step "braid-train --device $dev" "$out/main-job.txt" "$work/bin/braid-train" --device "$dev" --data "$data" \
  --epochs "$epochs" --out "$out/main-job"
step "braid-train --device $dev --amp bf16" "$out/main-job-bf16.txt" "$work/bin/braid-train" --device "$dev" \
  --amp bf16 --data "$data" --epochs "$epochs" --out "$out/main-job-bf16"
if [[ -x "$work/bin/mpiexec.hydra" ]]; then
  BRAID_NUM_THREADS=4 step "braid-train --device $dev, 2 ranks (DDP)" "$out/main-job-np2.txt" "${mpirun[@]}" \
    "$work/bin/braid-train" --device "$dev" --data "$data" --epochs 1 --out "$out/main-job-np2"
  BRAID_NUM_THREADS=4 step "braid-train --device $dev, 2 pipeline stages" "$out/main-job-pp2.txt" "${mpirun[@]}" \
    "$work/bin/braid-train" --device "$dev" --pipeline-stages 2 --data "$data" --epochs 1 --out "$out/main-job-pp2"
fi
grep -h "final test accuracy" "$out"/main-job*.txt | tee -a "$summary"

# Benchmarks against PyTorch on the same GPU, in one run (benchmarks/device_bench.py). Python runs
# with the machine's own libraries; only braid's program gets the carried ones, through a wrapper.
wrapper="$work/bin/braid-device-bench.sh"
{ echo '#!/usr/bin/env bash'; declare -f run_prog; echo "work='$work' libs='$libs'"; echo 'run_prog "$work/bin/braid-device-bench" "$@"'; } >"$wrapper"
chmod +x "$wrapper"
if [[ $dev == cuda* ]] && python3 -c "import torch; assert torch.cuda.is_available()" 2>/dev/null; then
  if python3 benchmarks/device_bench.py --exe "$wrapper" --device cuda >"$out/device_bench.md" 2>&1; then
    note "PASS device benchmarks (device_bench.md)"
  else
    note "FAIL device benchmarks (see device_bench.md)"
  fi
else
  note "SKIP device benchmarks: no GPU, or PyTorch with CUDA is not importable here"
fi
rm -rf "$work"
grep -q '^FAIL' "$summary" && exit 1
exit 0
