#!/usr/bin/env bash
# What gpucr's driver shim costs an application that is never checkpointed,
# and whether every kernel launch passes it (issue 3's benchmarks), on a GPU
# host, from the bundle:
#
#   bash $B/share/gpucr/bench/shimcost.sh [RAWFILE]
#
# Runs bin/shimcost (bench/shimcost.cu: per-launch host cost, alloc/free cost
# 256 B..1 GiB, 64 MiB pinned copies) once without the shim and once with it
# (LD_LIBRARY_PATH=$B/lib/gpucr GPUCR_DAEMON=0) and prints the two side by
# side (without, with, difference, and the run-to-run noise: the larger
# spread, max - min over the repetitions, of the two runs), with a verdict on
# the worst added cost per launch that says whether it is within that noise,
# and the added cost measured in one process (shimcost's paired figures: the
# shim's cuLaunchKernel against the real driver's, batches alternating),
# which the differences between two processes do not blur.
# Then, with the shim, it checks that every kernel launch passed one of the
# shim's wrappers (gpucr_shim_counts, libintercept/gpucr_shim.h), in
#   - a driver API program: shimcost itself (cuLaunchKernel linked and as an
#     entry point, and cudaLaunchKernel): the launches it issued against the
#     shim's count (its SHIMCOST-COUNTS line);
#   - a CUDA runtime API program: tests/gpu/cuda-prog --counts (its
#     CUDAPROG-COUNTS line): kernel launches must be equal; copies and
#     memsets are shown side by side (the runtime may add its own);
#   - PyTorch, where torch is importable (bench/torch_launches.py): a
#     training step, run both ways (kernels per step, as the profiler counts
#     them, must be the same); then, with the shim only, a smaller model's
#     training step under torch.compile (Triton kernels) and a loop of cuBLAS
#     GEMMs (--gemm). In each run with the shim, per profiled step, the
#     shim's count of launches must equal the profiler's launch calls and
#     kernels.
# Each check prints "every kernel launch passed the shim (PROGRAM): yes|NO
# (...)". Everything, both runs' raw output and the comparison lines
# (SHIMCOST-DIFF, SHIMCOST-VERDICT, SHIMCOST-*-WRAPPED), goes to RAWFILE, or
# $OUT, or RESULTS_DIR/<date>-<gpu>-shimcost.log (RESULTS_DIR defaults to
# results/ beside this script).
#
# About 3 minutes on an H200 host with the defaults (estimated from a launch
# costing ~4 µs there): ~15-20 s per shimcost run, a few s for cuda-prog,
# ~20 s per PyTorch run but up to ~1 minute for the one under torch.compile
# (its compilation). Each run's time is in the raw file ("### TAG (rc, s)").
#
#   SHIMCOST_ARGS="--launches 100000 --reps 3"   passed to shimcost
#   TORCH=0                                      skip every PyTorch part
#   TORCH_ARGS="..."                             passed to the training runs
#   COMPILE=0                                    skip the torch.compile check
#   COMPILE_ARGS="--layers 2 --steps 2"          its torch_launches.py options (the default)
#   GEMM=0                                       skip the cuBLAS check
#   GEMM_ARGS="--gemm-n 4096"                    its torch_launches.py options (besides --gemm)
#   TIMEOUT=1800                                 seconds each run may take
#
# Exit 0; 1 when a run fails, the shim is not in place in the run that should
# have it, the launch counts differ, or a launch did not pass the shim; 77
# when there is no GPU.
set -u
here=$(cd "$(dirname "$0")" && pwd)
if [ -z "${B:-}" ]; then
	B=
	if [ -x "$here/../../../bin/criu" ]; then B=$(cd "$here/../../.." && pwd); else
		for d in "$here"/../build/bundle/gpucr-*/; do
			[ -d "$d" ] && B=$(cd "$d" && pwd) && break
		done
	fi
fi
if [ -z "$B" ] || [ ! -x "$B/bin/criu" ]; then
	echo "shimcost: no bundle found: run 'make bundle' first"
	exit 1
