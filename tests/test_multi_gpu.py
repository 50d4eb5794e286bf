"""Inputs on a GPU other than the current one (a model split across GPUs, as
`device_map="auto"` places its layers, calls attention on cuda:1 while cuda:0 is
current). Every op must run on its inputs' device, on that device's current stream:
a launch on the current device would read another GPU's memory.

Each call runs twice, once with the inputs' device current and once with the other
GPU current, and the two results must be bitwise equal (same kernels, same inputs;
deterministic backwards, dropout from equally seeded generators). Skipped without two
GPUs of the same compute capability.
"""

import flashattn
import pytest
import torch
from _gpu import call_kernel
from test_fwd_gpu import FAMILY_DTYPES, require

def _why_not_two_alike_gpus():
    if torch.cuda.device_count() < 2:
        return "needs two GPUs"
    if torch.cuda.get_device_capability(0) != torch.cuda.get_device_capability(1):
        return "needs two GPUs of the same compute capability"
    return None


_WHY_NOT = _why_not_two_alike_gpus()
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(_WHY_NOT is not None, reason=str(_WHY_NOT))]

# (current device, inputs' device)
PLACEMENTS = [pytest.param(0, 1, id="current0-data1"), pytest.param(1, 0, id="current1-data0")]


def run_with_current(current, fn):
    """fn() with `current` the current device, synchronised (a fault surfaces here)."""
    with torch.cuda.device(current):
        result = fn()
    torch.cuda.synchronize(0)
    torch.cuda.synchronize(1)
    return result


def assert_same_bits(name, got, want):
    assert got.device == want.device, f"{name} on {got.device}, expected {want.device}"
    assert torch.equal(got.view(torch.uint8) if got.is_floating_point() else got,
                       want.view(torch.uint8) if want.is_floating_point() else want), (
        f"{name} differs when another GPU is current"
    )


def randn(shape, dtype, device, seed):
    g = torch.Generator("cuda:0").manual_seed(seed)
    return torch.randn(*shape, generator=g, device="cuda:0", dtype=dtype).to(device)


@pytest.mark.parametrize("current, data", PLACEMENTS)
@pytest.mark.parametrize("family, dtype", FAMILY_DTYPES)
@pytest.mark.parametrize("dropout_p", [0.0, 0.17])
def test_dense_forward_backward(family, dtype, current, data, dropout_p):
    fam = require(family, dtype, 64)
    dev = torch.device("cuda", data)
    q, k, v, dout = (randn((2, 300, 4, 64), dtype, dev, seed) for seed in range(4))

    def step():
        qq, kk, vv = (t.detach().clone().requires_grad_() for t in (q, k, v))
        torch.cuda.manual_seed_all(5)  # the same dropout mask on either GPU's generator
        out = call_kernel(flashattn.flash_attn_func, qq, kk, vv, dropout_p, causal=True, window_size=(100, 0),
                          deterministic=True, family=fam)
        out.backward(dout)
        return out.detach(), qq.grad, kk.grad, vv.grad

    want = run_with_current(data, step)
    got = run_with_current(current, step)
    for name, g, w in zip(("out", "dq", "dk", "dv"), got, want):
        assert torch.isfinite(w).all(), name
        assert_same_bits(name, g, w)


@pytest.mark.parametrize("current, data", PLACEMENTS)
@pytest.mark.parametrize("family, dtype", FAMILY_DTYPES)
def test_varlen_forward_backward(family, dtype, current, data):
    fam = require(family, dtype, 128)
    dev = torch.device("cuda", data)
    lengths = [1, 130, 0, 257, 64]
    cu = torch.tensor([0] + torch.tensor(lengths).cumsum(0).tolist(), dtype=torch.int32, device=dev)
    total = sum(lengths)
    q, dout = (randn((total, 8, 128), dtype, dev, seed) for seed in (0, 3))
    k, v = (randn((total, 2, 128), dtype, dev, seed) for seed in (1, 2))

    def step():
        qq, kk, vv = (t.detach().clone().requires_grad_() for t in (q, k, v))
        out = call_kernel(flashattn.flash_attn_varlen_func, qq, kk, vv, cu, cu, max(lengths), max(lengths),
                          causal=True, softcap=20.0, deterministic=True, family=fam)
        out.backward(dout)
        return out.detach(), qq.grad, kk.grad, vv.grad

    want = run_with_current(data, step)
    got = run_with_current(current, step)
    for name, g, w in zip(("out", "dq", "dk", "dv"), got, want):
        assert_same_bits(name, g, w)


@pytest.mark.parametrize("current, data", PLACEMENTS)
@pytest.mark.parametrize("family, dtype", FAMILY_DTYPES)
@pytest.mark.parametrize("paged", [False, True], ids=["contiguous", "paged"])
def test_kvcache_append_rotary_and_decode(family, dtype, current, data, paged):
    fam = require(family, dtype, 128)
    dev = torch.device("cuda", data)
    b, s_cache, h, h_k, d, s_new = 3, 512, 8, 2, 128, 2
    seqlens = torch.tensor([5, 300, 509], dtype=torch.int32, device=dev)
    q = randn((b, 1 + s_new, h, d), dtype, dev, 0)
    k_new, v_new = (randn((b, s_new, h_k, d), dtype, dev, seed) for seed in (1, 2))
    k_cache, v_cache = (randn((b, s_cache, h_k, d), dtype, dev, seed) for seed in (3, 4))
    angles = torch.arange(s_cache, device=dev, dtype=torch.float32)[:, None] * torch.linspace(
        1.0, 1e-3, d // 4, device=dev
    )
    cos, sin = angles.cos().to(dtype), angles.sin().to(dtype)
    block_table = None
    if paged:  # pages of 16 rows, in a shuffled order
        page = 16
        perm = torch.randperm(b * s_cache // page, generator=torch.Generator().manual_seed(0))
        block_table = perm.view(b, s_cache // page).to(torch.int32).to(dev)
        pages = lambda c: c.reshape(b * s_cache // page, page, h_k, d)[perm.argsort().to(dev)]
        k_cache, v_cache = pages(k_cache), pages(v_cache)

    def step(num_splits):
        kc, vc = k_cache.clone(), v_cache.clone()
        out, lse = call_kernel(
            flashattn.flash_attn_with_kvcache, q, kc, vc, k_new, v_new, rotary_cos=cos, rotary_sin=sin,
            cache_seqlens=seqlens, block_table=block_table, causal=True, num_splits=num_splits,
            return_softmax_lse=True, family=fam,
        )
        return out, lse, kc, vc

    for num_splits in (1, 3):  # 3: the split-KV kernel and its merge
        want = run_with_current(data, lambda: step(num_splits))
        got = run_with_current(current, lambda: step(num_splits))
        for name, g, w in zip(("out", "lse", "k_cache", "v_cache"), got, want):
            assert_same_bits(f"{name} (num_splits {num_splits})", g, w)


def test_inputs_on_two_gpus_are_refused():
    q = torch.randn(1, 8, 2, 64, device="cuda:0", dtype=torch.float16)
    k = torch.randn(1, 8, 2, 64, device="cuda:1", dtype=torch.float16)
    with pytest.raises(Exception, match="cuda:0.*cuda:1|cuda:1.*cuda:0"):
        flashattn.flash_attn_func(q, k, k)
