"""Deterministic PyTorch training of a small GPT-style model, for gpucr's GPU
suite: the loss sequence must be bit-identical with and without gpucr, and
after a dump/kill/restore. Random init from a fixed seed; no downloads.

    python3 torch_train.py --steps N --out FILE [--step-sleep S] [--dim D] [--layers L]

Appends "step K <loss as float.hex()>" to FILE after each step, then "done".
"""
import argparse
import math
import os
import time

os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")

import torch
import torch.nn as nn
import torch.nn.functional as F


class Block(nn.Module):
    def __init__(self, d, heads):
        super().__init__()
        self.ln1 = nn.LayerNorm(d)
        self.attn = nn.MultiheadAttention(d, heads, batch_first=True)
        self.ln2 = nn.LayerNorm(d)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

    def forward(self, x, mask):
        h = self.ln1(x)
        a, _ = self.attn(h, h, h, attn_mask=mask, need_weights=False)
        x = x + a
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    def __init__(self, vocab, d, layers, heads, ctx):
        super().__init__()
        self.tok = nn.Embedding(vocab, d)
        self.pos = nn.Embedding(ctx, d)
        self.blocks = nn.ModuleList(Block(d, heads) for _ in range(layers))
        self.ln = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab, bias=False)

    def forward(self, idx):
        t = idx.shape[1]
        mask = torch.triu(torch.full((t, t), float("-inf"), device=idx.device), 1)
        x = self.tok(idx) + self.pos(torch.arange(t, device=idx.device))
        for b in self.blocks:
            x = b(x, mask)
        return self.head(self.ln(x))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--out", required=True)
    ap.add_argument("--step-sleep", type=float, default=0.0)
    ap.add_argument("--dim", type=int, default=512)
    ap.add_argument("--layers", type=int, default=6)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--ctx", type=int, default=256)
    ap.add_argument("--vocab", type=int, default=8192)
    ap.add_argument("--compile", action="store_true")
    ap.add_argument("--times", help="append 'K SECONDS' (monotonic) after every step")
    args = ap.parse_args()

    torch.manual_seed(1234)
    torch.use_deterministic_algorithms(True)
    torch.backends.cudnn.benchmark = False
    torch.backends.cuda.matmul.allow_tf32 = False
    dev = "cuda"
    model = GPT(args.vocab, args.dim, args.layers, max(1, args.dim // 64), args.ctx).to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4)
    step_fn = model
    if args.compile:
        step_fn = torch.compile(model)
    g = torch.Generator(device=dev)
    g.manual_seed(42)
    if os.path.exists(args.out):
        os.unlink(args.out)
    for k in range(1, args.steps + 1):
        x = torch.randint(0, args.vocab, (args.batch, args.ctx + 1), device=dev, generator=g)
        logits = step_fn(x[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, args.vocab), x[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        v = loss.item()
        with open(args.out, "a") as f:
            f.write("step %d %s\n" % (k, float(v).hex()))
        if args.times:
            with open(args.times, "a") as f:
                f.write("%d %.6f\n" % (k, time.monotonic()))
        if args.step_sleep:
            time.sleep(args.step_sleep)
    with open(args.out, "a") as f:
        f.write("done\n")


if __name__ == "__main__":
    main()
