#!/usr/bin/env bash
# gpucr's real-GPU suite: runs from a bundle on a GPU host (`make gpu-test`
# in a source tree uses build/bundle/gpucr-VERSION). One line per check:
# NAME SIZE PASS|FAIL|SKIP figures-or-reason; then "N passed, N failed".
# Results also go to $GPU_TEST_OUT (default: stdout only).
#
# Knobs (environment): SIZES (GiB of the CUDA program, default "1 16";
# stock and gpucr at each; `make bench` adds 4), MODES (gpucr's modes for
# it, default "gpucr gpucr-image"), WORKLOADS (default the four PyTorch
# ones, torch-train-expandable: training with PyTorch's expandable
# segments, and torch-train-expandable-appvmm: the same with
# GPUCR_APP_VMM=1), WORKLOAD_MODES (default "gpucr-image", the harder path; `make
# bench` runs them from retained memory and against the stock path),
# STOCK_SIZES (default SIZES; "" skips the stock path), SHIM_TORCH_VARIANTS,
# IMG_SIZES (each "" skips its part), BIG (64 GiB for gpucr alone:
# auto, 0 or 1), STEPS, SKIP_TORCH, SKIP_GPUCR_CR, KEEP_LOGS=DIR (keep
# CRIU's and gpucrd's logs of each cycle; KEEP_LOGS_MODES to choose),
# ESCAPE_GIB (the escape check's size, default 4; 0 skips it),
# GPU_TEST_BUDGET_S (default 540: checks that would start later are
# skipped, and say so, so that the suite ends with its count inside one
# 10-minute call).
set -u
here=$(cd "$(dirname "$0")" && pwd)
if [ -z "${B:-}" ]; then
	if [ -x "$here/../../../../bin/criu" ]; then
		B=$(cd "$here/../../../.." && pwd)        # inside a bundle
	else
		B=$(ls -d "$here"/../../build/bundle/gpucr-*/ 2>/dev/null | head -1)
		B=${B%/}
	fi
fi
[ -n "$B" ] && [ -x "$B/bin/criu" ] || { echo "no bundle found: run 'make bundle' first"; exit 1; }
WORK=${WORK:-/dev/shm/gpucr-gpu-test}
rm -rf "$WORK"
mkdir -p "$WORK"
export B WORK PATH="$B/bin:$PATH"
. "$B/share/gpucr/tests/gpu/lib.sh"
pass=0 fail=0 skip=0

# over_budget NAME SIZE: true (and a SKIP line) once GPU_TEST_BUDGET_S is spent.
over_budget() {
	[ "$SECONDS" -lt "${GPU_TEST_BUDGET_S:-540}" ] && return 1
	result "$1" "$2" SKIP "not started: the suite's time budget (GPU_TEST_BUDGET_S=${GPU_TEST_BUDGET_S:-540} s) is spent"
	return 0
}

result() { # name size status detail; then when (seconds since the suite started)
	printf '%-28s %-7s %-4s %s [at %ss]\n' "$1" "$2" "$3" "$4" "$SECONDS"
	case $3 in PASS) pass=$((pass + 1)) ;; FAIL) fail=$((fail + 1)) ;; *) skip=$((skip + 1)) ;; esac
}

if ! nvidia-smi -L >/dev/null 2>&1; then
	echo "no NVIDIA GPU here (nvidia-smi -L failed)"
	exit 77
fi
echo "# $(date -u +%F) $(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | head -1), kernel $(uname -r)"

# -- the bundle runs here
v=$(criu --version 2>&1 | head -1)
[[ $v == Version:* ]] && result bundle-criu-version - PASS "$v" || result bundle-criu-version - FAIL "$v"
if out=$(criu check 2>&1); then result bundle-criu-check - PASS "$(echo "$out" | tail -1)"
else result bundle-criu-check - FAIL "$(echo "$out" | grep -i error | head -2 | tr '\n' ' ')"; fi
for p in gpucr gpucrd; do
	if v=$("$B/bin/$p" --version 2>&1); then result "bundle-$p" - PASS "$v"; else result "bundle-$p" - FAIL "$v"; fi
done

