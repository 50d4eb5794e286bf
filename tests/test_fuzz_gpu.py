"""Random valid calls of the public API on the CUDA kernels, per family (hypothesis).

The suites beside this one pin each feature at chosen shapes. Here hypothesis draws
shapes and options together: lengths on and off the tiles' edges, GQA, head dims
inside and between buckets, causal and window masks, softcap, ALiBi, dropout,
strided and misaligned views, deterministic backwards, varlen batches with empty
sequences, KV caches with every option, varlen batches over packed or paged caches.
Each call runs forward and backward (over a cache forward only) into outputs drawn
after the allocator's free memory was filled with NaN, and is held to DESIGN.md's
standard against the fp32 reference computed with the kernel's own dropout mask.

The examples are derandomized: the same on every run. FLASHATTN_FUZZ_EXAMPLES sets
how many each test draws (default 10); FLASHATTN_FUZZ_SEED draws another set;
FLASHATTN_FUZZ_LOG names a file that gets every call (JSON) before it runs, so that
a call which ends the CUDA context (after which every later call fails too, and
hypothesis cannot shrink) is named.
"""

import functools
import json
import math
import os

import flashattn
import pytest
import torch
from _standard import BWD_FACTOR, FWD_FACTOR, assert_lse, assert_standard
from flashattn import interface, reference
from test_fwd_gpu import FAMILY_DTYPES, require
from test_kvcache_gpu import Case, poison_free_memory
from test_varlen_gpu import cu_seqlens

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, Phase, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

pytestmark = pytest.mark.gpu

BWD_EPS = 1e-4
EXAMPLES = int(os.environ.get("FLASHATTN_FUZZ_EXAMPLES", "10"))
SEED = os.environ.get("FLASHATTN_FUZZ_SEED") or None
LOG = os.environ.get("FLASHATTN_FUZZ_LOG")
# Tile edges of every family (64, 80, 128, 192-row and -key tiles) and their neighbours.
EDGES = sorted({e + o for e in (64, 80, 128, 160, 192, 256, 384, 512) for o in (-1, 0, 1)})


@pytest.fixture(autouse=True)
def _exact_fp32_reference(monkeypatch):
    monkeypatch.setattr(torch.backends.cuda.matmul, "allow_tf32", False)
    monkeypatch.setattr(torch.backends.cudnn, "allow_tf32", False)


def examples(fn):
    """hypothesis settings of every test here: derandomized unless a seed is given."""
    # With a log, no shrinking: the failing call stays the log's last line.
    phases = [p for p in Phase if p != Phase.shrink] if LOG else list(Phase)
    fn = settings(max_examples=EXAMPLES, deadline=None, database=None, derandomize=SEED is None,
                  suppress_health_check=list(HealthCheck), phases=phases)(fn)
    return fn if SEED is None else hypothesis.seed(int(SEED))(fn)


def log_call(test, family, dtype, call):
    if LOG:
        with open(LOG, "a") as f:
            f.write(json.dumps({"test": test, "family": family, "dtype": str(dtype), **call}, default=repr) + "\n")


def lengths(low=1, high=700):
    return st.one_of(st.integers(low, 40), st.integers(low, high), st.sampled_from(EDGES))


def head_dims(family, dtype):
    """Head dims this build serves: bucket sizes, dims inside a bucket, and dims that
    are not multiples of 8 (the interface pads them)."""
    built = flashattn.build_info()["head_dims"] or [256]
    top = max(built)
    require(family, dtype, 8)
    return st.one_of(st.sampled_from([d for d in (32, 64, 96, 128, 160, 192, 224, 256) if d <= top]),
                     st.integers(1, top))


def options(draw, s_k, batch, heads):
    """Mask, score modifiers and dropout, each present in a share of the calls."""
    window = draw(st.sampled_from(["none", "none", "drawn"]))
    if window == "drawn":
        window = (draw(st.integers(-1, s_k + 8)), draw(st.integers(-1, s_k + 8)))
    else:
        window = (-1, -1)
    alibi = draw(st.sampled_from([None, None, None, "h", "bh"]))
    if alibi is not None:  # slopes from a drawn seed: a logged call is reproducible
        shape = (heads,) if alibi == "h" else (batch, heads)
        g = torch.Generator("cuda").manual_seed(draw(st.integers(0, 2**20)))
        alibi = torch.rand(shape, generator=g, device="cuda") * 0.5
    return {
        "causal": draw(st.booleans()),
        "window_size": window,
        "softcap": draw(st.sampled_from([0.0, 0.0, 0.0, 0.0, 2.0, 30.0])),
        "alibi_slopes": alibi,
        "dropout_p": draw(st.sampled_from([0.0, 0.0, 0.0, 0.17])),
        "softmax_scale": draw(st.sampled_from([None, None, 0.3])),
    }


