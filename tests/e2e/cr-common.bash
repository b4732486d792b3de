# Shared by the CRIU end-to-end scripts (sourced after `set -u`, not run):
# the set-up, cleanup, result lines, a private gpucrd, a flow's output
# checked against the uninterrupted run (check_same). Set CR_NAME (the
# scratch dir's name) first. Sets B (the build dir), W (a scratch dir),
# FAKE (the test driver, for gpucrd and the application), GPUCR_SOCKET,
# CRIU's plugin dir and APP_ENV: the application under gpucr's shim on the
# test driver (a script may set its own afterwards). GPUCRD_ARGS adds
# daemon options. Counts failures in $fails.
B=$(cd "${BUILD:-build}" && pwd)
[ "$(id -u)" = 0 ] || { echo "skip: CRIU needs root"; exit 77; }
command -v criu >/dev/null || { echo "criu not installed: run scripts/install-deps.sh"; exit 1; }
W=$(mktemp -d "/tmp/gpucr-$CR_NAME.XXXXXX")
FAKE=$B/fakecuda/libcuda.so.1
export GPUCR_SOCKET=$W/gpucrd.sock GPUCR_DRIVER_LIBCUDA=$FAKE FAKECUDA_STATE_DIR=$W
export CRIU_LIBS_DIR=$B/lib/criu
# A grace period at quiesce well above one "kernel" of the test driver (a
# host function that runs inside cuLaunchKernel): see control.c on threads
# that passed the gate just before it closed.
APP_ENV=(env LD_LIBRARY_PATH=$B/lib/gpucr GPUCR_REAL_LIBCUDA=$FAKE GPUCR_QUIESCE_GRACE_MS=50)
fails=0

cleanup() {
	pkill -f "gpucrd --socket $GPUCR_SOCKET" 2>/dev/null
	[ -n "${GPUCR_TEST_KEEP:-}" ] || rm -rf "$W"
}
trap cleanup EXIT

ok() { echo "ok: $*"; }
bad() { echo "FAIL: $*"; fails=$((fails + 1)); }

start_daemon() {
	"$B/bin/gpucrd" --socket "$GPUCR_SOCKET" --log "$W/gpucrd.log" ${GPUCRD_ARGS:-} </dev/null >/dev/null 2>&1 &
	for _ in $(seq 1 100); do [ -S "$GPUCR_SOCKET" ] && return 0; sleep 0.05; done
	echo "gpucrd did not start"; cat "$W/gpucrd.log"; exit 1
}
stop_daemon() {
	pkill -f "gpucrd --socket $GPUCR_SOCKET"
	for _ in $(seq 1 100); do pgrep -f "gpucrd --socket $GPUCR_SOCKET" >/dev/null || break; sleep 0.05; done
	rm -f "$GPUCR_SOCKET"
}

# What a flow NAME left, for a failure: its flow and application logs,
# CRIU's gpucr lines and errors, gpucrd's last lines.
show_logs() { # name
	tail -5 "$W/$1.flow.log" "$W/$1.app.log" 2>/dev/null | sed 's/^/    /'
	grep -h "gpucr:\|Error" "$W/$1/dump.log" "$W/$1/restore.log" 2>/dev/null | tail -15 | sed 's/^/    criu| /'
	[ -f "$W/gpucrd.log" ] && tail -15 "$W/gpucrd.log" | sed 's/^/    gpucrd| /'
}
# Flow NAME's output ($W/NAME.out) against the uninterrupted run's ($W/ref).
check_same() { # name
	if cmp -s "$W/ref" "$W/$1.out"; then
		ok "$1: output identical to the uninterrupted run"
	else
		bad "$1: output differs: $(diff "$W/ref" "$W/$1.out" 2>&1 | head -4 | tr '\n' ' ')"
		show_logs "$1"
	fi
}
