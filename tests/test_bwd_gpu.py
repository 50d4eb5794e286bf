"""Backward correctness of the CUDA kernels (DESIGN.md's standard), per kernel family.

dq, dk, dv of every family with a backward kernel, against the analytic fp32
reference (reference.attention_bwd) from the same inputs; the yardstick is the same
math in the input dtype. Bound: 3x that error + 1e-4. Outputs are NaN-poisoned, inputs
fresh randn. Also: deterministic mode, GQA without expanded gradients, autograd through
the public API (packed variants too), torch.compile with inductor, and a short training
run against PyTorch SDPA.
"""

import math

import flashattn
import pytest
import torch
import torch.nn.functional as F
from _gpu import call_kernel
from _standard import BWD_FACTOR, assert_standard
from flashattn import _dispatch, reference
from test_fwd_gpu import FAMILY_DTYPES, HEAD_DIMS, HEADS, SEQLEN_PAIRS, make_qkv, require

pytestmark = pytest.mark.gpu

OPS = torch.ops.flashattn
BWD_EPS = 1e-4


@pytest.fixture(autouse=True)
def _exact_fp32_reference(monkeypatch):
    monkeypatch.setattr(torch.backends.cuda.matmul, "allow_tf32", False)
    monkeypatch.setattr(torch.backends.cudnn, "allow_tf32", False)


def reference_grads(dout, q, k, v, upcast, **kwargs):
    """(dq, dk, dv) of reference attention: fp32 with upcast, else in the input dtype."""
    cast = (lambda t: t.float()) if upcast else (lambda t: t)
    qc, kc, vc, doc = (cast(t) for t in (q, k, v, dout))
    out, lse = reference.attention(qc, kc, vc, upcast=upcast, **kwargs)
    return reference.attention_bwd(doc, qc, kc, vc, out, lse, upcast=upcast, **kwargs)


def check_backward(q, k, v, family, causal=False, window=(-1, -1), softcap=0.0, alibi=None,
                   dout=None, seed=0):
    """fwd, then bwd_out (into NaN-poisoned dq/dk/dv) and bwd; both to the standard."""
    scale = 1.0 / math.sqrt(q.shape[-1])
    args = (alibi, None, 0.0, scale, causal, window[0], window[1], softcap)
    out, lse = call_kernel(OPS.fwd, q, k, v, *args, family)
    if dout is None:
        g = torch.Generator("cuda").manual_seed(seed + 1000)
        dout = torch.randn(q.shape, generator=g, device="cuda", dtype=q.dtype)
    grads = [torch.full_like(t, float("nan")) for t in (q, k, v)]
    call_kernel(OPS.bwd_out, dout, q, k, v, out, lse, *grads, *args, False, family)
    grads2 = call_kernel(OPS.bwd, dout, q, k, v, out, lse, *args, False, family)

    kwargs = {
        "softmax_scale": scale,
        "causal": causal,
        "window_size": window,
        "softcap": softcap,
        "alibi_slopes": alibi,
    }
    ref = reference_grads(dout, q, k, v, upcast=True, **kwargs)
    lowp = reference_grads(dout, q, k, v, upcast=False, **kwargs)
    for run, ours in (("bwd_out", grads), ("bwd", grads2)):
        for name, g_ours, g_ref, g_lowp, like in zip(("dq", "dk", "dv"), ours, ref, lowp, (q, k, v)):
            assert g_ours.dtype == like.dtype and g_ours.shape == like.shape
            assert_standard(f"{run} {name}", g_ours, g_ref, g_lowp, BWD_FACTOR, BWD_EPS)
    return grads


def run_case(family, dtype, d, s_q, s_k, causal, h_k, seed=0):
    fam = require(family, dtype, d)
    b = 2 if max(s_q, s_k) <= 1024 else 1
    q, k, v = make_qkv(b, s_q, s_k, HEADS, h_k, d, dtype, seed)
    check_backward(q, k, v, fam, causal=causal, seed=seed)


