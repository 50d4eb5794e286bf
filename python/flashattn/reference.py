"""Pure-PyTorch attention with the exact semantics of flash_attn 2.x.

It is the CPU implementation of the ``torch.ops.flashattn`` ops and the yardstick of
the GPU tests. It materialises the (b, h, s_q, s_k) score matrix, so it is for
checking, not for speed.

Shapes: q (b, s_q, h, d), k/v (b, s_k, h_k, d) with h % h_k == 0, any d.
Query head i reads key/value head i // (h // h_k). Varlen: q (total_q, h, d), k/v
(total_k, h_k, d), sequence i at rows [cu_seqlens[i], cu_seqlens[i + 1]); each
sequence is its own batch of one (masks aligned to its own bottom-right). KV cache
(``kvcache_attention``): flash_attn_with_kvcache's append, rotary embedding, paged
and per-sequence caches, written plainly, one sequence at a time.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch

__all__ = [
    "apply_rotary",
    "attention",
    "attention_bwd",
    "dropout_attn_probs",
    "dropout_keep_mask",
    "dropout_keep_rate",
    "kvcache_attention",
    "varlen_attention",
    "varlen_attention_bwd",
    "varlen_cache_attention",
    "visible_mask",
]


def visible_mask(
    s_q: int,
    s_k: int,
    causal: bool = False,
    window_size: tuple[int, int] = (-1, -1),
    device=None,
) -> torch.Tensor:
    """Bool (s_q, s_k): may query row i see key j? Aligned to the bottom-right.

    Query i lines up with key i + s_k - s_q; it sees keys in
    [that - window_left, that + window_right], -1 meaning unbounded on that side.
    ``causal`` forces window_right = 0.
    """
    window_left, window_right = window_size
    if causal:
        window_right = 0
    i = torch.arange(s_q, device=device)[:, None]
    j = torch.arange(s_k, device=device)[None, :]
    diagonal = i + (s_k - s_q)
    visible = torch.ones(s_q, s_k, dtype=torch.bool, device=device)
    if window_right >= 0:
        visible &= j <= diagonal + window_right
    if window_left >= 0:
        visible &= j >= diagonal - window_left
    return visible


def _compute_dtype(dtype: torch.dtype, upcast: bool) -> torch.dtype:
    if not upcast:
        return dtype
    return torch.float64 if dtype == torch.float64 else torch.float32


def _expand_kv(t: torch.Tensor, heads: int) -> torch.Tensor:
    """(b, s_k, h_k, d) -> (b, s_k, h, d): repeat each key/value head over its group."""
    return t.repeat_interleave(heads // t.shape[2], dim=2)


def _reduce_kv(t: torch.Tensor, heads_k: int) -> torch.Tensor:
    """(b, s_k, h, d) -> (b, s_k, h_k, d): sum the gradients of each group."""
    b, s_k, h, d = t.shape
    return t.reshape(b, s_k, heads_k, h // heads_k, d).sum(3)


def _scores(q, k, scale, softcap, alibi_slopes, visible):
    """Scaled, soft-capped, ALiBi-biased, masked scores (b, h, s_q, s_k).

    Also returns tanh(s / softcap) (None without softcap), for the backward's chain rule.
    """
    s_q, s_k = q.shape[1], k.shape[1]
    scores = torch.einsum("bqhd,bkhd->bhqk", q, k) * scale
    capped_tanh = None
    if softcap > 0:
        capped_tanh = torch.tanh(scores / softcap)
        scores = softcap * capped_tanh
    if alibi_slopes is not None:
        i = torch.arange(s_q, device=q.device)[:, None]
        j = torch.arange(s_k, device=q.device)[None, :]
        distance = (i + s_k - s_q - j).abs().to(scores.dtype)
        slopes = alibi_slopes.to(scores.dtype)
        slopes = slopes.view(-1 if slopes.dim() == 2 else 1, q.shape[2], 1, 1)
        scores = scores - slopes * distance
    return scores.masked_fill(~visible, -math.inf), capped_tanh


_MASK32 = 0xFFFFFFFF


def _mulhilo32(a: torch.Tensor, m: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(high, low) 32-bit words of a * m for int64 tensors a in [0, 2^32) and m < 2^32,
    in int64 arithmetic (the product can exceed 2^63: m is split in 16-bit halves)."""
    p_lo = a * (m & 0xFFFF)
    p_hi = a * (m >> 16)
    low = p_lo + ((p_hi & 0xFFFF) << 16)
    return (p_hi >> 16) + (low >> 32), low & _MASK32


