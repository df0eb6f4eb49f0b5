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

import torchcap

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests", "python"))
from gpt_decoder import Decoder  # noqa: E402


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(tempfile.mkdtemp(), "gpt2xl.tcg")
    model = Decoder(48, 1600, 25, 50257, device="meta").eval()
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
