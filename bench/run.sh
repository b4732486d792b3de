#!/usr/bin/env bash
# `make bench` (on a GPU host, from the bundle): gpucr side by side with the
# stock path (CRIU 4.1.1 + its cuda plugin + bench/cuda-checkpoint), in the
# same run, on the same workload (tests/gpu/cuda-prog.cu):
#   dump time (the process is frozen, then killed: its downtime), restore
#   time, time to the first step after the restore, image size; gpucr also
#   from its image after a daemon restart; the PyTorch workloads; what a
#   checkpoint of a running program costs its loop; the image engine on
#   tmpfs and disk; steady-state step time with and without gpucr's shim.
# Knobs: SIZES, SYSTEMS (default "stock gpucr gpucr-bg gpucr-image"; also
# gpucr-precopy: gpucr dump --pre-copy, restored from the image after a
# gpucrd restart; NAME-held / NAME-unheld below), WORKLOADS, WORKLOAD_SYSTEMS, CKPT_WORKLOADS
# (default cuda-prog-16; e.g. "cuda-prog-16 torch-train"), CKPT_SYSTEMS,
# IMG_GIB (0: no tmpfs image engine), DISK_GIB (0: no disk), BENCH_DISK_DIR,
# STEADY_ORDER, STEADY_TORCH_STEPS, STEPS, BENCH_BUDGET_S
# (default 555: later sections are skipped past it, to fit one 10-minute
# call).
# Writes RESULTS_DIR/<date>-<gpu>.{log,json,md,png} (default: results/ beside this script).
set -u
here=$(cd "$(dirname "$0")" && pwd)
if [ -z "${B:-}" ]; then
	if [ -x "$here/../../../bin/criu" ]; then B=$(cd "$here/../../.." && pwd); else
		B=$(ls -d "$here"/../build/bundle/gpucr-*/ 2>/dev/null | head -1); B=${B%/}; fi
fi
[ -n "$B" ] && [ -x "$B/bin/criu" ] || { echo "no bundle found: run 'make bundle' first"; exit 1; }
nvidia-smi -L >/dev/null 2>&1 || { echo "bench: no NVIDIA GPU here"; exit 77; }
WORK=${WORK:-/dev/shm/gpucr-bench}
RESULTS_DIR=${RESULTS_DIR:-$here/results}
rm -rf "$WORK"
mkdir -p "$WORK" "$RESULTS_DIR"
export B WORK PATH="$B/bin:$PATH"
. "$B/share/gpucr/tests/gpu/lib.sh"
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | tr ' ' '-' | tr -cd 'A-Za-z0-9-')
stamp=$(date -u +%F)
base=$RESULTS_DIR/$stamp-$gpu
log=$base.log
STEPS=${STEPS:-30}
{
	echo "# gpucr bench $(date -u +%FT%TZ)"
	echo "# host: $(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | head -1); $(nproc) CPUs; $(awk '/MemTotal/ {printf "%.0f GiB", $2/1048576}' /proc/meminfo); kernel $(uname -r)"
	echo "# command: B=$B bash $B/share/gpucr/bench/run.sh (SIZES='${SIZES:-1 4 16}', STEPS=$STEPS)"
	echo "# workload: cuda-prog, 16 buffers, 4 streams, dumped at step 10 of $STEPS; images on $WORK (tmpfs)"
} >"$log"
emit() { echo "BENCH $*" | tee -a "$log"; }
section() { echo "# section: $1 at ${SECONDS}s" >>"$log"; }
# One call of the device tool allows 10 minutes: the later sections are
# skipped (and say so) once BENCH_BUDGET_S seconds have gone.
over_budget() {
	[ "$SECONDS" -lt "${BENCH_BUDGET_S:-555}" ] && return 1
	echo "# skipped after ${SECONDS}s (BENCH_BUDGET_S=${BENCH_BUDGET_S:-555}): $1" | tee -a "$log"
	return 0
}

