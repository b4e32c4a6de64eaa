#!/bin/bash
# `tessel train` end to end as a user meets it: what it refuses exits 2 with a message that says
# what to do instead, before any step runs.
#   tests/cli/train_cli.sh TESSEL_BINARY SOURCE_DIR
set -euo pipefail
tessel=$1
config=$2/configs/gpt2-tiny.yaml
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# expect_refusal WANT ARGS...: exit status 2 and WANT in the message.
expect_refusal() {
  local want=$1 out rc
  shift
  set +e
  out=$("$tessel" train "$config" --set train.steps=1 "$@" 2>&1)
  rc=$?
  set -e
  [ "$rc" = 2 ] && grep -qF -- "$want" <<< "$out" || { echo "train $*: rc $rc, wanted '$want' in: $out"; exit 1; }
}

expect_refusal "needs 1 rank; give the layout (e.g. --set parallel.dp=2) or let --plan auto choose" --nproc 2
expect_refusal "error: --nproc: must be a positive whole number, got '0'" --nproc 0
expect_refusal "config parallel.tp must be at least 1, got 0" --set parallel.tp=0
expect_refusal "checkpoint path '$tmp/none' does not exist" --set parallel.dp=2 --resume "$tmp/none"
expect_refusal "checkpoint folder '$config/ck' cannot be created" --save "$config/ck"
expect_refusal "config model.init_from names '$tmp/none.safetensors', which cannot be read (no such file)" \
  --set parallel.dp=2 --set model.init_from="$tmp/none.safetensors"
expect_refusal "config data.path names '$tmp', which cannot be read (a folder, not a file)" --set data.path="$tmp"
expect_refusal "no complete checkpoint (step-NNNNNN folder) under '$tmp'" --resume "$tmp"
[ ! -e "$tmp/ck" ] || { echo "a refused run created its checkpoint folder"; exit 1; }
expect_refusal "error: --device: tpu not in {cpu,cuda,guarded}" --device tpu
# Expert parallel's world in both readings (issue 52, item 7): tessel's (ep beside dp) and
# Megatron-Core's (ep divides the data-parallel size), with the layout the second means.
set +e
out=$("$tessel" train "$2/configs/mixtral-tiny.yaml" --set train.steps=1 --set parallel.dp=2 --set parallel.ep=2 \
  --nproc 2 2>&1)
rc=$?
set -e
for want in "--nproc 2 but the config's parallel section (dp 2, ep 2, tp 1, pp 1) needs 4 ranks" \
  "read as Megatron-Core's, where ep divides the data-parallel size, it is 2 ranks: tessel's parallel.dp=1 parallel.ep=2"; do
  [ "$rc" = 2 ] && grep -qF -- "$want" <<< "$out" || { echo "ep world: rc $rc, wanted '$want' in: $out"; exit 1; }
done

# --device guarded trains on the guarded test device with the CPU's losses (docs/devices.md).
for dev in cpu guarded; do
  "$tessel" train "$config" --device "$dev" --set train.steps=2 --set model.n_layer=1 --set log.every=1 \
    --metrics "$tmp/$dev.jsonl" > "$tmp/$dev.log" 2>&1 || { echo "--device $dev failed:"; cat "$tmp/$dev.log"; exit 1; }
done
cmp -s <(grep -o '"loss":[^,]*' "$tmp/cpu.jsonl") <(grep -o '"loss":[^,]*' "$tmp/guarded.jsonl") ||
  { echo "--device guarded losses differ from the CPU's:"; cat "$tmp/cpu.jsonl" "$tmp/guarded.jsonl"; exit 1; }

# The usual thread variables are taken (issue 52: both were ignored, a rank took the cores).
for var in TESSEL_NUM_THREADS OMP_NUM_THREADS; do
  env -u TESSEL_NUM_THREADS -u OMP_NUM_THREADS -u OPENBLAS_NUM_THREADS "$var=1" \
    "$tessel" train "$config" --set train.steps=1 --set model.n_layer=1 > "$tmp/threads.log" 2>&1 ||
    { echo "$var=1 train failed:"; cat "$tmp/threads.log"; exit 1; }
  grep -qF "1 intra-op thread per rank ($var)" "$tmp/threads.log" ||
    { echo "$var=1 was not taken:"; cat "$tmp/threads.log"; exit 1; }
done

# The README's main command (./run.sh demo) parses and steps: its layout flags, taken from
# run.sh itself, for two steps.
demo_flags=$(sed -n '/tessel train configs\/gpt2-tiny.yaml/,/"\$@"/p' "$2/run.sh" | grep -o -- '--set parallel[^ ]*' | tr '\n' ' ')
[ -n "$demo_flags" ] || { echo "could not find the demo's flags in run.sh"; exit 1; }
# shellcheck disable=SC2086  # the flags are words on purpose
"$tessel" train "$config" $demo_flags --set train.steps=2 --set train.warmup=0 --set log.every=1 > "$tmp/demo.log" 2>&1 ||
  { echo "the demo's command failed:"; cat "$tmp/demo.log"; exit 1; }
grep -q "step 2/2" "$tmp/demo.log" || { echo "the demo did not reach step 2:"; cat "$tmp/demo.log"; exit 1; }
echo "train cli: ok"
