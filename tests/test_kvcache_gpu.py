"""The KV cache on the CUDA kernels, per family: flash_attn_with_kvcache (append in
place, rotary, paged and contiguous caches, split-KV, GQA packing), the varlen
forward over pages / seqused_k, and decode through flash_attn_func.

Every case draws fresh randn inputs and caches whose rows outside each sequence's
keys are NaN (the kernels must never read them), runs the kernel after filling the
allocator's free memory with NaN (so that an output row it never writes shows), and
holds out and lse to DESIGN.md's standard against the fp32 reference
(reference.kvcache_attention). The caches after the append must equal the
reference's: v bitwise, rotated k within one rounding, every other row untouched.
"""

import math

import flashattn
import pytest
import torch
import torch.nn.functional as F
from _gpu import call_kernel
from _standard import FWD_FACTOR, assert_lse, assert_standard
from flashattn import _dispatch, reference
from test_fwd_gpu import FAMILY_DTYPES, require

pytestmark = pytest.mark.gpu


@pytest.fixture(autouse=True)
def _exact_fp32_reference(monkeypatch):
    monkeypatch.setattr(torch.backends.cuda.matmul, "allow_tf32", False)
    monkeypatch.setattr(torch.backends.cudnn, "allow_tf32", False)


def poison_free_memory():
    """Fill the caching allocator's free blocks with NaN: outputs it hands out next
    start as NaN, so a row the kernel does not write fails the test."""
    blocks = [torch.full((n,), float("nan"), device="cuda") for n in (1 << 16, 1 << 20, 1 << 24)]
    del blocks


def rotary_tables(seqlen, rotary_dim, dtype):
    pos = torch.arange(seqlen, device="cuda", dtype=torch.float32)[:, None]
    freq = 10000.0 ** (-torch.arange(0, rotary_dim, 2, device="cuda", dtype=torch.float32) / rotary_dim)
    angles = pos * freq[None, :]
    return angles.cos().to(dtype), angles.sin().to(dtype)


def bits(t):
    return t.view(torch.int16)


