#!/usr/bin/env bash
# timeout: 120
# CRIU as installed by scripts/install-deps.sh works on this kernel: `criu
# check` passes, and a CPU-only process is dumped, killed, restored, and goes
# on counting from where it was with its memory intact (checked against an
# uninterrupted run of the same program).
set -euo pipefail
BUILD=${BUILD:-build}
B=$(cd "$BUILD" && pwd)
criu=$(command -v criu) || { echo "criu not installed: run scripts/install-deps.sh"; exit 1; }
[ "$(id -u)" = 0 ] || { echo "skip: CRIU needs root"; exit 77; }

"$criu" check
work=$(mktemp -d /tmp/gpucr-criu-basic.XXXXXX)
trap 'rm -rf "$work"' EXIT

# Reference: the checksum the program reports at count 60 when never interrupted.
"$B/tests/e2e-counter" "$work/ref" 60
read -r ref_count ref_sum <"$work/ref"
[ "$ref_count" = 60 ]

cat >"$work/flow.sh" <<FLOW
set -euo pipefail
setsid "$B/tests/e2e-counter" "$work/out" 60 </dev/null >/dev/null 2>&1 &
pid=\$!
sleep 0.3
read -r before _ <"$work/out"
mkdir "$work/img"
"$criu" dump -t \$pid -D "$work/img" -o dump.log -v4 || { tail -20 "$work/img/dump.log"; exit 1; }
wait \$pid 2>/dev/null || true
kill -0 \$pid 2>/dev/null && { echo "process still alive after dump"; exit 1; }
echo "dumped at count \$before"
"$criu" restore -D "$work/img" -o restore.log -v4 -d || { tail -20 "$work/img/restore.log"; exit 1; }
# Restored under its old pid; wait for it to finish its 60 steps.
for i in \$(seq 1 200); do kill -0 \$pid 2>/dev/null || break; sleep 0.05; done
FLOW
"$B/tests/e2e-subreaper" bash "$work/flow.sh"
read -r count sum <"$work/out"
echo "after restore: count $count, checksum $sum (reference $ref_sum)"
[ "$count" = 60 ] && [ "$sum" = "$ref_sum" ]
