"""PyTorch inference for gpucr's GPU suite: greedy generation with the GPT of
torch_train.py (random weights from a fixed seed, no downloads). The tokens
must be identical with and without gpucr, and after a dump/kill/restore.

    python3 torch_generate.py --tokens N --out FILE [--step-sleep S]

Appends "step K <token id>" to FILE for every generated token, then "done".
"""
import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")

import torch  # noqa: E402

from torch_train import GPT  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, default=40)
    ap.add_argument("--out", required=True)
    ap.add_argument("--step-sleep", type=float, default=0.0)
    ap.add_argument("--dim", type=int, default=512)
    ap.add_argument("--layers", type=int, default=6)
    ap.add_argument("--vocab", type=int, default=8192)
    ap.add_argument("--ctx", type=int, default=256)
    args = ap.parse_args()

    torch.manual_seed(1234)
    torch.use_deterministic_algorithms(True)
    torch.backends.cuda.matmul.allow_tf32 = False
    model = GPT(args.vocab, args.dim, args.layers, max(1, args.dim // 64), args.ctx).cuda().eval()
    idx = torch.randint(0, args.vocab, (1, 16), device="cuda", generator=torch.Generator("cuda").manual_seed(7))
    if os.path.exists(args.out):
        os.unlink(args.out)
    with torch.no_grad():
        for k in range(1, args.tokens + 1):
            logits = model(idx[:, -args.ctx:])
            nxt = logits[:, -1, :].argmax(dim=-1, keepdim=True)
            idx = torch.cat([idx, nxt], dim=1)
            with open(args.out, "a") as f:
                f.write("step %d %d\n" % (k, int(nxt.item())))
            if args.step_sleep:
                time.sleep(args.step_sleep)
    with open(args.out, "a") as f:
        f.write("done\n")


if __name__ == "__main__":
    main()