def make(shape, dtype, layout, g):
    """A randn tensor of `shape` (seq-major, as the API takes it) in the drawn memory
    layout, as a leaf that requires grad."""
    if layout == "heads_first":  # (.., h, s, d) memory, viewed as (.., s, h, d)
        t = torch.randn(*shape[:-3], shape[-2], shape[-3], shape[-1], generator=g, device="cuda", dtype=dtype)
        t = t.transpose(-3, -2)
    elif layout == "misaligned":  # an offset of one element: the interface copies it
        n = math.prod(shape)
        t = torch.randn(n + 1, generator=g, device="cuda", dtype=dtype)[1:].view(shape)
    else:
        t = torch.randn(shape, generator=g, device="cuda", dtype=dtype)
    return t.detach().requires_grad_()


def reference_kwargs(opts, d, fam):
    kw = dict(opts)
    if kw["softmax_scale"] is None:
        kw["softmax_scale"] = 1.0 / math.sqrt(d)
    kw["dropout_units"] = interface._dropout_units(fam)
    return kw


def rng_state_of(seed, dropout_p, like):
    """The [seed, offset] the call drew after torch.manual_seed(seed)."""
    torch.manual_seed(seed)
    return interface._draw_rng_state(dropout_p, like)


def check_call(out, lse, grads, q, k, v, dout, kw, fwd=reference.attention, bwd=reference.attention_bwd):
    """out, lse and the gradients to the standard against the reference functions
    (`fwd`, `bwd`: the dense ones, or the varlen ones with the offsets bound)."""
    qd, kd, vd = (t.detach() for t in (q, k, v))
    qf, kf, vf = (t.float() for t in (qd, kd, vd))
    ref_out, ref_lse = fwd(qf, kf, vf, **kw)
    low_out, low_lse = fwd(qd, kd, vd, upcast=False, **kw)
    assert out.shape == q.shape and out.dtype == q.dtype
    assert_standard("out", out, ref_out, low_out, FWD_FACTOR)
    assert_lse(lse, ref_lse, low_lse.float())
    # The fp32 backward takes the forward's own output, as the kernels do: their
    # rowsum(dO * O) holds O's rounding to 16 bits. (With one key and dropout the
    # exact dq and dk are 0 and that rounding is all there is, about 1e-3, which the
    # 16-bit reference, rounding both sides alike, does not show.)
    ref = bwd(dout.float(), qf, kf, vf, out.detach().float(), ref_lse, **kw)
    lowp = bwd(dout, qd, kd, vd, low_out, low_lse, upcast=False, **kw)
    for name, ours, r, lp in zip(("dq", "dk", "dv"), grads, ref, lowp):
        assert ours is not None, f"{name}: no gradient"
        assert_standard(name, ours, r, lp, BWD_FACTOR, BWD_EPS)


@pytest.mark.parametrize("family, dtype", FAMILY_DTYPES)
def test_fuzz_dense(family, dtype):
    fam = require(family, dtype, 8)
    dims = head_dims(family, dtype)

    @examples
    @given(st.data())
    def run(data):
        draw = data.draw
        b, h_k, group = draw(st.integers(1, 3)), draw(st.integers(1, 3)), draw(st.sampled_from([1, 2, 3, 4]))
        h = h_k * group
        s_q = draw(lengths())
        s_k = draw(st.one_of(st.just(s_q), lengths()))
        d = draw(dims)
        opts = options(draw, s_k, b, h)
        layout = draw(st.sampled_from(["contiguous", "contiguous", "heads_first", "misaligned"]))
        deterministic = draw(st.booleans())
        seed = draw(st.integers(0, 2**20))
        log_call("dense", family, dtype, dict(b=b, s_q=s_q, s_k=s_k, h=h, h_k=h_k, d=d, layout=layout,
                                              deterministic=deterministic, seed=seed, **opts))
        g = torch.Generator("cuda").manual_seed(seed)
        q = make((b, s_q, h, d), dtype, layout, g)
        k = make((b, s_k, h_k, d), dtype, layout, g)
        v = make((b, s_k, h_k, d), dtype, layout, g)
        dout = torch.randn(b, s_q, h, d, generator=g, device="cuda", dtype=dtype)

        poison_free_memory()
        torch.manual_seed(seed)
        out, lse, _ = flashattn.flash_attn_func(q, k, v, deterministic=deterministic, return_attn_probs=True,
                                                family=fam, **opts)
        out.backward(dout)
        grads = [t.grad for t in (q, k, v)]

        kw = reference_kwargs(opts, d, fam)
        kw["rng_state"] = rng_state_of(seed, opts["dropout_p"], q)
        check_call(out, lse, grads, q, k, v, dout, kw)
        if deterministic:
            for t in (q, k, v):
                t.grad = None
            torch.manual_seed(seed)
            flashattn.flash_attn_func(q, k, v, deterministic=True, family=fam, **opts).backward(dout)
            for name, first, t in zip(("dq", "dk", "dv"), grads, (q, k, v)):
                assert torch.equal(first, t.grad), f"deterministic {name} differs between two runs"

    run()