class Case:
    """One flash_attn_with_kvcache call: inputs, NaN-poisoned caches, and the reference."""

    def __init__(self, family, dtype, *, b=3, s_q=1, s_cache=300, h=8, h_k=8, d=64, s_new=0, page=None,
                 seqlens="random", leftpad=False, batch_idx=False, rotary_dim=0, interleaved=True, causal=False,
                 window=(-1, -1), softcap=0.0, alibi=False, num_splits=0, seed=0):
        self.fam = require(family, dtype, d)
        g = torch.Generator("cuda").manual_seed(seed)
        gc = torch.Generator().manual_seed(seed)
        rand = lambda *shape: torch.randn(*shape, generator=g, device="cuda", dtype=dtype)
        self.q = rand(b, s_q, h, d)
        # Keys already cached per sequence: 0, full, and random ones between. Under a
        # causal or local mask a rotary embedding turns q's row i at cache_seqlens + i,
        # which the tables must hold (as flash_attn's tests draw them).
        room = max(s_new, s_q) if rotary_dim and (causal or window != (-1, -1)) else s_new
        if seqlens == "random":
            lengths = torch.randint(0, s_cache - room + 1, (b,), generator=gc)
            lengths[0] = 0
            if b > 1:
                lengths[1] = s_cache - room
        else:
            lengths = torch.full((b,), int(seqlens))
        self.lengths = lengths.tolist()
        self.cache_seqlens = lengths.to(torch.int32).cuda() if seqlens == "random" else int(seqlens)
        self.leftpad = None
        if leftpad:
            self.leftpad = torch.tensor([torch.randint(0, n + 1, (1,), generator=gc).item() for n in self.lengths],
                                        dtype=torch.int32, device="cuda")
        b_cache = b + 2 if batch_idx else b
        self.batch_idx = None
        if batch_idx:
            self.batch_idx = torch.randperm(b_cache, generator=gc)[:b].to(torch.int32).cuda()
        k_full, v_full = rand(b_cache, s_cache, h_k, d), rand(b_cache, s_cache, h_k, d)
        # Rows a sequence does not use (past its keys and new keys, before its left pad) are NaN.
        for i in range(b):
            row = i if self.batch_idx is None else int(self.batch_idx[i])
            end = self.lengths[i] + s_new
            k_full[row, end:] = float("nan")
            v_full[row, end:] = float("nan")
            if self.leftpad is not None:
                k_full[row, : int(self.leftpad[i])] = float("nan")
                v_full[row, : int(self.leftpad[i])] = float("nan")
        self.block_table = None
        if page is not None:
            pages_per_seq = math.ceil(s_cache / page)
            num_pages = b * pages_per_seq + 3
            perm = torch.randperm(num_pages, generator=gc)[: b * pages_per_seq]
            self.block_table = perm.view(b, pages_per_seq).to(torch.int32).cuda()
            self.k_cache = torch.full((num_pages, page, h_k, d), float("nan"), device="cuda", dtype=dtype)
            self.v_cache = torch.full_like(self.k_cache, float("nan"))
            padded = pages_per_seq * page
            for i in range(b):
                kp = F.pad(k_full[i], (0, 0, 0, 0, 0, padded - s_cache), value=float("nan"))
                vp = F.pad(v_full[i], (0, 0, 0, 0, 0, padded - s_cache), value=float("nan"))
                self.k_cache[self.block_table[i].long()] = kp.view(pages_per_seq, page, h_k, d)
                self.v_cache[self.block_table[i].long()] = vp.view(pages_per_seq, page, h_k, d)
        else:
            self.k_cache, self.v_cache = k_full, v_full
        self.k = self.v = None
        if s_new:
            self.k, self.v = rand(b, s_new, h_k, d), rand(b, s_new, h_k, d)
        self.cos = self.sin = None
        if rotary_dim:
            capacity = s_cache if page is None else self.block_table.shape[1] * page
            self.cos, self.sin = rotary_tables(capacity, rotary_dim, dtype)
        self.alibi = torch.rand(h, device="cuda") * 0.3 if alibi else None
        self.kwargs = {
            "softmax_scale": 1.0 / math.sqrt(d), "causal": causal, "window_size": window, "softcap": softcap,
            "alibi_slopes": self.alibi,
        }
        self.interleaved = interleaved
        self.num_splits = num_splits

    def call_args(self):
        return dict(k=self.k, v=self.v, rotary_cos=self.cos, rotary_sin=self.sin, cache_seqlens=self.cache_seqlens,
                    cache_batch_idx=self.batch_idx, cache_leftpad=self.leftpad, block_table=self.block_table,
                    rotary_interleaved=self.interleaved, **self.kwargs)

    def run(self):
        k_before, v_before = self.k_cache.clone(), self.v_cache.clone()
        poison_free_memory()
        out, lse = call_kernel(
            flashattn.flash_attn_with_kvcache, self.q, self.k_cache, self.v_cache, **self.call_args(),
            num_splits=self.num_splits, return_softmax_lse=True, family=self.fam,
        )
        ref = self.reference(k_before, v_before, upcast=True)
        lowp = self.reference(k_before, v_before, upcast=False)
        assert_standard("out", out, ref[0], lowp[0], FWD_FACTOR)
        assert_lse(lse, ref[1], lowp[1].float())
        # The caches: v bitwise, k within one rounding of the rotation, the rest untouched.
        k_expect, v_expect = lowp[2], lowp[3]
        assert torch.equal(bits(self.v_cache), bits(v_expect)), "v_cache differs from the reference's append"
        if self.cos is None:
            assert torch.equal(bits(self.k_cache), bits(k_expect)), "k_cache differs from the reference's append"
        else:
            changed = bits(k_expect) != bits(k_before)
            assert torch.equal(bits(self.k_cache)[~changed], bits(k_before)[~changed]), "rows outside the append changed"
            torch.testing.assert_close(self.k_cache[changed], k_expect[changed], atol=2e-2, rtol=1e-2)
        return out, lse

    def reference(self, k_before, v_before, upcast):
        cast = (lambda t: None if t is None else t.float()) if upcast else (lambda t: t)
        k_cache, v_cache = k_before.clone(), v_before.clone()
        kc, vc = cast(k_cache), cast(v_cache)
        out, lse = reference.kvcache_attention(
            cast(self.q), kc, vc, cast(self.k), cast(self.v), cast(self.cos), cast(self.sin), self.cache_seqlens,
            self.batch_idx, self.leftpad, self.block_table, rotary_interleaved=self.interleaved, upcast=upcast,
            **self.kwargs,
        )
        # The low-precision reference appends in the cache dtype: the expected caches.
        return out, lse, k_cache if upcast else kc, v_cache if upcast else vc


