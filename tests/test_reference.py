"""flashattn.reference against a naive float64 loop written from docs/ops.md."""

import math

import pytest
import torch
from flashattn import reference
from hypothesis import given
from hypothesis import strategies as st


def naive_attention(q, k, v, scale, causal, window, softcap, alibi):
    """One query row at a time, in float64, straight from the rules in docs/ops.md."""
    q, k, v = q.double(), k.double(), v.double()
    b, s_q, h, d = q.shape
    s_k, h_k = k.shape[1], k.shape[2]
    left, right = window
    if causal:
        right = 0
    out = torch.zeros(b, s_q, h, d, dtype=torch.float64)
    lse = torch.full((b, h, s_q), math.inf, dtype=torch.float64)
    for bi in range(b):
        for hi in range(h):
            kh = hi // (h // h_k)
            for i in range(s_q):
                keys = [
                    j
                    for j in range(s_k)
                    if (right < 0 or j <= i + s_k - s_q + right)
                    and (left < 0 or j >= i + s_k - s_q - left)
                ]
                if not keys:
                    continue  # sees no key: out 0, lse +inf
                scores = torch.stack([q[bi, i, hi] @ k[bi, j, kh] for j in keys]) * scale
                if softcap > 0:
                    scores = softcap * torch.tanh(scores / softcap)
                if alibi is not None:
                    slope = (alibi[hi] if alibi.dim() == 1 else alibi[bi, hi]).double()
                    scores = scores - slope * torch.tensor(
                        [abs(i + s_k - s_q - j) for j in keys], dtype=torch.float64
                    )
                lse[bi, hi, i] = torch.logsumexp(scores, 0)
                probs = torch.softmax(scores, 0)
                out[bi, i, hi] = sum(p * v[bi, j, kh] for p, j in zip(probs, keys))
    return out, lse


@st.composite
def problems(draw):
    b = draw(st.integers(1, 2))
    s_q = draw(st.sampled_from([1, 2, 5, 9, 16]))
    s_k = draw(st.sampled_from([1, 3, 5, 8, 13]))
    h_k = draw(st.integers(1, 2))
    h = h_k * draw(st.sampled_from([1, 2, 3]))
    d = draw(st.sampled_from([3, 8, 16, 20]))
    alibi = draw(st.sampled_from([None, "h", "bh"]))
    return {
        "shape": (b, s_q, h, h_k, s_k, d),
        "causal": draw(st.booleans()),
        "window": (draw(st.sampled_from([-1, 0, 1, 4])), draw(st.sampled_from([-1, 0, 2]))),
        "softcap": draw(st.sampled_from([0.0, 0.7, 5.0])),
        "alibi": alibi,
        "scale": draw(st.sampled_from([None, 0.3])),
        "seed": draw(st.integers(0, 2**31 - 1)),
    }


def make_inputs(shape, alibi, seed, dtype=torch.float64):
    b, s_q, h, h_k, s_k, d = shape
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(b, s_q, h, d, generator=g, dtype=dtype)
    k = torch.randn(b, s_k, h_k, d, generator=g, dtype=dtype)
    v = torch.randn(b, s_k, h_k, d, generator=g, dtype=dtype)
    slopes = None
    if alibi is not None:
        slopes = torch.rand((h,) if alibi == "h" else (b, h), generator=g)
    return q, k, v, slopes