@pytest.mark.parametrize("family, dtype", FAMILY_DTYPES)
def test_fuzz_varlen(family, dtype):
    fam = require(family, dtype, 8)
    dims = head_dims(family, dtype)

    @examples
    @given(st.data())
    def run(data):
        draw = data.draw
        n = draw(st.integers(1, 6))
        lengths_q = draw(st.lists(lengths(0, 400), min_size=n, max_size=n))
        lengths_q[0] = max(lengths_q[0], 1)  # at least one row
        lengths_k = draw(st.one_of(st.just(lengths_q), st.lists(lengths(0, 400), min_size=n, max_size=n)))
        h_k, group = draw(st.integers(1, 3)), draw(st.sampled_from([1, 2, 4]))
        h = h_k * group
        d = draw(dims)
        opts = options(draw, max(lengths_k), n, h)
        seed = draw(st.integers(0, 2**20))
        log_call("varlen", family, dtype, dict(lengths_q=lengths_q, lengths_k=lengths_k, h=h, h_k=h_k, d=d,
                                               seed=seed, **opts))
        g = torch.Generator("cuda").manual_seed(seed)
        q = make((sum(lengths_q), h, d), dtype, "contiguous", g)
        k = make((sum(lengths_k), h_k, d), dtype, "contiguous", g)
        v = make((sum(lengths_k), h_k, d), dtype, "contiguous", g)
        dout = torch.randn(q.shape, generator=g, device="cuda", dtype=dtype)
        cu_q, cu_k = cu_seqlens(lengths_q), cu_seqlens(lengths_k)

        poison_free_memory()
        torch.manual_seed(seed)
        out, lse, _ = flashattn.flash_attn_varlen_func(q, k, v, cu_q, cu_k, max(lengths_q), max(lengths_k),
                                                       return_attn_probs=True, family=fam, **opts)
        out.backward(dout)
        grads = [t.grad for t in (q, k, v)]

        kw = reference_kwargs(opts, d, fam)
        kw["rng_state"] = rng_state_of(seed, opts["dropout_p"], q)
        offsets = {"cu_seqlens_q": cu_q, "cu_seqlens_k": cu_k}
        check_call(out, lse, grads, q, k, v, dout, kw, functools.partial(reference.varlen_attention, **offsets),
                   functools.partial(reference.varlen_attention_bwd, **offsets))

    run()


@pytest.mark.parametrize("family, dtype", FAMILY_DTYPES)
def test_fuzz_kvcache(family, dtype):
    require(family, dtype, 8)
    dims = head_dims(family, dtype)

    @examples
    @given(st.data())
    def run(data):
        draw = data.draw
        d = draw(dims)
        s_cache = draw(lengths(1, 1200))
        s_q = draw(st.one_of(st.integers(1, 4), st.integers(1, 80)))
        s_new = draw(st.one_of(st.just(0), st.integers(0, min(s_q, s_cache))))
        paged = draw(st.booleans())
        rotary_dims = [r for r in (16, 32, 64, 128) if r <= d]
        h_k, group = draw(st.integers(1, 3)), draw(st.sampled_from([1, 2, 5, 8]))
        window = draw(st.sampled_from([(-1, -1), (-1, -1), "drawn"]))
        if window == "drawn":
            window = (draw(st.integers(-1, s_cache)), draw(st.integers(-1, 8)))
        kwargs = dict(
            b=draw(st.integers(1, 5)), s_q=s_q, s_cache=s_cache, h=h_k * group, h_k=h_k, d=d, s_new=s_new,
            page=draw(st.integers(1, 300)) if paged else None,
            seqlens=draw(st.sampled_from(["random", "random", "int"])),
            leftpad=not paged and draw(st.booleans()),
            batch_idx=not paged and draw(st.booleans()),
            rotary_dim=draw(st.sampled_from([0] + rotary_dims)) if s_new and rotary_dims else 0,
            interleaved=draw(st.booleans()), causal=draw(st.booleans()), window=window,
            softcap=draw(st.sampled_from([0.0, 0.0, 0.0, 20.0])), alibi=draw(st.booleans()),
            num_splits=draw(st.sampled_from([0, 0, 0, 1, 3])), seed=draw(st.integers(0, 2**20)),
        )
        # Rotary tables hold the cache's positions: under a causal or local mask q's
        # rows must fit there too (test_rotary_positions_past_the_tables has the rest).
        room = s_new
        if kwargs["rotary_dim"] and (kwargs["causal"] or window != (-1, -1)):
            if s_q > s_cache:
                kwargs["rotary_dim"] = 0
            else:
                room = max(s_new, s_q)
        if kwargs["seqlens"] == "int":
            kwargs["seqlens"] = draw(st.integers(0, s_cache - room))
        log_call("kvcache", family, dtype, kwargs)
        Case(family, dtype, **kwargs).run()

    run()


