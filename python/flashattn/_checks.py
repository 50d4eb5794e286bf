"""Argument checks shared by the public API, the CPU op kernels and the fake kernels.

Every check reads only metadata (shape, stride, dtype, device), never tensor data,
so the same functions serve fake tensors under torch.compile. Every error is a
``FlashAttnError`` (a ``RuntimeError``, like the errors of flash_attn and of the
compiled kernels) whose text says what is wrong and how to fix it.
"""

from __future__ import annotations

import math
import operator

import torch

from ._families import FAMILIES

MAX_HEAD_DIM = 256
HEAD_DIM_MULTIPLE = 8

_DIM_NAMES = ("batch", "seqlen", "heads", "head_dim")
_CUDA_DTYPES = (torch.float16, torch.bfloat16)
# The CPU path (the pure-PyTorch reference) also takes fp32/fp64, for gradcheck.
_CPU_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


class FlashAttnError(RuntimeError):
    """An input or environment flashattn cannot run; the message says how to fix it."""


def fail(msg: str) -> None:
    """Raise a FlashAttnError with the library's prefix."""
    raise FlashAttnError(f"flashattn: {msg}")


_fail = fail


def _shape(t: torch.Tensor) -> str:
    return str(tuple(t.shape))


def _check_tensor(name: str, t) -> None:
    if not isinstance(t, torch.Tensor):
        _fail(f"{name} must be a torch.Tensor, got {type(t).__name__}")


def _check_last_dim_contiguous(name: str, t: torch.Tensor) -> None:
    if t.stride(-1) != 1:
        _fail(
            f"{name}'s last dim is not contiguous (stride(-1) = {t.stride(-1)}) — call"
            f" {name}.contiguous() or pass a tensor whose last dim is contiguous"
        )


def _check_qkv_like(name: str, t: torch.Tensor, any_last_stride: bool = False) -> None:
    """Rank 4, no empty dim, last dim contiguous (unless ``any_last_stride``: the
    public functions copy such inputs)."""
    if not isinstance(t, torch.Tensor):
        _check_tensor(name, t)
    if t.dim() != 4:
        _fail(
            f"{name} must be 4-D (batch, seqlen, heads, head_dim), got shape {_shape(t)}"
            " — for packed inputs use flash_attn_qkvpacked_func / flash_attn_kvpacked_func"
        )
    shape = t.shape
    if not (shape[0] and shape[1] and shape[2] and shape[3]):
        dim = next(i for i, size in enumerate(shape) if size == 0)
        _fail(
            f"{name} has size 0 in dim {dim} ({_DIM_NAMES[dim]}), shape {_shape(t)};"
            " flashattn needs non-empty inputs — skip the call for empty batches"
        )
    if not any_last_stride:
        _check_last_dim_contiguous(name, t)


def _check_dtype(name: str, t: torch.Tensor) -> None:
    allowed = _CUDA_DTYPES if t.is_cuda else _CPU_DTYPES
    if t.dtype in allowed:
        return
    if t.device.type == "cuda" and t.dtype.is_floating_point:
        _fail(
            f"{name} has dtype {t.dtype}; the CUDA kernels take torch.float16"
            f" or torch.bfloat16 — cast with {name}.half() or {name}.bfloat16()"
        )
    names = ", ".join(str(d) for d in allowed)
    _fail(
        f"{name} has dtype {t.dtype}; on {t.device.type} flashattn takes {names}"
        f" — cast with {name}.float() or {name}.half()"
    )


def _check_same(name: str, t: torch.Tensor, ref_name: str, ref: torch.Tensor) -> None:
    """Same device and dtype as ``ref``."""
    if t.device != ref.device:
        _fail(
            f"{ref_name} is on {ref.device} but {name} is on {t.device}"
            " — put all inputs on one device"
        )
    if t.dtype != ref.dtype:
        _fail(
            f"{ref_name} has dtype {ref.dtype} but {name} has {t.dtype} — give all inputs one dtype"
        )


