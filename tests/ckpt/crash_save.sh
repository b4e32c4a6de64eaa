#!/bin/bash
# A save killed at any moment never costs more than that save: 50 runs of 2 thread ranks are
# killed (SIGKILL, as kill -9) part-way through writing a checkpoint — at a random byte of a
# random rank's files, through TESSEL_FAULT, plus 10 real `kill -9`s at random times — and after
# each: `tessel ckpt inspect` reports the unfinished save as incomplete, and `--resume` picks the
# newest complete step and finishes the run with the losses of a run that was never killed.
#   tests/ckpt/crash_save.sh TESSEL_BINARY SOURCE_DIR [RUNS]
set -euo pipefail
tessel=$1
config=$2/configs/gpt2-tiny.yaml
runs=${3:-50}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
RANDOM=7  # reproducible choices
small=(--set model.n_layer=2 --set model.n_embd=64 --set model.n_head=4 --set train.global_batch=4 --set train.micro_batch=4
       --set train.seq_len=32 --set train.steps=4 --set train.save_every=1 --set train.warmup=0
       --set parallel.dp=2 --set parallel.sharding_stage=1 --set log.every=1)

"$tessel" train "$config" "${small[@]}" --metrics "$tmp/whole.jsonl" > "$tmp/whole.log" 2>&1 ||
  { echo "the uninterrupted run failed:"; cat "$tmp/whole.log"; exit 1; }

# check_resume RUN: inspect, then resume and compare the losses of the steps it ran.
check_resume() {
  local run=$1 newest inspect rc
  set +e
  inspect=$("$tessel" ckpt inspect "$tmp/ck" 2>&1)
  rc=$?
  set -e
  if ls -d "$tmp/ck"/.step-*.tmp > /dev/null 2>&1; then
    grep -q "INCOMPLETE: an unfinished save" <<< "$inspect" ||
      { echo "run $run: inspect did not report the unfinished save:"; echo "$inspect"; exit 1; }
    mid_save=$((mid_save + 1))
  fi
  newest=$(grep " complete" <<< "$inspect" | grep -v INCOMPLETE | tail -1 | cut -d' ' -f1 || true)
  if [ -z "$newest" ]; then
    [ "$rc" = 2 ] || { echo "run $run: no complete step but inspect exited $rc"; exit 1; }
    return  # killed before the first save finished: nothing to resume from
  fi
  "$tessel" train "$config" "${small[@]}" --resume "$tmp/ck" --save "$tmp/ck" --metrics "$tmp/resumed.jsonl" \
    > "$tmp/resume.log" 2>&1 || { echo "run $run: resume failed:"; cat "$tmp/resume.log"; exit 1; }
  grep -q "resumed from $tmp/ck/$newest " "$tmp/resume.log" ||
    { echo "run $run: did not resume from the newest complete step $newest:"; cat "$tmp/resume.log"; exit 1; }
  python3 - "$tmp/whole.jsonl" "$tmp/resumed.jsonl" "$run" <<'PY'
import json, sys
whole = {r["step"]: r["loss"] for r in map(json.loads, open(sys.argv[1]))}
for r in map(json.loads, open(sys.argv[2])):
    if abs(r["loss"] - whole[r["step"]]) > 1e-5 * abs(whole[r["step"]]):
        sys.exit(f"run {sys.argv[3]}: step {r['step']} loss {r['loss']} vs {whole[r['step']]} uninterrupted")
PY
}

mid_save=0
for run in $(seq 1 "$runs"); do
  rm -rf "$tmp/ck"
  step=$((1 + RANDOM % 4)) rank=$((RANDOM % 2)) bytes=$(( (RANDOM * 32768 + RANDOM) % 1200000 ))
  set +e
  { TESSEL_FAULT="rank=$rank,step=$step,action=crash,during=save,after_bytes=$bytes" \
      "$tessel" train "$config" "${small[@]}" --save "$tmp/ck" > "$tmp/run.log" 2>&1; } 2> /dev/null
  rc=$?
  set -e
  [ "$rc" = 137 ] || [ "$rc" = 0 ] || { echo "run $run: exit $rc"; cat "$tmp/run.log"; exit 1; }
  check_resume "$run"
done
injected=$mid_save

# Real kill -9 from outside, at random times.
for run in $(seq 1 10); do
  rm -rf "$tmp/ck"
  "$tessel" train "$config" "${small[@]}" --save "$tmp/ck" > "$tmp/run.log" 2>&1 &
  pid=$!
  sleep "0.$((RANDOM % 10))$((RANDOM % 10))"
  kill -9 "$pid" 2> /dev/null || true
  wait "$pid" 2> /dev/null || true
  check_resume "external $run"
done
# What a killed save leaves is removed by the next run that opens the folder, before its first
# step, saying so — a --resume of one step folder without --save too (issue 52: it stayed for
# good) — except a save a live process of this host is still writing.
rm -rf "$tmp/ck"
set +e
{ TESSEL_FAULT="rank=0,step=2,action=crash,during=save,after_bytes=1000" \
    "$tessel" train "$config" "${small[@]}" --save "$tmp/ck" > "$tmp/run.log" 2>&1; } 2> /dev/null
set -e
ls -d "$tmp/ck/.step-000002.tmp" > /dev/null || { echo "the killed save left no temporary folder"; exit 1; }
mkdir "$tmp/ck/.step-000009.tmp" && echo "$(hostname) $$" > "$tmp/ck/.step-000009.tmp/.owner"
"$tessel" train "$config" "${small[@]}" --resume "$tmp/ck/step-000001" > "$tmp/leftover.log" 2>&1 ||
  { echo "the resume from a step folder failed:"; cat "$tmp/leftover.log"; exit 1; }
[ ! -e "$tmp/ck/.step-000002.tmp" ] || { echo "a resume from a step folder left the killed save's folder"; exit 1; }
grep -q "removed $tmp/ck/.step-000002.tmp (.* GB), left by a save that did not finish" "$tmp/leftover.log" ||
  { echo "the removal was not announced:"; cat "$tmp/leftover.log"; exit 1; }
[ -d "$tmp/ck/.step-000009.tmp" ] && grep -q "left the checkpoint folder $tmp/ck/.step-000009.tmp alone" "$tmp/leftover.log" ||
  { echo "a live process's save folder was not left alone:"; cat "$tmp/leftover.log"; exit 1; }
echo "$(hostname) 999999999" > "$tmp/ck/.step-000009.tmp/.owner"  # no such process: left over
"$tessel" train "$config" "${small[@]}" --set train.steps=1 --save "$tmp/ck2" --resume "$tmp/ck" > "$tmp/leftover.log" 2>&1 ||
  { echo "the resume failed:"; cat "$tmp/leftover.log"; exit 1; }
[ ! -e "$tmp/ck/.step-000009.tmp" ] || { echo "a dead process's save folder was left"; exit 1; }

echo "crash during save: ok ($injected of $runs injected kills and $((mid_save - injected)) of 10 external ones landed mid-save)"
