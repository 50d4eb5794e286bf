#!/usr/bin/env python3
"""Where a kernel's warps spend their time, by how often the code runs.

Reads the per-instruction table that Nsight Compute writes for one profiled kernel
and groups its warp-state samples two ways:
  - by execution count: code run once per tile (tiles x consumer warps executions)
    apart from the main loop (that count x iterations) and the producer;
  - by contiguous SASS ranges of one execution count, with each range's share.

    ncu --clock-control none -k regex:fwd_ws_kernel -c 1 --section WarpStateStats \\
        --section SourceCounters -o prof python3 benchmarks/profile_one_call.py \\
        --batch 32 --seqlen 512 --heads 16 --hdim 128 --family sm90
    ncu -i prof.ncu-rep --page source --csv --print-source sass > prof.csv
    python3 benchmarks/ncu_source_summary.py prof.csv [--min-share 0.5]
"""

from __future__ import annotations

import argparse
import collections
import csv

SAMPLES = "Warp Stall Sampling (All Samples)"
EXECUTED = "Instructions Executed"


def read(path):
    with open(path, newline="") as f:
        rows = list(csv.reader(f))
    header = rows[1]  # rows[0] names the kernel
    col = {h: i for i, h in enumerate(header)}
    reasons = [h for h in header if h.startswith("stall_") and "(Not Issued)" not in h]
    out = []
    for r in rows[2:]:
        if len(r) < len(header) or not r[col[SAMPLES]].strip().isdigit():
            continue
        out.append({
            "sass": r[col["Source"]].strip(),
            "samples": int(r[col[SAMPLES]]),
            "executed": int(r[col[EXECUTED]] or 0),
            "reasons": {h[len("stall_"):]: int(r[col[h]] or 0) for h in reasons},
        })
    return rows[0][1] if len(rows[0]) > 1 else "", out


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("csv")
    p.add_argument("--min-share", type=float, default=0.5, help="smallest range to list, in percent of the samples")
    a = p.parse_args()
    kernel, ins = read(a.csv)
    total = sum(i["samples"] for i in ins) or 1
    print(kernel[:160])
    print(f"{total} samples over {len(ins)} instructions")

    by_count = collections.Counter()
    reasons = collections.defaultdict(collections.Counter)
    for i in ins:
        by_count[i["executed"]] += i["samples"]
        reasons[i["executed"]].update(i["reasons"])
    print("by execution count (top reasons, % of all samples):")
    for count, s in by_count.most_common(6):
        top = ", ".join(f"{k} {100 * v / total:.1f}" for k, v in reasons[count].most_common(4))
        print(f"  executed {count:8d}x  {100 * s / total:5.1f}%   {top}")

    print(f"contiguous SASS ranges of one execution count holding >= {a.min_share}% of the samples:")
    start = 0
    for k in range(1, len(ins) + 1):
        if k < len(ins) and ins[k]["executed"] == ins[start]["executed"]:
            continue
        s = sum(i["samples"] for i in ins[start:k])
        if 100 * s / total >= a.min_share:
            print(f"  SASS {start:5d}-{k - 1:5d}  executed {ins[start]['executed']:8d}x  {100 * s / total:5.1f}%"
                  f"  first: {ins[start]['sass'][:48]}")
        start = k


if __name__ == "__main__":
    main()