def _check_like(name: str, t, ref_name: str, ref: torch.Tensor) -> None:
    """A tensor with the shape, dtype and device of ``ref``, last dim contiguous."""
    _check_tensor(name, t)
    _check_same(name, t, ref_name, ref)
    if t.shape != ref.shape:
        _fail(f"{name} must have the shape of {ref_name} {_shape(ref)}, got {_shape(t)}")
    _check_last_dim_contiguous(name, t)


def check_fwd(
    q,
    k,
    v,
    *,
    out=None,
    alibi_slopes=None,
    rng_state=None,
    dropout_p: float = 0.0,
    window_left: int = -1,
    window_right: int = -1,
    softcap: float = 0.0,
    family: int = 0,
    public: bool = False,
) -> None:
    """Check forward inputs. ``public``: the public API's rules, which pad d to a
    multiple of 8 and copy inputs whose last dim is not contiguous."""
    if not _qkv_ok(q, k, v, public):
        _check_qkv(q, k, v, public)
    if out is not None:
        _check_like("out", out, "q", q)
    if alibi_slopes is not None:
        _check_alibi(alibi_slopes, q.shape[0], q.shape[2], q.device)
    if not public and (rng_state is not None or dropout_p):  # the public functions draw it themselves
        _check_rng_state(rng_state, q, dropout_p)
    _check_scalars(dropout_p, window_left, window_right, softcap)
    if family:
        _check_family(family, q)


def _qkv_ok(q, k, v, public: bool) -> bool:
    """The common case in one pass over the metadata (this runs on every call):
    True when q, k, v pass every check of ``_check_qkv``; False sends them there,
    which names the problem (or accepts a rarer valid input)."""
    if not (isinstance(q, torch.Tensor) and isinstance(k, torch.Tensor) and isinstance(v, torch.Tensor)):
        return False
    qs, ks = q.shape, k.shape
    if len(qs) != 4 or ks != v.shape or len(ks) != 4:
        return False
    b, s_q, h, d = qs
    dtype, device = q.dtype, q.device
    return bool(
        b
        and s_q
        and h
        and ks[1]
        and ks[2]
        and ks[0] == b
        and ks[3] == d
        and h % ks[2] == 0
        and 0 < d <= MAX_HEAD_DIM
        and (public or d % HEAD_DIM_MULTIPLE == 0)
        and (dtype in _CUDA_DTYPES if q.is_cuda else dtype in _CPU_DTYPES)
        and k.dtype == dtype
        and v.dtype == dtype
        and k.device == device
        and v.device == device
        and (public or (q.stride(-1) == 1 and k.stride(-1) == 1 and v.stride(-1) == 1))
    )


def _check_qkv(q, k, v, public: bool) -> None:
    """q, k, v in detail: raises naming the first problem."""
    _check_qkv_like("q", q, public)
    _check_dtype("q", q)
    _check_qkv_like("k", k, public)
    _check_qkv_like("v", v, public)
    device, dtype = q.device, q.dtype
    if k.device != device or k.dtype != dtype:
        _check_same("k", k, "q", q)
    if v.device != device or v.dtype != dtype:
        _check_same("v", v, "q", q)
    b, _, h, d = q.shape
    if k.shape != v.shape:
        _fail(
            f"k and v must have one shape, got k {_shape(k)} and v {_shape(v)} — both are"
            " (batch, seqlen_k, heads_k, head_dim)"
        )
    if k.shape[0] != b:
        _fail(f"q has batch {b} but k/v have batch {k.shape[0]} — pass one batch size")
    if k.shape[3] != d:
        _fail(
            f"q has head dim {d} but k/v have head dim {k.shape[3]} — q, k and v need one head dim"
        )
    h_k = k.shape[2]
    if h % h_k != 0:
        _fail(
            f"{h} query heads are not a multiple of {h_k} key/value heads (GQA needs h % h_k == 0)"
        )
    _check_head_dim(d, public)


