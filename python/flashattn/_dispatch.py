"""Kernel-family selection: device capability, forced families, and what the build holds.

A *family* is a kernel code path (sm70, sm75, sm80, sm90); a *target* is what nvcc emitted
(sass = machine code for one sm_XX, ptx = JIT-compiled on newer GPUs). The build
records both in ``_build_info.json`` beside ``_C.so``; this module reads it to say,
before any kernel runs, why a device, dtype or head dim cannot be served.
"""

from __future__ import annotations

import copy
import functools
import json
import os

import torch

from . import _families, _ops
from ._checks import FAMILIES, FlashAttnError

_BUILD_INFO_PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_build_info.json")
_ENV_FAMILY = "FLASHATTN_FAMILY"
_DTYPE_KEYS = {torch.float16: "fp16", torch.bfloat16: "bf16"}
_REBUILD = "(CMake options or environment variables of the build)"


def _fail(msg: str) -> None:
    raise FlashAttnError(f"flashattn: {msg}")


# ---- build info


def _empty_build_info() -> dict:
    return {
        "version": None,
        "cuda_version": None,
        "torch_target_version": None,
        "families": {},
        "dtypes": [],
        "head_dims": [],
    }


@functools.cache
def _read_build_info(path: str) -> dict | None:
    # Cached: the build writes the file once; dispatch reads it on every CUDA call.
    try:
        with open(path) as f:
            return json.load(f)
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as e:
        _fail(f"cannot read the build info {path} ({e}) — reinstall or rebuild flashattn")


def build_info() -> dict:
    """What the compiled extension holds, as written by the build, plus its load status.

    Keys: version, cuda_version, torch_target_version, families ({"sm80": {"sass":
    [80, 90], "ptx": [90]}, ...}; "arch_specific": true for sm_90a code,
    "smem99_tiles": true where the 99 KB tiles were built), dtypes (["fp16", "bf16"]), head_dims (kernel
    buckets), extension_loaded, extension_error, torch_version. Without a build the
    families are {} and the lists empty.
    """
    info = _read_build_info(_BUILD_INFO_PATH)
    info = _empty_build_info() if info is None else copy.deepcopy(info)
    info["extension_loaded"] = _ops.EXTENSION_LOADED
    info["extension_error"] = _ops.EXTENSION_ERROR
    info["torch_version"] = torch.__version__
    return info


