#!/usr/bin/env python3
"""Forward+backward TFLOP/s of flashattn with the features that pick other kernel
variants or masks: softcap and ALiBi (the score-modifier kernels), a sliding window
(512 keys left; 512 right, or 0 under causal) and GQA 4:1. bf16, b * s = 16k tokens,
h * d = 2048, d 64 and 128, 2k and 8k tokens, causal and not (--dropout P: with
attention dropout). One line per case:

    mode causal feature hdim seqlen TFLOP/s

(columns of bench_attention.py's table, the feature in the dtype's place), so that two
modules' runs compare line by line. TFLOP/s count the visible (query, key) pairs.

    python3 benchmarks/bench_features.py [--family sm90] | tee run.txt
"""

from __future__ import annotations

import argparse

import torch
import triton

import flashattn


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--family", default=None, help="flashattn kernel family (default: the device's)")
    parser.add_argument("--dropout", type=float, default=0.0, help="attention dropout probability (default 0)")
    args = parser.parse_args()
    torch.manual_seed(0)
    for d in (64, 128):
        for s in (2048, 8192):
            for feature in ("softcap", "alibi", "window", "gqa4"):
                for causal in (False, True):
                    b, h = 16384 // s, 2048 // d
                    h_k = h // 4 if feature == "gqa4" else h
                    shape_q, shape_kv = (b, s, h, d), (b, s, h_k, d)
                    q = torch.randn(shape_q, device="cuda", dtype=torch.bfloat16, requires_grad=True)
                    k = torch.randn(shape_kv, device="cuda", dtype=torch.bfloat16, requires_grad=True)
                    v = torch.randn(shape_kv, device="cuda", dtype=torch.bfloat16, requires_grad=True)
                    kwargs = dict(causal=causal, family=args.family, dropout_p=args.dropout)
                    if feature == "softcap":
                        kwargs["softcap"] = 30.0
                    if feature == "alibi":
                        kwargs["alibi_slopes"] = torch.rand(h, device="cuda", dtype=torch.float32) * 0.1
                    if feature == "window":
                        kwargs["window_size"] = (512, 0 if causal else 512)
                    grad = torch.randn_like(q)

                    def step():
                        flashattn.flash_attn_func(q, k, v, **kwargs).backward(grad)

                    ms = triton.testing.do_bench(step, warmup=25, rep=100, return_mode="median")
                    if feature == "window":
                        pairs = s * min(s, 513 if causal else 1025)  # about: rows near the ends see fewer
                    else:
                        pairs = s * s / (2 if causal else 1)
                    tflops = 3.5 * 4 * b * h * pairs * d / ms / 1e9
                    print(f"fwd_bwd {causal!s:5s} {feature:8s} {d:4d} {s:6d} {tflops:8.1f}", flush=True)


if __name__ == "__main__":
    main()
