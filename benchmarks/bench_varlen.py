#!/usr/bin/env python3
"""Time flashattn's varlen path (packed sequences of random lengths).

One run, same GPU and timer (triton's do_bench, median), bf16, heads * hdim = 2048,
16k tokens per batch. Every number is TFLOP/s of *useful* work: the sum over
sequences of 4 * h * s_q * s_k * d (the visible pairs when causal), backward 2.5x.

  varlen      flashattn.flash_attn_varlen_func on the packed batch
  dense       flashattn.flash_attn_func on b equal sequences of the same total tokens
              and the same useful FLOPs (s = sum(s_i^2) / tokens): what varlen
              should match
  torch-vl    torch.nn.attention.varlen.varlen_attn (PyTorch's FlashAttention-2
              varlen), where this torch has it
  FA2-padded  SDPA's FLASH_ATTENTION backend on the batch padded to max_seqlen
              (what a caller without varlen pays; its padding work is not counted;
              its backward is not timed on padded tensors of >= 2^31 elements, where
              it faults on torch 2.11)

Length sets (seeded): "mixed" uniform in [1, 4096], "short" uniform in [1, 256],
"one-long" one 8192-token sequence among 128 of 64 (empty tiles: the grid covers
8192 rows for every sequence).

    python benchmarks/bench_varlen.py [--out results/NAME]
"""

from __future__ import annotations

import argparse
import json
import math
import random
import sys

TOKENS = 16384
MODEL_DIM = 2048


def lengths_of(kind: str, seed: int = 0) -> list[int]:
    rng = random.Random(seed)
    if kind == "one-long":
        return [8192] + [64] * 128
    top = {"mixed": 4096, "short": 256}[kind]
    out = []
    while sum(out) < TOKENS:
        out.append(rng.randint(1, top))
    out[-1] -= sum(out) - TOKENS
    return [s for s in out if s > 0]


