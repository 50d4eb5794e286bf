"""Forward correctness of the CUDA kernels (DESIGN.md's standard), per kernel family.

Every family that the build says runs on this GPU is forced in turn (``family=``), so
a development build with all families compiled for one target tests all code paths
on one GPU. Inputs are fresh randn (never zeros); outputs are poisoned with NaN
before each run; the reference is fp32 from the same inputs and the yardstick is
PyTorch's own fp16/bf16 math (reference.attention(upcast=False)).

The default run is a representative slice; --slow runs the full grid (the sm80 family's
slice took 5 s and its full grid 16 s on an H200).
"""

import math

import flashattn
import pytest
import torch
from _gpu import call_kernel
from _standard import FWD_FACTOR, assert_lse, assert_standard
from flashattn import FlashAttnError, _dispatch, _families, reference

pytestmark = pytest.mark.gpu

OPS = torch.ops.flashattn
FAMILIES = _families.NAMES
HEAD_DIMS = (32, 40, 64, 80, 96, 128, 160, 192, 256)
SEQLENS = (1, 17, 113, 128, 255, 1024, 2925, 4096)
# Equal lengths, plus s_q != s_k both ways (s_q > s_k with causal masks whole rows).
SEQLEN_PAIRS = [(s, s) for s in SEQLENS] + [
    (1, 17),
    (17, 1),
    (113, 255),
    (255, 113),
    (128, 1024),
    (1024, 128),
    (1, 1024),
    (1024, 1),
    (2925, 4096),
    (4096, 2925),
]
HEADS = 8
GQA_HEADS_K = (8, 2, 1)  # ratios 1, 4, 8


def _family_dtypes():
    """(family, dtype) pairs: bf16 only where the family has it (families.json)."""
    for family in FAMILIES:
        for dtype in (torch.float16, torch.bfloat16):
            if dtype == torch.float16 or _families.get(int(family[2:])).bf16:
                yield pytest.param(family, dtype, id=f"{family}-{str(dtype)[6:]}")


FAMILY_DTYPES = list(_family_dtypes())


@pytest.fixture(autouse=True)
def _exact_fp32_reference(monkeypatch):
    # The fp32 reference must not silently run its matmuls in TF32.
    monkeypatch.setattr(torch.backends.cuda.matmul, "allow_tf32", False)
    monkeypatch.setattr(torch.backends.cudnn, "allow_tf32", False)


def require(family: str, dtype: torch.dtype, head_dim: int) -> int:
    """The family's int if the build runs it on this GPU for dtype and head_dim, else skip."""
    info = flashattn.build_info()
    major, minor = torch.cuda.get_device_capability()
    cc = 10 * major + minor
    wanted = int(family[2:])
    newest = _dispatch.family_for_capability((major, minor), torch.cuda.get_device_name())
    if wanted > newest:
        pytest.skip(f"{family} needs a newer GPU than compute capability {major}.{minor}")
    families = info["families"]
    if not families and wanted != newest:
        pytest.skip("the build info lists no families: only the device's own family is tested")
    if families and (family not in families or not _dispatch.runs_on(families[family], cc)):
        pytest.skip(f"this build has no {family} kernels for compute capability {major}.{minor}")
    key = {torch.float16: "fp16", torch.bfloat16: "bf16"}[dtype]
    if info["dtypes"] and key not in info["dtypes"]:
        pytest.skip(f"this build has no {key} kernels")
    if info["head_dims"] and max(info["head_dims"]) < head_dim:
        pytest.skip(f"this build has no kernel bucket for head dim {head_dim}")
    return wanted


def make_qkv(b, s_q, s_k, h, h_k, d, dtype, seed):
    g = torch.Generator("cuda").manual_seed(seed)
    return tuple(
        torch.randn(b, s, heads, d, generator=g, device="cuda", dtype=dtype)
        for s, heads in ((s_q, h), (s_k, h_k), (s_k, h_k))
    )