start_gpucrd || { echo "gpucrd did not start"; exit 1; }
# A system named NAME-held is NAME with gpucrd started with
# GPUCR_WRITE_AFTER_DRIVER=1 (the image's device->host write of a dump
# nothing waits for held back until the driver is done with the process:
# gpucrd's default), NAME-unheld with GPUCR_WRITE_AFTER_DRIVER=0 (written
# beside the driver's work): e.g. SIZES=16 SYSTEMS="gpucr-bg gpucr-bg-unheld"
# CKPT_SYSTEMS="gpucr gpucr-unheld".
# held SYS CYCLE ARGS...: runs the cycle function for SYS.
held() {
	local sys=$1 fn=$2 r rc v=1
	shift 2
	case $sys in
	*-held | *-unheld)
		[[ $sys == *-unheld ]] && v=0
		stop_gpucrd
		GPUCR_WRITE_AFTER_DRIVER=$v start_gpucrd || { echo "gpucrd did not start"; return 1; }
		r=$($fn "${sys%-*}" "$@")
		rc=$?
		stop_gpucrd
		start_gpucrd
		echo "$r"
		return $rc
		;;
	*) $fn "$sys" "$@" ;;
	esac
}
section "cuda-prog sizes"
for g in ${SIZES:-1 4 16}; do
	"$B/tests/gpu/cuda-prog" --gib "$g" --steps "$STEPS" --step-ms 50 --out "$WORK/ref-$g.log" || continue
	for sys in ${SYSTEMS:-stock gpucr gpucr-bg gpucr-image}; do
		if r=$(held "$sys" cr_cycle_cuda_prog "$g" 10 "$WORK/ref-$g.log" "$STEPS"); then
			set -- $r
			emit "system=$sys gib=$g ok=1 dump_s=$1 restore_s=$2 first_step_s=$3 image_bytes=$4"
		else
			emit "system=$sys gib=$g ok=0 reason=\"$(echo "$r" | tr '\n"' ' ')\""
		fi
	done
done

section "PyTorch workloads"
# The PyTorch workloads (tests/gpu/lib.sh), each dumped at step 8, killed
# and restored; every step after the restore must match the reference.
if python3 -c 'import torch; assert torch.cuda.is_available()' 2>/dev/null; then
	for name in ${WORKLOADS:-$WORKLOADS_ALL}; do
		cmd=$(workload_cmd "$name") || continue
		$cmd "$WORK/$name-ref.log" >"$WORK/$name-ref.err" 2>&1 || { emit "system=reference workload=$name ok=0 reason=\"$(tail -1 "$WORK/$name-ref.err" | tr '"' ' ')\""; continue; }
		for sys in ${WORKLOAD_SYSTEMS:-stock gpucr-bg}; do
			if r=$(cr_cycle "$sys" "$name" 8 "$WORK/$name-ref.log" "$cmd"); then
				set -- $r
				emit "system=$sys workload=$name ok=1 dump_s=$1 restore_s=$2 first_step_s=$3 image_bytes=$4"
			else
				emit "system=$sys workload=$name ok=0 reason=\"$(echo "$r" | tr '\n"' ' ')\""
			fi
		done
	done
fi

section "checkpoints of a running program"
# Checkpoints of a running program (left running): what one costs its loop,
# for gpucr (concurrent: a copy on the GPU at T, or calls waiting for the
# chunks they write) and the stock path (criu dump -R with CRIU's cuda
# plugin); CKPT_SYSTEMS may add gpucr-stop (stopped until its image is
# written; the GPU suite measures it). Each checkpoint is then restored and
# must go on bit-identically.
for name in ${CKPT_WORKLOADS:-cuda-prog-16}; do
	case $name in
	cuda-prog-*) cmd="$B/tests/gpu/cuda-prog --gib ${name#cuda-prog-} --steps 40 --step-ms 50 --out" ;;
	*) cmd=$(workload_cmd "$name") || continue ;;
	esac
	over_budget "checkpoints of a running program ($name)" && break
	$cmd "$WORK/ck-ref-$name.log" >/dev/null 2>&1 || continue
	for sys in ${CKPT_SYSTEMS:-stock gpucr}; do
		if r=$(held "$sys" ckpt_cycle "$name" 10 "$WORK/ck-ref-$name.log" "$cmd"); then
			set -- $r
			emit "ckpt=$name system=$sys ok=1 lost_ms=$1 checkpoint_s=$2 restore_s=$3"
		else
			emit "ckpt=$name system=$sys ok=0 reason=\"$(echo "$r" | tr '\n"' ' ')\""
		fi
	done
done
stop_gpucrd

