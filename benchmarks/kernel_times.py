"""Every GPU kernel of one forward+backward call, flashattn beside SDPA's cuDNN and
FlashAttention-2 backends: where a call's GPU time goes, pass by pass (the backward's
preprocess, main kernel and dQ conversion), from torch.profiler. bf16, (b, s, h, d)
tensors for flashattn, (b, h, s, d) for SDPA; the gradients are reset before each call,
as a training step does, so that no gradient-accumulation kernel is counted.

    python3 benchmarks/kernel_times.py                       # the default shapes, all three
    python3 benchmarks/kernel_times.py --impls flashattn     # A/B runs of two builds
    python3 benchmarks/kernel_times.py --shapes 8x2048x16x128,32x512x8x256c
    python3 benchmarks/kernel_times.py --impls flashattn --dropout 0.1  # with dropout

A shape is BATCHxSEQLENxHEADSxHDIM, with a trailing "c" for causal. GPU µs per call,
the mean of 5 profiled calls after 3 warmup calls. Needs a CUDA GPU.
"""

import argparse
import warnings

DEFAULT_SHAPES = "1x16384x16x128,8x2048x16x128,32x512x16x128,8x2048x32x64,32x512x8x256c"
IMPLS = ("flashattn", "cudnn", "fa2")


def parse_shape(text):
    causal = text.endswith("c")
    try:
        b, s, h, d = (int(x) for x in text.rstrip("c").split("x"))
    except ValueError:
        raise ValueError(f"shape {text!r}: expected BATCHxSEQLENxHEADSxHDIM[c], e.g. 8x2048x16x128") from None
    return b, s, h, d, causal


def kernel_table(impl, b, s, h, d, causal, dropout_p=0.0, calls=5):
    import flashattn
    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.profiler import ProfilerActivity, profile

    g = torch.Generator("cuda").manual_seed(0)
    q, k, v, do = (torch.randn(b, s, h, d, generator=g, device="cuda", dtype=torch.bfloat16) for _ in range(4))
    if impl != "flashattn":
        q, k, v, do = (t.transpose(1, 2).contiguous() for t in (q, k, v, do))
    for t in (q, k, v):
        t.requires_grad_(True)
    backend = SDPBackend.CUDNN_ATTENTION if impl == "cudnn" else SDPBackend.FLASH_ATTENTION

    def step():
        for t in (q, k, v):
            t.grad = None
        if impl == "flashattn":
            out = flashattn.flash_attn_func(q, k, v, dropout_p=dropout_p, causal=causal)
        else:
            with sdpa_kernel([backend]):
                out = torch.nn.functional.scaled_dot_product_attention(
                    q, k, v, dropout_p=dropout_p, is_causal=causal)
        out.backward(do)

    for _ in range(3):
        step()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            step()
        torch.cuda.synchronize()
    rows = [(e.device_time_total / calls, e.count // calls, e.key) for e in prof.key_averages() if e.device_time_total > 0]
    return sorted(rows, key=lambda r: -r[0])


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shapes", default=DEFAULT_SHAPES, help=f"comma-separated shapes (default {DEFAULT_SHAPES})")
    p.add_argument("--impls", default=",".join(IMPLS), help="any of flashattn,cudnn,fa2")
    p.add_argument("--dropout", type=float, default=0.0, help="attention dropout probability (default 0)")
    a = p.parse_args()
    if not 0.0 <= a.dropout < 1.0:
        p.error(f"--dropout: {a.dropout} is not in [0, 1)")
    try:
        shapes = [parse_shape(x) for x in a.shapes.split(",")]
    except ValueError as e:
        p.error(f"--shapes: {e}")
    impls = a.impls.split(",")
    for impl in impls:
        if impl not in IMPLS:
            p.error(f"--impls: unknown implementation {impl!r} (choose from {', '.join(IMPLS)})")

    import torch

    if not torch.cuda.is_available():
        p.error("needs a CUDA GPU")
    warnings.filterwarnings("ignore", message=".*Profiler clears events.*")
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name()}")
    for b, s, h, d, causal in shapes:
        for impl in impls:
            rows = kernel_table(impl, b, s, h, d, causal, a.dropout)
            print(f"== {impl} b{b} s{s} h{h} d{d} {'causal' if causal else 'non-causal'}"
                  + (f" dropout {a.dropout}" if a.dropout else "") + " (GPU us per call)")
            for us, count, name in rows:
                print(f"  {us:9.1f} x{count:<2} {name[:150]}")
            print(f"  {sum(r[0] for r in rows):9.1f} total")


if __name__ == "__main__":
    main()
