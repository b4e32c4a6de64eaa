#!/usr/bin/env bash
# Runs the libFuzzer targets of fuzz/ (the readers of untrusted input) for SECONDS each
# (default 60), over the committed seeds of fuzz/corpus/TARGET plus a working corpus that
# grows between runs (build/fuzz/corpus/TARGET). Builds the fuzz preset (clang) first. A
# crash, sanitizer report, hang (10 s on one input) or leak is saved under
# build/fuzz/crashes/ and fails the script; reproduce it with `build/fuzz/fuzz/fuzz_TARGET FILE`.
#
#   scripts/fuzz.sh [SECONDS] [TARGET...]     targets: json safetensors checkpoint config cluster store
#   TESSEL_FUZZ_PARALLEL=2 scripts/fuzz.sh    two targets at a time
#   TESSEL_FUZZ_RUNS=10000000 scripts/fuzz.sh 0 json   stop each target after that many
#                                             executions (SECONDS 0: no time limit)
set -euo pipefail
cd "$(dirname "$0")/.."

seconds=${1:-60}
shift || true
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(json safetensors checkpoint config cluster store)
parallel=${TESSEL_FUZZ_PARALLEL:-1}
case "$seconds" in ''|*[!0-9]*) echo "error: SECONDS must be a whole number, got '$seconds'" >&2; exit 2 ;; esac
case "${TESSEL_FUZZ_RUNS:-1}" in ''|*[!0-9]*) echo "error: TESSEL_FUZZ_RUNS must be a whole number, got '$TESSEL_FUZZ_RUNS'" >&2; exit 2 ;; esac
if [ "$seconds" -eq 0 ] && [ -z "${TESSEL_FUZZ_RUNS:-}" ]; then
  echo "error: SECONDS 0 (no time limit) needs TESSEL_FUZZ_RUNS" >&2
  exit 2
fi

if [ ! -f build/fuzz/build.ninja ]; then
  cmake --preset fuzz >/dev/null
fi
cmake --build --preset fuzz -j "${TESSEL_JOBS:-$(nproc)}"

mkdir -p build/fuzz/crashes build/fuzz/logs
run_one() {  # run_one TARGET: fuzz it, then print one summary line; status 1 on a finding
  local t=$1 bin=build/fuzz/fuzz/fuzz_$1 work=build/fuzz/corpus/$1
  [ -x "$bin" ] || { echo "error: unknown fuzz target '$t' (no $bin)" >&2; return 2; }
  mkdir -p "$work"
  local rc=0 limits=(-max_total_time="$seconds")
  [ -z "${TESSEL_FUZZ_RUNS:-}" ] || limits=(-runs="$TESSEL_FUZZ_RUNS")
  [ -z "${TESSEL_FUZZ_RUNS:-}" ] || [ "$seconds" -eq 0 ] || limits+=(-max_total_time="$seconds")
  ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1} UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1} \
    "$bin" "${limits[@]}" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
    -artifact_prefix="build/fuzz/crashes/$t-" "$work" "fuzz/corpus/$t" >"build/fuzz/logs/$t.log" 2>&1 || rc=$?
  local execs
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "build/fuzz/logs/$t.log" | tail -1)
  if [ "$rc" -ne 0 ]; then
    echo "fuzz $t: FOUND A PROBLEM after ${execs:-?} executions (exit $rc); log build/fuzz/logs/$t.log:"
    grep -E "^==[0-9]+==|SUMMARY|runtime error|Test unit written|deadly signal|ALARM|out-of-memory" \
      "build/fuzz/logs/$t.log" | head -20
    return 1
  fi
  local took
  took=$(sed -n 's/^Done [0-9]* runs in \([0-9]*\) second.*/\1/p' "build/fuzz/logs/$t.log" | tail -1)
  echo "fuzz $t: ${execs:-?} executions in ${took:-$seconds} s, corpus $(find "$work" -type f | wc -l) + $(find "fuzz/corpus/$t" -type f | wc -l) seeds, no crash"
}

failed=0
pids=()
for t in "${targets[@]}"; do
  if [ "$parallel" -gt 1 ]; then
    run_one "$t" &
    pids+=($!)
    if [ ${#pids[@]} -ge "$parallel" ]; then
      wait "${pids[0]}" || failed=1
      pids=("${pids[@]:1}")
    fi
  else
    run_one "$t" || failed=1
  fi
done
for p in "${pids[@]}"; do wait "$p" || failed=1; done
exit "$failed"