section "steady state"
# Steady state: the same programs with and without the shim (runs in the
# order without, with, with, without); the median step time from the
# programs' own per-step timestamps, so process start and CUDA/PyTorch
# initialisation are left out, and the whole run's wall time.
median_step_ms() { # times file: "K SECONDS" per step
	step_intervals "$1" |
		awk '{ v[NR] = $1 } END { if (NR) printf "%.3f", v[int((NR + 1) / 2)] * 1000; else printf "nan" }'
}
# STEADY_ORDER (default "0 1 1 0") is the runs' order: 0 without the shim,
# 1 with it, 2 with it but device memory left to the driver (GPUCR_VMM=0: to
# tell the shim's calls from its memory); STEADY_TORCH_STEPS (default 20)
# the training run's steps; STEADY_CUDA_PROG=0 leaves cuda-prog out.
TSTEPS=${STEADY_TORCH_STEPS:-20}
for shim in ${STEADY_ORDER:-0 1 1 0}; do
	over_budget "steady state" && break
	envx=()
	[ $shim = 1 ] && envx=(LD_LIBRARY_PATH=$B/lib/gpucr GPUCR_DAEMON=0)
	[ $shim = 2 ] && envx=(LD_LIBRARY_PATH=$B/lib/gpucr GPUCR_DAEMON=0 GPUCR_VMM=0)
	if [ "${STEADY_CUDA_PROG:-1}" != 0 ]; then
		rm -f "$WORK/st.times"
		t0=$(now)
		env "${envx[@]}" "$B/tests/gpu/cuda-prog" --gib 4 --steps 100 --step-ms 0 --out "$WORK/steady.log" --times "$WORK/st.times"
		t1=$(now)
		emit "steady=cuda-prog shim=$shim steps=100 seconds=$(elapsed $t0 $t1) step_ms=$(median_step_ms "$WORK/st.times")"
	fi
	if python3 -c 'import torch' 2>/dev/null; then
		rm -f "$WORK/st.times"
		t0=$(now)
		env "${envx[@]}" python3 "$B/share/gpucr/tests/gpu/torch_train.py" --steps "$TSTEPS" --out "$WORK/tt.log" --times "$WORK/st.times" >/dev/null 2>&1
		t1=$(now)
		emit "steady=torch-train shim=$shim steps=$TSTEPS seconds=$(elapsed $t0 $t1) step_ms=$(median_step_ms "$WORK/st.times")"
	fi
done
section "image engine"
# gpucrd's image engine alone (bin/imgbench, the daemon's own code): GPU
# memory -> image files -> new GPU memory, fingerprints checked; on tmpfs,
# and on the local disk beside what dd with O_DIRECT gets there.
gbs() { grep -o '[0-9.]* GB/s' | head -1 | cut -d' ' -f1; }
IMG_GIB=${IMG_GIB:-16}
mkdir -p "$WORK/imgbench"
if [ "$IMG_GIB" = 0 ] || over_budget "image engine on tmpfs"; then :
elif out=$("$B/bin/imgbench" --gib "$IMG_GIB" --dir "$WORK/imgbench" --ceilings 2>&1); then
	echo "$out" | sed 's/^/    imgbench| /' >>"$log"
	emit "image=tmpfs gib=$IMG_GIB write_gbs=$(echo "$out" | grep '^write' | gbs) read_gbs=$(echo "$out" | grep '^read' | gbs)" \
		"ceil_d2h_gbs=$(echo "$out" | grep 'ceiling.*GPU' | gbs) ceil_files_gbs=$(echo "$out" | grep 'ceiling.*files' | gbs)"
else
	emit "image=tmpfs gib=$IMG_GIB ok=0 reason=\"$(echo "$out" | tail -1 | tr '"' ' ')\""
fi
rm -rf "$WORK/imgbench"
DISK_DIR=${BENCH_DISK_DIR:-/var/tmp/gpucr-bench}
DISK_GIB=${DISK_GIB:-4}
if [ "$DISK_GIB" != 0 ] && ! over_budget "image engine on disk" && mkdir -p "$DISK_DIR" && [ "$(stat -f -c %T "$DISK_DIR")" != tmpfs ]; then
	ddw=$(dd if=/dev/zero of="$DISK_DIR/dd" bs=64M count=$((DISK_GIB * 16)) oflag=direct 2>&1 | tee -a "$log" | awk '/copied/ { for (i = 1; i < NF; i++) if ($(i + 1) == "s,") print $1 / $i }')
	ddr=$(dd if="$DISK_DIR/dd" of=/dev/null bs=64M iflag=direct 2>&1 | tee -a "$log" | awk '/copied/ { for (i = 1; i < NF; i++) if ($(i + 1) == "s,") print $1 / $i }')
	rm -f "$DISK_DIR/dd"
	if out=$("$B/bin/imgbench" --gib "$DISK_GIB" --dir "$DISK_DIR" 2>&1); then
		echo "$out" | sed 's/^/    imgbench| /' >>"$log"
		emit "image=disk gib=$DISK_GIB dir=$DISK_DIR write_gbs=$(echo "$out" | grep '^write' | gbs) read_gbs=$(echo "$out" | grep '^read' | gbs) dd_write_gbs=$(awk -v b="$ddw" 'BEGIN { printf "%.2f", b / 1e9 }') dd_read_gbs=$(awk -v b="$ddr" 'BEGIN { printf "%.2f", b / 1e9 }')"
	else
		emit "image=disk gib=$DISK_GIB ok=0 reason=\"$(echo "$out" | tail -1 | tr '"' ' ')\""
	fi
	rm -rf "$DISK_DIR"
fi

python3 "$B/share/gpucr/bench/report.py" "$log" "$base" && echo "results: $base.{log,json,md,png}"
rm -rf "$WORK"
