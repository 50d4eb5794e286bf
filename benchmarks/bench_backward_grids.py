"""The backward alone at the grids of real training shapes (small batches, GQA): flashattn
against SDPA's cuDNN backend (with enable_gqa, as transformers calls it), bf16.

    python3 benchmarks/bench_backward_grids.py                 # d128, every shape
    python3 benchmarks/bench_backward_grids.py --hdim 64 --shapes 0,2,3,8,10,14
    python3 benchmarks/bench_backward_grids.py --no-cudnn      # flashattn only (A/B runs)

Backward time = (forward + backward) - forward per call, µs (best of three runs of 30
calls, CUDA events); TFLOP/s = 2.5 x the forward's 4*b*h*s^2*d (half for causal).
Layout bshd: (b, s, h, d) tensors; bhsd: (b, s, h, d) views of (b, h, s, d) memory (a
model whose rotary embedding returns (b, h, s, d)). Needs a CUDA GPU.
"""

import argparse

# (seqlen, batch, heads, kv heads, causal, layout)
SHAPES = (
    (2048, 4, 16, 4, True, "bshd"),  # the Llama step of bench_transformers_step.py
    (2048, 4, 16, 4, True, "bhsd"),
    (2048, 4, 16, 16, True, "bshd"),
    (2048, 8, 16, 4, True, "bshd"),
    (2048, 8, 16, 16, True, "bshd"),
    (2048, 16, 16, 4, True, "bshd"),
    (2048, 2, 16, 4, True, "bshd"),
    (2048, 1, 32, 8, True, "bshd"),  # Llama-3-8B, one sequence
    (4096, 2, 16, 4, True, "bshd"),
    (4096, 4, 32, 8, True, "bshd"),
    (8192, 1, 32, 8, True, "bshd"),
    (2048, 4, 16, 4, False, "bshd"),
    (2048, 4, 16, 16, False, "bshd"),
    (16384, 1, 16, 16, True, "bshd"),
    (4096, 4, 16, 16, True, "bshd"),
    (1024, 16, 16, 16, True, "bshd"),
    (2048, 1, 64, 8, True, "bshd"),  # 70B's heads, one sequence
)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--hdim", type=int, default=128)
    p.add_argument("--shapes", help="comma list of indices into SHAPES (default: all)")
    p.add_argument("--no-cudnn", action="store_true", help="time flashattn only")
    a = p.parse_args()
    if a.shapes is not None:
        try:
            picked = [int(i) for i in a.shapes.split(",")]
        except ValueError:
            p.error(f"--shapes takes comma-separated integers, got {a.shapes!r}")
        if any(not 0 <= i < len(SHAPES) for i in picked):
            p.error(f"--shapes indices must be in 0..{len(SHAPES) - 1} (the SHAPES list), got {a.shapes!r}")

    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    import flashattn

    shapes = SHAPES if a.shapes is None else [SHAPES[i] for i in picked]
    d = a.hdim

    def best_ms(fn, reps=30):
        for _ in range(3):
            fn()
        torch.cuda.synchronize()
        best = float("inf")
        for _ in range(3):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(reps):
                fn()
            end.record()
            torch.cuda.synchronize()
            best = min(best, start.elapsed_time(end) / reps)
        return best

    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, flashattn {flashattn.__file__}, d{d} bf16")
    print(f"{'s':>6} {'b':>3} {'h':>3} {'hk':>3} {'causal':>6} {'layout':>6} | flashattn fwd  bwd | cuDNN fwd  bwd |"
          f" bwd TFLOP/s flashattn cuDNN | cuDNN/flashattn")
    for s, b, h, hk, causal, layout in shapes:
        torch.manual_seed(0)

        def make(heads):
            if layout == "bshd":
                t = torch.randn(b, s, heads, d, device="cuda", dtype=torch.bfloat16)
            else:
                t = torch.randn(b, heads, s, d, device="cuda", dtype=torch.bfloat16).transpose(1, 2)
            return t.requires_grad_()

        q, k, v = make(h), make(hk), make(hk)
        dout = torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16)
        ours_fwd = lambda: flashattn.flash_attn_func(q, k, v, causal=causal)  # noqa: E731
        ours_fwd_bwd = lambda: ours_fwd().backward(dout)  # noqa: E731
        with torch.no_grad():
            t_fwd = best_ms(ours_fwd)
        t_bwd = best_ms(ours_fwd_bwd) - t_fwd
        c_fwd = c_bwd = float("nan")
        if not a.no_cudnn:
            qt, kt, vt = (x.detach().transpose(1, 2).requires_grad_() for x in (q, k, v))
            dout_t = dout.transpose(1, 2)

            def cudnn_fwd():
                with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                    return F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal, enable_gqa=hk != h)

            with torch.no_grad():
                c_fwd = best_ms(cudnn_fwd)
            c_bwd = best_ms(lambda: cudnn_fwd().backward(dout_t)) - c_fwd
        flop = 2.5 * 4 * b * h * s * s * d * (0.5 if causal else 1.0)
        print(f"{s:>6} {b:>3} {h:>3} {hk:>3} {str(causal):>6} {layout:>6} | {t_fwd * 1e3:13.0f} {t_bwd * 1e3:4.0f} |"
              f" {c_fwd * 1e3:9.0f} {c_bwd * 1e3:4.0f} | {flop / t_bwd / 1e9:21.0f} {flop / c_bwd / 1e9:5.0f} |"
              f" {c_bwd / t_bwd:15.3f}", flush=True)


if __name__ == "__main__":
    main()
