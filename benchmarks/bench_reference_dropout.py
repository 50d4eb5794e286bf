#!/usr/bin/env python3
"""The pure-PyTorch path with dropout: reference.dropout_keep_mask (the mask of the
CPU path, of S_dmask for return_attn_probs, and of the GPU tests), flashattn's CPU
path forward+backward and its forward with return_attn_probs, and SDPA's own dropout
(math backend) on the same inputs beside them. Best of --reps, milliseconds.

  python3 benchmarks/bench_reference_dropout.py [--device cpu] [--reps 3]
"""

from __future__ import annotations

import argparse
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "python"))


def best_ms(fn, reps, sync):
    fn()
    sync()
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - t)
    return min(times) * 1e3


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cpu")
    p.add_argument("--reps", type=int, default=3)
    args = p.parse_args(argv)
    import torch
    import torch.nn.functional as F

    import flashattn
    from flashattn import reference

    dev = torch.device(args.device)
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    state = torch.tensor([123, 456], device=dev)
    for shape in [(4, 4, 1024, 1024), (60, 4, 256, 256)]:
        ms = best_ms(lambda: reference.dropout_keep_mask(state, *shape, 0.17), args.reps, sync)
        print(f"dropout_keep_mask {shape}: {ms:.0f} ms")

    torch.manual_seed(0)
    b, s, h, d = 2, 512, 8, 64
    q, k, v = (torch.randn(b, s, h, d, device=dev, requires_grad=True) for _ in range(3))

    def ours():
        flashattn.flash_attn_func(q, k, v, 0.1).sum().backward()

    def ours_probs():
        with torch.no_grad():
            flashattn.flash_attn_func(q, k, v, 0.1, return_attn_probs=True)

    def sdpa():
        qt, kt, vt = (t.transpose(1, 2) for t in (q, k, v))
        F.scaled_dot_product_attention(qt, kt, vt, dropout_p=0.1).sum().backward()

    name = f"b{b} s{s} h{h} d{d} fp32 p=0.1"
    print(f"flashattn {args.device} path {name}, forward+backward: {best_ms(ours, args.reps, sync):.0f} ms")
    print(f"flashattn {args.device} path {name}, forward with return_attn_probs: "
          f"{best_ms(ours_probs, args.reps, sync):.0f} ms")
    print(f"SDPA {name}, forward+backward: {best_ms(sdpa, args.reps, sync):.0f} ms")


if __name__ == "__main__":
    main()
