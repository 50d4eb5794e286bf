"""benchmarks/dropout_cost.py on two small made-up grids (no GPU): the costs,
ratios and added times it reports are the ones the rows give."""

import importlib.util
import json
import os

import pytest

ROOT = os.path.join(os.path.dirname(__file__), "..")


def _load(name):
    spec = importlib.util.spec_from_file_location(name, os.path.join(ROOT, "benchmarks", f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _grid(path, p, ms):
    """ms: {(mode, hdim): {impl: ms}}; one causal bf16 row of seqlen 1024 each."""
    rows = []
    for (mode, hdim), times in ms.items():
        row = {"mode": mode, "causal": True, "dtype": "bf16", "hdim": hdim, "seqlen": 1024,
               "results": {i: {"ms": t} for i, t in times.items()}}
        fa = times["flashattn"]
        row["ours_over_fa2"] = times["FA2"] / fa
        row["ours_over_cudnn"] = times["cuDNN"] / fa
        rows.append(row)
    with open(path, "w") as f:
        json.dump({"meta": {"dropout_p": p, "impls": ["flashattn", "FA2", "cuDNN"]}, "rows": rows}, f)


def test_dropout_cost_report(tmp_path, capsys):
    without = {("fwd", 64): {"flashattn": 1.0, "FA2": 2.0, "cuDNN": 1.0},
               ("fwd", 128): {"flashattn": 2.0, "FA2": 4.0, "cuDNN": 2.0}}
    with_ = {("fwd", 64): {"flashattn": 1.2, "FA2": 2.2, "cuDNN": 2.0},
             ("fwd", 128): {"flashattn": 2.6, "FA2": 4.4, "cuDNN": 4.0}}
    _grid(tmp_path / "with.json", 0.1, with_)
    _grid(tmp_path / "without.json", 0.0, without)
    _load("dropout_cost").main([str(tmp_path / "with.json"), str(tmp_path / "without.json")])
    out = capsys.readouterr().out
    # geomean of 1.2 and 1.3; FA2 1.1 both; cuDNN 2 both; ours/FA2 sqrt(2.2/1.2 * 4.4/2.6)
    ours = (1.2 * 1.3) ** 0.5
    over_fa2 = (2.2 / 1.2 * 4.4 / 2.6) ** 0.5
    over_cudnn = (2.0 / 1.2 * 4.0 / 2.6) ** 0.5
    assert (f"geomean fwd: cost of dropout: flashattn {ours:.3f} FA2 1.100 cuDNN 2.000; "
            f"flashattn/FA2 with dropout {over_fa2:.3f}, flashattn/cuDNN with dropout {over_cudnn:.3f}") in out
    assert "time dropout adds: flashattn +0.8 ms of 3.0, FA2 +0.6 ms of 6.0, cuDNN +3.0 ms of 3.0" in out
    by_hdim = {line.split()[1]: [float(x) for x in line.split()[2:]]
               for line in out.splitlines() if line.startswith("fwd ") and len(line.split()) == 7}
    assert by_hdim["64"] == pytest.approx([1.2, 1.1, 2.0, 2.2 / 1.2, 2.0 / 1.2], abs=1e-3)
    assert by_hdim["128"] == pytest.approx([1.3, 1.1, 2.0, 4.4 / 2.6, 4.0 / 2.6], abs=1e-3)
