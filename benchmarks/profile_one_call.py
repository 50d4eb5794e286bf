"""Two forward+backward calls of one shape, for a profiler (ncu, nsys) to capture
(--fwd-only: forwards; --impl cudnn / fa2: PyTorch SDPA's backend instead, (b, h, s, d)
memory, to profile beside ours).

    ncu --clock-control none -k regex:"bwd_ws_kernel|bwd_kernel|fwd_ws_kernel|fwd_kernel" -c 3 \
        --section SpeedOfLight --section ComputeWorkloadAnalysis --section WarpStateStats \
        --section LaunchStats --section Occupancy \
        python3 benchmarks/profile_one_call.py --hdim 128 --seqlen 4096
"""

import argparse

import flashattn
import torch


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--batch", type=int, default=2)
    p.add_argument("--seqlen", type=int, default=4096)
    p.add_argument("--heads", type=int, default=16)
    p.add_argument("--hdim", type=int, default=128)
    p.add_argument("--dtype", choices=["bf16", "fp16"], default="bf16")
    p.add_argument("--causal", action="store_true")
    p.add_argument("--family", default=None, help="force a kernel family (sm70, sm75, sm80, sm90)")
    p.add_argument("--dropout", type=float, default=0.0, help="attention dropout probability (default 0)")
    p.add_argument("--fwd-only", action="store_true", help="forward calls only")
    p.add_argument("--impl", choices=["flashattn", "cudnn", "fa2"], default="flashattn")
    a = p.parse_args()
    dtype = torch.bfloat16 if a.dtype == "bf16" else torch.float16
    g = torch.Generator("cuda").manual_seed(0)
    q, k, v, do = (torch.randn(a.batch, a.seqlen, a.heads, a.hdim, generator=g, device="cuda", dtype=dtype)
                   for _ in range(4))
    for t in (q, k, v):
        t.requires_grad_(True)
    if a.impl != "flashattn":
        from torch.nn.attention import SDPBackend, sdpa_kernel

        backend = SDPBackend.CUDNN_ATTENTION if a.impl == "cudnn" else SDPBackend.FLASH_ATTENTION
        q, k, v, do = (t.detach().transpose(1, 2).contiguous().requires_grad_(t.requires_grad) for t in (q, k, v, do))
    for _ in range(2):
        with torch.set_grad_enabled(not a.fwd_only):
            if a.impl == "flashattn":
                out = flashattn.flash_attn_func(q, k, v, a.dropout, causal=a.causal, family=a.family)
            else:
                with sdpa_kernel([backend]):
                    out = torch.nn.functional.scaled_dot_product_attention(q, k, v, dropout_p=a.dropout,
                                                                           is_causal=a.causal)
        if not a.fwd_only:
            out.backward(do)
    torch.cuda.synchronize()


if __name__ == "__main__":
    main()
