"""FLASHATTN_MAX_SMEM_KB: the tiles of GPUs with 99 KB of shared memory per block
(cc 8.6/8.9) run on any GPU, and a cap no tile fits gives a clear error.

The cap is read once per process, so each check runs in a fresh interpreter; the
whole GPU suite under the cap is `FLASHATTN_MAX_SMEM_KB=99 bash scripts/gpu_suite.sh`.
"""

import os
import subprocess
import sys
import textwrap

import flashattn
import pytest
import torch
from _gpu import gpu_skip_reason

pytestmark = pytest.mark.gpu

HERE = os.path.dirname(os.path.abspath(__file__))

SCRIPT = textwrap.dedent(
    """
    import math, sys, torch, flashattn
    from flashattn import reference
    torch.backends.cuda.matmul.allow_tf32 = False
    d = int(sys.argv[1])
    g = torch.Generator("cuda").manual_seed(d)
    q, k, v, do = (torch.randn(2, 300, 4, d, generator=g, device="cuda", dtype=torch.bfloat16)
                   for _ in range(4))
    for t in (q, k, v):
        t.requires_grad_(True)
    out = flashattn.flash_attn_func(q, k, v, causal=True, family="sm80")
    grads = torch.autograd.grad(out, (q, k, v), do)
    ref = reference.attention(q.double(), k.double(), v.double(), causal=True)[0]
    ref_grads = torch.autograd.grad(ref, (q, k, v), do.double())
    errs = [(out.double() - ref).abs().max().item()]
    errs += [(a.double() - b).abs().max().item() for a, b in zip(grads, ref_grads)]
    print("errors", errs)
    assert max(errs[:1]) < 2e-2 and max(errs[1:]) < 5e-2, errs
    """
)


def _run(env_cap, *args):
    env = dict(os.environ, FLASHATTN_MAX_SMEM_KB=env_cap)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (env.get("PYTHONPATH"), HERE) if p)
    return subprocess.run(
        [sys.executable, "-c", SCRIPT, *args], env=env, capture_output=True, text=True, timeout=300
    )


@pytest.fixture(autouse=True)
def _gpu():
    reason = gpu_skip_reason()
    if reason:
        pytest.skip(reason)
    if torch.cuda.get_device_capability() < (8, 0):
        pytest.skip("the sm80 family needs compute capability 8.0")
    if "sm80" not in flashattn.build_info()["families"]:
        pytest.skip("the build has no sm80 family")


def _largest_head_dim():
    return max(flashattn.build_info()["head_dims"] or [256])


@pytest.mark.parametrize("d", [64, 128, 192, 256])
def test_99kb_tiles_are_correct(d):
    info = flashattn.build_info()
    if not info["families"]["sm80"].get("smem99_tiles"):
        pytest.skip("built without the 99 KB tiles (FLASHATTN_SMEM99_ARCHS=none)")
    if d > _largest_head_dim() or (info["dtypes"] and "bf16" not in info["dtypes"]):
        pytest.skip(f"the build has no bf16 kernel bucket for head dim {d}")
    done = _run("99", str(d))
    assert done.returncode == 0, done.stdout + done.stderr


def test_a_cap_no_tile_fits_names_the_cap():
    done = _run("20", str(_largest_head_dim()))
    assert done.returncode != 0
    assert "needs" in done.stderr and "FLASHATTN_MAX_SMEM_KB allows 20 KB" in done.stderr, done.stderr


def test_a_bad_cap_is_a_clear_error():
    done = _run("lots", "64")
    assert done.returncode != 0
    assert "FLASHATTN_MAX_SMEM_KB='lots' is not a positive number of KB" in done.stderr, done.stderr
