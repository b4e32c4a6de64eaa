#!/usr/bin/env bash
# A tp=2 GPT-2 training step of this tree beside the same step of an older revision, measured in
# alternating runs on this machine (issue 25's head-sharded attention line: "at least 1.3x faster
# than today's at seq_len 1024, and no slower at the demo's size").
#
#   bench/tp2_side_by_side.sh [--rev 361c411^] [--rounds 3] [--steps 10]
#
# The old revision is checked out into a git worktree under build/side-by-side/ and its `tessel`
# built there (a few minutes the first time); this tree's build/release/tessel must exist. Each
# round runs both binaries on configs/gpt2-tiny.yaml with parallel.tp=2, at seq_len 1024 (batch
# 8) and at the demo's 128 (batch 16), and prints the median step_time_s of the steps after the
# first two. The default revision is the last one before GPT-2 attention was sharded by heads
# (361c411): its tp=2 step gathers the packed QKV projection and attends over every head.
set -euo pipefail
cd "$(dirname "$0")/.."
rev="361c411^" rounds=3 steps=10
while [ $# -gt 0 ]; do
  case "$1" in
    --rev) rev="$2"; shift 2 ;;
    --rounds) rounds="$2"; shift 2 ;;
    --steps) steps="$2"; shift 2 ;;
    -h|--help) sed -n '2,13p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "error: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done
new=build/release/tessel
[ -x "$new" ] || { echo "error: $new not found; build first (./run.sh build)" >&2; exit 1; }
sha=$(git rev-parse --short "$rev")
old_tree=build/side-by-side/$sha
if [ ! -x "$old_tree/build/release/tessel" ]; then
  echo "building tessel at $rev ($sha) in $old_tree ..." >&2
  [ -d "$old_tree" ] || git worktree add --detach "$old_tree" "$sha" >&2
  (cd "$old_tree" && cmake --preset release > /dev/null && cmake --build --preset release --target tessel >&2)
fi
old=$old_tree/build/release/tessel
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

median_step() {  # metrics file -> median step_time_s after the first two steps
  python3 -c "
import json, statistics, sys
t = [json.loads(l)['step_time_s'] for l in open(sys.argv[1]) if 'step_time_s' in l][2:]
print('%.4f' % statistics.median(t))" "$1"
}

# Both binaries on one OpenBLAS kernel set: the one this tree's tessel runs (an older tessel may
# not correct OpenBLAS's fallback on a CPU newer than the library; bench/same_blas.py).
if [ -z "${OPENBLAS_CORETYPE:-}" ]; then
  kernels=$("$new" --version | sed -n 's/.*, \([A-Za-z0-9]*\) kernels.*/\1/p')
  [ -z "$kernels" ] || export OPENBLAS_CORETYPE=$kernels
fi
echo "tp=2 GPT-2 (configs/gpt2-tiny.yaml), median step seconds; old = $rev ($sha), new = this tree"
echo "BLAS (both): $("$new" --version | sed 's/^[^(]*(//; s/)$//')"
printf '%8s %6s %6s %10s %10s %7s\n' seq_len batch round old new old/new
for size in "1024 8" "128 16"; do
  set -- $size
  for round in $(seq "$rounds"); do
    declare -A t=()
    for which in old new; do
      bin=$new; [ $which = old ] && bin=$old
      m=$out/$which.jsonl
      rm -f "$m"
      "$bin" train configs/gpt2-tiny.yaml --set parallel.tp=2 --set model.n_positions="$1" --set train.seq_len="$1" \
        --set train.global_batch="$2" --set train.micro_batch="$2" --set train.steps="$steps" --set train.warmup=0 \
        --set train.save_every=0 --metrics "$m" > "$out/$which.log" 2>&1 ||
        { echo "error: the $which run failed:" >&2; tail -5 "$out/$which.log" >&2; exit 1; }
      t[$which]=$(median_step "$m")
    done
    printf '%8s %6s %6s %10s %10s %6.2fx\n' "$1" "$2" "$round" "${t[old]}" "${t[new]}" \
      "$(python3 -c "print(${t[old]} / ${t[new]})")"
  done
done
