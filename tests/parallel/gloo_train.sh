#!/usr/bin/env bash
# Hybrid layouts on Gloo ranks as real processes (started by `tessel launch`) train like one
# rank: the loss of every step agrees with the single-rank trainer to 2^-22 (relative; the bound
# of docs/development.md, "Equality across layouts").
#   tests/parallel/gloo_train.sh TESSEL_BINARY SOURCE_DIR
set -euo pipefail
tessel=$1
src=$2
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
common=(--set model.n_layer=4 --set model.n_embd=32 --set model.n_head=4 --set model.n_positions=32
        --set train.seq_len=16 --set train.global_batch=8 --set train.micro_batch=2 --set train.steps=6
        --set train.warmup=1 --set train.save_every=0 --set train.threads=1 --set train.dropout=0.1
        --set log.every=1000)
"$tessel" train "$src/configs/gpt2-tiny.yaml" "${common[@]}" --metrics "$work/one.jsonl" >/dev/null 2>&1

compare() {  # compare FILE LABEL [REFERENCE]
  awk -v label="$2" '
    function loss(line) { match(line, /"loss":[-0-9.eE+]+/); return substr(line, RSTART + 7, RLENGTH - 7) + 0 }
    NR == FNR { ref[FNR] = loss($0); n = FNR; next }
    { got = loss($0); d = got - ref[FNR]; if (d < 0) d = -d; rel = d / (ref[FNR] < 0 ? -ref[FNR] : ref[FNR]);
      if (rel > worst) worst = rel; if (rel > 2.384185791015625e-07) { printf "%s: step %d loss %s vs one rank %s\n", label, FNR - 1, got, ref[FNR]; bad = 1 } ; m = FNR }
    END { if (m != n) { printf "%s: %d steps, one rank ran %d\n", label, m, n; bad = 1 }
          printf "%s: %d steps, worst relative loss difference %.1e\n", label, m, worst; exit bad }' \
    "${3:-$work/one.jsonl}" "$1"
}

run() {  # run LABEL NPROC SETTINGS...
  local label=$1 nproc=$2
  shift 2
  "$tessel" launch --nproc-per-node "$nproc" -- "$tessel" train "$src/configs/gpt2-tiny.yaml" "${common[@]}" "$@" \
    --backend gloo --metrics "$work/$label.jsonl" >"$work/$label.log" 2>&1 || { cat "$work/$label.log"; exit 1; }
  compare "$work/$label.jsonl" "$label"
}

run dp2-pp2-zbh1-stage2 4 --set parallel.dp=2 --set parallel.pp=2 --set parallel.schedule=ZBH1 --set parallel.sharding_stage=2
run dp2-tp2-sp-stage3 4 --set parallel.dp=2 --set parallel.tp=2 --set parallel.sp=true --set parallel.sharding_stage=3
run tp2-pp2-vpp 4 --set parallel.tp=2 --set parallel.pp=2 --set parallel.vpp=2 --set parallel.schedule=VPP
# Context parallel, both methods, with dropout (the ring draws its masks in the natural order).
run cp2-all_to_all-dp2 4 --set parallel.cp=2 --set parallel.cp_method=all_to_all --set parallel.dp=2
run cp2-ring-tp2-sp 4 --set parallel.cp=2 --set parallel.tp=2 --set parallel.sp=true
# --plan auto under tessel launch: rank 0 plans for the 4 processes, every rank runs that layout.
run plan-auto 4 --plan auto
grep -q "info: --plan auto: the planner chose dp=" "$work/plan-auto.log" ||
  { cat "$work/plan-auto.log"; echo "plan-auto: no layout was chosen"; exit 1; }

# Save on one backend, resume on the other: Gloo processes dp2·stage 2 save at step 3, thread
# ranks tp2 resume from it; thread pp2 save, Gloo processes dp2·tp2·stage 3 resume. The steps
# after the resume have the losses of the single-rank run.
resume() {  # resume LABEL: the last 3 steps of LABEL.jsonl against one rank's
  local label=$1
  shift
  grep -q '"step":5' "$work/$label.jsonl" || { echo "$label: the resumed run did not reach step 5"; exit 1; }
  tail -n 3 "$work/$label.jsonl" > "$work/$label.tail"
  tail -n 3 "$work/one.jsonl" > "$work/one.tail"
  awk -v label="$label" '
    function loss(line) { match(line, /"loss":[-0-9.eE+]+/); return substr(line, RSTART + 7, RLENGTH - 7) + 0 }
    NR == FNR { ref[FNR] = loss($0); next }
    { got = loss($0); d = got - ref[FNR]; if (d < 0) d = -d;
      if (d / ref[FNR] > 1e-5) { printf "%s: resumed step %d loss %s vs %s\n", label, FNR + 2, got, ref[FNR]; bad = 1 } }
    END { printf "%s: resumed steps match\n", label; exit bad }' "$work/one.tail" "$work/$label.tail"
}
"$tessel" launch --nproc-per-node 2 -- "$tessel" train "$src/configs/gpt2-tiny.yaml" "${common[@]}" --backend gloo \
  --set parallel.dp=2 --set parallel.sharding_stage=2 --set train.save_every=3 --save "$work/g" \
  >"$work/gsave.log" 2>&1 || { cat "$work/gsave.log"; exit 1; }
