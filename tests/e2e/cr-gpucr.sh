#!/usr/bin/env bash
# timeout: 300
# End to end on the test driver with real CRIU and gpucr's plugin: a CUDA
# application under gpucr's shim is dumped, killed and restored, and its
# output must equal an uninterrupted run's. Cases: restore from memory kept
# by gpucrd; --leave-running; gpucrd restarted between dump and restore
# (restore from the image, loaded while CRIU restores the CPU side); a
# damaged image refused (found while loading in the background, or before
# the restore starts with GPUCR_RESTORE_EARLY=0); gpucrd absent (the dump
# fails with a message and the application keeps running); a process tree
# with non-CUDA children; the image written in the background (its write
# held back until the driver is done, GPUCR_WRITE_AFTER_DRIVER=1); gpucr
# dump / restore; gpucr checkpoint (periodic, rotated, restored from latest);
# an application whose GPU memory is (all or partly) its own VMM memory,
# carried by the driver's checkpoint or, with GPUCR_APP_VMM=1, by gpucr's.
set -u
CR_NAME=cr
. "$(dirname "$0")/cr-common.bash"
STEPS=60

# Reference output, no daemon.
"${APP_ENV[@]}" GPUCR_DAEMON=0 "$B/tests/e2e-fake-app" "$W/ref" $STEPS 4 || { echo "reference run failed"; exit 1; }

# One C/R flow under a subreaper. $1 name, $2 dump options, $3 a function
# the outer script runs between dump and restore (daemons it starts must not
# be children of the subreaper, which waits for all its descendants), $4
# children. Writes $W/$1.out.
flow() {
	local name=$1 dopts=$2 between=$3 children=${4:-0} fpid
	mkdir -p "$W/$name"
	cat >"$W/$name.sh" <<FLOW
set -u
setsid ${APP_ENV[*]} $B/tests/e2e-fake-app $W/$name.out $STEPS 4 $children </dev/null >$W/$name.app.log 2>&1 &
pid=\$!
for i in \$(seq 1 400); do [ -f $W/$name.out ] && [ \$(wc -l <$W/$name.out) -ge 10 ] && break; sleep 0.02; done
criu dump -t \$pid -D $W/$name -o dump.log -v4 $dopts || { echo "dump failed"; exit 10; }
echo \$pid >$W/$name.dumped
for i in \$(seq 1 500); do [ -f $W/$name.go ] && break; sleep 0.02; done
if ! kill -0 \$pid 2>/dev/null; then
	wait \$pid 2>/dev/null
	criu restore -D $W/$name -o restore.log -v4 -d || { echo "restore failed"; exit 11; }
fi
for i in \$(seq 1 1500); do grep -q '^done' $W/$name.out 2>/dev/null && break; sleep 0.02; done
for i in \$(seq 1 100); do kill -0 \$pid 2>/dev/null || break; sleep 0.02; done
FLOW
	"$B/tests/e2e-subreaper" bash "$W/$name.sh" >"$W/$name.flow.log" 2>&1 &
	fpid=$!
	for _ in $(seq 1 1000); do [ -f "$W/$name.dumped" ] || ! kill -0 $fpid 2>/dev/null && break; sleep 0.02; done
	[ -n "$between" ] && [ -f "$W/$name.dumped" ] && $between "$(cat "$W/$name.dumped")" "$name"
	touch "$W/$name.go"
	wait $fpid
}

restart_daemon() { stop_daemon; start_daemon; }
damage_image() { # pid name
	restart_daemon
	printf '\xff' | dd of="$W/$2/gpucr-pages-$1.img" bs=1 seek=5000 conv=notrunc status=none
}


start_daemon

# 1. dump, kill, restore from the memory gpucrd kept.
flow kill-restore "" ""
check_same kill-restore
grep -q "restoring from retained GPU memory" "$W/gpucrd.log" && ok "kill-restore: zero-copy restore" ||
	bad "kill-restore: not restored from retained memory"
"$B/bin/gpucr" inspect --verify "$W/kill-restore" >/dev/null && ok "kill-restore: image verifies" ||
	bad "kill-restore: image does not verify"

# 2. --leave-running: the process goes on, same results, image complete.
flow leave-running "-R" ""
check_same leave-running
"$B/bin/gpucr" inspect --verify "$W/leave-running" >/dev/null && ok "leave-running: image verifies" ||
	bad "leave-running: image does not verify"

# 2b. The shim closes its connection to gpucrd just after it answers the
# release; CRIU, going on before that close, finds the socket among the
# process's files and refuses the dump ("External socket is used": seen in
# a periodic checkpoint on a loaded machine). A slow close must not matter.
APP_ENV+=(GPUCR_FI_RELEASE_CLOSE_MS=500)
flow slow-close "-R" ""
unset 'APP_ENV[${#APP_ENV[@]}-1]'
if grep -q "dump failed" "$W/slow-close.flow.log"; then
	bad "slow-close: the dump failed: $(grep -h 'Error' "$W/slow-close/dump.log" | head -2 | tr '\n' ' ')"