@given(problems())
def test_reference_matches_naive_loop(p):
    q, k, v, slopes = make_inputs(p["shape"], p["alibi"], p["seed"])
    kwargs = {
        "causal": p["causal"],
        "window_size": p["window"],
        "softcap": p["softcap"],
        "alibi_slopes": slopes,
    }
    out, lse = reference.attention(q, k, v, p["scale"], **kwargs)
    scale = p["scale"] or q.shape[-1] ** -0.5
    want_out, want_lse = naive_attention(
        q, k, v, scale, p["causal"], p["window"], p["softcap"], slopes
    )
    assert out.dtype == torch.float64 and lse.dtype == torch.float64
    torch.testing.assert_close(out, want_out, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(lse, want_lse, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_reference_upcast_returns_input_dtype(dtype):
    q, k, v, _ = make_inputs((2, 7, 4, 2, 9, 16), None, 0, dtype)
    out, lse = reference.attention(q, k, v, causal=True)
    assert out.dtype == dtype and lse.dtype == torch.float32
    want_out, want_lse = naive_attention(q, k, v, 0.25, True, (-1, -1), 0.0, None)
    torch.testing.assert_close(
        out.double(), want_out, rtol=0, atol=1e-2 if dtype != torch.float32 else 1e-5
    )
    torch.testing.assert_close(lse.double(), want_lse, rtol=0, atol=1e-5)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_reference_low_precision_is_close_but_not_exact(dtype):
    q, k, v, _ = make_inputs((1, 64, 2, 2, 64, 32), None, 1, dtype)
    out, lse = reference.attention(q, k, v, upcast=False)
    assert out.dtype == dtype
    exact, exact_lse = reference.attention(q, k, v)
    err = (out.float() - exact.float()).abs().max().item()
    assert 0 < err < 0.05
    assert (lse.float() - exact_lse).abs().max().item() < 0.1


def test_gqa_uses_head_i_over_group():
    # 6 query heads over 2 kv heads: heads 0-2 read kv head 0, heads 3-5 kv head 1.
    q, k, v, _ = make_inputs((1, 4, 6, 2, 5, 8), None, 2)
    out, _ = reference.attention(q, k, v)
    for i in range(6):
        single, _ = reference.attention(
            q[:, :, i : i + 1], k[:, :, i // 3 : i // 3 + 1], v[:, :, i // 3 : i // 3 + 1]
        )
        torch.testing.assert_close(out[:, :, i : i + 1], single)


def test_causal_bottom_right_fully_masked_rows():
    # s_q = 7 > s_k = 4: query i sees keys j <= i - 3, so rows 0-2 see nothing.
    q, k, v, _ = make_inputs((1, 7, 2, 1, 4, 8), None, 3)
    out, lse = reference.attention(q, k, v, causal=True)
    assert (out[:, :3] == 0).all()
    assert torch.isinf(lse[:, :, :3]).all() and (lse[:, :, :3] > 0).all()
    assert torch.isfinite(lse[:, :, 3:]).all()
    # The last row sees every key: plain softmax over all of them.
    scores = torch.einsum("hd,khd->hk", q[0, 6], k[0].expand(-1, 2, -1)) * 8**-0.5
    torch.testing.assert_close(lse[0, :, 6], torch.logsumexp(scores, -1))
    # Row 3 sees key 0 alone: its output is v[0].
    torch.testing.assert_close(out[0, 3], v[0, 0].expand(2, -1))


def test_causal_s_q_less_than_s_k_sees_prefix():
    # s_q = 2 < s_k = 5: query 0 sees keys 0..3, query 1 sees all five.
    q, k, v, _ = make_inputs((1, 2, 1, 1, 5, 8), None, 4)
    out, _ = reference.attention(q, k, v, causal=True)
    first, _ = reference.attention(q[:, :1], k[:, :4], v[:, :4])
    torch.testing.assert_close(out[:, :1], first)
    last, _ = reference.attention(q[:, 1:], k, v)
    torch.testing.assert_close(out[:, 1:], last)


def test_visible_mask_window():
    m = reference.visible_mask(3, 5, window_size=(1, 0))
    # diagonal of query i is key i + 2; it sees keys i + 1 .. i + 2.
    want = torch.tensor([[0, 1, 1, 0, 0], [0, 0, 1, 1, 0], [0, 0, 0, 1, 1]], dtype=torch.bool)
    assert torch.equal(m, want)
    assert torch.equal(
        reference.visible_mask(3, 5, causal=True, window_size=(-1, 4)),
        reference.visible_mask(3, 5, window_size=(-1, 0)),
    )


def _rng(seed, offset=0):
    return torch.tensor([seed, offset], dtype=torch.int64)


def test_dropout_same_state_same_mask():
    q, k, v, _ = make_inputs((1, 16, 2, 2, 16, 8), None, 5, torch.float32)
    a, lse_a = reference.attention(q, k, v, dropout_p=0.3, rng_state=_rng(7))
    b, lse_b = reference.attention(q, k, v, dropout_p=0.3, rng_state=_rng(7))
    c, _ = reference.attention(q, k, v, dropout_p=0.3, rng_state=_rng(7, 1))
    nodrop, lse = reference.attention(q, k, v)
    assert torch.equal(a, b)
    assert not torch.equal(a, c) and not torch.equal(a, nodrop)
    # lse is of the undropped scores
    assert torch.equal(lse_a, lse) and torch.equal(lse_b, lse)


def test_dropout_zero_is_no_dropout():
    q, k, v, _ = make_inputs((1, 8, 2, 2, 8, 8), None, 6, torch.float32)
    out, _ = reference.attention(q, k, v, dropout_p=0.0, rng_state=_rng(1))
    assert torch.equal(out, reference.attention(q, k, v)[0])


def test_dropout_preserves_the_mean():
    # Uniform attention over identical values: each output is mean(keep) / (1 - p) * v.
    b, s, h, d = 4, 64, 4, 8
    q = torch.zeros(b, s, h, d)
    k = torch.zeros(b, s, h, d)
    v = torch.ones(b, s, h, d)
    out, _ = reference.attention(q, k, v, dropout_p=0.25, rng_state=_rng(3))
    assert abs(out.mean().item() - 1.0) < 0.02
    assert out.std().item() > 0.01  # the mask did something
