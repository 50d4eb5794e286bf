"""The correctness standard of DESIGN.md.

A kernel's error against a float32/float64 reference computed from the same inputs
must be at most FACTOR x the error of PyTorch's own low-precision math against that
reference, plus a small epsilon: factor 2 for the forward, 3 for the backward. NaN
never passes.
"""

import torch

FWD_FACTOR = 2.0
BWD_FACTOR = 3.0


def max_err(a: torch.Tensor, b: torch.Tensor) -> float:
    if a.numel() == 0:  # e.g. the keys' gradients of a varlen batch without keys
        return 0.0
    return (a.double() - b.double()).abs().max().item()


def assert_standard(name, ours, ref, lowp, factor, eps=1e-5):
    """max|ours - ref| <= factor * max|lowp - ref| + eps; no NaN in ours."""
    assert ours.shape == ref.shape == lowp.shape, (name, ours.shape, ref.shape, lowp.shape)
    assert not torch.isnan(ours).any(), f"{name}: NaN in the kernel's output"
    assert not torch.isnan(ref).any(), f"{name}: NaN in the reference"
    err = max_err(ours, ref)
    lowp_err = max_err(lowp, ref)
    bound = factor * lowp_err + eps
    assert err <= bound, (
        f"{name}: max error {err:.3e} > {factor:g} x low-precision error {lowp_err:.3e} + {eps:g}"
    )


def assert_lse(ours, ref, lowp, factor=FWD_FACTOR):
    """softmax_lse: +inf rows (no visible key) must match exactly; finite entries obey
    the standard with an epsilon relative to the lse's magnitude (it is ~log(s_k) plus
    the largest score, and fp32 carries ~7 digits of it)."""
    assert ours.dtype == torch.float32, ours.dtype
    assert not torch.isnan(ours).any(), "softmax_lse: NaN"
    inf_ours, inf_ref = torch.isinf(ours), torch.isinf(ref)
    assert torch.equal(inf_ours, inf_ref), "softmax_lse: +inf rows differ from the reference"
    assert (ours[inf_ours] > 0).all(), "softmax_lse: a fully masked row must be +inf, not -inf"
    finite = ~inf_ref
    if finite.any():
        eps = 1e-3 * max(1.0, ref[finite].abs().max().item())
        assert_standard(
            "softmax_lse", ours[finite], ref[finite].float(), lowp[finite].float(), factor, eps
        )