# ---- the default slice


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("s_q, s_k", [(128, 128), (255, 113)])
@pytest.mark.parametrize("d", HEAD_DIMS)
@pytest.mark.parametrize("family, dtype", FAMILY_DTYPES)
def test_head_dims(family, dtype, d, s_q, s_k, causal):
    run_case(family, dtype, d, s_q, s_k, causal, h_k=HEADS)


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("s_q, s_k", SEQLEN_PAIRS)
@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("family, dtype", FAMILY_DTYPES)
def test_seqlens(family, dtype, d, s_q, s_k, causal):
    run_case(family, dtype, d, s_q, s_k, causal, h_k=HEADS)


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("s_q, s_k", [(113, 255), (1024, 1024), (255, 17)])
@pytest.mark.parametrize("h_k", [2, 1])
@pytest.mark.parametrize("family, dtype", FAMILY_DTYPES)
def test_gqa(family, dtype, h_k, s_q, s_k, causal):
    run_case(family, dtype, 128, s_q, s_k, causal, h_k=h_k)


@pytest.mark.parametrize("kv_layout", ["bshd", "bhsd"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("family, dtype", FAMILY_DTYPES)
def test_gqa_group_shared_over_ctas(family, dtype, causal, kv_layout):
    """A key-block grid of one wave (on any GPU of >= 24 SMs) whose CTAs would each run
    the 8 query heads of the group: the host shares the heads out over several CTAs
    per key block and adds their partial dk, dv (ops.cpp, choose_kv_head_splits), also
    into dk, dv with k's and v's (b, h, s, d) memory order."""
    fam = require(family, dtype, 128)
    q, k, v = make_qkv(1, 1536, 1536, HEADS, 1, 128, dtype, seed=5)
    if kv_layout == "bhsd":
        k, v = (t.transpose(1, 2).contiguous().transpose(1, 2) for t in (k, v))
    dk, dv = check_backward(q, k, v, fam, causal=causal)[1:]
    assert dk.stride() == k.stride() and dv.stride() == v.stride()


FEATURES = {
    "window": {"window": (64, 16)},
    "window_causal": {"window": (32, -1), "causal": True},
    "window_left_only": {"window": (100, -1)},
    "softcap": {"softcap": 5.0, "causal": True},
    "softcap_small": {"softcap": 0.5},
    "alibi_bh": {"alibi": "bh"},
    "alibi_h_causal": {"alibi": "h", "causal": True},
    "all_together": {"softcap": 30.0, "alibi": "bh", "window": (40, 8)},
}


@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("feature", FEATURES)
@pytest.mark.parametrize("family, dtype", FAMILY_DTYPES)
def test_features(family, dtype, feature, d):
    fam = require(family, dtype, d)
    q, k, v = make_qkv(2, 200, 300, HEADS, 2, d, dtype, seed=3)
    kwargs = dict(FEATURES[feature])
    if "alibi" in kwargs:
        slopes = torch.rand(2, HEADS, device="cuda")
        kwargs["alibi"] = slopes if kwargs["alibi"] == "bh" else slopes[0].contiguous()
    check_backward(q, k, v, fam, **kwargs)


@pytest.mark.parametrize("d", [8, 24, 136, 200, 248])
def test_head_dims_inside_buckets(d):
    family = f"sm{_dispatch.resolve_family(torch.device('cuda'), torch.float16)}"
    fam = require(family, torch.float16, d)
    q, k, v = make_qkv(2, 130, 77, HEADS, 4, d, torch.float16, seed=11)
    check_backward(q, k, v, fam, causal=True)


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("family, dtype", FAMILY_DTYPES)
def test_packed_views_in_and_out(family, dtype, causal):
    # q, k, v and dq, dk, dv as views of packed (b, s, 3, h, d) tensors; dout strided too.
    d = 64
    fam = require(family, dtype, d)
    g = torch.Generator("cuda").manual_seed(2)
    qkv = torch.randn(2, 255, 3, HEADS, d, generator=g, device="cuda", dtype=dtype)
    q, k, v = qkv.unbind(2)
    dout = torch.randn(2, 255, HEADS, 2 * d, generator=g, device="cuda", dtype=dtype)[..., :d]
    scale = d**-0.5
    args = (None, None, 0.0, scale, causal, -1, -1, 0.0)
    out, lse = call_kernel(OPS.fwd, q, k, v, *args, fam)
    dqkv = torch.full_like(qkv, float("nan"))
    call_kernel(OPS.bwd_out, dout, q, k, v, out, lse, *dqkv.unbind(2), *args, False, fam)
    kwargs = {"softmax_scale": scale, "causal": causal}
    ref = reference_grads(dout, q, k, v, upcast=True, **kwargs)
    lowp = reference_grads(dout, q, k, v, upcast=False, **kwargs)
    for name, ours, r, lp in zip(("dq", "dk", "dv"), dqkv.unbind(2), ref, lowp):
        assert_standard(name, ours, r, lp, BWD_FACTOR, BWD_EPS)


@pytest.mark.parametrize("family, dtype", FAMILY_DTYPES)
def test_gradients_come_back_in_the_inputs_layout(family, dtype):
    # q, k, v as (b, s, h, d) views of (b, h, s, d)-contiguous tensors (what a rotary
    # embedding's output is, transposed back): bwd returns dq, dk, dv in that memory
    # order, as torch.empty_like and flash_attn 2.x do, so that autograd need not copy
    # them into a leaf's strides; contiguous inputs keep contiguous gradients. Values
    # to the standard.
    d = 64
    fam = require(family, dtype, d)
    g = torch.Generator("cuda").manual_seed(3)
    leaves = [torch.randn(2, HEADS, 200, d, generator=g, device="cuda", dtype=dtype) for _ in range(3)]
    q, k, v = (t.transpose(1, 2) for t in leaves)
    dout = torch.randn(2, 200, HEADS, d, generator=g, device="cuda", dtype=dtype)
    scale = d**-0.5
    args = (None, None, 0.0, scale, True, -1, -1, 0.0)
    out, lse = call_kernel(OPS.fwd, q, k, v, *args, fam)
    grads = call_kernel(OPS.bwd, dout, q, k, v, out, lse, *args, False, fam)
    kwargs = {"softmax_scale": scale, "causal": True}
    ref = reference_grads(dout, q, k, v, upcast=True, **kwargs)
    lowp = reference_grads(dout, q, k, v, upcast=False, **kwargs)
    for name, ours, like, r, lp in zip(("dq", "dk", "dv"), grads, (q, k, v), ref, lowp):
        assert ours.stride() == like.stride(), f"{name} strides {ours.stride()}, input {like.stride()}"
        assert_standard(name, ours, r, lp, BWD_FACTOR, BWD_EPS)
    contiguous = [t.contiguous() for t in (q, k, v)]
    out, lse = call_kernel(OPS.fwd, *contiguous, *args, fam)
    for ours in call_kernel(OPS.bwd, dout, *contiguous, out, lse, *args, False, fam):
        assert ours.is_contiguous()
    # Through the public API's autograd, into the leaves.
    leaves = [t.clone().requires_grad_(True) for t in leaves]
    flashattn.flash_attn_func(*(t.transpose(1, 2) for t in leaves), causal=True, family=family).backward(dout)
    for name, leaf, r, lp in zip(("dq", "dk", "dv"), leaves, ref, lowp):
        assert leaf.grad.stride() == leaf.stride()
        assert_standard(name, leaf.grad.transpose(1, 2), r, lp, BWD_FACTOR, BWD_EPS)


def test_rows_that_see_no_key_get_zero_gradients():
    # s_q > s_k with causal: the first s_q - s_k rows see nothing (out 0, lse +inf).
    family = f"sm{_dispatch.resolve_family(torch.device('cuda'), torch.float16)}"
    fam = require(family, torch.float16, 64)
    q, k, v = make_qkv(1, 300, 100, HEADS, HEADS, 64, torch.float16, seed=21)
    dq = check_backward(q, k, v, fam, causal=True)[0]
    assert (dq[:, :200] == 0).all()


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_zero_softmax_scale(causal):
    # Uniform attention over the visible keys; masked keys must not turn into NaN.
    dtype, d = torch.float16, 64
    fam = require(_family_for(dtype), dtype, d)
    q, k, v = make_qkv(2, 130, 100, HEADS, 2, d, dtype, seed=22)
    dout = torch.randn_like(q)
    args = (None, None, 0.0, 0.0, causal, -1, -1, 0.0)
    out, lse = call_kernel(OPS.fwd, q, k, v, *args, fam)
    dq, dk, dv = call_kernel(OPS.bwd, dout, q, k, v, out, lse, *args, False, fam)
    kwargs = {"softmax_scale": 0.0, "causal": causal}
    ref, _ = reference.attention(q.float(), k.float(), v.float(), **kwargs)
    lowp, _ = reference.attention(q, k, v, upcast=False, **kwargs)
    assert_standard("out", out, ref, lowp, 2.0)
    ref_g = reference_grads(dout, q, k, v, upcast=True, **kwargs)
    lowp_g = reference_grads(dout, q, k, v, upcast=False, **kwargs)
    for name, ours, r, lp in zip(("dq", "dk", "dv"), (dq, dk, dv), ref_g, lowp_g):
        assert_standard(name, ours, r, lp, BWD_FACTOR, BWD_EPS)


# ---- deterministic mode


DETERMINISTIC_CASES = {
    "full": {"s": (1024, 1024), "h_k": HEADS},
    "causal": {"s": (1024, 1024), "h_k": HEADS, "causal": True},
    "causal_gqa8": {"s": (2048, 2048), "h_k": 1, "causal": True},
    # 16 (head, sequence) pairs, 256-512 key blocks: on an A100 or H100 one to four
    # waves, which the causal order runs as one section (tile_scheduler.h)
    "causal_one_section": {"s": (2048, 2048), "h_k": HEADS, "causal": True},
    # 48 pairs, 768-1536 key blocks, more than four waves there: L2 sections of
    # fewer pairs than there are
    "causal_sections": {"s": (2048, 2048), "h": 24, "h_k": 24, "causal": True},
    "window_sq_lt_sk": {"s": (300, 1000), "h_k": 2, "window": (128, 32)},
    "sq_gt_sk_causal": {"s": (1000, 300), "h_k": 4, "causal": True},
}


@pytest.mark.parametrize("d", [64, 128, 256])
@pytest.mark.parametrize("case", DETERMINISTIC_CASES)
@pytest.mark.parametrize("family, dtype", FAMILY_DTYPES)
def test_deterministic_is_bitwise_reproducible(family, dtype, case, d):
    fam = require(family, dtype, d)
    c = DETERMINISTIC_CASES[case]
    s_q, s_k = c["s"]
    q, k, v = make_qkv(2, s_q, s_k, c.get("h", HEADS), c["h_k"], d, dtype, seed=31)
    scale = d**-0.5
    window = c.get("window", (-1, -1))
    args = (None, None, 0.0, scale, c.get("causal", False), window[0], window[1], 0.0)
    out, lse = call_kernel(OPS.fwd, q, k, v, *args, fam)
    dout = torch.randn_like(q)
    runs = [call_kernel(OPS.bwd, dout, q, k, v, out, lse, *args, True, fam) for _ in range(3)]
    for later in runs[1:]:
        for name, a, b in zip(("dq", "dk", "dv"), runs[0], later):
            assert torch.equal(a, b), f"deterministic {name} differs between runs"
    # and it is the right answer
    kwargs = {"softmax_scale": scale, "causal": c.get("causal", False), "window_size": window}
    ref = reference_grads(dout, q, k, v, upcast=True, **kwargs)
    lowp = reference_grads(dout, q, k, v, upcast=False, **kwargs)
    for name, ours, r, lp in zip(("dq", "dk", "dv"), runs[0], ref, lowp):
        assert_standard(name, ours, r, lp, BWD_FACTOR, BWD_EPS)


# ---- the full grid


@pytest.mark.slow
@pytest.mark.parametrize("h_k", (8, 2, 1))
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("s_q, s_k", SEQLEN_PAIRS)
@pytest.mark.parametrize("d", HEAD_DIMS)
@pytest.mark.parametrize("family, dtype", FAMILY_DTYPES)
def test_full_grid(family, dtype, d, s_q, s_k, causal, h_k):
    run_case(family, dtype, d, s_q, s_k, causal, h_k=h_k)


# ---- autograd through the public API


def _family_for(dtype):
    return f"sm{_dispatch.resolve_family(torch.device('cuda'), dtype)}"


@pytest.mark.parametrize("d", [40, 64, 100])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_flash_attn_func_backward(dtype, d):
    # Gradients through .backward(); d = 40 is a bucket's inside, d = 100 is padded to 104.
    require(_family_for(dtype), dtype, d + (-d % 8))
    q, k, v = (t.requires_grad_() for t in make_qkv(2, 150, 170, HEADS, 2, d, dtype, seed=41))
    dout = torch.randn_like(q)
    out = call_kernel(flashattn.flash_attn_func, q, k, v, causal=True)
    out.backward(dout)
    kwargs = {"softmax_scale": d**-0.5, "causal": True}
    ref = reference_grads(dout, q.detach(), k.detach(), v.detach(), upcast=True, **kwargs)
    lowp = reference_grads(dout, q.detach(), k.detach(), v.detach(), upcast=False, **kwargs)
    for name, t, r, lp in zip(("dq", "dk", "dv"), (q, k, v), ref, lowp):
        assert_standard(name, t.grad, r, lp, BWD_FACTOR, BWD_EPS)


def test_packed_functions_backward():
    dtype, d = torch.float16, 64
    require(_family_for(dtype), dtype, d)
    g = torch.Generator("cuda").manual_seed(42)
    qkv = torch.randn(2, 190, 3, HEADS, d, generator=g, device="cuda", dtype=dtype)
    qkv.requires_grad_()
    dout = torch.randn(2, 190, HEADS, d, generator=g, device="cuda", dtype=dtype)
    call_kernel(flashattn.flash_attn_qkvpacked_func, qkv, causal=True).backward(dout)
    q, k, v = (t.detach() for t in qkv.unbind(2))
    kwargs = {"softmax_scale": d**-0.5, "causal": True}
    ref = reference_grads(dout, q, k, v, upcast=True, **kwargs)
    lowp = reference_grads(dout, q, k, v, upcast=False, **kwargs)
    for name, ours, r, lp in zip(("dq", "dk", "dv"), qkv.grad.unbind(2), ref, lowp):
        assert_standard(f"qkvpacked {name}", ours, r, lp, BWD_FACTOR, BWD_EPS)

    q = q.clone().requires_grad_()
    kv = torch.stack((k, v), dim=2)[:, :, :, :2].clone().requires_grad_()  # GQA: h_k = 2
    call_kernel(flashattn.flash_attn_kvpacked_func, q, kv, causal=True).backward(dout)
    k2, v2 = kv.detach().unbind(2)
    ref = reference_grads(dout, q.detach(), k2, v2, upcast=True, **kwargs)
    lowp = reference_grads(dout, q.detach(), k2, v2, upcast=False, **kwargs)
    for name, ours, r, lp in zip(("dq", "dk", "dv"), (q.grad, *kv.grad.unbind(2)), ref, lowp):
        assert_standard(f"kvpacked {name}", ours, r, lp, BWD_FACTOR, BWD_EPS)


def test_deterministic_flag_reaches_the_kernel():
    dtype, d = torch.bfloat16, 128
    require(_family_for(dtype), dtype, d)
    q, k, v = make_qkv(1, 1024, 1024, HEADS, 1, d, dtype, seed=43)
    dout = torch.randn_like(q)
    grads = []
    for _ in range(3):
        leaves = [t.clone().requires_grad_() for t in (q, k, v)]
        call_kernel(flashattn.flash_attn_func, *leaves, causal=True, deterministic=True).backward(
            dout
        )
        grads.append([t.grad for t in leaves])
    for later in grads[1:]:
        for a, b in zip(grads[0], later):
            assert torch.equal(a, b)


def test_torch_compile_inductor_forward_backward():
    # fullgraph=True: flash_attn_func and the loss trace into one graph; its backward
    # (our bwd op) is compiled by AOTAutograd with inductor and run by .backward().
    dtype, d = torch.bfloat16, 64
    require(_family_for(dtype), dtype, d)

    def loss(q, k, v):
        out = flashattn.flash_attn_func(q * 1.5, k, v, causal=True)
        return (out.float() ** 2).sum()

    leaves = [t.requires_grad_() for t in make_qkv(2, 96, 160, HEADS, 2, d, dtype, seed=44)]
    want_loss = loss(*leaves)
    want = torch.autograd.grad(want_loss, leaves)
    torch._dynamo.reset()
    got_loss = torch.compile(loss, fullgraph=True)(*leaves)
    got = torch.autograd.grad(got_loss, leaves)
    torch.testing.assert_close(got_loss, want_loss, rtol=1e-3, atol=1e-3)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=2e-2, atol=2e-2)


# ---- end to end: a small transformer trained with flashattn and with SDPA


class TinyTransformer(torch.nn.Module):
    def __init__(self, attend, vocab=256, dim=256, heads=4, layers=2):
        super().__init__()
        self.attend, self.heads = attend, heads
        self.embed = torch.nn.Embedding(vocab, dim)
        self.blocks = torch.nn.ModuleList()
        for _ in range(layers):
            self.blocks.append(
                torch.nn.ModuleDict(
                    {
                        "norm1": torch.nn.LayerNorm(dim),
                        "qkv": torch.nn.Linear(dim, 3 * dim),
                        "proj": torch.nn.Linear(dim, dim),
                        "norm2": torch.nn.LayerNorm(dim),
                        "mlp": torch.nn.Sequential(
                            torch.nn.Linear(dim, 4 * dim), torch.nn.GELU(), torch.nn.Linear(4 * dim, dim)
                        ),
                    }
                )
            )
        self.head = torch.nn.Linear(dim, vocab)

    def forward(self, tokens):
        x = self.embed(tokens)
        b, s, dim = x.shape
        for blk in self.blocks:
            qkv = blk["qkv"](blk["norm1"](x)).view(b, s, 3, self.heads, dim // self.heads)
            x = x + blk["proj"](self.attend(qkv).reshape(b, s, dim))
            x = x + blk["mlp"](blk["norm2"](x))
        return self.head(x)


def _attend_flashattn(qkv):
    return flashattn.flash_attn_qkvpacked_func(qkv.bfloat16(), causal=True).float()


def _attend_sdpa(qkv):
    q, k, v = (t.transpose(1, 2).bfloat16() for t in qkv.unbind(2))
    with torch.nn.attention.sdpa_kernel(torch.nn.attention.SDPBackend.FLASH_ATTENTION):
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    return out.transpose(1, 2).float()


def _train(attend, steps=50):
    torch.manual_seed(0)
    model = TinyTransformer(attend).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    g = torch.Generator("cuda").manual_seed(1)
    data = torch.randint(0, 256, (steps, 8, 129), generator=g, device="cuda")
    losses = []
    for step in range(steps):
        tokens = data[step]
        logits = model(tokens[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), tokens[:, 1:].reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def test_training_matches_sdpa():
    # Same seed, same data, bf16 attention: flashattn's loss curve must follow SDPA's.
    require(_family_for(torch.bfloat16), torch.bfloat16, 64)
    ours = call_kernel(_train, _attend_flashattn)
    theirs = _train(_attend_sdpa)
    diffs = [abs(a - b) for a, b in zip(ours, theirs)]
    assert all(math.isfinite(x) for x in ours)
    assert ours[-1] < ours[0], f"the loss did not go down: {ours[0]:.3f} -> {ours[-1]:.3f}"
    assert max(diffs) < 0.02, f"loss curves differ by up to {max(diffs):.4f}: {ours} vs {theirs}"


# ---- scores in the thousands


LARGE_SCORE_CASES = {
    # The case an independent test found: MQA decode, d = 24, 4097 keys.
    "mqa_decode": dict(b=1, s_q=1, s_k=4097, h=16, h_k=1, d=24, causal=False),
    "mqa_decode_d64": dict(b=1, s_q=1, s_k=4097, h=16, h_k=1, d=64, causal=False),
    "gqa_causal": dict(b=2, s_q=200, s_k=333, h=8, h_k=2, d=64, causal=True),
    "d128": dict(b=1, s_q=130, s_k=1030, h=4, h_k=4, d=128, causal=False),
}


@pytest.mark.parametrize("case", LARGE_SCORE_CASES)
@pytest.mark.parametrize("family, dtype", FAMILY_DTYPES)
def test_large_scores(family, dtype, case):
    # q and k scaled by 20: scores in the thousands. The backward recomputes P from
    # the forward's lse, so the lse must be as accurate as fp32 allows (an lse off by
    # 3.7e-3, as the rescaling across key blocks once made it, is P off by 0.37%),
    # and P in the backward must match the forward's. Yardsticks: the fp64
    # reference; PyTorch's math in fp32 (rounded to the dtype) and in the dtype.
    c = LARGE_SCORE_CASES[case]
    fam = require(family, dtype, c["d"])
    q, k, v = make_qkv(c["b"], c["s_q"], c["s_k"], c["h"], c["h_k"], c["d"], dtype, seed=7)
    q, k = q * 20, k * 20
    g = torch.Generator("cuda").manual_seed(8)
    dout = torch.randn(q.shape, generator=g, device="cuda", dtype=dtype)
    scale = 1.0 / math.sqrt(c["d"])
    args = (None, None, 0.0, scale, c["causal"], -1, -1, 0.0)
    out = torch.full_like(q, float("nan"))
    lse = call_kernel(OPS.fwd_out, q, k, v, out, *args, fam)
    grads = [torch.full_like(t, float("nan")) for t in (q, k, v)]
    call_kernel(OPS.bwd_out, dout, q, k, v, out, lse, *grads, *args, False, fam)

    kw = {"softmax_scale": scale, "causal": c["causal"]}
    qd, kd, vd, dod = (t.double() for t in (q, k, v, dout))
    ref_out, ref_lse = reference.attention(qd, kd, vd, **kw)
    ref = reference.attention_bwd(dod, qd, kd, vd, ref_out, ref_lse, **kw)
    # lse: a few fp32 spacings of its magnitude (it is ~max score * scale)
    lse_err = (lse.double() - ref_lse).abs().max().item()
    lse_bound = 8 * torch.finfo(torch.float32).eps * ref_lse.abs().max().item()
    assert lse_err <= lse_bound, f"lse error {lse_err:.2e} > {lse_bound:.2e}"
    # out and dv depend on P alone: within 3x fp32 math's error (rounded to the dtype).
    fp32_out = reference.attention(q.float(), k.float(), v.float(), **kw)[0].to(dtype)
    fp32_dv = reference_grads(dout, q, k, v, upcast=True, **kw)[2].to(dtype)
    assert_standard("out", out, ref_out, fp32_out, BWD_FACTOR, 1e-4)
    assert_standard("dv", grads[2], ref[2], fp32_dv, BWD_FACTOR, 1e-4)
    # dq, dk: the standard with flash_attn's overflow-test epsilon.
    lowp = reference_grads(dout, q, k, v, upcast=False, **kw)
    for name, ours, r, lp in zip(("dq", "dk"), grads[:2], ref[:2], lowp[:2]):
        assert_standard(name, ours, r, lp, BWD_FACTOR, 1e-3)
