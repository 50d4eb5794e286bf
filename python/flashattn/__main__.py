"""``python -m flashattn``: what this install holds, whether it runs here, and a self-test.

Prints the versions (flashattn, torch, CUDA), the GPU and the kernel family chosen for
it, what the build holds for that GPU (machine code, PTX compiled at first use, or
nothing and what to install instead), then checks a few attention calls against the
fp32 reference with DESIGN's rule (error <= 2x / 3x PyTorch's own low-precision error)
and times one shape beside PyTorch SDPA. Without a GPU it checks the CPU path (the
pure-PyTorch reference) against PyTorch's attention and says so. Exit status 0 when
every check passed, 1 otherwise.
"""

from __future__ import annotations

import argparse
import platform
import sys
import time

import torch
import torch.nn.functional as F

import flashattn
from flashattn import _dispatch, _families, reference
from flashattn._checks import FlashAttnError


class _Progress:
    """A one-line progress bar on a terminal, shown once the work has taken a second."""

    def __init__(self, total: int, stream=sys.stderr):
        self.total, self.done, self.stream = total, 0, stream
        self.start = time.perf_counter()
        self.shown = False

    def step(self, label: str) -> None:
        self.done += 1
        if not self.stream.isatty() or time.perf_counter() - self.start < 1.0:
            return
        filled = 30 * self.done // self.total
        self.stream.write(f"\r  [{'#' * filled}{'.' * (30 - filled)}] {self.done}/{self.total} {label:<40.40}")
        self.stream.flush()
        self.shown = True

    def close(self) -> None:
        if self.shown:
            self.stream.write("\r" + " " * 80 + "\r")
            self.stream.flush()


def _err(a: torch.Tensor, b: torch.Tensor) -> float:
    return (a.double() - b.double()).abs().max().item()


def _standard(name: str, ours, ref, lowp, factor: float, eps: float) -> tuple[bool, str]:
    """DESIGN's rule: max|ours - ref| <= factor * max|lowp - ref| + eps, no NaN."""
    if torch.isnan(ours).any():
        return False, f"{name}: NaN"
    err, bound = _err(ours, ref), factor * _err(lowp, ref) + eps
    return err <= bound, f"{name} {err:.1e} <= {bound:.1e}" if err <= bound else f"{name} {err:.1e} > {bound:.1e}"


def _check_dense(device, dtype, family, s_q, s_k, h, h_k, d, causal, backward) -> tuple[bool, str]:
    g = torch.Generator(device="cpu").manual_seed(s_q * 131 + s_k)
    shape_q, shape_k = (2, s_q, h, d), (2, s_k, h_k, d)
    q, k, v = (torch.randn(s, generator=g).to(device, dtype) for s in (shape_q, shape_k, shape_k))
    if backward:
        q.requires_grad_(), k.requires_grad_(), v.requires_grad_()
    out, lse, _ = flashattn.flash_attn_func(q, k, v, causal=causal, return_attn_probs=True, family=family)
    with torch.no_grad():
        q32, k32, v32 = (t.detach().float() for t in (q, k, v))
        ref, ref_lse = reference.attention(q32, k32, v32, causal=causal)
        lowp, lowp_lse = reference.attention(q, k, v, causal=causal, upcast=False)
    lse_eps = 1e-3 * max(1.0, ref_lse.abs().max().item())
    results = [_standard("out", out, ref, lowp, 2.0, 1e-5), _standard("lse", lse, ref_lse, lowp_lse, 2.0, lse_eps)]
    if backward:
        dout = torch.randn(shape_q, generator=g).to(device, dtype)
        out.backward(dout)
        with torch.no_grad():
            grads = reference.attention_bwd(dout.float(), q32, k32, v32, ref, ref_lse, causal=causal)
            lowp_grads = reference.attention_bwd(dout, q, k, v, lowp, lowp_lse, causal=causal, upcast=False)
        for name, t, r, lp in zip(("dq", "dk", "dv"), (q.grad, k.grad, v.grad), grads, lowp_grads):
            results.append(_standard(name, t, r, lp, 3.0, 1e-4))
    return all(ok for ok, _ in results), ", ".join(msg for _, msg in results)


