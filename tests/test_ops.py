"""The torch.ops.flashattn ops: schemas, opcheck, fake kernels, out variants, autograd."""

import flashattn
import pytest
import torch
from flashattn import _ops, reference

OPS = torch.ops.flashattn


def _inputs(b=2, s_q=5, s_k=7, h=4, h_k=2, d=16, dtype=torch.float32, requires_grad=False):
    g = torch.Generator().manual_seed(0)
    return tuple(
        torch.randn(b, s, heads, d, generator=g, dtype=dtype, requires_grad=requires_grad)
        for s, heads in ((s_q, h), (s_k, h_k), (s_k, h_k))
    )


# (alibi, rng_state, dropout_p, softmax_scale, causal, window_left, window_right, softcap)
VARIANTS = {
    "plain": (None, None, 0.0, 0.25, False, -1, -1, 0.0),
    "causal_softcap": (None, None, 0.0, 0.3, True, -1, -1, 2.0),
    "window_alibi": (torch.rand(4), None, 0.0, 0.25, False, 2, 1, 0.0),
    "dropout": (None, torch.tensor([5, 0]), 0.2, 0.25, True, -1, -1, 0.0),
}


def test_schemas_are_those_of_ops_md():
    names = ("fwd", "fwd_out", "bwd", "bwd_out", "varlen_fwd", "varlen_fwd_out", "varlen_bwd", "varlen_bwd_out",
             "varlen_fwd_cache", "fwd_kvcache")
    assert len(_ops.SCHEMAS) == len(names)
    for name, schema in zip(names, _ops.SCHEMAS):
        assert str(getattr(OPS, name).default._schema) == f"flashattn::{schema}"


@pytest.mark.parametrize("variant", VARIANTS)
def test_opcheck_fwd(variant):
    q, k, v = _inputs(requires_grad=True)
    torch.library.opcheck(OPS.fwd.default, (q, k, v, *VARIANTS[variant], 0))


@pytest.mark.parametrize("variant", VARIANTS)
def test_opcheck_fwd_out(variant):
    q, k, v = _inputs()
    out = torch.empty_like(q)
    torch.library.opcheck(OPS.fwd_out.default, (q, k, v, out, *VARIANTS[variant], 0))


def _bwd_inputs(variant):
    q, k, v = _inputs()
    opts = VARIANTS[variant]
    out, lse = OPS.fwd(q, k, v, *opts, 0)
    return (torch.randn_like(out), q, k, v, out, lse), opts


@pytest.mark.parametrize("deterministic", [False, True])
@pytest.mark.parametrize("variant", VARIANTS)
def test_opcheck_bwd(variant, deterministic):
    tensors, opts = _bwd_inputs(variant)
    torch.library.opcheck(OPS.bwd.default, (*tensors, *opts, deterministic, 0))


@pytest.mark.parametrize("variant", VARIANTS)
def test_opcheck_bwd_out(variant):
    tensors, opts = _bwd_inputs(variant)
    grads = tuple(torch.empty_like(t) for t in tensors[1:4])
    torch.library.opcheck(OPS.bwd_out.default, (*tensors, *grads, *opts, False, 0))


def test_fake_outputs_are_contiguous():
    # The CUDA kernels allocate contiguous outputs; the fake kernels must say the same,
    # also for strided inputs (views of packed qkv).
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        qkv = torch.empty(2, 9, 3, 4, 16, dtype=torch.float16, device="cuda")
        q, k, v = qkv.unbind(2)
        out, lse = OPS.fwd(q, k, v, None, None, 0.0, 0.25, False, -1, -1, 0.0, 80)
        assert out.shape == q.shape and out.is_contiguous() and out.dtype == torch.float16
        assert lse.shape == (2, 4, 9) and lse.is_contiguous() and lse.dtype == torch.float32
        dq, dk, dv = OPS.bwd(
            out, q, k, v, out, lse, None, None, 0.0, 0.25, False, -1, -1, 0.0, False, 80
        )
        for grad, like in ((dq, q), (dk, k), (dv, v)):
            assert grad.shape == like.shape and grad.is_contiguous()


def test_out_variants_write_their_outputs():
    q, k, v = _inputs(dtype=torch.float64)
    opts = (None, None, 0.0, 0.25, True, -1, -1, 0.0)
    out, lse = OPS.fwd(q, k, v, *opts, 0)
    poisoned = torch.full_like(q, float("nan"))
    lse2 = OPS.fwd_out(q, k, v, poisoned, *opts, 0)
    assert torch.equal(poisoned, out) and torch.equal(lse2, lse)

    dout = torch.randn_like(out)
    dq, dk, dv = OPS.bwd(dout, q, k, v, out, lse, *opts, False, 0)
    grads = tuple(torch.full_like(t, float("nan")) for t in (q, k, v))
    assert OPS.bwd_out(dout, q, k, v, out, lse, *grads, *opts, False, 0) is None
    for got, want in zip(grads, (dq, dk, dv)):
        assert torch.equal(got, want)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.float64])
