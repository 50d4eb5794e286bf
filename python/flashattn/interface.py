"""The public functions: drop-in replacements for those of the flash_attn 2.x package."""

from __future__ import annotations

import array
import functools
import math
import threading

import torch
import torch.nn.functional as F

from . import _dispatch, _families, _ops, reference
from ._checks import (
    HEAD_DIM_MULTIPLE,
    aligned_for_kernels,
    check_fwd,
    check_kvcache,
    check_packed,
    check_packed_varlen,
    check_rotary_positions,
    check_varlen,
    check_varlen_cache,
    check_window_size,
    fail,
    is_real,
)

__all__ = [
    "flash_attn_func",
    "flash_attn_kvpacked_func",
    "flash_attn_qkvpacked_func",
    "flash_attn_varlen_func",
    "flash_attn_varlen_kvpacked_func",
    "flash_attn_varlen_qkvpacked_func",
    "flash_attn_with_kvcache",
]


_fwd_op = torch.ops.flashattn.fwd.default
_varlen_fwd_op = torch.ops.flashattn.varlen_fwd.default
_varlen_fwd_cache_op = torch.ops.flashattn.varlen_fwd_cache.default
_fwd_kvcache_op = torch.ops.flashattn.fwd_kvcache.default
_below_autograd = torch._C._AutoDispatchBelowAutograd


def _eager() -> bool:
    """Plain eager autograd: not traced by torch.compile, no functorch transform, no
    forward-mode AD. Only there may the op skip its autograd kernel and the Function
    skip Function.apply's wrapper (each a few microseconds per call)."""
    return not (
        torch.compiler.is_compiling()
        or torch._C._are_functorch_transforms_active()
        or torch.autograd.forward_ad._current_level >= 0
    )


def _backward(ctx, dout, _dlse):
    if dout is None:  # the eager Functions do not materialise gradients (below)
        return (None,) * 13
    dq, dk, dv = _ops.attention_backward(dout, ctx.saved_tensors, ctx.args, ctx.deterministic)
    return (dq, dk, dv) + (None,) * 10


class _FlashAttnFunction(torch.autograd.Function):
    """``flashattn.fwd`` forward, ``flashattn.bwd`` backward, with ``deterministic``.

    Why not the autograd registered on the op (in _ops.py): the fwd schema of
    docs/ops.md has no ``deterministic`` argument, so the op's own backward cannot
    know it. Here it is a Python constant kept on ctx. Dynamo traces an
    autograd.Function, forward and backward, into the graph, so
    torch.compile(fullgraph=True) sees no break; inside ``forward`` grad mode is off,
    so the op's own autograd does not run as well. This form (``setup_context``) is
    the one torch.compile and functorch transforms take; plain eager calls use
    ``_FlashAttnFunctionEager``.
    """

    @staticmethod
    def forward(
        q,
        k,
        v,
        alibi_slopes,
        rng_state,
        dropout_p,
        softmax_scale,
        causal,
        window_left,
        window_right,
        softcap,
        deterministic,
        family,
    ):
        # Named parameters, not *args: Dynamo binds a variadic forward wrongly under no_grad.
        del deterministic  # used by the backward only (setup_context keeps it)
        return _fwd_op(
            q, k, v, alibi_slopes, rng_state, dropout_p, softmax_scale, causal,
            window_left, window_right, softcap, family,
        )

    @staticmethod
    def setup_context(ctx, inputs, output):
        q, k, v, alibi_slopes, rng_state, *scalars, deterministic, family = inputs
        out, lse = output
        ctx.save_for_backward(q, k, v, out, lse, alibi_slopes, rng_state)
        ctx.args = (*scalars, family)
        ctx.deterministic = deterministic
        ctx.mark_non_differentiable(lse)

    backward = staticmethod(_backward)