# -- references: uninterrupted runs
STEPS=${STEPS:-40}
SIZES=${SIZES:-1 16}
for g in $SIZES; do
	if ! "$B/tests/gpu/cuda-prog" --gib "$g" --steps "$STEPS" --step-ms 50 --out "$WORK/ref-$g.log" 2>"$WORK/ref-$g.err"; then
		result "cuda-prog-reference" "${g}GiB" FAIL "$(cat "$WORK/ref-$g.err")"
	fi
done

# -- the driver checkpoint tool (bench/cuda-checkpoint.c) on a live process
g=1
setsid "$B/tests/gpu/cuda-prog" --gib $g --steps "$STEPS" --step-ms 50 --out "$WORK/cc.log" </dev/null >/dev/null 2>&1 &
pid=$!
if wait_step "$WORK/cc.log" 5 120; then
	st0=$(cuda-checkpoint --get-state --pid $pid 2>&1)
	t0=$(now)
	cuda-checkpoint --action lock --pid $pid --timeout 10000 &&
		cuda-checkpoint --action checkpoint --pid $pid
	rc1=$?
	t1=$(now)
	st1=$(cuda-checkpoint --get-state --pid $pid 2>&1)
	cuda-checkpoint --action restore --pid $pid && cuda-checkpoint --action unlock --pid $pid
	rc2=$?
	t2=$(now)
	wait $pid
	if [ $rc1 = 0 ] && [ $rc2 = 0 ] && [ "$st0" = running ] && [ "$st1" = checkpointed ] &&
		cmp -s "$WORK/cc.log" "$WORK/ref-$g.log"; then
		result cuda-checkpoint-toggle "${g}GiB" PASS "checkpoint $(elapsed $t0 $t1)s restore $(elapsed $t1 $t2)s, output identical"
	else
		result cuda-checkpoint-toggle "${g}GiB" FAIL "states '$st0'/'$st1' rc $rc1/$rc2; output $(cmp -s "$WORK/cc.log" "$WORK/ref-$g.log" && echo same || echo differs)"
	fi
else
	result cuda-checkpoint-toggle "${g}GiB" FAIL "program did not start"
	kill $pid 2>/dev/null
fi

# -- the stock path (CRIU + its cuda plugin): dump, kill, restore
for g in ${STOCK_SIZES-$SIZES}; do
	if r=$(cr_cycle_cuda_prog stock "$g" 10 "$WORK/ref-$g.log" "$STEPS"); then
		set -- $r
		result stock-criu-cuda-prog "${g}GiB" PASS "dump ${1}s restore ${2}s (first step ${3}s) image $(($4 / 1048576)) MiB, output identical"
	else
		result stock-criu-cuda-prog "${g}GiB" FAIL "$r"
	fi
done

# -- the driver shim: same results as without it
SHIM_ENV="LD_LIBRARY_PATH=$B/lib/gpucr${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} GPUCR_DAEMON=0"
g=1
if env $SHIM_ENV "$B/tests/gpu/cuda-prog" --gib $g --steps "$STEPS" --step-ms 0 --out "$WORK/shim-$g.log" 2>"$WORK/shim.err" &&
	cmp -s "$WORK/shim-$g.log" "$WORK/ref-$g.log"; then
	result shim-cuda-prog "${g}GiB" PASS "output identical to the run without the shim"
else
	result shim-cuda-prog "${g}GiB" FAIL "$(tail -2 "$WORK/shim.err" | tr '\n' ' ') $(cmp "$WORK/shim-$g.log" "$WORK/ref-$g.log" 2>&1 | head -1)"
