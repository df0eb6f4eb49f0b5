"""A GPT-2-XL-sized decoder (48 blocks of width 1600, 25 heads, a 50257-token
vocabulary: 1.56 B parameters) built on the meta device in Python, traced by
torchcap.trace on meta inputs and saved weightless. Prints the trace and save
times, the file's size and the process's peak resident memory.

    PYTHONPATH=build/python /usr/bin/python3 bench/weightless_gpt.py [OUT.tcg]
"""

import os
import resource
import sys
import tempfile
import time

import torch
import torch.nn as nn

import torchcap


class Block(nn.Module):
    def __init__(self, d, heads, device):
        super().__init__()
        self.ln1 = nn.LayerNorm(d, device=device)
        self.qkv = nn.Linear(d, 3 * d, device=device)
        self.proj = nn.Linear(d, d, device=device)
        self.ln2 = nn.LayerNorm(d, device=device)
        self.fc = nn.Linear(d, 4 * d, device=device)
        self.out = nn.Linear(4 * d, d, device=device)
        self.heads = heads

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=-1)
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        a = (q @ k.transpose(-2, -1) / (d // self.heads) ** 0.5).softmax(-1) @ v
        x = x + self.proj(a.transpose(1, 2).reshape(b, t, d))
        return x + self.out(nn.functional.gelu(self.fc(self.ln2(x))))


class Decoder(nn.Module):
    """Its output projection is its embedding (tied, as GPT-2's)."""

    def __init__(self, layers=48, d=1600, heads=25, vocab=50257, device=None):
        super().__init__()
        self.wte = nn.Embedding(vocab, d, device=device)
        self.blocks = nn.Sequential(*[Block(d, heads, device) for _ in range(layers)])
        self.ln = nn.LayerNorm(d, device=device)

    def forward(self, idx):
        return self.ln(self.blocks(self.wte(idx))) @ self.wte.weight.t()


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(tempfile.mkdtemp(), "gpt2xl.tcg")
    model = Decoder(device="meta").eval()
    params = sum(p.numel() for p in model.parameters())
    idx = torch.zeros(1, 64, dtype=torch.long, device="meta")
    t0 = time.perf_counter()
    gm = torchcap.trace(model, (idx,))
    t1 = time.perf_counter()
    torchcap.save(gm, out)
    t2 = time.perf_counter()
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"decoder: {params / 1e9:.2f} B parameters ({params * 4 / 2**30:.1f} GiB as float32), "
          f"{len(gm.graph.nodes)} nodes")
    print(f"trace on meta: {t1 - t0:.2f} s; save: {t2 - t1:.2f} s; "
          f"file: {os.path.getsize(out) / 2**20:.2f} MiB ({out}); peak RSS: {peak:.0f} MiB")


if __name__ == "__main__":
    main()