def _check_head_dim(d: int, public: bool) -> None:
    if d > MAX_HEAD_DIM:
        _fail(
            f"head dim {d} is over the maximum of {MAX_HEAD_DIM}"
            " — split the heads or use another attention for such head dims"
        )
    if not public and d % HEAD_DIM_MULTIPLE != 0:
        _fail(
            f"head dim {d} is not a multiple of {HEAD_DIM_MULTIPLE} — pad q, k and v with"
            " zeros (the public functions do this for you)"
        )


def check_varlen(
    q,
    k,
    v,
    cu_seqlens_q,
    cu_seqlens_k,
    max_seqlen_q,
    max_seqlen_k,
    *,
    out=None,
    alibi_slopes=None,
    rng_state=None,
    dropout_p: float = 0.0,
    window_left: int = -1,
    window_right: int = -1,
    softcap: float = 0.0,
    family: int = 0,
    public: bool = False,
    paged: bool = False,
    seqused: bool = False,
) -> None:
    """Check varlen forward inputs: q (total_q, h, d), k/v (total_k, h_k, d), cu_seqlens
    int32 (b + 1,) on q's device. Metadata only: the offsets themselves are not read
    (on a GPU that would wait for it), only what the shapes allow — see docs/ops.md.
    ``paged``: k/v are pages (num_pages, page_size, h_k, d); ``seqused``: seqused_k
    gives the key counts (cu_seqlens_k only the first rows)."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        _check_tensor(name, t)
        if paged and name != "q":
            if t.dim() != 4:
                _fail(
                    f"with a block_table, {name} holds the KV cache's pages (num_pages, page_size, heads_k,"
                    f" head_dim), got shape {_shape(t)}"
                )
            _check_qkv_like(name, t)
            continue
        if t.dim() != 3:
            _fail(
                f"{name} must be 3-D (total_tokens, heads, head_dim), got shape {_shape(t)}"
                " — flash_attn_varlen_func takes the sequences packed along dim 0"
            )
        if t.shape[1] == 0 or t.shape[2] == 0:
            _fail(f"{name} has an empty heads or head_dim dim, shape {_shape(t)}")
        if not public:
            _check_last_dim_contiguous(name, t)
    _check_dtype("q", q)
    for name, t in (("k", k), ("v", v)):
        _check_same(name, t, "q", q)
    if k.shape != v.shape:
        _fail(f"k and v must have one shape, got k {_shape(k)} and v {_shape(v)}")
    _, h, d = q.shape
    if k.shape[-1] != d:
        _fail(f"q has head dim {d} but k/v have head dim {k.shape[-1]} — q, k and v need one head dim")
    if h % k.shape[-2] != 0:
        _fail(f"{h} query heads are not a multiple of {k.shape[-2]} key/value heads (GQA needs h % h_k == 0)")
    _check_head_dim(d, public)
    batch = None
    for name, cu in (("cu_seqlens_q", cu_seqlens_q), ("cu_seqlens_k", cu_seqlens_k)):
        _check_tensor(name, cu)
        if cu.dtype != torch.int32:
            _fail(
                f"{name} has dtype {cu.dtype}; it must be torch.int32 — e.g."
                " F.pad(seqlens.cumsum(0, dtype=torch.int32), (1, 0))"
            )
        if cu.device != q.device:
            _fail(f"q is on {q.device} but {name} is on {cu.device} — put all inputs on one device")
        if cu.dim() != 1 or cu.shape[0] < 2:
            _fail(f"{name} must be 1-D (batch + 1,) with batch >= 1, got shape {_shape(cu)}")
        if cu.stride(0) != 1:
            _fail(f"{name} must be contiguous — call {name}.contiguous()")
        if batch is not None and cu.shape[0] != batch + 1:
            _fail(
                f"cu_seqlens_q has {batch + 1} entries but cu_seqlens_k has {cu.shape[0]}"
                " — both are (batch + 1,)"
            )
        batch = cu.shape[0] - 1
    for name, m, total in (("max_seqlen_q", max_seqlen_q, q.shape[0]), ("max_seqlen_k", max_seqlen_k, k.shape[0])):
        if not is_int(m) or m < 0:
            _fail(f"{name} must be an int >= 0 (the longest sequence's length), got {m!r}")
        if name == "max_seqlen_k" and (paged or seqused):
            continue
        if total > batch * m:
            _fail(
                f"{name} = {m} is smaller than the longest sequence: {batch} sequences hold"
                f" {total} tokens — pass the longest sequence's length (e.g. int(seqlens.max()))"
            )
    if out is not None:
        _check_like("out", out, "q", q)
    if alibi_slopes is not None:
        _check_alibi(alibi_slopes, batch, h, q.device)
    if not public and (rng_state is not None or dropout_p):  # the public functions draw it themselves
        _check_rng_state(rng_state, q, dropout_p)
    _check_scalars(dropout_p, window_left, window_right, softcap)
    if family:
        _check_family(family, q)


def _check_per_sequence(name: str, t, q: torch.Tensor, batch: int) -> None:
    """An int32 (batch,) tensor on q's device."""
    _check_tensor(name, t)
    if t.dtype != torch.int32:
        _fail(f"{name} has dtype {t.dtype}; it must be torch.int32")
    if t.device != q.device:
        _fail(f"q is on {q.device} but {name} is on {t.device} — put all inputs on one device")
    if t.dim() != 1 or t.shape[0] != batch:
        _fail(f"{name} has shape {_shape(t)}; it must be ({batch},), one value per sequence")
    if t.stride(0) != 1:
        _fail(f"{name} must be contiguous — call {name}.contiguous()")