class _FlashAttnFunctionEager(torch.autograd.Function):
    """The same Function for plain eager calls: ``forward(ctx, ...)``, because with a
    separate ``setup_context`` every ``apply`` binds its 13 arguments through
    ``inspect.signature`` (tens of microseconds), and applied through the C entry point
    (``_apply_eager``), skipping Function.apply's Python wrapper."""

    @staticmethod
    def forward(ctx, q, k, v, alibi_slopes, rng_state, *scalars):
        # Never traced by Dynamo (plain eager only), so the scalars may be variadic:
        # (dropout_p, softmax_scale, causal, window_left, window_right, softcap,
        # deterministic, family), as _FlashAttnFunction.forward names them.
        *options, deterministic, family = scalars
        with _below_autograd():
            out, lse = _fwd_op(q, k, v, alibi_slopes, rng_state, *options, family)
        # lse has no gradient: do not let autograd allocate and zero one for it
        # (an allocation and a kernel launch per backward).
        ctx.set_materialize_grads(False)
        ctx.save_for_backward(q, k, v, out, lse, alibi_slopes, rng_state)
        ctx.args = (*options, family)
        ctx.deterministic = deterministic
        ctx.mark_non_differentiable(lse)
        return out, lse

    backward = staticmethod(_backward)


_apply_eager = torch._C._FunctionBase.__dict__["apply"].__get__(None, _FlashAttnFunctionEager)


def _attention(
    q,
    k,
    v,
    dropout_p,
    softmax_scale,
    causal,
    window_size,
    softcap,
    alibi_slopes,
    deterministic,
    return_attn_probs,
    family,
):
    window_left, window_right = check_window_size(window_size)
    check_fwd(
        q,
        k,
        v,
        alibi_slopes=alibi_slopes,
        dropout_p=dropout_p,
        window_left=window_left,
        window_right=window_right,
        softcap=softcap,
        public=True,
    )
    rng_state = _draw_rng_state(dropout_p, q)
    head_dim = q.shape[-1]
    if softmax_scale is None:
        softmax_scale = 1.0 / math.sqrt(head_dim)
    q, k, v, family, pad = _kernel_inputs(q, k, v, family)
    args = (
        q,
        k,
        v,
        alibi_slopes,
        rng_state,
        float(dropout_p),
        float(softmax_scale),
        bool(causal),
        window_left,
        window_right,
        float(softcap),
    )
    eager = _eager()
    if not eager:  # torch.compile, functorch, forward-mode AD (which raises: no jvp)
        out, lse = _FlashAttnFunction.apply(*args, bool(deterministic), family)
    elif torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad):
        out, lse = _apply_eager(*args, bool(deterministic), family)
    else:  # nothing to differentiate: the op below its autograd kernel (~8 us of Python)
        with _below_autograd():
            out, lse = _fwd_op(*args, family)
    if pad:
        out = out[..., :head_dim]
    if not return_attn_probs:
        return out
    probs = None
    if rng_state is not None:
        with torch.no_grad():
            probs = reference.dropout_attn_probs(
                q[..., :head_dim], k[..., :head_dim], softmax_scale, causal, (window_left, window_right), softcap,
                alibi_slopes, dropout_p, rng_state, _get_block_size_n(q.device, head_dim, True, causal),
                _dropout_units(family),
            )
    return out, lse, probs


def _kernel_inputs(q, k, v, family):
    """(q, k, v, family, pad): the family to run (0 on the CPU) and q, k, v as the
    kernels take them. Head dims that are not multiples of 8 are zero-padded (zeros
    add nothing to q.k and give output columns that are sliced off; autograd undoes
    both); misaligned views and a non-contiguous last dim are copied."""
    head_dim = q.shape[-1]
    pad = -head_dim % HEAD_DIM_MULTIPLE
    if q.is_cuda:
        family, head_dims = _dispatch.cuda_family_and_head_dims(q.device, q.dtype, family)
        if head_dims:
            _dispatch.head_dim_bucket(head_dim + pad, head_dims)
    else:
        if family is not None:
            _dispatch.parse_family(family)  # only validated: the CPU path has one implementation
        family = 0
    if pad:
        q, k, v = (F.pad(t, (0, pad)) for t in (q, k, v))
    elif family:
        q, k, v = (aligned_for_kernels(t, broadcast_ok=False) for t in (q, k, v))
    else:  # the CPU reference takes any strides but a non-contiguous last dim
        q, k, v = (t if t.stride(-1) == 1 else t.contiguous() for t in (q, k, v))
    return q, k, v, family, pad


