"""flashattn as an attention implementation of HuggingFace transformers.

    import flashattn.integrations.transformers as flashattn_hf
    name = flashattn_hf.register()          # "fattn"
    model = AutoModelForCausalLM.from_config(config, attn_implementation=name)

``register`` adds :func:`attention_forward` to transformers' ``AttentionInterface``
and, under the same name, transformers' flash-attention mask function to its
``AttentionMaskInterface``, so that the model hands over a 2-D padding mask (or
None when nothing is padded) instead of building a 4-D one. What the function does
with what transformers passes:

- a padding mask: unpad q/k/v, run :func:`flashattn.flash_attn_varlen_func`, pad
  the output back (left or right padding; with a cache, the queries are the last
  positions of each row, aligned to the bottom-right of their keys);
- packed sequences (padding-free training): ``cu_seq_lens_q/k`` and
  ``max_length_q/k`` keyword arguments (e.g. from ``DataCollatorWithFlattening``),
  or a single row of ``position_ids`` that restarts at each sequence;
- otherwise :func:`flashattn.flash_attn_func` on the batch as it is.
Causal or not per module (``is_causal``), GQA, sliding windows
(``sliding_window``), softcap; fp32 q/k/v (e.g. under autocast) are cast to the
autocast dtype, else to the dtype of the module's linear layers.

The name has no "flash" in it on purpose: transformers treats such names as a
request for the flash_attn package or a Hub kernel, and would try to load one.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..bert_padding import _cu_seqlens
from ..interface import flash_attn_func, flash_attn_varlen_func

__all__ = ["NAME", "attention_forward", "register"]

NAME = "fattn"


def _target_dtype(query: torch.Tensor, module: torch.nn.Module) -> torch.dtype | None:
    """The half dtype to cast fp32 inputs to, or None when they are half already."""
    if query.dtype not in (torch.float32, torch.float64):
        return None
    device_type = query.device.type
    if torch.is_autocast_enabled(device_type):
        return torch.get_autocast_dtype(device_type)
    if query.device.type == "cpu":
        return None  # the CPU path computes in fp32 itself
    for layer in module.modules():
        if isinstance(layer, torch.nn.Linear) and layer.weight.dtype in (torch.float16, torch.bfloat16):
            return layer.weight.dtype
    return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16


def _unpad(t: torch.Tensor, indices: torch.Tensor) -> torch.Tensor:
    """(b, s, h, d) -> (tokens, h, d): the rows at ``indices`` of the flattened batch."""
    return t.reshape(-1, *t.shape[2:])[indices]


def _varlen_from_mask(q, k, v, mask):
    """Unpad by a (b, s_k) bool mask of the key positions. Queries: the same rows when
    s_q == s_k, else the last s_q positions of each row (decode and chunked prefill
    with a cache, left padding)."""
    b, s_q = q.shape[:2]
    seqlens_k = mask.sum(-1, dtype=torch.int32)
    indices_k = mask.flatten().nonzero().flatten()
    max_k = int(seqlens_k.max())
    cu_k = _cu_seqlens(seqlens_k)
    if s_q == mask.shape[1]:
        indices_q, cu_q, max_q = indices_k, cu_k, max_k
    elif s_q == 1:
        indices_q = torch.arange(b, device=q.device)
        cu_q = torch.arange(b + 1, dtype=torch.int32, device=q.device)
        max_q = 1
    else:
        mask_q = mask[:, -s_q:]
        seqlens_q = mask_q.sum(-1, dtype=torch.int32)
        indices_q = mask_q.flatten().nonzero().flatten()
        cu_q, max_q = _cu_seqlens(seqlens_q), int(seqlens_q.max())
    return (_unpad(q, indices_q), _unpad(k, indices_k), _unpad(v, indices_k), cu_q, cu_k, max_q, max_k), indices_q


def _cu_from_position_ids(position_ids: torch.Tensor):
    """(cu_seqlens, max_seqlen) of sequences packed in one row: each starts where the
    position id is the row's minimum."""
    position_ids = position_ids.flatten()
    starts = (position_ids == position_ids.min()).nonzero().flatten().to(torch.int32)
    cu = torch.cat([starts, torch.tensor([position_ids.numel()], dtype=torch.int32, device=starts.device)])
    return cu, int(cu.diff().max())


