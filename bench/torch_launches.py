"""Kernel launches in one training step of the small GPT-style model of
tests/gpu/torch_train.py (random init, no downloads), counted by
torch.profiler (CUPTI). Run it without and with gpucr's shim
(LD_LIBRARY_PATH=$B/lib/gpucr GPUCR_DAEMON=0): the counts must be the same
(bench/shimcost.sh does both and compares).

    python3 torch_launches.py [--warmup N] [--steps N] [--compile] [--names]
                              [--dim D] [--layers L] [--batch B] [--ctx C] [--vocab V]

Each measured step is profiled on its own, after --warmup unprofiled steps
(cuBLAS handles, the caching allocator, torch.compile's compilation). Prints

    TORCHLAUNCH-INFO torch=... device=... shim=0|1 libcuda=PATH[,PATH] shim_launch_count=...
    TORCHLAUNCH step=K kernels=N memcpy=N memset=N launch_calls=N api=NAME:N,...
    TORCHLAUNCH-KERNEL step=K count=N name=...     (with --names)
    TORCHLAUNCH summary kernels_per_step=N launch_calls_per_step=N steady=yes|no

kernels: GPU kernel executions ("kernel" events); launch_calls: the runtime
and driver API calls that launch (cudaLaunchKernel, cuLaunchKernel, their Ex
and cooperative forms, cudaGraphLaunch), listed by name in api=. steady: every
measured step gave the same figures. libintercept keeps no launch counter of
its own (ShimStats.launches in proto/rpc.proto is never filled), so
shim_launch_count is "unavailable": the comparison is the profiler's figures
with and without the shim. Exit 0; 1 on an error; 77 without a CUDA GPU or torch.
"""
import argparse
import collections
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


def count_trace(path):
    with open(path) as f:
        trace = json.load(f)
    events = trace["traceEvents"] if isinstance(trace, dict) else trace
    kernels = collections.Counter()
    apis = collections.Counter()
    memcpy = memset = 0
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
    return kernels, apis, memcpy, memset


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--compile", action="store_true")
    ap.add_argument("--names", action="store_true")
    ap.add_argument("--dim", type=int, default=512)
    ap.add_argument("--layers", type=int, default=6)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--ctx", type=int, default=256)
    ap.add_argument("--vocab", type=int, default=8192)
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
    model = GPT(args.vocab, args.dim, args.layers, max(1, args.dim // 64), args.ctx).to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4)
    step_fn = torch.compile(model) if args.compile else model
    g = torch.Generator(device=dev)
    g.manual_seed(42)

    def step():
        x = torch.randint(0, args.vocab, (args.batch, args.ctx + 1), device=dev, generator=g)
        logits = step_fn(x[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, args.vocab), x[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        return loss.item()

    for _ in range(args.warmup):
        step()
    torch.cuda.synchronize()

    libs = loaded_libcuda()
    print("TORCHLAUNCH-INFO torch=%s cuda=%s device=%s shim=%d libcuda=%s gpucr_daemon=%s "
          "compile=%d model=dim%d-layers%d-batch%d-ctx%d-vocab%d warmup=%d "
          "shim_launch_count=unavailable"
          % (torch.__version__, torch.version.cuda,
             torch.cuda.get_device_name(0).replace(" ", "-"), len(libs) > 1,
             ",".join(libs) or "?", os.environ.get("GPUCR_DAEMON", "unset"), args.compile,
             args.dim, args.layers, args.batch, args.ctx, args.vocab, args.warmup), flush=True)

    acts = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    figures = []
    with tempfile.TemporaryDirectory(prefix="torch_launches.") as tmp:
        for k in range(1, args.steps + 1):
            with torch.profiler.profile(activities=acts) as prof:
                step()
                torch.cuda.synchronize()
            path = os.path.join(tmp, "step%d.json" % k)
            prof.export_chrome_trace(path)
            kernels, apis, memcpy, memset = count_trace(path)
            nk, nl = sum(kernels.values()), sum(apis.values())
            figures.append((nk, nl, memcpy, memset))
            print("TORCHLAUNCH step=%d kernels=%d memcpy=%d memset=%d launch_calls=%d api=%s"
                  % (k, nk, memcpy, memset, nl,
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
    print("TORCHLAUNCH summary kernels_per_step=%d launch_calls_per_step=%d steady=%s"
          % (figures[0][0], figures[0][1], "yes" if steady else "no"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