def _draw_rng_state(dropout_p, q, cu_seqlens_q=None):
    """[seed, offset] for the op when dropout is on (else None), drawn from torch's
    generator of q's device, so torch.manual_seed reproduces it.

    A plain eager call on a GPU claims it on the host (``_claim_rng_state``): no
    kernel, the op passes seed + offset to the kernels as a parameter. Under
    torch.compile (which traces the draw), functorch transforms and CUDA graph
    capture (where a replay must draw anew), ``torch.randint`` draws it on the device
    and the kernels read it from device memory. The two draw different masks for
    the same seed; each is reproducible."""
    if not (dropout_p and is_real(dropout_p) and dropout_p > 0):
        return None
    device = q.device if isinstance(q, torch.Tensor) else None
    if device is not None and device.type == "cuda" and _eager() and not torch.cuda.is_current_stream_capturing():
        sequences = q.shape[0] if cu_seqlens_q is None else cu_seqlens_q.numel() - 1
        return _claim_rng_state(device, max(sequences, 1) * q.shape[-2])
    return torch.randint(0, 2**63 - 1, (2,), dtype=torch.int64, device=device)


_claim_lock = threading.Lock()


def _claim_rng_state(device: torch.device, counters: int) -> torch.Tensor:
    """[seed word, offset] on the CPU from the CUDA generator of ``device``, advancing
    its offset past the ``counters`` (sequences x heads) values of seed + offset the
    call's mask uses (kernel/dropout.h adds b * heads + h), as PyTorch's fused
    kernels claim theirs: the next call's masks never repeat this one's. The seed
    goes through a 64-bit mix (SplitMix64's) first, so that seeds s and s + 1 do not
    give shifted copies of one mask stream."""
    gen = torch.cuda.default_generators[device.index]
    with _claim_lock:
        offset = gen.get_offset()
        gen.set_offset(offset + -(-counters // 4) * 4)  # the generator takes multiples of 4
    return torch.frombuffer(array.array("q", (_seed_word(gen.initial_seed()), offset)), dtype=torch.int64)


@functools.lru_cache(maxsize=16)
def _seed_word(seed: int) -> int:
    """SplitMix64's output function of the seed, as a signed 64-bit int."""
    mask = (1 << 64) - 1
    z = (seed + 0x9E3779B97F4A7C15) & mask
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & mask
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & mask
    z ^= z >> 31
    return z - (1 << 64) if z >> 63 else z


def _get_block_size_n(device, head_dim, is_dropout, is_causal):
    """The key-block size of flash_attn 2.x's kernels, which its S_dmask encoding
    (return_attn_probs with dropout) depends on: flashattn's S_dmask uses the same
    blocks (reference.dropout_attn_probs), so flash_attn's tests decode it unchanged."""
    major, minor = torch.cuda.get_device_capability(device) if torch.device(device).type == "cuda" else (8, 0)
    if head_dim <= 32:
        return 128
    if head_dim <= 64:
        return 64 if is_dropout else 128
    if head_dim <= 96:
        return 64
    if head_dim <= 128:
        if major == 8 and minor > 0:
            return 64 if (not is_dropout and is_causal) else 32
        return 32 if is_dropout else 64
    return 64


def _dropout_units(family: int) -> reference.DropoutUnits:
    """The dropout mask's units of a kernel family (kernel/dropout.h); the CPU path
    (family 0) has the sm80 family's."""
    f = _families.get(family or 80)
    return reference.DropoutUnits(f.dropout_row_pairing, f.dropout_lane_units)


def flash_attn_func(
    q,
    k,
    v,
    dropout_p=0.0,
    softmax_scale=None,
    causal=False,
    window_size=(-1, -1),
    softcap=0.0,
    alibi_slopes=None,
    deterministic=False,
    return_attn_probs=False,
    *,
    family=None,
):
    """Exact attention, as ``flash_attn.flash_attn_func``.

    q (b, s_q, h, d), k/v (b, s_k, h_k, d) with h % h_k == 0, d <= 256; fp16/bf16 on
    CUDA (fp16/bf16/fp32/fp64 on CPU, through the pure-PyTorch reference).
    softmax_scale defaults to 1/sqrt(d). causal and window_size masks are aligned to
    the bottom-right; a query row that sees no key gives 0. softcap > 0 caps scores
    with softcap * tanh(s / softcap). alibi_slopes fp32 (h) or (b, h).
    deterministic asks for a deterministic backward. ``family`` (keyword only, not in
    flash_attn) forces a kernel family: "sm70", "sm75", "sm80", "sm90" (or 70/75/80/90); the
    environment variable FLASHATTN_FAMILY does the same.

    dropout_p > 0 drops attention probabilities (the CUDA kernels and the CPU path
    draw the same mask from torch's generator of q's device; docs/ops.md).

    Returns out (b, s_q, h, d), or with return_attn_probs (out, softmax_lse (b, h, s_q)
    fp32, S_dmask): S_dmask is None without dropout (the probabilities are never
    materialised), and with dropout flash_attn's testing encoding of the
    probabilities and the dropout pattern (negative = dropped; docs/ops.md).
    """
    return _attention(
        q,
        k,
        v,
        dropout_p,
        softmax_scale,
        causal,
        window_size,
        softcap,
        alibi_slopes,
        deterministic,
        return_attn_probs,
        family,
    )


def flash_attn_qkvpacked_func(
    qkv,
    dropout_p=0.0,
    softmax_scale=None,
    causal=False,
    window_size=(-1, -1),
    softcap=0.0,
    alibi_slopes=None,
    deterministic=False,
    return_attn_probs=False,
    *,
    family=None,
):
    """flash_attn_func on qkv (b, s, 3, h, d); q, k and v are views of it, not copies."""
    check_packed("qkv", qkv, 3, "(batch, seqlen, 3, heads, head_dim)")
    q, k, v = qkv.unbind(2)
    return _attention(
        q,
        k,
        v,
        dropout_p,
        softmax_scale,
        causal,
        window_size,
        softcap,
        alibi_slopes,
        deterministic,
        return_attn_probs,
        family,
    )


def flash_attn_kvpacked_func(
    q,
    kv,
    dropout_p=0.0,
    softmax_scale=None,
    causal=False,
    window_size=(-1, -1),
    softcap=0.0,
    alibi_slopes=None,
    deterministic=False,
    return_attn_probs=False,
    *,
    family=None,
):
    """flash_attn_func on q (b, s_q, h, d) and kv (b, s_k, 2, h_k, d) (views, no copies)."""
    check_packed("kv", kv, 2, "(batch, seqlen_k, 2, heads_k, head_dim)")
    k, v = kv.unbind(2)
    return _attention(
        q,
        k,
        v,
        dropout_p,
        softmax_scale,
        causal,
        window_size,
        softcap,
        alibi_slopes,
        deterministic,
        return_attn_probs,
        family,
    )


# ---- varlen: sequences packed along dim 0, delimited by cu_seqlens


def _varlen_backward(ctx, dout, _dlse):
    if dout is None:  # as _backward
        return (None,) * 17
    dq, dk, dv = _ops.varlen_attention_backward(dout, ctx.saved_tensors, ctx.args, ctx.deterministic)
    return (dq, dk, dv) + (None,) * 14


class _FlashAttnVarlenFunction(torch.autograd.Function):
    """``flashattn.varlen_fwd`` forward, ``flashattn.varlen_bwd`` backward, with
    ``deterministic`` (as _FlashAttnFunction, which says why)."""

    @staticmethod
    def forward(
        q,
        k,
        v,
        cu_seqlens_q,
        cu_seqlens_k,
        max_seqlen_q,
        max_seqlen_k,
        alibi_slopes,
        rng_state,
        dropout_p,
        softmax_scale,
        causal,
        window_left,
        window_right,
        softcap,
        deterministic,
        family,
    ):
        del deterministic  # used by the backward only (setup_context keeps it)
        return _varlen_fwd_op(
            q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, alibi_slopes, rng_state,
            dropout_p, softmax_scale, causal, window_left, window_right, softcap, family,
        )

    @staticmethod
    def setup_context(ctx, inputs, output):
        q, k, v, cu_q, cu_k, max_q, max_k, alibi_slopes, rng_state, *scalars, deterministic, family = inputs
        out, lse = output
        ctx.save_for_backward(q, k, v, out, lse, cu_q, cu_k, alibi_slopes, rng_state)
        ctx.args = (max_q, max_k, *scalars, family)
        ctx.deterministic = deterministic
        ctx.mark_non_differentiable(lse)

    backward = staticmethod(_varlen_backward)


class _FlashAttnVarlenFunctionEager(torch.autograd.Function):
    """The same Function for plain eager calls (as _FlashAttnFunctionEager)."""

    @staticmethod
    def forward(ctx, q, k, v, cu_q, cu_k, max_q, max_k, alibi_slopes, rng_state, *scalars):
        *options, deterministic, family = scalars
        with _below_autograd():
            out, lse = _varlen_fwd_op(q, k, v, cu_q, cu_k, max_q, max_k, alibi_slopes, rng_state, *options, family)
        ctx.set_materialize_grads(False)  # as _FlashAttnFunctionEager
        ctx.save_for_backward(q, k, v, out, lse, cu_q, cu_k, alibi_slopes, rng_state)
        ctx.args = (max_q, max_k, *options, family)
        ctx.deterministic = deterministic
        ctx.mark_non_differentiable(lse)
        return out, lse

    backward = staticmethod(_varlen_backward)


_apply_varlen_eager = torch._C._FunctionBase.__dict__["apply"].__get__(None, _FlashAttnVarlenFunctionEager)


def _as_int(x):
    """max_seqlen may come as a 0-dim tensor (transformers passes one); the op takes an int."""
    return int(x) if isinstance(x, torch.Tensor) else x


def _varlen_attention(
    q,
    k,
    v,
    cu_seqlens_q,
    cu_seqlens_k,
    max_seqlen_q,
    max_seqlen_k,
    dropout_p,
    softmax_scale,
    causal,
    window_size,
    softcap,
    alibi_slopes,
    deterministic,
    return_attn_probs,
    block_table,
    family,
    seqused_k=None,
):
    if block_table is not None or seqused_k is not None:
        return _varlen_cache_attention(
            q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p, softmax_scale, causal,
            window_size, softcap, alibi_slopes, return_attn_probs, block_table, seqused_k, family,
        )
    window_left, window_right = check_window_size(window_size)
    max_seqlen_q, max_seqlen_k = _as_int(max_seqlen_q), _as_int(max_seqlen_k)
    check_varlen(
        q,
        k,
        v,
        cu_seqlens_q,
        cu_seqlens_k,
        max_seqlen_q,
        max_seqlen_k,
        alibi_slopes=alibi_slopes,
        dropout_p=dropout_p,
        window_left=window_left,
        window_right=window_right,
        softcap=softcap,
        public=True,
    )
    rng_state = _draw_rng_state(dropout_p, q, cu_seqlens_q)
    head_dim = q.shape[-1]
    if softmax_scale is None:
        softmax_scale = 1.0 / math.sqrt(head_dim)
    q, k, v, family, pad = _kernel_inputs(q, k, v, family)
    args = (
        q,
        k,
        v,
        cu_seqlens_q,
        cu_seqlens_k,
        max_seqlen_q,
        max_seqlen_k,
        alibi_slopes,
        rng_state,
        float(dropout_p),
        float(softmax_scale),
        bool(causal),
        window_left,
        window_right,
        float(softcap),
    )
    if not _eager():
        out, lse = _FlashAttnVarlenFunction.apply(*args, bool(deterministic), family)
    elif torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad):
        out, lse = _apply_varlen_eager(*args, bool(deterministic), family)
    else:
        with _below_autograd():
            out, lse = _varlen_fwd_op(*args, family)
    if pad:
        out = out[..., :head_dim]
    if not return_attn_probs:
        return out
    probs = None
    if rng_state is not None:
        with torch.no_grad():
            probs = reference.varlen_dropout_attn_probs(
                q[..., :head_dim], k[..., :head_dim], cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                softmax_scale, causal, (window_left, window_right), softcap, alibi_slopes, dropout_p, rng_state,
                _get_block_size_n(q.device, head_dim, True, causal), _dropout_units(family),
            )
    return out, lse, probs


def _varlen_cache_attention(
    q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p, softmax_scale, causal, window_size,
    softcap, alibi_slopes, return_attn_probs, block_table, seqused_k, family,
):
    """flash_attn_varlen_func over a KV cache (block_table pages, seqused_k): forward only."""
    if dropout_p:
        fail("dropout_p must be 0 with block_table or seqused_k (a KV cache is read for inference, forward only)")
    needs_grad = [t for t in (q, k, v) if isinstance(t, torch.Tensor) and t.requires_grad]
    needs_grad = needs_grad if torch.is_grad_enabled() else []
    window_left, window_right = check_window_size(window_size)
    max_seqlen_q, max_seqlen_k = _as_int(max_seqlen_q), _as_int(max_seqlen_k)
    check_varlen_cache(
        q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_k, block_table, max_seqlen_q, max_seqlen_k, alibi_slopes,
        0, public=True,
    )
    head_dim = q.shape[-1]
    if softmax_scale is None:
        softmax_scale = 1.0 / math.sqrt(head_dim)
    q, k, v, family, pad = _kernel_inputs(q, k, v, family)
    out, lse = _varlen_fwd_cache_op(
        q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_k, block_table, max_seqlen_q, max_seqlen_k, alibi_slopes,
        float(softmax_scale), bool(causal), window_left, window_right, float(softcap), family,
    )
    if pad:
        out = out[..., :head_dim]
    if needs_grad:
        out = _ForwardOnly.apply(out, *needs_grad)
    return (out, lse, None) if return_attn_probs else out


class _ForwardOnly(torch.autograd.Function):
    """The output of a KV cache read with inputs that require grad: the forward
    runs (as flash_attn's does); a backward through it raises."""

    @staticmethod
    def forward(ctx, out, *inputs):
        return out.view_as(out)

    @staticmethod
    def backward(ctx, *grads):
        fail(
            "no backward through block_table / seqused_k: a KV cache is read forward only — detach the"
            " output, or pass k/v without block_table and seqused_k to train"
        )


def flash_attn_varlen_func(
    q,
    k,
    v,
    cu_seqlens_q,
    cu_seqlens_k,
    max_seqlen_q,
    max_seqlen_k,
    dropout_p=0.0,
    softmax_scale=None,
    causal=False,
    window_size=(-1, -1),
    softcap=0.0,
    alibi_slopes=None,
    deterministic=False,
    return_attn_probs=False,
    block_table=None,
    seqused_k=None,
    *,
    family=None,
):
    """Exact attention over a batch of sequences of different lengths, packed along
    dim 0, as ``flash_attn.flash_attn_varlen_func``.

    q (total_q, h, d), k/v (total_k, h_k, d); sequence i is rows
    [cu_seqlens_q[i], cu_seqlens_q[i + 1]) of q and [cu_seqlens_k[i], cu_seqlens_k[i + 1])
    of k/v (int32 (b + 1,) tensors on q's device, starting at 0); max_seqlen_q/k are
    the longest sequences' lengths (ints, or 0-dim tensors). Every option is that of
    ``flash_attn_func``, per sequence: causal and window masks align to each
    sequence's own bottom-right, alibi_slopes is (h) or (b, h). Sequences may be
    empty. The offsets are not read on the host (that would wait for the GPU):
    docs/ops.md says what is checked.

    A KV cache (forward only, as serving engines read one for paged prefill):
    ``block_table`` (b, max_pages) int32 makes k/v pages (num_pages, page_size, h_k, d),
    sequence i's keys being rows 0.. of its pages block_table[i]; ``seqused_k`` (b,)
    int32 gives each sequence's key count (from row cu_seqlens_k[i], or from its first
    page), instead of cu_seqlens_k's differences. Any page size works.

    Returns out (total_q, h, d), or with return_attn_probs (out, softmax_lse
    (h, total_q) fp32, S_dmask) — flash_attn 2.x's varlen lse layout; S_dmask as
    flash_attn_func's, (b, h, max_seqlen_q, max_seqlen_k) rounded up to 128.
    """
    return _varlen_attention(
        q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p,
        softmax_scale, causal, window_size, softcap, alibi_slopes, deterministic,
        return_attn_probs, block_table, family, seqused_k,
    )


def flash_attn_varlen_qkvpacked_func(
    qkv,
    cu_seqlens,
    max_seqlen,
    dropout_p=0.0,
    softmax_scale=None,
    causal=False,
    window_size=(-1, -1),
    softcap=0.0,
    alibi_slopes=None,
    deterministic=False,
    return_attn_probs=False,
    *,
    family=None,
):
    """flash_attn_varlen_func on qkv (total, 3, h, d) (views, no copies); one
    cu_seqlens and max_seqlen for queries and keys."""
    check_packed_varlen("qkv", qkv, 3, "(total, 3, heads, head_dim)")
    q, k, v = qkv.unbind(1)
    return _varlen_attention(
        q, k, v, cu_seqlens, cu_seqlens, max_seqlen, max_seqlen, dropout_p, softmax_scale,
        causal, window_size, softcap, alibi_slopes, deterministic, return_attn_probs, None, family,
    )


def flash_attn_varlen_kvpacked_func(
    q,
    kv,
    cu_seqlens_q,
    cu_seqlens_k,
    max_seqlen_q,
    max_seqlen_k,
    dropout_p=0.0,
    softmax_scale=None,
    causal=False,
    window_size=(-1, -1),
    softcap=0.0,
    alibi_slopes=None,
    deterministic=False,
    return_attn_probs=False,
    *,
    family=None,
):
    """flash_attn_varlen_func on q (total_q, h, d) and kv (total_k, 2, h_k, d) (views)."""
    check_packed_varlen("kv", kv, 2, "(total_k, 2, heads_k, head_dim)")
    k, v = kv.unbind(1)
    return _varlen_attention(
        q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p,
        softmax_scale, causal, window_size, softcap, alibi_slopes, deterministic,
        return_attn_probs, None, family,
    )


# ---- KV cache: inference, forward only


def flash_attn_with_kvcache(
    q,
    k_cache,
    v_cache,
    k=None,
    v=None,
    rotary_cos=None,
    rotary_sin=None,
    cache_seqlens=None,
    cache_batch_idx=None,
    cache_leftpad=None,
    block_table=None,
    softmax_scale=None,
    causal=False,
    window_size=(-1, -1),
    softcap=0.0,
    rotary_interleaved=True,
    alibi_slopes=None,
    num_splits=0,
    return_softmax_lse=False,
    *,
    family=None,
):
    """Attention over a KV cache, appending new keys/values first, as
    ``flash_attn.flash_attn_with_kvcache`` (forward only).

    q (b, s_q, h, d). k_cache/v_cache (b_cache, s_cache, h_k, d), or pages
    (num_pages, page_size, h_k, d) with block_table (b, max_pages) int32 (any page
    size). cache_seqlens: int or (b,) int32, the keys already cached per sequence
    (None: the whole cache). k/v (b, s_new, h_k, d), if given, are written into the
    caches **in place** at rows cache_seqlens[i].. and attended to. rotary_cos/sin
    (seqlen_ro, rotary_dim / 2) rotate the new k at its positions and q at
    cache_seqlens[i] (+ its row when causal or windowed); pairs (2j, 2j + 1) with
    rotary_interleaved, else (j, j + rotary_dim / 2). cache_batch_idx (b,) int32 maps
    sequence i to cache row cache_batch_idx[i]; cache_leftpad (b,) int32 hides each
    sequence's first keys. causal/window/softcap/alibi_slopes as flash_attn_func, with
    s_k = cache_seqlens[i] + s_new. num_splits: 0 chooses the split-KV count from the
    GPU and the work, n >= 1 forces it. On the GPU, a head dim that is not a
    multiple of 8 runs on zero-padded copies of q and the caches (the appended rows
    copied back): as flash_attn, correct but a copy of the caches per call.

    Returns out (b, s_q, h, d), or (out, softmax_lse (b, h, s_q) fp32) with
    return_softmax_lse.
    """
    window_left, window_right = check_window_size(window_size)
    cache_seqlen = -1
    if cache_seqlens is not None and not isinstance(cache_seqlens, torch.Tensor):
        cache_seqlen, cache_seqlens = int(cache_seqlens), None
    if softmax_scale is None:
        softmax_scale = 1.0 / math.sqrt(q.shape[-1])
    head_dim, caches = q.shape[-1], None
    if q.is_cuda:
        # The op checks everything itself, in C++: only what it cannot take is fixed here.
        family = _dispatch.cuda_family_and_head_dims(q.device, q.dtype, family)[0]
        if head_dim % HEAD_DIM_MULTIPLE and _same_head_dim(head_dim, k_cache, v_cache, k, v):
            # The kernels take head dims in multiples of 8. As flash_attn does, run
            # on zero-padded copies of q and the caches, and write the caches'
            # copies back where keys were appended: correct, but every call copies
            # the caches.
            if isinstance(rotary_cos, torch.Tensor) and rotary_cos.dim() == 2 and 2 * rotary_cos.shape[1] > head_dim:
                # the op would allow it against the padded head dim and rotate the zeros in
                fail(
                    f"rotary_cos/sin give rotary_dim = {2 * rotary_cos.shape[1]}, more than the head dim {head_dim}"
                    " — give them at most head_dim / 2 columns (rotary_dim a multiple of 16, <= the head dim)"
                )
            pad = -head_dim % HEAD_DIM_MULTIPLE
            caches = (k_cache, v_cache)
            q, k_cache, v_cache = (F.pad(t, (0, pad)) for t in (q, k_cache, v_cache))
            if k is not None:
                k, v = F.pad(k, (0, pad)), F.pad(v, (0, pad))
        q = aligned_for_kernels(q)
        if k is not None:
            k, v = aligned_for_kernels(k), aligned_for_kernels(v)
        if block_table is not None:
            _check_pages_hold_keys(k_cache, k, cache_seqlens, block_table)
    else:
        check_kvcache(
            q, k_cache, v_cache, k, v, rotary_cos, rotary_sin, cache_seqlens, cache_seqlen, cache_batch_idx,
            cache_leftpad, block_table, alibi_slopes, softmax_scale, causal, window_left, window_right, softcap,
            rotary_interleaved, num_splits, 0, public=True,
        )
        if family is not None:
            _dispatch.parse_family(family)
        family = 0
    if causal or window_left >= 0 or window_right >= 0:
        _check_rotary_covers_queries(q, k, rotary_cos, cache_seqlens)
    args = (
        q, k_cache, v_cache, k, v, rotary_cos, rotary_sin, cache_seqlens, cache_seqlen, cache_batch_idx,
        cache_leftpad, block_table, alibi_slopes, float(softmax_scale), bool(causal), window_left, window_right,
        float(softcap), bool(rotary_interleaved), int(num_splits), family,
    )
    if _eager():
        with _below_autograd():
            out, lse = _fwd_kvcache_op(*args)
    else:
        out, lse = _fwd_kvcache_op(*args)
    if caches is not None:
        out = out[..., :head_dim]
        if k is not None:
            caches[0].copy_(k_cache[..., :head_dim])
            caches[1].copy_(v_cache[..., :head_dim])
    return (out, lse) if return_softmax_lse else out


def _check_pages_hold_keys(k_cache, k, cache_seqlens, block_table):
    """That block_table addresses every sequence's keys (cached + appended): else the
    kernels would read block_table past its columns. It reads cache_seqlens back from
    the GPU (one sync per call with pages, as flash_attn 2.x does), so not while a
    CUDA graph is being captured or torch.compile traces (a data-dependent value
    would break the graph), where the caller's sizes are trusted."""
    if not (isinstance(cache_seqlens, torch.Tensor) and cache_seqlens.numel() and isinstance(block_table, torch.Tensor)
            and block_table.dim() == 2 and isinstance(k_cache, torch.Tensor) and k_cache.dim() == 4):
        return  # an int cache_seqlens is checked by the op; malformed inputs are named by it
    if torch.compiler.is_compiling() or torch.cuda.is_current_stream_capturing():
        return
    s_new = k.shape[1] if isinstance(k, torch.Tensor) and k.dim() == 4 else 0
    capacity = block_table.shape[1] * k_cache.shape[1]
    longest = int(cache_seqlens.max()) + s_new
    if longest > capacity:
        fail(
            f"max(cache_seqlens){' + s_new' if s_new else ''} = {longest} keys, but block_table addresses"
            f" {block_table.shape[1]} pages of {k_cache.shape[1]} = {capacity} per sequence — give block_table"
            " more columns (pages)"
        )


def _check_rotary_covers_queries(q, k, rotary_cos, cache_seqlens):
    """Under a causal or local mask q's row i is rotated at cache_seqlens[b] + i: that
    rotary_cos has those positions, for a tensor cache_seqlens (the ops check an int
    one). Where q has no more rows than the new keys, the cache's own check covers
    them; else cache_seqlens is read back (one sync, in that case only, and not while
    a CUDA graph is captured or torch.compile traces: the kernel then leaves rows
    past the tables unrotated)."""
    if not (isinstance(rotary_cos, torch.Tensor) and rotary_cos.dim() == 2 and isinstance(q, torch.Tensor)
            and q.dim() == 4 and isinstance(k, torch.Tensor) and k.dim() == 4
            and isinstance(cache_seqlens, torch.Tensor) and cache_seqlens.numel()):
        return  # no rotary, an int cache_seqlens, or inputs the op names
    s_q = q.shape[1]
    if s_q <= k.shape[1] or torch.compiler.is_compiling() or (
        cache_seqlens.is_cuda and torch.cuda.is_current_stream_capturing()
    ):
        return
    check_rotary_positions(int(cache_seqlens.max()), s_q, rotary_cos.shape[0])


def _same_head_dim(head_dim, *tensors):
    """Whether every given tensor (None: absent) has last dim head_dim: only then is
    padding them safe (else the op names the mismatch)."""
    return all(t is None or (isinstance(t, torch.Tensor) and t.dim() > 0 and t.shape[-1] == head_dim)
               for t in tensors)
