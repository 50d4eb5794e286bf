#!/usr/bin/env python3
"""Decode over a KV cache: flashattn.flash_attn_with_kvcache beside PyTorch SDPA's
FlashAttention-2, and the GPU's own copy bandwidth, in one run.

For each shape (bf16; s_q query rows per sequence attending to s_k cached keys):
  GPU us     one call replayed from a CUDA graph (every kernel of the call)
  GB/s       bytes of K and V read / GPU time
  %copy      that bandwidth / the copy bandwidth measured in this run (device-to-device
             copy of 1 GiB: (read + write) / time)
for flashattn on a contiguous cache and on paged caches (pages of 16 and 256 tokens,
shuffled), and SDPA-FA2 on the contiguous cache ((b, h, s, d) layout, enable_gqa).
Then the host time of one call (issue only) on a few shapes.

  python3 benchmarks/bench_decode.py [--quick] [--out benchmarks/results/NAME]
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)

S_Q = (1, 4)
BATCHES = (1, 8, 64)
S_K = (1024, 8192, 32768, 131072)
HEADS = ((32, 8), (32, 32))
HEAD_DIMS = (64, 128, 256)
PAGES = (16, 256)
MAX_CACHE_BYTES = 12 << 30  # K + V; SDPA's copy and a paged copy sit beside it


def load_flashattn():
    try:
        import flashattn
    except ImportError:
        sys.path.insert(0, os.path.join(REPO, "python"))
        import flashattn
    return flashattn


def graph_us(torch, fn, target_ms=20.0, repeats=5):
    """GPU microseconds of one fn() replayed from a CUDA graph (median of `repeats`
    batches of replays sized to ~target_ms); None if fn cannot run or be captured."""
    try:
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            for _ in range(2):
                fn()
        torch.cuda.current_stream().wait_stream(s)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            fn()
        g.replay()
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        g.replay()
        end.record()
        torch.cuda.synchronize()
        replays = max(3, min(2000, int(target_ms / max(start.elapsed_time(end), 1e-3))))
        times = []
        for _ in range(repeats):
            start.record()
            for _ in range(replays):
                g.replay()
            end.record()
            torch.cuda.synchronize()
            times.append(start.elapsed_time(end) * 1e3 / replays)
        return statistics.median(times)
    except Exception as e:  # noqa: BLE001 - reported as n/a
        print(f"  n/a: {type(e).__name__}: {str(e).splitlines()[0][:150]}", flush=True)
        return None


def copy_bandwidth(torch, nbytes=1 << 30):
    src = torch.empty(nbytes // 2, dtype=torch.bfloat16, device="cuda").normal_()
    dst = torch.empty_like(src)
    us = graph_us(torch, lambda: dst.copy_(src), target_ms=50.0)
    return 2 * nbytes / (us * 1e-6) / 1e9


def host_us(torch, fn, calls=200, repeats=7):
    """(host us to issue one call, us per call including the GPU work): medians over
    `repeats` loops of `calls` calls (issue time read before the final synchronize)."""
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
        host.append((t1 - t0) / calls * 1e6)
        total.append((time.perf_counter() - t0) / calls * 1e6)
    return statistics.median(host), statistics.median(total)


def make_inputs(torch, b, s_q, s_k, h, h_k, d, page=None):
    gen = torch.Generator(device="cuda").manual_seed(0)
    dt = torch.bfloat16
    q = torch.randn(b, s_q, h, d, device="cuda", dtype=dt, generator=gen)
    seqlens = torch.full((b,), s_k, dtype=torch.int32, device="cuda")
    if page is None:
        k = torch.randn(b, s_k, h_k, d, device="cuda", dtype=dt, generator=gen)
        v = torch.randn(b, s_k, h_k, d, device="cuda", dtype=dt, generator=gen)
        return q, k, v, seqlens, None
    pages = math.ceil(s_k / page)
    perm = torch.randperm(b * pages, device="cuda", generator=gen)
    table = perm.view(b, pages).to(torch.int32)
    k = torch.randn(b * pages, page, h_k, d, device="cuda", dtype=dt, generator=gen)
    v = torch.randn(b * pages, page, h_k, d, device="cuda", dtype=dt, generator=gen)
    return q, k, v, seqlens, table


def runner_flashattn(torch, fa, inputs):
    q, k, v, seqlens, table = inputs
    return lambda: fa.flash_attn_with_kvcache(q, k, v, cache_seqlens=seqlens, block_table=table)


def runner_append(fa, q, k, v, new, seqlens):
    return lambda: fa.flash_attn_with_kvcache(q, k, v, *new, cache_seqlens=seqlens)


def runner_func(fa, q, k, v):
    return lambda: fa.flash_attn_func(q, k, v)


def runner_sdpa(torch, b, s_q, s_k, h, h_k, d, backend_set_outside=False):
    """SDPA's FLASH_ATTENTION backend; with backend_set_outside the caller holds the
    sdpa_kernel context (its enter/exit costs tens of microseconds per call)."""
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    gen = torch.Generator(device="cuda").manual_seed(0)
    q = torch.randn(b, h, s_q, d, device="cuda", dtype=torch.bfloat16, generator=gen)
    k = torch.randn(b, h_k, s_k, d, device="cuda", dtype=torch.bfloat16, generator=gen)
    v = torch.randn(b, h_k, s_k, d, device="cuda", dtype=torch.bfloat16, generator=gen)
    gqa = h != h_k

    def bare():
        return F.scaled_dot_product_attention(q, k, v, enable_gqa=gqa)

    def run():
        with sdpa_kernel([SDPBackend.FLASH_ATTENTION]):
            return bare()

    return bare if backend_set_outside else run


def geomean(xs):
    xs = [x for x in xs if x]
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else float("nan")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a few shapes only")
    parser.add_argument("--tune", action="store_true", help="12 shapes across head dims and batch sizes")
    parser.add_argument("--no-host", action="store_true", help="skip the per-call host times")
    parser.add_argument("--hdim", help="only these head dims (comma-separated)")
    parser.add_argument("--batch", help="only these batch sizes (comma-separated)")
    parser.add_argument("--pages", default=",".join(map(str, PAGES)),
                        help="page sizes of the paged caches timed (comma-separated; '' for none)")
    parser.add_argument("--out", help="write NAME.txt and NAME.json")
    args = parser.parse_args()

    def subset(option, text, allowed):
        """The comma-separated values of an option, each one of `allowed`."""
        try:
            values = {int(x) for x in text.split(",") if x.strip()}
        except ValueError:
            parser.error(f"{option} takes comma-separated integers, got {text!r}")
        if not values <= set(allowed):
            parser.error(f"{option} {text!r}: the grid has {', '.join(map(str, allowed))}")
        return values

    hdims = subset("--hdim", args.hdim, HEAD_DIMS) if args.hdim else None
    batches = subset("--batch", args.batch, BATCHES) if args.batch else None
    pages = tuple(sorted(subset("--pages", args.pages, PAGES)))

    import torch

    fa = load_flashattn()
    dev = torch.cuda.get_device_name()
    lines = []

    def emit(text=""):
        print(text, flush=True)
        lines.append(text)

    emit(f"# {dev}, torch {torch.__version__}, CUDA {torch.version.cuda}; flashattn {fa.__version__}; bf16")
    bw_copy = copy_bandwidth(torch)
    emit(f"# device-to-device copy bandwidth (read + write): {bw_copy:.0f} GB/s")
    shapes = list(itertools.product(S_Q, BATCHES, S_K, HEADS, HEAD_DIMS))
    if args.quick:
        shapes = [(1, 1, 4096, (32, 8), 128), (1, 8, 2048, (32, 8), 128), (4, 64, 8192, (32, 32), 64)]
    if args.tune:
        shapes = [(s_q, b, s_k, heads, d) for d in HEAD_DIMS for s_q, b, s_k, heads in
                  ((1, 1, 8192, (32, 8)), (1, 8, 8192, (32, 8)), (1, 64, 4096, (32, 32)), (4, 8, 32768, (32, 8)))]
    if args.hdim:
        shapes = [s for s in shapes if s[4] in hdims]
    if args.batch:
        shapes = [s for s in shapes if s[1] in batches]
    emit("s_q     b     s_k  h/h_k   d |  cache MB | flashattn us  GB/s %copy | paged16 us  vs cont | "
         "paged256 us vs cont |  SDPA-FA2 us | vs FA2")
    rows = []
    for s_q, b, s_k, (h, h_k), d in shapes:
        kv_bytes = 2 * b * s_k * h_k * d * 2
        if kv_bytes > MAX_CACHE_BYTES:
            continue
        row = {"s_q": s_q, "b": b, "s_k": s_k, "h": h, "h_k": h_k, "d": d, "kv_mb": kv_bytes / 2**20}
        inputs = make_inputs(torch, b, s_q, s_k, h, h_k, d)
        row["ours"] = graph_us(torch, runner_flashattn(torch, fa, inputs))
        del inputs
        for page in PAGES:
            if page not in pages:
                row[f"paged{page}"] = None
                continue
            inputs = make_inputs(torch, b, s_q, s_k, h, h_k, d, page)
            row[f"paged{page}"] = graph_us(torch, runner_flashattn(torch, fa, inputs))
            del inputs
        row["sdpa"] = graph_us(torch, runner_sdpa(torch, b, s_q, s_k, h, h_k, d))
        torch.cuda.empty_cache()
        gbs = kv_bytes / (row["ours"] * 1e-6) / 1e9 if row["ours"] else None
        row["gbs"] = gbs

        def fmt(x, w=10, p=1):
            return f"{x:{w}.{p}f}" if x else " " * (w - 3) + "n/a"

        def ratio(a, b_):
            return a / b_ if a and b_ else None

        emit(f"{s_q:3} {b:5} {s_k:7} {h:3}/{h_k:<3} {d:3} | {row['kv_mb']:9.1f} | {fmt(row['ours'], 12)} "
             f"{fmt(gbs, 5, 0)} {fmt(gbs and 100 * gbs / bw_copy, 5, 0)} | {fmt(row['paged16'])} "
             f"{fmt(ratio(row['paged16'], row['ours']), 7, 2)} | {fmt(row['paged256'], 11)} "
             f"{fmt(ratio(row['paged256'], row['ours']), 7, 2)} | {fmt(row['sdpa'], 12)} "
             f"{fmt(ratio(row['sdpa'], row['ours']), 6, 2)}")
        rows.append(row)

    def speedups(sel):
        return [r["sdpa"] / r["ours"] for r in rows if sel(r) and r["sdpa"] and r["ours"]]

    emit()
    emit(f"geomean speedup over SDPA-FA2 (contiguous): all {geomean(speedups(lambda r: True)):.2f}x, "
         f"b=1 {geomean(speedups(lambda r: r['b'] == 1)):.2f}x, "
         f"b=8 {geomean(speedups(lambda r: r['b'] == 8)):.2f}x, b=64 {geomean(speedups(lambda r: r['b'] == 64)):.2f}x")
    big = [r for r in rows if r["kv_mb"] >= 256 and r["gbs"]]
    if big:
        fracs = [r["gbs"] / bw_copy for r in big]
        emit(f"caches >= 256 MB: bandwidth {100 * min(fracs):.0f}%..{100 * max(fracs):.0f}% of copy, "
             f"geomean {100 * geomean(fracs):.0f}%")
    for page in PAGES:
        ratios = [r[f"paged{page}"] / r["ours"] for r in rows if r[f"paged{page}"] and r["ours"]]
        if ratios:
            emit(f"paged{page} / contiguous: geomean {geomean(ratios):.3f}, worst {max(ratios):.3f}")

    from torch.nn.attention import SDPBackend, sdpa_kernel

    if args.no_host:
        shapes_host = ()
    else:
        shapes_host = ((1, 4096, 32, 8, 128), (8, 2048, 32, 8, 128), (64, 1024, 32, 32, 64))
    emit()
    emit("per decode call (s_q = 1), us: host = issue only; call = 200 calls back to back incl. the GPU; "
         "GPU = graph replay")
    emit("shape                      impl                        host    call     GPU  call-GPU")
    host_rows = []
    for b, s_k, h, h_k, d in shapes_host:
        cont = make_inputs(torch, b, 1, s_k, h, h_k, d)
        paged = make_inputs(torch, b, 1, s_k, h, h_k, d, 16)
        q, k, v, *_ = cont
        one_new = [t[:, :1].clone() for t in (k, v)]
        seqlens_append = torch.full((b,), s_k - 1, dtype=torch.int32, device="cuda")
        impls = {
            "flash_attn_with_kvcache": runner_flashattn(torch, fa, cont),
            "  paged16": runner_flashattn(torch, fa, paged),
            "  + append 1 token": runner_append(fa, q, k, v, one_new, seqlens_append),
            "flash_attn_func": runner_func(fa, q, k, v),
        }
        for name, fn in impls.items():
            host, call = host_us(torch, fn)
            gpu = graph_us(torch, fn)
            host_rows.append({"b": b, "s_k": s_k, "h": h, "h_k": h_k, "d": d, "impl": name.strip(),
                              "host_us": host, "call_us": call, "gpu_us": gpu})
            emit(f"b={b:<2} s_k={s_k:<5} h={h}/{h_k:<2} d={d:<3} {name:26} {host:7.1f} {call:7.1f} {gpu or 0:7.1f}"
                 f" {call - (gpu or 0):8.1f}")
        sdpa = runner_sdpa(torch, b, 1, s_k, h, h_k, d, backend_set_outside=True)
        with sdpa_kernel([SDPBackend.FLASH_ATTENTION]):
            host, call = host_us(torch, sdpa)
        gpu = graph_us(torch, runner_sdpa(torch, b, 1, s_k, h, h_k, d))
        host_rows.append({"b": b, "s_k": s_k, "h": h, "h_k": h_k, "d": d, "impl": "SDPA-FA2",
                          "host_us": host, "call_us": call, "gpu_us": gpu})
        emit(f"b={b:<2} s_k={s_k:<5} h={h}/{h_k:<2} d={d:<3} {'SDPA-FA2':26} {host:7.1f} {call:7.1f} {gpu or 0:7.1f}"
             f" {call - (gpu or 0):8.1f}")
    if args.out:
        with open(args.out + ".txt", "w") as f:
            f.write("\n".join(lines) + "\n")
        with open(args.out + ".json", "w") as f:
            json.dump({"device": dev, "torch": torch.__version__, "copy_gbs": bw_copy, "rows": rows,
                       "host": host_rows}, f, indent=1)


if __name__ == "__main__":
    main()
