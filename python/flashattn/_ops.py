"""The ``torch.ops.flashattn`` ops: schemas, the compiled CUDA kernels, CPU and fake kernels.

The schemas are defined here (docs/ops.md is their contract) so that the ops, their
CPU kernels (the pure-PyTorch reference) and their fake kernels exist even where the
compiled extension is absent. The extension ``_C*.so``, loaded after the schemas,
registers the CUDA kernels for them.
"""

from __future__ import annotations

import glob
import os
from typing import NamedTuple

import torch

from . import reference
from ._checks import (
    aligned_for_kernels,
    check_bwd,
    check_fwd,
    check_kvcache,
    check_varlen,
    check_varlen_bwd,
    check_varlen_cache,
)

# Verbatim from docs/ops.md.
SCHEMAS = (
    (
        "fwd(Tensor q, Tensor k, Tensor v, Tensor? alibi_slopes, Tensor? rng_state, "
        "float dropout_p, float softmax_scale, bool causal, int window_left, "
        "int window_right, float softcap, int family) -> (Tensor out, Tensor softmax_lse)"
    ),
    (
        "fwd_out(Tensor q, Tensor k, Tensor v, Tensor(a!) out, Tensor? alibi_slopes, "
        "Tensor? rng_state, float dropout_p, float softmax_scale, bool causal, "
        "int window_left, int window_right, float softcap, int family) -> Tensor softmax_lse"
    ),
    (
        "bwd(Tensor dout, Tensor q, Tensor k, Tensor v, Tensor out, Tensor softmax_lse, "
        "Tensor? alibi_slopes, Tensor? rng_state, float dropout_p, float softmax_scale, "
        "bool causal, int window_left, int window_right, float softcap, "
        "bool deterministic, int family) -> (Tensor dq, Tensor dk, Tensor dv)"
    ),
    (
        "bwd_out(Tensor dout, Tensor q, Tensor k, Tensor v, Tensor out, Tensor softmax_lse, "
        "Tensor(a!) dq, Tensor(b!) dk, Tensor(c!) dv, Tensor? alibi_slopes, "
        "Tensor? rng_state, float dropout_p, float softmax_scale, bool causal, "
        "int window_left, int window_right, float softcap, bool deterministic, "
        "int family) -> ()"
    ),
    (
        "varlen_fwd(Tensor q, Tensor k, Tensor v, Tensor cu_seqlens_q, Tensor cu_seqlens_k, "
        "int max_seqlen_q, int max_seqlen_k, Tensor? alibi_slopes, Tensor? rng_state, "
        "float dropout_p, float softmax_scale, bool causal, int window_left, "
        "int window_right, float softcap, int family) -> (Tensor out, Tensor softmax_lse)"
    ),
    (
        "varlen_fwd_out(Tensor q, Tensor k, Tensor v, Tensor cu_seqlens_q, Tensor cu_seqlens_k, "
        "int max_seqlen_q, int max_seqlen_k, Tensor(a!) out, Tensor? alibi_slopes, "
        "Tensor? rng_state, float dropout_p, float softmax_scale, bool causal, "
        "int window_left, int window_right, float softcap, int family) -> Tensor softmax_lse"
    ),
    (
        "varlen_bwd(Tensor dout, Tensor q, Tensor k, Tensor v, Tensor out, Tensor softmax_lse, "
        "Tensor cu_seqlens_q, Tensor cu_seqlens_k, int max_seqlen_q, int max_seqlen_k, "
        "Tensor? alibi_slopes, Tensor? rng_state, float dropout_p, float softmax_scale, "
        "bool causal, int window_left, int window_right, float softcap, "
        "bool deterministic, int family) -> (Tensor dq, Tensor dk, Tensor dv)"
    ),
    (
        "varlen_bwd_out(Tensor dout, Tensor q, Tensor k, Tensor v, Tensor out, Tensor softmax_lse, "
        "Tensor cu_seqlens_q, Tensor cu_seqlens_k, int max_seqlen_q, int max_seqlen_k, "
        "Tensor(a!) dq, Tensor(b!) dk, Tensor(c!) dv, Tensor? alibi_slopes, "
        "Tensor? rng_state, float dropout_p, float softmax_scale, bool causal, "
        "int window_left, int window_right, float softcap, bool deterministic, "
        "int family) -> ()"
    ),
    (
        "varlen_fwd_cache(Tensor q, Tensor k, Tensor v, Tensor cu_seqlens_q, Tensor cu_seqlens_k, "
        "Tensor? seqused_k, Tensor? block_table, int max_seqlen_q, int max_seqlen_k, "
        "Tensor? alibi_slopes, float softmax_scale, bool causal, int window_left, "
        "int window_right, float softcap, int family) -> (Tensor out, Tensor softmax_lse)"
    ),
    (
        "fwd_kvcache(Tensor q, Tensor(a!) k_cache, Tensor(b!) v_cache, Tensor? k, Tensor? v, "
        "Tensor? rotary_cos, Tensor? rotary_sin, Tensor? cache_seqlens, int cache_seqlen, "
        "Tensor? cache_batch_idx, Tensor? cache_leftpad, Tensor? block_table, "
        "Tensor? alibi_slopes, float softmax_scale, bool causal, int window_left, "
        "int window_right, float softcap, bool rotary_interleaved, int num_splits, "
        "int family) -> (Tensor out, Tensor softmax_lse)"
    ),
)