def useful_flops(lengths, heads, hdim, causal):
    pairs = sum(s * (s + 1) / 2 if causal else s * s for s in lengths)
    return 4.0 * heads * hdim * pairs


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--hdim", default="64,128")
    p.add_argument("--sets", default="mixed,short,one-long")
    p.add_argument("--family", default=None)
    p.add_argument("--out", default=None, help="write OUT.txt and OUT.json")
    args = p.parse_args(argv)

    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from triton.testing import do_bench

    import flashattn

    try:
        from torch.nn.attention.varlen import varlen_attn
    except ImportError:
        varlen_attn = None

    dev = torch.device("cuda")
    dtype = torch.bfloat16
    fam = {} if args.family is None else {"family": args.family}
    lines, rows = [], []

    def say(text):
        print(text, flush=True)
        lines.append(text)

    say(f"{torch.cuda.get_device_name(0)}, torch {torch.__version__}, bf16, {TOKENS} tokens, heads*hdim={MODEL_DIM}")
    say(f"{'mode':8}{'causal':>7}{'hdim':>5}{'set':>9}{'seqs':>5}{'max':>6}"
        f"{'varlen':>9}{'dense':>9}{'torch-vl':>9}{'FA2-pad':>9}{'vl/dense':>9}")
    for hdim in (int(x) for x in args.hdim.split(",")):
        heads = MODEL_DIM // hdim
        for kind in args.sets.split(","):
            lengths = lengths_of(kind)
            total, max_s = sum(lengths), max(lengths)
            cu = F.pad(torch.tensor(lengths, device=dev).cumsum(0, dtype=torch.int32), (1, 0))
            g = torch.Generator(dev).manual_seed(0)
            q, k, v, dout = (torch.randn(total, heads, hdim, generator=g, device=dev, dtype=dtype) for _ in range(4))
            s_eq = max(1, round(sum(s * s for s in lengths) / total))
            b_eq = max(1, round(total / s_eq))
            dq, dk, dv, ddo = (torch.randn(b_eq, s_eq, heads, hdim, generator=g, device=dev, dtype=dtype)
                               for _ in range(4))
            padded = [torch.zeros(len(lengths), heads, max_s, hdim, device=dev, dtype=dtype) for _ in range(4)]
            for causal in (False, True):
                work = useful_flops(lengths, heads, hdim, causal)
                dense_work = useful_flops([s_eq] * b_eq, heads, hdim, causal)
                for mode in ("fwd", "fwd_bwd"):
                    factor = 1.0 if mode == "fwd" else 3.5
                    bwd = mode == "fwd_bwd"

                    def timed(fn, leaves, flops):
                        try:
                            ms = do_bench(fn, warmup=25, rep=100, return_mode="median",
                                          grad_to_none=leaves or None)
                        except Exception as e:  # noqa: BLE001 - reported as n/a
                            print(f"  failed: {type(e).__name__}: {str(e)[:200]}", file=sys.stderr)
                            return None
                        return factor * flops / (ms * 1e-3) / 1e12

                    ql, kl, vl = (t.clone().requires_grad_(bwd) for t in (q, k, v))

                    def run_varlen():
                        o = flashattn.flash_attn_varlen_func(ql, kl, vl, cu, cu, max_s, max_s, causal=causal, **fam)
                        if bwd:
                            o.backward(dout)

                    qd, kd, vd = (t.clone().requires_grad_(bwd) for t in (dq, dk, dv))

                    def run_dense():
                        o = flashattn.flash_attn_func(qd, kd, vd, causal=causal, **fam)
                        if bwd:
                            o.backward(ddo)

                    qt, kt, vt = (t.clone().requires_grad_(bwd) for t in (q, k, v))

                    def run_torch_varlen():
                        o = varlen_attn(qt, kt, vt, cu, cu, max_s, max_s, window_size=(-1, 0) if causal else (-1, -1))
                        if bwd:
                            o.backward(dout)

                    qp, kp, vp = (t.clone().requires_grad_(bwd) for t in padded[:3])

                    def run_padded():
                        with sdpa_kernel([SDPBackend.FLASH_ATTENTION]):
                            o = F.scaled_dot_product_attention(qp, kp, vp, is_causal=causal)
                        if bwd:
                            o.backward(padded[3])

                    # SDPA's FLASH_ATTENTION backward faults (illegal memory access, torch
                    # 2.11) on padded tensors of 2^31 elements or more: not timed there.
                    pad_ok = padded[0].numel() < 2**31 or not bwd
                    r = {
                        "varlen": timed(run_varlen, [ql, kl, vl], work),
                        "dense": timed(run_dense, [qd, kd, vd], dense_work),
                        "torch-vl": timed(run_torch_varlen, [qt, kt, vt], work) if varlen_attn else None,
                        "FA2-pad": timed(run_padded, [qp, kp, vp], work) if pad_ok else None,
                    }
                    ratio = r["varlen"] / r["dense"] if r["varlen"] and r["dense"] else None
                    cells = "".join(f"{x:9.1f}" if x else "      n/a" for x in r.values())
                    say(f"{mode:8}{causal!s:>7}{hdim:>5}{kind:>9}{len(lengths):>5}{max_s:>6}{cells}"
                        + (f"{ratio:9.3f}" if ratio else "      n/a"))
                    rows.append({"mode": mode, "causal": causal, "hdim": hdim, "set": kind, "lengths": lengths,
                                 "dense_shape": [b_eq, s_eq], "tflops": r, "varlen_over_dense": ratio})
    ratios = [r["varlen_over_dense"] for r in rows if r["varlen_over_dense"] and r["set"] != "one-long"]
    if ratios:
        say(f"geomean varlen/dense (mixed, short): {math.exp(sum(map(math.log, ratios)) / len(ratios)):.3f}")
    if args.out:
        with open(args.out + ".txt", "w") as f:
            f.write("\n".join(lines) + "\n")
        with open(args.out + ".json", "w") as f:
            json.dump({"device": torch.cuda.get_device_name(0), "torch": torch.__version__, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
