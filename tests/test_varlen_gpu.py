"""Varlen (packed sequences of different lengths) on the CUDA kernels, per family.

Every case packs fresh randn sequences, runs varlen_fwd_out / varlen_bwd_out into
NaN-poisoned outputs and holds out, lse, dq, dk, dv to DESIGN.md's standard against
the fp32 reference computed per sequence (reference.varlen_attention). Also: the
varlen path equals the dense path bitwise on equal lengths, deterministic mode,
opcheck of every op on CUDA tensors, torch.compile, offsets past 2^31 elements.
"""

import math

import flashattn
import pytest
import torch
import torch.nn.functional as F
from _gpu import call_kernel
from _standard import BWD_FACTOR, FWD_FACTOR, assert_lse, assert_standard
from flashattn import _dispatch, reference
from test_fwd_gpu import FAMILY_DTYPES, require

pytestmark = pytest.mark.gpu

OPS = torch.ops.flashattn
BWD_EPS = 1e-4
HEADS = 8


@pytest.fixture(autouse=True)
def _exact_fp32_reference(monkeypatch):
    monkeypatch.setattr(torch.backends.cuda.matmul, "allow_tf32", False)
    monkeypatch.setattr(torch.backends.cudnn, "allow_tf32", False)


def cu_seqlens(lengths):
    return F.pad(torch.tensor(lengths, device="cuda").cumsum(0, dtype=torch.int32), (1, 0))


def make_varlen(lengths_q, lengths_k, h, h_k, d, dtype, seed):
    g = torch.Generator("cuda").manual_seed(seed)
    q = torch.randn(sum(lengths_q), h, d, generator=g, device="cuda", dtype=dtype)
    k = torch.randn(sum(lengths_k), h_k, d, generator=g, device="cuda", dtype=dtype)
    v = torch.randn(sum(lengths_k), h_k, d, generator=g, device="cuda", dtype=dtype)
    return q, k, v


def reference_varlen(q, k, v, dout, cu_q, cu_k, upcast, **kwargs):
    """(out, lse, dq, dk, dv) per sequence: fp32 with upcast, else the input dtype's math."""
    cast = (lambda t: t.float()) if upcast else (lambda t: t)
    qc, kc, vc, doc = (cast(t) for t in (q, k, v, dout))
    out, lse = reference.varlen_attention(qc, kc, vc, cu_q, cu_k, upcast=upcast, **kwargs)
    grads = reference.varlen_attention_bwd(doc, qc, kc, vc, out, lse, cu_q, cu_k, upcast=upcast, **kwargs)
    return (out, lse, *grads)


def check_varlen(family, lengths_q, lengths_k, d, dtype, h_k=HEADS, causal=False, window=(-1, -1),
                 softcap=0.0, alibi=None, deterministic=False, seed=0, backward=True):
    fam = require(family, dtype, d)
    q, k, v = make_varlen(lengths_q, lengths_k, HEADS, h_k, d, dtype, seed)
    cu_q, cu_k = cu_seqlens(lengths_q), cu_seqlens(lengths_k)
    max_q, max_k = max(lengths_q), max(lengths_k)
    if alibi == "h":
        alibi = torch.rand(HEADS, device="cuda") * 0.3
    elif alibi == "bh":
        alibi = torch.rand(len(lengths_q), HEADS, device="cuda") * 0.3
    scale = 1.0 / math.sqrt(d)
    opts = (alibi, None, 0.0, scale, causal, window[0], window[1], softcap)
    varlen = (cu_q, cu_k, max_q, max_k)

    out = torch.full_like(q, float("nan"))
    lse = call_kernel(OPS.varlen_fwd_out, q, k, v, *varlen, out, *opts, fam)
    out2, lse2 = call_kernel(OPS.varlen_fwd, q, k, v, *varlen, *opts, fam)
    assert torch.equal(out, out2) and torch.equal(lse, lse2)
    assert lse.shape == (HEADS, q.shape[0]) and lse.dtype == torch.float32

    kwargs = {"softmax_scale": scale, "causal": causal, "window_size": window, "softcap": softcap,
              "alibi_slopes": alibi}
    g = torch.Generator("cuda").manual_seed(seed + 1000)
    dout = torch.randn(q.shape, generator=g, device="cuda", dtype=dtype)
    ref = reference_varlen(q, k, v, dout, cu_q, cu_k, upcast=True, **kwargs)
    lowp = reference_varlen(q, k, v, dout, cu_q, cu_k, upcast=False, **kwargs)
    assert_standard("out", out, ref[0], lowp[0], FWD_FACTOR)
    assert_lse(lse, ref[1], lowp[1].float())
    if not backward:
        return
    grads = [torch.full_like(t, float("nan")) for t in (q, k, v)]
    call_kernel(OPS.varlen_bwd_out, dout, q, k, v, out, lse, *varlen, *grads, *opts, deterministic, fam)
    for name, ours, r, lp in zip(("dq", "dk", "dv"), grads, ref[2:], lowp[2:]):
        assert_standard(name, ours, r, lp, BWD_FACTOR, BWD_EPS)
    if deterministic:
        again = call_kernel(OPS.varlen_bwd, dout, q, k, v, out, lse, *varlen, *opts, True, fam)
        for ours, second in zip(grads, again):
            assert torch.equal(ours, second), "deterministic backward differs between two runs"


