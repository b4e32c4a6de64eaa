#!/bin/bash
# `tessel plan` end to end: JSON fields the issue names, the YAML section loads as a training
# config, --layout evaluates one layout, bad input exits 2 naming the problem, --svg draws.
set -euo pipefail
tessel=$1
src=$2
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

"$tessel" plan --model gpt-1t --cluster dgx-a100-80g:3072 --global-batch 3072 --top 3 --format json --svg "$tmp/p.svg" > "$tmp/p.json"
/usr/bin/python3 - "$tmp/p.json" <<'PY'
import json, sys
j = json.load(open(sys.argv[1]))
assert len(j["plans"]) == 3, j["plans"]
for p in j["plans"]:
    for key in ("layout", "step_time_s", "tokens_per_s", "tflops_per_device", "mfu", "memory_gb"):
        assert key in p, key
    m = p["memory_gb"]
    assert abs(m["total"] - (m["params"] + m["grads"] + m["optimizer"] + m["activations"] + m["other"])) < 1e-6
    assert m["total"] <= 80, m
    assert p["rank_mapping"]["innermost_first"][0] == "tp"
times = [p["step_time_s"] for p in j["plans"]]
assert times == sorted(times), times
PY
grep -q "<svg" "$tmp/p.svg"

# --published: every table of plan/published.h, predicted against published, with its errors.
"$tessel" plan --published > "$tmp/published.txt"
for table in narayanan2021-table1 megatron-core-r0.8-h100 mt-nlg-530b bigscience-bloom-176b bigscience-bloom-176b-reshaping megatron-core-mixtral-h100; do
  grep -q "^$table: mean absolute error" "$tmp/published.txt" || { cat "$tmp/published.txt"; echo "no $table"; exit 1; }
done

# --threads: the search screens on as many threads as asked, and offers the same plans on any
# number (the seconds aside); 0 is refused naming the flag.
mix="--model mixtral-8x7b --cluster dgx-h100:64 --global-batch 256 --top 5 --format json"
"$tessel" plan $mix --threads 1 | sed -E 's/"seconds":[0-9.e+-]+//' > "$tmp/t1.json"
"$tessel" plan $mix --threads 3 | sed -E 's/"seconds":[0-9.e+-]+//' > "$tmp/t3.json"
cmp -s "$tmp/t1.json" "$tmp/t3.json" || { diff "$tmp/t1.json" "$tmp/t3.json" | head; echo "--threads 1 and 3 differ"; exit 1; }
rc=0; "$tessel" plan $mix --threads 0 > "$tmp/bad.txt" 2>&1 || rc=$?
[ "$rc" != 0 ] && grep -q -- "--threads" "$tmp/bad.txt" || { cat "$tmp/bad.txt"; echo "--threads 0: rc $rc"; exit 1; }

# --software names the stack apart from the device: the same H100 layout with and without
# Megatron-Core's overlaps (its tp 4 traffic hidden behind the GEMMs is reported, not charged).
h100="--model mcore-gpt-16b --cluster dgx-h100:192 --global-batch 192 --layout dp=48,tp=4,pp=1,sp=true,sharding_stage=1"
"$tessel" plan $h100 > "$tmp/mcore.txt"
grep -q "^software profile: megatron-core-r0.8" "$tmp/mcore.txt"
grep -q "overlapped by the software (megatron-core-r0.8)" "$tmp/mcore.txt"
"$tessel" plan $h100 --software deepspeed-megatron-2022 > "$tmp/ds.txt"
grep -q "^software profile: deepspeed-megatron-2022" "$tmp/ds.txt"
! grep -q "overlapped by the software" "$tmp/ds.txt"
step() { awk '$1 == "1" { print $3 }' "$1"; }
/usr/bin/python3 -c "import sys; a, b = map(float, sys.argv[1:]); assert a < b, (a, b)" "$(step "$tmp/mcore.txt")" "$(step "$tmp/ds.txt")"
set +e
"$tessel" plan $h100 --software megatron-2030 > "$tmp/bad.txt" 2>&1
rc=$?
set -e
[ "$rc" = 2 ] && grep -q "megatron-core-r0.8" "$tmp/bad.txt" || { cat "$tmp/bad.txt"; echo "rc $rc"; exit 1; }

# --explain: the step taken apart, and one block op by op from its trace (and with --costs
# listed, said to be listed).
"$tessel" plan --model gpt-1.7b --cluster dgx-a100-80g:8 --global-batch 64 --layout dp=8,tp=1,pp=1,mbs=1 --explain \
  > "$tmp/explain.txt"
for want in "^Explained: gpt-1.7b" "communication exposed: tp" "as traced on rank 0" "linear +backward +4 " \
    "sdpa +forward +1 "; do
  grep -Eq "$want" "$tmp/explain.txt" || { cat "$tmp/explain.txt"; echo "--explain: no '$want'"; exit 1; }
done
"$tessel" plan --model gpt-1.7b --cluster dgx-a100-80g:8 --global-batch 64 --layout dp=8,tp=1,pp=1,mbs=1 --explain \
  --costs listed | grep -q "costed from the cost model's list of ops: --costs listed"