def _check_block_table(block_table, q: torch.Tensor, batch: int) -> None:
    _check_tensor("block_table", block_table)
    if block_table.dtype != torch.int32:
        _fail(f"block_table has dtype {block_table.dtype}; it must be torch.int32")
    if block_table.device != q.device:
        _fail(f"q is on {q.device} but block_table is on {block_table.device} — put all inputs on one device")
    if block_table.dim() != 2 or block_table.shape[0] != batch or block_table.shape[1] == 0:
        _fail(
            f"block_table has shape {_shape(block_table)}; it must be (batch, max_pages_per_sequence)"
            f" = ({batch}, >= 1)"
        )
    if block_table.stride(1) != 1:
        _fail("block_table must be contiguous in its last dim — call block_table.contiguous()")


def check_varlen_cache(q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_k, block_table, max_seqlen_q, max_seqlen_k,
                       alibi_slopes, family, public: bool = False) -> None:
    """A varlen forward over a KV cache: check_varlen's rules, k/v pages
    (num_pages, page_size, h_k, d) with a block_table (b, pages) int32, seqused_k (b,) int32."""
    paged = block_table is not None
    check_varlen(
        q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, alibi_slopes=alibi_slopes,
        family=family, public=public, paged=paged, seqused=seqused_k is not None,
    )
    batch = cu_seqlens_q.shape[0] - 1
    if seqused_k is not None:
        _check_per_sequence("seqused_k", seqused_k, q, batch)
    if paged:
        _check_block_table(block_table, q, batch)
        if k.shape != v.shape:
            _fail(f"k and v must have one shape, got k {_shape(k)} and v {_shape(v)}")


