#!/usr/bin/env bash
# What gpucr's driver shim costs an application that is never checkpointed
# (issue 3's benchmarks), on a GPU host, from the bundle:
#
#   bash $B/share/gpucr/bench/shimcost.sh [RAWFILE]
#
# Runs bin/shimcost (bench/shimcost.cu: per-launch host cost, alloc/free cost
# 256 B..1 GiB, 64 MiB pinned copies) once without the shim and once with it
# (LD_LIBRARY_PATH=$B/lib/gpucr GPUCR_DAEMON=0), then, where torch is
# importable, bench/torch_launches.py both ways (kernels launched per
# training step, as the profiler counts them: must be the same) and, in the
# run with the shim, the shim's own count of the launches that passed its
# wrappers against the profiler's launch calls and kernels of the same steps
# (must be equal: every launch passed the shim). Prints a side-by-side table
# (without, with, difference) and writes both runs' raw output and the
# comparison to RAWFILE, or $OUT, or RESULTS_DIR/<date>-<gpu>-shimcost.log
# (RESULTS_DIR defaults to results/ beside this script).
#
#   SHIMCOST_ARGS="--launches 100000 --reps 3"   passed to shimcost
#   TORCH=0                                      skip the PyTorch launch count
#   TORCH_ARGS="--compile"                       passed to torch_launches.py
#
# Exit 0; 1 when a run fails, the shim is not in place in the run that should
# have it, the launch counts differ, or a launch did not pass the shim; 77
# when there is no GPU.
set -u
here=$(cd "$(dirname "$0")" && pwd)
if [ -z "${B:-}" ]; then
	if [ -x "$here/../../../bin/criu" ]; then B=$(cd "$here/../../.." && pwd); else
		B=$(ls -d "$here"/../build/bundle/gpucr-*/ 2>/dev/null | head -1); B=${B%/}; fi
fi
[ -n "$B" ] && [ -x "$B/bin/criu" ] || { echo "shimcost: no bundle found: run 'make bundle' first"; exit 1; }
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

{
	echo "# gpucr shimcost $(date -u +%FT%TZ)"
	echo "# host: $(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | head -1); $(nproc) CPUs; kernel $(uname -r)"
	echo "# command: B=$B bash $here/shimcost.sh $raw (SHIMCOST_ARGS='${SHIMCOST_ARGS:-}', TORCH=${TORCH:-1}, TORCH_ARGS='${TORCH_ARGS:-}')"
	echo "# shim run: LD_LIBRARY_PATH=$B/lib/gpucr${plain_ldp:+:$plain_ldp} GPUCR_DAEMON=0"
} >"$raw"

