#!/usr/bin/env bash
# `make demo`: gpucr's main job, end to end. A private gpucrd is started, a
# CUDA program runs under `gpucr run`, is dumped with CRIU (gpucr's plugin),
# killed, restored, and finishes; its output is compared with a run that was
# never interrupted, and the dump and restore times are printed.
#
# On a machine with an NVIDIA GPU the program is tests/gpu/cuda-prog (1 GiB
# of GPU memory, several streams). Without one, the same flow runs on
# gpucr's test driver (tests/fakecuda), which keeps "device" memory in host
# memory: it shows the plumbing, not GPU speed, and says so.
set -u
BUILD=${BUILD:-build}
B=$(cd "$BUILD" && pwd)
W=$(mktemp -d /tmp/gpucr-demo.XXXXXX)
export GPUCR_SOCKET=$W/gpucrd.sock CRIU_LIBS_DIR=$B/lib/criu PATH=$B/bin:$PATH

cleanup() {
	pkill -f "gpucrd --socket $GPUCR_SOCKET" 2>/dev/null
	rm -rf "$W"
}
trap cleanup EXIT
say() { printf '\n== %s\n' "$*"; }
now() { date +%s.%N; }
secs() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2f", b - a }'; }

[ "$(id -u)" = 0 ] || { echo "make demo needs root (CRIU dumps and restores processes)"; exit 1; }
criu_bin=$(command -v criu) || { echo "criu is not installed: run scripts/install-deps.sh"; exit 1; }
echo "gpucr demo: $("$criu_bin" --version | head -1) ($criu_bin), gpucr $("$B/bin/gpucr" --version | cut -d' ' -f2)"

if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1 && [ -x "$B/tests/gpu/cuda-prog" ]; then
	echo "GPU: $(nvidia-smi -L | head -1)"
	APP=("$B/tests/gpu/cuda-prog" --gib 1 --steps 40 --step-ms 50 --out)
	APP_ARGS_TAIL=()
else
	cat <<'TXT'
No NVIDIA GPU here. This demo runs the same flow on gpucr's test driver (tests/fakecuda):
"device" memory is host memory there, so it shows how the pieces work together,
not how fast they are on a GPU.
TXT
	export GPUCR_DRIVER_LIBCUDA=$B/fakecuda/libcuda.so.1 GPUCR_REAL_LIBCUDA=$B/fakecuda/libcuda.so.1
	export FAKECUDA_STATE_DIR=$W
	# The test driver runs "kernels" inside cuLaunchKernel on the CPU: give
	# quiesce a grace period longer than one of them.
	export GPUCR_QUIESCE_GRACE_MS=50
	APP=("$B/tests/e2e-fake-app")
	APP_ARGS_TAIL=(60 16)
fi

# The program with its arguments, as one script (exec keeps the pid).
app_script() { # out-file script
	{
		echo "#!/bin/sh"
		printf 'exec'
		printf " '%s'" "${APP[@]}" "$1" "${APP_ARGS_TAIL[@]}"
		echo
	} >"$2"
	chmod +x "$2"
}
APP_ARGS_TAIL=(${APP_ARGS_TAIL[@]+"${APP_ARGS_TAIL[@]}"})
app_script "$W/ref.out" "$W/ref.sh"
app_script "$W/run.out" "$W/app.sh"

say "1. an uninterrupted run, for reference"
GPUCR_DAEMON=0 LD_LIBRARY_PATH=$B/lib/gpucr "$W/ref.sh" || { echo "the reference run failed"; exit 1; }
echo "   $(grep -c ^step "$W/ref.out") steps, last: $(grep ^step "$W/ref.out" | tail -1)"

say "2. a private gpucrd"
"$B/bin/gpucrd" --socket "$GPUCR_SOCKET" --log "$W/gpucrd.log" </dev/null >/dev/null 2>&1 &
for _ in $(seq 1 100); do [ -S "$GPUCR_SOCKET" ] && break; sleep 0.05; done
echo "   socket $GPUCR_SOCKET, log $W/gpucrd.log"

say "3. the program under 'gpucr run', dumped at step 10, killed, restored"
cat >"$W/flow.sh" <<FLOW
set -u
now() { date +%s.%N; }
secs() { awk -v a="\$1" -v b="\$2" 'BEGIN { printf "%.2f", b - a }'; }
setsid $B/bin/gpucr run --socket $GPUCR_SOCKET -- $W/app.sh </dev/null >$W/app.log 2>&1 &
pid=\$!
disown \$pid
for i in \$(seq 1 1000); do [ -f $W/run.out ] && [ \$(grep -c ^step $W/run.out) -ge 10 ] && break; sleep 0.02; done
echo "   pid \$pid is at step \$(grep -c ^step $W/run.out); dumping"
t0=\$(now)
$B/bin/gpucr dump --pid \$pid -D $W/img || exit 1
t1=\$(now)
for i in \$(seq 1 200); do kill -0 \$pid 2>/dev/null || break; sleep 0.02; done
kill -0 \$pid 2>/dev/null && { echo "   the process survived its dump"; exit 1; }
echo "   dump took \$(secs \$t0 \$t1) s; the process is gone"
t2=\$(now)
$B/bin/gpucr restore -D $W/img || exit 1
t3=\$(now)
echo "   restore took \$(secs \$t2 \$t3) s; the process continues"
for i in \$(seq 1 3000); do grep -q '^done' $W/run.out 2>/dev/null && break; sleep 0.02; done
FLOW
"$B/tests/e2e-subreaper" bash "$W/flow.sh"
rc=$?

say "4. the result"
grep -E "released|restoring|loaded|running again" "$W/gpucrd.log" | sed 's/^/   /'
if [ $rc = 0 ] && cmp -s "$W/ref.out" "$W/run.out"; then
	echo "   every step after the restore matches the uninterrupted run ($(grep -c ^step "$W/run.out") steps)."
	exit 0
fi
echo "   FAILED: the output differs from the uninterrupted run or a step failed (exit $rc)"
diff "$W/ref.out" "$W/run.out" | head -5
exit 1