def check_kvcache(
    q, k_cache, v_cache, k, v, rotary_cos, rotary_sin, cache_seqlens, cache_seqlen, cache_batch_idx, cache_leftpad,
    block_table, alibi_slopes, softmax_scale, causal, window_left, window_right, softcap, rotary_interleaved,
    num_splits, family, public: bool = False,
) -> None:
    """flash_attn_with_kvcache's inputs (metadata only; the values of cache_seqlens
    are not read): q (b, s_q, h, d); caches (b_cache, s_cache, h_k, d), or pages
    (num_pages, page_size, h_k, d) with block_table (b, pages); new k/v (b, s_new,
    h_k, d); cache_seqlens (b,) int32 or cache_seqlen an int (-1: none)."""
    _check_qkv_like("q", q)
    _check_dtype("q", q)
    for name, t in (("k_cache", k_cache), ("v_cache", v_cache)):
        _check_qkv_like(name, t)
        _check_same(name, t, "q", q)
    if k_cache.shape != v_cache.shape:
        _fail(f"k_cache {_shape(k_cache)} and v_cache {_shape(v_cache)} must have the same shape")
    b, _, h, d = q.shape
    h_k = k_cache.shape[2]
    if k_cache.shape[3] != d:
        _fail(f"q has head dim {d} but the caches have {k_cache.shape[3]} — q and the caches need one head dim")
    if h % h_k != 0:
        _fail(f"{h} query heads are not a multiple of {h_k} key/value heads (GQA needs h % h_k == 0)")
    if d > MAX_HEAD_DIM:
        _check_head_dim(d, public)
    if d % HEAD_DIM_MULTIPLE != 0 and q.is_cuda:
        _fail(
            f"head dim {d} is not a multiple of {HEAD_DIM_MULTIPLE}: the kernels read whole 16-byte rows of the"
            " cache, which cannot be padded in place — allocate the cache (and q, k, v) with the head dim"
            f" padded to {d + (-d % HEAD_DIM_MULTIPLE)}"
        )
    paged = block_table is not None
    if paged:
        _check_block_table(block_table, q, b)
        if cache_leftpad is not None:
            _fail("cache_leftpad is not supported with a paged KV cache (block_table)")
        if cache_batch_idx is not None:
            _fail("cache_batch_idx is not supported with a paged KV cache (block_table): the block table names each"
                  " sequence's pages")
        capacity = k_cache.shape[1] * block_table.shape[1]
    else:
        capacity = k_cache.shape[1]
        if cache_batch_idx is None and k_cache.shape[0] < b:
            _fail(
                f"k_cache {_shape(k_cache)} holds {k_cache.shape[0]} sequences but q has {b}; give every"
                " sequence a cache row (or map them with cache_batch_idx)"
            )
    for name, t in (("cache_batch_idx", cache_batch_idx), ("cache_leftpad", cache_leftpad)):
        if t is not None:
            _check_per_sequence(name, t, q, b)
    if cache_seqlens is not None:
        _check_per_sequence("cache_seqlens", cache_seqlens, q, b)
    elif not is_int(cache_seqlen) or cache_seqlen < -1:
        _fail(f"cache_seqlens must be an int >= 0 or an int32 tensor ({b},), got {cache_seqlen!r}")
    if (k is None) != (v is None):
        _fail("pass both k and v (the new keys and values) or neither")
    s_new = 0
    if k is not None:
        for name, t in (("k", k), ("v", v)):
            _check_qkv_like(name, t)
            _check_same(name, t, "q", q)
            if tuple(t.shape) != (b, t.shape[1], h_k, d):
                _fail(f"{name} has shape {_shape(t)}; the new keys/values are (batch, seqlen_new, heads_k, head_dim)"
                      f" = ({b}, seqlen_new, {h_k}, {d})")
        if k.shape != v.shape:
            _fail(f"k {_shape(k)} and v {_shape(v)} must have the same shape")
        s_new = k.shape[1]
        if cache_seqlens is None and cache_seqlen < 0:
            _fail("appending k/v needs cache_seqlens (where each sequence's new keys go)")
        if s_new > capacity:
            _fail(f"{s_new} new keys do not fit a cache of {capacity} keys per sequence")
    if cache_seqlens is None and cache_seqlen >= 0 and cache_seqlen + s_new > capacity:
        _fail(f"the cache holds {capacity} keys per sequence; cache_seqlens = {cache_seqlen} plus {s_new} new keys"
              " do not fit")
    if (rotary_cos is None) != (rotary_sin is None):
        _fail("pass both rotary_cos and rotary_sin or neither")
    if rotary_cos is not None:
        if k is None:
            _fail("rotary_cos/rotary_sin rotate the new keys: pass k and v too (without new keys, rotate q yourself)")
        for name, t in (("rotary_cos", rotary_cos), ("rotary_sin", rotary_sin)):
            _check_tensor(name, t)
            _check_same(name, t, "q", q)
            if t.dim() != 2:
                _fail(f"{name} must be 2-D (seqlen_ro, rotary_dim / 2), got shape {_shape(t)}")
            if not t.is_contiguous():
                _fail(f"{name} must be contiguous — call {name}.contiguous()")
        if rotary_sin.shape != rotary_cos.shape:
            _fail(f"rotary_cos {_shape(rotary_cos)} and rotary_sin {_shape(rotary_sin)} must have the same shape")
        rotary_dim = 2 * rotary_cos.shape[1]
        if rotary_dim % 16 != 0 or rotary_dim > d:
            _fail(f"the rotary dim (2 * rotary_cos.shape[1] = {rotary_dim}) must be a multiple of 16 and at most"
                  f" the head dim {d}")
        if rotary_cos.shape[0] < capacity:
            _fail(f"rotary_cos/rotary_sin have {rotary_cos.shape[0]} positions but the cache holds {capacity};"
                  " pass one row per cache position")
        if (causal or window_left >= 0 or window_right >= 0) and cache_seqlens is None and cache_seqlen >= 0:
            check_rotary_positions(cache_seqlen, q.shape[1], rotary_cos.shape[0])
    if alibi_slopes is not None:
        _check_alibi(alibi_slopes, b, h, q.device)
    _check_scalars(0.0, window_left, window_right, softcap)
    if not is_int(num_splits) or num_splits < 0:
        _fail(f"num_splits must be an int >= 0 (0: automatic), got {num_splits!r}")
    if family:
        _check_family(family, q)