# Kept alive for the life of the process: dropping it would unregister the schemas.
_lib = torch.library.Library("flashattn", "DEF")
for _schema in SCHEMAS:
    _lib.define(_schema)


def _load_extension(here: str | None = None) -> tuple[bool, str | None]:
    """Load ``_C*.so`` from ``here`` (beside this file). Never raises: the CPU path
    works without it. The error names the loader's own reason (a missing GLIBC_ or
    torch symbol version, a wrong ELF class), which torch's ``load_library`` keeps
    only as the cause of its "Could not load this library"."""
    here = here or os.path.dirname(os.path.abspath(__file__))
    paths = sorted(glob.glob(os.path.join(here, "_C*.so")))
    if not paths:
        return False, f"no compiled extension (_C*.so) in {here}; only the CPU path is available"
    try:
        torch.ops.load_library(paths[0])
    except Exception as e:  # noqa: BLE001 - any failure (missing symbol, wrong torch) is reported
        reason = e
        while reason.__cause__ is not None:
            reason = reason.__cause__
        why = f"{type(reason).__name__}: {reason}"
        if reason is not e:
            why = f"{type(e).__name__}: {e} — {why}"
        return False, f"loading {paths[0]} failed: {why}"
    return True, None


EXTENSION_LOADED, EXTENSION_ERROR = _load_extension()


class _Options(NamedTuple):
    """The arguments all four ops share, in schema order (after the tensors)."""

    alibi_slopes: torch.Tensor | None
    rng_state: torch.Tensor | None
    dropout_p: float
    softmax_scale: float
    causal: bool
    window_left: int
    window_right: int
    softcap: float

    @classmethod
    def split(cls, args) -> tuple[_Options, int]:
        """(options, family) from the args after the tensors; bwd's deterministic sits
        between them and does not matter on the CPU."""
        return cls(*args[: len(cls._fields)]), args[-1]

    def check_kwargs(self, family: int) -> dict:
        return {
            "alibi_slopes": self.alibi_slopes,
            "rng_state": self.rng_state,
            "dropout_p": self.dropout_p,
            "window_left": self.window_left,
            "window_right": self.window_right,
            "softcap": self.softcap,
            "family": family,
        }

    def reference_kwargs(self) -> dict:
        return {
            "softmax_scale": self.softmax_scale,
            "causal": self.causal,
            "window_size": (self.window_left, self.window_right),
            "softcap": self.softcap,
            "alibi_slopes": self.alibi_slopes,
            "dropout_p": self.dropout_p,
            "rng_state": self.rng_state,
        }


# ---- fake kernels: shapes only; outputs contiguous, as the CUDA kernels allocate them


def _new_lse(q: torch.Tensor) -> torch.Tensor:
    b, s_q, h, _ = q.shape
    return q.new_empty((b, h, s_q), dtype=torch.float32)


@torch.library.register_fake("flashattn::fwd")
def _fwd_fake(q, k, v, *args):
    opts, family = _Options.split(args)
    check_fwd(q, k, v, **opts.check_kwargs(family))
    return q.new_empty(q.shape), _new_lse(q)


@torch.library.register_fake("flashattn::fwd_out")
def _fwd_out_fake(q, k, v, out, *args):
    opts, family = _Options.split(args)
    check_fwd(q, k, v, out=out, **opts.check_kwargs(family))
    return _new_lse(q)


@torch.library.register_fake("flashattn::bwd")
def _bwd_fake(dout, q, k, v, out, softmax_lse, *args):
    opts, family = _Options.split(args)
    check_bwd(dout, q, k, v, out, softmax_lse, **opts.check_kwargs(family))
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape)


