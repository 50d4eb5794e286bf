"""Registers, shared memory and spills of every kernel in a build log.

Build with FLASHATTN_PTXAS_VERBOSE=1 (ptxas -v) and pass the log:

    FLASHATTN_PTXAS_VERBOSE=1 pip wheel --no-build-isolation --no-deps -v . > build.log 2>&1
    python3 scripts/resource_report.py build.log

Shared memory is dynamic (sized by the traits), so it is derived from the tile in
the kernel's name: Q tile + K tile + V tile, (M + 2N) x head_dim elements.
Exits non-zero if any kernel spills more than --max-spill bytes.
"""

import argparse
import re
import subprocess
import sys

ENTRY = re.compile(r"Compiling entry function '(\w+)' for '(sm_\w+)'")
SPILL = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
USED = re.compile(r"Used (\d+) registers")
# Sm80FwdTraits<Element, kHeadDim, kBlockM, kBlockN, kNWarps>, mangled.
TRAITS = re.compile(r"(Sm\d+\w*?Traits)IN7cutlass(\d+)(\w+?)ELi(\d+)ELi(\d+)ELi(\d+)ELi(\d+)E")
ELEMENT_BYTES = {"half_t": 2, "bfloat16_t": 2}


def demangle(name: str) -> str:
    try:
        return subprocess.run(["c++filt", name], capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return name


def parse(lines):
    kernels, current = [], None
    for line in lines:
        if m := ENTRY.search(line):
            current = {"name": m.group(1), "target": m.group(2)}
            kernels.append(current)
        elif current and (m := SPILL.search(line)):
            current["stack"], current["spill_st"], current["spill_ld"] = map(int, m.groups())
        elif current and (m := USED.search(line)):
            current["regs"] = int(m.group(1))
    return kernels


# Sm80BwdTraits<..., kNWarps, kAtomMSdP, kAtomNdKV, kAtomMdQ, kDoubleBufferQ>: the
# mangled tail after the warps is "Li2ELi4ELi2ELb1E".
BWD_DOUBLE_Q = re.compile(r"^(?:Li\d+E){3}Lb([01])E")


def describe(kernel):
    m = TRAITS.search(kernel["name"])
    if not m:
        return demangle(kernel["name"]), None
    traits, _, element, d, bm, bn, warps = m.groups()
    d, bm, bn = int(d), int(bm), int(bn)
    elem_bytes = ELEMENT_BYTES.get(element, 2)
    smem = (bm + 2 * bn) * d * elem_bytes  # forward: Q, K, V
    if traits == "Sm70FwdTraits":
        smem += bm * bn * elem_bytes  # and P
    if bwd := BWD_DOUBLE_Q.search(kernel["name"][m.end():]):
        # backward: Q (x2 when double-buffered), dO, K, V, P, dS
        q_buffers = 2 if bwd.group(1) == "1" else 1
        smem = ((q_buffers + 1) * bm * d + 2 * bn * d + 2 * bm * bn) * elem_bytes
    label = f"{traits} {element:<10} d{d:<3} {bm}x{bn} {warps} warps"
    if traits.endswith("WsTraits") and traits.startswith("Sm90Fwd"):
        # Sm90FwdWsTraits<..., kStages>: kQStages Q tiles (two where a second fits
        # beside the K/V stages and the output's own tile), kStages K and V stages,
        # and the output's own tile where it fits (arch/sm90.h, kernel/fwd_sm90.h;
        # their barriers are not counted). A build with -DFLASHATTN_SM90_Q_STAGES=1
        # has one Q stage: this assumes the default.
        stages, limit = int(warps), 227 * 1024
        kv = 2 * stages * bn * d * elem_bytes
        q_stages = 2 if (3 * bm * d * elem_bytes + kv + 2048) <= limit else 1
        smem = q_stages * bm * d * elem_bytes + kv
        own_o = smem + bm * d * elem_bytes <= limit
        smem += bm * d * elem_bytes if own_o else 0
        # e.g. "kv2 q2 o": two K/V stages, two Q stages, the output's own tile
        label = f"{traits} {element:<10} d{d:<3} {bm}x{bn} kv{stages} q{q_stages}{' o' if own_o else ''}"
    if flag := re.search(r"EELb([01])E", kernel["name"]):
        label += " +mods" if flag.group(1) == "1" else ""
    if "convert_dq" in kernel["name"]:
        label, smem = label + " dq convert", bm * d * elem_bytes
    return label, smem


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("log")
    ap.add_argument("--max-spill", type=int, default=None, help="fail if a kernel spills more bytes")
    ap.add_argument("--max-smem-kb", type=int, default=None, help="fail if a kernel needs more shared memory")
    args = ap.parse_args()
    with open(args.log, errors="replace") as f:
        kernels = parse(f)
    if not kernels:
        sys.exit(f"no 'Compiling entry function' lines in {args.log}: build with FLASHATTN_PTXAS_VERBOSE=1")
    print(f"{'kernel':<54} {'target':<7} {'regs':>4} {'smem KB':>7} {'stack':>5} {'spill st/ld':>11}")
    worst, worst_smem = 0, 0
    for k in sorted(kernels, key=lambda k: (k["target"], k["name"])):
        label, smem = describe(k)
        smem_kb = f"{smem / 1024:.0f}" if smem else "?"
        spill = f"{k.get('spill_st', 0)}/{k.get('spill_ld', 0)}"
        worst = max(worst, k.get("spill_st", 0))
        worst_smem = max(worst_smem, smem or 0)
        print(f"{label:<54} {k['target']:<7} {k.get('regs', 0):>4} {smem_kb:>7} {k.get('stack', 0):>5} {spill:>11}")
    if args.max_spill is not None and worst > args.max_spill:
        sys.exit(f"a kernel spills {worst} bytes (> {args.max_spill})")
    if args.max_smem_kb is not None and worst_smem > args.max_smem_kb * 1024:
        sys.exit(f"a kernel needs {worst_smem / 1024:.0f} KB of shared memory (> {args.max_smem_kb} KB)")


if __name__ == "__main__":
    main()