def check_rotary_positions(first: int, s_q: int, positions: int) -> None:
    """Under a causal or local mask q's row i is rotated at position first + i
    (cache_seqlens + i): rotary_cos/rotary_sin must hold those `positions`."""
    if first + s_q > positions:
        _fail(
            f"under a causal or local mask q's rows are rotated at cache_seqlens + row, up to {first + s_q - 1},"
            f" but rotary_cos/rotary_sin have {positions} positions — pass a row per position (or fewer query rows)"
        )


def check_varlen_bwd(
    dout,
    q,
    k,
    v,
    out,
    softmax_lse,
    cu_seqlens_q,
    cu_seqlens_k,
    max_seqlen_q,
    max_seqlen_k,
    *,
    dq=None,
    dk=None,
    dv=None,
    **options,
) -> None:
    """Varlen backward inputs: the forward's, plus dout/out, softmax_lse (h, total_q)."""
    check_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, out=out, **options)
    _check_like("dout", dout, "q", q)
    _check_tensor("softmax_lse", softmax_lse)
    total_q, h, _ = q.shape
    if softmax_lse.dtype != torch.float32 or softmax_lse.device != q.device:
        _fail(
            f"softmax_lse must be torch.float32 on {q.device}, got {softmax_lse.dtype} on"
            f" {softmax_lse.device} — pass the softmax_lse the forward returned"
        )
    if tuple(softmax_lse.shape) != (h, total_q):
        _fail(
            f"softmax_lse must have shape (heads, total_q) = ({h}, {total_q}), got"
            f" {_shape(softmax_lse)} — pass the softmax_lse the varlen forward returned"
        )
    for name, t, ref_name, ref in (("dq", dq, "q", q), ("dk", dk, "k", k), ("dv", dv, "v", v)):
        if t is not None:
            _check_like(name, t, ref_name, ref)


def check_packed(name: str, t, count: int, layout: str) -> None:
    """A packed input: rank 5 with ``count`` tensors stacked in dim 2."""
    _check_tensor(name, t)
    if t.dim() != 5 or t.shape[2] != count:
        _fail(f"{name} must be 5-D {layout}, got shape {_shape(t)}")


def check_packed_varlen(name: str, t, count: int, layout: str) -> None:
    """A packed varlen input: rank 4 with ``count`` tensors stacked in dim 1."""
    _check_tensor(name, t)
    if t.dim() != 4 or t.shape[1] != count:
        _fail(f"{name} must be 4-D {layout}, got shape {_shape(t)}")


