"""flash_attn.layers.rotary.apply_rotary_emb on flashattn's reference rotary: the
tests' reference for flash_attn_with_kvcache's rotary embedding."""

import torch
from flashattn.reference import apply_rotary


def apply_rotary_emb(x, cos, sin, interleaved=False, inplace=False, seqlen_offsets=0, cu_seqlens=None,
                     max_seqlen=None):
    """x (b, s, h, d) rotated at positions seqlen_offsets + [0, s) (an int or a (b,)
    tensor); positions past cos's rows are left unrotated, as flash_attn's kernel
    leaves them."""
    if cu_seqlens is not None:
        raise NotImplementedError("varlen rotary is not needed by the tests run here")
    b, s = x.shape[:2]
    pos = torch.arange(s, device=x.device)[None, :].expand(b, s)
    if isinstance(seqlen_offsets, torch.Tensor):
        pos = pos + seqlen_offsets.to(x.device).long()[:, None]
    else:
        pos = pos + int(seqlen_offsets)
    inside = (pos < cos.shape[0])[:, :, None, None]
    out = torch.where(inside, apply_rotary(x, cos, sin, pos.clamp(max=cos.shape[0] - 1), interleaved), x)
    return x.copy_(out) if inplace else out