CASES = {
    "decode": {},
    "decode_gqa4": {"h": 8, "h_k": 2},
    "decode_mqa": {"h": 8, "h_k": 1, "s_cache": 1000},
    "append1": {"s_new": 1, "causal": True},
    "append5_causal_gqa": {"s_q": 5, "s_new": 5, "h_k": 2, "causal": True},
    "prefill_into_cache": {"s_q": 70, "s_new": 70, "causal": True, "s_cache": 200},
    "paged16": {"page": 16, "s_new": 3, "s_q": 3, "causal": True, "h_k": 4},
    "paged256_decode": {"page": 256, "s_cache": 700, "s_new": 1, "h_k": 2},
    "paged48_odd_page": {"page": 48, "s_new": 2, "s_q": 2},
    # Many key blocks per CTA: the loads' stages and the staged pages go round.
    "paged16_long": {"page": 16, "s_cache": 1500, "s_new": 1, "h_k": 2, "num_splits": 1},
    "leftpad": {"leftpad": True, "s_new": 2, "s_q": 2, "causal": True},
    "batch_idx": {"batch_idx": True, "s_new": 1},
    "window": {"window": (40, 0), "s_new": 1, "h_k": 2},
    "softcap_alibi": {"softcap": 15.0, "alibi": True, "s_new": 2, "s_q": 2, "causal": True},
    "int_seqlens": {"seqlens": 123, "s_new": 4, "s_q": 4},
    "whole_cache": {"seqlens": None, "s_cache": 129},
}


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("family, dtype", FAMILY_DTYPES)
def test_kvcache(family, dtype, d, case):
    opts = dict(CASES[case])
    seqlens = opts.pop("seqlens", "random")
    if seqlens is None:  # attend to the whole cache: no cache_seqlens
        c = Case(family, dtype, d=d, seqlens=opts.get("s_cache", 300), **opts)
        c.cache_seqlens = None
        c.run()
    else:
        Case(family, dtype, d=d, seqlens=seqlens, **opts).run()


@pytest.mark.parametrize("family, dtype", FAMILY_DTYPES)
def test_reads_what_the_kernel_before_it_wrote(family, dtype):
    # On sm_90 the KV cache kernel and the merge of its splits launch as dependents of
    # the stream's previous kernel (programmatic dependent launch): each may start while
    # that kernel runs and must wait for it before reading. Nothing syncs in between:
    # (1) elementwise kernels rewrite the whole cache and the lengths right before each
    # of three calls with eight splits (the merge waits for the split kernel, which waits
    # for the rewrite); (2) a chain of calls without splits whose q is the previous
    # call's output, which that call's kernel writes after letting the next one in.
    fam = require(family, dtype, 128)
    b, h, h_k, d, s_cache = 2, 8, 2, 128, 4096
    scale = 1.0 / math.sqrt(d)
    g = torch.Generator("cuda").manual_seed(5)
    rand = lambda *shape: torch.randn(*shape, generator=g, device="cuda", dtype=dtype)
    q = rand(b, 1, h, d)
    k_cache = torch.zeros(b, s_cache, h_k, d, device="cuda", dtype=dtype)
    v_cache = torch.zeros_like(k_cache)
    lens = torch.tensor([1000, 3000], dtype=torch.int32, device="cuda")
    steps = [(rand(b, s_cache, h_k, d), rand(b, s_cache, h_k, d)) for _ in range(3)]
    torch.cuda.synchronize()
    outs = []
    for i, (k_new, v_new) in enumerate(steps):
        torch.add(k_new, 0, out=k_cache)
        torch.add(v_new, 0, out=v_cache)
        lens.add_(17 * i)
        outs.append(flashattn.flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=lens, num_splits=8,
                                                      return_softmax_lse=True, family=fam))
    chain = _chained_calls(q, k_cache, v_cache, lens, fam, 4)
    torch.cuda.synchronize()
    lengths = [1000, 3000]
    for i, (k_new, v_new) in enumerate(steps):
        lengths = [n + 17 * i for n in lengths]
        seqlens = torch.tensor(lengths, dtype=torch.int32, device="cuda")
        ref, lowp = _decode_references(q, k_new, v_new, seqlens, scale)
        assert_standard(f"out, step {i}", outs[i][0], ref[0], lowp[0], FWD_FACTOR)
        assert_lse(outs[i][1], ref[1], lowp[1].float())
    _check_chain(chain, k_cache, v_cache, lens, scale)  # the caches hold the last step's keys


def _decode_references(q, k_cache, v_cache, seqlens, scale):
    """(fp32 reference, reference in q's precision) of a decode step over whole caches."""
    ref = reference.kvcache_attention(q.float(), k_cache.float(), v_cache.float(), None, None, None, None, seqlens,
                                      upcast=True, softmax_scale=scale)
    lowp = reference.kvcache_attention(q, k_cache, v_cache, None, None, None, None, seqlens, upcast=False,
                                       softmax_scale=scale)
    return ref, lowp