def check_forward(q, k, v, family, causal=False, window=(-1, -1), softcap=0.0, alibi=None):
    """Run fwd_out (into a NaN-poisoned out) and fwd; hold both to the standard."""
    scale = 1.0 / math.sqrt(q.shape[-1])
    args = (alibi, None, 0.0, scale, causal, window[0], window[1], softcap, family)
    out = torch.full_like(q, float("nan"))
    lse = call_kernel(OPS.fwd_out, q, k, v, out, *args)
    out2, lse2 = call_kernel(OPS.fwd, q, k, v, *args)

    kwargs = {
        "softmax_scale": scale,
        "causal": causal,
        "window_size": window,
        "softcap": softcap,
        "alibi_slopes": alibi,
    }
    ref, ref_lse = reference.attention(q.float(), k.float(), v.float(), **kwargs)
    lowp, lowp_lse = reference.attention(q, k, v, upcast=False, **kwargs)
    for name, o, o_lse in (("fwd_out", out, lse), ("fwd", out2, lse2)):
        assert o.dtype == q.dtype and o.shape == q.shape
        assert o_lse.shape == (q.shape[0], q.shape[2], q.shape[1]) and o_lse.is_contiguous()
        assert_standard(f"{name} out", o, ref, lowp, FWD_FACTOR)
        assert_lse(o_lse, ref_lse, lowp_lse.float())


def run_case(family, dtype, d, s_q, s_k, causal, h_k, seed=0):
    fam = require(family, dtype, d)
    b = 2 if max(s_q, s_k) <= 1024 else 1
    q, k, v = make_qkv(b, s_q, s_k, HEADS, h_k, d, dtype, seed)
    check_forward(q, k, v, fam, causal=causal)


# ---- the default slice: every head dim at two shapes; every seqlen pair at d 64/128; GQA


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


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("d", [64, 96, 128])
@pytest.mark.parametrize("family, dtype", FAMILY_DTYPES)
def test_packed_qkv_strided_views(family, dtype, d, causal):
    # q, k, v as views of one (b, s, 3, h, d) tensor: non-contiguous heads and rows.
    fam = require(family, dtype, d)
    g = torch.Generator("cuda").manual_seed(1)
    qkv = torch.randn(2, 255, 3, HEADS, d, generator=g, device="cuda", dtype=dtype)
    q, k, v = qkv.unbind(2)
    assert not q.is_contiguous()
    check_forward(q, k, v, fam, causal=causal)


@pytest.mark.parametrize("d", [8, 16, 24, 136, 200, 248])
def test_head_dims_inside_buckets(d):
    # Head dims well inside a bucket: the columns past d are predicated off.
    family = f"sm{_dispatch.resolve_family(torch.device('cuda'), torch.float16)}"
    fam = require(family, torch.float16, d)
    q, k, v = make_qkv(2, 130, 77, HEADS, 4, d, torch.float16, seed=11)
    check_forward(q, k, v, fam, causal=True)


def test_misaligned_views():
    # A view starting one element in, or rows d + 1 apart, cannot take 16-byte vector
    # loads: the raw op refuses it clearly, flash_attn_func copies it and computes.
    d, dtype = 64, torch.float16
    family = f"sm{_dispatch.resolve_family(torch.device('cuda'), dtype)}"
    fam = require(family, dtype, d)
    g = torch.Generator("cuda").manual_seed(12)
    base = torch.randn(2, 100, HEADS, d + 1, generator=g, device="cuda", dtype=dtype)
    shifted, odd_rows = base[..., 1:], base[..., :d]
    _, k, v = make_qkv(2, 100, 100, HEADS, HEADS, d, dtype, seed=13)
    for bad in (shifted, odd_rows):
        with pytest.raises(RuntimeError, match="16-byte aligned"):
            OPS.fwd(bad, k, v, None, None, 0.0, 0.125, False, -1, -1, 0.0, fam)
        out = flashattn.flash_attn_func(bad, k, v, causal=True)
        ref, _ = reference.attention(bad.float(), k.float(), v.float(), causal=True)
        lowp, _ = reference.attention(bad, k, v, causal=True, upcast=False)
        assert_standard("out", out, ref, lowp, FWD_FACTOR)
    # strides that only matter along a dim of size 1 are fine as they are
    single = torch.randn(HEADS * d, device="cuda", dtype=dtype).as_strided((1, 1, HEADS, d), (7, 5, d, 1))
    OPS.fwd(single, k[:1, :1], v[:1, :1], None, None, 0.0, 0.125, False, -1, -1, 0.0, fam)


