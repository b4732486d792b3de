#!/usr/bin/env bash
# timeout: 240
# End to end on the test driver with real CRIU and gpucr's plugin: a CUDA
# application NOT started under gpucr (no shim: it runs on the test driver
# directly) is dumped and restored through the driver's own checkpoint API,
# the fallback that makes gpucr's plugin a superset of CRIU's cuda plugin.
# The application opts the test driver into behaving as the real one does
# here: a checkpoint keeps its device memory (FAKECUDA_CKPT_KEEPS_MEMORY),
# and the checkpoint API is served by a restore thread of the application
# that must be let run while CRIU holds it stopped (FAKECUDA_RESTORE_THREAD;
# a call made while that thread is stopped fails after a few seconds where
# the driver would wait for ever). Cases: dump, kill, restore (a) with gpucrd
# running (driver calls made by the daemon), (b) without gpucrd (made in
# CRIU's process), (c) --leave-running. Each run's output must equal an
# uninterrupted run's, and the plugin's log must show the driver's own
# checkpoint and restore were used. (d) gpucrd stopped (SIGSTOP): the
# plugin gives up on it within GPUCR_DAEMON_TIMEOUT_MS and makes the driver
# calls itself.
set -u
CR_NAME=plain
. "$(dirname "$0")/cr-common.bash"
APP_ENV=(env LD_LIBRARY_PATH=$B/fakecuda FAKECUDA_CKPT_KEEPS_MEMORY=1 FAKECUDA_RESTORE_THREAD=1)
STEPS=60
GPUCRD_ARGS=--verbose

# Reference output: the same application, never dumped.
"${APP_ENV[@]}" "$B/tests/e2e-fake-app" "$W/ref" $STEPS 4 || { echo "reference run failed"; exit 1; }

# One C/R flow under a subreaper. $1 name, $2 dump options. Writes
# $W/$1.out, and $W/$1.dumped with the pid once the dump is done.
flow() {
	local name=$1 dopts=$2
	mkdir -p "$W/$name"
	cat >"$W/$name.sh" <<FLOW
set -u
setsid ${APP_ENV[*]} $B/tests/e2e-fake-app $W/$name.out $STEPS 4 </dev/null >$W/$name.app.log 2>&1 &
pid=\$!
for i in \$(seq 1 400); do [ -f $W/$name.out ] && [ \$(wc -l <$W/$name.out) -ge 10 ] && break; sleep 0.02; done
criu dump -t \$pid -D $W/$name -o dump.log -v4 $dopts || { echo "dump failed"; exit 10; }
echo \$pid >$W/$name.dumped
if ! kill -0 \$pid 2>/dev/null; then
	wait \$pid 2>/dev/null
	criu restore -D $W/$name -o restore.log -v4 -d || { echo "restore failed"; exit 11; }
fi
for i in \$(seq 1 1500); do grep -q '^done' $W/$name.out 2>/dev/null && break; sleep 0.02; done
for i in \$(seq 1 100); do kill -0 \$pid 2>/dev/null || break; sleep 0.02; done
# One left blocked (a driver state not put back) would keep the subreaper waiting.
kill -0 \$pid 2>/dev/null && { echo "pid \$pid still running: killed"; kill -9 \$pid; }
FLOW
	"$B/tests/e2e-subreaper" bash "$W/$name.sh" >"$W/$name.flow.log" 2>&1
}

# The plugin's log says it took the driver's own path, at dump ($2 = dump)
# or at restore ($2 = restore).
check_driver_path() { # name dump|restore
	local log=$W/$1/$2.log want
	if [ "$2" = dump ]; then
		want="CUDA process not under gpucr: using the driver's own checkpoint"
	else
		want="restoring a CUDA process not under gpucr with the driver's own restore"
	fi
	if grep -q "gpucr: pid [0-9]*: $want" "$log" 2>/dev/null; then
		ok "$1: $2 through the driver's own checkpoint API"
	else
		bad "$1: the $2 log does not show the driver's own checkpoint API"
		show_logs "$1"
	fi
	if grep -q "gpucr: .*\(failed\|cannot\)" "$log" 2>/dev/null; then
		bad "$1: the plugin reported an error in its $2 log"
		grep "gpucr: .*\(failed\|cannot\)" "$log" | sed 's/^/    /'
	fi
}