fi
[ -x "$B/bin/shimcost" ] || { echo "shimcost: $B/bin/shimcost is missing (the bundle was built without nvcc?)"; exit 1; }
[ -f "$B/lib/gpucr/libcuda.so.1" ] || { echo "shimcost: $B/lib/gpucr/libcuda.so.1 (the shim) is missing"; exit 1; }
if ! nvidia-smi -L >/dev/null 2>&1; then
	echo "shimcost: no NVIDIA GPU here (nvidia-smi -L failed): nothing to measure, skipped"
	exit 77
fi

gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | tr ' ' '-' | tr -cd 'A-Za-z0-9-')
RESULTS_DIR=${RESULTS_DIR:-$here/results}
raw=${1:-${OUT:-}}
if [ -z "$raw" ]; then
	mkdir -p "$RESULTS_DIR"
	raw=$RESULTS_DIR/$(date -u +%F)-$gpu-shimcost.log
elif [ -d "$raw" ]; then
	raw=${raw%/}/$(date -u +%F)-$gpu-shimcost.log
fi
tmp=$(mktemp -d /tmp/gpucr-shimcost.XXXXXX) || exit 1
trap 'rm -rf "$tmp"' EXIT

# The run without the shim must not find it through an inherited path.
plain_ldp=$(printf '%s' "${LD_LIBRARY_PATH:-}" | tr ':' '\n' | grep -vxF "$B/lib/gpucr" | paste -sd: -)
noshim=(env -u GPUCR_DAEMON LD_LIBRARY_PATH="$plain_ldp")
shim=(env LD_LIBRARY_PATH="$B/lib/gpucr${plain_ldp:+:$plain_ldp}" GPUCR_DAEMON=0)
TO=${TIMEOUT:-1800}

COMPILE_ARGS=${COMPILE_ARGS-"--layers 2 --steps 2"}
cudaprog_args=(--gib 0.5 --steps 10 --step-ms 0 --escape --counts)

{
	echo "# gpucr shimcost $(date -u +%FT%TZ)"
	echo "# host: $(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | head -1); $(nproc) CPUs; kernel $(uname -r)"
	echo "# command: B=$B bash $here/shimcost.sh $raw (SHIMCOST_ARGS='${SHIMCOST_ARGS:-}', TORCH=${TORCH:-1}, TORCH_ARGS='${TORCH_ARGS:-}', COMPILE=${COMPILE:-1}, COMPILE_ARGS='$COMPILE_ARGS', GEMM=${GEMM:-1}, GEMM_ARGS='${GEMM_ARGS:-}')"
	echo "# shim run: LD_LIBRARY_PATH=$B/lib/gpucr${plain_ldp:+:$plain_ldp} GPUCR_DAEMON=0"
} >"$raw"

fail=0
start=$SECONDS
# run_one TAG CMD...: output to $tmp/TAG and the raw file; rc 77 passes through.
run_one() {
	local tag=$1 rc t0=$SECONDS
	shift
	echo "shimcost: running $tag ..." >&2
	timeout "$TO" "$@" >"$tmp/$tag" 2>&1
	rc=$?
	{ echo "### $tag (rc=$rc, $((SECONDS - t0)) s)"; cat "$tmp/$tag"; } >>"$raw"
	if [ $rc = 77 ]; then
		echo "shimcost: $tag: skipped: $(tail -1 "$tmp/$tag")"
		exit 77
	fi
	if [ $rc != 0 ]; then
		echo "shimcost: $tag failed (rc=$rc):"
		tail -5 "$tmp/$tag" | sed 's/^/  /'
		fail=1
		return 1
	fi
}

# check_shim TAG WANT: the run's own report of whether the shim was loaded.
check_shim() {
	local got
	got=$(grep -m1 -o ' shim=[01]' "$tmp/$1" | cut -d= -f2)
	if [ "$got" != "$2" ]; then
		echo "shimcost: $1: shim=${got:-?} where shim=$2 was wanted ($(grep -m1 -o 'libcuda=[^ ]*' "$tmp/$1"))"
		fail=1
		return 1
	fi
}