@torch.library.register_fake("flashattn::bwd_out")
def _bwd_out_fake(dout, q, k, v, out, softmax_lse, dq, dk, dv, *args):
    opts, family = _Options.split(args)
    check_bwd(dout, q, k, v, out, softmax_lse, dq=dq, dk=dk, dv=dv, **opts.check_kwargs(family))


def _new_varlen_lse(q: torch.Tensor) -> torch.Tensor:
    total_q, h, _ = q.shape
    return q.new_empty((h, total_q), dtype=torch.float32)


@torch.library.register_fake("flashattn::varlen_fwd")
def _varlen_fwd_fake(q, k, v, cu_q, cu_k, max_q, max_k, *args):
    opts, family = _Options.split(args)
    check_varlen(q, k, v, cu_q, cu_k, max_q, max_k, **opts.check_kwargs(family))
    return q.new_empty(q.shape), _new_varlen_lse(q)


@torch.library.register_fake("flashattn::varlen_fwd_out")
def _varlen_fwd_out_fake(q, k, v, cu_q, cu_k, max_q, max_k, out, *args):
    opts, family = _Options.split(args)
    check_varlen(q, k, v, cu_q, cu_k, max_q, max_k, out=out, **opts.check_kwargs(family))
    return _new_varlen_lse(q)


@torch.library.register_fake("flashattn::varlen_bwd")
def _varlen_bwd_fake(dout, q, k, v, out, lse, cu_q, cu_k, max_q, max_k, *args):
    opts, family = _Options.split(args)
    check_varlen_bwd(dout, q, k, v, out, lse, cu_q, cu_k, max_q, max_k, **opts.check_kwargs(family))
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape)


@torch.library.register_fake("flashattn::varlen_bwd_out")
def _varlen_bwd_out_fake(dout, q, k, v, out, lse, cu_q, cu_k, max_q, max_k, dq, dk, dv, *args):
    opts, family = _Options.split(args)
    check_varlen_bwd(
        dout, q, k, v, out, lse, cu_q, cu_k, max_q, max_k, dq=dq, dk=dk, dv=dv, **opts.check_kwargs(family)
    )


# ---- CPU kernels: the pure-PyTorch reference, in fp32 (fp64 for fp64 inputs)


def _reference_fwd(q, k, v, opts: _Options):
    out, lse = reference.attention(q, k, v, **opts.reference_kwargs())
    return out.contiguous(), lse.to(torch.float32).contiguous()


def _reference_bwd(dout, q, k, v, out, softmax_lse, opts: _Options):
    grads = reference.attention_bwd(dout, q, k, v, out, softmax_lse, **opts.reference_kwargs())
    return tuple(g.contiguous() for g in grads)


@torch.library.register_kernel("flashattn::fwd", "cpu")
def _fwd_cpu(q, k, v, *args):
    opts, family = _Options.split(args)
    check_fwd(q, k, v, **opts.check_kwargs(family))
    return _reference_fwd(q, k, v, opts)


@torch.library.register_kernel("flashattn::fwd_out", "cpu")
def _fwd_out_cpu(q, k, v, out, *args):
    opts, family = _Options.split(args)
    check_fwd(q, k, v, out=out, **opts.check_kwargs(family))
    result, lse = _reference_fwd(q, k, v, opts)
    out.copy_(result)
    return lse


@torch.library.register_kernel("flashattn::bwd", "cpu")
def _bwd_cpu(dout, q, k, v, out, softmax_lse, *args):
    opts, family = _Options.split(args)
    check_bwd(dout, q, k, v, out, softmax_lse, **opts.check_kwargs(family))
    return _reference_bwd(dout, q, k, v, out, softmax_lse, opts)


@torch.library.register_kernel("flashattn::bwd_out", "cpu")
def _bwd_out_cpu(dout, q, k, v, out, softmax_lse, dq, dk, dv, *args):
    opts, family = _Options.split(args)
    check_bwd(dout, q, k, v, out, softmax_lse, dq=dq, dk=dk, dv=dv, **opts.check_kwargs(family))
    for dst, src in zip((dq, dk, dv), _reference_bwd(dout, q, k, v, out, softmax_lse, opts)):
        dst.copy_(src)


def _reference_varlen_fwd(q, k, v, cu_q, cu_k, opts: _Options):
    out, lse = reference.varlen_attention(q, k, v, cu_q, cu_k, **opts.reference_kwargs())
    return out.contiguous(), lse.to(torch.float32).contiguous()