def _check_varlen(device, dtype, family) -> tuple[bool, str]:
    g = torch.Generator(device="cpu").manual_seed(7)
    lens = [5, 130, 61]
    cu = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32, device=device)
    total, h, d = sum(lens), 4, 64
    q, k, v = (torch.randn(total, h, d, generator=g).to(device, dtype) for _ in range(3))
    out = flashattn.flash_attn_varlen_func(q, k, v, cu, cu, max(lens), max(lens), causal=True, family=family)
    ref = reference.varlen_attention(q.float(), k.float(), v.float(), cu, cu, causal=True)[0]
    lowp = reference.varlen_attention(q, k, v, cu, cu, causal=True, upcast=False)[0]
    return _standard("out", out, ref, lowp, 2.0, 1e-5)


def _check_decode(device, dtype, family) -> tuple[bool, str]:
    g = torch.Generator(device="cpu").manual_seed(11)
    b, s_cache, h, h_k, d = 2, 500, 8, 2, 128
    q = torch.randn(b, 1, h, d, generator=g).to(device, dtype)
    k_cache, v_cache = (torch.randn(b, s_cache, h_k, d, generator=g).to(device, dtype) for _ in range(2))
    k_new, v_new = (torch.randn(b, 1, h_k, d, generator=g).to(device, dtype) for _ in range(2))
    lens = torch.tensor([17, 433], dtype=torch.int32, device=device)
    ref_caches = k_cache.clone(), v_cache.clone()
    out = flashattn.flash_attn_with_kvcache(
        q, k_cache, v_cache, k_new, v_new, cache_seqlens=lens, causal=True, family=family
    )
    kw = {"cache_seqlens": lens, "causal": True}
    f32 = [t.float() for t in (q, *ref_caches, k_new, v_new)]
    ref = reference.kvcache_attention(*f32, **kw)[0]
    lowp = reference.kvcache_attention(q, *ref_caches, k_new, v_new, upcast=False, **kw)[0]
    return _standard("out", out, ref, lowp, 2.0, 1e-5)


def _check_cpu() -> tuple[bool, str]:
    """The CPU path (the reference) against PyTorch's own attention, fp32, with gradients."""
    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(2, 37, 4, 32, generator=g, requires_grad=True) for _ in range(3))
    out = flashattn.flash_attn_func(q, k, v, causal=True)
    out.sum().backward()
    grads = [t.grad.clone() for t in (q, k, v)]
    for t in (q, k, v):
        t.grad = None
    sdpa = F.scaled_dot_product_attention(*(t.transpose(1, 2) for t in (q, k, v)), is_causal=True).transpose(1, 2)
    sdpa.sum().backward()
    errors = [_err(out, sdpa)] + [_err(a, t.grad) for a, t in zip(grads, (q, k, v))]
    ok = max(errors) < 1e-4
    return ok, f"max difference from SDPA {max(errors):.1e} (out, dq, dk, dv)"


def _time_ms(fn, iters: int = 20) -> float:
    for _ in range(3):
        fn()
    times = []
    for _ in range(iters):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return sorted(times)[len(times) // 2]


def _timing(device, dtype, family, progress) -> list[str]:
    b, s, h, d = 4, 2048, 16, 128
    q, k, v = (torch.randn(b, s, h, d, device=device, dtype=dtype, requires_grad=True) for _ in range(3))
    dout = torch.randn_like(q)
    qt, kt, vt = (t.detach().transpose(1, 2).requires_grad_() for t in (q, k, v))
    lines = []
    for causal in (False, True):
        flops = 4 * b * h * s * s * d / (2 if causal else 1)

        def ours(causal=causal):
            return flashattn.flash_attn_func(q, k, v, causal=causal, family=family)

        def sdpa(causal=causal):
            return F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal)

        row = []
        for name, fn, grad_out in (("flashattn", ours, dout), ("SDPA", sdpa, dout.transpose(1, 2))):
            with torch.no_grad():
                fwd = _time_ms(fn)
            fwd_bwd = _time_ms(lambda fn=fn, g=grad_out: fn().backward(g))
            row.append((name, fwd, fwd_bwd))
            progress.step(f"timing {name} {'causal' if causal else 'non-causal'}")
        text = ", ".join(
            f"{n} fwd {f:.3f} ms ({flops / f / 1e9:.0f} TFLOP/s), fwd+bwd {fb:.3f} ms ({3.5 * flops / fb / 1e9:.0f})"
            for n, f, fb in row
        )
        lines.append(f"  {'causal    ' if causal else 'non-causal'} {text}")
    return lines


