"""Varlen on the CPU: the reference, the ops (opcheck, fake kernels, autograd,
torch.compile) and the public functions' argument checks. No GPU needed."""

import flashattn
import pytest
import torch
import torch.nn.functional as F
from flashattn import FlashAttnError, reference

OPS = torch.ops.flashattn


def cu_seqlens(lengths):
    return F.pad(torch.tensor(lengths).cumsum(0, dtype=torch.int32), (1, 0))


def make(lengths_q, lengths_k, h=4, h_k=2, d=16, dtype=torch.float64, requires_grad=False, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(sum(lengths_q), h, d, generator=g, dtype=dtype)
    k = torch.randn(sum(lengths_k), h_k, d, generator=g, dtype=dtype)
    v = torch.randn(sum(lengths_k), h_k, d, generator=g, dtype=dtype)
    return tuple(t.requires_grad_(requires_grad) for t in (q, k, v))


LQ, LK = [5, 0, 1, 9, 3], [7, 3, 0, 9, 1]
OPTS = {
    "plain": (None, None, 0.0, 0.25, False, -1, -1, 0.0),
    "causal_softcap": (None, None, 0.0, 0.3, True, -1, -1, 2.0),
    "window_alibi_bh": (torch.rand(5, 4), None, 0.0, 0.25, False, 2, 1, 0.0),
    "dropout": (None, torch.tensor([5, 0]), 0.2, 0.25, True, -1, -1, 0.0),
}


def _varlen_args():
    return (cu_seqlens(LQ), cu_seqlens(LK), max(LQ), max(LK))


@pytest.mark.parametrize("causal", [False, True])
def test_reference_is_dense_attention_per_sequence(causal):
    q, k, v = make(LQ, LK)
    cu_q, cu_k = cu_seqlens(LQ), cu_seqlens(LK)
    out, lse = reference.varlen_attention(q, k, v, cu_q, cu_k, causal=causal, window_size=(3, -1))
    assert out.shape == q.shape and lse.shape == (4, sum(LQ))
    for i in range(len(LQ)):
        rq, rk = slice(cu_q[i], cu_q[i + 1]), slice(cu_k[i], cu_k[i + 1])
        if LQ[i] == 0:
            continue
        if LK[i] == 0:
            assert (out[rq] == 0).all() and torch.isinf(lse[:, rq]).all()
            continue
        want, want_lse = reference.attention(q[None, rq], k[None, rk], v[None, rk], causal=causal,
                                             window_size=(3, -1))
        torch.testing.assert_close(out[rq], want[0], rtol=0, atol=0)
        torch.testing.assert_close(lse[:, rq], want_lse[0], rtol=0, atol=0)


@pytest.mark.parametrize("variant", OPTS)
def test_opcheck_varlen_fwd(variant):
    q, k, v = make(LQ, LK, dtype=torch.float32, requires_grad=True)
    torch.library.opcheck(OPS.varlen_fwd.default, (q, k, v, *_varlen_args(), *OPTS[variant], 0))


@pytest.mark.parametrize("variant", OPTS)
def test_opcheck_varlen_fwd_out(variant):
    q, k, v = make(LQ, LK, dtype=torch.float32)
    args = (q, k, v, *_varlen_args(), torch.empty_like(q), *OPTS[variant], 0)
    torch.library.opcheck(OPS.varlen_fwd_out.default, args)


@pytest.mark.parametrize("deterministic", [False, True])
@pytest.mark.parametrize("variant", OPTS)
def test_opcheck_varlen_bwd(variant, deterministic):
    q, k, v = make(LQ, LK, dtype=torch.float32)
    out, lse = OPS.varlen_fwd(q, k, v, *_varlen_args(), *OPTS[variant], 0)
    args = (torch.randn_like(out), q, k, v, out, lse, *_varlen_args(), *OPTS[variant], deterministic, 0)
    torch.library.opcheck(OPS.varlen_bwd.default, args)
    grads = tuple(torch.empty_like(t) for t in (q, k, v))
    args = (torch.randn_like(out), q, k, v, out, lse, *_varlen_args(), *grads, *OPTS[variant], deterministic, 0)
    torch.library.opcheck(OPS.varlen_bwd_out.default, args)


def test_fake_shapes():
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        qkv = torch.empty(50, 3, 4, 16, dtype=torch.float16, device="cuda")
        q, k, v = qkv.unbind(1)
        cu = torch.empty(4, dtype=torch.int32, device="cuda")
        out, lse = OPS.varlen_fwd(q, k, v, cu, cu, 30, 30, None, None, 0.0, 0.25, True, -1, -1, 0.0, 80)
        assert out.shape == q.shape and out.is_contiguous() and lse.shape == (4, 50)
        dq, dk, dv = OPS.varlen_bwd(out, q, k, v, out, lse, cu, cu, 30, 30, None, None, 0.0, 0.25, True, -1, -1,
                                    0.0, False, 80)
        for grad, like in ((dq, q), (dk, k), (dv, v)):
            assert grad.shape == like.shape and grad.is_contiguous()


def test_public_function_gradients_match_reference():
    q, k, v = make(LQ, LK, requires_grad=True)
    cu_q, cu_k = cu_seqlens(LQ), cu_seqlens(LK)
    out, lse, _ = flashattn.flash_attn_varlen_func(q, k, v, cu_q, cu_k, max(LQ), max(LK), causal=True,
                                                   softcap=3.0, return_attn_probs=True)
    dout = torch.randn_like(out)
    out.backward(dout)
    want = reference.varlen_attention_bwd(dout, q.detach(), k.detach(), v.detach(), out.detach(), lse,
                                          cu_q, cu_k, softmax_scale=16**-0.5, causal=True, softcap=3.0)
    for t, w in zip((q, k, v), want):
        torch.testing.assert_close(t.grad, w)


def test_gradcheck():
    q, k, v = make([3, 0, 4], [2, 2, 5], d=8, requires_grad=True)
    cu_q, cu_k = cu_seqlens([3, 0, 4]), cu_seqlens([2, 2, 5])

    def f(q, k, v):
        return flashattn.flash_attn_varlen_func(q, k, v, cu_q, cu_k, 4, 5, causal=True, window_size=(1, -1))

    assert torch.autograd.gradcheck(f, (q, k, v))


def test_packed_variants_are_views():
    lengths = [4, 6]
    cu = cu_seqlens(lengths)
    g = torch.Generator().manual_seed(1)
    qkv = torch.randn(10, 3, 2, 8, generator=g, dtype=torch.float64)
    q, k, v = qkv.unbind(1)
    want = flashattn.flash_attn_varlen_func(q, k, v, cu, cu, 6, 6, causal=True)
    got = flashattn.flash_attn_varlen_qkvpacked_func(qkv, cu, 6, causal=True)
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    got = flashattn.flash_attn_varlen_kvpacked_func(q, qkv[:, 1:], cu, cu, 6, 6, causal=True)
    torch.testing.assert_close(got, want, rtol=0, atol=0)


def test_max_seqlen_as_a_tensor_and_head_dim_padding():
    # transformers passes max_seqlen as a 0-dim tensor; d = 12 is padded to 16.
    q, k, v = make([3, 5], [3, 5], d=12)
    cu = cu_seqlens([3, 5])
    got = flashattn.flash_attn_varlen_func(q, k, v, cu, cu, torch.tensor(5), torch.tensor(5))
    want, _ = reference.varlen_attention(q, k, v, cu, cu)
    torch.testing.assert_close(got, want)


def test_compile_fullgraph_cpu():
    q, k, v = make(LQ, LK, dtype=torch.float32)
    cu_q, cu_k = cu_seqlens(LQ), cu_seqlens(LK)

    def f(q, k, v):
        return flashattn.flash_attn_varlen_func(q * 2, k, v, cu_q, cu_k, max(LQ), max(LK), causal=True)

    torch.testing.assert_close(torch.compile(f, fullgraph=True, backend="eager")(q, k, v), f(q, k, v))


def _bad(**changes):
    q, k, v = make(LQ, LK, dtype=torch.float32)
    args = {"q": q, "k": k, "v": v, "cu_seqlens_q": cu_seqlens(LQ), "cu_seqlens_k": cu_seqlens(LK),
            "max_seqlen_q": max(LQ), "max_seqlen_k": max(LK)}
    args.update(changes)
    return args


BAD = {
    "cu_int64": ({"cu_seqlens_q": cu_seqlens(LQ).long()}, "torch.int32"),
    "cu_float": ({"cu_seqlens_k": cu_seqlens(LK).float()}, "torch.int32"),
    "cu_2d": ({"cu_seqlens_q": cu_seqlens(LQ)[None]}, "1-D"),
    "cu_lengths_differ": ({"cu_seqlens_k": cu_seqlens(LK[:-1])}, "both are (batch + 1,)"),
    "cu_strided": ({"cu_seqlens_q": torch.zeros(12, dtype=torch.int32)[::2]}, "contiguous"),
    "max_too_small": ({"max_seqlen_q": 2}, "smaller than the longest sequence"),
    "max_negative": ({"max_seqlen_k": -1}, "max_seqlen_k must be an int >= 0"),
    "q_4d": ({"q": torch.zeros(1, 18, 4, 16)}, "must be 3-D"),
    "head_dim_differs": ({"k": torch.zeros(20, 2, 8), "v": torch.zeros(20, 2, 8)}, "head dim"),
    "gqa_ratio": ({"k": torch.zeros(20, 3, 16), "v": torch.zeros(20, 3, 16)}, "not a multiple"),
    "kv_shape": ({"v": torch.zeros(21, 2, 16)}, "one shape"),
    "head_dim_over_256": ({"q": torch.zeros(18, 4, 264), "k": torch.zeros(20, 2, 264),
                           "v": torch.zeros(20, 2, 264)}, "over the maximum"),
    "int_q": ({"q": torch.zeros(18, 4, 16, dtype=torch.int32)}, "dtype"),
}


@pytest.mark.parametrize("case", BAD)
def test_bad_inputs_get_clear_errors(case):
    changes, message = BAD[case]
    with pytest.raises(FlashAttnError, match=message.replace("(", r"\(").replace(")", r"\)").replace("+", r"\+")):
        flashattn.flash_attn_varlen_func(**_bad(**changes))


def test_block_table_needs_pages():
    with pytest.raises(FlashAttnError, match="block_table, k holds the KV cache's pages"):
        flashattn.flash_attn_varlen_func(**_bad(), block_table=torch.zeros(5, 1, dtype=torch.int32))


def test_alibi_shape_names_the_batch():
    with pytest.raises(FlashAttnError, match=r"\(batch, heads\) = \(5, 4\)"):
        flashattn.flash_attn_varlen_func(**_bad(), alibi_slopes=torch.zeros(4, 4))