def test_cpu_op_matches_reference(dtype):
    q, k, v = _inputs(dtype=dtype)
    out, lse = OPS.fwd(q, k, v, None, None, 0.0, 0.25, True, -1, -1, 0.0, 0)
    want, want_lse = reference.attention(q, k, v, 0.25, causal=True)
    assert out.dtype == dtype and lse.dtype == torch.float32
    assert torch.equal(out, want) and torch.equal(lse, want_lse.float())


def test_raw_op_autograd():
    q, k, v = _inputs(dtype=torch.float64, requires_grad=True)
    out, lse = OPS.fwd(q, k, v, None, None, 0.0, 0.3, True, -1, -1, 0.0, 0)
    assert not lse.requires_grad
    dout = torch.randn_like(out)
    out.backward(dout)
    want = reference.attention_bwd(
        dout, q.detach(), k.detach(), v.detach(), out.detach(), lse, 0.3, causal=True
    )
    for t, w in zip((q, k, v), want):
        torch.testing.assert_close(t.grad, w)


def test_extension_status_is_reported():
    info = flashattn.build_info()
    assert info["extension_loaded"] == _ops.EXTENSION_LOADED
    if not info["extension_loaded"]:
        assert "_C" in info["extension_error"]


def test_built_extension_loads():
    # An install that holds kernels must load them, also under a CPU-only torch
    # (the module resolves libtorch_cuda at its first CUDA call, not at load).
    info = flashattn.build_info()
    if not info["families"]:
        pytest.skip("no compiled extension in this install")
    assert info["extension_loaded"], info["extension_error"]


def test_extension_exports_no_cxx_runtime():
    # Static archives linked into the module (cudart, or libstdc++.a where the
    # toolchain has no shared one) must stay private: exported, their symbols bind
    # to the process's libstdc++ at load time, and a failing argument check then
    # crashed formatting its message (CMakeLists.txt, --exclude-libs).
    import importlib.util
    import shutil
    import subprocess

    spec = importlib.util.find_spec("flashattn._C")
    if spec is None or spec.origin is None or shutil.which("nm") is None:
        pytest.skip("no built extension or no nm")
    lines = subprocess.run(["nm", "-D", "--defined-only", spec.origin], capture_output=True, text=True,
                           check=True).stdout.splitlines()
    # cpp/exports.map hides every symbol, the std:: templates the code instantiates
    # (weak, W/V) included: exported, they too would bind to another library's copy.
    exported = [f[2] for f in (line.split() for line in lines) if len(f) == 3]
    leaked = [s for s in exported if s.startswith(("_ZNSt", "_ZSt", "_ZNKSt", "_ZTI", "_ZTS", "_ZTV", "__cxa_", "__gxx_"))]
    assert not leaked, f"the extension exports C++ runtime symbols: {leaked[:5]}"


def test_a_failed_load_names_the_loaders_reason(tmp_path):
    # torch.ops.load_library says only "Could not load this library"; the reason
    # (here: not an ELF file; on an old distribution, the missing GLIBC_ version) is
    # its cause, and build_info()["extension_error"] must show it.
    (tmp_path / "_C.so").write_bytes(b"not a shared object")
    loaded, error = _ops._load_extension(str(tmp_path))
    assert not loaded
    assert "_C.so" in error and "Could not load this library" in error
    assert "OSError" in error and ("ELF" in error or "too short" in error), error


def test_release_checks_read_the_installed_module():
    # scripts/check_wheel.py's readers on this build's module: the glibc versions it
    # needs (within this machine's, or it would not have loaded), torch's C shim among
    # its libraries, nothing of the C++ runtime exported.
    import importlib.util
    import os
    import platform
    import shutil
    import sys

    spec = importlib.util.find_spec("flashattn._C")
    if spec is None or spec.origin is None or not all(shutil.which(t) for t in ("objdump", "readelf", "nm")):
        pytest.skip("no built extension or no binutils")
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "scripts"))
    try:
        import check_wheel
    finally:
        sys.path.pop(0)
    from pathlib import Path

    so = Path(spec.origin)
    versions = check_wheel.glibc_versions(so)
    libc = tuple(int(x) for x in platform.libc_ver()[1].split(".")[:2])
    assert versions and versions[-1][:2] <= libc, (versions, libc)
    needed, rpaths = check_wheel.needed_libraries(so)
    assert "libtorch_cpu.so" in needed and not rpaths, (needed, rpaths)
    assert check_wheel.exported_cxx_runtime(so) == []
    assert check_wheel.manylinux_glibc("flashattn-0.1.0+cu13-py3-none-manylinux_2_28_x86_64.whl") == (2, 28)
