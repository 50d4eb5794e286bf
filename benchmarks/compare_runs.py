#!/usr/bin/env python3
"""Two builds of flashattn timed in one call, compared cell by cell.

Each argument is LABEL=GLOB: the bench_attention.py JSON files (--out NAME
writes NAME.json) of one build, one file per rep, reps run alternating with the
other build's. Per cell (mode, dtype, head dim, causal, seqlen) the fastest rep
of each build is taken; printed are the cells' ratios (B over A: > 1 means B is
faster), their geometric means by head dim and causal, by seqlen, and over all.

  python3 benchmarks/compare_runs.py base='r/fwd-base-*.json' new='r/fwd-new-*.json'
"""

from __future__ import annotations

import argparse
import glob
import json
import math
from collections import defaultdict


def load_best(pattern: str, impl: str) -> dict:
    best: dict = {}
    files = sorted(glob.glob(pattern))
    if not files:
        raise SystemExit(f"no files match {pattern!r}")
    for path in files:
        with open(path) as f:
            for row in json.load(f)["rows"]:
                res = row["results"].get(impl) or {}
                if res.get("tflops") is None:
                    continue
                key = (row["mode"], row["dtype"], row["hdim"], row["causal"], row["seqlen"])
                best[key] = max(best.get(key, 0.0), res["tflops"])
    return best


def geomean(xs):
    return math.exp(sum(map(math.log, xs)) / len(xs)) if xs else float("nan")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("runs", nargs=2, metavar="LABEL=GLOB")
    p.add_argument("--impl", default="flashattn", help="the implementation compared (default flashattn)")
    args = p.parse_args()
    (la, pa), (lb, pb) = (r.split("=", 1) for r in args.runs)
    a, b = load_best(pa, args.impl), load_best(pb, args.impl)
    cells = sorted(set(a) & set(b))
    print(f"{args.impl} TFLOP/s, fastest rep per cell: {la} ({pa}) and {lb} ({pb}); ratio {lb}/{la}")
    print(f"{'mode':8} {'dtype':5} {'hdim':>4} {'causal':>6} {'seqlen':>6} {la:>9} {lb:>9}  ratio")
    groups, by_len = defaultdict(list), defaultdict(list)
    for key in cells:
        r = b[key] / a[key]
        mode, dtype, hdim, causal, seqlen = key
        print(f"{mode:8} {dtype:5} {hdim:4d} {str(causal):>6} {seqlen:6d} {a[key]:9.1f} {b[key]:9.1f}  {r:.3f}")
        groups[(mode, dtype, hdim, causal)].append(r)
        by_len[(mode, seqlen)].append(r)
    for (mode, dtype, hdim, causal), rs in sorted(groups.items()):
        print(f"geomean {mode} {dtype} d{hdim} causal={causal}: {geomean(rs):.3f}")
    for (mode, seqlen), rs in sorted(by_len.items()):
        print(f"geomean {mode} seqlen {seqlen}: {geomean(rs):.3f}")
    print(f"geomean over {len(cells)} cells: {geomean([b[k] / a[k] for k in cells]):.4f}")


if __name__ == "__main__":
    main()