else
	check_same slow-close
fi

# 2c. The driver's checkpoint fails (in gpucrd, which makes the driver
# calls of a process under gpucr): CRIU's dump fails in its pause hook,
# before it has seized the process, and the process must go on with its
# memory: unlocked by the driver, woken, mapped back. The plugin used to
# try the restore thread's ptrace dance on a process CRIU did not hold,
# fail at it, and leave the process locked: its next CUDA call waited for
# ever.
stop_daemon
FAKECUDA_FAIL=cuCheckpointProcessCheckpoint start_daemon
setsid "${APP_ENV[@]}" "$B/tests/e2e-fake-app" "$W/ckfail.out" $STEPS 4 </dev/null >"$W/ckfail.app.log" 2>&1 &
ckpid=$!
for _ in $(seq 1 400); do [ -f "$W/ckfail.out" ] && [ "$(wc -l <"$W/ckfail.out")" -ge 10 ] && break; sleep 0.02; done
mkdir -p "$W/ckfail"
if criu dump -t $ckpid -D "$W/ckfail" -o dump.log -v4 >/dev/null 2>&1; then
	bad "ckpt-fail: the dump succeeded although the driver's checkpoint failed"
fi
for _ in $(seq 1 750); do grep -q '^done' "$W/ckfail.out" 2>/dev/null && break; sleep 0.02; done
if grep -q '^done' "$W/ckfail.out" && cmp -s "$W/ref" "$W/ckfail.out"; then
	ok "ckpt-fail: a failed driver checkpoint failed the dump, and the process went on to the same results"
else
	bad "ckpt-fail: after a failed driver checkpoint the process did not finish (or differs) within 15 s"
	grep gpucr "$W/ckfail/dump.log" | tail -5 | sed 's/^/    /'
	tail -3 "$W/ckfail.app.log" | sed 's/^/    /'
fi
kill -9 $ckpid 2>/dev/null
wait $ckpid 2>/dev/null
restart_daemon

# 3. gpucrd restarted between dump and restore: restore from the image.
flow daemon-restart "" restart_daemon
check_same daemon-restart
grep -q "loaded from the image" "$W/gpucrd.log" && ok "daemon-restart: restored from the image" ||
	bad "daemon-restart: the image was not loaded"
# The load overlapped CRIU's own restore: started at init, waited for in the late hook.
if grep -q "loading its .* MiB of GPU memory while CRIU restores the rest" "$W/daemon-restart/restore.log" &&
	grep -q "GPU memory loaded from the image and checked" "$W/daemon-restart/restore.log"; then
	ok "daemon-restart: the image was loaded while CRIU restored the CPU side"
else
	bad "daemon-restart: the image was not loaded in the background"
	grep gpucr "$W/daemon-restart/restore.log" | sed 's/^/    /'
fi

# 3b. The driver's restore of the process's context runs while gpucrd is
# still loading the image, not after the load: with a slow load (each
# slice held 1.5 s) and a slow driver restore (0.3 s), the restore is logged
# done before the load.
restart_slow_load() {
	stop_daemon
	GPUCR_LOG=debug FAKECUDA_CKPT_DELAY_MS=300 GPUCR_FI_SLICE_DELAY_MS=1500 start_daemon
}
flow overlap "" restart_slow_load
check_same overlap
opid=$(cat "$W/overlap.dumped" 2>/dev/null)
rl=$(grep -n "pid $opid: driver restore in" "$W/gpucrd.log" | tail -1 | cut -d: -f1)
ll=$(grep -n "pid $opid: .* loaded from the image" "$W/gpucrd.log" | tail -1 | cut -d: -f1)
if [ -n "$rl" ] && [ -n "$ll" ] && [ "$rl" -lt "$ll" ]; then
	ok "overlap: the driver's restore ran while the image was still loading"
else
	bad "overlap: the driver's restore did not overlap the load (restore line ${rl:-none}, load line ${ll:-none})"
	grep -n "pid $opid" "$W/gpucrd.log" | tail -8 | sed 's/^/    /'
fi
restart_daemon

# 4. a damaged image is refused, with the reason in CRIU's log.
flow damaged "" damage_image
if grep -q "restore failed" "$W/damaged.flow.log" && grep -q "fingerprint mismatch" "$W/damaged/restore.log"; then
	ok "damaged: restore refused: $(grep -o 'fingerprint mismatch[^;]*' "$W/damaged/restore.log" | head -1)"
else
	bad "damaged: restore was not refused as it should be"
	tail -5 "$W/damaged.flow.log" "$W/damaged/restore.log" | sed 's/^/    /'
fi
# The damage is found while loading in the background: the restored process
# is killed before it runs, and CRIU fails the restore.
dpid=$(cat "$W/damaged.dumped" 2>/dev/null)
if grep -q "killing it so that it does not run without it" "$W/damaged/restore.log" && grep -q "Restoring FAILED" "$W/damaged/restore.log" &&
	! kill -0 "$dpid" 2>/dev/null; then
	ok "damaged: the process was not left running without its memory"
