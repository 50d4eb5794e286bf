"""The public functions on CPU tensors: flash_attn 2.x behaviour, padding, dropout, compile."""

import math

import flashattn
import pytest
import torch
from flashattn import (
    _ops,
    flash_attn_func,
    flash_attn_kvpacked_func,
    flash_attn_qkvpacked_func,
    reference,
)


def rand(*shape, dtype=torch.float64, seed=0, requires_grad=False):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g, dtype=dtype).requires_grad_(requires_grad)


def test_exports():
    assert flashattn.__version__ == "0.1.0"
    for name in (
        "flash_attn_func",
        "flash_attn_qkvpacked_func",
        "flash_attn_kvpacked_func",
        "build_info",
        "reference",
    ):
        assert hasattr(flashattn, name)


def test_matches_reference_with_flash_attn_defaults():
    q, k, v = rand(2, 7, 4, 32, seed=1), rand(2, 9, 2, 32, seed=2), rand(2, 9, 2, 32, seed=3)
    out = flash_attn_func(q, k, v)
    want, _ = reference.attention(q, k, v, softmax_scale=1 / math.sqrt(32))
    torch.testing.assert_close(out, want)


@pytest.mark.parametrize("d", [3, 20, 36, 100])
def test_head_dim_padding(d):
    # Any d <= 256 works; the scale defaults to 1/sqrt of the original d.
    q, k, v = (rand(1, 5, 2, d, seed=s, requires_grad=True) for s in range(3))
    out = flash_attn_func(q, k, v, causal=True)
    assert out.shape == q.shape
    want, _ = reference.attention(q, k, v, softmax_scale=d**-0.5, causal=True)
    torch.testing.assert_close(out, want)
    grads = torch.autograd.grad(out.sum(), (q, k, v))
    want_grads = torch.autograd.grad(want.sum(), (q, k, v))
    for g, w in zip(grads, want_grads):
        assert g.shape == w.shape
        torch.testing.assert_close(g, w)


def test_return_attn_probs():
    q, k, v = rand(2, 6, 4, 16, seed=0), rand(2, 5, 4, 16, seed=1), rand(2, 5, 4, 16, seed=2)
    out, lse, probs = flash_attn_func(q, k, v, causal=True, return_attn_probs=True)
    assert probs is None
    assert lse.shape == (2, 4, 6) and lse.dtype == torch.float32
    want, want_lse = reference.attention(q, k, v, causal=True)
    torch.testing.assert_close(out, want)
    torch.testing.assert_close(lse, want_lse.float())
    assert torch.isinf(lse[:, :, 0]).all()  # row 0 of 6 queries over 5 keys sees nothing


def test_qkvpacked_equals_unpacked():
    qkv = rand(2, 8, 3, 4, 16, requires_grad=True)
    out = flash_attn_qkvpacked_func(qkv, causal=True, softcap=3.0)
    q, k, v = (qkv.detach()[:, :, i].clone().requires_grad_() for i in range(3))
    want = flash_attn_func(q, k, v, causal=True, softcap=3.0)
    torch.testing.assert_close(out, want)
    dout = torch.randn_like(out)
    out.backward(dout)
    want.backward(dout)
    torch.testing.assert_close(qkv.grad, torch.stack([q.grad, k.grad, v.grad], dim=2))


def test_kvpacked_equals_unpacked():
    q = rand(2, 5, 6, 24, seed=1, requires_grad=True)
    kv = rand(2, 7, 2, 3, 24, seed=2, requires_grad=True)  # GQA: 6 query heads over 3
    out = flash_attn_kvpacked_func(q, kv, window_size=(2, 1))
    k, v = (kv.detach()[:, :, i].clone().requires_grad_() for i in range(2))
    q2 = q.detach().clone().requires_grad_()
    want = flash_attn_func(q2, k, v, window_size=(2, 1))
    torch.testing.assert_close(out, want)
    out.sum().backward()
    want.sum().backward()
    torch.testing.assert_close(q.grad, q2.grad)
    torch.testing.assert_close(kv.grad, torch.stack([k.grad, v.grad], dim=2))


