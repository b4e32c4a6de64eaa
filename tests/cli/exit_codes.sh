#!/bin/bash
# One exit-status contract for every subcommand, end to end (docs/training.md, "Exit status"):
# 2 for bad input (flags, config, data, checkpoint, cluster), 1 for a run that failed after
# its input was accepted, 128+N for a run stopped by signal N. Each refusal is also checked to
# come quickly and to name the file or key.
#   tests/cli/exit_codes.sh TESSEL_BINARY SOURCE_DIR
set -euo pipefail
tessel=$1
src=$2
config=$src/configs/gpt2-tiny.yaml
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
failures=0

# expect RC WANT ARGS...: `tessel ARGS` exits RC within 20 s with WANT in its output.
expect() {
  local rc_want=$1 want=$2 out rc
  shift 2
  set +e
  out=$(timeout 20 "$tessel" "$@" 2>&1 < /dev/null)
  rc=$?
  set -e
  if [ "$rc" != "$rc_want" ] || ! grep -qF -- "$want" <<< "$out"; then
    echo "FAIL: tessel $*: rc $rc (wanted $rc_want), wanted '$want' in: ${out:0:600}"
    failures=$((failures + 1))
  fi
}
train1() { expect "$1" "$2" train "$config" --set train.steps=1 --set train.warmup=0 "${@:3}"; }

# ---- 2: bad input ----
# flags and configs
expect 2 "--nproc: must be a positive whole number" train "$config" --nproc 0
expect 2 "unknown config key 'train.learning_rate'" train "$config" --set train.learning_rate=1
expect 2 "config 'train.lr' must be a finite number, got '.inf'" train "$config" --set train.lr=.inf
expect 2 "cannot be read (no such file)" train "$config" --set data.path="$tmp/none.txt"

# files that are not regular files, named by key and refused at once (a named pipe once blocked
# forever); a name over the system's limit
mkfifo "$tmp/pipe"
long=$tmp/$(printf 'x%.0s' $(seq 5000))
expect 2 "config data.path names '$tmp/pipe', which cannot be read (a named pipe, not a regular file)" \
  train "$config" --set data.path="$tmp/pipe"
expect 2 "model.hf_config '$tmp/pipe': a named pipe, not a regular file" train "$config" --set model.hf_config="$tmp/pipe"
expect 2 "model.hf_config '$tmp': a folder, not a file" train "$config" --set model.hf_config="$tmp"
expect 2 "which cannot be read (the name is longer than this system allows)" train "$config" --set data.path="$long"
expect 2 "config '$tmp/pipe': a named pipe, not a regular file" train "$tmp/pipe"
expect 2 "--cluster '$tmp/pipe': a named pipe, not a regular file" plan --model "$config" --cluster "$tmp/pipe"
# Aliases nested 9 levels of 10 under an unknown key: under 1 KB, 10^9 nodes expanded; refused
# at once (it took over a minute).
{ sed '/^bomb:/,$d' "$config" | grep -v '^ *#' | sed "s|path: ../data|path: $src/data|"
  echo "bomb:"; echo "  a0: &a0 [x, x, x, x, x, x, x, x, x, x]"
  for i in 1 2 3 4 5 6 7 8; do echo "  a$i: &a$i [$(printf "*a$((i - 1)),%.0s" 1 2 3 4 5 6 7 8 9)*a$((i - 1))]"; done
} > "$tmp/bomb.yaml"
expect 2 "more than 100000 nodes with its aliases (*name) expanded" train "$tmp/bomb.yaml"
printf 'model: {arch: gpt2}\ndata: {path: x}\nlog: {[a]: 1}\n' > "$tmp/key.yaml"
expect 2 "key.yaml:3: a key must be a plain name" train "$tmp/key.yaml"

# data files: empty, too short for one sample, not a whole number of tokens, ids past the
# vocabulary — on one rank and on two thread ranks
: > "$tmp/empty.txt"
printf 'short' > "$tmp/short.txt"
printf 'abc' > "$tmp/odd.bin"
/usr/bin/python3 -c "import struct,sys; open(sys.argv[1],'wb').write(struct.pack('<400H', *([300] * 400)))" "$tmp/ids.bin"
train1 2 "data file '$tmp/empty.txt': is empty" --set data.path="$tmp/empty.txt"
train1 2 "5 tokens are too few for samples of seq_len 128" --set data.path="$tmp/short.txt"
train1 2 "3 bytes is not a whole number of 2-byte tokens" --set data.path="$tmp/odd.bin" --set data.format=uint16
train1 2 "holds token id 300 but model.vocab_size is 256" --set data.path="$tmp/ids.bin" --set data.format=uint16
train1 2 "holds token id 300 but model.vocab_size is 256" --set data.path="$tmp/ids.bin" --set data.format=uint16 \
  --set parallel.dp=2
train1 2 "validation tokens from data.val_path '$tmp/short.txt'" --set data.val_path="$tmp/short.txt" \
  --set train.eval_every=1

# Issue 52, item 6: each of these exited 1 with no reason or key, or was accepted silently.
train1 2 "--metrics: cannot write metrics file 'no/such/dir/m.jsonl': No such file or directory" \
  --metrics no/such/dir/m.jsonl