def _reference_varlen_bwd(dout, q, k, v, out, lse, cu_q, cu_k, opts: _Options):
    grads = reference.varlen_attention_bwd(dout, q, k, v, out, lse, cu_q, cu_k, **opts.reference_kwargs())
    return tuple(g.contiguous() for g in grads)


@torch.library.register_kernel("flashattn::varlen_fwd", "cpu")
def _varlen_fwd_cpu(q, k, v, cu_q, cu_k, max_q, max_k, *args):
    opts, family = _Options.split(args)
    check_varlen(q, k, v, cu_q, cu_k, max_q, max_k, **opts.check_kwargs(family))
    return _reference_varlen_fwd(q, k, v, cu_q, cu_k, opts)


@torch.library.register_kernel("flashattn::varlen_fwd_out", "cpu")
def _varlen_fwd_out_cpu(q, k, v, cu_q, cu_k, max_q, max_k, out, *args):
    opts, family = _Options.split(args)
    check_varlen(q, k, v, cu_q, cu_k, max_q, max_k, out=out, **opts.check_kwargs(family))
    result, lse = _reference_varlen_fwd(q, k, v, cu_q, cu_k, opts)
    out.copy_(result)
    return lse


@torch.library.register_kernel("flashattn::varlen_bwd", "cpu")
def _varlen_bwd_cpu(dout, q, k, v, out, lse, cu_q, cu_k, max_q, max_k, *args):
    opts, family = _Options.split(args)
    check_varlen_bwd(dout, q, k, v, out, lse, cu_q, cu_k, max_q, max_k, **opts.check_kwargs(family))
    return _reference_varlen_bwd(dout, q, k, v, out, lse, cu_q, cu_k, opts)


@torch.library.register_kernel("flashattn::varlen_bwd_out", "cpu")
def _varlen_bwd_out_cpu(dout, q, k, v, out, lse, cu_q, cu_k, max_q, max_k, dq, dk, dv, *args):
    opts, family = _Options.split(args)
    check_varlen_bwd(
        dout, q, k, v, out, lse, cu_q, cu_k, max_q, max_k, dq=dq, dk=dk, dv=dv, **opts.check_kwargs(family)
    )
    for dst, src in zip((dq, dk, dv), _reference_varlen_bwd(dout, q, k, v, out, lse, cu_q, cu_k, opts)):
        dst.copy_(src)


# ---- KV cache ops: forward only (no autograd kernel: gradients do not flow through them)


@torch.library.register_fake("flashattn::varlen_fwd_cache")
def _varlen_fwd_cache_fake(q, k, v, cu_q, cu_k, seqused_k, block_table, max_q, max_k, alibi_slopes, *args):
    *_, family = args
    check_varlen_cache(q, k, v, cu_q, cu_k, seqused_k, block_table, max_q, max_k, alibi_slopes, family)
    return q.new_empty(q.shape), _new_varlen_lse(q)


@torch.library.register_kernel("flashattn::varlen_fwd_cache", "cpu")
def _varlen_fwd_cache_cpu(q, k, v, cu_q, cu_k, seqused_k, block_table, max_q, max_k, alibi_slopes, *args):
    softmax_scale, causal, window_left, window_right, softcap, family = args
    check_varlen_cache(q, k, v, cu_q, cu_k, seqused_k, block_table, max_q, max_k, alibi_slopes, family)
    out, lse = reference.varlen_cache_attention(
        q, k, v, cu_q, cu_k, seqused_k, block_table, softmax_scale, causal, (window_left, window_right), softcap,
        alibi_slopes,
    )
    return out.contiguous(), lse.to(torch.float32).contiguous()


def _kvcache_seqlens(cache_seqlens, cache_seqlen):
    """The reference's cache_seqlens: the tensor, else the int (-1: the whole cache)."""
    if cache_seqlens is not None:
        return cache_seqlens
    return None if cache_seqlen < 0 else cache_seqlen


@torch.library.register_fake("flashattn::fwd_kvcache")
def _fwd_kvcache_fake(q, k_cache, v_cache, k, v, rotary_cos, rotary_sin, cache_seqlens, cache_seqlen, *args):
    check_kvcache(q, k_cache, v_cache, k, v, rotary_cos, rotary_sin, cache_seqlens, cache_seqlen, *args)
    b, s_q, h, _ = q.shape
    return q.new_empty(q.shape), q.new_empty((b, h, s_q), dtype=torch.float32)


