"""DiffMask's fit with its defaults on toy data sets it was never tuned on
(the toy-robustness suite, small)."""

import json

from benchmarks.runner import run_suite


def test_defaults_fit_every_cell_of_a_small_grid(tmp_path, monkeypatch):
    monkeypatch.setenv("CAPTUM_DIFFMASK_CACHE", str(tmp_path / "cache"))
    # two data sets side by side (workers: 2), as the suite runs them
    overrides = {"data_seeds": [301, 302], "shapes": {"large": None},
                 "modes": ["hidden"], "data": {"num_examples": 6000}, "workers": 2}
    results = run_suite("toy-robustness", tmp_path / "out", seeds=[0, 1], overrides=overrides, verbose=False)
    cells = results["cells"]
    assert len(cells) == 4
    for cell in cells:
        assert cell["js"] <= 0.05, cell  # a uniform attribution scores ~0.2
    assert all(m["accuracy"] >= 0.99 for m in results["models"])
    summary = results["summary"]["hidden"]
    assert summary["worst_js"] == max(c["js"] for c in cells)
    # two fit seeds per data set: the std of the attributions across them, per data set
    assert [(r["data_seed"], r["mode"]) for r in results["stability"]] == [(301, "hidden"), (302, "hidden")]
    assert all(0 <= r["mean_std"] <= r["p95_std"] + 1e-9 for r in results["stability"])
    report = (tmp_path / "out" / "report.md").read_text()
    assert "## Stability across fit seeds" in report
    assert "| hidden | 4 |" in report and "## Every cell" in report
    assert json.loads((tmp_path / "out" / "results.json").read_text())["suite"] == "toy-robustness"
