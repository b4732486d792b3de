#!/usr/bin/env bash
# timeout: 120
# End to end on the test driver with real CRIU and gpucr's plugin: waits on
# a peer that stops answering are bounded, and the application survives
# them. A CUDA application under gpucr's shim is stopped (SIGSTOP) and
# dumped: its control thread cannot answer gpucrd's quiesce, so gpucrd
# gives up after the drain time plus GPUCR_SHIM_TIMEOUT_MS and the dump
# fails with a message saying so (it waited for ever before); once the
# application runs again (SIGCONT) it quiesces late, takes the Resume that
# followed, and finishes with the output of an uninterrupted run (the
# Resume was dropped by the shim before, leaving its gate closed).
set -u
CR_NAME=bound
. "$(dirname "$0")/cr-common.bash"
STEPS=40

"${APP_ENV[@]}" GPUCR_DAEMON=0 "$B/tests/e2e-fake-app" "$W/ref" $STEPS 4 || { echo "reference run failed"; exit 1; }

GPUCR_SHIM_TIMEOUT_MS=500 start_daemon
setsid "${APP_ENV[@]}" "$B/tests/e2e-fake-app" "$W/stopped.out" $STEPS 4 </dev/null >"$W/stopped.app.log" 2>&1 &
pid=$!
for _ in $(seq 1 400); do [ -f "$W/stopped.out" ] && [ "$(wc -l <"$W/stopped.out")" -ge 10 ] && break; sleep 0.02; done
grep -q "pid $pid .*attached" "$W/gpucrd.log" || { sleep 0.5; }
kill -STOP $pid
mkdir -p "$W/stopped"
t0=$(date +%s.%N)
# The quiesce gives the shim GPUCR_LOCK_TIMEOUT_MS to drain: 300 ms here.
GPUCR_LOCK_TIMEOUT_MS=300 criu dump -t $pid -D "$W/stopped" -o dump.log -v4 >"$W/stopped.criu.log" 2>&1
rc=$?
t=$(awk -v s="$t0" -v e="$(date +%s.%N)" 'BEGIN { printf "%.1f", e - s }')
want="did not answer quiesce within 800 ms"
if [ $rc != 0 ] && grep -q "gpucr: .*$want" "$W/stopped/dump.log" && awk -v t="$t" 'BEGIN { exit !(t < 10) }'; then
	ok "stopped: the dump failed after $t s, saying the process did not answer"
else
	bad "stopped: criu dump exit $rc after $t s; its log: $(grep -h "gpucr:" "$W/stopped/dump.log" | tail -3)"
fi
kill -CONT $pid
for _ in $(seq 1 1500); do grep -q '^done' "$W/stopped.out" 2>/dev/null && break; sleep 0.02; done
if cmp -s "$W/ref" "$W/stopped.out"; then
	ok "stopped: the application ran on to the end, output identical to the uninterrupted run"
else
	bad "stopped: output differs: $(diff "$W/ref" "$W/stopped.out" 2>&1 | head -4 | tr '\n' ' ')"
	tail -5 "$W/stopped.app.log" | sed 's/^/    app| /'
	tail -8 "$W/gpucrd.log" | sed 's/^/    gpucrd| /'
fi
kill -9 $pid 2>/dev/null
stop_daemon

echo "$fails failure(s)"
[ $fails = 0 ]