MIXED = [0, 1, 7, 128, 2925, 4097]
LENGTHS = {
    "mixed": (MIXED, MIXED),
    "q_ne_k": ([5, 128, 300, 0, 1, 77], [17, 100, 300, 4, 0, 1000]),
    "one": ([1000], [1000]),
    "short_many": ([(i * 37) % 61 for i in range(150)], [(i * 53) % 67 for i in range(150)]),
}


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("lengths", LENGTHS)
@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("family, dtype", FAMILY_DTYPES)
def test_varlen(family, dtype, d, lengths, causal):
    lengths_q, lengths_k = LENGTHS[lengths]
    check_varlen(family, lengths_q, lengths_k, d, dtype, causal=causal)


@pytest.mark.parametrize("family, dtype", FAMILY_DTYPES)
def test_varlen_thousands_of_sequences(family, dtype):
    # 2500 sequences (many empty): the tile scheduler's search over cu_seqlens takes
    # three rounds; one long sequence among them leaves most (sequence, tile) pairs empty.
    lengths_q = [(i * 7919) % 23 for i in range(2500)] + [700]
    lengths_k = [(i * 104729) % 29 for i in range(2500)] + [900]
    check_varlen(family, lengths_q, lengths_k, 64, dtype, causal=True, h_k=2)


@pytest.mark.parametrize("d", [32, 96, 160, 256])
@pytest.mark.parametrize("family, dtype", FAMILY_DTYPES)
def test_varlen_head_dims(family, dtype, d):
    check_varlen(family, [3, 200, 129], [300, 64, 129], d, dtype, causal=True)


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("family, dtype", FAMILY_DTYPES)
def test_varlen_long_key_blocks(family, dtype, causal):
    # The longest sequence (2100 keys) puts d256 on the sm90 family's tile with key
    # blocks of 80; the others end inside a block, beside the next one's rows.
    check_varlen(family, [70, 1000, 5, 301], [77, 2100, 1, 1203], 256, dtype, causal=causal, h_k=2,
                 backward=False)


@pytest.mark.parametrize("family, dtype", FAMILY_DTYPES)
def test_varlen_gqa_group_shared_over_ctas(family, dtype):
    # 20 key blocks and 8 query heads per kv head over up to 1000 queries: the backward
    # shares a group's heads out over several CTAs per key block and adds their partial
    # dk, dv (ops.cpp, choose_kv_head_splits); deterministic, so also reproducible.
    check_varlen(family, [1000, 3, 536], [1000, 700, 536], 128, dtype, causal=True, h_k=1, deterministic=True)


FEATURES = {
    "window": {"window": (64, 16)},
    "window_causal": {"window": (32, -1), "causal": True},
    "softcap": {"softcap": 5.0, "causal": True},
    "alibi_bh": {"alibi": "bh"},
    "alibi_h_causal": {"alibi": "h", "causal": True},
    "gqa4": {"h_k": 2, "causal": True},
    "mqa": {"h_k": 1},
    "deterministic": {"deterministic": True, "causal": True, "h_k": 2},
    "all_together": {"softcap": 30.0, "alibi": "bh", "window": (40, 8), "h_k": 4},
}