def test_window_size_of_any_integer_pair():
    # flash_attn takes any pair of integers; its tests draw torch.randint(0, s_k, (2,)).
    q, k, v = (rand(1, 9, 2, 16, seed=s) for s in range(3))
    want = flash_attn_func(q, k, v, window_size=(3, 1))
    for pair in ([3, 1], torch.tensor([3, 1]), (torch.tensor(3), 1)):
        assert torch.equal(flash_attn_func(q, k, v, window_size=pair), want)
    cu = torch.tensor([0, 9], dtype=torch.int32)
    out = flashattn.flash_attn_varlen_func(q[0], k[0], v[0], cu, cu, 9, 9, window_size=torch.tensor([3, 1]))
    torch.testing.assert_close(out, want[0])
    for bad in (torch.tensor([3.0, 1.0]), torch.tensor(3), (1, 2, 3)):
        with pytest.raises(flashattn.FlashAttnError, match="window_"):
            flash_attn_func(q, k, v, window_size=bad)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_low_precision_inputs_on_cpu(dtype):
    q, k, v = (rand(1, 6, 2, 16, dtype=dtype, seed=s) for s in range(3))
    out = flash_attn_func(q, k, v)
    assert out.dtype == dtype
    want, _ = reference.attention(q, k, v)
    torch.testing.assert_close(out, want)


@pytest.mark.parametrize("which", ["q", "k", "v"])
def test_non_contiguous_last_dim_is_copied(which):
    # As flash_attn 2.x: the public functions accept a last dim with stride != 1.
    q, k, v = rand(2, 5, 4, 16, seed=0), rand(2, 6, 2, 16, seed=1), rand(2, 6, 2, 16, seed=2)
    want = flash_attn_func(q, k, v, causal=True)
    strided = {"q": q, "k": k, "v": v}
    t = strided[which]
    strided[which] = t.transpose(-1, -2).contiguous().transpose(-1, -2)
    assert strided[which].stride(-1) != 1 and torch.equal(strided[which], t)
    torch.testing.assert_close(flash_attn_func(**strided, causal=True), want)


def test_family_is_ignored_for_cpu_tensors(monkeypatch):
    q, k, v = (rand(1, 4, 2, 8, seed=s) for s in range(3))
    monkeypatch.setenv("FLASHATTN_FAMILY", "sm75")
    torch.testing.assert_close(flash_attn_func(q, k, v, family="sm80"), flash_attn_func(q, k, v))


def _spy_backward(monkeypatch):
    calls = []
    real = _ops.attention_backward

    def spy(dout, saved, args, deterministic):
        calls.append({"saved": saved, "args": args, "deterministic": deterministic})
        return real(dout, saved, args, deterministic)

    monkeypatch.setattr(_ops, "attention_backward", spy)
    return calls


@pytest.mark.parametrize("deterministic", [False, True])
def test_deterministic_reaches_the_backward(monkeypatch, deterministic):
    calls = _spy_backward(monkeypatch)
    q, k, v = (rand(1, 4, 2, 8, seed=s, requires_grad=True) for s in range(3))
    flash_attn_func(q, k, v, deterministic=deterministic).sum().backward()
    assert [c["deterministic"] for c in calls] == [deterministic]


def test_dropout_forward():
    q, k, v = (rand(2, 16, 4, 16, dtype=torch.float32, seed=s) for s in range(3))
    torch.manual_seed(0)
    a = flash_attn_func(q, k, v, dropout_p=0.3)
    torch.manual_seed(0)
    b = flash_attn_func(q, k, v, dropout_p=0.3)
    c = flash_attn_func(q, k, v, dropout_p=0.3)
    assert torch.equal(a, b)  # same global seed -> same rng_state -> same mask
    assert not torch.equal(a, c)
    nodrop = flash_attn_func(q, k, v)
    assert torch.equal(flash_attn_func(q, k, v, dropout_p=0.0), nodrop)
    assert not torch.equal(a, nodrop)


def test_dropout_preserves_the_mean():
    # Identical values: every output is a dropped, rescaled average of ones.
    q, k = rand(4, 64, 4, 8, dtype=torch.float32, seed=0), rand(4, 64, 4, 8, dtype=torch.float32)
    v = torch.ones(4, 64, 4, 8)
    out = flash_attn_func(q, k, v, dropout_p=0.2)
    assert abs(out.mean().item() - 1.0) < 0.03


def test_dropout_backward_uses_the_forward_mask(monkeypatch):
    calls = _spy_backward(monkeypatch)
    q, k, v = (rand(1, 6, 2, 8, seed=s, requires_grad=True) for s in range(3))
    out = flash_attn_func(q, k, v, dropout_p=0.25, causal=True)
    dout = torch.randn_like(out)
    grads = torch.autograd.grad(out, (q, k, v), dout)
    rng_state = calls[0]["saved"][6]
    want = reference.attention(q, k, v, causal=True, dropout_p=0.25, rng_state=rng_state)[0]
    torch.testing.assert_close(out, want)
    for g, w in zip(grads, torch.autograd.grad(want, (q, k, v), dout)):
        torch.testing.assert_close(g, w)


