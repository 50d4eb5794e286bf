"""Dropout's definition, on the CPU: the Philox generator against its published known
answers, the mask's structure and rates, the CPU path's forward and backward using one
mask, and flash_attn's S_dmask encoding (return_attn_probs) decoded as its tests do."""

import math

import flashattn
import pytest
import torch
from flashattn import reference


def _words(*values):
    return [torch.tensor(v, dtype=torch.int64) for v in values]


@pytest.mark.parametrize(
    "key, counter, want",
    [
        # Random123's kat_vectors for Philox4x32-10.
        ((0, 0), (0, 0, 0, 0), (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8)),
        ((0xFFFFFFFF,) * 2, (0xFFFFFFFF,) * 4, (0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD)),
        ((0xA4093822, 0x299F31D0), (0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344),
         (0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1)),
    ],
)
def test_philox_known_answers(key, counter, want):
    got = reference.philox4x32(tuple(_words(*key)), _words(*counter), rounds=10)
    assert [int(x) for x in got] == list(want)


def test_mask_is_a_function_of_coordinates():
    state = torch.tensor([2**62 + 12345, 2**63 - 7])  # offset + b * h + h wraps past 2^64
    whole = reference.dropout_keep_mask(state, 2, 3, 70, 90, 0.2)
    # Sequence 1 as a batch of one: offset + 1 * heads.
    one = reference.dropout_keep_mask(state + torch.tensor([0, 3]), 1, 3, 70, 90, 0.2)
    assert torch.equal(whole[1:], one)
    part = reference.dropout_keep_mask(state, 2, 3, 40, 50, 0.2)
    assert torch.equal(whole[..., :40, :50], part)
    other = reference.dropout_keep_mask(state + torch.tensor([1, 0]), 2, 3, 70, 90, 0.2)
    assert not torch.equal(whole, other)
    assert not torch.equal(whole[0, 0], whole[0, 1])


@pytest.mark.parametrize("p", [0.0, 0.01, 0.17, 0.5, 0.9])
def test_keep_rate(p):
    mask = reference.dropout_keep_mask(torch.tensor([7, 11]), 2, 4, 512, 512, p)
    keep = reference.dropout_keep_rate(p)
    assert abs(keep - (1 - p)) <= 1 / 8192
    n = mask.numel()
    assert abs(mask.float().mean().item() - keep) < 5 * math.sqrt(keep * (1 - keep) / n) + 1e-12


def test_keep_rate_rounds_as_the_kernels_host_code():
    # cpp/ops.cpp rounds (1 - p) 4096 with std::lround, halves away from zero: at
    # p = 3/8192 that is 4094.5 -> 4095, where Python's round() gives 4094, so the
    # CPU path's mask would differ from the GPU's in the dithered bytes.
    assert reference.dropout_keep_rate(3 / 8192) == 4095 / 4096
    assert reference.dropout_keep_rate(1 / 8192) == 1.0
    # Thresholds of 256 (p below 1/8192) keep every byte.
    assert reference.dropout_keep_mask(torch.tensor([5, 6]), 1, 2, 64, 64, 1e-4).all()


