#!/usr/bin/env bash
# Counts the calls that read tensor memory on the host (t.data<T>(), t.mutable_data<T>())
# outside a device's kernel files — the op families of src/tessel/ops/ and folders named
# cpu/, cuda/ or kernels/ (ARCHITECTURE principle 11: no code outside a device's kernels reads
# tensor memory, so a GPU or the guarded device can run it). Each such call is a path the
# guarded device would crash on. The count may only go down: it must equal the ceiling in
# host_reads_ceiling.txt (lower the ceiling when you remove one; the goal is zero).
set -euo pipefail
root=${1:?usage: host_reads.sh SOURCE_ROOT}
cd "$root"
ceiling=$(cat tests/layering/host_reads_ceiling.txt)
sites=$(grep -rnE '\.(data|mutable_data)<[A-Za-z0-9_:]+>\(' src/tessel --include='*.cc' --include='*.h' --include='*.cu' \
  | grep -vE '^src/tessel/ops/|/(cpu|cuda|kernels)/' || true)
count=0
[ -n "$sites" ] && count=$(printf '%s\n' "$sites" | wc -l)
printf '%s\n' "$sites" | sed 's/^/  /'
echo "host reads of tensor memory outside kernel files: $count (ceiling $ceiling)"
if [ "$count" -gt "$ceiling" ]; then
  echo "error: $((count - ceiling)) new host read(s) of tensor memory outside kernel files; move the code into an op's kernel" >&2
  exit 1
fi
if [ "$count" -lt "$ceiling" ]; then
  echo "error: the count fell to $count: lower tests/layering/host_reads_ceiling.txt to $count" >&2
  exit 1
fi