@pytest.mark.parametrize("feature", FEATURES)
@pytest.mark.parametrize("family, dtype", FAMILY_DTYPES)
def test_varlen_features(family, dtype, feature):
    check_varlen(family, [300, 0, 1, 250, 64], [200, 5, 0, 500, 64], 64, dtype, **FEATURES[feature])


@pytest.mark.parametrize("family, dtype", FAMILY_DTYPES)
def test_varlen_equals_dense(family, dtype):
    # Equal lengths: the varlen path runs the dense path's tiles on the same data, so
    # out, lse and (deterministic) gradients are bitwise those of the dense op. (A
    # batch that fills the GPU: with fewer tiles the dense forward splits the keys,
    # which varlen does not; cpp/ops.cpp plan_splits.)
    fam = require(family, dtype, 64)
    b, s, d = 12, 333, 64
    g = torch.Generator("cuda").manual_seed(3)
    q, k, v, dout = (torch.randn(b, s, HEADS, d, generator=g, device="cuda", dtype=dtype) for _ in range(4))
    opts = (None, None, 0.0, d**-0.5, True, -1, -1, 0.0)
    out, lse = call_kernel(OPS.fwd, q, k, v, *opts, fam)
    dense_grads = call_kernel(OPS.bwd, dout, q, k, v, out, lse, *opts, True, fam)
    flat = lambda t: t.reshape(b * s, *t.shape[2:])
    cu = cu_seqlens([s] * b)
    v_out, v_lse = call_kernel(OPS.varlen_fwd, flat(q), flat(k), flat(v), cu, cu, s, s, *opts, fam)
    assert torch.equal(v_out, flat(out))
    assert torch.equal(v_lse, lse.transpose(0, 1).reshape(HEADS, b * s))
    v_grads = call_kernel(OPS.varlen_bwd, flat(dout), flat(q), flat(k), flat(v), v_out, v_lse, cu, cu, s, s,
                          *opts, True, fam)
    for ours, dense in zip(v_grads, dense_grads):
        assert torch.equal(ours, flat(dense))


@pytest.mark.parametrize("family, dtype", FAMILY_DTYPES)
def test_varlen_no_queries_or_no_keys(family, dtype):
    # Every sequence empty on one side: out 0 / lse +inf, or dk = dv = 0, dq = 0.
    fam = require(family, dtype, 64)
    for lengths_q, lengths_k in (([0, 0], [5, 9]), ([4, 3], [0, 0])):
        q, k, v = make_varlen(lengths_q, lengths_k, HEADS, 2, 64, dtype, seed=5)
        cu_q, cu_k = cu_seqlens(lengths_q), cu_seqlens(lengths_k)
        opts = (None, None, 0.0, 0.125, False, -1, -1, 0.0)
        varlen = (cu_q, cu_k, max(lengths_q), max(lengths_k))
        out, lse = call_kernel(OPS.varlen_fwd, q, k, v, *varlen, *opts, fam)
        assert (out == 0).all() and torch.isinf(lse).all() and (lse > 0).all()
        dout = torch.randn_like(q)
        grads = call_kernel(OPS.varlen_bwd, dout, q, k, v, out, lse, *varlen, *opts, False, fam)
        for grad in grads:
            assert (grad == 0).all()


def test_varlen_strided_views_and_padding_of_head_dim():
    # qkv packed (total, 3, h, d) views, d not a multiple of 8: the public function pads.
    family = f"sm{_dispatch.resolve_family(torch.device('cuda'), torch.float16)}"
    require(family, torch.float16, 40)
    lengths = [33, 1, 200]
    cu = cu_seqlens(lengths)
    g = torch.Generator("cuda").manual_seed(11)
    qkv = torch.randn(sum(lengths), 3, 4, 36, generator=g, device="cuda", dtype=torch.float16, requires_grad=True)
    out = flashattn.flash_attn_varlen_qkvpacked_func(qkv, cu, max(lengths), causal=True)
    q, k, v = (t.detach().float() for t in qkv.unbind(1))
    ref, _ = reference.varlen_attention(q, k, v, cu, cu, causal=True)
    lowp, _ = reference.varlen_attention(*(t.half() for t in (q, k, v)), cu, cu, causal=True, upcast=False)
    assert_standard("out", out, ref, lowp, FWD_FACTOR)
    out.float().pow(2).sum().backward()
    assert qkv.grad is not None and not torch.isnan(qkv.grad).any()
    # a non-contiguous last dim is copied, not refused
    qt = q.half().transpose(1, 2).contiguous().transpose(1, 2)
    assert qt.stride(-1) != 1
    got = flashattn.flash_attn_varlen_func(qt, k.half(), v.half(), cu, cu, max(lengths), max(lengths), causal=True)
    torch.testing.assert_close(got, out.detach(), rtol=0, atol=0)