def test_cpu_forward_and_backward_share_the_mask():
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 33, 4, 16, generator=g, dtype=torch.float64) for _ in range(3))
    state = torch.tensor([99, 5])
    mask = reference.dropout_keep_mask(state, 2, 4, 33, 33, 0.3).double()
    out, lse = torch.ops.flashattn.fwd(q, k, v, None, state, 0.3, 0.25, True, -1, -1, 0.0, 0)
    scores = torch.einsum("bqhd,bkhd->bhqk", q, k) * 0.25
    scores = scores.masked_fill(~reference.visible_mask(33, 33, True), -math.inf)
    probs = torch.softmax(scores, -1)
    want = torch.einsum("bhqk,bkhd->bqhd", probs * mask / 0.7, v)
    torch.testing.assert_close(out, want)
    qg, kg, vg = (t.clone().requires_grad_() for t in (q, k, v))
    dropped = torch.einsum("bhqk,bkhd->bqhd", torch.softmax(
        (torch.einsum("bqhd,bkhd->bhqk", qg, kg) * 0.25).masked_fill(~reference.visible_mask(33, 33, True), -math.inf),
        -1) * mask / 0.7, vg)
    dout = torch.randn_like(q)
    want_grads = torch.autograd.grad(dropped, (qg, kg, vg), dout)
    grads = torch.ops.flashattn.bwd(dout, q, k, v, out, lse, None, state, 0.3, 0.25, True, -1, -1, 0.0, False, 0)
    for a, b in zip(grads, want_grads):  # the op's lse is fp32 (its schema), hence rtol
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_return_attn_probs_decodes_as_flash_attn_tests_do():
    torch.manual_seed(3)
    q, k, v = (torch.randn(1, 100, 2, 64) for _ in range(3))
    out, lse, s_dmask = flashattn.flash_attn_func(q, k, v, 0.2, causal=True, return_attn_probs=True)
    assert s_dmask.shape == (1, 2, 128, 128)
    block = flashattn.interface._get_block_size_n(q.device, 64, True, True)
    scores = torch.einsum("bqhd,bkhd->bhqk", q, k) / 8.0
    visible = reference.visible_mask(100, 100, True)
    scores = scores.masked_fill(~visible, -math.inf)
    running = torch.stack([s.amax(-1) for s in scores.split(block, -1)], -1).flip(-1).cummax(-1).values.flip(-1)
    parts = s_dmask[..., :100, :100].abs().split(block, -1)
    attn = torch.cat([a * torch.exp(running[..., i, None] - lse[..., None]) for i, a in enumerate(parts)], -1)
    probs = torch.softmax(scores, -1)
    torch.testing.assert_close(attn, probs, rtol=1e-4, atol=1e-6)
    keep = s_dmask[..., :100, :100] >= 0
    want = torch.einsum("bhqk,bkhd->bqhd", torch.where(keep, probs, 0.0) / 0.8, v)
    torch.testing.assert_close(out, want, rtol=1e-4, atol=1e-5)
    assert (s_dmask[..., 100:, :] == 0).all() and (s_dmask[..., :, 100:] == 0).all()


def test_without_dropout_there_is_no_s_dmask():
    q = torch.randn(1, 10, 2, 16)
    assert flashattn.flash_attn_func(q, q, q, return_attn_probs=True)[2] is None


