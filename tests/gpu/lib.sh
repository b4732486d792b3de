# Shared helpers of the GPU suite and the benchmarks (sourced).
# Needs: B (the bundle root), WORK (a scratch dir on tmpfs).

now() { date +%s.%N; }

# The intervals between a program's steps, in seconds, sorted, from its
# --times file ("K SECONDS" per step). (Plain awk and sort: no gawk on
# every host.)
step_intervals() {
	awk 'NR > 1 { printf "%.6f\n", $2 - p } { p = $2 }' "$1" | sort -n
}
elapsed() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.3f", b - a }'; }

# Waits until FILE has a line "step N ..." with N >= $2 (or "done"), max $3 s.
wait_step() {
	local file=$1 want=$2 limit=${3:-120} i last
	for ((i = 0; i < limit * 20; i++)); do
		if [ -f "$file" ]; then
			last=$(awk '$1 == "step" { n = $2 } END { print n + 0 }' "$file")
			[ "$last" -ge "$want" ] && return 0
			grep -q '^done' "$file" && return 0
		fi
		sleep 0.05
	done
	return 1
}

wait_gone() { # pid, max seconds
	local i
	for ((i = 0; i < ${2:-300} * 20; i++)); do
		kill -0 "$1" 2>/dev/null || return 0
		sleep 0.05
	done
	return 1
}

# Starts a private gpucrd on $WORK/gpucrd.sock (log $WORK/gpucrd.log).
start_gpucrd() {
	export GPUCR_SOCKET=$WORK/gpucrd.sock
	setsid "$B/bin/gpucrd" --socket "$GPUCR_SOCKET" --log "$WORK/gpucrd.log" ${GPUCRD_ARGS:-} </dev/null >/dev/null 2>&1 &
	GPUCRD_PID=$!
	local i
	for ((i = 0; i < 200; i++)); do
		[ -S "$GPUCR_SOCKET" ] && return 0
		sleep 0.05
	done
	return 1
}

stop_gpucrd() {
	local i
	pkill -f "gpucrd --socket $GPUCR_SOCKET" 2>/dev/null
	for ((i = 0; i < 200; i++)); do
		pgrep -f "gpucrd --socket $GPUCR_SOCKET" >/dev/null || break
		sleep 0.05
	done
	rm -f "$GPUCR_SOCKET"
	GPUCRD_PID=
}

# The PyTorch workloads (tests/gpu/*.py): $1 name -> the command, to which
# the output file is appended. Training (losses), generation (tokens), a
# cuBLAS GEMM loop (checksums), torch.compile (Triton kernels).
WORKLOADS_ALL="torch-train torch-generate cublas-gemm torch-compile"
workload_cmd() {
	local G=$B/share/gpucr/tests/gpu
	case $1 in
	torch-train) echo "python3 $G/torch_train.py --steps 20 --step-sleep 0.1 --out" ;;
	torch-generate) echo "python3 $G/torch_generate.py --tokens 30 --step-sleep 0.1 --out" ;;
	cublas-gemm) echo "python3 $G/gemm_loop.py --steps 30 --step-sleep 0.1 --out" ;;
	torch-compile) echo "python3 $G/torch_train.py --compile --steps 20 --step-sleep 0.1 --out" ;;
	# PyTorch's allocator on the driver's VMM calls itself (the shim passes
	# them through; the driver's checkpoint carries that memory); in the GPU
	# suite's default list, not in WORKLOADS_ALL
	torch-train-expandable) echo "env PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True python3 $G/torch_train.py --steps 20 --step-sleep 0.1 --out" ;;
	# The same with the shim tracking those calls (GPUCR_APP_VMM=1, off by
	# default until this has been measured): the segments' memory goes to
	# gpucrd like gpucr's own, the driver's checkpoint has none to move
	torch-train-expandable-appvmm) echo "env GPUCR_APP_VMM=1 PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True python3 $G/torch_train.py --steps 20 --step-sleep 0.1 --out" ;;
	# ~0.6 G parameters with Adam: about 12 GB of GPU state (issue 7's
	# checkpoint-cost workload); not in WORKLOADS_ALL
	torch-train-big) echo "python3 $G/torch_train.py --dim 2048 --layers 12 --steps 30 --step-sleep 0.05 --out" ;;
	*) return 1 ;;
	esac
}