# (a) gpucrd running: dump, kill, restore; the daemon makes the driver calls.
start_daemon
flow daemon ""
check_same daemon
check_driver_path daemon dump
check_driver_path daemon restore
pid=$(cat "$W/daemon.dumped" 2>/dev/null)
if grep -q "gpucr plugin .*gpucrd connected" "$W/daemon/dump.log" &&
	grep -q "pid $pid: driver checkpoint in" "$W/gpucrd.log" && grep -q "pid $pid: driver restore in" "$W/gpucrd.log"; then
	ok "daemon: gpucrd checkpointed and restored pid $pid"
else
	bad "daemon: gpucrd did not make the driver calls"
	show_logs daemon
fi

# (c) --leave-running: the process goes on, its driver state put back.
flow leave-running "-R"
check_same leave-running
check_driver_path leave-running dump
if grep -q "left running: putting its GPU state back" "$W/leave-running/dump.log"; then
	ok "leave-running: driver restore and unlock after the dump"
else
	bad "leave-running: the GPU state was not put back"
	show_logs leave-running
fi
stop_daemon

# (b) no gpucrd: the driver calls are made in CRIU's own process. Under
# ASan the test driver is instrumented and CRIU (not instrumented) cannot
# load it.
if ldd "$FAKE" | grep -q libasan; then
	echo "skip: no-daemon case under ASan (CRIU cannot load the instrumented test driver)"
else
	flow no-daemon ""
	check_same no-daemon
	check_driver_path no-daemon dump
	check_driver_path no-daemon restore
	if grep -q "gpucrd not running" "$W/no-daemon/dump.log" && grep -q "gpucrd not running" "$W/no-daemon/restore.log"; then
		ok "no-daemon: the plugin called the driver itself"
	else
		bad "no-daemon: the plugin did not run without gpucrd"
		show_logs no-daemon
	fi
fi

# (d) gpucrd stopped (SIGSTOP) for the whole C/R: the plugin waits for its
# silence no longer than GPUCR_DAEMON_TIMEOUT_MS (1 s here), says so, and
# makes the driver calls in CRIU's process, as without a daemon (it waited
# an hour before); gpucr ps says the same within the bound.
if ldd "$FAKE" | grep -q libasan; then
	echo "skip: stopped-daemon case under ASan (CRIU cannot load the instrumented test driver)"
else
	start_daemon
	dpid=$(pgrep -f "gpucrd --socket $GPUCR_SOCKET")
	kill -STOP $dpid
	export GPUCR_DAEMON_TIMEOUT_MS=1000
	t0=$(date +%s)
	flow stopped-daemon ""
	t1=$(date +%s)
	check_same stopped-daemon
	check_driver_path stopped-daemon dump
	check_driver_path stopped-daemon restore
	want="gpucrd at $GPUCR_SOCKET sent nothing for 1000 ms (GPUCR_DAEMON_TIMEOUT_MS)"
	if grep -qF "$want" "$W/stopped-daemon/dump.log" && grep -qF "$want" "$W/stopped-daemon/restore.log"; then
		ok "stopped-daemon: the plugin gave up on gpucrd after 1 s, and the C/R took $((t1 - t0)) s"
	else
		bad "stopped-daemon: the plugin did not say gpucrd was silent"
		show_logs stopped-daemon
	fi
	t0=$(date +%s.%N)
	"$B/bin/gpucr" ps >"$W/ps.out" 2>&1
	rc=$?
	t=$(awk -v s="$t0" -v e="$(date +%s.%N)" 'BEGIN { printf "%.1f", e - s }')
	if [ $rc != 0 ] && grep -qF "$want" "$W/ps.out" && awk -v t="$t" 'BEGIN { exit !(t < 5) }'; then
		ok "stopped-daemon: gpucr ps failed after $t s, naming the silence"
	else
		bad "stopped-daemon: gpucr ps (exit $rc, $t s): $(head -3 "$W/ps.out")"
	fi
	unset GPUCR_DAEMON_TIMEOUT_MS
	kill -CONT $dpid
	stop_daemon
fi

echo "$fails failure(s)"
[ $fails = 0 ]
