"""The analytic backward (reference.attention_bwd, the CPU bwd op) against autograd."""

import flashattn
import pytest
import torch
from flashattn import reference
from hypothesis import given
from hypothesis import strategies as st


def differentiable_attention(q, k, v, scale, causal, window, softcap, alibi):
    """Plain float64 attention for autograd; rows that see no key give 0 without NaN."""
    _b, s_q, h, _d = q.shape
    s_k, h_k = k.shape[1], k.shape[2]
    k = k.repeat_interleave(h // h_k, dim=2)
    v = v.repeat_interleave(h // h_k, dim=2)
    scores = torch.einsum("bqhd,bkhd->bhqk", q, k) * scale
    if softcap > 0:
        scores = softcap * torch.tanh(scores / softcap)
    if alibi is not None:
        i = torch.arange(s_q)[:, None]
        j = torch.arange(s_k)[None, :]
        slopes = alibi.double().view(-1, h, 1, 1)
        scores = scores - slopes * (i + s_k - s_q - j).abs()
    visible = reference.visible_mask(s_q, s_k, causal, window)
    row_sees = visible.any(-1, keepdim=True)
    scores = scores.masked_fill(~visible, float("-inf")).masked_fill(~row_sees, 0.0)
    probs = torch.softmax(scores, -1) * row_sees
    return torch.einsum("bhqk,bkhd->bqhd", probs, v)


@st.composite
def problems(draw):
    h_k = draw(st.integers(1, 2))
    return {
        "b": draw(st.integers(1, 2)),
        "s_q": draw(st.sampled_from([1, 4, 9])),
        "s_k": draw(st.sampled_from([1, 3, 8])),
        "h_k": h_k,
        "h": h_k * draw(st.sampled_from([1, 2])),
        "d": draw(st.sampled_from([8, 12])),
        "causal": draw(st.booleans()),
        "window": (draw(st.sampled_from([-1, 0, 2])), draw(st.sampled_from([-1, 1]))),
        "softcap": draw(st.sampled_from([0.0, 1.5])),
        "alibi": draw(st.booleans()),
        "seed": draw(st.integers(0, 2**31 - 1)),
    }


@given(problems())
def test_analytic_backward_matches_autograd(p):
    g = torch.Generator().manual_seed(p["seed"])
    b, s_q, s_k, h, h_k, d = p["b"], p["s_q"], p["s_k"], p["h"], p["h_k"], p["d"]
    q = torch.randn(b, s_q, h, d, generator=g, dtype=torch.float64, requires_grad=True)
    k = torch.randn(b, s_k, h_k, d, generator=g, dtype=torch.float64, requires_grad=True)
    v = torch.randn(b, s_k, h_k, d, generator=g, dtype=torch.float64, requires_grad=True)
    dout = torch.randn(b, s_q, h, d, generator=g, dtype=torch.float64)
    alibi = torch.rand(b, h, generator=g) if p["alibi"] else None
    args = (0.4, p["causal"], p["window"], p["softcap"], alibi)

    out = differentiable_attention(q, k, v, *args)
    want = torch.autograd.grad(out, (q, k, v), dout)
    ref_out, lse = reference.attention(q.detach(), k.detach(), v.detach(), *args)
    torch.testing.assert_close(ref_out, out.detach(), rtol=1e-10, atol=1e-10)
    got = reference.attention_bwd(dout, q.detach(), k.detach(), v.detach(), ref_out, lse, *args)
    for name, x, y in zip("qkv", got, want):
        torch.testing.assert_close(x, y, rtol=1e-9, atol=1e-9, msg=f"d{name}")


def test_fully_masked_rows_get_zero_grads():
    # s_q = 6 > s_k = 2, causal: rows 0-3 see no key.
    q, k, v = (torch.randn(1, s, 2, 8, requires_grad=True) for s in (6, 2, 2))
    out = flashattn.flash_attn_func(q, k, v, causal=True)
    out.backward(torch.randn_like(out))
    for t in (q, k, v):
        assert torch.isfinite(t.grad).all()
    assert (q.grad[:, :4] == 0).all()


def test_dropout_backward_matches_autograd_with_the_same_mask():
    # The mask of rng_state is fixed, so the dropped forward is differentiable in q, k, v.
    g = torch.Generator().manual_seed(0)
    q, k, v = (
        torch.randn(1, 6, 2, 8, generator=g, dtype=torch.float64, requires_grad=True)
        for _ in range(3)
    )
    rng = torch.tensor([11, 4])
    out, lse = reference.attention(q, k, v, dropout_p=0.4, rng_state=rng)
    dout = torch.randn_like(out)
    want = torch.autograd.grad(out, (q, k, v), dout)
    got = reference.attention_bwd(
        dout, q.detach(), k.detach(), v.detach(), out.detach(), lse, dropout_p=0.4, rng_state=rng
    )
    for x, y in zip(got, want):
        torch.testing.assert_close(x, y, rtol=1e-9, atol=1e-9)


def _inputs(b, s_q, s_k, h, h_k, d, seed=0):
    g = torch.Generator().manual_seed(seed)
    return tuple(
        torch.randn(b, s, heads, d, generator=g, dtype=torch.float64, requires_grad=True)
        for s, heads in ((s_q, h), (s_k, h_k), (s_k, h_k))
    )


GRADCHECK_CASES = {
    "plain": ({}, (1, 3, 4, 2, 2, 8)),
    "causal": ({"causal": True}, (1, 4, 3, 2, 2, 8)),
    "causal_masked_rows": ({"causal": True}, (1, 5, 2, 1, 1, 8)),
    "gqa": ({"causal": True}, (2, 3, 4, 4, 2, 8)),
    "window": ({"window_size": (1, 0)}, (1, 4, 5, 2, 1, 8)),
    "softcap": ({"softcap": 0.8}, (1, 3, 4, 2, 2, 8)),
    "alibi": ({"alibi_slopes": torch.tensor([0.5, 0.25])}, (1, 3, 4, 2, 1, 8)),
    "padded_d20": ({"causal": True}, (1, 3, 4, 2, 1, 20)),
}


@pytest.mark.parametrize("case", GRADCHECK_CASES)
def test_gradcheck_flash_attn_func(case):
    kwargs, shape = GRADCHECK_CASES[case]
    q, k, v = _inputs(*shape)
    assert torch.autograd.gradcheck(
        lambda q, k, v: flashattn.flash_attn_func(q, k, v, **kwargs), (q, k, v)
    )