# kv LINE KEY: the value of KEY=VALUE in LINE, the key matched whole.
kv() { printf ' %s\n' "$1" | grep -oE " $2=[^ ]*" | head -1 | cut -d= -f2; }

# check_counted TAG LINEKEY PROG_KERNELS LABEL RAWKEY: a program that
# reports, in one LINEKEY line at its end, the launches, copies and memsets it
# issued and the shim's counts of them (shim_kernels=... or
# shim_counts=unavailable). Every launch passed the shim when shim_kernels
# equals the program's count (key PROG_KERNELS). Copies and memsets are shown
# side by side, not judged: the CUDA runtime may make its own, which the shim
# counts too.
check_counted() {
	local tag=$1 key=$2 pk=$3 label=$4 rk=$5 line p s what pc sc d out=""
	line=$(grep -m1 "^$key " "$tmp/$tag" 2>/dev/null)
	if [ -z "$line" ]; then
		echo "every kernel launch passed the shim ($label): NO (no $key line: the run did not finish)"
		echo "$rk ok=0 counts=missing" >>"$raw"
		fail=1
		return 1
	fi
	p=$(kv "$line" "$pk") s=$(kv "$line" shim_kernels)
	if [ -z "$s" ]; then
		echo "every kernel launch passed the shim ($label): NO (the shim's counts are unavailable; program $p)"
		echo "$rk ok=0 program_kernels=$p shim_counts=unavailable" >>"$raw"
		fail=1
		return 1
	fi
	for what in copies memsets; do
		pc=$(kv "$line" $what) sc=$(kv "$line" shim_$what)
		if ! [[ $pc =~ ^[0-9]+$ && $sc =~ ^[0-9]+$ ]]; then
			out+="; $what: program ${pc:-?}, shim ${sc:-?}"
			continue
		fi
		d=$((sc - pc))
		if [ $d = 0 ]; then
			out+="; $what: program $pc, shim $sc (equal)"
		elif [ $d -gt 0 ]; then
			out+="; $what: program $pc, shim $sc ($d more: the runtime's own)"
		else
			out+="; $what: program $pc, shim $sc ($((-d)) FEWER than issued)"
		fi
	done
	echo "$rk ok=$([ "$p" = "$s" ] && echo 1 || echo 0) program_kernels=$p shim_kernels=$s" \
		"program_copies=$(kv "$line" copies) shim_copies=$(kv "$line" shim_copies)" \
		"program_memsets=$(kv "$line" memsets) shim_memsets=$(kv "$line" shim_memsets)" \
		"shim_graphs=$(kv "$line" shim_graphs)" >>"$raw"
	if [ "$p" = "$s" ]; then
		echo "every kernel launch passed the shim ($label): yes (shim $s, program $p)"
	else
		echo "every kernel launch passed the shim ($label): NO (shim $s, program $p)"
		fail=1
	fi
	echo "  side by side, not judged: ${out#; }"
	[ "$p" = "$s" ]
}