def _chained_calls(q, k_cache, v_cache, lens, family, calls):
    """[q, out_1, ...]: each call's q is the previous call's output, with no sync between."""
    chain = [q]
    for _ in range(calls):
        chain.append(flashattn.flash_attn_with_kvcache(chain[-1], k_cache, v_cache, cache_seqlens=lens, num_splits=1,
                                                       family=family))
    return chain


def _check_chain(chain, k_cache, v_cache, lens, scale):
    for i in range(1, len(chain)):
        ref, lowp = _decode_references(chain[i - 1], k_cache, v_cache, lens, scale)
        assert_standard(f"chained call {i}", chain[i], ref[0], lowp[0], FWD_FACTOR)


@pytest.mark.parametrize("family, dtype", FAMILY_DTYPES)
def test_chained_calls_read_the_previous_output(family, dtype):
    # As the chain above, with a grid of several waves (b = 64, 8 KV heads: 512 CTAs
    # without splits) and uneven cache lengths. A build without the waits
    # (-DFLASHATTN_NO_GRID_WAIT) passed this and the test above on an H100 too: the
    # window between a CTA letting the next call in and writing its output is short,
    # so these check the chained results, not that the wait is there.
    fam = require(family, dtype, 128)
    b, h, h_k, d, s_cache = 64, 32, 8, 128, 2048
    scale = 1.0 / math.sqrt(d)
    g = torch.Generator("cuda").manual_seed(6)
    rand = lambda *shape: torch.randn(*shape, generator=g, device="cuda", dtype=dtype)
    k_cache, v_cache = rand(b, s_cache, h_k, d), rand(b, s_cache, h_k, d)
    lens = torch.randint(1, s_cache + 1, (b,), generator=g, device="cuda", dtype=torch.int32)
    q = rand(b, 1, h, d)
    torch.cuda.synchronize()
    chain = _chained_calls(q, k_cache, v_cache, lens, fam, 6)
    torch.cuda.synchronize()
    _check_chain(chain, k_cache, v_cache, lens, scale)


@pytest.mark.parametrize("case", ["append5_causal_gqa", "paged16", "decode"])
@pytest.mark.parametrize("d", [44, 59])
@pytest.mark.parametrize("family, dtype", FAMILY_DTYPES)
def test_kvcache_head_dim_not_multiple_of_8(family, dtype, d, case):
    # The public function runs these on padded copies of q and the caches and writes
    # the appended rows back: the caches must end as the reference's, in place.
    Case(family, dtype, d=d, **CASES[case]).run()
    Case(family, dtype, d=d, s_new=2, s_q=2, causal=True, rotary_dim=32, interleaved=False).run()


def test_rotary_wider_than_an_unpadded_head_dim():
    # d = 44 runs padded to 48: a rotary_dim of 48 must be refused against 44.
    require(_device_family(), torch.float16, 44)
    q = torch.randn(1, 1, 2, 44, device="cuda", dtype=torch.float16)
    cache = torch.randn(1, 16, 2, 44, device="cuda", dtype=torch.float16)
    new = torch.randn(1, 1, 2, 44, device="cuda", dtype=torch.float16)
    cos, sin = rotary_tables(16, 48, torch.float16)
    with pytest.raises(RuntimeError, match="rotary_dim = 48, more than the head dim 44"):
        flashattn.flash_attn_with_kvcache(q, cache, cache.clone(), new, new, rotary_cos=cos, rotary_sin=sin,
                                          cache_seqlens=3)


