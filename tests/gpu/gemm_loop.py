"""A cuBLAS GEMM loop for gpucr's GPU suite (torch.matmul in fp32, no TF32):
each step multiplies the state by a fixed matrix and normalises; the
checksum of every step must be identical with and without gpucr and after
a dump/kill/restore.

    python3 gemm_loop.py --steps N --out FILE [--n SIZE] [--step-sleep S]
"""
import argparse
import os
import time

os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")

import torch  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--out", required=True)
    ap.add_argument("--n", type=int, default=4096)
    ap.add_argument("--step-sleep", type=float, default=0.0)
    args = ap.parse_args()

    torch.use_deterministic_algorithms(True)
    torch.backends.cuda.matmul.allow_tf32 = False
    g = torch.Generator("cuda").manual_seed(99)
    a = torch.randn(args.n, args.n, device="cuda", generator=g) / args.n ** 0.5
    x = torch.randn(args.n, args.n, device="cuda", generator=g)
    if os.path.exists(args.out):
        os.unlink(args.out)
    for k in range(1, args.steps + 1):
        x = a @ x
        x = x / x.norm()
        s = float(x.double().abs().sum().item())
        with open(args.out, "a") as f:
            f.write("step %d %s\n" % (k, s.hex()))
        if args.step_sleep:
            time.sleep(args.step_sleep)
    with open(args.out, "a") as f:
        f.write("done\n")


if __name__ == "__main__":
    main()
