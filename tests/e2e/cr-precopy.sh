#!/usr/bin/env bash
# timeout: 120
# End to end on the test driver with real CRIU and gpucr's plugin: a
# migration with `gpucr dump --pre-copy`. The application runs (its
# "kernels" write its buffers every step) while gpucrd pre-copies its GPU
# memory into the image directory; CRIU then dumps it and the dump finishes
# the GPU image from the pre-copy. gpucrd is restarted (nothing kept: as on
# another host) and the process restored from the image: its output must be
# an uninterrupted run's, the image must verify, and the figures (--json,
# gpucr dump's output) must show the image was finished from the pre-copy.
set -u
CR_NAME=precopy
. "$(dirname "$0")/cr-common.bash"
STEPS=60

"${APP_ENV[@]}" GPUCR_DAEMON=0 "$B/tests/e2e-fake-app" "$W/ref" $STEPS 4 || { echo "reference run failed"; exit 1; }

GPUCR_CHUNK_KB=256 start_daemon
cat >"$W/mig.sh" <<FLOW
set -u
setsid $B/bin/gpucr run --socket $GPUCR_SOCKET -- env GPUCR_REAL_LIBCUDA=$FAKE GPUCR_QUIESCE_GRACE_MS=50 $B/tests/e2e-fake-app $W/mig.out $STEPS 4 </dev/null >$W/mig.app.log 2>&1 &
pid=\$!
for i in \$(seq 1 400); do [ -f $W/mig.out ] && [ \$(wc -l <$W/mig.out) -ge 10 ] && break; sleep 0.02; done
$B/bin/gpucr dump --pre-copy --pre-copy-rounds 2 --json --pid \$pid -D $W/mig >$W/mig.json 2>$W/mig.dump.err || exit 10
for i in \$(seq 1 100); do kill -0 \$pid 2>/dev/null || break; sleep 0.02; done
echo \$pid >$W/mig.dumped
for i in \$(seq 1 500); do [ -f $W/mig.go ] && break; sleep 0.02; done
$B/bin/gpucr restore -D $W/mig >$W/mig.restore.out 2>&1 || exit 11
for i in \$(seq 1 1500); do grep -q '^done' $W/mig.out 2>/dev/null && break; sleep 0.02; done
FLOW
"$B/tests/e2e-subreaper" bash "$W/mig.sh" >"$W/mig.flow.log" 2>&1 &
fpid=$!
for _ in $(seq 1 1000); do [ -f "$W/mig.dumped" ] || ! kill -0 $fpid 2>/dev/null && break; sleep 0.02; done
# Another host: a gpucrd that holds nothing of the process.
stop_daemon
start_daemon
touch "$W/mig.go"
wait $fpid
rc=$?

if [ $rc = 0 ] && cmp -s "$W/ref" "$W/mig.out"; then
	ok "migration: output identical to the uninterrupted run"
else
	bad "migration: flow exit $rc; output: $(diff "$W/ref" "$W/mig.out" 2>&1 | head -4 | tr '\n' ' ')"
	tail -8 "$W/mig.flow.log" "$W/mig.dump.err" "$W/mig.restore.out" "$W/mig.app.log" 2>/dev/null | sed 's/^/    /'
	tail -15 "$W/gpucrd.log" | sed 's/^/    gpucrd| /'
fi
grep -q "restoring from retained GPU memory" "$W/gpucrd.log" && bad "migration: restored from kept memory, not the image" ||
	ok "migration: restored from the image"
"$B/bin/gpucr" inspect --verify "$W/mig" >/dev/null && ok "migration: image verifies" || bad "migration: image does not verify"
# The figures: pre-copied, finished from it. (This application rewrites
# every buffer every step, so the final pass keeps little or nothing: what
# is kept, and exactly, is daemon-precopy's to check.)
if grep -q '"pre_copy":{"processes":1,' "$W/mig.json" && grep -q '"finished_from":1' "$W/mig.json" &&
	grep -q '"kept_bytes":[0-9]' "$W/mig.json" && grep -q '"final_pass_ms":' "$W/mig.json"; then
	ok "migration: --json reports the pre-copy and the final pass: $(grep -o '"pre_copy":{[^}]*}' "$W/mig.json")"
else
	bad "migration: --json: $(cat "$W/mig.json")"
fi
grep -q "pre-copied: .* written in .* round(s)" "$W/mig.dump.err" && grep -q "finished from its pre-copy" "$W/mig.dump.err" &&
	ok "migration: gpucr dump prints the pre-copy and the final pass" ||
	{ bad "migration: no pre-copy figures printed"; tail -8 "$W/mig.dump.err" | sed 's/^/    /'; }
ls -a "$W/mig" | grep -q partial && bad "migration: partial files left: $(ls -a "$W/mig" | tr '\n' ' ')" ||
	ok "migration: no partial files left"
stop_daemon

echo "$fails failure(s)"
[ $fails = 0 ]