# A mixture of experts' sparse block (traced with a balanced router) and a context-parallel one.
"$tessel" plan --model mixtral-8x7b --cluster dgx-h100:64 --global-batch 256 \
  --layout dp=2,ep=8,pp=4,vpp=8,sharding_stage=1 --explain > "$tmp/explain.txt"
for want in "one sparse block, .*ep 8" "grouped_matmul +backward +3 " "ep +all_to_all +5 " \
    "expert-parallel exposed [0-9.]+ ms forward" "note: dropless routing: the memory above assumes"; do
  grep -Eq "$want" "$tmp/explain.txt" || { cat "$tmp/explain.txt"; echo "--explain (moe): no '$want'"; exit 1; }
done
"$tessel" plan --model llama3-8b --cluster dgx-h100:16 --global-batch 16 --seq-len 32768 \
  --layout tp=8,cp=2,recompute=full --explain > "$tmp/explain.txt"
for want in "cp 2 ring\), as traced" "cp +send +4 " "context-parallel \(ring\) exposed .* hidden behind the attention [0-9.]+ ms"; do
  grep -Eq "$want" "$tmp/explain.txt" || { cat "$tmp/explain.txt"; echo "--explain (cp): no '$want'"; exit 1; }
done
rc=0
"$tessel" plan --model gpt-1.7b --cluster dgx-a100-80g:8 --global-batch 64 --explain --format json > "$tmp/bad.txt" 2>&1 || rc=$?
[ "$rc" = 2 ] && grep -q "explain prints tables" "$tmp/bad.txt" || { cat "$tmp/bad.txt"; echo "--explain --format json: rc $rc"; exit 1; }

# One layout: the published 1T layout of Narayanan et al. 2021.
"$tessel" plan --model gpt-1t --cluster dgx-a100-80g:3072 --global-batch 3072 \
  --layout dp=6,tp=8,pp=64,vpp=2,mbs=1,sharding_stage=0,sp=false,recompute=full | grep -q "dp=6,tp=8,pp=64,vpp=2"

# The yaml form is a parallel section a training config accepts.
"$tessel" plan --model "$src/configs/gpt2-tiny.yaml" --cluster dgx-a100-80g:4 --format yaml > "$tmp/parallel.yaml"
grep -q "^parallel:" "$tmp/parallel.yaml"
{ sed '/^parallel:/,$d' "$src/configs/gpt2-tiny.yaml"; cat "$tmp/parallel.yaml"; } > "$tmp/cfg.yaml"
sed -i "s|path: ../data/kjv.txt|path: $src/data/kjv.txt|" "$tmp/cfg.yaml"
"$tessel" train "$tmp/cfg.yaml" --set train.steps=1 --set train.warmup=0 --set train.save_every=0 > "$tmp/train.log" 2>&1 ||
  { cat "$tmp/train.log"; exit 1; }

# Expert parallel: the search puts Mixtral 8x7B's experts on ep ranks (its YAML says so).
"$tessel" plan --model mixtral-8x7b --cluster dgx-h100:64 --global-batch 256 --format yaml > "$tmp/mixtral.yaml"
grep -Eq "^  ep: [2-8]$" "$tmp/mixtral.yaml" || { cat "$tmp/mixtral.yaml"; echo "no ep in the Mixtral plan"; exit 1; }

# A plan with ep (and one with cp) as `tessel plan --format yaml` writes it, for the tiny
# configs on 4 local thread ranks, trains: the section pasted into the config, a few steps.
export XDG_CACHE_HOME="$tmp/cache"
plan_and_train() {  # CONFIG LAYOUT WANT
  local name
  name=$(basename "$1" .yaml)
  "$tessel" plan --model "$src/configs/$1" --cluster local:4 --layout "$2" --format yaml > "$tmp/$name.plan.yaml" 2>/dev/null
  grep -q "$3" "$tmp/$name.plan.yaml" || { cat "$tmp/$name.plan.yaml"; echo "no '$3' in the plan"; exit 1; }
  { sed '/^parallel:/,$d' "$src/configs/$1"; grep -v '^#' "$tmp/$name.plan.yaml"; } > "$tmp/$name.cfg.yaml"
  sed -i "s|path: ../data/kjv.txt|path: $src/data/kjv.txt|" "$tmp/$name.cfg.yaml"
  "$tessel" train "$tmp/$name.cfg.yaml" --set train.steps=3 --set train.warmup=0 --set train.save_every=0 \
    --set log.every=1 > "$tmp/$name.log" 2>&1 || { cat "$tmp/$name.log"; exit 1; }
  grep -q "step 3/3" "$tmp/$name.log" && grep -q "\[rank 3\]" "$tmp/$name.log" ||
    { cat "$tmp/$name.log"; echo "$1 did not train 3 steps on 4 ranks"; exit 1; }
}
plan_and_train mixtral-tiny.yaml dp=2,tp=1,pp=1,ep=2,mbs=4 "^  ep: 2$"
plan_and_train llama-tiny.yaml dp=2,tp=1,pp=1,cp=2,cp_method=ring,mbs=4 "^  cp_method: ring$"