def test_large_batch_and_heads():
    # More (batch x heads) than a 2-D/3-D grid's y/z dims allow (65535).
    family = f"sm{_dispatch.resolve_family(torch.device('cuda'), torch.float16)}"
    fam = require(family, torch.float16, 32)
    q, k, v = make_qkv(70000, 3, 5, 1, 1, 32, torch.float16, seed=14)
    out = torch.full_like(q, float("nan"))
    OPS.fwd_out(q, k, v, out, None, None, 0.0, 0.2, True, -1, -1, 0.0, fam)
    ref, _ = reference.attention(q.float(), k.float(), v.float(), softmax_scale=0.2, causal=True)
    lowp, _ = reference.attention(q, k, v, softmax_scale=0.2, causal=True, upcast=False)
    assert_standard("out", out, ref, lowp, FWD_FACTOR)


@pytest.mark.parametrize(
    "mask",
    [{}, {"causal": True}, {"window": (100, 0)}],
    ids=["full", "causal", "window"],
)
@pytest.mark.parametrize("s_q, s_k", [(640, 640), (640, 300)])
@pytest.mark.parametrize("d", [64, 128, 192, 256])
@pytest.mark.parametrize("family, dtype", FAMILY_DTYPES)
def test_several_tiles_per_cta(family, dtype, d, s_q, s_k, mask):
    # 320 query tiles of 128 rows: more than the SMs of any GPU we serve, so a
    # persistent kernel's CTAs each compute several, in the order the causal and
    # window masks sort by weight. With s_q > s_k the first query blocks of a causal
    # mask see no key (zero output, lse +inf) between tiles that do. d 64/128: the
    # output tile beside Q; d 192/256: staged where Q was.
    fam = require(family, dtype, d)
    q, k, v = make_qkv(4, s_q, s_k, 16, 4, d, dtype, seed=21)
    check_forward(q, k, v, fam, **mask)


SHORT_QUERIES = {
    # (s_q, s_k, options): the sm90 family runs head dims up to 64 in query tiles
    # of 128 rows instead of 192 where that makes no more tiles per head (s_q <= 128
    # or 193 to 256, launch/query_tiles.h); the ends of both ranges and the lengths
    # just outside, with each mask and the score modifiers.
    "s65": (65, 65, {}),
    "s128_causal": (128, 300, {"causal": True}),
    "s129": (129, 129, {}),
    "s192_causal": (192, 192, {"causal": True}),
    "s193": (193, 193, {}),
    "s197_causal": (197, 197, {"causal": True}),
    "s256_window": (256, 200, {"window": (50, 10)}),
    "s257": (257, 257, {}),
    "s200_softcap_alibi": (200, 230, {"softcap": 30.0, "alibi": True, "causal": True}),
}


@pytest.mark.parametrize("case", SHORT_QUERIES)
@pytest.mark.parametrize("d", [32, 64])
@pytest.mark.parametrize("family, dtype", FAMILY_DTYPES)
def test_short_query_tiles(family, dtype, d, case):
    # 96 (batch, head) pairs: above 128 rows two tiles each, more than the SMs of
    # the GPUs we serve, so that a persistent grid's CTAs take several.
    fam = require(family, dtype, d)
    s_q, s_k, opts = SHORT_QUERIES[case]
    opts = dict(opts)
    if opts.pop("alibi", False):
        opts["alibi"] = torch.rand(4, device="cuda") * 0.3
    q, k, v = make_qkv(24, s_q, s_k, 4, 2, d, dtype, seed=31)
    check_forward(q, k, v, fam, **opts)


LONG_KEYS = {
    # (s_q, s_k, h_k, options): the sm90 family runs d > 192 in key blocks of 80
    # from 1024 keys, 2048 under a mask (launch/fwd_sm90.h); lengths that end
    # inside such a block, and the lengths just below the switch.
    "full": (1031, 1031, 2, {}),
    "below_switch": (300, 1023, 2, {}),
    "causal": (2100, 2300, 1, {"causal": True}),
    "causal_below_switch": (700, 2047, 2, {"causal": True}),
    "window": (2048, 2048, 2, {"window": (300, 40)}),
    "softcap_alibi": (200, 1500, 2, {"softcap": 30.0, "alibi": True}),
}


@pytest.mark.parametrize("case", LONG_KEYS)
@pytest.mark.parametrize("d", [200, 256])
@pytest.mark.parametrize("family, dtype", FAMILY_DTYPES)
def test_long_key_blocks(family, dtype, d, case):
    fam = require(family, dtype, d)
    s_q, s_k, h_k, opts = LONG_KEYS[case]
    q, k, v = make_qkv(1, s_q, s_k, 4, h_k, d, dtype, seed=23)
    opts = dict(opts)
    if opts.pop("alibi", False):
        opts["alibi"] = torch.rand(4, device="cuda") * 0.3
    check_forward(q, k, v, fam, **opts)


