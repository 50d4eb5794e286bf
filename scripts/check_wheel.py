#!/usr/bin/env python3
"""Checks a built flashattn wheel before it is released, and reports its figures.

    python3 scripts/check_wheel.py dist/flashattn-0.1.0+cu13-py3-none-manylinux_2_28_x86_64.whl \
        --variant cu13 [--build-seconds S --jobs N]

Fails (exit 1) when:
  - the module needs a GLIBC_ symbol version newer than the wheel's manylinux tag
    allows (PEP 600: manylinux_2_28 -> at most GLIBC_2.28);
  - it needs a shared library other than torch's libtorch_cpu.so and the C runtime's
    (libstdc++ must be linked in: a GLIBCXX_ version would tie it to one compiler);
  - it exports a C++ runtime symbol (they would bind to the process's libstdc++);
  - it has an RPATH/RUNPATH;
  - its families and targets are not the ones of its CUDA major (cu13: no sm70;
    cu12: sm70 for sm_70), or the wheel's local version label disagrees.
Uses binutils (objdump, readelf); cuobjdump (for the kernel count) where on PATH.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

# Shared libraries the module may need: torch's C shim and the C runtime that every
# manylinux system has (PEP 600). libtorch_cpu.so comes from the torch in the process.
ALLOWED_NEEDED = {
    "libtorch_cpu.so",
    "libc.so.6",
    "libm.so.6",
    "libdl.so.2",
    "libpthread.so.0",
    "librt.so.1",
    "libgcc_s.so.1",
    "ld-linux-x86-64.so.2",
}
CXX_RUNTIME_EXPORT = re.compile(r"^(_ZNSt|_ZSt|_ZNKSt|_ZTI|_ZTS|_ZTV|__cxa_|__gxx_)")
# Each variant's families and their targets; a trial build (pruned head dims or dtypes)
# holds the same families.
# sm90: sm_90a machine code (runs on cc 9.0 alone), no PTX.
EXPECTED = {
    "cu13": {
        "sm75": {"sass": [75], "ptx": []},
        "sm80": {"sass": [80, 86, 89, 90, 100, 120], "ptx": [90]},
        "sm90": {"sass": [90], "ptx": []},
    },
    "cu12": {
        "sm70": {"sass": [70], "ptx": []},
        "sm75": {"sass": [75], "ptx": []},
        # CUDA 12.8+ adds sm_100/sm_120 (the workflow's 12.9); older 12.x stop at sm_90.
        "sm80": {"sass": [80, 86, 89, 90], "ptx": [90]},
        "sm90": {"sass": [90], "ptx": []},
    },
}


def _run(*cmd: str) -> str:
    return subprocess.run(cmd, check=True, capture_output=True, text=True).stdout


def glibc_versions(so: Path) -> list[tuple[int, ...]]:
    """The GLIBC_x.y versions the module's undefined symbols are bound to."""
    found = set(re.findall(r"\(GLIBC_([0-9.]+)\)", _run("objdump", "-T", str(so))))
    return sorted(tuple(int(p) for p in v.split(".")) for v in found)


def needed_libraries(so: Path) -> tuple[list[str], list[str]]:
    """(NEEDED, RPATH and RUNPATH entries) of the dynamic section."""
    dynamic = _run("readelf", "-d", "-W", str(so))
    needed = re.findall(r"\(NEEDED\)\s+Shared library: \[([^\]]+)\]", dynamic)
    paths = re.findall(r"\((?:RPATH|RUNPATH)\)\s+Library (?:rpath|runpath): \[([^\]]*)\]", dynamic)
    return needed, paths


def exported_cxx_runtime(so: Path) -> list[str]:
    out = _run("nm", "-D", "--defined-only", str(so))
    names = [line.split()[-1] for line in out.splitlines() if len(line.split()) == 3]
    return [n for n in names if CXX_RUNTIME_EXPORT.match(n)]


def manylinux_glibc(wheel_name: str) -> tuple[int, int] | None:
    m = re.search(r"manylinux_(\d+)_(\d+)_", wheel_name)
    return (int(m.group(1)), int(m.group(2))) if m else None


def kernel_count(so: Path) -> int | None:
    """CUDA kernels in the module's sm_90 code (every target holds the same ones)."""
    if shutil.which("cuobjdump") is None:
        return None
    out = subprocess.run(["cuobjdump", "-elf", str(so)], capture_output=True, text=True, check=False).stdout
    arch = None
    count = 0
    for line in out.splitlines():
        m = re.match(r"arch = (sm_\d+)", line.strip())
        if m:
            arch = m.group(1)
        elif arch == "sm_90" and re.search(r"PROGBITS\s.*\s\.text\.\S+$", line):
            count += 1
    return count or None


