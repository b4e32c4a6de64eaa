#!/bin/bash
# Bad checkpoints are refused before anything is overwritten: a checkpoint of another model, a
# truncated file, a tensor of the wrong dtype or shape, a manifest naming a file outside the
# folder. Each resume exits 2 with an error naming the file (and the tensor, where one is at
# fault), and the run's --save folder gets nothing.
#   tests/ckpt/bad_checkpoints.sh TESSEL_BINARY SOURCE_DIR
set -euo pipefail
tessel=$1
src=$2
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
gpt2=(--set model.n_layer=2 --set model.n_embd=64 --set model.n_head=4 --set train.global_batch=4
      --set train.micro_batch=4 --set train.seq_len=32 --set train.warmup=0 --set train.steps=2)
"$tessel" train "$src/configs/gpt2-tiny.yaml" "${gpt2[@]}" --set train.steps=1 --set parallel.dp=2 \
  --save "$tmp/good" > /dev/null 2>&1
"$tessel" train "$src/configs/llama-tiny.yaml" --set model.num_hidden_layers=2 --set model.hidden_size=64 \
  --set model.num_attention_heads=4 --set model.num_key_value_heads=4 --set model.intermediate_size=96 \
  --set train.global_batch=4 --set train.micro_batch=4 --set train.seq_len=32 --set train.steps=1 \
  --save "$tmp/llama" > /dev/null 2>&1
step=step-000001
failures=0

# refused LABEL WANT... -- CHECKPOINT [EXTRA ARGS]: resuming exits 2 naming every WANT, saving nothing.
refused() {
  local label=$1 wants=() out rc
  shift
  while [ "$1" != -- ]; do wants+=("$1"); shift; done
  shift
  local ck=$1
  shift
  rm -rf "$tmp/out"
  set +e
  out=$("$tessel" train "$src/configs/gpt2-tiny.yaml" "${gpt2[@]}" "$@" --resume "$ck" --save "$tmp/out" 2>&1)
  rc=$?
  set -e
  local ok=1
  [ "$rc" = 2 ] || ok=0
  for w in "${wants[@]}"; do grep -qF -- "$w" <<< "$out" || ok=0; done
  if ls "$tmp/out"/step-* > /dev/null 2>&1; then ok=0; fi
  if [ "$ok" = 0 ]; then
    echo "FAIL $label: rc $rc, wanted 2 and [${wants[*]}] and no new step in: ${out:0:800}"
    failures=$((failures + 1))
  else
    echo "ok   $label: $(grep -m1 error: <<< "$out" | cut -c1-200)"
  fi
}

# copy NAME: a fresh copy of the good checkpoint's step folder.
copy() { rm -rf "$tmp/$1"; mkdir -p "$tmp/$1"; cp -r "$tmp/good/$step" "$tmp/$1/"; echo "$tmp/$1/$step"; }

# edit_header FILE PYTHON: rewrite a safetensors header in place (same length, space padded).
edit_header() {
  python3 - "$1" "$2" <<'PY'
import json, struct, sys
path, code = sys.argv[1], sys.argv[2]
data = bytearray(open(path, "rb").read())
(n,) = struct.unpack("<Q", data[:8])
h = json.loads(data[8:8 + n])
exec(code)
text = json.dumps(h, separators=(",", ":")).encode()
assert len(text) <= n, "the edited header is longer"
data[8:8 + n] = text + b" " * (n - len(text))
open(path, "wb").write(data)
PY
}

# reseal STEP_DIR FILE: the manifest's checksum of FILE (a safetensors file's header, a JSON file
# whole) made to match what it now holds, as a writer that rewrote both consistently would leave
# it: what is checked then is the header against checkpoint.json, and both against the model.
reseal() {
  python3 - "$1/manifest.json" "$2" <<'PY'
import json, os, struct, sys
M = (1 << 64) - 1
P1, P2, P3 = 0x9E3779B185EBCA87, 0xC2B2AE3D27D4EB4F, 0x165667B19E3779F9
rotl = lambda x, r: ((x << r) | (x >> (64 - r))) & M
def checksum(p):  # checkpoint_checksum (src/tessel/ckpt/sharded_save.cc)
    lane, i, n = [(P1 + P2) & M, P2, 0, (-P1) & M], 0, len(p)
    while i + 32 <= n:
        for l in range(4):
            (w,) = struct.unpack_from("<Q", p, i + 8 * l)
            lane[l] = (rotl((lane[l] + w * P2) & M, 31) * P1) & M
        i += 32
    h = (rotl(lane[0], 1) + rotl(lane[1], 7) + rotl(lane[2], 12) + rotl(lane[3], 18) + n) & M
    for b in p[i:]:
        h = (rotl(h ^ ((b * P3) & M), 11) * P1) & M
    h ^= h >> 33; h = (h * P2) & M; h ^= h >> 29; h = (h * P3) & M
    return format(h ^ (h >> 32), "016x")
manifest, path = sys.argv[1], sys.argv[2]
m = json.load(open(manifest))
e = m["files"][os.path.basename(path)]
data = open(path, "rb").read()
if "header_checksum" in e:
    e["header_checksum"] = checksum(data[:e["header_bytes"]])
else:
    e["size"], e["checksum"] = len(data), checksum(data)
json.dump(m, open(manifest, "w"))
PY
}

