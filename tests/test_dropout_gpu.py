"""Dropout in the CUDA kernels, per kernel family.

- The mask each kernel applies is read back exactly (forward: V one-hot over a block of
  256 keys that alone gets probability; backward: dV with dO one-hot) and must equal
  reference.dropout_keep_mask bit for bit: the forward's and the backward's.
- Forward and backward against the fp32 reference computed with that mask, DESIGN's
  2x / 3x rule (fresh randn, NaN-poisoned outputs), with causal masks, windows, softcap,
  ALiBi, GQA, head dims, odd lengths and varlen.
- The same seed gives bitwise the same outputs and (deterministic mode) gradients;
  another seed other masks; keep rates per (batch, head), row and column.
- CUDA graph replays draw new masks, each equal to the eager call with its rng_state;
  torch.compile(fullgraph=True) draws with torch.randint (inductor's fallback_random:
  eager's randint); an eager call claims [seed, offset] on the host, which gives the
  kernels the same mask as the same values in device memory.
- A small transformer trained with dropout follows SDPA's (with dropout) loss curve.
"""

import math

import flashattn
import pytest
import torch
import torch.nn.functional as F
from _gpu import call_kernel
from _standard import BWD_FACTOR, FWD_FACTOR, assert_lse, assert_standard
from flashattn import _families, reference
from test_fwd_gpu import FAMILY_DTYPES, require
from test_varlen_gpu import cu_seqlens

pytestmark = pytest.mark.gpu

OPS = torch.ops.flashattn
P = 0.17  # flash_attn 2.x's tests use this rate
FAMILIES_FP16 = [p for p in FAMILY_DTYPES if p.values[1] == torch.float16]


@pytest.fixture(autouse=True)
def _exact_fp32_reference(monkeypatch):
    monkeypatch.setattr(torch.backends.cuda.matmul, "allow_tf32", False)
    monkeypatch.setattr(torch.backends.cudnn, "allow_tf32", False)


def dropout_units(family: int) -> reference.DropoutUnits:
    f = _families.get(family)
    return reference.DropoutUnits(f.dropout_row_pairing, f.dropout_lane_units)


def rng_state(seed: int) -> torch.Tensor:
    g = torch.Generator("cuda").manual_seed(seed)
    return torch.randint(0, 2**63 - 1, (2,), generator=g, device="cuda", dtype=torch.int64)


# ---- the mask, read back from the kernels