@torch.library.register_kernel("flashattn::fwd_kvcache", "cpu")
def _fwd_kvcache_cpu(q, k_cache, v_cache, k, v, rotary_cos, rotary_sin, cache_seqlens, cache_seqlen, *args):
    check_kvcache(q, k_cache, v_cache, k, v, rotary_cos, rotary_sin, cache_seqlens, cache_seqlen, *args)
    (batch_idx, leftpad, block_table, alibi_slopes, softmax_scale, causal, window_left, window_right, softcap,
     rotary_interleaved, _num_splits, _family) = args
    out, lse = reference.kvcache_attention(
        q, k_cache, v_cache, k, v, rotary_cos, rotary_sin, _kvcache_seqlens(cache_seqlens, cache_seqlen),
        batch_idx, leftpad, block_table, softmax_scale, causal, (window_left, window_right), softcap,
        rotary_interleaved, alibi_slopes,
    )
    return out.contiguous(), lse.to(torch.float32).contiguous()


# ---- autograd


def attention_backward(dout, saved, args, deterministic: bool):
    """Gradients (dq, dk, dv) through ``flashattn.bwd``.

    saved: (q, k, v, out, softmax_lse, alibi_slopes, rng_state) from the forward;
    args: the forward's scalars (dropout_p, softmax_scale, causal, window_left,
    window_right, softcap, family). Shared by the op's autograd and the public API's.
    """
    # The kernels need a contiguous last dim and 16-byte aligned rows (sum()'s
    # gradient, for one, is an expanded tensor with stride 0).
    if dout.stride(-1) != 1:
        dout = dout.contiguous()
    q, k, v, out, lse, alibi_slopes, rng_state = saved
    if q.device.type == "cuda":
        dout = aligned_for_kernels(dout, broadcast_ok=False)
    *scalars, family = args
    return torch.ops.flashattn.bwd.default(
        dout, q, k, v, out, lse, alibi_slopes, rng_state, *scalars, deterministic, family
    )


def _fwd_setup_context(ctx, inputs, output):
    q, k, v, alibi_slopes, rng_state, *args = inputs
    out, lse = output
    ctx.save_for_backward(q, k, v, out, lse, alibi_slopes, rng_state)
    ctx.args = args
    ctx.mark_non_differentiable(lse)


def _fwd_backward(ctx, dout, _dlse):
    # The raw op has no deterministic flag; flash_attn_func passes its own (interface.py).
    dq, dk, dv = attention_backward(dout, ctx.saved_tensors, ctx.args, deterministic=False)
    return (dq, dk, dv) + (None,) * 9


torch.library.register_autograd("flashattn::fwd", _fwd_backward, setup_context=_fwd_setup_context)


def varlen_attention_backward(dout, saved, args, deterministic: bool):
    """Gradients (dq, dk, dv) through ``flashattn.varlen_bwd``.

    saved: (q, k, v, out, softmax_lse, cu_seqlens_q, cu_seqlens_k, alibi_slopes,
    rng_state); args: (max_seqlen_q, max_seqlen_k, dropout_p, softmax_scale, causal,
    window_left, window_right, softcap, family).
    """
    if dout.stride(-1) != 1:
        dout = dout.contiguous()
    q, k, v, out, lse, cu_q, cu_k, alibi_slopes, rng_state = saved
    if q.device.type == "cuda":
        dout = aligned_for_kernels(dout, broadcast_ok=False)
    max_q, max_k, *scalars, family = args
    return torch.ops.flashattn.varlen_bwd.default(
        dout, q, k, v, out, lse, cu_q, cu_k, max_q, max_k, alibi_slopes, rng_state, *scalars, deterministic, family
    )


def _varlen_fwd_setup_context(ctx, inputs, output):
    q, k, v, cu_q, cu_k, max_q, max_k, alibi_slopes, rng_state, *args = inputs
    out, lse = output
    ctx.save_for_backward(q, k, v, out, lse, cu_q, cu_k, alibi_slopes, rng_state)
    ctx.args = (max_q, max_k, *args)
    ctx.mark_non_differentiable(lse)


def _varlen_fwd_backward(ctx, dout, _dlse):
    dq, dk, dv = varlen_attention_backward(dout, ctx.saved_tensors, ctx.args, deterministic=False)
    return (dq, dk, dv) + (None,) * 13


torch.library.register_autograd(
    "flashattn::varlen_fwd", _varlen_fwd_backward, setup_context=_varlen_fwd_setup_context
)
