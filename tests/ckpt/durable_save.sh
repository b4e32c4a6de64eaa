#!/bin/bash
# Durable saves. (1) A full disk at every kind of place in a save: a 2-rank run that saved step
# 1 resumes and saves step 2 under a file-size limit (ulimit -f) from 1 KiB to past the largest
# file, so the write that fails is a safetensors header, a piece, trainer.json, checkpoint.json
# or the manifest: the run fails (exit 1) naming the file, step 2 is never published, step 1
# is untouched, and a resume afterwards starts from step 1. (2) The system calls of a save, as
# strace sees them: every file of the step folder is fsync'd before the folder is renamed into
# place, the folder itself too, and the parent folder after the rename.
#   tests/ckpt/durable_save.sh TESSEL_BINARY SOURCE_DIR
set -euo pipefail
tessel=$1
config=$2/configs/gpt2-tiny.yaml
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
small=(--set model.n_layer=2 --set model.n_embd=64 --set model.n_head=4 --set train.global_batch=4
       --set train.micro_batch=4 --set train.seq_len=32 --set train.warmup=0 --set parallel.dp=2
       --set parallel.sharding_stage=1 --set train.save_every=0)

"$tessel" train "$config" "${small[@]}" --set train.steps=1 --save "$tmp/ck" > "$tmp/first.log" 2>&1 ||
  { cat "$tmp/first.log"; exit 1; }
sum1=$(cd "$tmp/ck/step-000001" && cat -- * | md5sum)
largest=$(($(stat -c %s "$tmp/ck/step-000001"/* | sort -n | tail -1) / 1024 + 2))
failed=0
for kib in 1 2 4 8 16 32 64 128 256 512 1024 $largest; do
  set +e
  out=$( (trap '' XFSZ; ulimit -f "$kib"; exec "$tessel" train "$config" "${small[@]}" --set train.steps=2 \
    --resume "$tmp/ck" --save "$tmp/ck") 2>&1)
  rc=$?
  set -e
  if [ -d "$tmp/ck/step-000002" ]; then
    [ "$rc" = 0 ] || { echo "limit ${kib} KiB: exit $rc but step 2 was published:"; echo "$out"; exit 1; }
    "$tessel" ckpt inspect "$tmp/ck/step-000002" --verify > /dev/null ||
      { echo "limit ${kib} KiB: the published step 2 does not verify"; exit 1; }
    rm -rf "$tmp/ck/step-000002"
    continue
  fi
  failed=$((failed + 1))
  [ "$rc" = 1 ] || { echo "limit ${kib} KiB: exit $rc, wanted 1:"; echo "$out"; exit 1; }
  grep -q "not saved" <<< "$out" && grep -q "File too large" <<< "$out" ||
    { echo "limit ${kib} KiB: the error does not say why:"; echo "$out"; exit 1; }
  [ "$(cd "$tmp/ck/step-000001" && cat -- * | md5sum)" = "$sum1" ] ||
    { echo "limit ${kib} KiB: step 1 changed"; exit 1; }
  "$tessel" train "$config" "${small[@]}" --set train.steps=1 --resume "$tmp/ck" > "$tmp/resume.log" 2>&1 ||
    { echo "limit ${kib} KiB: resume failed"; cat "$tmp/resume.log"; exit 1; }
  grep -q "resumed from $tmp/ck/step-000001 " "$tmp/resume.log" ||
    { echo "limit ${kib} KiB: did not resume from step 1"; cat "$tmp/resume.log"; exit 1; }
done
[ "$failed" -ge 8 ] || { echo "only $failed file-size limits made the save fail"; exit 1; }

# The order of the system calls, with the paths of the descriptors (strace -y).
if ! command -v strace > /dev/null; then
  echo "durable saves: ok ($failed file-size limits refused; strace not installed, order not checked)"
  exit 0
fi
rm -rf "$tmp/ck2"
strace -f -y -qq -e trace=fsync,rename,renameat,renameat2 -o "$tmp/trace" \
  "$tessel" train "$config" "${small[@]}" --set train.steps=1 --save "$tmp/ck2" > /dev/null 2>&1
python3 - "$tmp/trace" "$tmp/ck2" <<'PY'
import os, re, sys
trace, root = sys.argv[1], os.path.realpath(sys.argv[2])
tmpdir, final = os.path.join(root, ".step-000001.tmp"), os.path.join(root, "step-000001")
synced, renamed_at, events = {}, None, []
for i, line in enumerate(open(trace)):
    m = re.search(r'fsync\(\d+<([^>]*)>', line)  # the call (strace -f may split it into unfinished/resumed)
    if m:
        synced.setdefault(m.group(1), i)
        if m.group(1) == root:
            events.append(i)
    if "rename" in line and tmpdir in line and final in line and "= 0" in line:
        renamed_at = i
if renamed_at is None:
    sys.exit("no rename of the temporary folder into place")
files = os.listdir(final)
late = [f for f in files if synced.get(os.path.join(tmpdir, f), 1 << 60) > renamed_at]
if late:
    sys.exit(f"not fsync'd before the rename: {late}")
if synced.get(tmpdir, 1 << 60) > renamed_at:
    sys.exit("the folder was not fsync'd before the rename")
if not any(i > renamed_at for i in events):
    sys.exit("the parent folder was not fsync'd after the rename")
print(f"fsync order: {len(files)} files and the folder synced before the rename, the parent after")
PY
# (3) A background save is announced before the next save starts, so that when the next one
# fails the user still learns which checkpoint is complete (issue 52: it was sometimes never said).
set +e
out=$(TESSEL_FAULT="step=2,action=error,during=save" "$tessel" train "$config" "${small[@]}" --set train.steps=3 \
  --set train.save_every=1 --set train.async_save=true --save "$tmp/bg" 2>&1)
rc=$?
set -e
[ "$rc" = 1 ] || { echo "a failed background save: exit $rc, wanted 1:"; echo "$out"; exit 1; }
grep -qF "saved $tmp/bg/step-000001" <<< "$out" ||
  { echo "the completed save of step 1 was not announced before step 2's failed:"; echo "$out"; exit 1; }
[ -d "$tmp/bg/step-000001" ] && [ ! -d "$tmp/bg/step-000002" ] ||
  { echo "wanted step 1 published and step 2 not:"; ls -a "$tmp/bg"; exit 1; }
echo "durable saves: ok ($failed file-size limits refused the save without publishing it)"