else
	bad "damaged: no kill and failed restore after the background load failed"
fi
# 4b. the same with the load done before CRIU starts (GPUCR_RESTORE_EARLY=0):
# refused before any process is created.
GPUCR_RESTORE_EARLY=0 flow damaged-sync "" damage_image
if grep -q "restore failed" "$W/damaged-sync.flow.log" && grep -q "fingerprint mismatch" "$W/damaged-sync/restore.log" &&
	! grep -q "killing it" "$W/damaged-sync/restore.log"; then
	ok "damaged-sync: refused when the restore started"
else
	bad "damaged-sync: restore was not refused at its start"
	tail -5 "$W/damaged-sync.flow.log" "$W/damaged-sync/restore.log" | sed 's/^/    /'
fi

# 5. gpucrd absent: the dump fails and says why; the application goes on.
stop_daemon
start_daemon
cat >"$W/absent.sh" <<FLOW
set -u
setsid ${APP_ENV[*]} $B/tests/e2e-fake-app $W/absent.out $STEPS 4 </dev/null >$W/absent.app.log 2>&1 &
pid=\$!
for i in \$(seq 1 400); do [ -f $W/absent.out ] && [ \$(wc -l <$W/absent.out) -ge 10 ] && break; sleep 0.02; done
pkill -f 'gpucrd --socket $GPUCR_SOCKET'; sleep 0.3
mkdir -p $W/absent
if criu dump -t \$pid -D $W/absent -o dump.log -v4; then echo "dump succeeded without gpucrd"; exit 12; fi
for i in \$(seq 1 1500); do grep -q '^done' $W/absent.out 2>/dev/null && break; sleep 0.02; done
wait \$pid
FLOW
"$B/tests/e2e-subreaper" bash "$W/absent.sh" >"$W/absent.flow.log" 2>&1
if grep -q "gpucrd does not answer" "$W/absent/dump.log"; then ok "absent: dump refused with a message"; else
	bad "absent: no message naming the missing daemon"; tail -5 "$W/absent/dump.log" "$W/absent.flow.log" | sed 's/^/    /'; fi
check_same absent
rm -f "$GPUCR_SOCKET"
start_daemon

# 6. a process tree: the CUDA process and two plain children. Under ASan
# the restore of the forked tree dies with SIGSEGV in CRIU's restore stage
# before gpucr's hooks run (ASan's runtime in the children), so it is left
# to the normal build.
if ldd "$B/tests/e2e-fake-app" | grep -q libasan; then
	echo "skip: tree under ASan (CRIU cannot restore ASan-instrumented process trees here)"
else
	flow tree "" "" 2
	check_same tree
fi

# 7. the image written in the background (GPUCR_IMAGE_WAIT=0): CRIU does not
# wait for it, a restore right away gets the retained memory (the image is
# made slow on purpose), and the process maps it once the image is done.
# By default (GPUCR_WRITE_AFTER_DRIVER unset) the write waits for the
# driver's checkpoint, which the plugin asks for right after the release
# (the test driver's checkpoint and restore made to take 0.3 s, like the
# driver's).
stop_daemon
unset GPUCR_WRITE_AFTER_DRIVER
GPUCR_LOG=debug FAKECUDA_CKPT_DELAY_MS=300 GPUCR_FI_IMAGE_DELAY_MS=1500 start_daemon
GPUCR_IMAGE_WAIT=0 flow background "" ""
check_same background
bgpid=$(cat "$W/background.dumped" 2>/dev/null)
if awk -v p="pid $bgpid " 'index($0, p) && /restoring from retained/ { r = NR } index($0, p) && /GPU image written/ { w = NR } END { exit !(r && w && r < w) }' "$W/gpucrd.log"; then
	ok "background: restored from retained memory before its image was complete"
else
	bad "background: the restore did not overlap the image write"
	grep "pid $bgpid " "$W/gpucrd.log" | sed 's/^/    gpucrd| /'
fi
# first_lines PID PATTERN...: the line number of the first gpucrd log line of
# PID matching each PATTERN, in order (0: none).
first_lines() {
	local p=$1
	shift
	for pat in "$@"; do
		awk -v p="pid $p: " -v re="$pat" 'index($0, p) && $0 ~ re { print NR; f = 1; exit } END { if (!f) print 0 }' "$W/gpucrd.log"
	done | tr '\n' ' '
}
read -r fpl ckl wrl <<<"$(first_lines "$bgpid" "fingerprints at T done" "driver checkpoint in" "D2H write started")"
if grep -q "pid $bgpid: image write held back .* until the driver's checkpoint was done" "$W/gpucrd.log" &&
	[ "$fpl" -gt 0 ] && [ "$fpl" -lt "$ckl" ] && [ "$ckl" -lt "$wrl" ]; then
	ok "background: fingerprints, then the driver's checkpoint, then the image write (gpucrd's default)"
