#!/usr/bin/env bash
# gpucr inspect: decodes a valid image (text and JSON), and refuses a damaged
# one with exit status 1 and a message naming the problem; --verify catches a
# damaged chunk that the structural checks cannot see.
set -euo pipefail
B=${BUILD:-build}
work=$(mktemp -d /tmp/gpucr-inspect.XXXXXX)
trap 'rm -rf "$work"' EXIT
fail() { echo "FAIL: $*"; exit 1; }

"$B/tests/e2e-mkimage" "$work" 4242
out=$("$B/bin/gpucr" inspect "$work")
echo "$out"
grep -q 'pid 4242 (sample)' <<<"$out" || fail "no pid/comm line"
grep -q '3 buffers' <<<"$out" || fail "buffer count"
grep -q 'NVIDIA H200 GPU-deadbeef-0102' <<<"$out" || fail "device line"
grep -q '0x00007f2a00200000' <<<"$out" || fail "buffer address"

"$B/bin/gpucr" inspect --json "$work" >"$work/out.json"
python3 - "$work/out.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
img = d["images"][0]
assert img["pid"] == 4242 and img["comm"] == "sample", img
assert len(img["buffers"]) == 3 and img["buffers"][1]["va"] == "0x7f2a00200000", img["buffers"]
assert img["zero_bytes"] == 65536 and img["bytes"] == 3 * 65536 + 100 + 65536 + 2 * 65536, img
PY

"$B/bin/gpucr" inspect --verify "$work" | grep -q verified || fail "--verify on a good image"

# A flipped byte in chunk data: structure intact, --verify must catch it.
printf '\xff' | dd of="$work/gpucr-pages-4242.img" bs=1 seek=$((4096 + 70000)) conv=notrunc status=none
"$B/bin/gpucr" inspect "$work" >/dev/null || fail "structural check should still pass"
if "$B/bin/gpucr" inspect --verify "$work" 2>"$work/err"; then fail "--verify missed a damaged chunk"; fi
grep -q 'fingerprint mismatch in chunk 1' "$work/err" || { cat "$work/err"; fail "message"; }

# A truncated image file: exit 1, message says truncated.
truncate -s -3 "$work/gpucr-4242.img"
set +e
"$B/bin/gpucr" inspect "$work" 2>"$work/err"
rc=$?
set -e
[ $rc = 1 ] || fail "exit status $rc for a truncated image"
grep -q truncated "$work/err" || { cat "$work/err"; fail "message"; }

# Usage errors exit 2.
set +e
"$B/bin/gpucr" inspect 2>/dev/null
rc=$?
set -e
[ $rc = 2 ] || fail "usage exit status $rc"
echo ok