# Scores whose row maximum grows from key block to key block (the kernels walk the
# keys from the last block): by less and by more than the 2^8 in probability below
# which the sm90 forward keeps a row's running maximum and skips the output's rescale.
@pytest.mark.parametrize("growth", ["rising", "falling", "mixed"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("d", [64, 128, 256])
@pytest.mark.parametrize("family, dtype", FAMILY_DTYPES)
def test_running_maximum_growth(family, dtype, d, causal, growth):
    fam = require(family, dtype, d)
    s = 700
    q, k, v = make_qkv(2, s, s, 4, 2, d, dtype, seed=29)
    j = torch.arange(s, device="cuda", dtype=torch.float32)
    if growth == "mixed":  # a scale per 64 keys, from 0.5 to 12
        g = torch.Generator("cuda").manual_seed(31)
        scale = (0.5 + 11.5 * torch.rand((s + 63) // 64, generator=g, device="cuda")).repeat_interleave(64)[:s]
    else:  # the largest scores 30x the smallest, at the first or the last key
        scale = 1 + 29 * j / s
        scale = scale.flip(0) if growth == "falling" else scale
    k = (k.float() * scale.view(1, s, 1, 1)).to(dtype)
    check_forward(q, k, v, fam, causal=causal)


# ---- the full grid


@pytest.mark.slow
@pytest.mark.parametrize("h_k", GQA_HEADS_K)
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("s_q, s_k", SEQLEN_PAIRS)
@pytest.mark.parametrize("d", HEAD_DIMS)
@pytest.mark.parametrize("family, dtype", FAMILY_DTYPES)
def test_full_grid(family, dtype, d, s_q, s_k, causal, h_k):
    run_case(family, dtype, d, s_q, s_k, causal, h_k=h_k)


# ---- features, the public API, streams, buffers, sizes


FEATURES = {
    "window": lambda alibi: {"window": (64, 16)},
    "window_causal": lambda alibi: {"window": (32, -1), "causal": True},
    "softcap": lambda alibi: {"softcap": 5.0, "causal": True},
    "alibi_bh": lambda alibi: {"alibi": alibi},
    "alibi_h_causal": lambda alibi: {"alibi": alibi[0].contiguous(), "causal": True},
    "softcap_small": lambda alibi: {"softcap": 0.5},
    "all_together": lambda alibi: {"softcap": 30.0, "alibi": alibi, "window": (40, 8)},
}


@pytest.mark.parametrize("feature", FEATURES)
@pytest.mark.parametrize("family, dtype", FAMILY_DTYPES)
def test_features(family, dtype, feature):
    fam = require(family, dtype, 64)
    q, k, v = make_qkv(2, 200, 300, HEADS, 2, 64, dtype, seed=3)
    alibi = torch.rand(2, HEADS, device="cuda")
    check_forward(q, k, v, fam, **FEATURES[feature](alibi))


@pytest.mark.parametrize("d", [20, 64])
def test_public_api_on_gpu(d):
    # The device's own family, chosen by flashattn; d = 20 is padded to 24.
    q, k, v = make_qkv(2, 113, 200, HEADS, 2, d, torch.float16, seed=4)
    require(f"sm{_dispatch.resolve_family(q.device, q.dtype)}", q.dtype, d + (-d % 8))
    out, lse, _ = call_kernel(
        flashattn.flash_attn_func, q, k, v, causal=True, return_attn_probs=True
    )
    ref, ref_lse = reference.attention(q.float(), k.float(), v.float(), causal=True)
    lowp, lowp_lse = reference.attention(q, k, v, causal=True, upcast=False)
    assert_standard("out", out, ref, lowp, FWD_FACTOR)
    assert_lse(lse, ref_lse, lowp_lse.float())


def test_build_info_lists_a_family_for_this_gpu():
    info = flashattn.build_info()
    assert info["extension_loaded"], info["extension_error"]
    assert info["families"], "the build info lists no kernel families"
    major, minor = torch.cuda.get_device_capability()
    runnable = [f for f, t in info["families"].items() if _dispatch.runs_on(t, 10 * major + minor)]
    assert runnable, f"no built family runs on compute capability {major}.{minor}: {info}"


@pytest.mark.parametrize("layout", ["padded_rows", "head_major"])
@pytest.mark.parametrize("d, s", [(64, 128), (72, 200), (256, 77)])
@pytest.mark.parametrize("family, dtype", FAMILY_DTYPES)
def test_preallocated_out_is_honoured(family, dtype, d, s, layout):
    # out is a strided view into a larger buffer (rows padded past the head dim,
    # or a (b, h, s, d) buffer seen as (b, s, h, d)), over lengths that end
    # inside a tile: exactly its elements are written.
    fam = require(family, dtype, d)
    q, k, v = make_qkv(2, s, s, HEADS, HEADS, d, dtype, seed=5)
    if layout == "padded_rows":
        buffer = torch.full((2, s, HEADS, d + 24), 7.0, device="cuda", dtype=dtype)
        out = buffer[..., :d]
    else:
        buffer = torch.full((2, HEADS, s + 3, d), 7.0, device="cuda", dtype=dtype)
        out = buffer[:, :, :s].transpose(1, 2)
    outside = torch.ones_like(buffer, dtype=torch.bool)
    outside.as_strided(out.shape, out.stride()).fill_(False)
    out.fill_(float("nan"))
    scale = d**-0.5
    call_kernel(OPS.fwd_out, q, k, v, out, None, None, 0.0, scale, False, -1, -1, 0.0, fam)
    assert out.data_ptr() == buffer.data_ptr()
    assert (buffer[outside] == 7.0).all(), "fwd_out wrote outside out"
    ref, _ = reference.attention(q.float(), k.float(), v.float(), softmax_scale=scale)
    lowp, _ = reference.attention(q, k, v, softmax_scale=scale, upcast=False)
    assert_standard("out", out, ref, lowp, FWD_FACTOR)


def test_runs_on_the_current_stream():
    # The side stream first sleeps, then rewrites q. A kernel launched on another stream
    # would read the old q; one on the current stream reads the new one.
    q, k, v = make_qkv(1, 256, 256, HEADS, HEADS, 64, torch.float16, seed=6)
    fam = require(f"sm{_dispatch.resolve_family(q.device, q.dtype)}", q.dtype, 64)
    new_q = torch.randn_like(q)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        torch.cuda._sleep(100_000_000)
        q.copy_(new_q)
        out, _ = call_kernel(OPS.fwd, q, k, v, None, None, 0.0, 0.125, False, -1, -1, 0.0, fam)
    torch.cuda.synchronize()
    ref, _ = reference.attention(new_q.float(), k.float(), v.float(), softmax_scale=0.125)
    lowp, _ = reference.attention(new_q, k, v, softmax_scale=0.125, upcast=False)
    assert_standard("out", out, ref, lowp, FWD_FACTOR)


@pytest.mark.slow
def test_over_2_pow_31_elements():
    # q, k, v and out of 2^31 + 2^24 elements each (bf16, ~4.3 GB apiece): offsets must be
    # 64-bit. The last batch entries live past element 2^31; check them and the first.
    b, s, h, d = 2**13 + 2**6, 128, 16, 128
    need = 4 * b * s * h * d * 2 + 2**30
    if torch.cuda.mem_get_info()[0] < need:
        pytest.skip(f"needs {need / 2**30:.0f} GiB of free GPU memory")
    fam = require(
        f"sm{_dispatch.resolve_family(torch.device('cuda'), torch.bfloat16)}", torch.bfloat16, d
    )
    q, k, v = make_qkv(b, s, s, h, h, d, torch.bfloat16, seed=7)
    assert q.numel() > 2**31
    out, lse = call_kernel(OPS.fwd, q, k, v, None, None, 0.0, d**-0.5, True, -1, -1, 0.0, fam)
    for batch in (slice(0, 1), slice(b - 2, b)):
        qs, ks, vs = q[batch], k[batch], v[batch]
        ref, ref_lse = reference.attention(qs.float(), ks.float(), vs.float(), causal=True)
        lowp, lowp_lse = reference.attention(qs, ks, vs, causal=True, upcast=False)
        assert_standard("out", out[batch], ref, lowp, FWD_FACTOR)
        assert_lse(lse[batch], ref_lse, lowp_lse.float())


# ---- bad inputs on the GPU


def test_fp32_cuda_input_is_refused():
    q, k, v = make_qkv(1, 16, 16, 2, 2, 64, torch.float32, seed=8)
    with pytest.raises(
        FlashAttnError, match="the CUDA kernels take torch.float16 or torch.bfloat16"
    ):
        flashattn.flash_attn_func(q, k, v)
    # the raw op goes straight to the C++ checks
    with pytest.raises(RuntimeError) as info:
        call_kernel(OPS.fwd, q, k, v, None, None, 0.0, 0.125, False, -1, -1, 0.0, 0)
    assert any(w in str(info.value).lower() for w in ("fp16", "float16", "half")), info.value


def test_cpu_and_cuda_mix_is_refused():
    q, k, v = make_qkv(1, 16, 16, 2, 2, 64, torch.float16, seed=9)
    with pytest.raises(FlashAttnError, match="put all inputs on one device"):
        flashattn.flash_attn_func(q, k.cpu(), v)
    with pytest.raises(RuntimeError):
        call_kernel(OPS.fwd, q, k.cpu(), v, None, None, 0.0, 0.125, False, -1, -1, 0.0, 0)


# ---- serving-style use: torch.compile and CUDA graphs


def test_torch_compile_inductor_forward():
    # Inference under torch.compile(fullgraph=True) with inductor: the fake kernel's
    # shapes and strides must match what the CUDA kernel returns.
    q, k, v = make_qkv(2, 96, 160, HEADS, 2, 64, torch.bfloat16, seed=15)
    require(f"sm{_dispatch.resolve_family(q.device, q.dtype)}", q.dtype, 64)

    def attend(q, k, v):
        # Same kernel on the same (exactly scaled) input: bitwise equal to eager.
        return flashattn.flash_attn_func(q * 1.5, k, v, causal=True)

    with torch.no_grad():
        eager = attend(q, k, v)
        compiled = torch.compile(attend, fullgraph=True)(q, k, v)
    torch.testing.assert_close(compiled, eager, rtol=0, atol=0)


@pytest.mark.parametrize("b, s, h", [(2, 128, HEADS), (4, 640, 16)], ids=["one_wave", "tile_counter"])
def test_cuda_graph_capture_and_replay(b, s, h):
    # Capturable: no host sync, allocations from torch's allocator, launch on the
    # capturing stream. Replays see new inputs copied into the static buffers.
    # tile_counter: more causal tiles than SMs, where a persistent forward takes its
    # tiles from a counter that each replay must zero again.
    q, k, v = make_qkv(b, s, s, h, h, 128, torch.float16, seed=16)
    require(f"sm{_dispatch.resolve_family(q.device, q.dtype)}", q.dtype, 128)
    flashattn.flash_attn_func(q, k, v)  # warm up outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = flashattn.flash_attn_func(q, k, v, causal=True)
    for seed in (17, 18, 19):
        new = make_qkv(b, s, s, h, h, 128, torch.float16, seed=seed)
        for dst, src in zip((q, k, v), new):
            dst.copy_(src)
        graph.replay()
        torch.cuda.synchronize()
        ref, _ = reference.attention(*(t.float() for t in new), causal=True)
        lowp, _ = reference.attention(*new, causal=True, upcast=False)
        assert_standard("out", out, ref, lowp, FWD_FACTOR)


def test_broadcast_kv_views():
    # k, v expand()ed along the batch (stride 0): the same result as real copies.
    g = torch.Generator("cuda").manual_seed(3)
    q = torch.randn(3, 200, 4, 64, generator=g, device="cuda", dtype=torch.float16)
    k, v = (torch.randn(1, 300, 2, 64, generator=g, device="cuda", dtype=torch.float16).expand(3, -1, -1, -1)
            for _ in range(2))
    out = flashattn.flash_attn_func(q, k, v, causal=True)
    assert torch.equal(out, flashattn.flash_attn_func(q, k.contiguous(), v.contiguous(), causal=True))
    # A dout expand()ed along the heads: the same gradients as its copy.
    q.requires_grad_()
    dout = torch.randn(3, 200, 1, 64, generator=g, device="cuda", dtype=torch.float16).expand(-1, -1, 4, -1)
    grads = [torch.autograd.grad(flashattn.flash_attn_func(q, k, v, causal=True, deterministic=True), q, d)[0]
             for d in (dout, dout.contiguous())]
    assert torch.equal(grads[0], grads[1])