def _opcheck_cases():
    lengths_q, lengths_k = [3, 0, 17], [9, 4, 17]
    q, k, v = make_varlen(lengths_q, lengths_k, 4, 2, 64, torch.float16, seed=9)
    cu_q, cu_k = cu_seqlens(lengths_q), cu_seqlens(lengths_k)
    opts = (None, None, 0.0, 0.125, True, -1, -1, 0.0)
    return q, k, v, (cu_q, cu_k, 17, 17), opts


def test_opcheck_every_op_on_cuda():
    family = _dispatch.resolve_family(torch.device("cuda"), torch.float16)
    require(f"sm{family}", torch.float16, 64)
    q, k, v, varlen, opts = _opcheck_cases()
    out, lse = OPS.varlen_fwd(q, k, v, *varlen, *opts, family)
    dout = torch.randn_like(out)
    qr, kr, vr = (t.clone().requires_grad_() for t in (q, k, v))
    torch.library.opcheck(OPS.varlen_fwd.default, (qr, kr, vr, *varlen, *opts, family))
    torch.library.opcheck(OPS.varlen_fwd_out.default, (q, k, v, *varlen, torch.empty_like(q), *opts, family))
    torch.library.opcheck(OPS.varlen_bwd.default, (dout, q, k, v, out, lse, *varlen, *opts, True, family))
    grads = tuple(torch.empty_like(t) for t in (q, k, v))
    torch.library.opcheck(OPS.varlen_bwd_out.default, (dout, q, k, v, out, lse, *varlen, *grads, *opts, True, family))
    # the dense ops too
    qd, kd, vd = (t[None, :17].clone() for t in (q, k, v))
    outd, lsed = OPS.fwd(qd, kd, vd, *opts, family)
    qdr, kdr, vdr = (t.clone().requires_grad_() for t in (qd, kd, vd))
    torch.library.opcheck(OPS.fwd.default, (qdr, kdr, vdr, *opts, family))
    torch.library.opcheck(OPS.fwd_out.default, (qd, kd, vd, torch.empty_like(qd), *opts, family))
    doutd = torch.randn_like(outd)
    torch.library.opcheck(OPS.bwd.default, (doutd, qd, kd, vd, outd, lsed, *opts, True, family))
    grads = tuple(torch.empty_like(t) for t in (qd, kd, vd))
    torch.library.opcheck(OPS.bwd_out.default, (doutd, qd, kd, vd, outd, lsed, *grads, *opts, True, family))


def test_varlen_torch_compile_fullgraph_forward_and_backward():
    family = _dispatch.resolve_family(torch.device("cuda"), torch.float16)
    require(f"sm{family}", torch.float16, 64)
    lengths = [100, 3, 250]
    cu = cu_seqlens(lengths)
    q, k, v = make_varlen(lengths, lengths, HEADS, 2, 64, torch.float16, seed=21)

    def step(q, k, v):
        out = flashattn.flash_attn_varlen_func(q * 1.5, k, v, cu, cu, 250, 250, causal=True, deterministic=True)
        return out.float().square().sum()

    grads = []
    for fn in (step, torch.compile(step, fullgraph=True)):
        leaves = [t.clone().requires_grad_() for t in (q, k, v)]
        fn(*leaves).backward()
        grads.append([t.grad for t in leaves])
    for eager, compiled in zip(*grads):
        torch.testing.assert_close(compiled, eager, rtol=0, atol=0)