def _block_inputs(b, s_q, s_k, h, h_k, d, key_block, query_block=None, dtype=torch.float16):
    """q, k, v such that the rows of `query_block` (all rows if None) give key block
    `key_block` (d keys) uniform probability and every other key exp(-60) of it, the
    other rows the reverse, and v is one-hot: out[.., i, j % d] is then
    keep(i, j) / (n (1 - p)) for the n keys of the block."""
    i = torch.arange(s_q, device="cuda")
    j = torch.arange(s_k, device="cuda")
    rows_in = torch.ones_like(i, dtype=torch.bool) if query_block is None else (i // d) == query_block
    keys_in = (j // d) == key_block
    q = torch.zeros(b, s_q, h, d, device="cuda", dtype=dtype)
    q[..., 0] = torch.where(rows_in, 30.0, -30.0).view(1, -1, 1).to(dtype)
    k = torch.zeros(b, s_k, h_k, d, device="cuda", dtype=dtype)
    k[..., 0] = torch.where(keys_in, 1.0, -1.0).view(1, -1, 1).to(dtype)
    v = torch.zeros(b, s_k, h_k, d, device="cuda", dtype=dtype)
    v[:, j, :, j % d] = 1.0
    return q, k, v, rows_in, keys_in


def read_forward_mask(family, b, s_q, s_k, h, h_k, d, state, p):
    """(b, h, s_q, s_k) keep mask of the forward kernel, d keys at a time."""
    mask = torch.zeros(b, h, s_q, s_k, dtype=torch.bool, device="cuda")
    for block in range((s_k + d - 1) // d):
        q, k, v, _, keys_in = _block_inputs(b, s_q, s_k, h, h_k, d, block)
        out, _ = call_kernel(OPS.fwd, q, k, v, None, state, p, 1.0, False, -1, -1, 0.0, family)
        cols = keys_in.nonzero().squeeze(1)
        mask[..., cols] = (out[:, :, :, cols % d] > 1e-3).permute(0, 2, 1, 3)
    return mask


def read_backward_mask(family, b, s_q, s_k, h, d, state, p):
    """(b, h, s_q, s_k) keep mask of the backward kernel, by blocks of d x d: dV of key
    j is sum_i keep(i, j) P_ij dO_i / (1 - p), with dO one-hot in each query block and
    only that block's rows giving the key block probability (s_k > d)."""
    assert s_k > d
    mask = torch.zeros(b, h, s_q, s_k, dtype=torch.bool, device="cuda")
    i = torch.arange(s_q, device="cuda")
    dout = torch.zeros(b, s_q, h, d, device="cuda", dtype=torch.float16)
    dout[:, i, :, i % d] = 1.0
    for qb in range((s_q + d - 1) // d):
        for kb in range((s_k + d - 1) // d):
            q, k, v, rows_in, keys_in = _block_inputs(b, s_q, s_k, h, h, d, kb, qb)
            out, lse = call_kernel(OPS.fwd, q, k, v, None, state, p, 1.0, False, -1, -1, 0.0, family)
            _, _, dv = call_kernel(OPS.bwd, dout, q, k, v, out, lse, None, state, p, 1.0, False, -1, -1, 0.0,
                                   False, family)
            rows, cols = rows_in.nonzero().squeeze(1), keys_in.nonzero().squeeze(1)
            got = dv[:, cols][..., rows % d] > 1e-3  # (b, cols, h, rows)
            mask[:, :, rows[:, None], cols[None, :]] = got.permute(0, 2, 3, 1)
    return mask


# 1100 and 1200 keys at d256: past the length where the sm90 forward switches to
# its long-sequence tile without dropout.
@pytest.mark.parametrize("d, s_k", [(32, 700), (64, 700), (128, 700), (256, 700), (256, 1100), (256, 1200)])
@pytest.mark.parametrize("family, dtype", FAMILIES_FP16)
def test_forward_mask_is_the_reference_mask(family, dtype, d, s_k):
    fam = require(family, dtype, d)
    b, s_q, h, h_k = 2, 301, 3, 1
    state = rng_state(1)
    got = read_forward_mask(fam, b, s_q, s_k, h, h_k, d, state, P)
    want = reference.dropout_keep_mask(state, b, h, s_q, s_k, P, dropout_units(fam))
    assert torch.equal(got, want), f"{(got != want).sum().item()} of {got.numel()} keep bits differ"


# Every bucket: the backwards' tiles hold a warp's columns in runs of 32, 16 or 8
# (sm75 d192/d256), each made from its own share of the units (kernel/dropout.h).
@pytest.mark.parametrize("d", [32, 64, 96, 128, 160, 192, 224, 256])
@pytest.mark.parametrize("family, dtype", FAMILIES_FP16)
def test_backward_mask_is_the_forward_mask(family, dtype, d):
    fam = require(family, dtype, d)
    b, s_q, s_k, h = 2, 200, 300, 2
    state = rng_state(2)
    got = read_backward_mask(fam, b, s_q, s_k, h, d, state, P)
    want = reference.dropout_keep_mask(state, b, h, s_q, s_k, P, dropout_units(fam))
    assert torch.equal(got, want), f"{(got != want).sum().item()} of {got.numel()} keep bits differ"


# The thresholds' ends: below p = 1/8192 round((1 - p) 4096) is 4096 and every byte is
# kept (the sm90 backward's drop addends are 0), above 1 - 1/8192 it is 0 and none is
# (addends 256); at 1e-3 and 0.999 the dithered bytes' threshold is 256 and 1. Both
# the forward's and the backward's masks, in every bucket whose sm90 backward has the
# producer's warps make them (d <= 128).
@pytest.mark.parametrize("p", [1e-4, 1e-3, 0.999, 0.9999])
@pytest.mark.parametrize("d", [32, 64, 96, 128])
@pytest.mark.parametrize("family, dtype", FAMILIES_FP16)
def test_masks_at_the_ends_of_the_rate(family, dtype, d, p):
    fam = require(family, dtype, d)
    b, s_q, s_k, h = 1, 150, 260, 2
    state = rng_state(3)
    want = reference.dropout_keep_mask(state, b, h, s_q, s_k, p, dropout_units(fam))
    if p < 1 / 8192:
        assert bool(want.all())
    if p > 1 - 1 / 8192:
        assert not bool(want.any())
    got_fwd = read_forward_mask(fam, b, s_q, s_k, h, h, d, state, p)
    assert torch.equal(got_fwd, want), f"forward: {(got_fwd != want).sum().item()} of {want.numel()} keep bits differ"
    got_bwd = read_backward_mask(fam, b, s_q, s_k, h, d, state, p)
    assert torch.equal(got_bwd, want), f"backward: {(got_bwd != want).sum().item()} of {want.numel()} keep bits differ"


@pytest.mark.parametrize("family, dtype", FAMILIES_FP16)
def test_varlen_mask_counts_rows_in_each_sequence(family, dtype):
    # Sequence i of a varlen batch has batch index i of the mask, rows and columns
    # counted from its own start.
    fam = require(family, dtype, 256)
    lengths, h, d = [37, 260, 5], 2, 256
    state = rng_state(3)
    cu = cu_seqlens(lengths)
    q = torch.zeros(sum(lengths), h, d, device="cuda", dtype=torch.float16)
    q[..., 0] = 30.0
    k = torch.zeros_like(q)
    pos = torch.cat([torch.arange(n, device="cuda") for n in lengths])
    k[..., 0] = torch.where(pos < 256, 1.0, -1.0).view(-1, 1).half()
    v = torch.zeros_like(q)
    rows = torch.arange(sum(lengths), device="cuda")
    v[rows, :, pos % d] = torch.where(pos < 256, 1.0, 0.0).view(-1, 1).half()
    out, _ = call_kernel(OPS.varlen_fwd, q, k, v, cu, cu, max(lengths), max(lengths), None, state, P, 1.0, False,
                         -1, -1, 0.0, fam)
    mask = reference.dropout_keep_mask(state, len(lengths), h, max(lengths), max(lengths), P, dropout_units(fam))
    start = 0
    for i, n in enumerate(lengths):
        got = out[start:start + n, :, : min(n, 256)] > 1e-3  # (rows, h, cols)
        want = mask[i, :, :n, : min(n, 256)].permute(1, 0, 2)
        assert torch.equal(got, want), f"sequence {i}: {(got != want).sum().item()} keep bits differ"
        start += n


# ---- outputs and gradients against the reference with the same mask


def check_dropout(family, dtype, b, s_q, s_k, h, h_k, d, causal=False, window=(-1, -1), softcap=0.0,
                  alibi=None, p=P, seed=0):
    fam = require(family, dtype, d)
    g = torch.Generator("cuda").manual_seed(seed)
    q = torch.randn(b, s_q, h, d, generator=g, device="cuda", dtype=dtype)
    k = torch.randn(b, s_k, h_k, d, generator=g, device="cuda", dtype=dtype)
    v = torch.randn(b, s_k, h_k, d, generator=g, device="cuda", dtype=dtype)
    dout = torch.randn(b, s_q, h, d, generator=g, device="cuda", dtype=dtype)
    state = rng_state(seed + 7)
    scale = 1.0 / math.sqrt(d)
    args = (alibi, state, p, scale, causal, window[0], window[1], softcap)
    out = torch.full_like(q, float("nan"))
    lse = call_kernel(OPS.fwd_out, q, k, v, out, *args, fam)
    grads = [torch.full_like(t, float("nan")) for t in (q, k, v)]
    call_kernel(OPS.bwd_out, dout, q, k, v, out, lse, *grads, *args, False, fam)

    kw = {"softmax_scale": scale, "causal": causal, "window_size": window, "softcap": softcap,
          "alibi_slopes": alibi, "dropout_p": p, "rng_state": state, "dropout_units": dropout_units(fam)}
    f32 = [t.float() for t in (q, k, v, dout)]
    ref, ref_lse = reference.attention(*f32[:3], **kw)
    lowp, lowp_lse = reference.attention(q, k, v, upcast=False, **kw)
    assert_standard("out", out, ref, lowp, FWD_FACTOR)
    assert_lse(lse, ref_lse, lowp_lse.float())
    ref_grads = reference.attention_bwd(f32[3], *f32[:3], ref, ref_lse, **kw)
    lowp_grads = reference.attention_bwd(dout, q, k, v, lowp, lowp_lse, upcast=False, **kw)
    for name, ours, r, lp in zip(("dq", "dk", "dv"), grads, ref_grads, lowp_grads):
        assert_standard(name, ours, r, lp, BWD_FACTOR, 1e-4)


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("s_q, s_k", [(128, 128), (255, 113), (113, 300), (1, 77)])
@pytest.mark.parametrize("d", [32, 64, 128, 256])
@pytest.mark.parametrize("family, dtype", FAMILY_DTYPES)
def test_forward_backward(family, dtype, d, s_q, s_k, causal):
    check_dropout(family, dtype, 2, s_q, s_k, 4, 4, d, causal=causal)


# Above d192 the sm90 forward without dropout runs key blocks of 80 from 1024 keys
# (2048 under a mask); with dropout, lengths on both sides of that switch, under a
# causal mask, a window and score modifiers.
@pytest.mark.parametrize(
    "s_q, s_k, kw",
    [(129, 1100, {}), (300, 2100, {"causal": True}), (1, 1300, {}), (150, 1200, {"softcap": 5.0}),
     (200, 2300, {"window": (700, 300)}), (64, 900, {})],
)
@pytest.mark.parametrize("d", [200, 256])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
def test_sm90_dropout_on_both_sides_of_the_long_tile(dtype, d, s_q, s_k, kw):
    check_dropout("sm90", dtype, 1, s_q, s_k, 2, 1, d, **kw)


# The sm90 backward's keep masks are made a tile ahead by the producer's warps where
# the keys are the rows of S (up to d128; 128 query rows up to d64) and by the
# consumers above (kernel/bwd_sm90.h, launch/bwd_sm90.h): head dims on both sides of
# those bounds, GQA, and a sequence of several query tiles per key block.
@pytest.mark.parametrize("s_q, s_k, causal", [(255, 113, True), (113, 300, False), (700, 700, True)])
@pytest.mark.parametrize("d", [40, 72, 96, 120, 160])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
def test_sm90_keep_masks_made_ahead(dtype, d, s_q, s_k, causal):
    check_dropout("sm90", dtype, 2, s_q, s_k, 4, 2, d, causal=causal)


@pytest.mark.parametrize(
    "feature", ["gqa", "mqa", "window", "softcap", "alibi", "softcap_alibi", "p_small", "p_large", "d80"]
)
@pytest.mark.parametrize("family, dtype", FAMILY_DTYPES)
def test_features(family, dtype, feature):
    kw = {"b": 2, "s_q": 200, "s_k": 333, "h": 8, "h_k": 8, "d": 64}
    if feature == "gqa":
        kw["h_k"] = 2
    elif feature == "mqa":
        kw["h_k"] = 1
    elif feature == "window":
        kw.update(window=(40, 7))
    elif feature == "softcap":
        kw.update(softcap=5.0)
    elif feature == "alibi":
        kw.update(alibi=torch.rand(8, device="cuda") * 0.3, causal=True)
    elif feature == "softcap_alibi":
        kw.update(softcap=5.0, alibi=torch.rand(2, 8, device="cuda") * 0.3)
    elif feature == "p_small":
        kw.update(p=0.01)
    elif feature == "p_large":
        kw.update(p=0.9)
    elif feature == "d80":
        kw.update(d=80)
    check_dropout(family, dtype, **kw)


@pytest.mark.parametrize("family, dtype", FAMILY_DTYPES)
def test_varlen_forward_backward(family, dtype):
    check_varlen_dropout(family, dtype, 64, [1, 130, 0, 77, 300], [20, 128, 5, 0, 301])


# Varlen with dropout where the longest sequence would take the sm90 forward's
# long-sequence tile without dropout (above d192, 2048 keys under a causal mask).
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
def test_sm90_varlen_dropout_at_long_tile_lengths(dtype):
    check_varlen_dropout("sm90", dtype, 256, [1, 130, 0, 77, 300], [1100, 128, 5, 0, 2301])


def check_varlen_dropout(family, dtype, d, lengths_q, lengths_k, h=4):
    fam = require(family, dtype, d)
    g = torch.Generator("cuda").manual_seed(5)
    q = torch.randn(sum(lengths_q), h, d, generator=g, device="cuda", dtype=dtype)
    k = torch.randn(sum(lengths_k), 2, d, generator=g, device="cuda", dtype=dtype)
    v = torch.randn(sum(lengths_k), 2, d, generator=g, device="cuda", dtype=dtype)
    dout = torch.randn_like(q)
    cu_q, cu_k = cu_seqlens(lengths_q), cu_seqlens(lengths_k)
    state = rng_state(9)
    args = (cu_q, cu_k, max(lengths_q), max(lengths_k), None, state, P, d**-0.5, True, -1, -1, 0.0)
    out, lse = call_kernel(OPS.varlen_fwd, q, k, v, *args, fam)
    dq, dk, dv = call_kernel(OPS.varlen_bwd, dout, q, k, v, out, lse, *args, False, fam)
    kw = {"causal": True, "dropout_p": P, "rng_state": state, "dropout_units": dropout_units(fam)}
    f32 = [t.float() for t in (q, k, v, dout)]
    ref, ref_lse = reference.varlen_attention(*f32[:3], cu_q, cu_k, **kw)
    lowp, lowp_lse = reference.varlen_attention(q, k, v, cu_q, cu_k, upcast=False, **kw)
    assert_standard("out", out, ref, lowp, FWD_FACTOR)
    assert_lse(lse, ref_lse, lowp_lse.float())
    ref_g = reference.varlen_attention_bwd(f32[3], *f32[:3], ref, ref_lse, cu_q, cu_k, **kw)
    lowp_g = reference.varlen_attention_bwd(dout, q, k, v, lowp, lowp_lse, cu_q, cu_k, upcast=False, **kw)
    for name, ours, r, lp in zip(("dq", "dk", "dv"), (dq, dk, dv), ref_g, lowp_g):
        assert_standard(name, ours, r, lp, BWD_FACTOR, 1e-4)


@pytest.mark.parametrize("family, dtype", FAMILY_DTYPES)
def test_public_function_and_return_attn_probs(family, dtype):
    # flash_attn_func draws rng_state from the CUDA generator; S_dmask (flash_attn's
    # testing encoding) gives back the mask and the probabilities.
    require(family, dtype, 64)
    g = torch.Generator("cuda").manual_seed(11)
    q, k, v = (torch.randn(2, 150, 4, 64, generator=g, device="cuda", dtype=dtype) for _ in range(3))
    torch.manual_seed(123)
    out, _, s_dmask = flashattn.flash_attn_func(q, k, v, P, causal=True, return_attn_probs=True, family=family)
    assert s_dmask.shape == (2, 4, 256, 256) and s_dmask.dtype == dtype
    keep = s_dmask[..., :150, :150] >= 0
    lse_ref = reference.attention(q.float(), k.float(), v.float(), causal=True)[1]
    # Decode as flash_attn's tests do: |S| exp(running max - lse) over the blocks.
    block = flashattn.interface._get_block_size_n(q.device, 64, True, True)
    scores = torch.einsum("bqhd,bkhd->bhqk", q.float(), k.float()) / 8.0
    visible = reference.visible_mask(150, 150, True, device="cuda")
    scores = scores.masked_fill(~visible, -math.inf)
    blocks = [s.amax(-1) for s in scores.split(block, dim=-1)]
    running = torch.stack(blocks, -1).flip(-1).cummax(-1).values.flip(-1)
    parts = s_dmask[..., :150, :150].float().abs().split(block, dim=-1)
    attn = torch.cat([a * torch.exp(running[..., i, None] - lse_ref[..., None]) for i, a in enumerate(parts)], -1)
    want = torch.softmax(scores, -1)
    assert (attn - want).abs().max().item() < 1e-2
    # The mask the kernel applied: out equals the reference with this mask.
    ref = (torch.where(keep, want, 0.0) / (1 - P)).to(torch.float32)
    ref_out = torch.einsum("bhqk,bkhd->bqhd", ref, v.float())
    lowp_out = torch.einsum("bhqk,bkhd->bqhd", ref.to(dtype), v).float()
    assert_standard("out", out, ref_out, lowp_out, FWD_FACTOR, 1e-3)
    fraction = 1 - keep[visible.expand_as(keep)].float().mean().item()
    assert abs(fraction - P) < 0.01


# ---- reproducibility and statistics


@pytest.mark.parametrize("family, dtype", FAMILY_DTYPES)
def test_same_seed_same_bits_other_seed_other_mask(family, dtype):
    require(family, dtype, 128)
    g = torch.Generator("cuda").manual_seed(12)
    q, k, v = (torch.randn(2, 333, 4, 128, generator=g, device="cuda", dtype=dtype, requires_grad=True)
               for _ in range(3))
    dout = torch.randn(2, 333, 4, 128, generator=g, device="cuda", dtype=dtype)

    def run(seed):
        torch.manual_seed(seed)
        out = flashattn.flash_attn_func(q, k, v, 0.1, causal=True, deterministic=True, family=family)
        return (out, *torch.autograd.grad(out, (q, k, v), dout))

    first, again, other = run(0), run(0), run(1)
    for a, b in zip(first, again):
        assert torch.equal(a, b)
    assert not torch.equal(first[0], other[0])


def test_keep_rates():
    # The mask's statistics (the kernels apply it bit for bit: the readout tests above).
    Units = reference.DropoutUnits
    for p, units in ((0.1, Units(8)), (0.5, Units(8)), (0.1, Units(2)), (0.1, Units(8, True)), (0.5, Units(8, True))):
        mask = reference.dropout_keep_mask(rng_state(20), 4, 8, 1024, 1024, p, units)
        stride = units.paired_row_stride
        keep = reference.dropout_keep_rate(p)
        n = 1024 * 1024
        per_head = mask.float().mean((-1, -2))
        sigma = math.sqrt(keep * (1 - keep) / n)
        assert (per_head - keep).abs().max().item() < 5 * sigma, (p, per_head)
        for dim in (-1, -2):  # rows, columns: binomial spread, no structure
            rates = mask.float().mean(dim)
            spread = math.sqrt(keep * (1 - keep) / 1024)
            assert abs(rates.std().item() / spread - 1) < 0.1, (p, dim, rates.std().item(), spread)
        # Neighbours (same Philox call or not) are uncorrelated.
        x = mask.float() - keep
        for shift in ((0, 1), (1, 0), (0, 4), (0, 8), (stride, 0)):
            corr = (x[..., shift[0]:, shift[1]:] * x[..., : 1024 - shift[0], : 1024 - shift[1]]).mean()
            assert abs(corr.item()) / (keep * (1 - keep)) < 0.01, (p, shift, corr.item())
    assert abs(reference.dropout_keep_rate(0.1) - 0.9) <= 1 / 8192


# ---- CUDA graphs, torch.compile


def test_cuda_graph_replays_draw_new_masks():
    family = 0  # the device's own
    dtype = torch.bfloat16 if torch.cuda.get_device_capability()[0] >= 8 else torch.float16
    g = torch.Generator("cuda").manual_seed(13)
    q, k, v = (torch.randn(2, 256, 4, 64, generator=g, device="cuda", dtype=dtype) for _ in range(3))
    dout = torch.randn_like(q)

    def step():
        state = torch.randint(0, 2**63 - 1, (2,), device="cuda", dtype=torch.int64)
        out, lse = OPS.fwd(q, k, v, None, state, 0.3, 0.125, True, -1, -1, 0.0, family)
        grads = OPS.bwd(dout, q, k, v, out, lse, None, state, 0.3, 0.125, True, -1, -1, 0.0, False, family)
        return state, out, grads

    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        call_kernel(step)  # a build without the device's family and dtype skips
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        state, out, grads = step()
    replays = []
    for _ in range(2):
        graph.replay()
        torch.cuda.synchronize()
        replays.append((state.clone(), out.clone(), [t.clone() for t in grads]))
    assert not torch.equal(replays[0][0], replays[1][0]) and not torch.equal(replays[0][1], replays[1][1])
    for st, o, gr in replays:  # each replay is the eager call with its own rng_state
        eager_out, lse = OPS.fwd(q, k, v, None, st, 0.3, 0.125, True, -1, -1, 0.0, family)
        eager_grads = OPS.bwd(dout, q, k, v, eager_out, lse, None, st, 0.3, 0.125, True, -1, -1, 0.0, False, family)
        assert torch.equal(o, eager_out)
        for a, b in zip(gr, eager_grads):
            torch.testing.assert_close(a, b, rtol=0, atol=1e-2)  # dq adds in any order


def test_torch_compile_fullgraph_with_dropout():
    # Compiled, the draw of rng_state is a traced torch.randint (so a compiled CUDA
    # graph draws anew at each replay); with inductor's fallback_random it is
    # eager's randint: the compiled call equals the ops called with that draw.
    import torch._inductor.config as inductor_config

    dtype = torch.bfloat16 if torch.cuda.get_device_capability()[0] >= 8 else torch.float16
    g = torch.Generator("cuda").manual_seed(14)
    leaves = [torch.randn(2, 200, 4, 64, generator=g, device="cuda", dtype=dtype, requires_grad=True)
              for _ in range(3)]

    def loss(q, k, v):
        return flashattn.flash_attn_func(q, k, v, 0.2, causal=True, deterministic=True).float().square().sum()

    torch.manual_seed(5)
    state = torch.randint(0, 2**63 - 1, (2,), device="cuda", dtype=torch.int64)
    q, k, v = (t.detach() for t in leaves)
    out, lse = call_kernel(OPS.fwd, q, k, v, None, state, 0.2, 0.125, True, -1, -1, 0.0, 0)
    want = out.float().square().sum()
    dout = (2 * out.float()).to(dtype)
    want_grads = OPS.bwd(dout, q, k, v, out, lse, None, state, 0.2, 0.125, True, -1, -1, 0.0, True, 0)
    with inductor_config.patch(fallback_random=True):
        compiled = torch.compile(loss, fullgraph=True)
        torch.manual_seed(5)
        got = compiled(*leaves)
        got_grads = torch.autograd.grad(got, leaves)
        torch.manual_seed(6)
        other = compiled(*leaves)
    torch.testing.assert_close(got, want, rtol=1e-3, atol=1e-3)
    for a, b in zip(got_grads, want_grads):
        torch.testing.assert_close(a, b, rtol=2e-2, atol=2e-2)
    assert not torch.equal(got, other)


# ---- the eager draw: [seed word, offset] claimed on the host


@pytest.mark.parametrize("varlen", [False, True], ids=["dense", "varlen"])
@pytest.mark.parametrize("family, dtype", FAMILY_DTYPES)
def test_host_rng_state_is_the_same_mask_as_on_the_device(family, dtype, varlen):
    # A CPU rng_state reaches the kernels as a parameter, one on q's device through
    # device memory: the same [seed, offset] gives the same bits either way.
    fam = require(family, dtype, 64)
    g = torch.Generator("cuda").manual_seed(16)
    lengths = [77, 0, 200, 1]
    shape = (sum(lengths), 4, 64) if varlen else (2, 150, 4, 64)
    q, k, v, dout = (torch.randn(*shape, generator=g, device="cuda", dtype=dtype) for _ in range(4))
    cu = cu_seqlens(lengths)
    host = torch.tensor([-(2**62) - 12345, 2**63 - 7], dtype=torch.int64)  # the sum wraps past 2^64

    def run(state):
        opts = (None, state, 0.3, 0.125, True, -1, -1, 0.0)
        if varlen:
            out, lse = call_kernel(OPS.varlen_fwd, q, k, v, cu, cu, max(lengths), max(lengths), *opts, fam)
            return out, *OPS.varlen_bwd(dout, q, k, v, out, lse, cu, cu, max(lengths), max(lengths), *opts, True, fam)
        out, lse = call_kernel(OPS.fwd, q, k, v, *opts, fam)
        return out, *OPS.bwd(dout, q, k, v, out, lse, *opts, True, fam)

    for name, a, b in zip(("out", "dq", "dk", "dv"), run(host), run(host.cuda())):
        assert torch.equal(a, b), name


def test_eager_draw_claims_the_generator_offset():
    # An eager call claims [mix(seed), offset] and moves the CUDA generator's offset
    # past the b * heads counters its mask uses: the next call (and every other
    # consumer of the generator) draws past them.
    dtype = torch.bfloat16 if torch.cuda.get_device_capability()[0] >= 8 else torch.float16
    q = torch.randn(3, 64, 6, 64, device="cuda", dtype=dtype)
    gen = torch.cuda.default_generators[q.device.index]
    states = []
    for seed in (7, 7, 8):
        torch.manual_seed(seed)
        first = flashattn.interface._draw_rng_state(0.1, q)
        second = flashattn.interface._draw_rng_state(0.1, q)
        states.append((first, second, gen.get_offset()))
    (a1, a2, off), (b1, b2, _), (c1, _, _) = states
    assert a1.device.type == "cpu" and torch.equal(a1, b1) and torch.equal(a2, b2)
    assert a1[1].item() == 0 and a2[1].item() == 20 and off == 40  # 3 * 6 counters, in multiples of 4
    assert a1[0].item() == a2[0].item() != c1[0].item()
    # Seeds 7 and 8 must not give masks one head apart: their words differ by far more.
    assert abs(c1[0].item() - a1[0].item()) > 2**40
    cu = cu_seqlens([5, 0, 0, 59])
    torch.manual_seed(7)
    flashattn.interface._draw_rng_state(0.1, q.view(-1, 6, 64)[:64], cu)
    assert gen.get_offset() == 24  # 4 sequences * 6 heads


def test_public_call_in_a_cuda_graph_draws_new_masks():
    # Captured, the public function draws rng_state on the device (a host draw would
    # be frozen into the graph): each replay applies another mask.
    dtype = torch.bfloat16 if torch.cuda.get_device_capability()[0] >= 8 else torch.float16
    q, k, v = (torch.randn(2, 256, 4, 64, device="cuda", dtype=dtype) for _ in range(3))
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        call_kernel(flashattn.flash_attn_func, q, k, v, 0.3)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = flashattn.flash_attn_func(q, k, v, 0.3)
    replays = []
    for _ in range(2):
        graph.replay()
        torch.cuda.synchronize()
        replays.append(out.clone())
    assert not torch.equal(replays[0], replays[1])


@pytest.mark.parametrize("family, dtype", FAMILY_DTYPES)
@pytest.mark.parametrize("reentrant", [False, True], ids=["non-reentrant", "reentrant"])
@pytest.mark.parametrize("varlen", [False, True], ids=["dense", "varlen"])
def test_activation_checkpointing_recomputes_the_same_mask(family, dtype, reentrant, varlen):
    # torch.utils.checkpoint (a model's gradient_checkpointing) runs the forward again
    # in the backward, with the RNG state restored: the recomputed dropout mask must be
    # the first one, so the gradients equal those without checkpointing, bit for bit.
    from torch.utils.checkpoint import checkpoint

    require(family, dtype, 64)
    g = torch.Generator("cuda").manual_seed(15)
    lengths = [77, 0, 200, 1]
    cu = cu_seqlens(lengths)
    shape = (sum(lengths), 4, 64) if varlen else (2, 150, 4, 64)
    q, k, v, dout = (torch.randn(*shape, generator=g, device="cuda", dtype=dtype) for _ in range(4))

    def attention(q, k, v):
        if varlen:
            return flashattn.flash_attn_varlen_func(q, k, v, cu, cu, max(lengths), max(lengths), 0.25, causal=True,
                                                    deterministic=True, family=family)
        return flashattn.flash_attn_func(q, k, v, 0.25, causal=True, deterministic=True, family=family)

    def grads(checkpointed):
        leaves = [t.clone().requires_grad_() for t in (q, k, v)]
        torch.manual_seed(21)
        if checkpointed:
            out = checkpoint(attention, *leaves, use_reentrant=reentrant)
        else:
            out = attention(*leaves)
        out.backward(dout)  # not autograd.grad: the reentrant form takes .backward only
        return [out.detach(), *(t.grad for t in leaves)]

    plain = call_kernel(grads, False)
    for name, got, want in zip(("out", "dq", "dk", "dv"), grads(True), plain):
        assert torch.equal(got, want), f"{name} differs under activation checkpointing"


# ---- end to end: training with dropout beside SDPA with dropout


def test_training_with_dropout_follows_sdpa():
    # Both drop 10% of the attention probabilities with their own masks: the curves
    # differ by the masks' noise only (measured: below the bounds here by ~3x).
    from test_bwd_gpu import _train

    dtype = torch.bfloat16 if torch.cuda.get_device_capability()[0] >= 8 else torch.float16
    require("sm80" if dtype == torch.bfloat16 else "sm75", dtype, 64)

    def ours(qkv):
        return flashattn.flash_attn_qkvpacked_func(qkv.to(dtype), 0.1, causal=True).float()

    def sdpa(qkv):
        q, k, v = (t.transpose(1, 2).to(dtype) for t in qkv.unbind(2))
        out = F.scaled_dot_product_attention(q, k, v, dropout_p=0.1, is_causal=True)
        return out.transpose(1, 2).float()

    a, b = call_kernel(_train, ours), _train(sdpa)
    assert all(math.isfinite(x) for x in a) and a[-1] < a[0]
    diffs = [abs(x - y) for x, y in zip(a, b)]
    tail = abs(sum(a[-10:]) - sum(b[-10:])) / 10
    assert max(diffs) < 0.1 and tail < 0.03, f"loss curves differ (max {max(diffs):.3f}, tail {tail:.3f}): {a} vs {b}"