def philox4x32(
    key: tuple[torch.Tensor, torch.Tensor], counter: list[torch.Tensor], rounds: int = 7
) -> list[torch.Tensor]:
    """Philox4x32 (7 rounds in kernel/dropout.h), elementwise on int64 tensors holding
    32-bit words: key (k0, k1), counter [c0, c1, c2, c3]; returns 4 words."""
    k0, k1 = key
    c0, c1, c2, c3 = counter
    for _ in range(rounds):
        hi0, lo0 = _mulhilo32(c0, 0xD2511F53)
        hi1, lo1 = _mulhilo32(c2, 0xCD9E8D57)
        c0, c1, c2, c3 = hi1 ^ c1 ^ k0, lo1, hi0 ^ c3 ^ k1, lo0
        k0, k1 = (k0 + 0x9E3779B9) & _MASK32, (k1 + 0xBB67AE85) & _MASK32
    return [c0, c1, c2, c3]


class DropoutUnits(NamedTuple):
    """How a kernel family's dropout mask groups elements into Philox calls
    (include/flashattn/kernel/dropout.h): ``paired_row_stride`` pairs rows (i, i + s),
    8 for 16x8 mma atoms (sm75, sm80, sm90 and the CPU path), 2 for sm70; with
    ``lane_units`` (sm75, sm80, sm90 and the CPU path) a call covers one lane's 16
    elements of a row pair in 32 columns, else (sm70) a row pair's 8 columns."""

    paired_row_stride: int = 8
    lane_units: bool = True


def dropout_keep_rate(dropout_p: float) -> float:
    """The probability that the kernels keep an element: 1 - p to 1/8192
    (round((1 - p) 4096) / 4096)."""
    return _keep16(dropout_p) / 4096


def _keep16(dropout_p: float) -> int:
    """round((1 - p) 4096) with halves away from zero, as the kernels' host code
    rounds it (std::lround); Python's round() would take a half to the even side."""
    return math.floor((1.0 - dropout_p) * 4096 + 0.5)


