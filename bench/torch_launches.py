"""Kernel launches in one step of a PyTorch workload, counted by
torch.profiler (CUPTI) and, when gpucr's shim is the libcuda.so.1 in use, by
the shim itself (gpucr_shim_counts, libintercept/gpucr_shim.h). The workload
is a training step of the small GPT-style model of tests/gpu/torch_train.py
(random init, no downloads), optionally under torch.compile, or with --gemm
a loop of cuBLAS GEMMs like tests/gpu/gemm_loop.py's. Run it without and
with the shim (LD_LIBRARY_PATH=$B/lib/gpucr GPUCR_DAEMON=0): the profiler's
counts must be the same, and with the shim every launch must have passed
one of its wrappers (bench/shimcost.sh does both runs and compares).

    python3 torch_launches.py [--warmup N] [--steps N] [--compile | --gemm] [--names]
                              [--dim D] [--layers L] [--batch B] [--ctx C] [--vocab V]
                              [--gemm-n N] [--gemm-iters K]

--gemm: each step multiplies an N x N fp32 state by a fixed matrix
(torch.matmul, no TF32) and normalises it, K times, then runs one bf16
GEMM, one addmm (GEMM with a bias) and one batched GEMM (torch.bmm) on it,
so several cuBLAS/cuBLASLt paths launch; --dim ... --vocab do not apply.
--compile: the model under torch.compile (default mode: no CUDA graphs);
not with --gemm.

Each measured step is profiled on its own, after --warmup unprofiled steps
(cuBLAS handles, the caching allocator, torch.compile's compilation). Prints

    TORCHLAUNCH-INFO torch=... device=... shim=0|1 libcuda=PATH[,PATH] workload=train|gemm
                compile=0|1 ... shim_launch_count=available|unavailable
    TORCHLAUNCH step=K kernels=N memcpy=N memset=N launch_calls=N graph_launch_calls=N
                shim_kernels=N shim_graphs=N shim_copies=N shim_memsets=N api=NAME:N,...
    TORCHLAUNCH-KERNEL step=K count=N name=...     (with --names)
    TORCHLAUNCH summary kernels_per_step=N launch_calls_per_step=N graph_launch_calls_per_step=N
                shim_kernel_launches_per_step=N shim_graph_launches_per_step=N steady=yes|no

(each TORCHLAUNCH line is one line). kernels: GPU kernel executions
("kernel" events); launch_calls: the runtime and driver API calls that
launch (cudaLaunchKernel, cuLaunchKernel, their Ex and cooperative forms,
cudaGraphLaunch, cuGraphLaunch), listed by name in api=; graph_launch_calls:
those of them that launch a graph. shim_*: the calls that passed the shim's
kernel-launch, graph-launch, copy and memset wrappers, read from the shim
right before the step and again after its torch.cuda.synchronize(), both
inside the profiled window, so neither the profiler's start nor its stop
counts. The shim counts launch calls, the profiler kernels run: with no
graphs in the step, shim_kernels must equal both launch_calls and kernels.
Without the shim (shim=0), or with a shim that has no gpucr_shim_counts,
every shim_* figure is "unavailable". steady: every measured step gave the
same figures. The summary gives step 1's. Exit 0; 1 on an error; 77 without
a CUDA GPU or torch.
"""
import argparse
import collections
import ctypes
import json
import os
import sys
import tempfile

here = os.path.dirname(os.path.abspath(__file__))
# tests/gpu sits beside bench/ both in the source tree and in a bundle's share/gpucr.
sys.path.insert(0, os.path.join(here, "..", "tests", "gpu"))

try:
    import torch
    import torch.nn.functional as F
except ImportError as e:
    print("torch_launches: torch is not importable (%s)" % e, file=sys.stderr)
    sys.exit(77)

try:
    from torch_train import GPT  # also sets CUBLAS_WORKSPACE_CONFIG
except ImportError as e:
    print("torch_launches: cannot import tests/gpu/torch_train.py from %s (%s)"
          % (os.path.join(here, "..", "tests", "gpu"), e), file=sys.stderr)
    sys.exit(1)

LAUNCH_APIS = ("cudaLaunchKernel", "cudaLaunchKernelExC", "cudaLaunchCooperativeKernel",
               "cudaGraphLaunch", "cuLaunchKernel", "cuLaunchKernelEx",
               "cuLaunchCooperativeKernel", "cuGraphLaunch")
GRAPH_LAUNCH_APIS = ("cudaGraphLaunch", "cuGraphLaunch")
SHIM_COUNTS = ("kernels", "graphs", "copies", "memsets")


class ShimCounts(ctypes.Structure):
    """struct gpucr_shim_counts (libintercept/gpucr_shim.h)."""
    _fields_ = [(name, ctypes.c_uint64) for name in SHIM_COUNTS]