# This machine as `tessel cluster detect` measures it: a cluster file that reads back, whose
# figures are in range and say where they come from, and that plans a layout.
export XDG_CACHE_HOME="$tmp/cache"
"$tessel" cluster detect --ranks 2 -q -o "$tmp/local.yaml"
# ... and keeps the measurement, which --cluster local:2 (and tessel train --plan auto) reuse for a day.
ls "$tmp/cache/tessel/cluster-$(hostname)-2ranks.yaml" >/dev/null
"$tessel" plan --model "$src/configs/gpt2-tiny.yaml" --cluster local:2 > /dev/null 2> "$tmp/cached.err"
grep -q "as measured 0.0 h ago" "$tmp/cached.err" || { cat "$tmp/cached.err"; echo "the kept measurement was not used"; exit 1; }
"$tessel" plan --model "$src/configs/gpt2-tiny.yaml" --cluster "$tmp/local.yaml" --format json \
  --layout dp=1,tp=2,pp=1,vpp=1,mbs=16,sharding_stage=0,sp=false,recompute=none > "$tmp/local.json"
/usr/bin/python3 - "$tmp/local.yaml" "$tmp/local.json" <<'PY'
import json, re, sys
text = open(sys.argv[1]).read()
def value(key):
    return float(re.search(r"^ *" + key + r": ([-0-9.e]+)$", text, re.M).group(1))
assert 0 < value("attention_efficiency") <= 4, value("attention_efficiency")
assert 0 < value("attention_half_dim") <= 4096, value("attention_half_dim")
assert 0 < value("optimizer_efficiency") <= 2, value("optimizer_efficiency")
assert 0 < value("gemm_efficiency") <= 1
assert value("memory_bandwidth") > 0
# The streaming roof is a layer's elementwise ops, and attention is measured as GPT-2 lays it out.
assert "tanh gelu on [2048, 1024]" in text, text
assert "packed projection" in text, text
plan = json.load(open(sys.argv[2]))["plans"][0]
assert plan["step_time_s"] > 0 and plan["time"]["compute_s"] > 0 and plan["time"]["tp_comm_s"] > 0, plan
PY

# Bad input: exit status 2 and a message naming the problem.
set +e
out=$("$tessel" plan --model gpt-1t --cluster dgx-a100-80g:3072 --global-batch 3072 --layout dp=6,tp=8,pp=63 2>&1); rc=$?
set -e
[ "$rc" = 2 ] && grep -q "has 3072 devices" <<< "$out" || { echo "bad layout: rc $rc: $out"; exit 1; }
set +e
out=$("$tessel" plan --model gpt-9t --cluster dgx-a100-80g:8 --global-batch 8 2>&1); rc=$?
set -e
[ "$rc" = 2 ] && grep -q "unknown model preset 'gpt-9t'" <<< "$out" || { echo "bad model: rc $rc: $out"; exit 1; }
set +e
out=$("$tessel" plan --model gpt-1.7b --cluster dgx-a100-80g:8 --global-batch 0 2>&1); rc=$?
set -e
[ "$rc" = 2 ] && grep -q "^error: --global-batch: must be a positive whole number, got '0'" <<< "$out" ||
  { echo "bad count: rc $rc: $out"; exit 1; }
# Each refusal names what is wrong and exits 2 (input checks, before any work).
expect_refusal() {  # WANT COMMAND...
  local want=$1
  shift
  set +e
  out=$("$@" 2>&1)
  rc=$?
  set -e
  [ "$rc" = 2 ] && grep -qF -- "$want" <<< "$out" || { echo "expected exit 2 and '$want' from $*: rc $rc: ${out:0:400}"; exit 1; }
}
expect_refusal "--model excludes --published" "$tessel" plan --published --model gpt-1t
expect_refusal "--seq-len 4096 exceeds the model's 128 positions" \
  "$tessel" plan --model "$src/configs/gpt2-tiny.yaml" --cluster dgx-a100-80g:4 --seq-len 4096
expect_refusal "the folder $tmp/missing does not exist" \
  "$tessel" plan --model gpt-1.7b --cluster dgx-a100-80g:8 --global-batch 8 --svg "$tmp/missing/p.svg"
expect_refusal "--layout: empty" "$tessel" plan --model gpt-1.7b --cluster dgx-a100-80g:8 --global-batch 8 --layout ""
expect_refusal "--mesh 2 would not be used" "$tessel" explain-reshard 'mesh(dp=2)[S(0)]' 'mesh(dp=2)[R]' --mesh 2 --shape 4,4
expect_refusal "--shape '4,,4' has an empty dim" "$tessel" explain-reshard '[S(0)]' '[R]' --mesh 2 --shape 4,,4
expect_refusal "the SRC mesh has 200000 ranks" "$tessel" explain-reshard '[S(0)]' '[R]' --mesh 200000 --shape 400000
expect_refusal "more than 16777216 processes" "$tessel" explain-reshard '[S(0)]' '[R]' --mesh 100000x100000 --shape 4,4
echo "plan cli: ok"