@pytest.mark.parametrize("family, dtype", FAMILY_DTYPES)
def test_fuzz_varlen_over_a_cache(family, dtype):
    # flash_attn_varlen_func with seqused_k, over packed rows or pages (paged prefill);
    # every row a sequence does not use is NaN.
    fam = require(family, dtype, 8)
    dims = head_dims(family, dtype)

    @examples
    @given(st.data())
    def run(data):
        draw = data.draw
        n = draw(st.integers(1, 5))
        lengths_q = draw(st.lists(lengths(0, 300), min_size=n, max_size=n))
        used = draw(st.lists(lengths(0, 900), min_size=n, max_size=n))
        lengths_q[0], used[0] = max(lengths_q[0], 1), max(used[0], 1)
        page = draw(st.one_of(st.none(), st.integers(1, 300)))
        spare = draw(st.integers(0, 9))  # packed rows past each sequence's used ones
        h_k, group = draw(st.integers(1, 3)), draw(st.sampled_from([1, 2, 4]))
        h = h_k * group
        d = draw(dims)
        opts = options(draw, max(used), n, h)
        opts["dropout_p"] = 0.0  # a forward over a cache has no dropout
        seed = draw(st.integers(0, 2**20))
        log_call("varlen_cache", family, dtype, dict(lengths_q=lengths_q, used=used, page=page, spare=spare, h=h,
                                                     h_k=h_k, d=d, seed=seed, **opts))
        g = torch.Generator("cuda").manual_seed(seed)
        rand = lambda *shape: torch.randn(*shape, generator=g, device="cuda", dtype=dtype)
        q = rand(sum(lengths_q), h, d)
        cu_q = cu_seqlens(lengths_q)
        if page is None:
            rows = [u + spare for u in used]
            k, v = rand(sum(rows), h_k, d), rand(sum(rows), h_k, d)
            cu_k, table = cu_seqlens(rows), None
            for i in range(n):
                k[int(cu_k[i]) + used[i]: int(cu_k[i + 1])] = float("nan")
                v[int(cu_k[i]) + used[i]: int(cu_k[i + 1])] = float("nan")
        else:
            pages = math.ceil(max(used) / page)
            num_pages = n * pages + 2
            table = torch.randperm(num_pages, device="cuda", generator=g)[: n * pages].view(n, pages).to(torch.int32)
            k = torch.full((num_pages, page, h_k, d), float("nan"), device="cuda", dtype=dtype)
            v = torch.full_like(k, float("nan"))
            for i in range(n):
                rows_i = torch.arange(used[i], device="cuda")
                where = (table[i].long()[rows_i // page], rows_i % page)
                k[where], v[where] = rand(used[i], h_k, d), rand(used[i], h_k, d)
            cu_k = cu_seqlens(used)
        seqused = torch.tensor(used, dtype=torch.int32, device="cuda")

        poison_free_memory()
        out, lse, _ = flashattn.flash_attn_varlen_func(q, k, v, cu_q, cu_k, max(lengths_q), max(used),
                                                       return_attn_probs=True, block_table=table,
                                                       seqused_k=seqused, family=fam, **opts)
        kw = {key: val for key, val in opts.items() if key != "dropout_p"}
        if kw["softmax_scale"] is None:
            kw["softmax_scale"] = 1.0 / math.sqrt(d)
        ref = reference.varlen_cache_attention(q.float(), k.float(), v.float(), cu_q, cu_k, seqused, table, **kw)
        low = reference.varlen_cache_attention(q, k, v, cu_q, cu_k, seqused, table, upcast=False, **kw)
        assert_standard("out", out, ref[0], low[0], FWD_FACTOR)
        assert_lse(lse, ref[1], low[1].float())

    run()
