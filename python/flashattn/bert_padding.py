"""Padding helpers of flash_attn 2.x's ``flash_attn.bert_padding``, for the varlen functions.

A padded batch ``(batch, seqlen, ...)`` with a ``(batch, seqlen)`` mask of the real
tokens becomes the packed ``(tokens, ...)`` rows and ``cu_seqlens`` that
``flash_attn_varlen_func`` takes, and its output goes back the same way::

    from flashattn.bert_padding import pad_input, unpad_input

    q_packed, indices, cu_q, max_q, _ = unpad_input(q, mask)      # (tokens, h, d)
    k_packed, _, cu_k, max_k, _ = unpad_input(k, mask)
    v_packed, *_ = unpad_input(v, mask)
    out = flash_attn_varlen_func(q_packed, k_packed, v_packed, cu_q, cu_k, max_q, max_k)
    out = pad_input(out, indices, batch, seqlen)                  # (batch, seqlen, h, d), 0 at padding

Same names, arguments and results as flash_attn >= 2.7 (``unpad_input`` returns five
values; code written for the older four unpacks ``*_`` or the first four). The gathers
and scatters are differentiable (``index_select`` / ``index_copy``) and trace under
torch.compile; ``unpad_input`` reads the longest length back to the host (an int, as
flash_attn returns it).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

__all__ = [
    "index_first_axis",
    "index_put_first_axis",
    "pad_input",
    "unpad_input",
    "unpad_input_for_concatenated_sequences",
]


def index_first_axis(input: torch.Tensor, indices: torch.Tensor) -> torch.Tensor:
    """``input[indices]`` along the first dim: the rows at ``indices`` (int64, 1-D)."""
    if input.dim() < 2:
        raise ValueError(
            f"index_first_axis takes a tensor of at least 2 dims, got shape {tuple(input.shape)}"
        )
    return input.index_select(0, indices)


def index_put_first_axis(
    values: torch.Tensor, indices: torch.Tensor, first_axis_dim: int
) -> torch.Tensor:
    """A zero tensor of ``first_axis_dim`` rows (and ``values``' other dims) with
    ``values[i]`` in row ``indices[i]``: the inverse of ``index_first_axis``."""
    if values.dim() < 2:
        raise ValueError(
            f"index_put_first_axis takes values of at least 2 dims, got shape {tuple(values.shape)}"
        )
    out = values.new_zeros((first_axis_dim, *values.shape[1:]))
    return out.index_copy(0, indices, values)


def _cu_seqlens(lengths: torch.Tensor) -> torch.Tensor:
    return F.pad(lengths.cumsum(0, dtype=torch.int32), (1, 0))


def unpad_input(
    hidden_states: torch.Tensor,
    attention_mask: torch.Tensor,
    unused_mask: torch.Tensor | None = None,
):
    """Packs the real tokens of a padded batch.

    Arguments:
        hidden_states: ``(batch, seqlen, ...)``.
        attention_mask: ``(batch, seqlen)``, bool or int: nonzero marks a real token.
        unused_mask: optional ``(batch, seqlen)``: tokens that are kept in the packed
            rows (and counted in ``cu_seqlens``) but are not real, e.g. slots kept for
            a later append; ``seqused`` counts only the real ones.
    Returns:
        ``(hidden, indices, cu_seqlens, max_seqlen, seqused)``: hidden ``(tokens, ...)``
        in batch order, ``indices`` (int64) of those tokens in the flattened
        ``batch * seqlen`` rows, ``cu_seqlens`` (int32, ``batch + 1``), ``max_seqlen``
        (int), ``seqused`` (int32, ``batch``).
    """
    if attention_mask.dim() != 2 or tuple(attention_mask.shape) != tuple(hidden_states.shape[:2]):
        raise ValueError(
            f"attention_mask has shape {tuple(attention_mask.shape)}; it must be (batch, seqlen) = "
            f"{tuple(hidden_states.shape[:2])}, the first two dims of hidden_states"
        )
    kept = attention_mask.bool()
    if unused_mask is not None:
        kept = kept | unused_mask.bool()
    seqlens = kept.sum(dim=-1, dtype=torch.int32)
    seqused = attention_mask.bool().sum(dim=-1, dtype=torch.int32)
    indices = kept.flatten().nonzero().flatten()
    max_seqlen = int(seqlens.max()) if seqlens.numel() else 0
    rows = hidden_states.reshape(-1, *hidden_states.shape[2:])
    return index_first_axis(rows, indices), indices, _cu_seqlens(seqlens), max_seqlen, seqused


def unpad_input_for_concatenated_sequences(
    hidden_states: torch.Tensor, attention_mask_in_length: torch.Tensor
):
    """Packs rows that each hold several sequences one after another.

    ``attention_mask_in_length`` ``(batch, seqlen)`` lists, per row, the lengths of the
    sequences concatenated at its start, then zeros: ``[[2, 3, 0, 0, 0, 0], [3, 2, 0,
    0, 0, 0]]`` is a row holding a sequence of 2 tokens then one of 3 (and a padding
    token), and a row of 3 then 2. Returns ``(hidden, indices, cu_seqlens,
    max_seqlen)``, with one ``cu_seqlens`` entry per sequence.
    """
    lengths = attention_mask_in_length
    if lengths.dim() != 2 or tuple(lengths.shape) != tuple(hidden_states.shape[:2]):
        raise ValueError(
            f"attention_mask_in_length has shape {tuple(lengths.shape)}; it must be (batch, seqlen) = "
            f"{tuple(hidden_states.shape[:2])}, the first two dims of hidden_states"
        )
    seqlen = lengths.shape[1]
    used = lengths.sum(dim=-1)
    kept = torch.arange(seqlen, device=lengths.device) < used.unsqueeze(1)
    flat = lengths.flatten()
    seqlens = flat[flat.nonzero().flatten()].to(torch.int32)
    indices = kept.flatten().nonzero().flatten()
    max_seqlen = int(seqlens.max()) if seqlens.numel() else 0
    rows = hidden_states.reshape(-1, *hidden_states.shape[2:])
    return index_first_axis(rows, indices), indices, _cu_seqlens(seqlens), max_seqlen


def pad_input(
    hidden_states: torch.Tensor, indices: torch.Tensor, batch: int, seqlen: int
) -> torch.Tensor:
    """The inverse of ``unpad_input``: packed ``(tokens, ...)`` rows back to
    ``(batch, seqlen, ...)``, zeros where there was no token."""
    out = index_put_first_axis(hidden_states, indices, batch * seqlen)
    return out.reshape(batch, seqlen, *hidden_states.shape[1:])
