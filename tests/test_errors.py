"""Bad inputs: each raises a FlashAttnError (a RuntimeError) that names the problem and the fix."""

import flashattn
import pytest
import torch
from flashattn import (
    FlashAttnError,
    flash_attn_func,
    flash_attn_kvpacked_func,
    flash_attn_qkvpacked_func,
)
from torch._subclasses.fake_tensor import FakeTensorMode

OPS = torch.ops.flashattn
OPTS = (None, None, 0.0, 0.25, False, -1, -1, 0.0)  # alibi .. softcap of the ops


def t(*shape, dtype=torch.float32, device="cpu"):
    return (
        torch.randn(*shape, dtype=dtype, device=device)
        if device != "meta"
        else torch.empty(*shape, dtype=dtype, device="meta")
    )


def qkv(b=2, s_q=5, s_k=6, h=4, h_k=2, d=16, **kw):
    return t(b, s_q, h, d, **kw), t(b, s_k, h_k, d, **kw), t(b, s_k, h_k, d, **kw)


def _fwd_op(q, k, v, *, opts=OPTS, family=0):
    return OPS.fwd(q, k, v, *opts, family)


def _bwd_op(dout=None, lse=None, out=None):
    q, k, v = qkv()
    fwd_out, fwd_lse = OPS.fwd(q, k, v, *OPTS, 0)
    dout = torch.randn_like(fwd_out) if dout is None else dout
    return OPS.bwd(
        dout,
        q,
        k,
        v,
        fwd_out if out is None else out,
        fwd_lse if lse is None else lse,
        *OPTS,
        False,
        0,
    )


def _cuda_fp32():
    with FakeTensorMode():
        flash_attn_func(*qkv(device="cuda"))