"$tessel" train "$src/configs/gpt2-tiny.yaml" "${common[@]}" --set parallel.tp=2 --resume "$work/g/step-000003" \
  --metrics "$work/gloo-to-thread.jsonl" >"$work/g2t.log" 2>&1 || { cat "$work/g2t.log"; exit 1; }
resume gloo-to-thread
"$tessel" train "$src/configs/gpt2-tiny.yaml" "${common[@]}" --set parallel.pp=2 --set parallel.micro_batches=2 \
  --set train.save_every=3 --save "$work/t" >"$work/tsave.log" 2>&1 || { cat "$work/tsave.log"; exit 1; }
"$tessel" launch --nproc-per-node 4 -- "$tessel" train "$src/configs/gpt2-tiny.yaml" "${common[@]}" --backend gloo \
  --set parallel.dp=2 --set parallel.tp=2 --set parallel.sharding_stage=3 --resume "$work/t/step-000003" \
  --metrics "$work/thread-to-gloo.jsonl" >"$work/t2g.log" 2>&1 || { cat "$work/t2g.log"; exit 1; }
resume thread-to-gloo

# Mixture of experts (issue 29): a tiny Mixtral with the experts over ep (tokens exchanged by
# all_to_all between processes), dropless and with a capacity that drops tokens, and with context
# parallel (each rank routes its part of every sequence), against the
# single-rank run; then a save with ep 2 on Gloo resumed with tp 2 on thread ranks.
moe=(--set model.num_hidden_layers=2 --set model.hidden_size=32 --set model.num_attention_heads=4
     --set model.num_key_value_heads=2 --set model.intermediate_size=32 --set model.max_position_embeddings=32
     --set model.num_local_experts=4 --set train.seq_len=16 --set train.global_batch=8 --set train.micro_batch=4
     --set train.steps=6 --set train.warmup=1 --set train.save_every=0 --set train.threads=1 --set log.every=1000)
for cap in 0 1.0; do
  "$tessel" train "$src/configs/mixtral-tiny.yaml" "${moe[@]}" --set model.capacity_factor=$cap \
    --metrics "$work/moe-one-$cap.jsonl" >/dev/null 2>&1
done
moe_run() {  # moe_run LABEL NPROC CAPACITY SETTINGS...
  local label=$1 nproc=$2 cap=$3
  shift 3
  "$tessel" launch --nproc-per-node "$nproc" -- "$tessel" train "$src/configs/mixtral-tiny.yaml" "${moe[@]}" \
    --set model.capacity_factor=$cap "$@" --backend gloo --metrics "$work/$label.jsonl" >"$work/$label.log" 2>&1 ||
    { cat "$work/$label.log"; exit 1; }
  compare "$work/$label.jsonl" "$label" "$work/moe-one-$cap.jsonl"
}
moe_run moe-ep4-capacity 4 1.0 --set parallel.ep=4
moe_run moe-dp2-ep2-stage3 4 0 --set parallel.dp=2 --set parallel.ep=2 --set parallel.sharding_stage=3
moe_run moe-cp2-ep2 4 0 --set parallel.cp=2 --set parallel.ep=2  # each rank routes its half of every sequence
"$tessel" launch --nproc-per-node 2 -- "$tessel" train "$src/configs/mixtral-tiny.yaml" "${moe[@]}" --backend gloo \
  --set parallel.ep=2 --set model.capacity_factor=0 --set train.save_every=3 --save "$work/m" \
  >"$work/msave.log" 2>&1 || { cat "$work/msave.log"; exit 1; }
"$tessel" train "$src/configs/mixtral-tiny.yaml" "${moe[@]}" --set model.capacity_factor=0 --set parallel.tp=2 \
  --resume "$work/m/step-000003" --metrics "$work/moe-ep-to-tp.jsonl" >"$work/m2t.log" 2>&1 || { cat "$work/m2t.log"; exit 1; }
cp "$work/moe-one-0.jsonl" "$work/one.jsonl"  # resume compares against one.jsonl
resume moe-ep-to-tp