def loaded_libcuda():
    """Paths of the libcuda objects mapped in this process: two (gpucr's
    libcuda.so.1 and the real driver) when the shim is in place."""
    seen = []
    with open("/proc/self/maps") as f:
        for line in f:
            parts = line.split(None, 5)
            if len(parts) < 6:
                continue
            path = parts[5].strip()
            if os.path.basename(path).startswith("libcuda.so") and path not in seen:
                seen.append(path)
    return seen


def shim_counter(libs):
    """A function returning the shim's counts (a tuple in SHIM_COUNTS'
    order), found in whichever of the mapped libcuda objects exports
    gpucr_shim_counts, or None. RTLD_NOLOAD: the object already loaded is
    the one asked, nothing new is loaded."""
    for path in libs:
        try:
            lib = ctypes.CDLL(path, mode=os.RTLD_NOLOAD | os.RTLD_LAZY)
        except OSError:
            continue
        fn = getattr(lib, "gpucr_shim_counts", None)
        if fn is None:
            continue
        fn.restype = ctypes.c_int
        fn.argtypes = [ctypes.POINTER(ShimCounts), ctypes.c_size_t]

        def read(fn=fn):
            c = ShimCounts()
            n = fn(ctypes.byref(c), ctypes.sizeof(c))
            if n != ctypes.sizeof(c):
                raise RuntimeError("gpucr_shim_counts returned %d, not %d" % (n, ctypes.sizeof(c)))
            return tuple(getattr(c, name) for name in SHIM_COUNTS)
        return read
    return None


def count_trace(path):
    with open(path) as f:
        trace = json.load(f)
    events = trace["traceEvents"] if isinstance(trace, dict) else trace
    kernels = collections.Counter()
    apis = collections.Counter()
    memcpy = memset = graphs = 0
    for e in events:
        if e.get("ph") != "X":
            continue
        cat = e.get("cat", "")
        name = e.get("name", "")
        if cat == "kernel":
            kernels[name] += 1
        elif cat == "gpu_memcpy":
            memcpy += 1
        elif cat == "gpu_memset":
            memset += 1
        elif cat in ("cuda_runtime", "cuda_driver"):
            base = name.split("_ptsz")[0].split("_ptds")[0].split("_v")[0]
            if base in LAUNCH_APIS:
                apis[name] += 1
                if base in GRAPH_LAUNCH_APIS:
                    graphs += 1
    return kernels, apis, memcpy, memset, graphs


