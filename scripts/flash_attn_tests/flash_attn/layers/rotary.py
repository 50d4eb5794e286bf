"""flash_attn.layers.rotary.apply_rotary_emb in PyTorch ops: the tests' reference
for flash_attn_with_kvcache's rotary embedding."""

import torch


def apply_rotary_emb(x, cos, sin, interleaved=False, inplace=False, seqlen_offsets=0, cu_seqlens=None,
                     max_seqlen=None):
    """x (b, s, h, d) rotated on its first 2 * cos.shape[1] channels at positions
    seqlen_offsets + [0, s) (an int or a (b,) tensor), in fp32, rounded once; pairs
    (2j, 2j + 1) if interleaved, else (j, j + rotary_dim / 2). Positions past
    cos's rows are left unrotated, as flash_attn's kernel leaves them."""
    if cu_seqlens is not None:
        raise NotImplementedError("varlen rotary is not needed by the tests run here")
    b, s = x.shape[:2]
    rotary_dim = 2 * cos.shape[1]
    pos = torch.arange(s, device=x.device)[None, :].expand(b, s)
    if isinstance(seqlen_offsets, torch.Tensor):
        pos = pos + seqlen_offsets.to(x.device).long()[:, None]
    else:
        pos = pos + int(seqlen_offsets)
    inside = (pos < cos.shape[0])[:, :, None, None]
    row = pos.clamp(max=cos.shape[0] - 1)
    c = torch.where(inside, cos[row].float()[:, :, None, :], 1.0)
    s_ = torch.where(inside, sin[row].float()[:, :, None, :], 0.0)
    xr = x[..., :rotary_dim].float()
    if interleaved:
        x1, x2 = xr[..., 0::2], xr[..., 1::2]
        rotated = torch.stack([x1 * c - x2 * s_, x1 * s_ + x2 * c], dim=-1).flatten(-2)
    else:
        x1, x2 = xr[..., : rotary_dim // 2], xr[..., rotary_dim // 2 :]
        rotated = torch.cat([x1 * c - x2 * s_, x1 * s_ + x2 * c], dim=-1)
    out = torch.cat([rotated.to(x.dtype), x[..., rotary_dim:]], dim=-1)
    if inplace:
        return x.copy_(out)
    return out
