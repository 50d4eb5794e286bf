#!/usr/bin/env python3
"""Plot a bench_attention.py results JSON: TFLOP/s vs seqlen per implementation.

    python3 benchmarks/plot.py benchmarks/results/<name>.json [-o out.png]

One subplot per (mode, causal) row and head-dim column; colours are the
implementations, line styles the dtypes (bf16 solid, fp16 dashed).
bench_attention.py imports plot_results from here, so there is one plotting code.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

IMPL_STYLE = {  # colour, line width, z-order
    "flashattn": ("#d62728", 2.4, 5),
    "FA2": ("#1f77b4", 1.6, 4),
    "cuDNN": ("#2ca02c", 1.6, 3),
    "memeff": ("#7f7f7f", 1.6, 2),
}
DTYPE_STYLE = {"bf16": ("-", "o"), "fp16": ("--", "s")}


def _seqlen_label(s):
    return f"{s // 1024}k" if s >= 1024 and s % 1024 == 0 else str(s)


def _ordered(values, preferred):
    return [v for v in preferred if v in values] + sorted(v for v in values if v not in preferred)


def plot_results(data, out_png):
    """Write the figure for `data` (the dict bench_attention.py writes) to out_png."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D

    rows = data["rows"]
    meta = data.get("meta", {})
    if not rows:
        raise ValueError("no rows to plot")
    impls = _ordered({i for r in rows for i in r["results"]}, meta.get("impls") or list(IMPL_STYLE))
    modes = _ordered({r["mode"] for r in rows}, ["fwd", "fwd_bwd"])
    causals = _ordered({r["causal"] for r in rows}, [False, True])
    hdims = sorted({r["hdim"] for r in rows})
    dtypes = _ordered({r["dtype"] for r in rows}, ["bf16", "fp16"])
    seqlens = sorted({r["seqlen"] for r in rows})
    if len(hdims) > 1:  # rows (mode, causal), columns hdim
        grid = [[(m, c, d) for d in hdims] for m in modes for c in causals]
    else:  # one hdim: rows mode, columns causal
        grid = [[(m, c, hdims[0]) for c in causals] for m in modes]

    nrow, ncol = len(grid), len(grid[0])
    any_bad = False
    fig, axes = plt.subplots(nrow, ncol, figsize=(max(4.6 * ncol + 0.6, 8.5), 3.3 * nrow + 1.2),
                             squeeze=False, sharex=True, layout="constrained")
    for i, grid_row in enumerate(grid):
        for j, (mode, causal, hdim) in enumerate(grid_row):
            ax = axes[i][j]
            ymax = 0.0
            for impl in impls:
                color, lw, z = IMPL_STYLE.get(impl, (None, 1.6, 1))
                for dt in dtypes:
                    ls, marker = DTYPE_STYLE.get(dt, (":", "^"))
                    pts = sorted((r["seqlen"], r["results"].get(impl, {}).get("tflops"))
                                 for r in rows if (r["mode"], r["causal"], r["hdim"], r["dtype"])
                                 == (mode, causal, hdim, dt))
                    xs = [s for s, t in pts if t is not None]
                    ys = [t for s, t in pts if t is not None]
                    if not xs:
                        continue
                    ymax = max(ymax, max(ys))
                    ax.plot(xs, ys, ls=ls, marker=marker, ms=4, lw=lw, color=color, zorder=z)
                    if impl == "flashattn":  # rows whose output check failed
                        bad = [(r["seqlen"], r["results"]["flashattn"]["tflops"]) for r in rows
                               if (r["mode"], r["causal"], r["hdim"], r["dtype"])
                               == (mode, causal, hdim, dt) and r.get("check_ok") is False
                               and r["results"]["flashattn"].get("tflops") is not None]
                        if bad:
                            any_bad = True
                            ax.plot(*zip(*bad), ls="none", marker="x", ms=9, mew=2,
                                    color="black", zorder=9)
            ax.set_xscale("log", base=2)
            ax.set_xticks(seqlens)
            ax.set_xticklabels([_seqlen_label(s) for s in seqlens])
            ax.minorticks_off()
            ax.set_ylim(0, ymax * 1.12 if ymax > 0 else 1)
            ax.grid(True, alpha=0.3)
            ax.set_title(f"{mode}, {'causal' if causal else 'non-causal'}, hdim {hdim}",
                         fontsize=10)
            if j == 0:
                ax.set_ylabel("TFLOP/s")
            if i == nrow - 1:
                ax.set_xlabel("seqlen (batch = 16k / seqlen)")

    handles = [Line2D([], [], color=IMPL_STYLE.get(n, (None,))[0], lw=IMPL_STYLE.get(n, (0, 1.6))[1],
                      label=n) for n in impls]
    handles += [Line2D([], [], color="black", ls=DTYPE_STYLE.get(d, (":", "^"))[0],
                       marker=DTYPE_STYLE.get(d, (":", "^"))[1], ms=4, label=d) for d in dtypes]
    if any_bad:
        handles.append(Line2D([], [], ls="none", marker="x", ms=9, mew=2, color="black",
                              label="flashattn output check failed"))
    fig.legend(handles=handles, loc="outside lower center", ncol=len(handles), frameon=False)
    title = "flashattn vs PyTorch SDPA backends"
    bits = [meta.get("device"), meta.get("torch") and f"torch {meta['torch']}",
            meta.get("cuda") and f"CUDA {meta['cuda']}", meta.get("cudnn") and f"cuDNN {meta['cudnn']}",
            (meta.get("date_utc") or "")[:10]]
    sub = ", ".join(b for b in bits if b)
    fig.suptitle(f"{title}\n{sub}" if sub else title, fontsize=12)
    fig.savefig(out_png, dpi=110)
    plt.close(fig)
    return out_png


def main(argv=None):
    p = argparse.ArgumentParser(description="Re-plot a bench_attention.py results JSON.")
    p.add_argument("json", help="results file written by bench_attention.py")
    p.add_argument("-o", "--out", help="PNG path (default: the JSON's path with .png)")
    args = p.parse_args(argv)
    with open(args.json) as f:
        data = json.load(f)
    out = args.out or os.path.splitext(args.json)[0] + ".png"
    plot_results(data, out)
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