@pytest.mark.parametrize("family, dtype", FAMILY_DTYPES)
def test_rotary_positions_past_the_tables(family, dtype):
    # Causal, 6 q rows and 2 new keys at cache_seqlens 9 of a 12-row cache: q's rows
    # are rotated at 9..14, past the tables' 12 rows. The public function refuses it
    # (a tensor cache_seqlens by one sync, an int by the op); the op with a tensor, as
    # inside a CUDA graph, does not check and must leave rows 12.. unrotated rather
    # than read past the tables, which here end where NaN rows begin.
    fam = require(family, dtype, 64)
    g = torch.Generator("cuda").manual_seed(3)
    rand = lambda *shape: torch.randn(*shape, generator=g, device="cuda", dtype=dtype)
    q, k_cache, v_cache, k, v = rand(1, 6, 4, 64), rand(1, 12, 2, 64), rand(1, 12, 2, 64), rand(1, 2, 2, 64), rand(1, 2, 2, 64)
    seqlens = torch.tensor([9], dtype=torch.int32, device="cuda")
    cos, sin = (t.repeat(2, 1) for t in rotary_tables(12, 32, dtype))
    cos[12:], sin[12:] = float("nan"), float("nan")
    cos, sin = cos[:12], sin[:12]
    for given in (seqlens, 9):  # an int is checked by the op
        with pytest.raises(RuntimeError, match="up to 14, but rotary_cos/rotary_sin have 12 positions"):
            flashattn.flash_attn_with_kvcache(q, k_cache.clone(), v_cache.clone(), k, v, rotary_cos=cos,
                                              rotary_sin=sin, cache_seqlens=given, causal=True, family=fam)
    kc, vc = k_cache.clone(), v_cache.clone()
    out, lse = call_kernel(torch.ops.flashattn.fwd_kvcache, q, kc, vc, k, v, cos, sin, seqlens, -1, None, None, None,
                           None, 0.125, True, -1, -1, 0.0, True, 0, fam)
    kr, vr = k_cache.float(), v_cache.float()
    ref, ref_lse = reference.kvcache_attention(q.float(), kr, vr, k.float(), v.float(), cos.float(), sin.float(),
                                               seqlens, softmax_scale=0.125, causal=True)
    low, low_lse = reference.kvcache_attention(q, k_cache.clone(), v_cache.clone(), k, v, cos, sin, seqlens,
                                               softmax_scale=0.125, causal=True, upcast=False)
    assert_standard("out", out, ref, low, FWD_FACTOR)
    assert_lse(lse, ref_lse, low_lse.float())


def _device_family():
    major, minor = torch.cuda.get_device_capability()
    return f"sm{_dispatch.family_for_capability((major, minor), torch.cuda.get_device_name())}"


def test_pages_must_hold_the_keys():
    # max(cache_seqlens) + s_new past what block_table addresses would make the kernels
    # read block_table past its columns: flash_attn 2.x raises, and so does this.
    dtype = torch.float16
    q = torch.randn(2, 1, 4, 64, device="cuda", dtype=dtype)
    pages = torch.randn(6, 16, 2, 64, device="cuda", dtype=dtype)
    table = torch.tensor([[0, 1], [2, 3]], dtype=torch.int32, device="cuda")  # 32 keys per sequence
    new = torch.randn(2, 1, 2, 64, device="cuda", dtype=dtype)
    full = torch.tensor([32, 5], dtype=torch.int32, device="cuda")
    flashattn.flash_attn_with_kvcache(q, pages, pages.clone(), cache_seqlens=full, block_table=table)  # fits
    with pytest.raises(RuntimeError, match="block_table addresses 2 pages of 16 = 32"):
        flashattn.flash_attn_with_kvcache(q, pages, pages.clone(), new, new, cache_seqlens=full, block_table=table)
    with pytest.raises(RuntimeError, match="block_table"):
        flashattn.flash_attn_with_kvcache(q, pages, pages.clone(), cache_seqlens=full + 1, block_table=table)


@pytest.mark.parametrize("num_splits", [1, 2, 7, 0])
@pytest.mark.parametrize("family, dtype", FAMILY_DTYPES)
def test_kvcache_splits(family, dtype, num_splits):
    # Long caches, b = 1: the heuristic splits; forced counts must agree with it.
    Case(family, dtype, b=2, h=16, h_k=4, s_cache=3000, s_new=1, num_splits=num_splits, page=64).run()
    Case(family, dtype, b=1, s_q=4, h=8, h_k=8, s_cache=2000, s_new=4, causal=True, num_splits=num_splits).run()
    # One and three rows in all (b = h_k = s_q = 1): the split workspace's lse part
    # is not a multiple of 16 bytes (flash_attn's paged tests: b = h = 1).
    Case(family, dtype, b=1, h=1, h_k=1, s_cache=700, s_new=1, seqlens=600, num_splits=num_splits, page=256).run()
    Case(family, dtype, b=1, h=3, h_k=1, s_cache=1500, seqlens=1400, num_splits=num_splits).run()


@pytest.mark.parametrize("rotary_dim", [16, 32, 64])
@pytest.mark.parametrize("interleaved", [True, False])
@pytest.mark.parametrize("family, dtype", FAMILY_DTYPES)
def test_kvcache_rotary(family, dtype, interleaved, rotary_dim):
    Case(family, dtype, d=64, s_new=3, s_q=3, causal=True, rotary_dim=rotary_dim, interleaved=interleaved,
         h_k=2).run()
    Case(family, dtype, d=64, s_new=1, rotary_dim=rotary_dim, interleaved=interleaved, page=16).run()