else
	bad "background: the image write did not wait for the driver's checkpoint (lines $fpl $ckl $wrl)"
	grep "pid $bgpid" "$W/gpucrd.log" | sed 's/^/    gpucrd| /'
fi
stop_daemon
start_daemon
for _ in $(seq 1 250); do ls "$W"/background/gpucr-*.img >/dev/null 2>&1 && break; sleep 0.02; done
"$B/bin/gpucr" inspect --verify "$W/background" >/dev/null && ok "background: image complete and verifies" ||
	bad "background: image missing or damaged"

# 8. gpucr dump / gpucr restore: CRIU runs without waiting for the image,
# the command waits for it, showing progress, and reports (the image write
# is slowed down so there is progress to show).
stop_daemon
GPUCR_FI_IMAGE_DELAY_MS=2500 start_daemon
cat >"$W/cli.sh" <<FLOW
set -u
setsid $B/bin/gpucr run --socket $GPUCR_SOCKET -- env GPUCR_REAL_LIBCUDA=$FAKE $B/tests/e2e-fake-app $W/cli.out $STEPS 4 </dev/null >$W/cli.app.log 2>&1 &
pid=\$!
for i in \$(seq 1 400); do [ -f $W/cli.out ] && [ \$(wc -l <$W/cli.out) -ge 10 ] && break; sleep 0.02; done
$B/bin/gpucr dump --json --pid \$pid -D $W/cli >$W/cli.json || exit 10
for i in \$(seq 1 100); do kill -0 \$pid 2>/dev/null || break; sleep 0.02; done
$B/bin/gpucr restore --json -D $W/cli >>$W/cli.json || exit 11
for i in \$(seq 1 1500); do grep -q '^done' $W/cli.out 2>/dev/null && break; sleep 0.02; done
FLOW
"$B/tests/e2e-subreaper" bash "$W/cli.sh" >"$W/cli.flow.log" 2>&1
grep -q "GPU image of pid .* complete" "$W/cli.flow.log" && ok "cli: gpucr dump waited for the GPU image" ||
	{ bad "cli: no image completion reported"; tail -8 "$W/cli.flow.log" | sed 's/^/    /'; }
grep -Eq "writing 1 GPU image\(s\): [0-9.]+ of [0-9.]+ (MiB|GiB), " "$W/cli.flow.log" && ok "cli: progress shown while the image was written" ||
	{ bad "cli: no progress line"; tail -8 "$W/cli.flow.log" | sed 's/^/    /'; }
check_same cli
# --json: stdout holds one object per command and nothing else.
if [ "$(wc -l <"$W/cli.json")" = 2 ] && grep -q '^{"command":"dump","pid":[0-9]*,.*"result":"ok"' "$W/cli.json" &&
	grep -q '^{"command":"restore",.*"result":"ok"' "$W/cli.json"; then
	ok "cli: --json gives one object per command on stdout"
else
	bad "cli: --json output: $(tr '\n' ' ' <"$W/cli.json")"
fi
stop_daemon
start_daemon

# 9. gpucr checkpoint: three checkpoints of the running process 0.2 s apart,
# the newest two kept; then the process is killed and restored from
# DIR/latest, and every line it wrote, before and after, is the
# uninterrupted run's. (Its stdout goes to /dev/null: CRIU refuses to
# restore a process whose open log file grew after the checkpoint.)
CK_STEPS=200
"${APP_ENV[@]}" GPUCR_DAEMON=0 "$B/tests/e2e-fake-app" "$W/ref-ck" $CK_STEPS 4 || { echo "reference run failed"; exit 1; }
cat >"$W/ck.sh" <<FLOW
set -u
setsid $B/bin/gpucr run --socket $GPUCR_SOCKET -- env GPUCR_REAL_LIBCUDA=$FAKE GPUCR_QUIESCE_GRACE_MS=50 $B/tests/e2e-fake-app $W/ck.out $CK_STEPS 4 </dev/null >/dev/null 2>&1 &
pid=\$!
for i in \$(seq 1 400); do [ -f $W/ck.out ] && [ \$(wc -l <$W/ck.out) -ge 10 ] && break; sleep 0.02; done
$B/bin/gpucr checkpoint --pid \$pid -D $W/ckpts --every 0.2 --count 3 --keep 2 --json >$W/ck.json || exit 10
kill -9 \$pid; wait \$pid 2>/dev/null
$B/bin/gpucr restore -D $W/ckpts/latest || exit 11
for i in \$(seq 1 1500); do grep -q '^done' $W/ck.out 2>/dev/null && break; sleep 0.02; done
FLOW
"$B/tests/e2e-subreaper" bash "$W/ck.sh" >"$W/ck.flow.log" 2>&1
if [ "$(grep -c '"result":"ok"' "$W/ck.json")" = 3 ] &&
	[ "$(cd "$W/ckpts" && echo ckpt-* .ckpt-*)" = "ckpt-0002 ckpt-0003 .ckpt-*" ] &&
	[ "$(readlink "$W/ckpts/latest")" = ckpt-0003 ]; then
	ok "checkpoint: 3 made, the newest 2 kept, latest -> ckpt-0003, nothing partial left"