train1 2 "--metrics: cannot write metrics file '$tmp': it is a folder" --metrics "$tmp"
train1 2 "config 'log.metrics': cannot write metrics file '$tmp'" --set log.metrics="$tmp"
train1 2 "config 'model.vocab_size' (68719476736) x 'model.n_embd' (256): the model's 1.76e+13 parameters need 64.0 TiB" \
  --set model.vocab_size=68719476736
train1 0 "config 'train.momentum' is a setting of train.optimizer sgd; this run's optimizer is adamw, which ignores it" \
  --set train.momentum=0.5
train1 0 "config 'train.betas' is a setting of train.optimizer adamw; this run's optimizer is sgd, which ignores it" \
  --set train.optimizer=sgd
train1 2 "tokens overflow the run's 64-bit token counter" --set train.steps=100000000000000000
printf '{"model_type": "gpt2", "n_layer": 2, "n_embd": 32, "n_head": 2, "vocab_size": -5, "n_positions": 32}' \
  > "$tmp/config.json"
train1 2 "(its own values, which the YAML overrides): config 'model.vocab_size' must be positive, got -5" \
  --set model.hf_config="$tmp/config.json" --set model.vocab_size=256
# One sample reads seq_len + 1 tokens: a file of exactly that many trains; one token fewer is refused.
head -c 129 "$src/data/kjv.txt" > "$tmp/one_sample.txt"
train1 0 "step 1/1" --set data.path="$tmp/one_sample.txt"
head -c 128 "$src/data/kjv.txt" > "$tmp/too_short.txt"
train1 2 "128 tokens are too few for samples of seq_len 128 (a sample reads seq_len + 1 = 129 tokens)" \
  --set data.path="$tmp/too_short.txt"

TESSEL_STORE_QUOTA_MB=abc expect 2 "TESSEL_STORE_QUOTA_MB must be a whole number of MiB" launch --nproc-per-node 1 -- /bin/true
TESSEL_STORE_QUOTA_MB=64 expect 0 "" launch --nproc-per-node 1 -- /bin/true

# checkpoints: a malformed trainer.json, a malformed safetensors file to start from
mkdir -p "$tmp/ck/step-000001"
echo garbage > "$tmp/ck/step-000001/trainer.json"
echo garbage > "$tmp/ck/step-000001/model.safetensors"
echo garbage > "$tmp/bad.safetensors"
train1 2 "bad trainer.json" --resume "$tmp/ck"
train1 2 "safetensors file '$tmp/bad.safetensors'" --set model.init_from="$tmp/bad.safetensors"

# clusters and plans
printf 'name: x\nname: y\n' > "$tmp/dup.yaml"
expect 2 "'name' is given twice (first at line 1)" plan --model "$config" --cluster "$tmp/dup.yaml"
expect 2 "2147483647 devices is more than 1048576" plan --model "$config" --cluster dgx-a100-80g:2147483647 --global-batch 16
expect 2 "--cluster local:99999999999: expected local:N" plan --model "$config" --cluster local:99999999999
expect 2 "more than 281474976710656 elements" plan --model gpt-1t --cluster dgx-a100-80g:8 --global-batch 8 \
  --seq-len 4294967296
expect 2 "--layout: dp=4294967296 is more than 1048576" plan --model gpt-1t --cluster dgx-a100-80g:8 \
  --global-batch 8 --layout dp=4294967296
expect 2 "--cluster nosuch:8: not a preset" plan --model "$config" --cluster nosuch:8

# A config of a model alone plans (the planner never reads the data section).
printf 'model: {arch: gpt2, n_layer: 2, n_embd: 32, n_head: 2, vocab_size: 256, n_positions: 32}\n' > "$tmp/model.yaml"
expect 0 "global batch 8" plan --model "$tmp/model.yaml" --cluster dgx-a100-80g:8 --global-batch 8 --top 1

# ---- 1: a run that failed after its input was accepted ----
# Writing the checkpoint fails (a file-size limit, SIGXFSZ ignored so write() reports EFBIG).
set +e
out=$( (trap '' XFSZ; ulimit -f 100; exec timeout 60 "$tessel" train "$config" --set train.steps=1 --set train.warmup=0 \
  --save "$tmp/saves") 2>&1)
rc=$?
set -e
if [ "$rc" != 1 ] || ! grep -qF "not saved" <<< "$out"; then
  echo "FAIL: a save that cannot be written: rc $rc (wanted 1): ${out:0:600}"
  failures=$((failures + 1))
fi

# ---- 128+N: stopped by a signal ----
# SIGTERM during a run with --save: the step in progress finishes, is saved, and the exit
# status says which signal stopped it (143 = 128 + 15).
"$tessel" train "$config" --set train.steps=100000 --set log.every=1 --save "$tmp/stopped" > "$tmp/run.log" 2>&1 &
pid=$!
for _ in $(seq 600); do grep -q "step 1/" "$tmp/run.log" && break; sleep 0.1; done
kill -TERM "$pid"
set +e
wait "$pid"
rc=$?
set -e
if [ "$rc" != 143 ]; then
  echo "FAIL: SIGTERM to tessel train: rc $rc (wanted 143): $(tail -3 "$tmp/run.log")"
  failures=$((failures + 1))
fi

[ "$failures" = 0 ] || { echo "$failures exit-status checks failed"; exit 1; }
echo "exit codes: ok"