def dropout_keep_mask(
    rng_state: torch.Tensor,
    batch: int,
    heads: int,
    seqlen_q: int,
    seqlen_k: int,
    dropout_p: float,
    dropout_units: DropoutUnits = DropoutUnits(),
) -> torch.Tensor:
    """Bool (batch, heads, seqlen_q, seqlen_k): the CUDA kernels' dropout mask (True =
    kept) for rng_state = int64 [seed, offset], bit for bit (include/flashattn/kernel/
    dropout.h defines it), with the kernel family's ``dropout_units`` (an int is a
    row stride without lane units, as this argument was before). Computed on
    rng_state's device, without reading it on the host (so it can be captured in a
    CUDA graph).

    Each Philox call is made once, as the kernels make it, and its 16 bytes'
    decisions are then gathered into the elements that use them (an element-wise
    evaluation makes every call 16 times over)."""
    if isinstance(dropout_units, int):
        dropout_units = DropoutUnits(dropout_units, lane_units=False)
    dev = rng_state.device
    s = dropout_units.paired_row_stride
    i = torch.arange(seqlen_q, device=dev)
    j = torch.arange(seqlen_k, device=dev)
    # Every element's call (row pair, column group) and byte of that call.
    row_pair = (i // (2 * s)) * s + i % s
    if dropout_units.lane_units:
        group = j // 32 * 4 + j % 8 // 2
        byte_col = j // 8 % 4 * 4 + j % 2
        spans, rest = divmod(seqlen_k, 32)
        groups = spans * 4 + (min(rest, 8) + 1) // 2
    else:
        group = j // 8
        byte_col = j % 8 // 2 * 4 + j % 2
        groups = -(-seqlen_k // 8)
    blocks, rest = divmod(seqlen_q, 2 * s)
    row_pairs = blocks * s + min(rest, s)  # row_pair's values are 0 .. row_pairs - 1
    byte = byte_col.view(1, -1) + ((i // s) % 2 * 2).view(-1, 1)
    # The calls: seed + offset + b * heads + h, wrapping at 2^64 as the kernels'
    # uint64 does, and every (row pair, group).
    bh = torch.arange(batch * heads, device=dev).view(-1, 1, 1)
    base = rng_state[0] + rng_state[1] + bh
    lo, hi = base & _MASK32, (base >> 32) & _MASK32
    r = torch.arange(row_pairs, device=dev).view(1, -1, 1)
    g = torch.arange(groups, device=dev).view(1, 1, -1)
    # Lane units put the seed where the first round multiplies (kernel/dropout.h).
    counter = (lo, g, hi, r) if dropout_units.lane_units else (g, r, lo, hi)
    shape = (batch * heads, row_pairs, groups)
    zero = torch.zeros((), dtype=torch.int64, device=dev)
    words = philox4x32((zero, zero), [c.expand(shape) for c in counter])
    # Byte k of a call (byte k % 4 of word k // 4, little-endian) is kept below
    # t_lo + (k < n_hi).
    keep16 = _keep16(dropout_p)
    kept = torch.stack(
        [((words[k // 4] >> (8 * (k % 4))) & 0xFF) < keep16 // 16 + int(k < keep16 % 16) for k in range(16)], -1
    )
    element = (row_pair.view(-1, 1) * groups + group.view(1, -1)) * 16 + byte
    keep = kept.view(batch * heads, row_pairs * groups * 16)[:, element.view(-1)]
    return keep.view(batch, heads, seqlen_q, seqlen_k)


def _dropout_scale(rng_state, dropout_p, like, dtype, dropout_units):
    """The kept elements' factor for the probabilities ``like``: mask / (1 - p), in
    the compute dtype, on like's device (rng_state may be on the CPU)."""
    b, h, s_q, s_k = like.shape
    keep = dropout_keep_mask(rng_state.to(like.device), b, h, s_q, s_k, dropout_p, dropout_units)
    return keep.to(dtype) / (1.0 - dropout_p)


def _prepare(q, k, v, softmax_scale, causal, window_size, softcap, alibi_slopes, dtype):
    """Cast, expand GQA, build the scores: what the forward and backward share."""
    _, s_q, h, d = q.shape
    scale = d**-0.5 if softmax_scale is None else softmax_scale
    qc = q.to(dtype)
    kc = _expand_kv(k.to(dtype), h)
    vc = _expand_kv(v.to(dtype), h)
    visible = visible_mask(s_q, k.shape[1], causal, window_size, q.device)
    scores, capped_tanh = _scores(qc, kc, scale, softcap, alibi_slopes, visible)
    return qc, kc, vc, scale, visible, scores, capped_tanh


def _probs(scores, lse, visible):
    """P = exp(s - lse); exactly 0 where masked (also in rows that see no key)."""
    return torch.exp(scores - lse.to(scores.dtype)[..., None]).masked_fill(~visible, 0.0)


def attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    softmax_scale: float | None = None,
    causal: bool = False,
    window_size: tuple[int, int] = (-1, -1),
    softcap: float = 0.0,
    alibi_slopes: torch.Tensor | None = None,
    dropout_p: float = 0.0,
    rng_state: torch.Tensor | None = None,
    upcast: bool = True,
    dropout_units: DropoutUnits = DropoutUnits(),
) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention forward. Returns (out like q, softmax_lse (b, h, s_q)).

    ``upcast=True`` computes in fp32 (fp64 for fp64 inputs) and returns ``out`` in the
    input dtype; ``upcast=False`` computes everything in the input dtype (PyTorch's
    own low-precision math, the error baseline of the GPU tests). ``softmax_lse`` is in
    the compute dtype: natural log of the scores' exp-sum, +inf for a row that sees no
    key (whose output is 0). Dropout (needs ``rng_state``) applies to P after the lse,
    with the CUDA kernels' mask (``dropout_keep_mask``; ``dropout_units`` names the
    kernel family's).
    """
    dtype = _compute_dtype(q.dtype, upcast)
    _, _, vc, _, visible, scores, _ = _prepare(
        q, k, v, softmax_scale, causal, window_size, softcap, alibi_slopes, dtype
    )
    lse = torch.logsumexp(scores, dim=-1)
    lse = lse.masked_fill(lse == -math.inf, math.inf)  # flash_attn: no key -> +inf
    probs = _probs(scores, lse, visible)
    if dropout_p > 0:
        probs = probs * _dropout_scale(rng_state, dropout_p, probs, dtype, dropout_units)
    out = torch.einsum("bhqk,bkhd->bqhd", probs, vc)
    return out.to(q.dtype), lse


def attention_bwd(
    dout: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    out: torch.Tensor,
    softmax_lse: torch.Tensor,
    softmax_scale: float | None = None,
    causal: bool = False,
    window_size: tuple[int, int] = (-1, -1),
    softcap: float = 0.0,
    alibi_slopes: torch.Tensor | None = None,
    dropout_p: float = 0.0,
    rng_state: torch.Tensor | None = None,
    upcast: bool = True,
    dropout_units: DropoutUnits = DropoutUnits(),
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Analytic attention backward in fp32 (fp64 for fp64). Returns (dq, dk, dv).

    P is recomputed from the scores and ``softmax_lse``; dk/dv are summed over each
    GQA group to (b, s_k, h_k, d). Rows that see no key get zero gradients.
    ``upcast=False`` computes in the input dtype (the GPU tests' error baseline).
    """
    dtype = _compute_dtype(q.dtype, upcast)
    qc, kc, vc, scale, visible, scores, capped_tanh = _prepare(
        q, k, v, softmax_scale, causal, window_size, softcap, alibi_slopes, dtype
    )
    do, o = dout.to(dtype), out.to(dtype)
    probs = _probs(scores, softmax_lse, visible)
    dropped = probs
    if dropout_p > 0:
        keep_scale = _dropout_scale(rng_state, dropout_p, probs, dtype, dropout_units)
        dropped = probs * keep_scale
    dv = torch.einsum("bhqk,bqhd->bkhd", dropped, do)
    dprobs = torch.einsum("bqhd,bkhd->bhqk", do, vc)
    if dropout_p > 0:
        dprobs = dprobs * keep_scale
    # Softmax backward: dS = P * (dP - rowsum(dO * O)); rowsum(dO * O) = rowsum(P * dP).
    delta = (do * o).sum(-1).transpose(1, 2)[..., None]
    dscores = probs * (dprobs - delta)
    if capped_tanh is not None:
        dscores = dscores * (1.0 - capped_tanh * capped_tanh)
    dq = scale * torch.einsum("bhqk,bkhd->bqhd", dscores, kc)
    dk = scale * torch.einsum("bhqk,bqhd->bkhd", dscores, qc)
    h_k = k.shape[2]
    return dq.to(q.dtype), _reduce_kv(dk, h_k).to(k.dtype), _reduce_kv(dv, h_k).to(v.dtype)


def dropout_attn_probs(
    q: torch.Tensor,
    k: torch.Tensor,
    softmax_scale: float | None,
    causal: bool,
    window_size: tuple[int, int],
    softcap: float,
    alibi_slopes: torch.Tensor | None,
    dropout_p: float,
    rng_state: torch.Tensor,
    block_size_n: int,
    dropout_units: DropoutUnits = DropoutUnits(),
) -> torch.Tensor:
    """What flash_attn 2.x returns as S_dmask with ``return_attn_probs=True`` and
    dropout, for a batch q (b, s_q, h, d), k (b, s_k, h_k, d): (b, h, s_q rounded up to
    128, s_k rounded up to 128) in q's dtype. Entry (i, j) is exp(s_ij - m_ij) for the
    scaled score s (softcap and ALiBi applied), where m_ij is the running maximum of
    row i over key blocks of ``block_size_n`` keys taken from the last to the first,
    up to j's block (what flash_attn's kernel holds when it writes S; its tests
    normalise it with the same blocks); negative where dropout dropped the element
    (the kernels' mask, ``dropout_keep_mask``); 0 where masked and in the padding."""
    b, s_q, h, d = q.shape
    s_k = k.shape[1]
    scale = d**-0.5 if softmax_scale is None else softmax_scale
    visible = visible_mask(s_q, s_k, causal, window_size, q.device)
    scores, _ = _scores(q.float(), _expand_kv(k.float(), h), scale, softcap, alibi_slopes, visible)
    blocks = -(-s_k // block_size_n)
    padded = torch.nn.functional.pad(scores, (0, blocks * block_size_n - s_k), value=-math.inf)
    block_max = padded.view(b, h, s_q, blocks, block_size_n).amax(-1)
    running = block_max.flip(-1).cummax(-1).values.flip(-1)  # max over blocks >= this one
    running = running.repeat_interleave(block_size_n, dim=-1)[..., :s_k]
    probs = torch.exp(scores - running.masked_fill(running == -math.inf, 0.0))
    keep = dropout_keep_mask(rng_state.to(q.device), b, h, s_q, s_k, dropout_p, dropout_units)
    probs = torch.where(keep, probs, -probs)
    out = torch.zeros(b, h, -(-s_q // 128) * 128, -(-s_k // 128) * 128, dtype=q.dtype, device=q.device)
    out[..., :s_q, :s_k] = probs.to(q.dtype)
    return out


def varlen_dropout_attn_probs(
    q, k, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale, causal, window_size, softcap,
    alibi_slopes, dropout_p, rng_state, block_size_n, dropout_units=DropoutUnits(),
) -> torch.Tensor:
    """``dropout_attn_probs`` of a varlen batch: (b, h, max_seqlen_q rounded up to 128,
    max_seqlen_k rounded up to 128), sequence i at the top left of entry i."""
    b, h = cu_seqlens_q.numel() - 1, q.shape[1]
    out = torch.zeros(b, h, -(-max_seqlen_q // 128) * 128, -(-max_seqlen_k // 128) * 128, dtype=q.dtype,
                      device=q.device)
    for i, rq, rk in _sequences(cu_seqlens_q, cu_seqlens_k):
        if rq.stop == rq.start or rk.stop == rk.start:
            continue
        slopes, state = _sequence_options(i, h, alibi_slopes, rng_state)
        p = dropout_attn_probs(q[None, rq], k[None, rk], softmax_scale, causal, window_size, softcap, slopes,
                               dropout_p, state, block_size_n, dropout_units)
        out[i, :, : rq.stop - rq.start, : rk.stop - rk.start] = p[0, :, : rq.stop - rq.start, : rk.stop - rk.start]
    return out


def _sequences(cu_seqlens_q: torch.Tensor, cu_seqlens_k: torch.Tensor):
    """(i, q rows, k rows) of every sequence of a varlen batch (reads the offsets)."""
    cu_q, cu_k = cu_seqlens_q.tolist(), cu_seqlens_k.tolist()
    for i in range(len(cu_q) - 1):
        yield i, slice(cu_q[i], cu_q[i + 1]), slice(cu_k[i], cu_k[i + 1])


def _sequence_options(i: int, heads: int, alibi_slopes, rng_state):
    """Sequence i's ALiBi slopes ((h) or row i of (b, h)) and dropout state: sequence i
    is batch index i of the mask (offset + i * heads as a batch of one)."""
    slopes = alibi_slopes
    if slopes is not None and slopes.dim() == 2:
        slopes = slopes[i]
    state = None
    if rng_state is not None:
        state = rng_state + torch.tensor([0, i * heads], dtype=rng_state.dtype, device=rng_state.device)
    return slopes, state


def varlen_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    cu_seqlens_k: torch.Tensor,
    softmax_scale: float | None = None,
    causal: bool = False,
    window_size: tuple[int, int] = (-1, -1),
    softcap: float = 0.0,
    alibi_slopes: torch.Tensor | None = None,
    dropout_p: float = 0.0,
    rng_state: torch.Tensor | None = None,
    upcast: bool = True,
    dropout_units: DropoutUnits = DropoutUnits(),
) -> tuple[torch.Tensor, torch.Tensor]:
    """Varlen forward: ``attention`` per sequence. Returns (out (total_q, h, d),
    softmax_lse (h, total_q)) — flash_attn 2.x's varlen lse layout. Rows of q outside
    every sequence are 0 in out and +inf in the lse. Sequence i's dropout mask is
    batch index i of ``dropout_keep_mask`` (rows and columns counted in the sequence)."""
    total_q, h, _ = q.shape
    out = torch.zeros_like(q)
    lse = torch.full((h, total_q), math.inf, dtype=_compute_dtype(q.dtype, upcast), device=q.device)
    for i, rq, rk in _sequences(cu_seqlens_q, cu_seqlens_k):
        if rq.stop == rq.start:
            continue
        slopes, state = _sequence_options(i, h, alibi_slopes, rng_state)
        if rk.stop == rk.start:  # no key: out 0, lse +inf (as a row that sees no key)
            continue
        o, l = attention(
            q[None, rq], k[None, rk], v[None, rk], softmax_scale, causal, window_size, softcap,
            slopes, dropout_p, state, upcast, dropout_units,
        )
        out[rq] = o[0]
        lse[:, rq] = l[0]
    return out, lse


def varlen_attention_bwd(
    dout: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    out: torch.Tensor,
    softmax_lse: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    cu_seqlens_k: torch.Tensor,
    softmax_scale: float | None = None,
    causal: bool = False,
    window_size: tuple[int, int] = (-1, -1),
    softcap: float = 0.0,
    alibi_slopes: torch.Tensor | None = None,
    dropout_p: float = 0.0,
    rng_state: torch.Tensor | None = None,
    upcast: bool = True,
    dropout_units: DropoutUnits = DropoutUnits(),
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Varlen backward: ``attention_bwd`` per sequence; softmax_lse (h, total_q).
    Rows outside every sequence get zero gradients."""
    dq, dk, dv = torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
    for i, rq, rk in _sequences(cu_seqlens_q, cu_seqlens_k):
        if rq.stop == rq.start or rk.stop == rk.start:
            continue
        slopes, state = _sequence_options(i, q.shape[1], alibi_slopes, rng_state)
        g = attention_bwd(
            dout[None, rq], q[None, rq], k[None, rk], v[None, rk], out[None, rq],
            softmax_lse[None, :, rq], softmax_scale, causal, window_size, softcap, slopes,
            dropout_p, state, upcast, dropout_units,
        )
        dq[rq], dk[rk], dv[rk] = g[0][0], g[1][0], g[2][0]
    return dq, dk, dv


def apply_rotary(
    x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, positions: torch.Tensor, interleaved: bool
) -> torch.Tensor:
    """Rotary embedding of x (b, s, h, d) at positions (b, s): its first
    rotary_dim = 2 * cos.shape[1] dims are rotated by the angles of row positions[b, i]
    of cos/sin (seqlen_ro, rotary_dim / 2); pairs (2j, 2j + 1) when ``interleaved``,
    else (j, j + rotary_dim / 2). Computed in fp32, returned in x's dtype. Rows at a
    position past the tables are left as they are (angle 0), as the kernels do."""
    rotary_dim = 2 * cos.shape[1]
    held = positions < cos.shape[0]
    at = torch.where(held, positions, 0)
    c = torch.where(held[..., None], cos[at].float(), 1.0)[:, :, None]  # (b, s, 1, rotary_dim / 2)
    s = torch.where(held[..., None], sin[at].float(), 0.0)[:, :, None]
    x_rot = x[..., :rotary_dim].float()
    if interleaved:
        x1, x2 = x_rot[..., 0::2], x_rot[..., 1::2]
        rotated = torch.stack((x1 * c - x2 * s, x1 * s + x2 * c), dim=-1).flatten(-2)
    else:
        x1, x2 = x_rot.chunk(2, dim=-1)
        rotated = torch.cat((x1 * c - x2 * s, x1 * s + x2 * c), dim=-1)
    return torch.cat((rotated.to(x.dtype), x[..., rotary_dim:]), dim=-1)


def _cache_rows(cache: torch.Tensor, batch: int, rows: torch.Tensor, block_table, cache_batch_idx):
    """Index of rows ``rows`` of sequence ``batch`` in a cache: (cache row or pages, offsets)."""
    if block_table is not None:
        page_size = cache.shape[1]
        return block_table[batch].long()[rows // page_size], rows % page_size
    cache_batch = batch if cache_batch_idx is None else int(cache_batch_idx[batch])
    return torch.full_like(rows, cache_batch), rows


def kvcache_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    k: torch.Tensor | None = None,
    v: torch.Tensor | None = None,
    rotary_cos: torch.Tensor | None = None,
    rotary_sin: torch.Tensor | None = None,
    cache_seqlens: torch.Tensor | int | None = None,
    cache_batch_idx: torch.Tensor | None = None,
    cache_leftpad: torch.Tensor | None = None,
    block_table: torch.Tensor | None = None,
    softmax_scale: float | None = None,
    causal: bool = False,
    window_size: tuple[int, int] = (-1, -1),
    softcap: float = 0.0,
    rotary_interleaved: bool = True,
    alibi_slopes: torch.Tensor | None = None,
    upcast: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """flash_attn_with_kvcache: returns (out like q, softmax_lse (b, h, s_q)).

    The new k/v (b, s_new, h_k, d) are written **into k_cache/v_cache** at rows
    cache_seqlens[b].. of each sequence (k rotated at those positions); q is rotated
    at cache_seqlens[b] (+ its row under a causal or local mask). Sequence b then
    attends to its cache rows [cache_leftpad[b], cache_seqlens[b] + s_new), as one
    sequence (masks and ALiBi aligned to its bottom-right). cache_seqlens None: the
    whole cache. Caches are (b_cache, s_cache, h_k, d), or pages (num_pages,
    page_size, h_k, d) named by block_table (b, pages_per_sequence).
    """
    b, s_q, h, _ = q.shape
    capacity = k_cache.shape[1] * (block_table.shape[1] if block_table is not None else 1)
    if cache_seqlens is None:
        lengths = [capacity] * b
    elif isinstance(cache_seqlens, int):
        lengths = [cache_seqlens] * b
    else:
        lengths = [int(x) for x in cache_seqlens.tolist()]
    s_new = 0 if k is None else k.shape[1]
    rotary = rotary_cos is not None
    device = q.device
    if rotary:
        starts = torch.tensor(lengths, device=device)[:, None]
        rows = torch.arange(s_q, device=device)[None, :]
        per_row = causal or window_size[0] >= 0 or window_size[1] >= 0
        q = apply_rotary(q, rotary_cos, rotary_sin, starts + (rows if per_row else 0 * rows), rotary_interleaved)
    out = torch.zeros_like(q)
    lse = torch.full((b, h, s_q), math.inf, dtype=_compute_dtype(q.dtype, upcast), device=device)
    for i in range(b):
        if k is not None:
            positions = torch.arange(lengths[i], lengths[i] + s_new, device=device)
            new_k = k[i : i + 1]
            if rotary:
                new_k = apply_rotary(new_k, rotary_cos, rotary_sin, positions[None], rotary_interleaved)
            where = _cache_rows(k_cache, i, positions, block_table, cache_batch_idx)
            k_cache[where] = new_k[0]
            v_cache[where] = v[i]
        first = 0 if cache_leftpad is None else int(cache_leftpad[i])
        keys = torch.arange(first, max(lengths[i] + s_new, first), device=device)
        if keys.numel() == 0:
            continue
        where = _cache_rows(k_cache, i, keys, block_table, cache_batch_idx)
        slopes, _ = _sequence_options(i, 0, alibi_slopes, None)
        o, l = attention(
            q[i : i + 1], k_cache[where][None], v_cache[where][None], softmax_scale, causal, window_size,
            softcap, slopes, 0.0, None, upcast,
        )
        out[i], lse[i] = o[0], l[0]
    return out, lse


def varlen_cache_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    cu_seqlens_k: torch.Tensor,
    seqused_k: torch.Tensor | None = None,
    block_table: torch.Tensor | None = None,
    softmax_scale: float | None = None,
    causal: bool = False,
    window_size: tuple[int, int] = (-1, -1),
    softcap: float = 0.0,
    alibi_slopes: torch.Tensor | None = None,
    upcast: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Varlen forward over a KV cache. Sequence b's keys: seqused_k[b] of them
    (cu_seqlens_k[b + 1] - cu_seqlens_k[b] without it), from row cu_seqlens_k[b] of
    k/v (total_k, h_k, d), or from row 0 of its pages block_table[b] when k/v are pages
    (num_pages, page_size, h_k, d). Returns (out (total_q, h, d), lse (h, total_q))."""
    total_q, h, _ = q.shape
    out = torch.zeros_like(q)
    lse = torch.full((h, total_q), math.inf, dtype=_compute_dtype(q.dtype, upcast), device=q.device)
    cu_q, cu_k = cu_seqlens_q.tolist(), cu_seqlens_k.tolist()
    for i in range(len(cu_q) - 1):
        rq = slice(cu_q[i], cu_q[i + 1])
        n = int(seqused_k[i]) if seqused_k is not None else cu_k[i + 1] - cu_k[i]
        if rq.stop == rq.start or n <= 0:
            continue
        rows = torch.arange(n, device=q.device)
        if block_table is not None:
            where = _cache_rows(k, i, rows, block_table, None)
            ks, vs = k[where], v[where]
        else:
            ks, vs = k[cu_k[i] + rows], v[cu_k[i] + rows]
        slopes, _ = _sequence_options(i, 0, alibi_slopes, None)
        o, l = attention(
            q[None, rq], ks[None], vs[None], softmax_scale, causal, window_size, softcap, slopes, 0.0, None, upcast
        )
        out[rq] = o[0]
        lse[:, rq] = l[0]
    return out, lse