else
	bad "checkpoint: unexpected checkpoints: $(ls -a "$W/ckpts" | tr '\n' ' '); $(tr '\n' ' ' <"$W/ck.json")"
	tail -8 "$W/ck.flow.log" | sed 's/^/    /'
fi
if grep -q '^done' "$W/ck.out" && [ "$(sort -u "$W/ck.out")" = "$(sort -u "$W/ref-ck")" ]; then
	ok "checkpoint: restored from latest; every step before and after identical to the uninterrupted run"
else
	bad "checkpoint: output after the restore from latest differs: $(diff <(sort -u "$W/ref-ck") <(sort -u "$W/ck.out") | head -4 | tr '\n' ' ')"
	tail -8 "$W/ck.flow.log" | sed 's/^/    /'
fi

# 10-11. concurrent checkpoints (gpucr dump --leave-running): the process runs
# again as soon as CRIU is done, in a save epoch, while gpucrd writes its
# memory slowly (fault injection); calls that write chunks not yet saved
# wait for them, and gpucrd saves those first. The image must hold the state
# at T: the process is then killed and restored from it, and every line it
# wrote must match the uninterrupted run's. In 11 a kernel writes through a
# pointer held in device memory, which no decoding predicts: the saved
# chunk no longer matches its fingerprint at T, the checkpoint is refused,
# naming the functions launched in the epoch, and retried with the process
# stopped, and the final image is correct; the process's next checkpoint
# runs it again, holding those functions' launches, and is restored from.
stop_daemon
GPUCR_SPARE=0 GPUCR_FI_SLICE_DELAY_MS=300 start_daemon
"${APP_ENV[@]}" GPUCR_DAEMON=0 FAKE_APP_ESCAPE=1 "$B/tests/e2e-fake-app" "$W/ref-esc" $CK_STEPS 4 || { echo "reference run failed"; exit 1; }
# Kills a process (SIGKILL) at a moment when none of its threads is inside
# a call of the test driver: the driver counts the calls in flight in its
# state file ($W/fakecuda-ckpt-PID, `active` of struct fk_page at offset 16,
# tests/fakecuda/internal.h), which outlives the process, so one killed
# inside a call could never be locked for a checkpoint again once restored
# (the real driver keeps that state in the process's memory).
cat >"$W/kill-quiet.sh" <<'KQ'
pid=$1 page=$2/fakecuda-ckpt-$1
[ -f "$page" ] || { kill -KILL "$pid" 2>/dev/null; exit 0; }
for _ in $(seq 1 200); do
	kill -STOP "$pid" 2>/dev/null || exit 0
	for _ in $(seq 1 100); do
		all=1
		for s in /proc/$pid/task/*/stat; do
			st=$(sed 's/.*) //' "$s" 2>/dev/null | cut -d' ' -f1)
			case $st in T | t | Z | X | '') ;; *) all=0 ;; esac
		done
		[ $all = 1 ] && break
		sleep 0.002
	done
	if [ "$(od -An -t d4 -j 16 -N 4 "$page" 2>/dev/null | tr -d ' ')" = 0 ]; then
		kill -KILL "$pid"
		exit 0
	fi
	kill -CONT "$pid"
	sleep 0.00$((RANDOM % 9 + 1))
done
kill -KILL "$pid"
KQ
conc_case() { # name escape(0|1) reference
	local name=$1 esc=$2 ref=$3 cpid
	cat >"$W/$name.sh" <<FLOW
set -u
setsid $B/bin/gpucr run --socket $GPUCR_SOCKET -- env GPUCR_REAL_LIBCUDA=$FAKE GPUCR_QUIESCE_GRACE_MS=50 FAKE_APP_ESCAPE=$esc $B/tests/e2e-fake-app $W/$name.out $CK_STEPS 4 </dev/null >/dev/null 2>&1 &
pid=\$!
echo \$pid >$W/$name.pid
for i in \$(seq 1 400); do [ -f $W/$name.out ] && [ \$(wc -l <$W/$name.out) -ge 10 ] && break; sleep 0.02; done
$B/bin/gpucr dump --pid \$pid -D $W/$name -R >$W/$name.dump.out 2>&1 || exit 10
bash $W/kill-quiet.sh \$pid $W; wait \$pid 2>/dev/null
$B/bin/gpucr restore -D $W/$name || exit 11
if [ $esc = 1 ]; then # a second checkpoint of the restored process, and a restore from it
	sleep 0.3
	$B/bin/gpucr dump --pid \$pid -D $W/$name-2 -R >$W/$name.dump2.out 2>&1 || exit 12
	bash $W/kill-quiet.sh \$pid $W
	for i in \$(seq 1 250); do kill -0 \$pid 2>/dev/null || break; sleep 0.02; done
	$B/bin/gpucr restore -D $W/$name-2 || exit 13
fi
for i in \$(seq 1 1500); do grep -q '^done' $W/$name.out 2>/dev/null && break; sleep 0.02; done
FLOW
	"$B/tests/e2e-subreaper" bash "$W/$name.sh" >"$W/$name.flow.log" 2>&1
	cpid=$(cat "$W/$name.pid" 2>/dev/null)
	if grep -q '^done' "$W/$name.out" && [ "$(sort -u "$W/$name.out")" = "$(sort -u "$ref")" ]; then
		ok "$name: restored from the checkpoint; every step before and after identical to the uninterrupted run"
	else
		bad "$name: output after the restore differs: $(diff <(sort -u "$ref") <(sort -u "$W/$name.out") | head -4 | tr '\n' ' ')"
		tail -8 "$W/$name.flow.log" "$W/$name.dump.out" | sed 's/^/    /'
		grep "pid $cpid" "$W/gpucrd.log" | tail -8 | sed 's/^/    gpucrd| /'
	fi
}
conc_case concurrent 0 "$W/ref-ck"
cpid=$(cat "$W/concurrent.pid" 2>/dev/null)
if awk -v p="pid $cpid " 'index($0, p) && /running again while its GPU memory is saved/ && !r { r = NR } index($0, p) && /GPU image written/ && !w { w = NR } END { exit !(r && w && r < w) }' "$W/gpucrd.log"; then
	ok "concurrent: the process ran again before its image was written"
else
	bad "concurrent: no save epoch overlapping the image write"
	grep "pid $cpid " "$W/gpucrd.log" | sed 's/^/    gpucrd| /'
fi
! grep -q "retrying" "$W/concurrent.dump.out" && ok "concurrent: no retry needed" || bad "concurrent: retried without an escape"
conc_case escape 1 "$W/ref-esc"
epid=$(cat "$W/escape.pid" 2>/dev/null)
if grep -q "pid $epid .*escaped prediction" "$W/gpucrd.log" && grep -q "retrying with the process stopped" "$W/escape.dump.out"; then
	ok "escape: the unpredicted write was detected and the checkpoint retried with the process stopped"
else
	bad "escape: the unpredicted write was not detected"
	cat "$W/escape.dump.out" | sed 's/^/    /'
	grep "pid $epid " "$W/gpucrd.log" | sed 's/^/    gpucrd| /'
fi
# The failure names the suspects: the functions the process launched in the
# epoch (the kernel that wrote through the pointer among them), in gpucrd's
# log and in what gpucr dump said.
if grep -q "pid $epid (.*): buffer 0x.*escaped prediction.*; suspects: .*escape.* (functions\? launched since the cut)" "$W/gpucrd.log" &&
	grep -q "the GPU image was not written: .*; suspects: .*escape" "$W/escape.dump.out"; then
	ok "escape: the suspects were named: $(grep -o 'suspects: [^(]*' "$W/escape.dump.out" | head -1)"
else
	bad "escape: the suspect functions were not named"
	grep "pid $epid[ :]" "$W/gpucrd.log" | sed 's/^/    gpucrd| /'
fi
# They are remembered in the process (the restored one too): its next
# checkpoint (no room on the GPU for a copy here) runs it in a save epoch
# again, holding their launches until its memory is saved; it needs no
# retry, and the process restored from it finishes as the uninterrupted run
# did (checked above).
if awk -v p="pid $epid " 'index($0, p) && /escaped prediction in an earlier checkpoint: this one runs it while its memory is saved/ && !e { e = NR }
	index($0, p) && /running again while its GPU memory is saved/ && e && NR > e { r = 1 } END { exit !r }' "$W/gpucrd.log" &&
	grep -q "pid $epid: \(escape\|step\) launched during a save epoch: held until the epoch is saved (it escaped prediction before)" "$W/gpucrd.log" &&
	! grep -q "retrying" "$W/escape.dump2.out" && "$B/bin/gpucr" inspect --verify "$W/escape-2" >/dev/null &&
	"$B/bin/gpucr" inspect --json "$W/escape-2" | grep -q '"escaped":true'; then
	ok "escape: the next checkpoint ran the process in a save epoch with the suspects held, needed no retry, and its image verifies"
else
	bad "escape: the next checkpoint after an escape"
	cat "$W/escape.dump2.out" 2>/dev/null | sed 's/^/    /'
	grep "pid $epid[ :]" "$W/gpucrd.log" | tail -12 | sed 's/^/    gpucrd| /'
fi
# 12. the same with room on the GPU: the memory is copied device to device
# at T, so the process waits for nothing and a write through a pointer held
# in device memory after T does not matter (no retry). With
# GPUCR_WRITE_AFTER_DRIVER=1 the image is written from that copy only after
# the driver's unlock (the process runs again); the copy stays at T (the
# test driver's checkpoint and restore take 0.3 s each here).
stop_daemon
GPUCR_WRITE_AFTER_DRIVER=1 GPUCR_LOG=debug FAKECUDA_CKPT_DELAY_MS=300 GPUCR_SPARE_MARGIN_MB=0 GPUCR_FI_SLICE_DELAY_MS=300 start_daemon
conc_case spare 1 "$W/ref-esc"
spid=$(cat "$W/spare.pid" 2>/dev/null)
if grep -q "pid $spid: .* copied to spare GPU memory at T" "$W/gpucrd.log" && ! grep -q "retrying" "$W/spare.dump.out"; then
	ok "spare: copied on the GPU at T, nothing to retry"
else
	bad "spare: no copy to spare GPU memory at T, or a retry"
	cat "$W/spare.dump.out" | sed 's/^/    /'
	grep "pid $spid" "$W/gpucrd.log" | sed 's/^/    gpucrd| /'
fi
read -r spl unl wrl <<<"$(first_lines "$spid" "spare copy done" "driver unlock in" "D2H write started: .* from the spare copy")"
if grep -q "pid $spid: image write held back .* until the driver's unlock was done" "$W/gpucrd.log" &&
	[ "$spl" -gt 0 ] && [ "$spl" -lt "$unl" ] && [ "$unl" -lt "$wrl" ]; then
	ok "spare: copied at T, then the driver's unlock, then the image written from the copy (GPUCR_WRITE_AFTER_DRIVER=1)"
else
	bad "spare: the image write did not wait for the driver's unlock (lines $spl $unl $wrl)"
	grep "pid $spid" "$W/gpucrd.log" | sed 's/^/    gpucrd| /'
fi
stop_daemon
start_daemon

# 13. an application that allocates its GPU memory itself through the
# driver's VMM calls, as PyTorch does with expandable_segments:True
# (FAKE_APP_VMM=2: all of it, no cuMemAlloc; 1: its large buffers). The
# shim passes those calls through: gpucr owns none or little of its memory,
# and the rest is carried by the driver's checkpoint (the test driver's
# keeps it, FAKECUDA_CKPT_KEEPS_MEMORY=1, as the driver moves it to host
# memory and back). A process with no buffer of gpucr's used to take the
# shim's "memory lost" path at its reattach, and its restore from memory
# kept while its image was still being written was refused.
APP_ENV+=(FAKECUDA_CKPT_KEEPS_MEMORY=1 FAKECUDA_RESTORE_THREAD=1 FAKE_APP_VMM=2)
vmm_checks() { # name
	local p
	p=$(cat "$W/$1.dumped" 2>/dev/null)
	check_same "$1"
	if grep -q "memory is lost\|error" "$W/$1.app.log"; then
		bad "$1: the shim did not get its (empty) memory back: $(grep -m1 'lost\|error' "$W/$1.app.log")"
	elif grep -q "resumed" "$W/$1.app.log" && grep -q "pid $p (.*): running again" "$W/gpucrd.log"; then
		ok "$1: resumed by gpucrd after the restore"
	else
		bad "$1: not resumed by gpucrd"
		grep "pid $p" "$W/gpucrd.log" | tail -6 | sed 's/^/    gpucrd| /'
	fi
}
flow vmm-kill-restore "" ""
vmm_checks vmm-kill-restore
grep -q "pid $(cat "$W/vmm-kill-restore.dumped" 2>/dev/null) (.*): restoring from retained GPU memory (0 MiB" "$W/gpucrd.log" &&
	ok "vmm-kill-restore: restored from the (empty) memory gpucrd kept" || bad "vmm-kill-restore: not restored from retained memory"
# The driver's checkpoint outlasts the shim's 1 s reconnect (it moves the
# memory gpucr does not own: 1.7 s for PyTorch's ~3 GB with expandable
# segments on an H200), and the (empty) image is complete long before.
# The shim's reconnect must be refused until CRIU is done with the process:
# let in, its socket made CRIU's dump fail, and its remap ran into the
# driver's lock.
stop_daemon
FAKECUDA_CKPT_DELAY_MS=1600 start_daemon
saved_env=("${APP_ENV[@]}")
APP_ENV+=(GPUCR_LOG=debug)
flow vmm-slow-driver "" ""
APP_ENV=("${saved_env[@]}")
vmm_checks vmm-slow-driver
grep -q "gpucrd refused hello: pid [0-9]*: its dump is still running" "$W/vmm-slow-driver.app.log" &&
	ok "vmm-slow-driver: the shim's reconnect during the driver's checkpoint was refused until CRIU was done" ||
	bad "vmm-slow-driver: the shim was not kept out while CRIU worked on the process (the race was not hit?)"
restart_daemon
flow vmm-daemon-restart "" restart_daemon
vmm_checks vmm-daemon-restart
grep -q "pid $(cat "$W/vmm-daemon-restart.dumped" 2>/dev/null): 0 MiB loaded from the image" "$W/gpucrd.log" &&
	ok "vmm-daemon-restart: restored from the image" || bad "vmm-daemon-restart: the image was not loaded"
APP_ENV[${#APP_ENV[@]}-1]=FAKE_APP_VMM=1
flow vmm-mixed "" restart_daemon
vmm_checks vmm-mixed
grep -q "released [1-9][0-9]* chunk(s)" "$W/vmm-mixed.app.log" && grep -q "mapped back at its addresses" "$W/vmm-mixed.app.log" &&
	ok "vmm-mixed: the shim's own buffers were released and mapped back" || bad "vmm-mixed: the shim's buffers were not released and mapped back"
APP_ENV[${#APP_ENV[@]}-1]=FAKE_APP_VMM=2
# Restored from the memory kept while the image is still being written.
stop_daemon
GPUCR_FI_IMAGE_DELAY_MS=1500 start_daemon
GPUCR_IMAGE_WAIT=0 flow vmm-background "" ""
vmm_checks vmm-background
# The driver's restore fails (after a gpucrd restart): the driver still
# holds the process, whose next CUDA call would wait for ever. It is killed
# in the late hook and the restore fails, instead of a restored process
# that hangs.
restart_drv_fail() { stop_daemon; FAKECUDA_FAIL=cuCheckpointProcessRestore start_daemon; }
flow vmm-drv-fail "" restart_drv_fail
fpid=$(cat "$W/vmm-drv-fail.dumped" 2>/dev/null)
if grep -q "restore failed" "$W/vmm-drv-fail.flow.log" && grep -q "did not give its CUDA state back" "$W/vmm-drv-fail/restore.log" &&
	! kill -0 "$fpid" 2>/dev/null; then
	ok "vmm-drv-fail: $(grep -o 'pid [0-9]*: the driver did not give[^;]*' "$W/vmm-drv-fail/restore.log" | head -1)"
else
	bad "vmm-drv-fail: a failed driver restore did not fail the restore"
	tail -5 "$W/vmm-drv-fail.flow.log" | sed 's/^/    /'
	grep gpucr "$W/vmm-drv-fail/restore.log" | sed 's/^/    /'
	kill -9 "$fpid" 2>/dev/null
fi
restart_daemon

# 14. the same application with GPUCR_APP_VMM=1: the shim tracks its VMM
# calls (virtual handles), and every handle it maps whole becomes a buffer
# of gpucr's, released to gpucrd at the dump and mapped back at restore.
# The test driver's checkpoint is the strict one here (no
# FAKECUDA_CKPT_KEEPS_MEMORY): it refuses a process that still holds device
# memory, so the dump passes only if the shim really gave all of it to
# gpucrd. The application holds its handles (FAKE_APP_VMM_HOLD=1) and at
# the end unmaps, maps again and releases them with their old values; with
# FAKE_APP_VMM=1 it releases each handle once mapped (the mapping keeps the
# memory) and its small buffers are cuMemAlloc'd.
APP_ENV=(env LD_LIBRARY_PATH=$B/lib/gpucr GPUCR_REAL_LIBCUDA=$FAKE GPUCR_QUIESCE_GRACE_MS=50
	FAKECUDA_RESTORE_THREAD=1 GPUCR_APP_VMM=1 GPUCR_LOG=debug FAKE_APP_VMM_HOLD=1 FAKE_APP_VMM=2)
appvmm_checks() { # name
	vmm_checks "$1"
	if grep -q "): adopted$" "$W/$1.app.log" && grep -q "released [1-9][0-9]* chunk(s)" "$W/$1.app.log" &&
		grep -q "mapped back at its addresses ([1-9][0-9]* chunks)" "$W/$1.app.log"; then
		ok "$1: the application's VMM memory was adopted, released to gpucrd and mapped back ($(grep -o 'released [0-9]* chunk(s)' "$W/$1.app.log" | head -1))"
	else
		bad "$1: the application's VMM memory was not released to gpucrd and mapped back"
		grep "adopted\|released\|mapped back\|fake-app\|fakecuda" "$W/$1.app.log" "$W/$1.flow.log" | tail -6 | sed 's/^/    /'
	fi
}
flow appvmm-kill-restore "" ""
appvmm_checks appvmm-kill-restore
grep -q "pid $(cat "$W/appvmm-kill-restore.dumped" 2>/dev/null) (.*): restoring from retained GPU memory ([1-9][0-9]* MiB" "$W/gpucrd.log" &&
	ok "appvmm-kill-restore: restored from the memory gpucrd kept" || bad "appvmm-kill-restore: not restored from retained memory"
flow appvmm-daemon-restart "" restart_daemon
appvmm_checks appvmm-daemon-restart
grep -q "pid $(cat "$W/appvmm-daemon-restart.dumped" 2>/dev/null): [1-9][0-9]* MiB loaded from the image" "$W/gpucrd.log" &&
	ok "appvmm-daemon-restart: restored from the image" || bad "appvmm-daemon-restart: the image was not loaded"
APP_ENV[${#APP_ENV[@]}-2]=FAKE_APP_VMM_HOLD=0
APP_ENV[${#APP_ENV[@]}-1]=FAKE_APP_VMM=1
flow appvmm-mixed "" ""
appvmm_checks appvmm-mixed
restart_daemon

echo "$fails failure(s)"
[ $fails = 0 ]