def _holds_for(targets: dict, cc: int) -> str:
    if targets.get("arch_specific"):  # sm_90a: that compute capability alone
        return f"machine code for sm_{cc}a" if cc in targets.get("sass", ()) else "nothing for this GPU"
    sass = [s for s in targets.get("sass", ()) if s // 10 == cc // 10 and s <= cc]
    if sass:
        return f"machine code for sm_{max(sass)}"
    ptx = [p for p in targets.get("ptx", ()) if p <= cc]
    if ptx:
        return (
            f"PTX compute_{max(ptx)}, which the driver compiles for this GPU at first use"
            " (seconds per kernel, then cached)"
        )
    return "nothing for this GPU"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m flashattn", description=__doc__.splitlines()[0])
    ap.add_argument("--no-timing", action="store_true", help="skip the timing beside SDPA")
    ap.add_argument("--family", default=None, help=f"force a kernel family ({_families.listing()})")
    args = ap.parse_args(argv)

    info = flashattn.build_info()
    print(f"flashattn {flashattn.__version__}", end="")
    if info.get("version"):
        print(f" (extension {info['version']}, CUDA {info['cuda_version']}, torch target {info['torch_target_version']})")
    else:
        print(" (no compiled extension)")
    print(f"torch {torch.__version__} (CUDA {torch.version.cuda}), Python {platform.python_version()}, {platform.system()} {platform.machine()}")
    if info["extension_loaded"]:
        print("extension: loaded")
    else:
        print(f"extension: NOT loaded — {info['extension_error']}")
    families = info.get("families") or {}
    held = "; ".join(
        f"{f} (sm_{', sm_'.join(f'{x}a' if t.get('arch_specific') else str(x) for x in t.get('sass', []))}"
        + (f"; PTX compute_{', compute_'.join(map(str, t['ptx']))}" if t.get("ptx") else "")
        + ")"
        for f, t in sorted(families.items())
    )
    if held:
        print(f"built: {held}; dtypes {', '.join(info.get('dtypes', []))}; head dims up to {max(info.get('head_dims') or [0])}")

    ok = True
    if not torch.cuda.is_available():
        why = "this torch has no CUDA (a CPU build)" if torch.version.cuda is None else "no CUDA GPU is visible"
        print(f"GPU: none ({why}): checking the CPU path (the pure-PyTorch reference), not the CUDA kernels")
        passed, msg = _check_cpu()
        print(f"  CPU forward + backward vs torch SDPA: {'ok' if passed else 'FAILED'} ({msg})")
        print("result: OK (CPU path)" if passed else "result: FAILED")
        return 0 if passed else 1

    device = torch.device("cuda", torch.cuda.current_device())
    props = torch.cuda.get_device_properties(device)
    cc = 10 * props.major + props.minor
    print(f"GPU {device.index}: {props.name}, compute capability {props.major}.{props.minor}, {props.multi_processor_count} SMs")
    dtype = torch.bfloat16 if cc >= 80 else torch.float16
    try:
        family = _dispatch.resolve_family(device, dtype, args.family)
    except FlashAttnError as e:
        print(f"family: none — {e}")
        print("result: FAILED (nothing in this install runs on this GPU)")
        return 1
    print(f"family: sm{family} — this build holds {_holds_for(families.get(f'sm{family}', {}), cc)}" if families else f"family: sm{family}")

    checks = [
        ("forward+backward causal GQA, s 300", lambda: _check_dense(device, dtype, family, 300, 300, 4, 2, 64, True, True)),
        ("forward+backward s_q 128 < s_k 333", lambda: _check_dense(device, dtype, family, 128, 333, 4, 4, 128, False, True)),
        ("varlen causal, lengths 5/130/61", lambda: _check_varlen(device, dtype, family)),
        ("decode over a KV cache, GQA 4:1", lambda: _check_decode(device, dtype, family)),
    ]
    timing = not args.no_timing
    progress = _Progress(len(checks) + (4 if timing else 0))
    print(f"self-test ({str(dtype).removeprefix('torch.')}, against the fp32 reference; error <= 2x (3x for gradients) PyTorch's own):")
    lines = []
    for name, fn in checks:
        try:
            passed, msg = fn()
        except Exception as e:  # noqa: BLE001 - a crash is a failed check, reported as such
            passed, msg = False, f"{type(e).__name__}: {str(e).splitlines()[0]}"
        ok &= passed
        lines.append(f"  {name:<38} {'ok' if passed else 'FAILED'}  ({msg})")
        progress.step(name)
    if timing and ok:
        lines.append(f"timing (b 4, s 2048, h 16, d 128, {str(dtype).removeprefix('torch.')}; median of 20; SDPA picks its backend):")
        lines.extend(_timing(device, dtype, family, progress))
    progress.close()
    print("\n".join(lines))
    print("result: OK" if ok else "result: FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