def runs_on(targets: dict, cc: int) -> bool:
    """Does a family compiled for ``targets`` ({"sass": [...], "ptx": [...]}) run on a
    device of capability ``cc`` (10 * major + minor)?

    Machine code for sm_s runs on the same major version from s upwards (arch-specific
    code, sm_90a, on s alone); PTX for compute_p is JIT-compiled on any device from p
    upwards.
    """
    if targets.get("arch_specific"):
        return cc in targets.get("sass", ())
    sass_ok = any(s // 10 == cc // 10 and s <= cc for s in targets.get("sass", ()))
    return sass_ok or any(p <= cc for p in targets.get("ptx", ()))


def _describe_families(families: dict) -> str:
    if not families:
        return "no kernel families"
    parts = []
    for name in sorted(families, reverse=True):
        targets = families[name]
        sass = ", ".join(f"sm_{s}" for s in targets.get("sass", ())) or "none"
        ptx = ", ".join(f"compute_{p}" for p in targets.get("ptx", ())) or "none"
        parts.append(f"{name} (sass {sass}; ptx {ptx})")
    return "; ".join(parts)


# ---- capability -> family


def device_capability(device: torch.device) -> tuple[tuple[int, int], str]:
    """(compute capability, name) of a CUDA device; tests replace this."""
    return torch.cuda.get_device_capability(device), torch.cuda.get_device_name(device)


def family_for_capability(capability: tuple[int, int], name: str = "this GPU") -> int:
    """The newest family a device of this capability can run (families.json: sm90's
    sm_90a code runs on compute capability 9.0 only; newer GPUs run the sm80 family)."""
    major, minor = capability
    newest = _families.newest_for(10 * major + minor)
    if newest is None:
        oldest = _families.get(FAMILIES[0]).min_cc
        _fail(
            f"flashattn needs compute capability {oldest // 10}.{oldest % 10} or newer;"
            f" {name} is {major}.{minor}"
        )
    return newest


def parse_family(value, source: str = "family") -> int | None:
    """A family number from 80, "80", "sm80" (any case); None for None, 0, "" and "auto"."""
    if value is None or (isinstance(value, int) and not isinstance(value, bool) and value == 0):
        return None
    if isinstance(value, int) and not isinstance(value, bool) and value in FAMILIES:
        return value
    if isinstance(value, str):
        text = value.strip().lower()
        if text in ("", "auto"):
            return None
        text = text.removeprefix("sm")
        if text.isdigit() and int(text) in FAMILIES:
            return int(text)
    _fail(
        f"{source}={value!r} is not a kernel family — use {_families.listing()}"
        f" (or {_families.listing(numbers=True)}), or auto to pick by device"
    )


def _no_family_message(wanted: list[int], forced: bool, cc: int, name: str, info: dict) -> str:
    families = info.get("families") or {}
    cuda_major = str(info.get("cuda_version") or "").split(".")[0]
    if wanted == [70] and "sm70" not in families and cuda_major.isdigit() and int(cuda_major) >= 13:
        version = str(info.get("version") or "").split("+")[0] or "<version>"
        return (
            f"this build has no sm70 family (CUDA 13 cannot target sm_70), so it cannot run"
            f" on {name}; install the CUDA 12 wheel of flashattn"
            f" (flashattn-{version}+cu12-py3-none-manylinux_2_28_x86_64.whl) with a cu126 torch"
        )
    what = f"family sm{wanted[0]}" if forced else "kernel family"
    fix = (
        f"rebuild with FLASHATTN_FAMILIES including sm{wanted[0]} and FLASHATTN_CUDA_ARCHS (or"
        f" FLASHATTN_SM{wanted[0]}_ARCHS) including {cc} {_REBUILD}"
    )
    if forced:
        fix += f", or let flashattn pick (family=None, {_ENV_FAMILY} unset or auto)"
    return (
        f"no {what} in this build runs on {name} (compute capability {cc // 10}.{cc % 10});"
        f" built: {_describe_families(families)} — {fix}"
    )


def resolve_family(
    device: torch.device,
    dtype: torch.dtype,
    family=None,
    *,
    capability: tuple[int, int] | None = None,
    device_name: str | None = None,
    info: dict | None = None,
    environ=None,
) -> int:
    """The kernel family (a number of families.json) to run on a CUDA device.

    ``family`` (argument, else env FLASHATTN_FAMILY) forces one; otherwise the newest
    family the device can run that the build holds for it. ``capability``,
    ``device_name``, ``info`` (a build_info() dict) and ``environ`` are injectable.
    """
    if capability is None:
        capability, device_name = device_capability(device)
    name = device_name or "this GPU"
    info = build_info() if info is None else info
    environ = os.environ if environ is None else environ
    major, minor = capability
    cc = 10 * major + minor
    newest = family_for_capability(capability, name)

    forced = parse_family(family, "family")
    if forced is None:
        forced = parse_family(environ.get(_ENV_FAMILY), _ENV_FAMILY)
    if forced is not None and _families.get(forced).arch_specific and not _families.get(forced).runs_on(cc):
        fam = _families.get(forced)
        _fail(
            f"family sm{forced} runs on compute capability {fam.min_cc // 10}.{fam.min_cc % 10} only"
            f" (its code is sm_{fam.arch_specific});"
            f" {name} is {major}.{minor} — its newest family is sm{newest}"
        )
    if forced is not None and forced > newest:
        _fail(
            f"family sm{forced} needs compute capability {forced // 10}.{forced % 10} or"
            f" newer; {name} is {major}.{minor} — its newest family is sm{newest}"
        )
    if dtype not in _DTYPE_KEYS:
        _fail(
            f"the CUDA kernels take torch.float16 or torch.bfloat16, got {dtype}"
            " — cast with .half() or .bfloat16()"
        )
    if dtype == torch.bfloat16 and not _families.get(forced or newest).bf16:
        who = f"the forced family sm{forced}" if forced else f"{name}'s family sm{newest}"
        _fail(
            f"bf16 needs sm_80 tensor cores (Ampere or newer); {who} takes fp16 only"
            " — cast with .half() (torch.float16)"
        )
    if not info.get("extension_loaded", False):
        _fail(
            f"the compiled CUDA extension is not loaded ({info.get('extension_error')}) —"
            " install a flashattn wheel built with CUDA kernels, or use CPU tensors"
        )

    families = info.get("families") or {}
    if not families:  # a build that records nothing (older than the sm90 family): trust its kernels
        chosen = forced or _families.newest_portable(cc)
    else:
        wanted = [forced] if forced else [f for f in sorted(FAMILIES, reverse=True) if f <= newest]
        if dtype == torch.bfloat16:
            wanted = [f for f in wanted if _families.get(f).bf16]
        runnable = [f for f in wanted if f"sm{f}" in families and runs_on(families[f"sm{f}"], cc)]
        if not runnable:
            _fail(_no_family_message(wanted, forced is not None, cc, name, info))
        chosen = runnable[0]

    dtypes = info.get("dtypes") or []
    if dtypes and _DTYPE_KEYS[dtype] not in dtypes:
        _fail(
            f"this build has no {_DTYPE_KEYS[dtype]} kernels (built: {', '.join(dtypes)}) —"
            f" rebuild with FLASHATTN_DTYPES including {_DTYPE_KEYS[dtype]} {_REBUILD}, or"
            f" cast to {dtypes[0]}"
        )
    return chosen


def head_dim_bucket(head_dim: int, head_dims) -> int | None:
    """The kernel bucket serving ``head_dim`` (a multiple of 8): the smallest built bucket
    >= head_dim. None when the build records no buckets (then its kernels check)."""
    if not head_dims:
        return None
    served = [b for b in head_dims if b >= head_dim]
    if not served:
        wanted = (head_dim + 31) // 32 * 32
        _fail(
            f"head dim {head_dim} needs a kernel bucket >= {head_dim}, and this build's"
            f" head dims are {', '.join(str(b) for b in sorted(head_dims))} — rebuild with"
            f" FLASHATTN_HEAD_DIMS including {wanted} {_REBUILD}"
        )
    return min(served)


# (device, dtype, family argument, FLASHATTN_FAMILY) -> (family, head dims): the
# answer never changes for a key within a process, and computing it reads device
# properties and the build info (tens of microseconds); a lookup costs well under one.
_dispatch_cache: dict = {}


def cuda_family_and_head_dims(device: torch.device, dtype: torch.dtype, family) -> tuple:
    """(family, built head-dim buckets) for a CUDA call.

    One constant under torch.compile: it reads the device, the environment and the
    build-info file, none of which dynamo can trace. The head-dim check stays outside
    (``head_dim_bucket``) because a head dim may be symbolic there. Errors are raised
    every time (never cached); answers are cached per key.
    """
    key = (device, dtype, family, os.environ.get(_ENV_FAMILY))
    try:
        found = _dispatch_cache.get(key)
    except TypeError:  # an unhashable family: resolve_family names the problem
        found = key = None
    if found is None:
        info = build_info()
        found = (resolve_family(device, dtype, family, info=info), tuple(info.get("head_dims") or ()))
        if key is not None:
            _dispatch_cache[key] = found
    return found


# One constant under torch.compile: what torch.compiler.assume_constant_result(fn) does
# (it sets this attribute), without importing torch._dynamo, which the decorator does
# and which costs 1.2 s at `import flashattn` (tests/test_interface.py checks both).
cuda_family_and_head_dims._dynamo_marked_constant = True