fi
if [ -z "${SKIP_TORCH:-}" ] && python3 -c 'import torch; assert torch.cuda.is_available()' 2>/dev/null; then
	TT=$B/share/gpucr/tests/gpu/torch_train.py
	# (torch.compile under the shim: the torch-compile workload below)
	# (plain PyTorch under the shim: every workload below runs under it and is
	# compared with a reference run without it)
	for variant in ${SHIM_TORCH_VARIANTS-expandable}; do
		extra=() envx=()
		case $variant in
		expandable) envx=(PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True) ;;
		compile) extra=(--compile) ;;
		esac
		env "${envx[@]}" python3 "$TT" --steps 12 --out "$WORK/tt-ref-$variant.log" "${extra[@]}" >"$WORK/tt-ref.err" 2>&1
		t0=$(now)
		env "${envx[@]}" $SHIM_ENV python3 "$TT" --steps 12 --out "$WORK/tt-shim-$variant.log" "${extra[@]}" >"$WORK/tt-shim.err" 2>&1
		rc=$?
		t1=$(now)
		if [ $rc = 0 ] && grep -q done "$WORK/tt-ref-$variant.log" && cmp -s "$WORK/tt-ref-$variant.log" "$WORK/tt-shim-$variant.log"; then
			result "shim-torch-train-$variant" - PASS "12 steps, loss sequence bit-identical ($(elapsed $t0 $t1)s)"
		else
			result "shim-torch-train-$variant" - FAIL "rc $rc; $(tail -3 "$WORK/tt-shim.err" | tr '\n' ' ')"
		fi
	done
else
	result shim-torch-train - SKIP "no PyTorch with CUDA here"
fi

# -- gpucrd's image engine alone: GPU memory -> image -> GPU memory
for g in ${IMG_SIZES-16}; do
	mkdir -p "$WORK/imgbench"
	if out=$("$B/bin/imgbench" --gib "$g" --dir "$WORK/imgbench" 2>&1); then
		w=$(echo "$out" | grep '^write' | grep -o '[0-9.]* GB/s' | head -1)
		rd=$(echo "$out" | grep '^read' | grep -o '[0-9.]* GB/s' | head -1)
		result imgbench-tmpfs "${g}GiB" PASS "GPU->image $w, image->GPU+verify $rd"
		echo "$out" | sed 's/^/    /'
	else
		result imgbench-tmpfs "${g}GiB" FAIL "$(echo "$out" | tail -2 | tr '\n' ' ')"
	fi
	rm -rf "$WORK/imgbench"
done