def test_rotary_against_complex_multiplication():
    # An independent rotary: pairs as complex numbers times e^(i angle).
    torch.manual_seed(0)
    x = torch.randn(2, 5, 3, 32, dtype=torch.float64)
    cos, sin = rotary_tables(20, 32, torch.float32)
    cos, sin = cos.cpu().double(), sin.cpu().double()
    pos = torch.randint(0, 20, (2, 5))
    rot = torch.complex(cos[pos], sin[pos])[:, :, None]
    inter = torch.view_as_real(torch.view_as_complex(x.view(2, 5, 3, 16, 2)) * rot).flatten(-2)
    torch.testing.assert_close(reference.apply_rotary(x, cos, sin, pos, True), inter)
    halves = torch.complex(x[..., :16], x[..., 16:]) * rot
    torch.testing.assert_close(reference.apply_rotary(x, cos, sin, pos, False),
                               torch.cat((halves.real, halves.imag), -1))


@pytest.mark.parametrize("family, dtype", FAMILY_DTYPES)
def test_decode_through_flash_attn_func(family, dtype):
    # s_q = 1 over a long cache: GQA packing and split-KV in the plain forward.
    fam = require(family, dtype, 128)
    g = torch.Generator("cuda").manual_seed(3)
    # (1, 4096, 1, 1) and (1, 3000, 3, 1): split-KV over 1 and 3 rows, whose partial
    # lse values fill no whole 16 bytes before the partial outputs.
    for b, s_k, h, h_k, causal in ((1, 4096, 32, 8, True), (8, 2048, 32, 8, False), (2, 777, 8, 8, True),
                                   (1, 4096, 1, 1, False), (1, 3000, 3, 1, True)):
        q = torch.randn(b, 1, h, 128, generator=g, device="cuda", dtype=dtype)
        k = torch.randn(b, s_k, h_k, 128, generator=g, device="cuda", dtype=dtype)
        v = torch.randn(b, s_k, h_k, 128, generator=g, device="cuda", dtype=dtype)
        poison_free_memory()
        out, lse, _ = call_kernel(flashattn.flash_attn_func, q, k, v, causal=causal, return_attn_probs=True,
                                  family=fam)
        ref = reference.attention(q.float(), k.float(), v.float(), causal=causal)
        lowp = reference.attention(q, k, v, causal=causal, upcast=False)
        assert_standard("out", out, ref[0], lowp[0], FWD_FACTOR)
        assert_lse(lse, ref[1], lowp[1].float())


@pytest.mark.parametrize("page", [None, 16, 256])
@pytest.mark.parametrize("family, dtype", FAMILY_DTYPES)
def test_varlen_over_a_cache(family, dtype, page):
    # flash_attn_varlen_func with seqused_k (and pages): paged prefill as serving engines run it.
    fam = require(family, dtype, 64)
    g = torch.Generator("cuda").manual_seed(5)
    gc = torch.Generator().manual_seed(5)
    lengths_q = [3, 0, 64, 1]
    used = [40, 7, 300, 1]
    b, h, h_k, d = len(used), 8, 2, 64
    q = torch.randn(sum(lengths_q), h, d, generator=g, device="cuda", dtype=dtype)
    cu_q = F.pad(torch.tensor(lengths_q, device="cuda").cumsum(0, dtype=torch.int32), (1, 0))
    seqused = torch.tensor(used, dtype=torch.int32, device="cuda")
    if page is None:
        # cu_seqlens_k spans more rows than are used: more than batch * max(used) in all
        rows = [u + 300 for u in used]
        k = torch.randn(sum(rows), h_k, d, generator=g, device="cuda", dtype=dtype)
        v = torch.randn_like(k)
        cu_k = F.pad(torch.tensor(rows, device="cuda").cumsum(0, dtype=torch.int32), (1, 0))
        for i in range(b):
            k[int(cu_k[i]) + used[i] : int(cu_k[i + 1])] = float("nan")
        table = None
    else:
        pages = max(math.ceil(u / page) for u in used)
        num_pages = b * pages + 2
        table = torch.randperm(num_pages, generator=gc)[: b * pages].view(b, pages).to(torch.int32).cuda()
        k = torch.randn(num_pages, page, h_k, d, generator=g, device="cuda", dtype=dtype)
        v = torch.randn_like(k)
        cu_k = F.pad(torch.tensor(used, device="cuda").cumsum(0, dtype=torch.int32), (1, 0))
    poison_free_memory()
    out, lse, _ = call_kernel(
        flashattn.flash_attn_varlen_func, q, k, v, cu_q, cu_k, max(lengths_q), max(used), causal=True,
        return_attn_probs=True, block_table=table, seqused_k=seqused, family=fam,
    )
    cast = lambda t: t.float()
    ref = reference.varlen_cache_attention(cast(q), cast(k), cast(v), cu_q, cu_k, seqused, table, causal=True)
    lowp = reference.varlen_cache_attention(q, k, v, cu_q, cu_k, seqused, table, causal=True, upcast=False)
    assert_standard("out", out, ref[0], lowp[0], FWD_FACTOR)
    assert_lse(lse, ref[1], lowp[1].float())


