"""A GPT-2-like decoder in Python (pre-norm blocks, tied output projection),
shared by the weightless tests and bench/weightless_gpt.py."""

import torch.nn as nn


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
    """A GPT-2-like decoder whose output projection is its embedding (tied)."""

    def __init__(self, layers, d, heads, vocab, device=None):
        super().__init__()
        self.wte = nn.Embedding(vocab, d, device=device)
        self.blocks = nn.Sequential(*[Block(d, heads, device) for _ in range(layers)])
        self.ln = nn.LayerNorm(d, device=device)

    def forward(self, idx):
        return self.ln(self.blocks(self.wte(idx))) @ self.wte.weight.t()