refused "another architecture" "holds a llama model but the config builds gpt2" -- "$tmp/llama/$step"
refused "another size" "transformer.wte.weight" "has shape [256, 64]" "model-0000" -- "$tmp/good/$step" \
  --set model.n_embd=128
ck=$(copy truncated)
truncate -s 4000 "$ck/model-00001-of-00002.safetensors"
refused "a truncated file" "model-00001-of-00002.safetensors" "4000 bytes" -- "$ck"
ck=$(copy dtype)
file=$(grep -l "transformer.h.0.attn.c_proj.weight\"" "$ck"/model-*.safetensors | head -1)
edit_header "$file" 'h["transformer.h.0.attn.c_proj.weight"]["dtype"] = "I32"'
reseal "$ck" "$file"
refused "a wrong dtype" "transformer.h.0.attn.c_proj.weight" "is I32" "$(basename "$file")" -- "$ck"
ck=$(copy shape)
file=$(grep -l "transformer.h.0.mlp.c_fc.weight\"" "$ck"/model-*.safetensors | head -1)
edit_header "$file" 'h["transformer.h.0.mlp.c_fc.weight"]["shape"] = [256, 64]'
reseal "$ck" "$file"
refused "a wrong shape" "transformer.h.0.mlp.c_fc.weight" "has shape [256, 64]" "$(basename "$file")" -- "$ck"
# Issue 52, item 4: headers were trusted when their byte count was right. An edited header is
# refused by its checksum; resealed, by checkpoint.json's shapes; with checkpoint.json edited to
# agree, by the shape the model needs (the optimizer's step stored as [1]; an exp_avg stored
# transposed, [256, 64] for [64, 256]).
ck=$(copy header_sum)
opt=$(ls "$ck"/optimizer*.safetensors | head -1)
edit_header "$opt" 'h["step"]["shape"] = [1]'
refused "an edited header" "$(basename "$opt")'s header does not match its checksum" -- "$ck"
reseal "$ck" "$opt"
refused "a resealed header against checkpoint.json" '"step" has shape [1] in' "$(basename "$opt")" -- "$ck"
ck=$(copy header_swap)
k=transformer.h.0.mlp.c_fc.weight.exp_avg
opt=$(grep -l "$k\"" "$ck"/optimizer*.safetensors | head -1)
edit_header "$opt" "h['$k']['shape'] = h['$k']['shape'][::-1]"
python3 - "$ck/checkpoint.json" "$k" <<'PY'
import json, sys
path, k = sys.argv[1], sys.argv[2]
c = json.load(open(path))
t = c["tensors"][k]
t["shape"] = t["shape"][::-1]
for p in t["pieces"]:
    p["offset"], p["extent"] = p["offset"][::-1], p["extent"][::-1]
json.dump(c, open(path, "w"))
PY
reseal "$ck" "$opt"
reseal "$ck" "$ck/checkpoint.json"
refused "a transposed state, header and index agreeing" "\"$k\" has shape [256, 64] but [64, 256] is needed" -- "$ck"
ck=$(copy outside)
python3 - "$ck/manifest.json" <<'PY'
import json, sys
m = json.load(open(sys.argv[1]))
m["files"]["../../etc/passwd"] = {"size": 1}
json.dump(m, open(sys.argv[1], "w"))
PY
refused "a manifest naming a file outside the folder" "manifest.json" "../../etc/passwd" "not a file of the folder" -- "$ck"
[ "$failures" = 0 ] || exit 1
echo "bad checkpoints: ok"