def test_decode_loop_in_a_cuda_graph():
    # cache_seqlens on the device, no host sync, no allocation that changes size: a
    # decode step captured once and replayed must equal eager steps (on the device's
    # own family; the eager calls check block_table's bounds, the capture does not).
    require(_device_family(), torch.bfloat16, 128)
    b, h, h_k, d, s_cache, page = 2, 16, 4, 128, 512, 16
    g = torch.Generator("cuda").manual_seed(9)
    pages = s_cache // page
    table = torch.arange(b * pages, dtype=torch.int32, device="cuda").view(b, pages)
    k_cache = torch.randn(b * pages, page, h_k, d, generator=g, device="cuda", dtype=torch.bfloat16)
    v_cache = torch.randn_like(k_cache)
    seqlens = torch.tensor([10, 100], dtype=torch.int32, device="cuda")
    steps = [tuple(torch.randn(b, 1, heads, d, generator=g, device="cuda", dtype=torch.bfloat16)
                   for heads in (h, h_k, h_k)) for _ in range(4)]
    q_in, k_in, v_in = (torch.empty_like(t) for t in steps[0])

    def step():
        out = flashattn.flash_attn_with_kvcache(q_in, k_cache, v_cache, k_in, v_in, cache_seqlens=seqlens,
                                                block_table=table, causal=True)
        seqlens.add_(1)
        return out

    k_eager, v_eager, lens_eager = k_cache.clone(), v_cache.clone(), seqlens.clone()
    eager = []
    for q, k, v in steps:
        eager.append(flashattn.flash_attn_with_kvcache(q, k_eager, v_eager, k, v, cache_seqlens=lens_eager,
                                                       block_table=table, causal=True))
        lens_eager += 1
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):  # warm up (first-call opt-ins) outside the capture
        for t, src in zip((q_in, k_in, v_in), steps[0]):
            t.copy_(src)
        k_warm, v_warm, lens_warm = k_cache.clone(), v_cache.clone(), seqlens.clone()
        flashattn.flash_attn_with_kvcache(q_in, k_warm, v_warm, k_in, v_in, cache_seqlens=lens_warm,
                                          block_table=table, causal=True)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out_static = step()
    for i, (q, k, v) in enumerate(steps):
        for t, src in zip((q_in, k_in, v_in), (q, k, v)):
            t.copy_(src)
        graph.replay()
        assert torch.equal(out_static, eager[i]), f"step {i}: graph replay differs from eager"
    assert torch.equal(k_cache, k_eager) and torch.equal(v_cache, v_eager)


