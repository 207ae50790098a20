#!/usr/bin/env bash
# The GPU checks, run on a lent GPU machine from the repository root with build/bundle carried
# (scripts/gpu_bundle.sh makes it here). Writes summary.txt and logs.tar.gz (every log below) under
# $OUT (default: gpu-results/):
#   nvidia-smi.txt       the device
#   cuda_*.txt           the parity suites (every primitive, fused kernel and dtype against the CPU backend)
#   suite-<name>.txt     the unit tests with every tensor on cuda:0 (BRAID_TEST_DEVICE=cuda)
#   nccl.txt             the NCCL group at a world of one, and its watchdog (tests/test_nccl.cpp)
#   suite-*-np2.txt      the distributed suites at 2 ranks sharing the GPU (CUDA tensors staged
#                        through MPI, since NCCL refuses two ranks on one GPU)
#   main-job.txt         braid-train --device cuda on Fashion-MNIST, and --amp bf16; -np2: data-
#                        parallel and pipeline runs at 2 ranks on the one GPU
#   summary.txt          one line per step: passed / failed
#   device_bench.md      GEMM, convolution, ResNet-50 and GPT-2-small steps against PyTorch
#   profile-<suite>.md   a kernel profile (BRAID_CHECK_PROFILE=<suite>, or BRAID_CHECK_MODE=speed)
#
# BRAID_CHECK_MODE=speed runs only the parity suites, the benchmarks and the ResNet-50 profile (fits in
# 8 minutes of device time).
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
# glibc's own libraries go apart: the machine's loader must not pick up the carried libc through the
# library path (a newer loader with an older libc crashes); only the carried loader uses them.
mkdir -p "$work/glibc"
for l in ld-linux-x86-64.so.2 libc.so.6 libm.so.6 libdl.so.2 libpthread.so.0 librt.so.1 libresolv.so.2 libutil.so.1; do
  [[ -f "$work/lib/$l" ]] && mv "$work/lib/$l" "$work/glibc/"
done
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
# Programs run with the machine's loader when its glibc is new enough, else with the carried one;
# $work/run holds the choice, so that `timeout` can run it.
if LD_LIBRARY_PATH="$libs" "$work/bin/braid-train" --help >/dev/null 2>&1; then
  printf '#!/usr/bin/env bash\nLD_LIBRARY_PATH=%q exec "$@"\n' "$libs" >"$work/run"
else
  printf '#!/usr/bin/env bash\nexec %q --library-path %q "$@"\n' "$work/glibc/ld-linux-x86-64.so.2" \
    "$work/glibc:$libs:/usr/lib/x86_64-linux-gnu:/lib/x86_64-linux-gnu" >"$work/run"
  note "the machine's glibc is older than the bundle's: programs run with the carried loader, and the 2-rank"
  note "checks may fail (MPICH's launcher starts its ranks with the machine's loader)"
fi
chmod +x "$work/run"
export BRAID_NUM_THREADS=${BRAID_NUM_THREADS:-8} OMP_WAIT_POLICY=passive

# The device tool brings back only a few files: the logs go to $logs and, after every step, into
# $out/logs.tar.gz; summary.txt stays beside it.
logs="$work/logs"
mkdir -p "$logs"
{ nvidia-smi; nvcc --version; echo "bundle of $(cat "$bundle/commit" 2>/dev/null); checked from $built_in on $(date -u)"; } \
  >"$logs/nvidia-smi.txt" 2>&1

