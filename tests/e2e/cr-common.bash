# Shared by the CRIU end-to-end scripts (sourced, not run): cleanup, result
# lines, a private gpucrd. Needs B (the build dir), W (a scratch dir) and
# GPUCR_SOCKET; GPUCRD_ARGS adds daemon options. Counts failures in $fails.
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