# check_wrapped TAG LABEL RAWKEY: in a torch_launches.py run with the shim,
# every launch passed one of its wrappers: in each measured step the shim's
# kernel-launch count equals the profiler's kernel launch calls (launch_calls
# less graph launches), its graph-launch count the profiler's graph launch
# calls, and, with no graph launched, the kernels the profiler saw run.
# Reports step 1, or the first step that differs.
check_wrapped() {
	local tag=$1 label=$2 rk=$3 line ok
	if ! grep -q '^TORCHLAUNCH step=' "$tmp/$tag" 2>/dev/null; then
		echo "every kernel launch passed the shim ($label): NO ($tag measured no step)"
		echo "$rk ok=0 steps=0" >>"$raw"
		fail=1
		return 1
	fi
	line=$(awk '
	function val(k,   i) {
		for (i = 1; i <= NF; i++)
			if (index($i, k "=") == 1)
				return substr($i, length(k) + 2)
		return ""
	}
	$1 == "TORCHLAUNCH" && $2 ~ /^step=/ {
		n++
		sk = val("shim_kernels"); sg = val("shim_graphs")
		if (sk !~ /^[0-9]+$/ || sg !~ /^[0-9]+$/) { unavailable = 1; next }
		sk += 0; sg += 0
		pk = val("kernels") + 0; pg = val("graph_launch_calls") + 0; pl = val("launch_calls") - pg
		bad = sk != pl || sg != pg || (pg == 0 && sk != pk)
		nbad += bad
		if (rep == "" || (bad && !repbad)) {
			rep = sprintf("step=%s shim_kernels=%d shim_graphs=%d profiler_kernel_launch_calls=%d profiler_graph_launch_calls=%d profiler_kernels=%d",
				      substr($2, 6), sk, sg, pl, pg, pk)
			repbad = bad
		}
	}
	END {
		if (unavailable)
			printf "ok=0 steps=%d shim_counts=unavailable\n", n
		else
			printf "ok=%d steps=%d bad_steps=%d %s\n", nbad == 0, n, nbad, rep
	}' "$tmp/$tag")
	echo "$rk $line" >>"$raw"
	ok=$(kv "$line" ok)
	if [ -n "$(kv "$line" shim_counts)" ]; then
		echo "every kernel launch passed the shim ($label): NO (the shim's counts are unavailable in $tag)"
	elif [ "$ok" = 1 ]; then
		echo "every kernel launch passed the shim ($label): yes (shim $(kv "$line" shim_kernels), profiler $(kv "$line" profiler_kernel_launch_calls) per step, over $(kv "$line" steps) steps)"
	else
		echo "every kernel launch passed the shim ($label): NO (shim $(kv "$line" shim_kernels), profiler $(kv "$line" profiler_kernel_launch_calls) launch calls and $(kv "$line" profiler_kernels) kernels in step $(kv "$line" step); graph launches: shim $(kv "$line" shim_graphs), profiler $(kv "$line" profiler_graph_launch_calls); $(kv "$line" bad_steps) of $(kv "$line" steps) steps differ)"
	fi
	if [ "$ok" != 1 ]; then
		fail=1
		return 1
	fi
}

# shellcheck disable=SC2086 # SHIMCOST_ARGS is a list of words
run_one shimcost-without "${noshim[@]}" "$B/bin/shimcost" ${SHIMCOST_ARGS:-} &&
	check_shim shimcost-without 0
# shellcheck disable=SC2086
run_one shimcost-with "${shim[@]}" "$B/bin/shimcost" ${SHIMCOST_ARGS:-} &&
	check_shim shimcost-with 1

if [ -s "$tmp/shimcost-without" ] && [ -s "$tmp/shimcost-with" ]; then
	echo
	grep -h '^SHIMCOST-INFO device=' "$tmp/shimcost-without" | head -1 | sed 's/^SHIMCOST-INFO /# /'
	# noise: the larger spread (max - min over the repetitions) of the two
	# runs' figure; a difference no larger is within the run-to-run noise.
	awk -v RAW="$raw" '
	function val(s, k,   i, n, kv) {
		n = split(s, kv, " ")
		for (i = 1; i <= n; i++)
			if (index(kv[i], k "=") == 1)
				return substr(kv[i], length(k) + 2)
		return ""
	}
	function abs(x) { return x < 0 ? -x : x }
	$1 != "SHIMCOST" { next }
	{
		name = val($0, "name")
		sp = val($0, "max") - val($0, "min")
		r = val($0, "reps") + 0
		if (FILENAME == ARGV[1]) {
			a[name] = val($0, "value"); unit[name] = val($0, "unit"); order[++n] = name
			sa[name] = sp; ra[name] = r
		} else {
			b[name] = val($0, "value"); sb[name] = sp; rb[name] = r
		}
		if (r > 0 && (reps == "" || r < reps))
			reps = r
	}
	END {
		printf "%-40s %-5s %12s %12s %12s %8s %10s\n", "figure (median of " (reps == "" ? "?" : reps) " reps)",
		       "unit", "without", "with", "difference", "%", "noise"
		for (i = 1; i <= n; i++) {
			k = order[i]
			if (!(k in b)) { printf "%-40s %-5s %12.3f %12s\n", k, unit[k], a[k], "-"; continue }
			d = b[k] - a[k]
			noise = sa[k] > sb[k] ? sa[k] : sb[k]
			inn = abs(d) <= noise
			printf "%-40s %-5s %12.3f %12.3f %+12.3f %+7.1f%% %10.3f%s\n", k, unit[k], a[k], b[k], d,
			       (a[k] ? 100 * d / a[k] : 0), noise, inn ? " *" : ""
			printf "SHIMCOST-DIFF name=%s unit=%s without=%.3f with=%.3f diff=%.3f pct=%.2f noise=%.3f within_noise=%d reps_without=%d reps_with=%d\n",
			       k, unit[k], a[k], b[k], d, (a[k] ? 100 * d / a[k] : 0), noise, inn, ra[k], rb[k] >> RAW
			if (k ~ /^paired\./ && (pw == "" || b[k] + 0 > pd)) { pw = k; pd = b[k] + 0; pf = a[k] + 0; ps = sb[k] + 0 }
			if (k ~ /^launch\./) {
				nl++; nin += inn
				if (worst == "" || d > wd) { worst = k; wd = d; wn = noise; wr = (ra[k] < rb[k] ? ra[k] : rb[k]) }
			}
		}
		print "noise: the larger spread (max - min over the repetitions) of the two runs; *: the difference is no larger"
		if (worst != "") {
			wi = abs(wd) <= wn
			printf "\nadded cost per launch, worst case: %s %+.0f ns (issue 3 target: <= 1000 ns): %s; %s the run-to-run noise (spread %.0f ns over %d reps); %d of %d launch differences within the noise\n",
			       worst, wd, (wd <= 1000 ? "within" : "OVER"), (wi ? "the difference is within" : "the difference exceeds"), wn, wr, nin, nl
			printf "SHIMCOST-VERDICT launch_worst=%s added_ns=%.1f target_ns=1000 ok=%d noise_ns=%.1f within_noise=%d reps=%d launch_within_noise=%d launch_figures=%d\n",
			       worst, wd, (wd <= 1000), wn, wi, wr, nin, nl >> RAW
		}
		if (pw != "") {
			printf "added cost per launch, paired in one process (the shim'"'"'s cuLaunchKernel against the real driver'"'"'s, batches alternating), worst case: %s %+.0f ns (spread %.0f ns over the repetitions; the same measurement without the shim, driver against driver: %+.0f ns) (issue 3 target: <= 1000 ns): %s\n",
			       pw, pd, ps, pf, (pd <= 1000 ? "within" : "OVER")
			printf "SHIMCOST-PAIRED worst=%s added_ns=%.1f spread_ns=%.1f floor_ns=%.1f target_ns=1000 ok=%d\n", pw, pd, ps, pf, (pd <= 1000) >> RAW
		}
	}' "$tmp/shimcost-without" "$tmp/shimcost-with"
fi

# Every launch through the shim: shimcost (driver API) and cuda-prog (runtime API).
echo
if [ -s "$tmp/shimcost-with" ]; then
	check_counted shimcost-with SHIMCOST-COUNTS launches \
		"driver API program: shimcost, cuLaunchKernel linked and as an entry point, cudaLaunchKernel" \
		SHIMCOST-DRIVER-WRAPPED
fi
if [ -x "$B/tests/gpu/cuda-prog" ]; then
	run_one cuda-prog-with "${shim[@]}" "$B/tests/gpu/cuda-prog" "${cudaprog_args[@]}" --out "$tmp/cuda-prog.out"
	check_counted cuda-prog-with CUDAPROG-COUNTS kernels \
		"CUDA runtime API program: cuda-prog" SHIMCOST-CUDAPROG-WRAPPED
else
	echo "every kernel launch passed the shim (CUDA runtime API program: cuda-prog): NO ($B/tests/gpu/cuda-prog is missing: the bundle was built without nvcc?)"
	echo "SHIMCOST-CUDAPROG-WRAPPED ok=0 counts=missing" >>"$raw"
	fail=1
fi

# Kernels per PyTorch step: training without and with the shim, then with
# the shim under torch.compile and a cuBLAS GEMM loop.
if [ "${TORCH:-1}" != 0 ]; then
	if python3 -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
		tl=$B/share/gpucr/bench/torch_launches.py
		[ -f "$tl" ] || tl=$here/torch_launches.py
		# shellcheck disable=SC2086 # TORCH_ARGS is a list of words
		run_one torch-without "${noshim[@]}" python3 "$tl" --names ${TORCH_ARGS:-} &&
			check_shim torch-without 0
		# shellcheck disable=SC2086
		run_one torch-with "${shim[@]}" python3 "$tl" --names ${TORCH_ARGS:-} &&
			check_shim torch-with 1
		# sum TAG KEY: KEY's value in TAG's summary line (the key matched whole:
		# launch_calls_per_step is not graph_launch_calls_per_step).
		sum() { kv "$(grep -h -m1 '^TORCHLAUNCH summary' "$tmp/$1" 2>/dev/null)" "$2"; }
		k_without=$(sum torch-without kernels_per_step) k_with=$(sum torch-with kernels_per_step)
		l_without=$(sum torch-without launch_calls_per_step) l_with=$(sum torch-with launch_calls_per_step)
		if [ -n "$k_without" ] && [ -n "$k_with" ]; then
			same=same
			if [ "$k_without" != "$k_with" ] || [ "$l_without" != "$l_with" ]; then
				same=DIFFERENT
				fail=1
			fi
			echo
			printf '%-40s %12s %12s\n' "torch training step (profiler)" without with
			printf '%-40s %12s %12s\n' "kernels per step" "$k_without" "$k_with"
			printf '%-40s %12s %12s\n' "launch API calls per step" "$l_without" "$l_with"
			printf '%-40s %12s %12s\n' "graph launch calls per step" "$(sum torch-without graph_launch_calls_per_step)" "$(sum torch-with graph_launch_calls_per_step)"
			printf '%-40s %12s %12s\n' "steady over the measured steps" "$(sum torch-without steady)" "$(sum torch-with steady)"
			echo "kernels per step with and without the shim (profiler): $same"
			echo "SHIMCOST-TORCH kernels_without=$k_without kernels_with=$k_with launch_calls_without=$l_without launch_calls_with=$l_with same=$([ $same = same ] && echo 1 || echo 0)" >>"$raw"
			[ $same = same ] || diff <(grep '^TORCHLAUNCH-KERNEL step=1 ' "$tmp/torch-without") \
				<(grep '^TORCHLAUNCH-KERNEL step=1 ' "$tmp/torch-with") | head -20
		fi
		echo
		check_wrapped torch-with "PyTorch training step" SHIMCOST-TORCH-WRAPPED
		if [ "${COMPILE:-1}" != 0 ]; then
			# shellcheck disable=SC2086 # COMPILE_ARGS is a list of words
			run_one torch-compile-with "${shim[@]}" python3 "$tl" --compile $COMPILE_ARGS &&
				check_shim torch-compile-with 1
			check_wrapped torch-compile-with "torch.compile training step, Triton kernels" SHIMCOST-COMPILE-WRAPPED
		fi
		if [ "${GEMM:-1}" != 0 ]; then
			# shellcheck disable=SC2086 # GEMM_ARGS is a list of words
			run_one torch-gemm-with "${shim[@]}" python3 "$tl" --gemm ${GEMM_ARGS:-} &&
				check_shim torch-gemm-with 1
			check_wrapped torch-gemm-with "cuBLAS GEMMs: torch matmul, addmm, bmm" SHIMCOST-GEMM-WRAPPED
		fi
	else
		echo
		echo "PyTorch checks (training, torch.compile, cuBLAS): skipped (python3 cannot import torch with a CUDA GPU)"
	fi
fi

echo
echo "shimcost.sh took $((SECONDS - start)) s; raw output: $raw"
exit $fail