# -- gpucr's own C/R: needs the shim, the daemon's dump path and the plugin
if [ -f "$B/lib/criu/gpucr_plugin.so" ] && [ -z "${SKIP_GPUCR_CR:-}" ]; then
	start_gpucrd || result gpucrd-start - FAIL "gpucrd did not start: $(tail -3 "$WORK/gpucrd.log")"
	for g in $SIZES; do
		for mode in ${MODES-gpucr gpucr-image}; do
			if r=$(cr_cycle_cuda_prog $mode "$g" 10 "$WORK/ref-$g.log" "$STEPS"); then
				set -- $r
				result "$mode-criu-cuda-prog" "${g}GiB" PASS "dump ${1}s restore ${2}s (first step ${3}s) image $(($4 / 1048576)) MiB, output identical"
			else
				result "$mode-criu-cuda-prog" "${g}GiB" FAIL "$r"
				tail -15 "$WORK/gpucrd.log" | sed 's/^/    gpucrd| /'
			fi
		done
	done
	# PyTorch workloads: training (losses), generation (tokens), a cuBLAS
	# GEMM loop (checksums), torch.compile (Triton kernels): after a restore
	# every step must be bit-identical to an uninterrupted run.
	if python3 -c 'import torch' 2>/dev/null; then
		for name in ${WORKLOADS:-$WORKLOADS_ALL torch-train-expandable torch-train-expandable-appvmm}; do
			over_budget "gpucr-image-criu-$name" - && continue
			cmd=$(workload_cmd "$name") || { result "$name" - FAIL "no such workload"; continue; }
			$cmd "$WORK/$name-ref.log" >"$WORK/$name-ref.err" 2>&1 ||
				{ result "$name-reference" - FAIL "$(tail -2 "$WORK/$name-ref.err" | tr '\n' ' ')"; continue; }
			for mode in ${WORKLOAD_MODES:-gpucr-image}; do
				if r=$(cr_cycle $mode $name 8 "$WORK/$name-ref.log" "$cmd"); then
					set -- $r
					result "$mode-criu-$name" - PASS "dump ${1}s restore ${2}s (first step ${3}s) image $(($4 / 1048576)) MiB, every step identical"
				else
					result "$mode-criu-$name" - FAIL "$r"
					tail -15 "$WORK/gpucrd.log" | sed 's/^/    gpucrd| /'
				fi
			done
		done
	fi
	# A checkpoint of the running program (gpucr dump -R, concurrent), the
	# program killed 8 steps later and the checkpoint restored: the same
	# results; and what the checkpoint cost the program's loop.
	g=${SIZES##* }
	for mode in gpucr gpucr-stop; do
		over_budget "$mode-checkpoint-cuda-prog" "${g}GiB" && continue
		if r=$(ckpt_cycle $mode "cuda-prog-$g" 10 "$WORK/ref-$g.log" "$B/tests/gpu/cuda-prog --gib $g --steps $STEPS --step-ms 50 --out"); then
			set -- $r
			result "$mode-checkpoint-cuda-prog" "${g}GiB" PASS "loop lost ${1} ms, checkpoint ${2}s, restore ${3}s, output identical"
		else
			result "$mode-checkpoint-cuda-prog" "${g}GiB" FAIL "$r"
		fi
	done
	# The same with a kernel that writes through a pointer held in device
	# memory (cuda-prog --escape): no launch decoding sees that write. With
	# no copy in spare GPU memory at T (GPUCR_SPARE=0) and a slow image write
	# (GPUCR_FI_SLICE_DELAY_MS), the program writes memory not yet saved:
	# gpucrd must find the chunk changed, gpucr dump retry with the program
	# stopped, and the image restored give the uninterrupted run's results.
	g=${ESCAPE_GIB:-4}
	if [ "$g" != 0 ] && ! over_budget gpucr-escape-checkpoint-cuda-prog "${g}GiB"; then
		name=gpucr-escape-checkpoint-cuda-prog
		ecmd="$B/tests/gpu/cuda-prog --gib $g --steps 40 --step-ms 50 --escape --out"
		if ! $ecmd "$WORK/ref-esc-$g.log" 2>"$WORK/ref-esc-$g.err"; then
			result "$name" "${g}GiB" FAIL "reference run: $(tail -2 "$WORK/ref-esc-$g.err" | tr '\n' ' ')"
		else
			# About 2.5 s to write the image: gpucrd's writers (one per CPU, at
			# most 16) each sleep this long after every 32 MiB slice; the
			# program runs again ~1 s after T.
			nw=$(getconf _NPROCESSORS_ONLN 2>/dev/null || echo 16)
			[ "$nw" -gt 16 ] && nw=16
			per=$(((g * 32 + 5 + nw - 1) / nw)) # slices: g GiB, two 64 MiB victims, the small buffers
			delay=$((2500 / per))
			[ $delay -lt 10 ] && delay=10
			stop_gpucrd
			log0=$(wc -l <"$WORK/gpucrd.log" 2>/dev/null || echo 0)
			if ! GPUCR_SPARE=0 GPUCR_FI_SLICE_DELAY_MS=$delay start_gpucrd; then
				result "$name" "${g}GiB" FAIL "gpucrd (GPUCR_SPARE=0) did not start: $(tail -3 "$WORK/gpucrd.log" | tr '\n' ' ')"
			else
				r=$(CR_TIMEOUT=120 ckpt_cycle gpucr "cuda-prog-escape-$g" 10 "$WORK/ref-esc-$g.log" "$ecmd")
				rc=$?
				d=$WORK/ck-gpucr-cuda-prog-escape-$g
				# Only this check's program talked to this gpucrd: its lines are the log's new ones.
				elog=$(tail -n +$((log0 + 1)) "$WORK/gpucrd.log")
				esc=$(echo "$elog" | grep -E 'pid [0-9]+[ :].*changed while it was being saved: a GPU write escaped prediction' | head -1 |
					sed -n 's/.*\(pid [0-9]*\).*\(buffer 0x[0-9a-f]*\): chunk at \(offset [0-9]*\).*/\1 \2 \3/p')
				why=()
				[ -n "$esc" ] || why+=("gpucrd logged no escaped write")
				grep -q "retrying with the process stopped" "$d/dump.out" 2>/dev/null ||
					why+=("gpucr dump did not retry with the process stopped")
				[ $rc = 0 ] || why+=("$(echo "$r" | tr '\n' ' ')")
				if [ ${#why[@]} = 0 ]; then
					read -r _ ck_s rs_s <<<"$r"
					result "$name" "${g}GiB" PASS "escape caught ($esc), retried with the program stopped; checkpoint ${ck_s}s, restore ${rs_s}s, output identical"
				else
					detail=$(printf '%s; ' "${why[@]}")
					result "$name" "${g}GiB" FAIL "${detail%; }"
					sed 's/^/    dump| /' "$d/dump.out" 2>/dev/null | tail -8
					echo "$elog" | tail -12 | sed 's/^/    gpucrd| /'
				fi
			fi
			stop_gpucrd
			start_gpucrd || result gpucrd-start - FAIL "gpucrd did not start: $(tail -3 "$WORK/gpucrd.log")"
		fi
	fi
	# A CUDA program not started under gpucr, with gpucr's plugin: the
	# driver-only fallback (what CRIU's own cuda plugin does).
	g=${SIZES%% *}
	if over_budget plain-criu-cuda-prog "${g}GiB"; then
		:
	elif r=$(CR_TIMEOUT=120 cr_cycle_cuda_prog plain "$g" 10 "$WORK/ref-$g.log" "$STEPS"); then
		set -- $r
		result "plain-criu-cuda-prog" "${g}GiB" PASS "dump ${1}s restore ${2}s (first step ${3}s) image $(($4 / 1048576)) MiB, output identical"
	else
		result "plain-criu-cuda-prog" "${g}GiB" FAIL "$r"
	fi
	# gpucr alone at 64 GiB: the stock path keeps a full copy in host
	# memory and then writes an image of the same size (does not fit a
	# 128 GiB host). On by default where the GPU has 80 GiB and the host
	# 100 GiB; BIG=0 skips it, BIG=1 forces it.
	big=${BIG:-auto}
	if [ "$big" = auto ]; then
		gmem=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1)
		hmem=$(awk '/MemTotal/ { print int($2 / 1048576) }' /proc/meminfo)
		[ "${gmem:-0}" -ge 81920 ] && [ "$hmem" -ge 100 ] && big=1 || big=0
	fi
	if [ "$big" = 1 ] && ! over_budget gpucr-criu-cuda-prog 64GiB; then
		"$B/tests/gpu/cuda-prog" --gib 64 --steps 20 --step-ms 50 --out "$WORK/ref-64.log"
		if r=$(cr_cycle_cuda_prog gpucr 64 8 "$WORK/ref-64.log" 20); then
			set -- $r
			result gpucr-criu-cuda-prog 64GiB PASS "dump ${1}s restore ${2}s (first step ${3}s) image $(($4 / 1048576)) MiB, output identical"
		else
			result gpucr-criu-cuda-prog 64GiB FAIL "$r"
		fi
	fi
	# A migration's dump (gpucr dump --pre-copy): the GPU memory written
	# while the program runs, then at T only the chunks that changed; then
	# gpucrd restarted and the program restored from the image.
	g=${SIZES##* }
	if ! over_budget gpucr-precopy-criu-cuda-prog "${g}GiB"; then
		if r=$(cr_cycle_cuda_prog gpucr-precopy "$g" 10 "$WORK/ref-$g.log" "$STEPS"); then
			set -- $r
			pc=$(grep -h "finished from its pre-copy" "$WORK/cr-gpucr-precopy-cuda-prog-$g/dump.out" 2>/dev/null | sed 's/.*: finished/finished/')
			result gpucr-precopy-criu-cuda-prog "${g}GiB" PASS "gpucr dump --pre-copy ${1}s, restore from the image ${2}s, output identical; ${pc:-no pre-copy figures}"
		else
			result gpucr-precopy-criu-cuda-prog "${g}GiB" FAIL "$r"
			tail -15 "$WORK/gpucrd.log" | sed 's/^/    gpucrd| /'
		fi
	fi
	stop_gpucrd
else
	result gpucr-criu-cuda-prog - SKIP "gpucr's CRIU plugin is not in this build yet"
fi

rm -rf "$WORK"
echo "$pass passed, $fail failed, $skip skipped"
[ $fail = 0 ]