CASES = {
    "int_dtype": (
        lambda: flash_attn_func(*(x.to(torch.int32) for x in qkv())),
        ["q has dtype torch.int32", "cast with q.float() or q.half()"],
    ),
    "fp32_on_cuda": (
        _cuda_fp32,
        [
            "q has dtype torch.float32",
            "CUDA kernels take torch.float16 or torch.bfloat16",
            "q.half() or q.bfloat16()",
        ],
    ),
    "dtype_mix": (
        lambda: flash_attn_func(qkv()[0], *qkv(dtype=torch.float64)[1:]),
        ["q has dtype torch.float32 but k has torch.float64", "one dtype"],
    ),
    "device_mix": (
        lambda: flash_attn_func(qkv()[0], *qkv(device="meta")[1:]),
        ["q is on cpu but k is on meta", "put all inputs on one device"],
    ),
    "device_mix_raw_op": (
        lambda: _fwd_op(qkv()[0], qkv(device="meta")[1], qkv()[2]),
        ["q is on cpu but k is on meta", "one device"],
    ),
    "rank": (
        lambda: flash_attn_func(t(2, 5, 16), *qkv()[1:]),
        ["q must be 4-D (batch, seqlen, heads, head_dim)", "got shape (2, 5, 16)"],
    ),
    "batch_mismatch": (
        lambda: flash_attn_func(qkv(b=2)[0], *qkv(b=3)[1:]),
        ["q has batch 2 but k/v have batch 3"],
    ),
    "head_dim_mismatch": (
        lambda: flash_attn_func(qkv(d=16)[0], *qkv(d=24)[1:]),
        ["q has head dim 16 but k/v have head dim 24", "one head dim"],
    ),
    "k_v_shapes": (
        lambda: flash_attn_func(*qkv()[:2], t(2, 7, 2, 16)),
        ["k and v must have one shape", "(2, 6, 2, 16)", "(2, 7, 2, 16)"],
    ),
    "gqa_ratio": (
        lambda: flash_attn_func(*qkv(h=12, h_k=5)),
        ["12 query heads are not a multiple of 5 key/value heads", "h % h_k == 0"],
    ),
    "head_dim_too_big": (
        lambda: flash_attn_func(*qkv(d=320)),
        ["head dim 320 is over the maximum of 256"],
    ),
    "op_non_contiguous": (
        lambda: _fwd_op(qkv()[0].transpose(-1, -2).contiguous().transpose(-1, -2), *qkv()[1:]),
        ["q's last dim is not contiguous", "call q.contiguous()"],
    ),
    "empty_seqlen": (
        lambda: flash_attn_func(*qkv(s_q=0)),
        ["q has size 0 in dim 1 (seqlen)", "non-empty"],
    ),
    "empty_batch": (lambda: flash_attn_func(*qkv(b=0)), ["size 0 in dim 0 (batch)"]),
    "window_left": (
        lambda: flash_attn_func(*qkv(), window_size=(-2, 0)),
        ["window_left must be an int >= -1", "-1 means unbounded"],
    ),
    "window_right": (
        lambda: flash_attn_func(*qkv(), window_size=(0, 1.5)),
        ["window_right must be an int >= -1"],
    ),
    "window_not_pair": (
        lambda: flash_attn_func(*qkv(), window_size=3),
        ["window_size must be a pair (left, right)"],
    ),
    "dropout_one": (
        lambda: flash_attn_func(*qkv(), dropout_p=1.0),
        ["dropout_p must be a number in [0, 1)", "1.0"],
    ),
    "dropout_negative": (
        lambda: flash_attn_func(*qkv(), dropout_p=-0.1),
        ["dropout_p must be a number in [0, 1)"],
    ),
    "softcap": (
        lambda: flash_attn_func(*qkv(), softcap=-1.0),
        ["softcap must be a finite number >= 0"],
    ),
    "alibi_shape": (
        lambda: flash_attn_func(*qkv(), alibi_slopes=t(3)),
        ["alibi_slopes must have shape (heads,) = (4,) or (batch, heads) = (2, 4)", "got (3,)"],
    ),
    "alibi_dtype": (
        lambda: flash_attn_func(*qkv(), alibi_slopes=t(4, dtype=torch.float16)),
        ["alibi_slopes has dtype torch.float16", "torch.float32"],
    ),
    "alibi_device": (
        lambda: flash_attn_func(*qkv(), alibi_slopes=t(4, device="meta")),
        ["alibi_slopes is on meta", "one device"],
    ),
    "qkvpacked_shape": (
        lambda: flash_attn_qkvpacked_func(t(2, 5, 2, 4, 16)),
        ["qkv must be 5-D (batch, seqlen, 3, heads, head_dim)"],
    ),
    "kvpacked_shape": (
        lambda: flash_attn_kvpacked_func(qkv()[0], t(2, 6, 2, 16)),
        ["kv must be 5-D (batch, seqlen_k, 2, heads_k, head_dim)"],
    ),
    "family_name": (
        lambda: flash_attn_func(*qkv(), family="sm86"),
        ["family='sm86' is not a kernel family", "sm70, sm75, sm80, sm90"],
    ),
    "not_a_tensor": (lambda: flash_attn_func([1.0], *qkv()[1:]), ["q must be a torch.Tensor"]),
    # raw ops: what the public API would have fixed or supplied
    "op_head_dim_multiple": (
        lambda: _fwd_op(*qkv(d=20)),
        ["head dim 20 is not a multiple of 8", "pad q, k and v with zeros"],
    ),
    "op_dropout_without_rng": (
        lambda: _fwd_op(*qkv(), opts=(None, None, 0.1) + OPTS[3:]),
        ["dropout_p = 0.1 needs rng_state"],
    ),
    "op_rng_state": (
        lambda: _fwd_op(*qkv(), opts=(None, torch.tensor([1, 2, 3])) + OPTS[2:]),
        ["rng_state must be an int64 tensor of shape (2,)", "[seed, offset]"],
    ),
    "op_family_on_cpu": (
        lambda: _fwd_op(*qkv(), family=80),
        ["family=80 forces a CUDA kernel family", "pass family=0"],
    ),
    "op_family_value": (
        lambda: _fwd_op(*qkv(), family=86),
        ["family must be 0 (pick by device) or one of (70, 75, 80, 90)"],
    ),
    "op_out_dtype": (
        lambda: OPS.fwd_out(*qkv(), t(2, 5, 4, 16, dtype=torch.float64), *OPTS, 0),
        ["q has dtype torch.float32 but out has torch.float64"],
    ),
    "op_out_shape": (
        lambda: OPS.fwd_out(*qkv(), t(2, 5, 4, 8), *OPTS, 0),
        ["out must have the shape of q (2, 5, 4, 16), got (2, 5, 4, 8)"],
    ),
    "op_lse_shape": (
        lambda: _bwd_op(lse=t(2, 5, 4)),
        ["softmax_lse must have shape (batch, heads, seqlen_q) = (2, 4, 5)"],
    ),
    "op_lse_dtype": (
        lambda: _bwd_op(lse=t(2, 4, 5, dtype=torch.float64)),
        ["softmax_lse has dtype torch.float64", "torch.float32"],
    ),
    "op_dout_shape": (lambda: _bwd_op(dout=t(2, 5, 4, 8)), ["dout must have the shape of q"]),
}


@pytest.mark.parametrize("case", CASES)
def test_bad_input(case):
    fn, fragments = CASES[case]
    with pytest.raises(FlashAttnError) as info:
        fn()
    msg = str(info.value)
    assert isinstance(info.value, RuntimeError)
    assert msg.startswith("flashattn: "), msg
    for fragment in fragments:
        assert fragment in msg, f"{fragment!r} not in {msg!r}"


def test_errors_are_runtime_errors_like_flash_attn():
    assert issubclass(FlashAttnError, RuntimeError)
    assert flashattn.FlashAttnError is FlashAttnError