def check_window_size(window_size) -> tuple:
    """(left, right) as ints. Any pair of integers is taken, as flash_attn takes it:
    a tuple or list, or a 2-element integer tensor (flash_attn's own tests draw
    windows with torch.randint(0, s_k, (2,)))."""
    kind = type(window_size)
    if (kind is tuple or kind is list) and len(window_size) == 2 and type(window_size[0]) is int \
            and type(window_size[1]) is int:
        return window_size if kind is tuple else tuple(window_size)
    try:
        left, right = window_size
    except (TypeError, ValueError):
        _fail(
            f"window_size must be a pair (left, right) of ints >= -1, got {window_size!r}"
            " — (-1, -1) turns local attention off"
        )
    return _as_index(left), _as_index(right)


def _as_index(w):
    """w as an int where it is an integer (an int, a 0-dim integer tensor, a numpy
    integer), else unchanged for _check_scalars to name."""
    if isinstance(w, bool) or (isinstance(w, torch.Tensor) and w.is_floating_point()):
        return w
    try:
        return operator.index(w)
    except TypeError:
        return w


def check_bwd(
    dout,
    q,
    k,
    v,
    out,
    softmax_lse,
    *,
    dq=None,
    dk=None,
    dv=None,
    alibi_slopes=None,
    rng_state=None,
    dropout_p: float = 0.0,
    window_left: int = -1,
    window_right: int = -1,
    softcap: float = 0.0,
    family: int = 0,
) -> None:
    """Check backward inputs: the forward's, plus dout/out/lse and optional dq/dk/dv."""
    check_fwd(
        q,
        k,
        v,
        out=out,
        alibi_slopes=alibi_slopes,
        rng_state=rng_state,
        dropout_p=dropout_p,
        window_left=window_left,
        window_right=window_right,
        softcap=softcap,
        family=family,
    )
    _check_like("dout", dout, "q", q)
    _check_tensor("softmax_lse", softmax_lse)
    b, s_q, h, _ = q.shape
    if softmax_lse.dtype != torch.float32:
        _fail(
            f"softmax_lse has dtype {softmax_lse.dtype}; it must be"
            " torch.float32 — pass the softmax_lse the forward returned"
        )
    if softmax_lse.device != q.device:
        _fail(
            f"q is on {q.device} but softmax_lse is on {softmax_lse.device}"
            " — put all inputs on one device"
        )
    if tuple(softmax_lse.shape) != (b, h, s_q):
        _fail(
            f"softmax_lse must have shape (batch, heads, seqlen_q) = ({b}, {h}, {s_q}),"
            f" got {_shape(softmax_lse)} — pass the softmax_lse the forward returned"
        )
    for name, t, ref_name, ref in (("dq", dq, "q", q), ("dk", dk, "k", k), ("dv", dv, "v", v)):
        if t is not None:
            _check_like(name, t, ref_name, ref)


def _check_alibi(alibi_slopes, b: int, h: int, device: torch.device) -> None:
    _check_tensor("alibi_slopes", alibi_slopes)
    if alibi_slopes.dtype != torch.float32:
        _fail(
            f"alibi_slopes has dtype {alibi_slopes.dtype}; it must be"
            " torch.float32 — cast with alibi_slopes.float()"
        )
    if tuple(alibi_slopes.shape) not in ((h,), (b, h)):
        _fail(
            f"alibi_slopes must have shape (heads,) = ({h},) or (batch, heads) = ({b}, {h}),"
            f" got {_shape(alibi_slopes)} — one slope per query head"
        )
    if alibi_slopes.device != device:
        _fail(
            f"q is on {device} but alibi_slopes is on {alibi_slopes.device}"
            " — put all inputs on one device"
        )
    _check_last_dim_contiguous("alibi_slopes", alibi_slopes)


