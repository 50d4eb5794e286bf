"""The KV cache API on the CPU: flash_attn_with_kvcache's semantics in the reference
(append in place, rotary positions, paged = contiguous, leftpad, batch index), the
public function and the ops (opcheck, torch.compile), and clear errors."""

import math

import flashattn
import pytest
import torch
from flashattn import reference

OPS = torch.ops.flashattn


def _randn(*shape, seed=0, dtype=torch.float64):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=dtype)


def _rotary(seqlen, rotary_dim):
    angles = torch.arange(seqlen, dtype=torch.float64)[:, None] * 10000.0 ** (
        -torch.arange(0, rotary_dim, 2, dtype=torch.float64) / rotary_dim
    )
    return angles.cos(), angles.sin()


def test_append_then_attend_equals_attention_over_the_concatenation():
    b, s_q, h, h_k, d, s_cache = 2, 3, 4, 2, 16, 20
    q = _randn(b, s_q, h, d, seed=1)
    k_cache, v_cache = _randn(b, s_cache, h_k, d, seed=2), _randn(b, s_cache, h_k, d, seed=3)
    k, v = _randn(b, s_q, h_k, d, seed=4), _randn(b, s_q, h_k, d, seed=5)
    lengths = [4, 11]
    k_before, v_before = k_cache.clone(), v_cache.clone()
    out, lse = reference.kvcache_attention(q, k_cache, v_cache, k, v, cache_seqlens=torch.tensor(lengths,
                                           dtype=torch.int32), causal=True)
    for i, n in enumerate(lengths):
        keys = torch.cat((k_before[i, :n], k[i]))[None]
        values = torch.cat((v_before[i, :n], v[i]))[None]
        o, l = reference.attention(q[i : i + 1], keys, values, causal=True)
        torch.testing.assert_close(out[i : i + 1], o)
        torch.testing.assert_close(lse[i : i + 1], l)
        # Appended in place; every other row untouched.
        assert torch.equal(k_cache[i, n : n + s_q], k[i]) and torch.equal(v_cache[i, n : n + s_q], v[i])
        assert torch.equal(k_cache[i, :n], k_before[i, :n]) and torch.equal(k_cache[i, n + s_q :], k_before[i, n + s_q :])


def test_paged_equals_contiguous():
    b, h, h_k, d, page, pages = 3, 4, 4, 16, 4, 5
    q = _randn(b, 2, h, d, seed=1)
    k_cont, v_cont = _randn(b, page * pages, h_k, d, seed=2), _randn(b, page * pages, h_k, d, seed=3)
    table = torch.randperm(b * pages, generator=torch.Generator().manual_seed(0)).view(b, pages).to(torch.int32)
    k_paged = torch.empty(b * pages, page, h_k, d, dtype=torch.float64)
    v_paged = torch.empty_like(k_paged)
    for i in range(b):
        k_paged[table[i].long()] = k_cont[i].view(pages, page, h_k, d)
        v_paged[table[i].long()] = v_cont[i].view(pages, page, h_k, d)
    k, v = _randn(b, 2, h_k, d, seed=4), _randn(b, 2, h_k, d, seed=5)
    seqlens = torch.tensor([0, 7, 18], dtype=torch.int32)
    cont = reference.kvcache_attention(q, k_cont, v_cont, k, v, cache_seqlens=seqlens, causal=True)
    paged = reference.kvcache_attention(q, k_paged, v_paged, k, v, cache_seqlens=seqlens, block_table=table,
                                        causal=True)
    torch.testing.assert_close(cont, paged)
    for i in range(b):
        torch.testing.assert_close(k_paged[table[i].long()].reshape(-1, h_k, d), k_cont[i])


def test_rotary_positions():
    # New key j sits at position cache_seqlens + j; q at cache_seqlens (+ i when causal).
    b, s_q, h, d, s_cache, rd = 1, 3, 2, 32, 12, 16
    q, k, v = _randn(b, s_q, h, d, seed=1), _randn(b, s_q, h, d, seed=2), _randn(b, s_q, h, d, seed=3)
    k_cache, v_cache = torch.zeros(b, s_cache, h, d, dtype=torch.float64), torch.zeros(b, s_cache, h, d,
                                                                                         dtype=torch.float64)
    cos, sin = _rotary(s_cache, rd)
    for causal in (False, True):
        kc, vc = k_cache.clone(), v_cache.clone()
        out, _ = reference.kvcache_attention(q, kc, vc, k, v, cos, sin, cache_seqlens=5, causal=causal,
                                             rotary_interleaved=False)
        positions = torch.arange(5, 8)[None]
        k_rot = reference.apply_rotary(k, cos, sin, positions, False)
        assert torch.equal(kc[:, 5:8], k_rot)
        q_pos = positions if causal else torch.full_like(positions, 5)
        q_rot = reference.apply_rotary(q, cos, sin, q_pos, False)
        expect, _ = reference.attention(q_rot, kc[:, :8], vc[:, :8], causal=causal)
        torch.testing.assert_close(out, expect)


