#!/usr/bin/env python3
"""Per-call cost of flashattn's host path, beside PyTorch SDPA's FlashAttention-2.

For each shape, in one run:
  host      microseconds to issue one call (N calls issued back to back, timed
            before the final synchronize; the GPU queue never fills): Python,
            dispatcher and C++ work per call
  per call  N calls back to back including the GPU work, per call: what a
            training or serving loop sees (max of host and GPU time)
  GPU       one call replayed from a CUDA graph: the kernels alone
for flashattn.flash_attn_func (no_grad for fwd, autograd for fwd_bwd), the raw
op torch.ops.flashattn.fwd (fwd only), and SDPA with the FLASH_ATTENTION backend.
With --dropout P every call drops with probability P (the raw op is given an
rng_state drawn once, on the device).

  python3 benchmarks/bench_overhead.py [--dropout P] [--out benchmarks/results/NAME]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)

# (name, batch, seqlen_q, seqlen_k, heads, heads_k, hdim, causal)
SHAPES = (
    ("b1-s2k-h12-d64", 1, 2048, 2048, 12, 12, 64, False),
    ("b1-s128-h16-d128-causal", 1, 128, 128, 16, 16, 128, True),
    ("decode-s1-sk4k-h32-d128", 1, 1, 4096, 32, 32, 128, False),
    # flash_attn_varlen_func on 64 packed sequences of 128 tokens (SDPA: the same
    # batch dense): more tiles than SMs, so the varlen forward takes a tile counter.
    ("varlen-b64-s128-h16-d128", 64, 128, 128, 16, 16, 128, False),
)
CALLS = 200
REPEATS = 7


def load_flashattn():
    try:
        import flashattn
    except ImportError:
        sys.path.insert(0, os.path.join(REPO, "python"))
        import flashattn
    return flashattn


def per_call_us(torch, fn, calls=CALLS, repeats=REPEATS):
    """(host us, per-call us): medians over `repeats` loops of `calls` calls."""
    for _ in range(20):
        fn()
    torch.cuda.synchronize()
    host, total = [], []
    for _ in range(repeats):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        t1 = time.perf_counter()
        torch.cuda.synchronize()
        t2 = time.perf_counter()
        host.append((t1 - t0) / calls * 1e6)
        total.append((t2 - t0) / calls * 1e6)
    return statistics.median(host), statistics.median(total)


def graph_us(torch, fn, replays=200):
    """GPU time of one call, replayed from a CUDA graph; None if it cannot be captured."""
    try:
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            for _ in range(3):
                fn()
        torch.cuda.current_stream().wait_stream(s)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            fn()
        for _ in range(10):
            g.replay()
        torch.cuda.synchronize()
        times = []
        for _ in range(REPEATS):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(replays):
                g.replay()
            end.record()
            torch.cuda.synchronize()
            times.append(start.elapsed_time(end) * 1e3 / replays)
        return statistics.median(times)
    except Exception as e:  # noqa: BLE001 - reported as n/a
        print(f"  (graph capture failed: {type(e).__name__}: {str(e).splitlines()[0][:120]})")
        return None


def runners(torch, fa, shape, mode, dropout_p=0.0):
    """{impl: callable} for one shape and mode."""
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    _, b, s_q, s_k, h, h_k, d, causal = shape
    dt = torch.bfloat16
    bwd = mode == "fwd_bwd"
    gen = torch.Generator(device="cuda").manual_seed(0)
    q = torch.randn(b, s_q, h, d, device="cuda", dtype=dt, generator=gen)
    k = torch.randn(b, s_k, h_k, d, device="cuda", dtype=dt, generator=gen)
    v = torch.randn(b, s_k, h_k, d, device="cuda", dtype=dt, generator=gen)
    g = torch.randn(b, s_q, h, d, device="cuda", dtype=dt, generator=gen)
    q_, k_, v_, g_ = (t.transpose(1, 2).contiguous() for t in (q, k, v, g))
    if bwd:
        for t in (q, k, v, q_, k_, v_):
            t.requires_grad_(True)
    out = {}
    varlen = shape[0].startswith("varlen")
    if varlen:  # the same rows, packed: (b * s, h, d), contiguous
        q, k, v, g = (t.detach().reshape(b * t.shape[1], *t.shape[2:]) for t in (q, k, v, g))
        if bwd:
            for t in (q, k, v):
                t.requires_grad_(True)
        cu = torch.arange(0, (b + 1) * s_q, s_q, device="cuda", dtype=torch.int32)

    def ours():
        if varlen:
            o = fa.flash_attn_varlen_func(q, k, v, cu, cu, s_q, s_k, dropout_p, causal=causal)
        else:
            o = fa.flash_attn_func(q, k, v, dropout_p, causal=causal)
        if bwd:
            o.backward(g)

    if bwd:
        out["flashattn"] = ours
    else:
        def ours_no_grad():
            with torch.no_grad():
                ours()

        out["flashattn"] = ours_no_grad
        scale = d**-0.5
        rng = torch.randint(0, 2**63 - 1, (2,), device="cuda", dtype=torch.int64) if dropout_p else None

        def raw_op():
            if varlen:
                torch.ops.flashattn.varlen_fwd(q, k, v, cu, cu, s_q, s_k, None, rng, dropout_p, scale, causal, -1,
                                               -1, 0.0, 0)
            else:
                torch.ops.flashattn.fwd(q, k, v, None, rng, dropout_p, scale, causal, -1, -1, 0.0, 0)

        out["raw op"] = raw_op
    flash = sdpa_kernel([SDPBackend.FLASH_ATTENTION])

    def sdpa():
        o = F.scaled_dot_product_attention(q_, k_, v_, dropout_p=dropout_p, is_causal=causal)
        if bwd:
            o.backward(g_)

    def sdpa_no_grad():
        with torch.no_grad():
            F.scaled_dot_product_attention(q_, k_, v_, dropout_p=dropout_p, is_causal=causal)

    out["SDPA-FA2"] = sdpa if bwd else sdpa_no_grad
    return out, flash, (q, k, v, q_, k_, v_)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default=None, help="path without extension for .json")
    p.add_argument("--label", default="", help="a name for this run in the output")
    p.add_argument("--dropout", type=float, default=0.0, help="dropout_p of every call (default 0)")
    args = p.parse_args(argv)
    import torch

    if not torch.cuda.is_available():
        raise SystemExit("bench_overhead.py: no CUDA device visible")
    fa = load_flashattn()
    dev = torch.cuda.get_device_name(0)
    print(f"torch {torch.__version__}, {dev}, flashattn {os.path.dirname(fa.__file__)}, dropout_p"
          f" {args.dropout} {args.label}")
    print(f"{'shape':28}{'mode':>8}{'impl':>10}{'host us':>9}{'per call':>9}{'GPU us':>8}")
    rows = []
    for shape in SHAPES:
        for mode in ("fwd", "fwd_bwd"):
            if shape[2] == 1 and (mode == "fwd_bwd" or args.dropout):
                continue  # decode has no backward and no dropout
            fns, flash, tensors = runners(torch, fa, shape, mode, args.dropout)
            with flash:
                for impl, fn in fns.items():
                    host, total = per_call_us(torch, fn)
                    gpu = graph_us(torch, fn)
                    rows.append({"shape": shape[0], "mode": mode, "impl": impl, "host_us": host,
                                 "per_call_us": total, "gpu_us": gpu})
                    gpu_text = f"{gpu:8.1f}" if gpu is not None else "     n/a"
                    print(f"{shape[0]:28}{mode:>8}{impl:>10}{host:9.1f}{total:9.1f}{gpu_text}",
                          flush=True)
            del fns, tensors
    if args.out:
        with open(args.out + ".json", "w") as f:
            json.dump({"device": dev, "torch": torch.__version__, "label": args.label, "dropout_p": args.dropout,
                       "calls": CALLS, "repeats": REPEATS, "rows": rows}, f, indent=1)
        print(f"wrote {args.out}.json")


if __name__ == "__main__":
    main()