@pytest.mark.parametrize("stride, lane_units", [(8, False), (2, False), (8, True)], ids=["row_pair_units", "sm70", "sm75_sm80_sm90"])
def test_mask_is_each_units_call(stride, lane_units):
    # kernel/dropout.h: element (i, j) takes byte k = (j % 8 // 2) * 4 + (i // s % 2) *
    # 2 + j % 2 of the call (j // 8, row pair, lo, hi) (a row pair's 8 columns), or
    # with the sm75/sm80/sm90 lane units byte k = (j // 8 % 4) * 4 + (i // s % 2) * 2 + j % 2 of
    # the call (lo, j // 32 * 4 + j % 8 // 2, hi, row pair) (one lane's 16 elements):
    # a scalar emulation, element by element.
    state = torch.tensor([987654321, 2**40 + 3])
    p = 0.3
    mask = reference.dropout_keep_mask(state, 2, 2, 40, 100, p, reference.DropoutUnits(stride, lane_units))
    keep16 = math.floor((1 - p) * 4096 + 0.5)  # std::lround, as cpp/ops.cpp rounds it
    zero = torch.zeros((), dtype=torch.int64)
    for b, h, i, j in [(0, 0, 0, 0), (1, 1, 9, 37), (0, 1, 17, 95), (1, 0, 39, 64), (1, 1, 31, 99), (0, 0, 3, 6)]:
        base = (987654321 + 2**40 + 3 + b * 2 + h) % 2**64
        group = j // 32 * 4 + j % 8 // 2 if lane_units else j // 8
        row_pair = (i // (2 * stride)) * stride + i % stride
        lo, hi = base & 0xFFFFFFFF, base >> 32
        counter = _words(lo, group, hi, row_pair) if lane_units else _words(group, row_pair, lo, hi)
        words = [int(w) for w in reference.philox4x32((zero, zero), counter)]
        k = (j // 8 % 4 if lane_units else j % 8 // 2) * 4 + (i // stride % 2) * 2 + j % 2
        byte = (words[k // 4] >> (8 * (k % 4))) & 0xFF
        assert bool(mask[b, h, i, j]) == (byte < keep16 // 16 + (k < keep16 % 16)), (b, h, i, j)


def test_dropout_units_accept_a_row_stride():
    # An int is a row stride without lane units (the argument's old form).
    state = torch.tensor([987654321, 2**40 + 3])
    assert torch.equal(reference.dropout_keep_mask(state, 2, 2, 40, 100, 0.3, 2),
                       reference.dropout_keep_mask(state, 2, 2, 40, 100, 0.3, reference.DropoutUnits(2, lane_units=False)))


def _element_wise_keep_mask(rng_state, batch, heads, seqlen_q, seqlen_k, dropout_p, units):
    """kernel/dropout.h's definition evaluated element by element (every element
    makes its own call): what dropout_keep_mask, which makes each call once, must equal."""
    s = units.paired_row_stride
    i, j = torch.arange(seqlen_q), torch.arange(seqlen_k)
    bh = torch.arange(batch * heads).view(batch, heads, 1, 1)
    base = rng_state[0] + rng_state[1] + bh
    if units.lane_units:
        group, byte_col = (j // 32 * 4 + j % 8 // 2).view(1, 1, 1, -1), j // 8 % 4 * 4 + j % 2
    else:
        group, byte_col = (j // 8).view(1, 1, 1, -1), j % 8 // 2 * 4 + j % 2
    row_pair = ((i // (2 * s)) * s + i % s).view(1, 1, -1, 1)
    shape = (batch, heads, seqlen_q, seqlen_k)
    lo, hi = base & 0xFFFFFFFF, (base >> 32) & 0xFFFFFFFF
    counter = (lo, group, hi, row_pair) if units.lane_units else (group, row_pair, lo, hi)
    zero = torch.zeros((), dtype=torch.int64)
    x = reference.philox4x32((zero, zero), [c.expand(shape) for c in counter])
    byte = byte_col.view(1, -1) + ((i // s) % 2 * 2).view(-1, 1)
    word = torch.gather(torch.stack(x, -1), -1, (byte // 4).expand(shape).unsqueeze(-1)).squeeze(-1)
    keep16 = math.floor((1 - dropout_p) * 4096 + 0.5)
    return ((word >> ((byte % 4) * 8)) & 0xFF) < keep16 // 16 + (byte < keep16 % 16).to(torch.int64)


UNIT_KINDS = [reference.DropoutUnits(8, True), reference.DropoutUnits(8, False), reference.DropoutUnits(2, False)]
MASK_SHAPES = [(2, 3, 70, 90), (1, 2, 1, 1), (1, 1, 17, 33), (2, 1, 16, 32), (1, 2, 129, 257), (1, 1, 31, 7),
               (1, 1, 0, 5), (1, 1, 5, 0), (0, 2, 8, 8)]


@pytest.mark.parametrize("units", UNIT_KINDS, ids=["lane_units", "row_pair_units", "sm70"])
@pytest.mark.parametrize("shape", MASK_SHAPES)
def test_mask_makes_each_call_once_with_the_definitions_bits(units, shape):
    # Calls made once per (row pair, group) and gathered must give the element-wise
    # definition's bits, at lengths on and off the 2s rows and 32 (8) columns of a unit,
    # with a seed whose sum with the offset wraps past 2^63.
    states = [torch.tensor([987654321, 2**40 + 3]), torch.tensor([2**62 + 5, 2**62 + 7]), torch.tensor([3, 0])]
    for state, p in zip(states, [0.3, 0.1, 0.999]):
        got = reference.dropout_keep_mask(state, *shape, p, units)
        assert got.shape == shape and got.dtype == torch.bool
        assert torch.equal(got, _element_wise_keep_mask(state, *shape, p, units)), (state, p)