fail=0
# run_one TAG CMD...: output to $tmp/TAG and the raw file; rc 77 passes through.
run_one() {
	local tag=$1 rc
	shift
	echo "shimcost: running $tag ..." >&2
	timeout "$TO" "$@" >"$tmp/$tag" 2>&1
	rc=$?
	{ echo "### $tag (rc=$rc)"; cat "$tmp/$tag"; } >>"$raw"
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

# check_wrapped TAG: in a torch_launches.py run with the shim, every launch
# passed one of its wrappers: in each measured step the shim's kernel-launch
# count equals the profiler's kernel launch calls (launch_calls less graph
# launches), its graph-launch count the profiler's graph launch calls, and,
# with no graph launched, the kernels the profiler saw run. Reports step 1,
# or the first step that differs.
check_wrapped() {
	local line ok
	if ! grep -q '^TORCHLAUNCH step=' "$tmp/$1" 2>/dev/null; then
		echo "every kernel launch passed the shim: unknown ($1 measured no step)"
		echo "SHIMCOST-TORCH-WRAPPED ok=0 steps=0" >>"$raw"
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
	}' "$tmp/$1")
	echo "SHIMCOST-TORCH-WRAPPED $line" >>"$raw"
	ok=$(printf '%s\n' "$line" | grep -o '^ok=[01]' | cut -d= -f2)
	wval() { printf '%s\n' "$line" | grep -o " $1=[^ ]*" | cut -d= -f2; }
	if [ -n "$(wval shim_counts)" ]; then
		echo "every kernel launch passed the shim: NO (the shim's counts are unavailable in $1)"
	elif [ "$ok" = 1 ]; then
		echo "every kernel launch passed the shim: yes (shim $(wval shim_kernels), profiler $(wval profiler_kernel_launch_calls) per step, over $(wval steps) steps)"
	else
		echo "every kernel launch passed the shim: NO (shim $(wval shim_kernels), profiler $(wval profiler_kernel_launch_calls) launch calls and $(wval profiler_kernels) kernels in step $(wval step); graph launches: shim $(wval shim_graphs), profiler $(wval profiler_graph_launch_calls); $(wval bad_steps) of $(wval steps) steps differ)"
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
	awk -v RAW="$raw" '
	function val(s, k,   i, n, kv) {
		n = split(s, kv, " ")
		for (i = 1; i <= n; i++)
			if (index(kv[i], k "=") == 1)
				return substr(kv[i], length(k) + 2)
		return ""
	}
	$1 != "SHIMCOST" { next }
	{
		name = val($0, "name")
		if (FILENAME == ARGV[1]) { a[name] = val($0, "value"); unit[name] = val($0, "unit"); order[++n] = name }
		else b[name] = val($0, "value")
	}
	END {
		printf "%-40s %-5s %12s %12s %12s %8s\n", "figure (median)", "unit", "without", "with", "difference", "%"
		for (i = 1; i <= n; i++) {
			k = order[i]
			if (!(k in b)) { printf "%-40s %-5s %12.3f %12s\n", k, unit[k], a[k], "-"; continue }
			d = b[k] - a[k]
			printf "%-40s %-5s %12.3f %12.3f %+12.3f %+7.1f%%\n", k, unit[k], a[k], b[k], d, (a[k] ? 100 * d / a[k] : 0)
			printf "SHIMCOST-DIFF name=%s unit=%s without=%.3f with=%.3f diff=%.3f pct=%.2f\n", k, unit[k], a[k], b[k], d, (a[k] ? 100 * d / a[k] : 0) >> RAW
			if (k ~ /^launch\./ && (worst == "" || d > wd)) { worst = k; wd = d }
		}
		if (worst != "") {
			printf "\nadded cost per launch, worst case: %s %+.0f ns (issue 3 target: <= 1000 ns): %s\n", worst, wd, (wd <= 1000 ? "within" : "OVER")
			printf "SHIMCOST-VERDICT launch_worst=%s added_ns=%.1f target_ns=1000 ok=%d\n", worst, wd, (wd <= 1000) >> RAW
		}
	}' "$tmp/shimcost-without" "$tmp/shimcost-with"
fi

# Kernels per PyTorch training step, without and with the shim.
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
		sum() { grep -h '^TORCHLAUNCH summary' "$tmp/$1" 2>/dev/null | grep -o "$2=[0-9a-z]*" | cut -d= -f2; }
		kw=$(sum torch-without kernels_per_step) kv=$(sum torch-with kernels_per_step)
		lw=$(sum torch-without launch_calls_per_step) lv=$(sum torch-with launch_calls_per_step)
		if [ -n "$kw" ] && [ -n "$kv" ]; then
			same=same
			if [ "$kw" != "$kv" ] || [ "$lw" != "$lv" ]; then
				same=DIFFERENT
				fail=1
			fi
			echo
			printf '%-40s %12s %12s\n' "torch training step (profiler)" without with
			printf '%-40s %12s %12s\n' "kernels per step" "$kw" "$kv"
			printf '%-40s %12s %12s\n' "launch API calls per step" "$lw" "$lv"
			printf '%-40s %12s %12s\n' "steady over the measured steps" "$(sum torch-without steady)" "$(sum torch-with steady)"
			echo "kernels per step with and without the shim (profiler): $same"
			echo "SHIMCOST-TORCH kernels_without=$kw kernels_with=$kv launch_calls_without=$lw launch_calls_with=$lv same=$([ $same = same ] && echo 1 || echo 0)" >>"$raw"
			[ $same = same ] || diff <(grep '^TORCHLAUNCH-KERNEL step=1 ' "$tmp/torch-without") \
				<(grep '^TORCHLAUNCH-KERNEL step=1 ' "$tmp/torch-with") | head -20
		fi
		check_wrapped torch-with
	else
		echo
		echo "torch launch count: skipped (python3 cannot import torch with a CUDA GPU)"
	fi
fi

echo
echo "raw output: $raw"
exit $fail
