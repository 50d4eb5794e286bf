"""flashattn.bert_padding (flash_attn 2.x's padding helpers) on the CPU: packing,
unpacking, gradients, and a padded batch through the varlen function."""

import pytest
import torch
from flashattn import flash_attn_func, flash_attn_varlen_func
from flashattn.bert_padding import (
    index_first_axis,
    index_put_first_axis,
    pad_input,
    unpad_input,
    unpad_input_for_concatenated_sequences,
)


def random_mask(batch, seqlen, seed):
    """Right-padded rows of random lengths, one of them empty and one full."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(0, seqlen + 1, (batch,), generator=g)
    lengths[0], lengths[-1] = 0, seqlen
    return torch.arange(seqlen) < lengths[:, None]


@pytest.mark.parametrize("mask_dtype", [torch.bool, torch.int32, torch.int64])
def test_unpad_then_pad_is_the_masked_input(mask_dtype):
    b, s = 5, 11
    x = torch.randn(b, s, 3, 4)
    mask = random_mask(b, s, seed=1)
    packed, indices, cu, max_seqlen, seqused = unpad_input(x, mask.to(mask_dtype))
    lengths = mask.sum(-1)
    assert packed.shape == (int(lengths.sum()), 3, 4)
    assert indices.dtype == torch.int64 and torch.equal(indices, mask.flatten().nonzero().flatten())
    assert cu.dtype == torch.int32 and cu.tolist() == [0, *lengths.cumsum(0).tolist()]
    assert isinstance(max_seqlen, int) and max_seqlen == int(lengths.max())
    assert seqused.dtype == torch.int32 and seqused.tolist() == lengths.tolist()
    for i in range(b):  # sequence i's tokens, in order
        assert torch.equal(packed[cu[i] : cu[i + 1]], x[i, : lengths[i]])
    assert torch.equal(pad_input(packed, indices, b, s), x * mask[..., None, None])


def test_unpad_left_padding_and_holes():
    """Any mask, not only right padding: tokens keep their order within a row."""
    x = torch.arange(2 * 4, dtype=torch.float32).reshape(2, 4, 1)
    mask = torch.tensor([[0, 1, 0, 1], [0, 0, 1, 1]])
    packed, indices, cu, max_seqlen, _ = unpad_input(x, mask)
    assert packed.flatten().tolist() == [1.0, 3.0, 6.0, 7.0]
    assert indices.tolist() == [1, 3, 6, 7] and cu.tolist() == [0, 2, 4] and max_seqlen == 2


def test_unused_mask_is_packed_but_not_counted_as_used():
    x = torch.randn(2, 6, 2)
    mask = torch.tensor([[1, 1, 0, 0, 0, 0], [1, 1, 1, 0, 0, 0]])
    unused = torch.tensor([[0, 0, 1, 1, 0, 0], [0, 0, 0, 1, 0, 0]])
    packed, indices, cu, max_seqlen, seqused = unpad_input(x, mask, unused)
    assert cu.tolist() == [0, 4, 8] and max_seqlen == 4 and seqused.tolist() == [2, 3]
    assert indices.tolist() == [0, 1, 2, 3, 6, 7, 8, 9]
    assert torch.equal(packed, x.reshape(-1, 2)[indices])


def test_gradients_flow_through_unpad_and_pad():
    b, s = 4, 7
    mask = random_mask(b, s, seed=2)
    x = torch.randn(b, s, 3, dtype=torch.float64, requires_grad=True)
    packed, indices, *_ = unpad_input(x, mask)
    w = torch.randn_like(packed)
    (packed * w).sum().backward()
    expected = torch.zeros(b * s, 3, dtype=torch.float64)
    expected[indices] = w
    assert torch.equal(x.grad, expected.reshape(b, s, 3))

    y = torch.randn(int(mask.sum()), 3, dtype=torch.float64, requires_grad=True)
    torch.autograd.gradcheck(lambda t: pad_input(t, indices, b, s), (y,))
    torch.autograd.gradcheck(
        lambda t: index_first_axis(t, indices), (x.detach().reshape(b * s, 3).requires_grad_(),)
    )


def test_index_helpers_are_inverse():
    x = torch.randn(10, 2, 3)
    indices = torch.tensor([7, 0, 3])
    rows = index_first_axis(x, indices)
    assert torch.equal(rows, x[indices])
    back = index_put_first_axis(rows, indices, 10)
    expected = torch.zeros_like(x)
    expected[indices] = x[indices]
    assert torch.equal(back, expected)
    with pytest.raises(ValueError, match="at least 2 dims"):
        index_first_axis(torch.randn(10), indices)


def test_mask_of_the_wrong_shape_is_refused():
    with pytest.raises(ValueError, match=r"\(batch, seqlen\) = \(2, 5\)"):
        unpad_input(torch.randn(2, 5, 3), torch.ones(2, 4))


def test_concatenated_sequences():
    x = torch.arange(2 * 6, dtype=torch.float32).reshape(2, 6, 1)
    lengths = torch.tensor([[2, 3, 0, 0, 0, 0], [3, 2, 0, 0, 0, 0]])
    packed, indices, cu, max_seqlen = unpad_input_for_concatenated_sequences(x, lengths)
    assert cu.dtype == torch.int32 and cu.tolist() == [0, 2, 5, 8, 10]
    assert max_seqlen == 3
    assert indices.tolist() == [0, 1, 2, 3, 4, 6, 7, 8, 9, 10]
    assert torch.equal(packed.flatten(), x.flatten()[indices])


@pytest.mark.parametrize("causal", [False, True])
def test_padded_batch_through_varlen_equals_each_sequence_alone(causal):
    """The usual pattern: unpad q, k, v by the mask, varlen attention, pad the output."""
    b, s, h, d = 4, 9, 2, 16
    mask = random_mask(b, s, seed=3)
    g = torch.Generator().manual_seed(4)
    q, k, v = (torch.randn(b, s, h, d, generator=g, dtype=torch.float64) for _ in range(3))
    q_p, indices, cu, max_s, _ = unpad_input(q, mask)
    k_p, *_ = unpad_input(k, mask)
    v_p, *_ = unpad_input(v, mask)
    out = pad_input(
        flash_attn_varlen_func(q_p, k_p, v_p, cu, cu, max_s, max_s, causal=causal), indices, b, s
    )
    for i in range(b):
        n = int(mask[i].sum())
        assert not out[i, n:].any()  # padding rows stay 0
        if n:
            alone = flash_attn_func(
                q[i : i + 1, :n], k[i : i + 1, :n], v[i : i + 1, :n], causal=causal
            )
            torch.testing.assert_close(out[i : i + 1, :n], alone)