def test_leftpad_and_batch_idx():
    b, h, d = 2, 2, 16
    q = _randn(b, 1, h, d, seed=1)
    k_cache, v_cache = _randn(4, 10, h, d, seed=2), _randn(4, 10, h, d, seed=3)
    idx = torch.tensor([3, 1], dtype=torch.int32)
    pad = torch.tensor([2, 0], dtype=torch.int32)
    seqlens = torch.tensor([6, 9], dtype=torch.int32)
    out, _ = reference.kvcache_attention(q, k_cache.clone(), v_cache.clone(), cache_seqlens=seqlens,
                                         cache_batch_idx=idx, cache_leftpad=pad)
    for i in range(b):
        rows = slice(int(pad[i]), int(seqlens[i]))
        o, _ = reference.attention(q[i : i + 1], k_cache[int(idx[i]), rows][None], v_cache[int(idx[i]), rows][None])
        torch.testing.assert_close(out[i : i + 1], o)


def test_public_function_on_cpu_mutates_the_caches():
    b, h, h_k, d = 2, 4, 2, 20  # any head dim on the CPU
    q = _randn(b, 1, h, d, seed=1, dtype=torch.float32)
    k_cache, v_cache = _randn(b, 8, h_k, d, seed=2, dtype=torch.float32), _randn(b, 8, h_k, d, seed=3,
                                                                                   dtype=torch.float32)
    k, v = _randn(b, 1, h_k, d, seed=4, dtype=torch.float32), _randn(b, 1, h_k, d, seed=5, dtype=torch.float32)
    expect_k, expect_v = k_cache.clone(), v_cache.clone()
    expect, expect_lse = reference.kvcache_attention(q, expect_k, expect_v, k, v, cache_seqlens=3)
    out, lse = flashattn.flash_attn_with_kvcache(q, k_cache, v_cache, k, v, cache_seqlens=3, return_softmax_lse=True)
    torch.testing.assert_close(out, expect)
    torch.testing.assert_close(lse, expect_lse.float())
    assert torch.equal(k_cache, expect_k) and torch.equal(v_cache, expect_v)


def _op_args(seed=0, page=None):
    b, h, h_k, d = 2, 4, 2, 16
    q = _randn(b, 2, h, d, seed=seed, dtype=torch.float32)
    if page:
        k_cache = _randn(6, page, h_k, d, seed=seed + 1, dtype=torch.float32)
        table = torch.tensor([[0, 2, 4], [5, 3, 1]], dtype=torch.int32)
    else:
        k_cache, table = _randn(b, 12, h_k, d, seed=seed + 1, dtype=torch.float32), None
    v_cache = torch.randn_like(k_cache)
    k, v = _randn(b, 2, h_k, d, seed=seed + 2, dtype=torch.float32), _randn(b, 2, h_k, d, seed=seed + 3,
                                                                             dtype=torch.float32)
    seqlens = torch.tensor([1, 6], dtype=torch.int32)
    return (q, k_cache, v_cache, k, v, None, None, seqlens, -1, None, None, table, None, 0.25, True, -1, -1, 0.0,
            True, 0, 0)


@pytest.mark.parametrize("page", [None, 4])
def test_opcheck_fwd_kvcache(page):
    torch.library.opcheck(OPS.fwd_kvcache.default, _op_args(page=page))


def test_opcheck_varlen_fwd_cache():
    q = _randn(5, 4, 16, dtype=torch.float32)
    k = _randn(3, 4, 2, 16, seed=1, dtype=torch.float32)  # pages of 4
    v = torch.randn_like(k)
    cu_q = torch.tensor([0, 2, 5], dtype=torch.int32)
    cu_k = torch.tensor([0, 5, 6], dtype=torch.int32)
    table = torch.tensor([[0, 2], [1, 0]], dtype=torch.int32)
    seqused = torch.tensor([5, 1], dtype=torch.int32)
    args = (q, k, v, cu_q, cu_k, seqused, table, 3, 8, None, 0.25, True, -1, -1, 0.0, 0)
    torch.library.opcheck(OPS.varlen_fwd_cache.default, args)
    out, lse = OPS.varlen_fwd_cache(*args)
    ref, _ = reference.varlen_cache_attention(q, k, v, cu_q, cu_k, seqused, table, 0.25, True)
    torch.testing.assert_close(out, ref)
    assert lse.shape == (4, 5)