# cycle_failed MODE SUBDIR DIR STATUS: a cycle that failed or ran out of
# time (CR_TIMEOUT): says in which phase, kills what is left of its
# program, keeps its logs (whatever KEEP_LOGS_MODES says).
cycle_failed() {
	local mode=$1 sub=$2 dir=$3 rc=$4 pid
	[ "$rc" = 124 ] && echo "timed out after ${CR_TIMEOUT:-150} s in $(grep '^phase:' "$dir/flow.log" | tail -1 | cut -c8-)"
	grep -v '^phase:' "$dir/flow.log" | tail -5
	pid=$(cat "$dir/pid" 2>/dev/null)
	[ -n "$pid" ] && kill -9 "$pid" 2>/dev/null
	KEEP_LOGS_MODES=$mode keep_logs "$mode" "$sub" "$dir"/img/*.log "$dir"/*.log "$dir"/dump.out
	return 0
}

# keep_logs MODE SUBDIR FILES...: CRIU's and gpucrd's logs of a cycle (of
# the modes in KEEP_LOGS_MODES, default all) kept under $KEEP_LOGS/SUBDIR.
keep_logs() {
	local mode=$1 sub=$2
	shift 2
	[ -n "${KEEP_LOGS:-}" ] && [[ " ${KEEP_LOGS_MODES:-$mode} " == *" $mode "* ]] || return 0
	mkdir -p "$KEEP_LOGS/$sub"
	cp "$@" "$WORK/gpucrd.log" "$KEEP_LOGS/$sub/" 2>/dev/null
	return 0
}

# A C/R cycle of cuda-prog through CRIU: $1 mode: "stock" (CRIU + its cuda
# plugin), "gpucr" (under gpucr run, restored from retained memory) or
# "gpucr-image" (gpucrd restarted between dump and restore: from the image)
# or "gpucr-bg" (CRIU does not wait for the GPU image, GPUCR_IMAGE_WAIT=0;
# restored at once from retained memory while the image is written) or
# "plain" (gpucr's plugin, the program not started under gpucr: the
# driver-only fallback).
# Runs, dumps at step $3, kills, restores, lets it finish; compares the
# output with the reference $4. $2 = GiB, $5 = steps. On success prints
# "dump_s restore_s first_step_s image_bytes", on failure a reason (status 1).
cr_cycle_cuda_prog() {
	cr_cycle "$1" "cuda-prog-$2" "$3" "$4" "$B/tests/gpu/cuda-prog --gib $2 --steps $5 --step-ms 50 --out"
}

# The same for any program: $1 mode, $2 name, $3 step to dump at, $4
# reference output, $5 the command, to which the output file is appended.
cr_cycle() {
	local mode=$1 name=$2 at=$3 ref=$4 cmd=$5 dir=$WORK/cr-$1-$2
	local libdir run_prefix=""
	case $mode in
	stock) libdir=$B/lib/criu-stock ;;
	plain) libdir=$B/lib/criu ;; # gpucr's plugin, a process not started under gpucr: the fallback
	gpucr | gpucr-image | gpucr-bg | gpucr-precopy)
		libdir=$B/lib/criu
		run_prefix="$B/bin/gpucr run --socket $GPUCR_SOCKET --"
		;;
	esac
	local dumpcmd="criu dump -t \$pid -D $dir/img -o dump.log -v4"
	# gpucr-precopy: a migration's dump (gpucr dump --pre-copy: the GPU
	# memory written while the program runs, then only what changed), and
	# the restore from its image after a gpucrd restart, like gpucr-image.
	[ $mode = gpucr-precopy ] && dumpcmd="gpucr dump --pre-copy --pid \$pid -D $dir/img >$dir/dump.out 2>&1"
	rm -rf "$dir"
	mkdir -p "$dir/img"
	cat >"$dir/flow.sh" <<FLOW
set -u
export CRIU_LIBS_DIR=$libdir PATH=$B/bin:\$PATH B=$B WORK=$WORK GPUCR_SOCKET=${GPUCR_SOCKET:-}
[ $mode = gpucr-bg ] && export GPUCR_IMAGE_WAIT=0
. $B/share/gpucr/tests/gpu/lib.sh
setsid $run_prefix $cmd $dir/out.log </dev/null >$dir/prog.log 2>&1 &
pid=\$!
echo \$pid >$dir/pid
echo "phase: running to step $at"
wait_step $dir/out.log $at 300 || { echo "never reached step $at"; exit 1; }
t0=\$(now)
echo "phase: criu dump"
$dumpcmd || { echo "dump failed:"; grep -E 'Error|error|gpucr' $dir/img/dump.log | tail -5; tail -3 $dir/dump.out 2>/dev/null; exit 1; }
t1=\$(now)
wait \$pid 2>/dev/null
last=\$(awk '\$1 == "step" { n = \$2 } END { print n + 0 }' $dir/out.log)
echo dumped >$dir/dumped
for i in \$(seq 1 600); do [ -f $dir/go ] && break; sleep 0.05; done
t2=\$(now)
echo "phase: criu restore"
criu restore -D $dir/img -o restore.log -v4 -d || { echo "restore failed:"; grep -E 'Error|error|gpucr' $dir/img/restore.log | tail -5; exit 1; }
t3=\$(now)
echo "phase: restored, waiting for step \$((last + 1))"
wait_step $dir/out.log \$((last + 1)) 300
t4=\$(now)
echo "phase: waiting for the restored process to finish"
wait_gone \$pid 600 || { echo "restored process did not finish"; exit 1; }
echo "\$(elapsed \$t0 \$t1) \$(elapsed \$t2 \$t3) \$(elapsed \$t2 \$t4) \$(du -sb $dir/img | cut -f1)" >$dir/figures
FLOW
	# The flow waits after the dump for "go": gpucr-image restarts the
	# daemon then, from here (a daemon started inside the flow would be a
	# descendant of the subreaper, which waits for all of them).
	timeout "${CR_TIMEOUT:-150}" "$B/tests/e2e-subreaper" bash "$dir/flow.sh" >"$dir/flow.log" 2>&1 &
	local fpid=$! i
	for ((i = 0; i < 6000; i++)); do [ -f "$dir/dumped" ] || ! kill -0 $fpid 2>/dev/null && break; sleep 0.05; done
	if { [ $mode = gpucr-image ] || [ $mode = gpucr-precopy ]; } && [ -f "$dir/dumped" ]; then
		stop_gpucrd
		sleep 0.3
		rm -f "$GPUCR_SOCKET"
		local seen
		seen=$(grep -c 'GPU ready' "$WORK/gpucrd.log" 2>/dev/null)
		start_gpucrd
		# A daemon that has been up a moment: its start-up warm-up (the
		# driver, pinned staging; under a second) is not the restore's.
		for ((i = 0; i < 100; i++)); do
			[ "$(grep -c 'GPU ready' "$WORK/gpucrd.log" 2>/dev/null)" -gt "${seen:-0}" ] && break
			sleep 0.1
		done
	fi
	touch "$dir/go"
	wait $fpid
	i=$?
	if [ $i != 0 ]; then
		cycle_failed "$mode" "$mode-$name" "$dir" $i
		return 1
	fi
	if ! cmp -s "$dir/out.log" "$ref"; then
		echo "output differs from the uninterrupted run: $(diff "$ref" "$dir/out.log" | head -3 | tr '\n' ' ')"
		return 1
	fi
	cat "$dir/figures"
	keep_logs "$mode" "$mode-$name" "$dir"/img/*.log "$dir"/*.log
	rm -rf "$dir/img"
}

# A checkpoint of a running program (left running); 8 steps later the
# program is killed and the checkpoint restored, which must go on to the
# same results. $1 mode: "gpucr" (concurrent: gpucr dump -R), "gpucr-stop"
# (GPUCR_CONCURRENT=0: stopped until its image is written) or "stock"
# (criu dump -R with CRIU's cuda plugin); $2 name, $3 step to checkpoint at,
# $4 reference output, $5 the command (output file appended, then
# --times FILE). Prints "lost_ms checkpoint_s restore_s": lost_ms is the
# program's longest step interval around the checkpoint less its median
# interval.
ckpt_cycle() {
	local mode=$1 name=$2 at=$3 ref=$4 cmd=$5 dir=$WORK/ck-$1-$2
	local libdir=$B/lib/criu run_prefix="" dumpcmd
	case $mode in
	stock) libdir=$B/lib/criu-stock ;;
	*) run_prefix="$B/bin/gpucr run --socket $GPUCR_SOCKET --" ;;
	esac
	case $mode in
	stock) dumpcmd="criu dump -t \$pid -D $dir/img -o dump.log -v4 -R" ;;
	gpucr-stop) dumpcmd="env GPUCR_CONCURRENT=0 gpucr dump --pid \$pid -D $dir/img -R" ;;
	*) dumpcmd="gpucr dump --pid \$pid -D $dir/img -R" ;;
	esac
	rm -rf "$dir"
	mkdir -p "$dir/img"
	cat >"$dir/flow.sh" <<FLOW
set -u
export CRIU_LIBS_DIR=$libdir PATH=$B/bin:\$PATH B=$B WORK=$WORK GPUCR_SOCKET=${GPUCR_SOCKET:-}
. $B/share/gpucr/tests/gpu/lib.sh
# stdout to /dev/null: CRIU refuses to restore a process whose open log file grew after the checkpoint
setsid $run_prefix $cmd $dir/out.log --times $dir/times </dev/null >/dev/null 2>&1 &
pid=\$!
echo \$pid >$dir/pid
echo "phase: running to step $at"
wait_step $dir/out.log $at 300 || { echo "never reached step $at"; exit 1; }
t0=\$(now)
echo "phase: checkpoint"
$dumpcmd >$dir/dump.out 2>&1 || { echo "checkpoint failed:"; tail -5 $dir/dump.out; exit 1; }
t1=\$(now)
wait_step $dir/out.log \$(( $at + 8 )) 300
kill -9 \$pid; wait \$pid 2>/dev/null
cp $dir/times $dir/times.run
t2=\$(now)
echo "phase: criu restore"
criu restore -D $dir/img -o restore.log -v4 -d \$([ -f $dir/img/gpucr-shell-job ] && echo --shell-job) || { echo "restore failed:"; grep -E 'Error|error|gpucr' $dir/img/restore.log | tail -5; exit 1; }
t3=\$(now)
for i in \$(seq 1 6000); do grep -q '^done' $dir/out.log && break; sleep 0.05; done
echo "\$(elapsed \$t0 \$t1) \$(elapsed \$t2 \$t3)" >$dir/figures
FLOW
	timeout "${CR_TIMEOUT:-150}" "$B/tests/e2e-subreaper" bash "$dir/flow.sh" >"$dir/flow.log" 2>&1
	local rc=$?
	if [ ! -f "$dir/figures" ]; then
		cycle_failed "$mode" "ck-$mode-$name" "$dir" $rc
		return 1
	fi
	if ! grep -q "^done" "$dir/out.log" || [ "$(sort -u "$dir/out.log")" != "$(sort -u "$ref")" ]; then
		echo "after the restore of the checkpoint, the output differs from the uninterrupted run: $(diff <(sort -u "$ref") <(sort -u "$dir/out.log") | head -3 | tr '\n' ' ')"
		return 1
	fi
	keep_logs "$mode" "ck-$mode-$name" "$dir"/img/*.log "$dir"/*.log "$dir"/dump.out "$dir"/times.run
	echo "$(step_intervals "$dir/times.run" |
		awk '{ v[NR] = $1 } END { printf "%.0f", (v[NR] - v[int((NR + 1) / 2)]) * 1000 }') $(cat "$dir/figures")"
	rm -rf "$dir/img"
}