@pytest.mark.parametrize("paged, d", [(False, 64), (True, 64), (False, 44)])
def test_kvcache_compiles_fullgraph(paged, d):
    # On the device's own family; with pages (whose bounds check reads cache_seqlens
    # back in eager mode only) and with a head dim the public function pads.
    require(_device_family(), torch.bfloat16, d)
    g = torch.Generator("cuda").manual_seed(2)
    q = torch.randn(2, 1, 8, d, generator=g, device="cuda", dtype=torch.bfloat16)
    k_cache = torch.randn(2, 64, 2, d, generator=g, device="cuda", dtype=torch.bfloat16)
    v_cache = torch.randn_like(k_cache)
    k, v = (torch.randn(2, 1, 2, d, generator=g, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    seqlens = torch.tensor([5, 30], dtype=torch.int32, device="cuda")
    table = torch.tensor([[1], [0]], dtype=torch.int32, device="cuda") if paged else None

    def fn(q, k_cache, v_cache, k, v, seqlens):
        return flashattn.flash_attn_with_kvcache(q, k_cache, v_cache, k, v, cache_seqlens=seqlens, causal=True,
                                                 block_table=table)

    kc_eager, vc_eager = k_cache.clone(), v_cache.clone()
    eager = fn(q, kc_eager, vc_eager, k, v, seqlens)
    compiled = torch.compile(fn, fullgraph=True)(q, k_cache, v_cache, k, v, seqlens)
    assert torch.equal(eager, compiled)
    assert torch.equal(k_cache, kc_eager) and torch.equal(v_cache, vc_eager), "the compiled call lost the append"


@pytest.mark.parametrize("bad, match", [
    ({"cache_seqlens": 64}, "do not fit"),
    ({"rotary_cos": "odd"}, "multiple of 16"),
    ({"block_table": "int64"}, "block_table has dtype"),
    ({"num_splits": -1}, "num_splits"),
    ({"cache_leftpad": "with_pages"}, "cache_leftpad is not supported"),
])
def test_kvcache_errors_on_the_gpu(bad, match):
    require(_device_family(), torch.bfloat16, 64)
    q = torch.randn(2, 1, 4, 64, device="cuda", dtype=torch.bfloat16)
    k_cache = torch.randn(2, 64, 2, 64, device="cuda", dtype=torch.bfloat16)
    v_cache = torch.randn_like(k_cache)
    k, v = (torch.randn(2, 1, 2, 64, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    kwargs = {"k": k, "v": v, "cache_seqlens": torch.tensor([1, 2], dtype=torch.int32, device="cuda")}
    kwargs.update(bad)
    if bad.get("rotary_cos") == "odd":
        kwargs["rotary_cos"], kwargs["rotary_sin"] = rotary_tables(64, 24, torch.bfloat16)
    if bad.get("block_table") == "int64":
        kwargs["block_table"] = torch.zeros(2, 4, dtype=torch.int64, device="cuda")
    if bad.get("cache_leftpad") == "with_pages":
        kwargs["cache_leftpad"] = torch.zeros(2, dtype=torch.int32, device="cuda")
        kwargs["block_table"] = torch.zeros(2, 4, dtype=torch.int32, device="cuda")
    with pytest.raises(RuntimeError, match=match):
        flashattn.flash_attn_with_kvcache(q, k_cache, v_cache, **kwargs)


@pytest.mark.parametrize("inference_tensors", [False, True], ids=["normal-tensors", "inference-tensors"])
def test_inference_mode(inference_tensors):
    # Serving code runs under torch.inference_mode(): every forward must run there and
    # give what it gives under no_grad, and the KV cache's in-place append must land,
    # in normal tensors and in inference tensors (made under inference_mode, outside
    # autograd's version counting).
    dtype = torch.bfloat16 if torch.cuda.get_device_capability()[0] >= 8 else torch.float16
    require(_device_family(), dtype, 64)
    g = torch.Generator("cuda").manual_seed(31)
    rand = lambda *shape: torch.randn(*shape, generator=g, device="cuda", dtype=dtype)
    q, k, v, q_packed = rand(2, 70, 8, 64), rand(2, 90, 2, 64), rand(2, 90, 2, 64), rand(90, 8, 64)
    cu = torch.tensor([0, 30, 90], dtype=torch.int32, device="cuda")
    k_cache, v_cache = rand(2, 128, 2, 64), rand(2, 128, 2, 64)
    k_new, v_new = rand(2, 3, 2, 64), rand(2, 3, 2, 64)
    seqlens = torch.tensor([5, 100], dtype=torch.int32, device="cuda")
    block_table = torch.tensor([[1, 0], [3, 2]], dtype=torch.int32, device="cuda")

    def caches():  # contiguous, and as pages of 64 rows in another order
        return [k_cache.clone(), v_cache.clone()] + [c.reshape(4, 64, 2, 64)[[1, 0, 3, 2]].clone()
                                                     for c in (k_cache, v_cache)]

    def calls(kc, vc, kp, vp):
        return [
            flashattn.flash_attn_func(q, k, v, causal=True),
            flashattn.flash_attn_varlen_func(q_packed, k[0], v[0], cu, cu, 60, 60, window_size=(7, 3)),
            flashattn.flash_attn_with_kvcache(q[:, :3], kc, vc, k_new, v_new, cache_seqlens=seqlens, causal=True),
            flashattn.flash_attn_with_kvcache(q[:, :1], kp, vp, k_new, v_new, cache_seqlens=seqlens,
                                              block_table=block_table),
        ]

    with torch.no_grad():
        want_caches = caches()
        want = call_kernel(calls, *want_caches)
    got_caches = None if inference_tensors else caches()
    with torch.inference_mode():
        if inference_tensors:
            got_caches = caches()
        got = calls(*got_caches)
    assert all(c.is_inference() == inference_tensors for c in got_caches)
    for i, (a, b) in enumerate(zip(got + got_caches, want + want_caches)):
        assert torch.equal(a, b), f"result {i} differs under inference_mode"