def _is_packed(position_ids, batch: int) -> bool:
    if position_ids is None or batch != 1 or position_ids.shape[-1] == 1:
        return False
    expected = torch.arange(position_ids.shape[-1], device=position_ids.device) + position_ids.min()
    return bool((expected != position_ids.flatten()).any())


def attention_forward(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    sliding_window: int | None = None,
    softcap: float | None = None,
    is_causal: bool | None = None,
    **kwargs,
) -> tuple[torch.Tensor, None]:
    """transformers' attention-function contract: query (b, h, s_q, d), key/value
    (b, h_k, s_k, d) -> (output (b, s_q, h, d), None)."""
    b, _, s_q, head_dim = query.shape
    q, k, v = (t.transpose(1, 2) for t in (query, key, value))  # (b, s, h, d)
    v_head_dim = v.shape[-1]
    if v_head_dim != head_dim:  # e.g. MLA: v gets q's head dim, the output is cropped
        v = F.pad(v, (0, head_dim - v_head_dim))
    target = _target_dtype(q, module)
    if target is not None:
        q, k, v = q.to(target), k.to(target), v.to(target)
    causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
    window = (-1, -1)
    if sliding_window is not None and k.shape[1] > sliding_window:
        window = (sliding_window - 1, sliding_window - 1)
    options = {
        "dropout_p": dropout,
        "softmax_scale": scaling,
        "causal": causal,
        "window_size": window,
        "softcap": softcap or 0.0,
        "deterministic": bool(kwargs.get("deterministic", False)),
    }
    position_ids = kwargs.get("position_ids")
    if attention_mask is not None and attention_mask.dim() == 2:
        args, indices_q = _varlen_from_mask(q, k, v, attention_mask.bool())
        out_unpadded = flash_attn_varlen_func(*args, **options)
        out = out_unpadded.new_zeros(b * s_q, *out_unpadded.shape[1:])
        out = out.index_put((indices_q,), out_unpadded).view(b, s_q, *out_unpadded.shape[1:])
    elif attention_mask is not None:
        raise ValueError(
            f"flashattn takes a 2-D padding mask or None, got a mask of shape {tuple(attention_mask.shape)};"
            " load the model through flashattn.integrations.transformers.register(), which also registers"
            " the matching mask function"
        )
    elif kwargs.get("cu_seq_lens_q") is not None:
        cu_q, cu_k = kwargs["cu_seq_lens_q"].to(torch.int32), kwargs["cu_seq_lens_k"].to(torch.int32)
        flat = (t.reshape(-1, *t.shape[2:]) for t in (q, k, v))
        out = flash_attn_varlen_func(*flat, cu_q, cu_k, kwargs["max_length_q"], kwargs["max_length_k"], **options)
        out = out.view(b, s_q, *out.shape[1:])
    elif _is_packed(position_ids, b):
        cu, max_s = _cu_from_position_ids(position_ids)
        flat = (t.reshape(-1, *t.shape[2:]) for t in (q, k, v))
        out = flash_attn_varlen_func(*flat, cu, cu, max_s, max_s, **options).view(b, s_q, -1, head_dim)
    else:
        out = flash_attn_func(q, k, v, **options)
    if v_head_dim != head_dim:
        out = out[..., :v_head_dim]
    return out, None


def register(name: str = NAME) -> str:
    """Register flashattn with transformers under ``name`` (attention and mask
    function); returns the name to pass as ``attn_implementation``."""
    if "flash" in name:
        raise ValueError(
            f"the name {name!r} contains 'flash': transformers would look for the flash_attn package or a Hub"
            " kernel under it; pick another (the default is 'fattn')"
        )
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, flash_attention_mask

    AttentionInterface.register(name, attention_forward)
    AttentionMaskInterface.register(name, flash_attention_mask)
    return name
