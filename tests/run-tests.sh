#!/usr/bin/env bash
# Runs gpucr's tests: each argument is a test executable or a shell script.
# Exit status 0 is a pass, 77 a skip, anything else a failure; each test has a
# time limit (GPUCR_TEST_TIMEOUT seconds, default 120; a script may ask for
# more with a "# timeout: N" line). Prints one line per test and the closing
# "N passed, N failed, N skipped" line; exits 1 if any test failed.
# TESTS_FILTER=regex runs only the tests whose name matches. The log of a
# failure is also kept in test-logs/failed/, so a rare one survives reruns.
set -u

timeout_default=${GPUCR_TEST_TIMEOUT:-120}
logdir=${BUILD:-build}/test-logs
mkdir -p "$logdir"
pass=0 fail=0 skip=0
failed=()

for t in "$@"; do
	name=$(basename "$t")
	name=${name%.sh}
	if [ -n "${TESTS_FILTER:-}" ] && ! [[ $name =~ $TESTS_FILTER ]]; then
		continue
	fi
	limit=$timeout_default
	if [[ $t == *.sh ]]; then
		l=$(sed -n 's/^# timeout: *\([0-9]\+\).*/\1/p' "$t" | head -1)
		[ -n "$l" ] && limit=$l
		cmd=(bash "$t")
	else
		cmd=("$t")
	fi
	log=$logdir/$name.log
	start=$(date +%s.%N)
	timeout -k 5 "$limit" "${cmd[@]}" >"$log" 2>&1 </dev/null
	rc=$?
	secs=$(awk -v s="$start" -v e="$(date +%s.%N)" 'BEGIN { printf "%.1f", e - s }')
	case $rc in
	0) pass=$((pass + 1)); printf 'PASS  %-40s %6ss\n' "$name" "$secs" ;;
	77) skip=$((skip + 1)); printf 'SKIP  %-40s %6ss  %s\n' "$name" "$secs" "$(tail -1 "$log")" ;;
	124 | 137)
		fail=$((fail + 1)); failed+=("$name")
		mkdir -p "$logdir/failed" && cp "$log" "$logdir/failed/$name.$(date +%Y%m%dT%H%M%S).log"
		printf 'FAIL  %-40s %6ss  (timed out after %ss)\n' "$name" "$secs" "$limit"
		sed 's/^/    | /' "$log" | tail -20 ;;
	*)
		fail=$((fail + 1)); failed+=("$name")
		mkdir -p "$logdir/failed" && cp "$log" "$logdir/failed/$name.$(date +%Y%m%dT%H%M%S).log"
		printf 'FAIL  %-40s %6ss  (exit %d)\n' "$name" "$secs" "$rc"
		sed 's/^/    | /' "$log" | tail -30 ;;
	esac
done

[ ${#failed[@]} -gt 0 ] && echo "failed: ${failed[*]} (logs in $logdir)"
echo "$pass passed, $fail failed, $skip skipped"
[ "$fail" -eq 0 ]