def test_kvcache_compiles_fullgraph_on_cpu():
    args = _op_args()
    q, k_cache, v_cache, k, v, *_ = args
    seqlens = args[7]

    def fn(q, k_cache, v_cache, k, v, seqlens):
        return flashattn.flash_attn_with_kvcache(q, k_cache, v_cache, k, v, cache_seqlens=seqlens, causal=True)

    kc, vc = k_cache.clone(), v_cache.clone()
    eager = fn(q, kc, vc, k, v, seqlens)
    compiled = torch.compile(fn, fullgraph=True, backend="aot_eager")(q, k_cache, v_cache, k, v, seqlens)
    torch.testing.assert_close(eager, compiled)
    assert torch.equal(kc, k_cache) and torch.equal(vc, v_cache)


def _call(**overrides):
    b, h, h_k, d = 2, 4, 2, 16
    kwargs = {
        "q": torch.randn(b, 1, h, d), "k_cache": torch.randn(b, 8, h_k, d), "v_cache": torch.randn(b, 8, h_k, d),
        "k": torch.randn(b, 1, h_k, d), "v": torch.randn(b, 1, h_k, d),
        "cache_seqlens": torch.tensor([1, 2], dtype=torch.int32),
    }
    kwargs.update(overrides)
    return flashattn.flash_attn_with_kvcache(**kwargs)


@pytest.mark.parametrize("overrides, match", [
    ({"cache_seqlens": 8}, "do not fit"),
    ({"cache_seqlens": None}, "appending k/v needs cache_seqlens"),
    ({"cache_seqlens": torch.tensor([1, 2])}, "cache_seqlens has dtype torch.int64"),
    ({"v": None}, "both k and v"),
    ({"k": torch.randn(2, 1, 4, 16)}, "new keys/values"),
    ({"rotary_cos": torch.randn(8, 4), "rotary_sin": torch.randn(8, 4)}, "multiple of 16"),
    ({"rotary_cos": torch.randn(4, 8), "rotary_sin": torch.randn(4, 8)}, "one row per cache position"),
    ({"block_table": torch.zeros(2, 2, dtype=torch.int32), "cache_leftpad": torch.zeros(2, dtype=torch.int32)},
     "cache_leftpad is not supported"),
    ({"block_table": torch.zeros(3, 2, dtype=torch.int32)}, r"block_table has shape \(3, 2\)"),
    ({"k_cache": torch.randn(1, 8, 2, 16), "v_cache": torch.randn(1, 8, 2, 16)}, "give every sequence a cache row"),
    ({"q": torch.randn(2, 1, 3, 16)}, "not a multiple of 2 key/value heads"),
    ({"num_splits": -2}, "num_splits"),
])
def test_kvcache_errors(overrides, match):
    with pytest.raises(flashattn.FlashAttnError, match=match):
        _call(**overrides)


# Under a causal or local mask q's row i is rotated at cache_seqlens + i: with more q
# rows than new keys those positions can pass the tables' rows.
ROTARY_PAST = {"q": torch.randn(2, 4, 4, 16), "causal": True, "rotary_cos": torch.randn(8, 8),
               "rotary_sin": torch.randn(8, 8)}


@pytest.mark.parametrize("seqlens", [torch.tensor([1, 5], dtype=torch.int32), 5], ids=["tensor", "int"])
def test_rotary_positions_past_the_tables_are_refused(seqlens):
    with pytest.raises(flashattn.FlashAttnError, match="rotated at cache_seqlens \\+ row, up to 8"):
        _call(cache_seqlens=seqlens, **ROTARY_PAST)
    _call(cache_seqlens=4, **ROTARY_PAST)  # rows at 4..7: held
    _call(cache_seqlens=5, **{**ROTARY_PAST, "causal": False})  # every row at 5


def test_varlen_cache_is_forward_only():
    q = torch.randn(3, 2, 16, requires_grad=True)
    k = torch.randn(2, 4, 2, 16)
    cu = torch.tensor([0, 3], dtype=torch.int32)
    table = torch.tensor([[1, 0]], dtype=torch.int32)
    # With inputs that require grad the forward runs (flash_attn's tests call it so);
    # a backward through it names the limit.
    out = flashattn.flash_attn_varlen_func(q, k, k, cu, cu, 3, 8, block_table=table)
    assert out.requires_grad
    with pytest.raises(flashattn.FlashAttnError, match="forward only"):
        out.sum().backward()
    with torch.no_grad():
        out = flashattn.flash_attn_varlen_func(q, k, k, cu, cu, 3, 8, block_table=table,
                                               seqused_k=torch.tensor([6], dtype=torch.int32))
    keys = k.view(-1, 2, 16)[torch.tensor([4, 5, 6, 7, 0, 1])]
    expect, _ = reference.attention(q[None].detach(), keys[None], keys[None], softmax_scale=1 / math.sqrt(16))
    torch.testing.assert_close(out, expect[0])