@pytest.mark.parametrize("dynamic", [False, True])
def test_torch_compile_fullgraph(dynamic):
    def loss(q, k, v):
        out = flash_attn_func(q, k, v, causal=True, softcap=4.0)
        return (out * out).sum()

    compiled = torch.compile(loss, fullgraph=True, backend="aot_eager", dynamic=dynamic)
    for s_q, d in ((5, 16), (7, 20)):  # d = 20 takes the padding path
        q = rand(2, s_q, 4, d, dtype=torch.float32, seed=1, requires_grad=True)
        k = rand(2, 6, 2, d, dtype=torch.float32, seed=2, requires_grad=True)
        v = rand(2, 6, 2, d, dtype=torch.float32, seed=3, requires_grad=True)
        want = torch.autograd.grad(loss(q, k, v), (q, k, v))
        got_loss = compiled(q, k, v)
        torch.testing.assert_close(got_loss, loss(q, k, v))
        for g, w in zip(torch.autograd.grad(got_loss, (q, k, v)), want):
            torch.testing.assert_close(g, w)


def test_torch_compile_with_dropout_and_packed_qkv():
    def loss(qkv):
        return flash_attn_qkvpacked_func(qkv, dropout_p=0.1, deterministic=True).sum()

    qkv = rand(2, 5, 3, 2, 16, dtype=torch.float32, requires_grad=True)
    compiled = torch.compile(loss, fullgraph=True, backend="aot_eager")
    compiled(qkv).backward()
    assert qkv.grad.shape == qkv.shape and torch.isfinite(qkv.grad).all()


def test_functorch_grad_matches_autograd():
    q, k, v = (rand(1, 5, 2, 8, seed=s) for s in range(3))

    def loss(q):
        return flash_attn_func(q, k, v, causal=True).square().sum()

    qg = q.clone().requires_grad_()
    want = torch.autograd.grad(loss(qg), qg)[0]
    torch.testing.assert_close(torch.func.grad(loss)(q), want)


def test_forward_mode_ad_is_not_silently_dropped():
    # No jvp is implemented: forward-mode AD must raise, never return an output
    # without its tangent.
    import torch.autograd.forward_ad as fwAD

    q, k, v = (rand(1, 5, 2, 8, seed=s) for s in range(3))
    with fwAD.dual_level():
        try:
            out = flash_attn_func(fwAD.make_dual(q, torch.ones_like(q)), k, v)
        except (RuntimeError, NotImplementedError):
            return
        assert fwAD.unpack_dual(out).tangent is not None


def test_import_does_not_load_dynamo():
    # torch._dynamo takes ~1.2 s to import; `import flashattn` must not pull it in.
    import subprocess
    import sys

    code = "import sys, flashattn; print('torch._dynamo' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={**__import__("os").environ, "PYTHONPATH": ":".join(sys.path)})
    assert out.stdout.strip() == "False", out.stdout + out.stderr


def test_dispatch_is_a_compile_constant():
    # _dispatch marks cuda_family_and_head_dims as assume_constant_result does, by hand
    # (the decorator imports dynamo): the attribute must still be what it sets.
    from flashattn import _dispatch

    marked = torch.compiler.assume_constant_result(lambda: 0)
    assert getattr(marked, "_dynamo_marked_constant", None) is True
    assert _dispatch.cuda_family_and_head_dims._dynamo_marked_constant is True


def test_forward_inputs_broadcast_views_are_copied():
    # expand()ed q/k/v of the forward and dout of the backward (stride 0 along a dim
    # of size > 1) reach the kernels as real copies: the sm90 family reads them by TMA.
    from flashattn._checks import aligned_for_kernels

    k = torch.randn(1, 16, 2, 8).expand(3, 16, 2, 8)
    copied = aligned_for_kernels(k, broadcast_ok=False)
    assert copied.is_contiguous() and torch.equal(copied, k)
    assert aligned_for_kernels(k) is k
    one = torch.randn(1, 16, 2, 8)  # size-1 dims keep any stride
    assert aligned_for_kernels(one, broadcast_ok=False) is one
