#!/usr/bin/env python3
"""Time flashattn side by side with PyTorch SDPA's attention backends.

One run times, on the same GPU and with the same timer:
  flashattn  flashattn.flash_attn_func, layout (b, s, h, d)
  FA2        SDPA's FLASH_ATTENTION backend (FlashAttention-2), layout (b, h, s, d)
  cuDNN      SDPA's CUDNN_ATTENTION backend, layout (b, h, s, d)
  memeff     SDPA's EFFICIENT_ATTENTION backend, layout (b, h, s, d)
Each implementation gets inputs in its own native contiguous layout (the same
values, laid out once before timing), so none pays for a copy inside the timed
region.

Grid (DESIGN.md, "Performance standard"): head dim 64/128/256, seqlen 512..16k,
batch = 16384 // seqlen, heads = 2048 // hdim, causal and not, bf16 and fp16,
modes fwd and fwd_bwd. TFLOP/s by the field's convention: forward
4*b*h*s*s*d (half of it when causal), backward 2.5x forward, fwd_bwd 3.5x.

See benchmarks/README.md. `--help` and importing this file need no GPU.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import math
import os
import platform
import re
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)

IMPLS = ("flashattn", "FA2", "cuDNN", "memeff")
SDPA_BACKEND_NAMES = {
    "FA2": "FLASH_ATTENTION",
    "cuDNN": "CUDNN_ATTENTION",
    "memeff": "EFFICIENT_ATTENTION",
}
MODES = ("fwd", "fwd_bwd")
DTYPES = ("bf16", "fp16")
DEFAULT_HDIMS = (64, 128, 256)
DEFAULT_SEQLENS = (512, 1024, 2048, 4096, 8192, 16384)
TOKENS = 16384  # batch * seqlen
MODEL_DIM = 2048  # heads * hdim
WARMUP_MS = 25
REP_MS = 100
# The shapes users run, beside the grid:
# (name, batch, seqlen_q, seqlen_k, heads, heads_k, hdim, causal). Causal masks
# are bottom-right aligned (flash_attn's convention); SDPA gets the same mask as
# torch.nn.attention.bias.causal_lower_right where seqlen_q != seqlen_k.
REAL_SHAPES = (
    ("small-batch", 1, 2048, 2048, 12, 12, 64, False),
    ("vit-b", 256, 197, 197, 12, 12, 80, False),
    ("short-causal", 1, 128, 128, 16, 16, 128, True),
    ("llama3-8b-prefill", 2, 8192, 8192, 32, 8, 128, True),
    ("70b-prefill", 1, 16384, 16384, 64, 8, 128, True),
    ("128k-sequence", 1, 131072, 131072, 16, 16, 128, True),
    ("chunked-prefill", 1, 512, 8192, 32, 8, 128, True),
    ("gemma-d256-prefill", 1, 8192, 8192, 16, 8, 256, True),
)

# Forward-output sanity check of flashattn against the first SDPA backend that
# ran: a gross-error guard (the test suite holds the real accuracy standard).
# (atol, rtol) per element and a bound on ||out - ref|| / ||ref||. Two correct
# bf16 kernels differ by <= ~0.008 per element on this grid (FA2 vs cuDNN, H200).
CHECK_TOL = {"bf16": (2e-2, 2e-2, 2e-2), "fp16": (5e-3, 5e-3, 5e-3)}


# --------------------------------------------------------------------------
# FLOPs (no torch needed)
# --------------------------------------------------------------------------
def _family_names() -> list[str]:
    """The kernel families, from the package's families.json (read directly: this
    script also runs where flashattn is not importable)."""
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python", "flashattn", "families.json")
    try:
        with open(path) as f:
            return list(json.load(f)["families"])
    except OSError:
        import flashattn._families

        return list(flashattn._families.NAMES)


def attn_flops(batch, heads, seqlen_q, seqlen_k, hdim, causal, mode):
    """FLOPs of one call, by the FlashAttention papers' convention.

    forward: 4 * b * h * s_q * s_k * d (two matmuls, 2 FLOPs per MAC), halved
    when causal (with s_q != s_k: the (query, key) pairs a bottom-right causal
    mask leaves visible); backward: 2.5x forward; fwd_bwd: 3.5x forward.
    """
    f = 4.0 * batch * heads * seqlen_q * seqlen_k * hdim
    if causal and seqlen_q != seqlen_k:
        visible = sum(max(0, min(seqlen_k, seqlen_k - seqlen_q + i + 1)) for i in range(seqlen_q))
        f = 4.0 * batch * heads * visible * hdim
    elif causal:
        f /= 2
    return {"fwd": 1.0, "bwd": 2.5, "fwd_bwd": 3.5}[mode] * f


def grid_shape(seqlen, hdim):
    """(batch, heads) of the standard grid: 16k tokens, heads * hdim = 2048."""
    return max(1, TOKENS // seqlen), max(1, MODEL_DIM // hdim)


def geomean(xs):
    xs = [x for x in xs if x is not None and x > 0 and math.isfinite(x)]
    if not xs:
        return None
    return math.exp(sum(math.log(x) for x in xs) / len(xs))


# --------------------------------------------------------------------------
# Command line
# --------------------------------------------------------------------------
def _int_list(text):
    out = []
    for part in text.split(","):
        part = part.strip().lower()
        if not part:
            continue
        mult = 1
        if part.endswith("k"):
            part, mult = part[:-1], 1024
        try:
            out.append(int(part) * mult)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not an integer: {part!r}") from None
    if not out:
        raise argparse.ArgumentTypeError("empty list")
    return out


def _impl_list(text):
    lower = {n.lower(): n for n in IMPLS}
    out = []
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        if part.lower() not in lower:
            raise argparse.ArgumentTypeError(
                f"unknown implementation {part!r}; choose from {','.join(IMPLS)}")
        if lower[part.lower()] not in out:
            out.append(lower[part.lower()])
    if not out:
        raise argparse.ArgumentTypeError("empty list")
    return out


def build_parser():
    p = argparse.ArgumentParser(
        description="Time flashattn against PyTorch SDPA's FLASH_ATTENTION (FA2), "
                    "CUDNN_ATTENTION (cuDNN) and EFFICIENT_ATTENTION (memeff) backends "
                    "in one run. TFLOP/s: forward 4*b*h*s^2*d (half for causal), "
                    "fwd_bwd 3.5x forward.",
        epilog="Results: <out>.json (metadata + every row) and <out>.png. Save the "
               "printed table with tee as <out>.txt. See benchmarks/README.md.")
    p.add_argument("--mode", choices=("fwd", "fwd_bwd", "both"), default="both")
    p.add_argument("--dtype", choices=("bf16", "fp16", "both"), default=None,
                   help="default: both (bf16 with --quick)")
    p.add_argument("--hdim", type=_int_list, default=None,
                   help="comma list, default 64,128,256 (128 with --quick)")
    p.add_argument("--seqlen", type=_int_list, default=None,
                   help="comma list, 'k' suffix allowed; default 512,1k,2k,4k,8k,16k "
                        "(1k,4k with --quick); batch = 16384 // seqlen")
    p.add_argument("--causal", choices=("both", "true", "false"), default="both")
    p.add_argument("--gqa", type=int, default=1,
                   help="query heads per key/value head (h_k = heads // GQA); SDPA backends "
                        "that take enable_gqa=True get it (as transformers calls them), the others "
                        "K/V expanded with repeat_interleave inside the timed region (their "
                        "gradients summed back by autograd)")
    p.add_argument("--deterministic", action="store_true",
                   help="flashattn's deterministic backward (SDPA backends are unaffected)")
    p.add_argument("--dropout", type=float, default=0.0,
                   help="attention dropout probability for every implementation (the "
                        "output check is skipped: the masks differ)")
    p.add_argument("--layout", choices=("native", "bshd", "bhsd"), default="native",
                   help="memory order of q, k, v (and dout): native gives flashattn (b, s, h, d) and "
                        "SDPA (b, h, s, d), each contiguous; bshd / bhsd give every implementation "
                        "that order, as views")
    p.add_argument("--family", choices=("auto", *_family_names()), default="auto",
                   help="flashattn kernel family (auto: the device's); must be in the build")
    p.add_argument("--impls", type=_impl_list, default=list(IMPLS),
                   help=f"comma list out of {','.join(IMPLS)} (default: all)")
    p.add_argument("--out", default=None,
                   help="output path without extension; default "
                        "benchmarks/results/<device>-<dtype>-<date> (a temp dir with --quick)")
    p.add_argument("--memory", action="store_true",
                   help="also print peak memory (MiB) per implementation "
                        "(always recorded in the JSON)")
    p.add_argument("--set", dest="shape_set", choices=("grid", "real"), default="grid",
                   help="grid: the standard grid; real: the shapes users run (REAL_SHAPES: "
                        "small batch, ViT, GQA prefill, 128k tokens, chunked prefill), with "
                        "their own geomean; --dtype defaults to bf16 there")
    p.add_argument("--quick", action="store_true",
                   help="smoke test: hdim 128, seqlen 1k,4k, bf16, causal and not")
    p.add_argument("--no-check", dest="check", action="store_false",
                   help="skip the forward-output sanity check of flashattn against SDPA")
    p.add_argument("--no-plot", dest="plot", action="store_false", help="do not write the PNG")
    return p


def resolve_args(args):
    """Fill in the defaults that depend on --quick."""
    if args.shape_set == "real":
        args.dtype = args.dtype or "bf16"
    if args.quick:
        args.hdim = args.hdim or [128]
        args.seqlen = args.seqlen or [1024, 4096]
        args.dtype = args.dtype or "bf16"
    args.hdim = args.hdim or list(DEFAULT_HDIMS)
    args.seqlen = args.seqlen or list(DEFAULT_SEQLENS)
    args.dtype = args.dtype or "both"
    args.modes = list(MODES) if args.mode == "both" else [args.mode]
    args.dtypes = list(DTYPES) if args.dtype == "both" else [args.dtype]
    args.causals = {"both": [False, True], "true": [True], "false": [False]}[args.causal]
    for d in args.hdim:
        if d <= 0 or d > MODEL_DIM:
            raise SystemExit(f"bench_attention.py: --hdim {d} out of range")
    if not 0.0 <= args.dropout < 1.0:
        raise SystemExit(f"bench_attention.py: --dropout {args.dropout} out of [0, 1)")
    if args.dropout > 0:
        args.check = False
    if args.gqa < 1 or any((MODEL_DIM // d) % args.gqa for d in args.hdim):
        raise SystemExit(f"bench_attention.py: --gqa {args.gqa} must divide every heads count")
    for s in args.seqlen:
        if s <= 0:
            raise SystemExit(f"bench_attention.py: --seqlen {s} out of range")
    return args


# --------------------------------------------------------------------------
# Environment
# --------------------------------------------------------------------------
def _slug(text):
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")


def _git_commit():
    try:
        rev = subprocess.run(["git", "-C", REPO, "rev-parse", "HEAD"], capture_output=True,
                             text=True, timeout=10, check=False).stdout.strip()
        dirty = subprocess.run(["git", "-C", REPO, "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=10, check=False).stdout.strip()
        if not re.fullmatch(r"[0-9a-f]{40}", rev):
            return None
        return rev + ("-dirty" if dirty else "")
    except Exception:  # noqa: BLE001 - no git, not a checkout: leave it out
        return None


def load_flashattn():
    """(module or None, build_info dict or None, error string or None)."""
    try:
        import flashattn
    except ImportError as e:
        # Not installed: try the source tree's package (an in-place build).
        src = os.path.join(REPO, "python")
        if not os.path.isfile(os.path.join(src, "flashattn", "__init__.py")):
            return None, None, _short_error(e)
        sys.path.insert(0, src)
        try:
            import flashattn
        except Exception as e2:  # noqa: BLE001 - reported in the header
            return None, None, f"from {src}: {_short_error(e2)}"
    except Exception as e:  # noqa: BLE001 - a broken build: reported in the header
        return None, None, _short_error(e)
    info = None
    try:
        info = flashattn.build_info()
    except Exception as e:  # noqa: BLE001 - reported in the header
        return flashattn, None, f"build_info() failed: {type(e).__name__}: {e}"
    return flashattn, info, None


def collect_meta(torch, args, fa_mod, fa_info, fa_err):
    props = torch.cuda.get_device_properties(0)
    try:
        import triton
        triton_version = triton.__version__
    except Exception:  # noqa: BLE001 - metadata only
        triton_version = None
    families = None
    if isinstance(fa_info, dict):
        fam = fa_info.get("families")
        families = list(fam) if isinstance(fam, (dict, list, tuple)) else fam
    return {
        "date_utc": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "device": torch.cuda.get_device_name(0),
        "capability": "sm_{}{}".format(*torch.cuda.get_device_capability(0)),
        "sm_count": props.multi_processor_count,
        "device_memory_gib": round(props.total_memory / 2**30, 1),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None,
        "triton": triton_version,
        "python": platform.python_version(),
        "flashattn_version": getattr(fa_mod, "__version__", None) if fa_mod else None,
        "flashattn_path": os.path.dirname(fa_mod.__file__) if fa_mod else None,
        "flashattn_build_info": fa_info,
        "flashattn_families": families,
        "flashattn_error": fa_err,
        "flashattn_family_arg": args.family,
        "git_commit": _git_commit(),
        "command": " ".join([os.path.basename(sys.argv[0])] + sys.argv[1:]),
        "timer": f"triton.testing.do_bench(warmup={WARMUP_MS}, rep={REP_MS}, return_mode='median')",
        "flops": "fwd 4*b*h*s_q*s_k*d (x0.5 causal); bwd 2.5x fwd; fwd_bwd 3.5x fwd",
        "grid": f"batch = {TOKENS} // seqlen, heads = {MODEL_DIM} // hdim",
        "impls": args.impls,
        "gqa": args.gqa,
        "deterministic": args.deterministic,
        "dropout_p": args.dropout,
        "layouts": ({"flashattn": "(b, s, h, d) contiguous", "sdpa": "(b, h, s, d) contiguous"}
                    if args.layout == "native" else
                    {"all": f"{'(b, s, h, d)' if args.layout == 'bshd' else '(b, h, s, d)'} contiguous, as views"}),
        "peak_mem": "max_memory_allocated over one call (fwd, or fwd+bwd) minus what was "
                    "allocated before the implementation's inputs were made: inputs, grads, "
                    "outputs and workspace",
    }


# --------------------------------------------------------------------------
# Timing one implementation on one shape
# --------------------------------------------------------------------------
class _Done(Exception):
    """The real-shape set ran to its end."""


class ContextLost(RuntimeError):
    """The CUDA context is unusable (e.g. an illegal memory access)."""


def _short_error(e):
    msg = str(e).strip().splitlines()[0] if str(e).strip() else ""
    text = f"{type(e).__name__}: {msg}" if msg else type(e).__name__
    return text[:240]


def _context_alive(torch):
    try:
        torch.cuda.synchronize()
        return True
    except Exception:  # noqa: BLE001 - any failure means the context is gone
        return False


def make_runner(torch, impl, base, mode, causal, family, gqa=1, deterministic=False, dropout_p=0.0,
                layout="native"):
    """Inputs in the implementation's native layout (or `layout`'s memory order,
    passed as views), and the callable to time.

    base: dict of (b, s, h, d) tensors q, k, v, g made once per shape.
    Returns (fn, leaves, to_bhsd) where to_bhsd maps the output to (b, h, s, d).
    """
    bwd = mode == "fwd_bwd"
    memory = layout if layout != "native" else ("bshd" if impl == "flashattn" else "bhsd")

    def leaf(name):  # base[name] in `memory`'s order, contiguous
        t = base[name].clone() if memory == "bshd" else base[name].transpose(1, 2).contiguous()
        return t.requires_grad_(bwd) if name != "g" else t

    def as_bshd(t):
        return t if memory == "bshd" else t.transpose(1, 2)

    def as_bhsd(t):
        return t if memory == "bhsd" else t.transpose(1, 2)

    if impl == "flashattn":
        import flashattn
        lq, lk, lv = (leaf(n) for n in "qkv")
        g = as_bshd(leaf("g")) if bwd else None
        kwargs = {"causal": causal, "deterministic": deterministic, "dropout_p": dropout_p}
        if family != "auto":
            kwargs["family"] = family

        def fwd():
            out = flashattn.flash_attn_func(as_bshd(lq), as_bshd(lk), as_bshd(lv), **kwargs)
            return out[0] if isinstance(out, tuple) else out

        def to_bhsd(o):
            return o.transpose(1, 2)
    else:
        import torch.nn.functional as F
        from torch.nn.attention import SDPBackend, sdpa_kernel
        backend = getattr(SDPBackend, SDPA_BACKEND_NAMES[impl])
        lq, lk, lv = (leaf(n) for n in "qkv")
        q, k, v = (as_bhsd(t) for t in (lq, lk, lv))
        g = as_bhsd(leaf("g")) if bwd else None

        # SDPA's is_causal is top-left aligned; bottom-right needs its causal bias.
        lower_right = causal and q.shape[2] != k.shape[2]
        if lower_right:
            from torch.nn.attention.bias import causal_lower_right
            mask = causal_lower_right(q.shape[2], k.shape[2])

        def sdpa(native_gqa):
            kk, vv = (k, v) if gqa == 1 or native_gqa else (t.repeat_interleave(gqa, dim=1) for t in (k, v))
            extra = {"enable_gqa": True} if gqa > 1 and native_gqa else {}
            with sdpa_kernel([backend]):
                if lower_right:
                    return F.scaled_dot_product_attention(q, kk, vv, attn_mask=mask, dropout_p=dropout_p, **extra)
                return F.scaled_dot_product_attention(q, kk, vv, is_causal=causal, dropout_p=dropout_p, **extra)

        # GQA: the backend's own (enable_gqa, as transformers calls SDPA) where it
        # takes it, else K/V expanded in the timed region.
        native_gqa = False
        if gqa > 1:
            try:
                sdpa(True)
                native_gqa = True
            except RuntimeError:
                print(f"  ({impl} takes no enable_gqa here: k/v expanded)")

        def fwd():
            return sdpa(native_gqa)

        def to_bhsd(o):
            return o

    if not bwd:
        return fwd, [], to_bhsd

    def fwd_bwd():
        out = fwd()
        out.backward(g)
        return out

    return fwd_bwd, [lq, lk, lv], to_bhsd


def bench_one(torch, do_bench, impl, base, mode, causal, family, flops, gqa=1,
              deterministic=False, dropout_p=0.0, layout="native"):
    """Returns (result dict, forward output in (b, h, s, d) or None)."""
    res = {"tflops": None, "ms": None, "peak_mem_bytes": None, "error": None}
    out_ref = None
    fn = leaves = None
    try:
        torch.cuda.synchronize()
        before = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        fn, leaves, to_bhsd = make_runner(torch, impl, base, mode, causal, family, gqa,
                                          deterministic, dropout_p, layout)
        # First call: surfaces "unsupported" errors and warms up (a backend's first
        # call may allocate one-time state); the second measures peak memory.
        out = fn()
        for t in leaves:
            t.grad = None
        del out
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        out = fn()
        torch.cuda.synchronize()
        res["peak_mem_bytes"] = int(torch.cuda.max_memory_allocated() - before)
        out_ref = to_bhsd(out.detach())
        del out
        for t in leaves:
            t.grad = None
        ms = do_bench(fn, warmup=WARMUP_MS, rep=REP_MS, return_mode="median",
                      grad_to_none=leaves or None)
        res["ms"] = float(ms)
        res["tflops"] = flops / (ms * 1e-3) / 1e12
    except torch.cuda.OutOfMemoryError as e:
        res["error"] = "OOM: " + _short_error(e)
        out_ref = None
    except Exception as e:
        res["error"] = _short_error(e)
        out_ref = None
        if not _context_alive(torch):
            raise ContextLost(f"{impl}: {res['error']}") from e
    finally:
        fn = leaves = None
    if res["error"]:
        torch.cuda.empty_cache()
    return res, out_ref


def check_output(out, ref, dtype_name):
    """(max abs difference, relative L2 difference, within the loose tolerance?)"""
    atol, rtol, rel_tol = CHECK_TOL[dtype_name]
    a, b = out.float(), ref.float()
    diff = (a - b).abs()
    bad = ~(diff <= atol + rtol * b.abs())  # NaN counts as bad
    rel = float(diff.norm() / b.norm().clamp_min(1e-30))
    max_abs = float(diff.nan_to_num(float("inf")).max())
    return max_abs, rel, not bool(bad.any()) and rel <= rel_tol


# --------------------------------------------------------------------------
# Table
# --------------------------------------------------------------------------
def _fmt(x, width=9, prec=1):
    return f"{x:{width}.{prec}f}" if x is not None else " " * (width - 3) + "n/a"


def table_header(impls, memory):
    cols = "".join(f"{n:>10}" for n in impls)
    if memory:
        cols += "".join(f"{n + ' MiB':>15}" for n in impls)
    ratio = "  ours/FA2" if ("flashattn" in impls and "FA2" in impls) else ""
    return f"{'mode':8}{'causal':>7}{'dtype':>6}{'hdim':>5}{'seqlen':>7}  {cols}{ratio}"


def table_row(row, impls, memory):
    cells = ""
    for n in impls:
        r = row["results"].get(n, {})
        mark = "!" if (n == "flashattn" and row.get("check_ok") is False) else " "
        cells += _fmt(r.get("tflops")) + mark
    if memory:
        for n in impls:
            b = row["results"].get(n, {}).get("peak_mem_bytes")
            cells += _fmt(b / 2**20 if b is not None else None, width=15, prec=0)
    ratio = ""
    if "flashattn" in impls and "FA2" in impls:
        rr = row.get("ours_over_fa2")
        ratio = f"  {rr:8.2f}" if rr is not None else "       n/a"
    line = (f"{row['mode']:8}{row['causal']!s:>7}{row['dtype']:>6}{row['hdim']:>5}"
            f"{row['seqlen']:>7}  {cells}{ratio}")
    if row.get("name"):
        line += (f"  {row['name']} (b={row['batch']} s_k={row['seqlen_k']} h={row['heads']}"
                 f" h_k={row['heads_k']})")
    return line


def summarize(rows, modes):
    """Geometric means of ours/FA2 and ours/cuDNN."""
    groups, overall = [], {}
    keys = []
    for r in rows:
        k = (r["mode"], r["dtype"], r["hdim"], r["causal"])
        if k not in keys:
            keys.append(k)
    if rows and rows[0].get("name"):  # the real-shape set: one group per mode and dtype
        keys = []
        for r in rows:
            if (r["mode"], r["dtype"]) not in keys:
                keys.append((r["mode"], r["dtype"]))
        for k in keys:
            sel = [r for r in rows if (r["mode"], r["dtype"]) == k]
            ratios = [r.get("ours_over_fa2") for r in sel]
            groups.append({
                "mode": k[0], "dtype": k[1], "hdim": "real", "causal": "-",
                "n": sum(1 for x in ratios if x is not None),
                "geomean_ours_over_fa2": geomean(ratios),
                "geomean_ours_over_cudnn": geomean([r.get("ours_over_cudnn") for r in sel]),
                "min_ours_over_fa2": min((x for x in ratios if x is not None), default=None),
            })
        keys = []
    for k in keys:
        sel = [r for r in rows if (r["mode"], r["dtype"], r["hdim"], r["causal"]) == k]
        groups.append({
            "mode": k[0], "dtype": k[1], "hdim": k[2], "causal": k[3],
            "n": sum(1 for r in sel if r.get("ours_over_fa2") is not None),
            "geomean_ours_over_fa2": geomean([r.get("ours_over_fa2") for r in sel]),
            "geomean_ours_over_cudnn": geomean([r.get("ours_over_cudnn") for r in sel]),
        })
    for m in modes:
        sel = [r for r in rows if r["mode"] == m]
        if sel:
            overall[m] = {
                "n": sum(1 for r in sel if r.get("ours_over_fa2") is not None),
                "geomean_ours_over_fa2": geomean([r.get("ours_over_fa2") for r in sel]),
                "geomean_ours_over_cudnn": geomean([r.get("ours_over_cudnn") for r in sel]),
            }
    return {"groups": groups, "overall": overall}


def print_summary(summary, impls):
    if "flashattn" not in impls or not ({"FA2", "cuDNN"} & set(impls)):
        return
    def g(x):
        return f"{x:10.3f}" if x is not None else "       n/a"

    print()
    print("summary: geometric mean over seqlens (n = seqlens where both ran)")
    print(f"{'mode':8}{'dtype':>6}{'hdim':>5}{'causal':>7}{'n':>3}  {'ours/FA2':>10}{'ours/cuDNN':>11}")
    for s in summary["groups"]:
        print(f"{s['mode']:8}{s['dtype']:>6}{s['hdim']:>5}{s['causal']!s:>7}{s['n']:>3}  "
              f"{g(s['geomean_ours_over_fa2'])} {g(s['geomean_ours_over_cudnn'])}")
    for m, s in summary["overall"].items():
        print(f"overall {m:8} (n={s['n']:3}): ours/FA2 {g(s['geomean_ours_over_fa2']).strip()}, "
              f"ours/cuDNN {g(s['geomean_ours_over_cudnn']).strip()}")


def print_errors(rows):
    seen = {}
    for r in rows:
        for impl, res in r["results"].items():
            if res.get("error"):
                seen.setdefault((impl, res["error"]), 0)
                seen[(impl, res["error"])] += 1
    if seen:
        print()
        print("n/a reasons:")
        for (impl, err), n in seen.items():
            print(f"  {impl:9} x{n:<3} {err}")


# --------------------------------------------------------------------------
# Main
# --------------------------------------------------------------------------
def default_out(device_name, dtypes, quick):
    date = _dt.date.today().isoformat()
    name = f"{_slug(device_name)}-{'-'.join(dtypes)}-{date}"
    if quick:
        return os.path.join(tempfile.gettempdir(), f"flashattn-bench-quick-{name}")
    return os.path.join(HERE, "results", name)


def write_results(path, meta, rows, summary, want_png):
    os.makedirs(os.path.dirname(os.path.abspath(path)) or ".", exist_ok=True)
    data = {"meta": meta, "rows": rows, "summary": summary}
    with open(path + ".json", "w") as f:
        json.dump(data, f, indent=1)
    msg = f"wrote {path}.json"
    if want_png and rows and rows[0].get("name"):
        msg += " (no PNG for the real-shape set: its table is the result)"
    elif want_png and rows:
        try:
            sys.path.insert(0, HERE)
            from plot import plot_results
            plot_results(data, path + ".png")
            msg += f" and {path}.png"
        except ImportError as e:
            msg += f" (no PNG: {e}; pip install matplotlib)"
        except Exception as e:  # noqa: BLE001 - the JSON is written; re-plot with plot.py
            msg += f" (PNG failed: {_short_error(e)})"
    print(msg, flush=True)


def main(argv=None):
    args = resolve_args(build_parser().parse_args(argv))

    try:
        import torch
    except ImportError:
        raise SystemExit("bench_attention.py: PyTorch is not installed") from None
    if not torch.cuda.is_available():
        raise SystemExit("bench_attention.py: no CUDA device visible (torch.cuda.is_available() "
                         f"is False; torch {torch.__version__}, built for CUDA "
                         f"{torch.version.cuda}). Run it on a GPU machine.")
    try:
        from triton.testing import do_bench
    except ImportError:
        raise SystemExit("bench_attention.py: triton is required for timing "
                         "(pip install triton; CUDA builds of torch ship it)") from None

    fa_mod, fa_info, fa_err = (None, None, None)
    if "flashattn" in args.impls:
        fa_mod, fa_info, fa_err = load_flashattn()
    meta = collect_meta(torch, args, fa_mod, fa_info, fa_err)
    out_path = args.out or default_out(meta["device"], args.dtypes, args.quick)

    print(f"torch {meta['torch']}, CUDA {meta['cuda']}, {meta['device']} ({meta['capability']}, "
          f"{meta['sm_count']} SMs), cuDNN {meta['cudnn']}, triton {meta['triton']}")
    if "flashattn" in args.impls:
        if fa_mod is None:
            print(f"flashattn: not importable ({fa_err}); its column is n/a")
        else:
            print(f"flashattn {meta['flashattn_version']} ({meta['flashattn_path']}), build "
                  f"families: {meta['flashattn_families']}, family: {args.family}"
                  + (f" ({fa_err})" if fa_err else ""))
    print(f"git {meta['git_commit']}; timer {meta['timer']}; {meta['grid']}; "
          f"TFLOP/s: {meta['flops']}" + (f"; dropout_p {args.dropout}" if args.dropout else ""), flush=True)
    print(table_header(args.impls, args.memory), flush=True)

    dtypes = {"bf16": torch.bfloat16, "fp16": torch.float16}
    # SDPA backends first, so flashattn's output can be checked against one of them.
    run_order = [n for n in ("FA2", "cuDNN", "memeff", "flashattn") if n in args.impls]
    rows = []
    t_start = time.time()
    status = 0
    try:
        if args.shape_set == "real":
            for mode in args.modes:
                for dname in args.dtypes:
                    for shape in REAL_SHAPES:
                        rows.append(run_config(torch, do_bench, args, run_order, mode, shape[7],
                                               dname, dtypes[dname], shape[6], shape[2], fa_mod,
                                               fa_err, shape=shape))
                        print(table_row(rows[-1], args.impls, args.memory), flush=True)
            raise _Done
        for mode in args.modes:
            for causal in args.causals:
                for dname in args.dtypes:
                    for hdim in args.hdim:
                        for seqlen in args.seqlen:
                            rows.append(run_config(torch, do_bench, args, run_order, mode, causal,
                                                   dname, dtypes[dname], hdim, seqlen, fa_mod, fa_err))
                            print(table_row(rows[-1], args.impls, args.memory), flush=True)
    except _Done:
        pass
    except ContextLost as e:
        print(f"\nCUDA context lost, stopping: {e}", flush=True)
        status = 1
    except KeyboardInterrupt:
        print("\ninterrupted; writing what ran", flush=True)
        status = 130

    meta["elapsed_s"] = round(time.time() - t_start, 1)
    summary = summarize(rows, args.modes)
    print_summary(summary, args.impls)
    print_errors(rows)
    mism = [r for r in rows if r.get("check_ok") is False]
    if mism:
        print(f"\nWARNING: flashattn's forward output differs from {mism[0]['check_ref']} beyond "
              f"the sanity tolerance in {len(mism)} row(s) (marked '!'); those timings may "
              f"not be of a correct kernel")
    print(f"\nelapsed {meta['elapsed_s']} s")
    write_results(out_path, meta, rows, summary, args.plot)
    return status


def run_config(torch, do_bench, args, run_order, mode, causal, dname, dtype, hdim, seqlen,
               fa_mod, fa_err, shape=None):
    """One row: a grid point (hdim, seqlen), or a REAL_SHAPES entry `shape`."""
    if shape is None:
        name, (batch, heads), seqlen_k, gqa = None, grid_shape(seqlen, hdim), seqlen, args.gqa
    else:
        name, batch, seqlen, seqlen_k, heads, heads_k, hdim, causal = shape
        gqa = heads // heads_k
    flops = attn_flops(batch, heads, seqlen, seqlen_k, hdim, causal, mode)
    row = {"mode": mode, "causal": causal, "dtype": dname, "hdim": hdim, "seqlen": seqlen,
           "seqlen_k": seqlen_k, "batch": batch, "heads": heads, "heads_k": heads // gqa,
           "flops": flops, "results": {}}
    if name is not None:
        row["name"] = name
    base = {}
    try:
        gen = torch.Generator(device="cuda").manual_seed(1000003 * hdim + seqlen)
        for n in ("q", "k", "v") + (("g",) if mode == "fwd_bwd" else ()):
            h = heads // gqa if n in "kv" else heads
            s = seqlen_k if n in "kv" else seqlen
            base[n] = torch.randn((batch, s, h, hdim), device="cuda", dtype=dtype,
                                  generator=gen)
    except torch.cuda.OutOfMemoryError as e:
        base.clear()
        torch.cuda.empty_cache()
        for impl in args.impls:
            row["results"][impl] = {"tflops": None, "ms": None, "peak_mem_bytes": None,
                                    "error": "OOM making inputs: " + _short_error(e)}
        return _finish_row(row)

    ref, ref_name = None, None
    for impl in run_order:
        if impl == "flashattn" and fa_mod is None:
            row["results"][impl] = {"tflops": None, "ms": None, "peak_mem_bytes": None,
                                    "error": f"not importable: {fa_err}"}
            continue
        res, out = bench_one(torch, do_bench, impl, base, mode, causal, args.family, flops,
                             gqa, args.deterministic, args.dropout, args.layout)
        row["results"][impl] = res
        if out is None:
            continue
        if impl != "flashattn":
            if ref is None and args.check and "flashattn" in run_order:
                ref, ref_name = out, impl
        elif ref is not None:
            (row["check_max_abs_diff"], row["check_rel_l2"],
             row["check_ok"]) = check_output(out, ref, dname)
            row["check_ref"] = ref_name
        del out
    ref = None
    base.clear()
    return _finish_row(row)


def _finish_row(row):
    def ratio(a, b):
        ta = row["results"].get(a, {}).get("tflops")
        tb = row["results"].get(b, {}).get("tflops")
        return ta / tb if (ta and tb) else None
    row["ours_over_fa2"] = ratio("flashattn", "FA2")
    row["ours_over_cudnn"] = ratio("flashattn", "cuDNN")
    return row


if __name__ == "__main__":
    sys.exit(main())
