"""Where a kernel touches local memory (register spills), from `cuobjdump -sass`.

    cuobjdump -sass kernels.o | python3 scripts/sass_spills.py

Per kernel: local stores (STL) and loads (LDL) inside its loops (a backward
branch spanning more than 4 KB of code: the main loops, not the spin-waits) and
outside them. Exits non-zero if a kernel stores to local memory inside a loop;
loads there (a loop-invariant value reloaded once per iteration) are reported.
"""

import re
import sys

FUNCTION = re.compile(r"Function : (\S+)")
BRANCH = re.compile(r"/\*([0-9a-f]{4,})\*/\s+(?:@!?P\w+\s+)?BRA(?:\.U)?\s+(0x[0-9a-f]+)")
LOCAL = re.compile(r"/\*([0-9a-f]{4,})\*/\s+.*\b(STL|LDL)\b")
MIN_LOOP_BYTES = 0x1000


def analyse(lines):
    loops = []
    for line in lines:
        if m := BRANCH.search(line):
            src, dst = int(m.group(1), 16), int(m.group(2), 16)
            if dst < src and src - dst > MIN_LOOP_BYTES:
                loops.append((dst, src))
    counts = {"STL": [0, 0], "LDL": [0, 0]}  # [in a loop, outside]
    for line in lines:
        if m := LOCAL.search(line):
            addr = int(m.group(1), 16)
            counts[m.group(2)][0 if any(lo <= addr <= hi for lo, hi in loops) else 1] += 1
    return counts


def main():
    functions, name = {}, None
    for line in sys.stdin:
        if m := FUNCTION.search(line):
            name = m.group(1)
            functions[name] = []
        elif name:
            functions[name].append(line)
    bad = 0
    for name, lines in sorted(functions.items()):
        c = analyse(lines)
        if sum(c["STL"]) + sum(c["LDL"]) == 0:
            continue
        demangled = re.sub(r"^_ZN9flashattn\d+", "", name)[:90]
        print(f"{demangled}: in loops {c['STL'][0]} STL / {c['LDL'][0]} LDL; "
              f"outside {c['STL'][1]} STL / {c['LDL'][1]} LDL")
        bad += c["STL"][0] > 0
    if bad:
        sys.exit(f"{bad} kernel(s) spill inside a loop")
    print("no kernel stores to local memory inside a loop")


if __name__ == "__main__":
    main()