def make_train_step(args, dev, g):
    """One training step of torch_train.py's model (optionally compiled)."""
    model = GPT(args.vocab, args.dim, args.layers, max(1, args.dim // 64), args.ctx).to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4)
    step_fn = torch.compile(model) if args.compile else model

    def step():
        x = torch.randint(0, args.vocab, (args.batch, args.ctx + 1), device=dev, generator=g)
        logits = step_fn(x[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, args.vocab), x[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        return loss.item()
    return step


def make_gemm_step(args, dev, g):
    """A step of cuBLAS GEMMs: --gemm-iters fp32 matmuls of the state, each
    normalised (gemm_loop.py's step), then a bf16 GEMM, an addmm and a
    batched GEMM, so the cuBLAS and cuBLASLt kernels of several paths
    launch. The state carries over from step to step."""
    n = args.gemm_n
    a = torch.randn(n, n, device=dev, generator=g) / n ** 0.5
    a16 = a.to(torch.bfloat16)
    bias = torch.randn(n, device=dev, generator=g)
    bat = torch.randn(8, n // 4, n // 4, device=dev, generator=g) / (n // 4) ** 0.5
    state = {"x": torch.randn(n, n, device=dev, generator=g)}

    def step():
        x = state["x"]
        for _ in range(args.gemm_iters):
            x = a @ x
            x = x / x.norm()
        state["x"] = x
        y = (a16 @ x.to(torch.bfloat16)).float()
        y = torch.addmm(bias, a, y)
        z = torch.bmm(bat, bat)
        return float(x.double().abs().sum().item() + y.sum().item() + z.sum().item())
    return step


def main():
    ap = argparse.ArgumentParser(description="Kernel launches per step of a PyTorch workload: "
                                 "torch.profiler's count and gpucr's shim's.")
    ap.add_argument("--warmup", type=int, default=3, help="unprofiled steps first (default 3)")
    ap.add_argument("--steps", type=int, default=3, help="profiled steps (default 3)")
    work = ap.add_mutually_exclusive_group()
    work.add_argument("--compile", action="store_true", help="train under torch.compile")
    work.add_argument("--gemm", action="store_true",
                      help="a loop of cuBLAS GEMMs (torch.matmul) in place of training")
    ap.add_argument("--names", action="store_true", help="list the kernels of each step")
    ap.add_argument("--dim", type=int, default=512)
    ap.add_argument("--layers", type=int, default=6)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--ctx", type=int, default=256)
    ap.add_argument("--vocab", type=int, default=8192)
    ap.add_argument("--gemm-n", type=int, default=2048, help="--gemm: matrix size (default 2048)")
    ap.add_argument("--gemm-iters", type=int, default=8,
                    help="--gemm: fp32 GEMMs per step (default 8)")
    args = ap.parse_args()

    if not torch.cuda.is_available():
        print("torch_launches: no CUDA GPU visible to torch", file=sys.stderr)
        return 77

    # The same settings as torch_train.py: deterministic kernel choice, so
    # two runs launch the same kernels.
    torch.manual_seed(1234)
    torch.use_deterministic_algorithms(True)
    torch.backends.cudnn.benchmark = False
    torch.backends.cuda.matmul.allow_tf32 = False
    dev = "cuda"
    g = torch.Generator(device=dev)
    g.manual_seed(42)
    step = make_gemm_step(args, dev, g) if args.gemm else make_train_step(args, dev, g)

    for _ in range(args.warmup):
        step()
    torch.cuda.synchronize()

    libs = loaded_libcuda()
    shim_read = shim_counter(libs) if len(libs) > 1 else None
    if len(libs) > 1 and not shim_read:
        print("torch_launches: no loaded libcuda (%s) exports gpucr_shim_counts: "
              "the shim's counts are unavailable" % ",".join(libs), file=sys.stderr)
    if args.gemm:
        shape = "gemm-n%d-iters%d" % (args.gemm_n, args.gemm_iters)
    else:
        shape = ("dim%d-layers%d-batch%d-ctx%d-vocab%d"
                 % (args.dim, args.layers, args.batch, args.ctx, args.vocab))
    print("TORCHLAUNCH-INFO torch=%s cuda=%s device=%s shim=%d libcuda=%s gpucr_daemon=%s "
          "workload=%s compile=%d model=%s warmup=%d shim_launch_count=%s"
          % (torch.__version__, torch.version.cuda,
             torch.cuda.get_device_name(0).replace(" ", "-"), len(libs) > 1,
             ",".join(libs) or "?", os.environ.get("GPUCR_DAEMON", "unset"),
             "gemm" if args.gemm else "train", args.compile, shape, args.warmup,
             "available" if shim_read else "unavailable"), flush=True)

    acts = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    figures = []
    with tempfile.TemporaryDirectory(prefix="torch_launches.") as tmp:
        for k in range(1, args.steps + 1):
            # The shim is read inside the profiled window: what CUPTI does
            # as the profiler starts and stops stays outside it.
            with torch.profiler.profile(activities=acts) as prof:
                before = shim_read() if shim_read else None
                step()
                torch.cuda.synchronize()
                after = shim_read() if shim_read else None
            path = os.path.join(tmp, "step%d.json" % k)
            prof.export_chrome_trace(path)
            kernels, apis, memcpy, memset, ng = count_trace(path)
            nk, nl = sum(kernels.values()), sum(apis.values())
            shim = (tuple(a - b for a, b in zip(after, before)) if shim_read
                    else ("unavailable",) * len(SHIM_COUNTS))
            figures.append((nk, nl, memcpy, memset, ng) + shim)
            print("TORCHLAUNCH step=%d kernels=%d memcpy=%d memset=%d launch_calls=%d "
                  "graph_launch_calls=%d %s api=%s"
                  % (k, nk, memcpy, memset, nl, ng,
                     " ".join("shim_%s=%s" % kv for kv in zip(SHIM_COUNTS, shim)),
                     ",".join("%s:%d" % kv for kv in sorted(apis.items())) or "none"),
                  flush=True)
            if args.names:
                for name, n in sorted(kernels.items(), key=lambda kv: (-kv[1], kv[0])):
                    print("TORCHLAUNCH-KERNEL step=%d count=%d name=%s" % (k, n, name))
    if figures and figures[0][0] == 0:
        print("torch_launches: the profiler recorded no kernels (CUPTI unavailable?)",
              file=sys.stderr)
        return 1
    steady = all(f == figures[0] for f in figures)
    print("TORCHLAUNCH summary kernels_per_step=%d launch_calls_per_step=%d "
          "graph_launch_calls_per_step=%d shim_kernel_launches_per_step=%s "
          "shim_graph_launches_per_step=%s steady=%s"
          % (figures[0][0], figures[0][1], figures[0][4], figures[0][5], figures[0][6],
             "yes" if steady else "no"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