def check(wheel: Path, variant: str | None, build_seconds: float | None, jobs: int | None) -> bool:
    problems: list[str] = []
    with tempfile.TemporaryDirectory() as tmp, zipfile.ZipFile(wheel) as z:
        names = z.namelist()
        sos = [n for n in names if re.fullmatch(r"flashattn/_C[^/]*\.so", n)]
        if len(sos) != 1 or "flashattn/_build_info.json" not in names:
            print(f"FAIL: {wheel.name} lacks flashattn/_C*.so or _build_info.json", file=sys.stderr)
            return False
        so = Path(z.extract(sos[0], tmp))
        info = json.loads(z.read("flashattn/_build_info.json"))
        installed = sum(i.file_size for i in z.infolist())

        tag = manylinux_glibc(wheel.name)
        versions = glibc_versions(so)
        newest = versions[-1] if versions else None
        if tag is None:
            problems.append(f"{wheel.name} has no manylinux_X_Y platform tag")
        elif newest is not None and newest[:2] > tag:
            problems.append(
                f"the module needs GLIBC_{'.'.join(map(str, newest))}, newer than its tag"
                f" manylinux_{tag[0]}_{tag[1]} allows — build in the manylinux container or"
                " against scripts/glibc_sysroot.sh (scripts/build_wheel.sh does)"
            )
        needed, rpaths = needed_libraries(so)
        extra = sorted(set(needed) - ALLOWED_NEEDED)
        if extra:
            problems.append(f"the module needs {', '.join(extra)}: link them statically (-static-libstdc++)")
        if rpaths:
            problems.append(f"the module has an RPATH/RUNPATH {rpaths}")
        exported = exported_cxx_runtime(so)
        if exported:
            problems.append(f"the module exports {len(exported)} C++ runtime symbols, e.g. {exported[:3]}")

        families = info.get("families", {})
        if variant is not None:
            label = re.search(r"^flashattn-[^-]+\+(cu\d+)-", wheel.name)
            if label is None or label.group(1) != variant:
                problems.append(f"{wheel.name} is not labelled +{variant} (FLASHATTN_WHEEL_CUDA)")
            expected = EXPECTED[variant]
            got = {f: {"sass": sorted(t.get("sass", [])), "ptx": sorted(t.get("ptx", []))} for f, t in families.items()}
            cuda = tuple(int(p) for p in str(info.get("cuda_version", "0.0")).split(".")[:2])
            if variant == "cu12" and cuda >= (12, 8):
                expected = dict(expected, sm80={"sass": [80, 86, 89, 90, 100, 120], "ptx": [90]})
            if got != expected:
                problems.append(f"families/targets {got}, expected {expected} for {variant}")
        pruned = set(info.get("head_dims", [])) != {32, 64, 96, 128, 160, 192, 224, 256} or len(
            info.get("dtypes", [])
        ) != 2
        kernels = kernel_count(so)

        print(f"wheel           {wheel.name}")
        print(f"size            {wheel.stat().st_size / 2**20:.1f} MiB (installed {installed / 2**20:.1f} MiB; _C.so {so.stat().st_size / 2**20:.1f} MiB)")
        if build_seconds is not None:
            print(f"build time      {build_seconds / 60:.1f} min" + (f" with {jobs} jobs" if jobs else ""))
        print(f"CUDA            {info.get('cuda_version')}; torch target {info.get('torch_target_version')}")
        for f, t in sorted(families.items()):
            print(f"family {f}     sass {t.get('sass')} ptx {t.get('ptx')}")
        print(f"dtypes, dims    {info.get('dtypes')} {info.get('head_dims')}" + ("  (pruned: a trial build)" if pruned else ""))
        if kernels is not None:
            print(f"kernels         {kernels} (per target)")
        print(f"glibc needed    GLIBC_{'.'.join(map(str, newest)) if newest else '-'} (tag allows {tag[0]}.{tag[1]})" if tag else "")
        print(f"needs           {', '.join(needed)}")
    for p in problems:
        print(f"FAIL: {p}", file=sys.stderr)
    if not problems:
        print("check_wheel: OK")
    return not problems


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("wheel", type=Path)
    ap.add_argument("--variant", choices=sorted(EXPECTED), help="the CUDA major the wheel was built for")
    ap.add_argument("--build-seconds", type=float)
    ap.add_argument("--jobs", type=int)
    args = ap.parse_args()
    return 0 if check(args.wheel, args.variant, args.build_seconds, args.jobs) else 1


if __name__ == "__main__":
    sys.exit(main())
