#!/usr/bin/env bash
# The GPU checks of issue 51, as one script for a machine with a GPU (the `device` tool's
# H200, or any CUDA machine): builds what it needs (release, CUDA for the local GPU's
# architecture), runs the tests labelled gpu, and writes every figure under $OUT (default
# runs/gpu_check). Meant to finish in under 8 minutes on 16 cores.
#
#   OUT=/tmp/out scripts/gpu_check.sh        (TESSEL_JOBS sets the build's parallelism)
#
# What it does not measure yet, because the runtime does not do it yet: training GPT-2 on the
# GPU (f32 and bf16 against the CPU run), two ranks on one GPU, and the speed benchmark
# against PyTorch. Each appears here when the code it needs lands.
set -euo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-runs/gpu_check}
mkdir -p "$out"
jobs=${TESSEL_JOBS:-$(nproc)}
start=$(date +%s)
log() { echo "[gpu_check $(($(date +%s) - start)) s] $*" | tee -a "$out/summary.txt"; }

{ nvidia-smi || true; } > "$out/nvidia-smi.txt" 2>&1
arch=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -1 | tr -d '.' || true)
arch=${arch:-90}
log "GPU compute capability sm_$arch; building with $jobs jobs"

# Only what the checks need; the build folder is kept between runs on the same machine.
cmake -S . -B build/gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DTESSEL_CUDA_ARCHITECTURES="$arch" \
  -DTESSEL_BUILD_BENCH=OFF > "$out/configure.txt" 2>&1 || { cat "$out/configure.txt"; exit 1; }
grep -q "CUDA backend ON" "$out/configure.txt" || { log "error: CMake did not enable the CUDA backend"; exit 1; }
cmake --build build/gpu -j "$jobs" --target tessel cuda_test > "$out/build.txt" 2>&1 || { tail -40 "$out/build.txt"; exit 1; }
log "built"

build/gpu/tessel --version | tee "$out/version.txt"

# Every gpu test; the op cases print their worst element when they miss the bound.
set +e
build/gpu/tests/cuda/cuda_test --gtest_output=json:"$out/cuda_test.json" > "$out/cuda_test.txt" 2>&1
rc=$?
set -e
grep -E "^\[  (PASSED|FAILED|SKIPPED) \]|tests ran|CUDA kernels:|with:|without:|^cuda:0" "$out/cuda_test.txt" \
  | sort | uniq -c | sort -rn | head -40 | tee -a "$out/summary.txt"
grep -B2 -A6 "Failure" "$out/cuda_test.txt" | head -200 > "$out/failures.txt" || true
log "cuda_test exit $rc (failures, if any: $out/failures.txt)"
exit $rc
