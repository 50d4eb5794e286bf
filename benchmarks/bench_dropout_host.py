#!/usr/bin/env python3
"""Host time of calls with dropout: the eager draw of rng_state on the host (what
flashattn's public functions do outside CUDA graph capture and torch.compile) beside
the device draw (torch.randint, what they do there), dropout off, and SDPA-FA2 with
dropout, in one process, the variants alternating round by round.

Tiny shapes (the GPU's work far below the host's), so time per call is host time.
Per line: the best and the median of the rounds, microseconds per call.

  python3 benchmarks/bench_dropout_host.py [--rounds 15] [--calls 300]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "python"))


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=15)
    p.add_argument("--calls", type=int, default=300)
    args = p.parse_args(argv)
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    import flashattn
    from flashattn import interface

    host_draw = interface._draw_rng_state

    def device_draw(dropout_p, q, cu_seqlens_q=None):
        if dropout_p and dropout_p > 0:
            return torch.randint(0, 2**63 - 1, (2,), dtype=torch.int64, device=q.device)
        return None

    dt = torch.bfloat16
    b, s, h, d = 1, 128, 8, 64
    q, k, v, g = (torch.randn(b, s, h, d, device="cuda", dtype=dt) for _ in range(4))
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    q_, k_, v_, g_ = (t.transpose(1, 2).contiguous() for t in (q, k, v, g))
    leaves_ = [t.clone().requires_grad_() for t in (q_, k_, v_)]
    lengths = torch.tensor([0, 40, 128, 200, 256], device="cuda", dtype=torch.int32)
    packed = [t[0, :, :, :].repeat(2, 1, 1) for t in (q, k, v)]  # 256 rows, 4 sequences

    def fwd(p):
        with torch.no_grad():
            flashattn.flash_attn_func(q, k, v, p)

    def fwd_bwd(p):
        flashattn.flash_attn_func(*leaves, p).backward(g)

    def varlen_fwd(p):
        with torch.no_grad():
            flashattn.flash_attn_varlen_func(*packed, lengths, lengths, 128, 128, p)

    def sdpa_fwd(p):
        with torch.no_grad():
            F.scaled_dot_product_attention(q_, k_, v_, dropout_p=p)

    def sdpa_fwd_bwd(p):
        F.scaled_dot_product_attention(*leaves_, dropout_p=p).backward(g_)

    def draw_only(p):
        interface._draw_rng_state(p, q)

    variants = [("host draw", host_draw, 0.1), ("device draw", device_draw, 0.1), ("no dropout", host_draw, 0.0)]
    cases = [("forward", fwd), ("forward+backward", fwd_bwd), ("varlen forward", varlen_fwd),
             ("the draw alone", draw_only)]
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name()}, b{b} s{s} h{h} d{d} bf16, "
          f"{args.rounds} rounds of {args.calls} calls")
    flash_only = sdpa_kernel([SDPBackend.FLASH_ATTENTION])
    flash_only.__enter__()  # SDPA's FlashAttention-2 backend for the whole run
    for name, fn in cases + [("SDPA-FA2 forward", sdpa_fwd), ("SDPA-FA2 forward+backward", sdpa_fwd_bwd)]:
        sdpa = name.startswith("SDPA")
        runs = [("dropout 0.1", None, 0.1), ("no dropout", None, 0.0)] if sdpa else variants
        if name == "the draw alone":
            runs = variants[:2]
        times = {label: [] for label, _, _ in runs}
        for _ in range(3):
            for label, draw, pr in runs:  # warm up
                if draw:
                    interface._draw_rng_state = draw
                fn(pr)
        torch.cuda.synchronize()
        for _ in range(args.rounds):
            for label, draw, pr in runs:
                if draw:
                    interface._draw_rng_state = draw
                torch.cuda.synchronize()
                t0 = time.perf_counter()
                for _ in range(args.calls):
                    fn(pr)
                torch.cuda.synchronize()
                times[label].append((time.perf_counter() - t0) / args.calls * 1e6)
        interface._draw_rng_state = host_draw
        cells = "  ".join(f"{label} {min(t):6.1f} / {statistics.median(t):6.1f}" for label, t in times.items())
        print(f"{name:28}{cells}", flush=True)


if __name__ == "__main__":
    main()