# Each step runs under a time limit (BRAID_CHECK_STEP_S, default 150 s: a hang fails its step, not the
# lease), and no step starts once BRAID_CHECK_BUDGET_S (default 480 s) have passed since the start,
# so the logs come back inside the device tool's limit. The steps run most-needed first.
started=$SECONDS
budget=${BRAID_CHECK_BUDGET_S:-480}
step() {  # step NAME LOG [--direct] CMD...: runs one program (--direct: not through $work/run)
  local name=$1 log=$logs/$2 runner=$work/run rc t0=$SECONDS
  shift 2
  if [[ $1 == --direct ]]; then runner=; shift; fi
  if ((SECONDS - started > budget)); then note "SKIP $name: past the check's budget of ${budget} s"; return; fi
  local prog=$1
  if [[ $prog == "$work"/* && ! -x $prog ]]; then note "SKIP $name: $(basename "$prog") is not in the bundle"; return; fi
  timeout -k 10 "${BRAID_CHECK_STEP_S:-150}" $runner "$@" >"$log" 2>&1
  rc=$?
  if ((rc == 0)); then note "PASS $name ($((SECONDS - t0)) s)"
  elif ((rc == 124 || rc == 137)); then note "FAIL $name: timed out after $((SECONDS - t0)) s (see $(basename "$log"))"
  else note "FAIL $name: exit $rc (see $(basename "$log"))"; fi
  grep -E '^\[  (PASSED|FAILED|SKIPPED) +\] [0-9]+ tests?|^\[  FAILED  \] [A-Za-z].*[^)]$' "$log" | sed "s/^/    /" >>"$summary"
  tar -C "$work" -czf "$out/logs.tar.gz" logs
}

# BRAID_CHECK_PROFILE=resnet50|gpt2|conv|gemm: instead of the checks, the kernels of one step of that
# device benchmark under Nsight Compute (each kernel's duration; ncu serialises them, so the sum is
# device time without overlap), summed by kernel (benchmarks/ncu_summary.py) into profile.md.
profile() {  # profile SUITE
  local ncu
  ncu=$(command -v ncu || find /opt /usr/local -name ncu -type f -perm -u+x 2>/dev/null | head -1)
  [[ -n $ncu ]] || { note "FAIL profile: no ncu on this machine"; return; }
  step "ncu on braid-device-bench --suite $1" "ncu-$1.csv" --direct "$ncu" --csv \
    --metrics gpu__time_duration.sum --clock-control none --launch-count "${BRAID_CHECK_PROFILE_KERNELS:-2500}" \
    --target-processes all "$work/run" "$work/bin/braid-device-bench" --device cuda --suite "$1" --repeats 1
  python3 benchmarks/ncu_summary.py "$logs/ncu-$1.csv" --steps "${BRAID_CHECK_PROFILE_STEPS:-1}" >"$out/profile-$1.md" 2>&1
  grep -h 'ms\b' "$logs/ncu-$1.csv" | grep -v '^"' | tail -5 | tee -a "$summary"
  head -30 "$out/profile-$1.md"
  tar -C "$work" -czf "$out/logs.tar.gz" logs
}

# Benchmarks against PyTorch on the same GPU, in one run (benchmarks/device_bench.py). Python runs
# with the machine's own libraries; only braid's program gets the carried ones, through a wrapper.
device_benchmarks() {
  local wrapper="$work/bin/braid-device-bench.sh"
  printf '#!/usr/bin/env bash\nexec %q %q "$@"\n' "$work/run" "$work/bin/braid-device-bench" >"$wrapper"
  chmod +x "$wrapper"
  if [[ ! -x "$work/bin/braid-device-bench" ]]; then
    note "SKIP device benchmarks: braid-device-bench is not in the bundle"
  elif [[ $dev == cuda* ]] && python3 -c "import torch; assert torch.cuda.is_available()" 2>/dev/null; then
    PYTHONUNBUFFERED=1 step "device benchmarks (device_bench.md)" device_bench.md --direct python3 benchmarks/device_bench.py \
      --exe "$wrapper" --device cuda
    cp "$logs/device_bench.md" "$out/" 2>/dev/null
  else
    note "SKIP device benchmarks: no GPU, or PyTorch with CUDA is not importable here"
  fi
}

# The CUDA parity suites (tests/test_cuda_*.cpp: every primitive and fused kernel against the CPU).
parity_suites() {
  for t in cuda_backend cuda_half cuda_fused cuda_conv cuda_matmul cuda_attention; do
    step "$t" "$t.txt" "$work/bin/test_$t"
  done
}

finish() {
  tar -C "$work" -czf "$out/logs.tar.gz" logs
  rm -rf "$work"
  grep -q '^FAIL' "$summary" && exit 1
  exit 0
}

if [[ -n ${BRAID_CHECK_PROFILE:-} ]]; then
  profile "$BRAID_CHECK_PROFILE"
  finish
fi

# BRAID_CHECK_MODE=speed: what the GPU speed work needs in 8 minutes of device time: the parity
# suites of the kernels, the benchmarks against PyTorch in the same run, then the kernel profile of
# one ResNet-50 step (profile-resnet50.md) while the budget lasts.
if [[ ${BRAID_CHECK_MODE:-} == speed ]]; then
  parity_suites
  device_benchmarks
  profile resnet50
  finish
fi

# What only a GPU can show first: the NCCL group at a world of one (with its watchdog), the backend's
# parity with the CPU, and two ranks sharing the GPU (DDP, SyncBatchNorm and pipeline equivalence with
# device tensors, staged through MPI since NCCL refuses two ranks on one GPU).
[[ -x "$work/bin/test_nccl" ]] && step "NCCL group, world of one" nccl.txt "$work/bin/test_nccl"
parity_suites
# The launcher passes the library path on to its ranks.
mpirun=("$work/bin/mpiexec.hydra" -launcher fork -n 2)
[[ -x "$work/bin/mpiexec.hydra" ]] || note "SKIP 2-rank checks: no mpiexec.hydra in the bundle"
if [[ -x "$work/bin/mpiexec.hydra" ]]; then
  for t in distributed pipeline amp_distributed; do
    [[ -x "$work/bin/test_$t" ]] || continue
    BRAID_TEST_DEVICE=$dev BRAID_NUM_THREADS=4 step "suite $t at 2 ranks on one $dev" "suite-$t-np2.txt" \
      "${mpirun[@]}" "$work/bin/test_$t"
  done
fi

# The main job on the GPU: the CNN in float32 and in bfloat16 mixed precision, then data-parallel and
# pipelined at 2 ranks on the one GPU.
epochs=${BRAID_CHECK_EPOCHS:-2}
step "braid-train --device $dev" main-job.txt "$work/bin/braid-train" --device "$dev" --data "$data" \
  --epochs "$epochs" --out "$work/main-job"
step "braid-train --device $dev --amp bf16" main-job-bf16.txt "$work/bin/braid-train" --device "$dev" \
  --amp bf16 --data "$data" --epochs "$epochs" --out "$work/main-job-bf16"
if [[ -x "$work/bin/mpiexec.hydra" ]]; then
  BRAID_NUM_THREADS=4 step "braid-train --device $dev, 2 ranks (DDP)" main-job-np2.txt "${mpirun[@]}" \
    "$work/bin/braid-train" --device "$dev" --data "$data" --epochs 1 --out "$work/main-job-np2"
  BRAID_NUM_THREADS=4 step "braid-train --device $dev, 2 pipeline stages" main-job-pp2.txt "${mpirun[@]}" \
    "$work/bin/braid-train" --device "$dev" --pipeline-stages 2 --data "$data" --epochs 1 --out "$work/main-job-pp2"
fi
grep -h "final test accuracy" "$logs"/main-job*.txt | tee -a "$summary"

# The unit-test families CI runs on the shadow device (Note [Tests on the shadow device] in
# tests/meson.build), with every tensor on the GPU. BRAID_CHECK_SUITES="tensor conv" runs only those
# (and "differential" the differential test).
suites=${BRAID_CHECK_SUITES:-tensor ops_golden gradcheck autograd loss optim conv layers sequence_layers checkpoint \
  device amp onnx_module onnx_conformance differential}
for t in $suites; do
  [[ $t != differential && -x "$work/bin/test_$t" ]] || continue
  BRAID_TEST_DEVICE=$dev step "suite $t on $dev" "suite-$t.txt" "$work/bin/test_$t"
done
if [[ " $suites " == *" differential "* && -x "$work/bin/test_differential" ]]; then
  BRAID_DIFF_CASES="$work/bin/diff_cases.jsonl" BRAID_TEST_DEVICE=$dev \
    step "differential on $dev" suite-differential.txt "$work/bin/test_differential"
fi

device_benchmarks
finish