def _check_rng_state(rng_state, q: torch.Tensor, dropout_p) -> None:
    if rng_state is None:
        if is_real(dropout_p) and dropout_p > 0:
            _fail(
                f"dropout_p = {dropout_p} needs rng_state, an int64 tensor [seed, offset]"
                " — pass one (flash_attn_func draws it for you)"
            )
        return
    _check_tensor("rng_state", rng_state)
    if rng_state.dtype != torch.int64 or tuple(rng_state.shape) != (2,):
        _fail(
            f"rng_state must be an int64 tensor of shape (2,) holding [seed, offset], got"
            f" {rng_state.dtype} of shape {_shape(rng_state)}"
        )
    if q.device.type == "cuda" and rng_state.device not in (q.device, torch.device("cpu")):
        _fail(
            f"rng_state is on {rng_state.device}; the CUDA kernels read it on q's device"
            f" ({q.device}) or the CPU — pass rng_state.to(q.device)"
        )


# Symbolic scalars appear when torch.compile traces the fake kernels.
def is_int(x) -> bool:
    return isinstance(x, (int, torch.SymInt)) and not isinstance(x, bool)


def is_real(x) -> bool:
    return isinstance(x, (int, float, torch.SymInt, torch.SymFloat)) and not isinstance(x, bool)


def _check_scalars(dropout_p, window_left, window_right, softcap) -> None:
    # The common case (floats and -1 ints) first: these run on every call.
    if (
        type(dropout_p) is float
        and type(softcap) is float
        and type(window_left) is int
        and type(window_right) is int
        and 0.0 <= dropout_p < 1.0
        and 0.0 <= softcap < math.inf
        and window_left >= -1
        and window_right >= -1
    ):
        return
    if not is_real(dropout_p) or not 0.0 <= dropout_p < 1.0:
        _fail(f"dropout_p must be a number in [0, 1), got {dropout_p!r} — 0.0 turns dropout off")
    for name, w in (("window_left", window_left), ("window_right", window_right)):
        if not is_int(w) or w < -1:
            _fail(
                f"{name} must be an int >= -1 (-1 means unbounded), got {w!r}"
                " — window_size=(-1, -1) turns local attention off"
            )
    if not is_real(softcap) or not 0.0 <= softcap < math.inf:
        _fail(f"softcap must be a finite number >= 0 (0 turns it off), got {softcap!r}")


def _check_family(family, q: torch.Tensor) -> None:
    if family == 0:
        return
    if not is_int(family) or family not in FAMILIES:
        _fail(f"family must be 0 (pick by device) or one of {FAMILIES}, got {family!r}")
    if q.device.type == "cpu":
        _fail(
            f"family={family} forces a CUDA kernel family, but the inputs are on the CPU"
            " — pass family=0"
        )


def aligned_for_kernels(t, broadcast_ok=True):
    """t, or a contiguous copy of it when the CUDA kernels' 16-byte vector accesses
    would be misaligned: a view starting or stepping by elements not a multiple of 8
    (the storage itself is aligned by torch's allocator), or whose last dim is not
    contiguous. broadcast_ok=False (q, k, v of the forward, dout of the backward) also
    copies a view that repeats elements along a dim (stride 0, size > 1: expand()):
    the sm90 kernels read them through TMA descriptors, which are not specified for
    zero strides."""
    strides = t.stride()
    if strides[-1] != 1:
        return t.contiguous()
    if not broadcast_ok and 0 in strides and any(st == 0 and n > 1 for n, st in zip(t.shape, strides)):
        return t.contiguous()
    misaligned = False
    if len(strides) == 4:
        rare = strides[0] % 8 or strides[1] % 8 or strides[2] % 8
    else:
        rare = any(stride % 8 for stride in strides[:-1])
    if rare:  # look at the dims that matter
        steps = (stride for size, stride in zip(t.shape[:-1], strides[:-1]) if size != 1)
        misaligned = any(stride % 8 for stride in steps)
    # Dynamo cannot trace storage_offset(); a compiled graph with an odd offset
    # gets the op's clear error instead of a copy.
    if not torch.compiler.is_compiling():
        misaligned = misaligned or t.storage_offset() % 8 != 0
    return t.clone(memory_format=torch.contiguous_format) if misaligned else t