def test_varlen_offsets_past_2_pow_31_elements():
    # 2^31 + 2^24 elements in q/k/v (bf16, ~4.3 GB each): the last sequences start
    # past element 2^31, so their offsets (cu_seqlens * row stride) must be 64-bit.
    h, d = 16, 128
    total = 2**31 // (h * d) + 2**24 // (h * d)
    need = 4 * total * h * d * 2 + 2**30
    if torch.cuda.mem_get_info()[0] < need:
        pytest.skip(f"needs {need / 2**30:.0f} GiB of free GPU memory")
    family = _dispatch.resolve_family(torch.device("cuda"), torch.bfloat16)
    fam = require(f"sm{family}", torch.bfloat16, d)
    lengths = [total - 3000, 1000, 2000]
    cu = cu_seqlens(lengths)
    g = torch.Generator("cuda").manual_seed(7)
    q, k, v = (torch.randn(total, h, d, generator=g, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    # one huge sequence would make the reference infeasible: only check the last two
    out, lse = call_kernel(OPS.varlen_fwd, q, k, v, cu, cu, lengths[0], lengths[0], None, None, 0.0, d**-0.5,
                           True, 1000, 0, 0.0, fam)
    start = lengths[0]
    rows = slice(start, total)
    sub_cu = cu_seqlens(lengths[1:])
    ref, ref_lse = reference.varlen_attention(q[rows].float(), k[rows].float(), v[rows].float(), sub_cu, sub_cu,
                                              causal=True, window_size=(1000, 0))
    lowp, lowp_lse = reference.varlen_attention(q[rows], k[rows], v[rows], sub_cu, sub_cu, causal=True,
                                                window_size=(1000, 0), upcast=False)
    assert_standard("out", out[rows], ref, lowp, FWD_FACTOR)
    assert_lse(lse[:, rows], ref_lse, lowp_lse.float())


@pytest.mark.parametrize("d, causal", [(128, False), (64, True)], ids=["d128", "d64-causal"])
@pytest.mark.parametrize("family, dtype", FAMILY_DTYPES)
def test_varlen_sequences_do_not_mix(family, dtype, d, causal):
    # A kernel may read past a sequence's end into the next one's rows (whole
    # tiles; at d64 under a causal mask the sm90 forward's 192-row tiles, whose
    # warpgroups skip rows past the end and multiply their own key ranges); Inf
    # and NaN in one sequence must change no other sequence's out, lse or
    # gradients (deterministic mode: bitwise).
    fam = require(family, dtype, d)
    lengths_q, lengths_k = [77, 200, 100], [150, 33, 300]
    q, k, v = make_varlen(lengths_q, lengths_k, HEADS, 2, d, dtype, seed=7)
    cu_q, cu_k = cu_seqlens(lengths_q), cu_seqlens(lengths_k)
    varlen = (cu_q, cu_k, max(lengths_q), max(lengths_k))
    opts = (None, None, 0.0, d**-0.5, causal, -1, -1, 0.0)
    dout = torch.randn_like(q)

    def run(q, k, v):
        out, lse = call_kernel(OPS.varlen_fwd, q, k, v, *varlen, *opts, fam)
        dq, dk, dv = call_kernel(OPS.varlen_bwd, dout, q, k, v, out, lse, *varlen, *opts, True, fam)
        return out, lse, dq, dk, dv

    clean = run(q, k, v)
    bq, bk = cu_q.tolist(), cu_k.tolist()
    q[bq[1]:bq[2]] = float("nan")
    k[bk[1]:bk[2]] = float("inf")
    v[bk[1]:bk[2]] = float("nan")
    poisoned = run(q, k, v)
    for i in (0, 2):
        rows_q, rows_k = slice(bq[i], bq[i + 1]), slice(bk[i], bk[i + 1])
        for name, ours, ref, rows in (("out", poisoned[0], clean[0], rows_q), ("dq", poisoned[2], clean[2], rows_q),
                                      ("dk", poisoned[3], clean[3], rows_k), ("dv", poisoned[4], clean[4], rows_k)):
            assert torch.equal(ours[rows], ref[rows]), f"sequence {i}: {name} changed"
        assert torch.equal(poisoned[1][:, rows_q], clean[1][:, rows_q]), f"sequence {i}: lse changed"
