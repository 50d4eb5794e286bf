#!/usr/bin/env python3
"""What dropout costs: two bench_attention.py results of the same grid, one with
--dropout P and one without, side by side.

    python3 benchmarks/dropout_cost.py WITH.json WITHOUT.json

Per row and implementation: time with dropout / time without (the cost of dropout),
and flashattn / FA2 with dropout (TFLOP/s). Geomeans per mode, and per mode and
head dim (with flashattn / cuDNN with dropout where cuDNN ran).
"""

from __future__ import annotations

import json
import math
import sys


def _geomean(xs):
    xs = [x for x in xs if x]
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else None


def _key(row):
    return (row["mode"], row["causal"], row["dtype"], row["hdim"], row["seqlen"], row.get("name"))


def main(argv):
    if len(argv) != 2:
        raise SystemExit(__doc__)
    with open(argv[0]) as f:
        with_ = json.load(f)
    with open(argv[1]) as f:
        without = json.load(f)
    p = with_["meta"].get("dropout_p")
    base = {_key(r): r for r in without["rows"]}
    impls = [i for i in ("flashattn", "FA2", "cuDNN", "memeff") if i in with_["meta"]["impls"]]
    print(f"dropout_p {p}: time with / time without dropout, per implementation; "
          f"flashattn / FA2 = TFLOP/s ratio with dropout")
    print(f"{'mode':8} {'causal':6} {'dtype':5} {'hdim':>4} {'seqlen':>6} "
          + " ".join(f"{i:>9}" for i in impls) + f" {'ours/FA2':>9}")
    costs = {(m, i): [] for m in ("fwd", "fwd_bwd") for i in impls}
    ratios = {m: [] for m in ("fwd", "fwd_bwd")}
    ratios_cudnn = {m: [] for m in ("fwd", "fwd_bwd")}
    by_hdim = {}  # (mode, hdim) -> {impl: costs, "ours/FA2": ratios, "ours/cuDNN": ratios}
    for row in with_["rows"]:
        ref = base.get(_key(row))
        if ref is None:
            continue
        bucket = by_hdim.setdefault((row["mode"], row["hdim"]), {})
        cells = []
        for i in impls:
            a, b = row["results"].get(i, {}).get("ms"), ref["results"].get(i, {}).get("ms")
            c = a / b if a and b else None
            costs[(row["mode"], i)].append(c)
            bucket.setdefault(i, []).append(c)
            cells.append(f"{c:9.3f}" if c else f"{'n/a':>9}")
        ratio = row.get("ours_over_fa2")
        ratios[row["mode"]].append(ratio)
        ratios_cudnn[row["mode"]].append(row.get("ours_over_cudnn"))
        bucket.setdefault("ours/FA2", []).append(ratio)
        bucket.setdefault("ours/cuDNN", []).append(row.get("ours_over_cudnn"))
        print(f"{row['mode']:8} {row['causal']!s:6} {row['dtype']:5} {row['hdim']:>4} {row['seqlen']:>6} "
              + " ".join(cells) + (f" {ratio:9.3f}" if ratio else f" {'n/a':>9}"))
    for m in ("fwd", "fwd_bwd"):
        if not ratios[m]:
            continue
        cells = " ".join(f"{i} {_geomean(costs[(m, i)]) or float('nan'):.3f}" for i in impls)
        over_cudnn = _geomean(ratios_cudnn[m])
        print(f"geomean {m}: cost of dropout: {cells}; flashattn/FA2 with dropout {_geomean(ratios[m]):.3f}"
              + (f", flashattn/cuDNN with dropout {over_cudnn:.3f}" if over_cudnn else ""))
    # Absolute time: what dropout adds over the whole grid (rows where every
    # implementation ran), so that a faster kernel's larger relative cost can be
    # read beside the time it actually adds.
    for m in ("fwd", "fwd_bwd"):
        pairs = [(r, base.get(_key(r))) for r in with_["rows"] if r["mode"] == m]
        pairs = [(a, b) for a, b in pairs if b is not None and all(
            a["results"].get(i, {}).get("ms") and b["results"].get(i, {}).get("ms") for i in impls)]
        if not pairs:
            continue
        cells = []
        for i in impls:
            t_with = sum(a["results"][i]["ms"] for a, _ in pairs)
            t_without = sum(b["results"][i]["ms"] for _, b in pairs)
            cells.append(f"{i} +{t_with - t_without:.1f} ms of {t_without:.1f}")
        print(f"summed over {len(pairs)} {m} rows, time dropout adds: " + ", ".join(cells))
    cols = list(impls) + ["ours/FA2", "ours/cuDNN"]
    print("by head dim (geomeans over the rows): cost of dropout per implementation; "
          "flashattn over FA2 and over cuDNN, both with dropout")
    print(f"{'mode':8} {'hdim':>4} " + " ".join(f"{c:>10}" for c in cols))
    for (m, d), bucket in sorted(by_hdim.items()):
        vals = [_geomean(bucket.get(c, [])) for c in cols]
        print(f"{m:8} {d:>4} " + " ".join(f"{v:10.3f}" if v else f"{'n/a':>10}" for v in vals))


if __name__ == "__main__":
    main(sys.argv[1:])
