#!/usr/bin/env bash
# The entry point for newcomers and CI. Every mode first installs what it needs from
# Debian's archive (scripts/install-deps.sh, idempotent) and builds with CMake + Ninja.
#
#   ./run.sh demo    the main job: build, then train the demo GPT-2 on 4 local ranks
#                    (data x pipeline parallel, ZeRO-1; a few minutes) and write its timeline
#   ./run.sh test    the whole test suite: release build + ctest, then the sanitizer build
#                    (AddressSanitizer + UBSan) of the core, ops and autograd tests, then
#                    each fuzz target of fuzz/ for a few seconds (scripts/fuzz.sh: longer runs)
#   ./run.sh bench   benchmarks (installs PyTorch 1.13 too, for side-by-side figures)
#   ./run.sh build   just build (release)
set -euo pipefail
cd "$(dirname "$0")"

mode=${1:-}
shift || true
jobs=${TESSEL_JOBS:-$(nproc)}

usage() { sed -n '2,11p' "$0" | sed 's/^# \{0,1\}//'; }

build() {  # build PRESET [TARGET...]
  local preset=$1
  shift
  if [ ! -f "build/$preset/build.ninja" ]; then
    cmake --preset "$preset" >/dev/null
  fi
  echo "== building ($preset, $jobs jobs)"
  if [ $# -gt 0 ]; then
    cmake --build --preset "$preset" -j "$jobs" --target "$@"
  else
    cmake --build --preset "$preset" -j "$jobs"
  fi
}

case "$mode" in
  demo)
    scripts/install-deps.sh
    build release
    echo "== demo: GPT-2 (4 layers, 3.3M parameters) trained on the shipped King James corpus"
    echo "   on 4 ranks: 2 data-parallel x 2 pipeline stages (1F1B, 4 micro-batches), ZeRO stage 1"
    mkdir -p runs/demo
    build/release/tessel train configs/gpt2-tiny.yaml --set parallel.dp=2 --set parallel.pp=2 \
      --set parallel.micro_batches=4 --set parallel.sharding_stage=1 \
      --metrics runs/demo/metrics.jsonl --trace runs/demo/trace.json "$@"
    echo "== timeline: open runs/demo/trace.json in https://ui.perfetto.dev (or chrome://tracing)"
    ;;
  test)
    scripts/install-deps.sh --test
    build release
    echo "== tests (release)"
    # The test command installs what its tests need, so none may skip for want of it.
    TESSEL_TEST_REQUIRE_TORCH=1 ctest --preset release -j "$jobs" "$@"
    build asan core_test ops_test autograd_test comm_test comm_launched
    echo "== tests (AddressSanitizer + UndefinedBehaviorSanitizer: core, ops, autograd, the Gloo and thread backends)"
    ctest --preset asan -j "$jobs" -L 'core|ops|autograd' "$@"
    # comm_test's cases (the ones that need no `tessel` binary): raw shared memory, futexes and
    # sockets are where a sanitizer earns its time.
    ctest --preset asan -j "$jobs" -R '^(GlooSharedMemory|GlooThreads|ThreadBackend|Hierarchical|Heartbeat|DefaultTimeout|WorldSizes/|Topologies/)' "$@"
    echo "== fuzz targets (libFuzzer, clang; ${TESSEL_FUZZ_SECONDS:-3} s each over their seeds)"
    scripts/fuzz.sh "${TESSEL_FUZZ_SECONDS:-3}"
    ;;
  bench)
    scripts/install-deps.sh --bench
    build release
    build/release/bench/ops_bench "$@"
    build/release/bench/dist_bench
    build/release/bench/sync_bench
    build/release/bench/pipeline_bench
    bench/ddp_vs_pytorch.py
    build/release/tessel bench comm --np 2
    bench/train_vs_pytorch.py
    build/release/tessel plan --published
    bench/plan_fidelity.py
    ;;
  build)
    scripts/install-deps.sh
    build release
    ;;
  -h|--help|help)
    usage
    ;;
  *)
    usage >&2
    echo "error: unknown mode '${mode}'" >&2
    exit 2
    ;;
esac
