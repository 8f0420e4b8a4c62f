"""The HTML views rendered by a real headless browser (Chromium): every word is
on the page, a DiffMask row that drops everything looks empty while one that
keeps everything is coloured, and every view carries its legend and each
layer's convergence verdict."""

import json
import shutil
import subprocess
from pathlib import Path

import matplotlib.image
import pytest
import torch

from captum_diffmask.interface.comparison import Comparison, MethodResult
from captum_diffmask.interface.explanation import Explanation

CHROMIUM = next((p for p in map(shutil.which, ("chromium", "chromium-browser", "google-chrome")) if p), None)
pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="no Chromium to render the HTML views: install it "
                                "(Debian: apt-get install chromium)")
WORDS = ["a", "film", "with", "lovely", "performances"]


def _chromium(tmp_path, page, *arguments):
    path = tmp_path / "page.html"
    path.write_text(page)
    command = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
               f"--user-data-dir={tmp_path / 'profile'}", *arguments, path.as_uri()]
    return subprocess.run(command, capture_output=True, text=True, timeout=120, cwd=tmp_path)


def _green_pixels(tmp_path, page):
    _chromium(tmp_path, page, f"--screenshot={tmp_path / 'shot.png'}", "--window-size=800,300")
    pixels = matplotlib.image.imread(tmp_path / "shot.png")[..., :3]
    red, green, blue = pixels[..., 0], pixels[..., 1], pixels[..., 2]
    return int(((green - red > 0.15) & (green - blue > 0.15)).sum())


def _diffmask(kept, verdicts=()):
    scores = torch.full((len(WORDS), max(len(verdicts), 1)), kept)
    columns = [f"layer {k}" for k in range(scores.shape[1])]
    return Explanation("DiffMask", [" ".join(WORDS)], columns, "max", words=[WORDS], word_scores=[scores],
                       verdicts=list(verdicts))


def test_every_word_is_on_the_rendered_page(tmp_path):
    dom = _chromium(tmp_path, _diffmask(0.5).to_html(), "--dump-dom").stdout
    assert dom.count("class=\"w\"") == len(WORDS)
    for word in WORDS:
        assert f">{word}</span>" in dom


def test_a_row_that_drops_everything_looks_empty_and_one_that_keeps_everything_does_not(tmp_path):
    legend_only = _green_pixels(tmp_path, _diffmask(0.0).to_html())  # the legend's 0..1 swatch
    assert legend_only > 50
    assert _green_pixels(tmp_path, _diffmask(0.009).to_html()) == legend_only  # not scaled up to its maximum
    assert _green_pixels(tmp_path, _diffmask(1.0).to_html()) > legend_only + 500


def _legend(dom):
    return dom.split('<div class="legend">', 1)[1].split("</div>", 1)[0]


def test_the_explanation_page_shows_its_legend_and_each_layers_verdict(tmp_path):
    dom = _chromium(tmp_path, _diffmask(0.5, ["converged", "unsettled"]).to_html(), "--dump-dom").stdout
    legend = _legend(dom)
    assert "keep probability" in legend and "from 0" in legend and "to 1" in legend
    assert "<b>converged</b>" in legend and "not converged" in legend
    assert "attribution over the row" not in legend  # no signed rows on this page
    assert 'data-verdict="converged">converged<' in dom
    assert 'data-verdict="unsettled">not converged: unsettled<' in dom


def test_a_comparison_page_renders_every_method_and_token(tmp_path):
    mask = torch.ones(1, len(WORDS), dtype=torch.bool)
    methods = {"DiffMask": MethodResult("DiffMask", torch.zeros(1, len(WORDS)), probabilities=True),
               "IntegratedGradients": MethodResult("IntegratedGradients", torch.linspace(-1, 1, len(WORDS))[None])}
    methods["DiffMask"].verdicts = {0: "needed"}
    methods["IntegratedGradients"].verdicts = {0: "failed check: completeness gap 0.43"}
    methods["DiffMask"].seconds, methods["IntegratedGradients"].seconds = 0.25, 0.5
    page = Comparison(methods, [WORDS], mask, 0, 1.0, metrics=[]).to_html()
    dom = _chromium(tmp_path, page, "--dump-dom").stdout
    assert dom.count("class=\"w\"") == 2 * len(WORDS)
    summary = dom.split('<table class="metrics">', 1)[1].split("</table>", 1)[0]
    assert "<th>x one forward pass</th>" in summary  # the terminal's table, as HTML
    assert "<td>DiffMask</td>" in summary and "<td>0.25</td>" in summary and "<td>0.5</td>" in summary
    legend = _legend(dom)
    assert "keep probability" in legend and "red negative" in legend and "<b>needed</b>" in legend
    assert 'data-verdict="needed">needed<' in dom
    # Integrated Gradients' check of its own numbers: in the summary and on its row, as measured, not "not converged"
    assert "<th>verdict</th>" in summary and "<td>failed check: completeness gap 0.43</td>" in summary
    assert 'data-verdict="failed check: completeness gap 0.43">failed check: completeness gap 0.43<' in dom
    assert "Checked / failed check: a method's own measure" in legend


def test_a_generation_page_shows_its_legend_and_each_layers_verdict(tmp_path):
    from captum_diffmask.interface.generation_result import GenerationAttribution

    scores = torch.rand(2, 3, 2)
    defined = torch.tensor([[True, True, False], [True, True, True]])
    result = GenerationAttribution(torch.arange(4), 2, scores, defined, ["a", "b", "c", "d"], "DiffMask",
                                   [0, 1], None, probabilities=True, verdicts={0: "converged", 1: "violated"})
    dom = _chromium(tmp_path, result.to_html(), "--dump-dom").stdout
    assert "keep probability" in _legend(dom)
    assert 'data-verdict="converged">converged<' in dom and 'data-verdict="violated">not converged: violated<' in dom


def _depth_page(tmp_path):
    from captum_diffmask import depth_view

    scores = torch.tensor([[0.1, 0.9, 0.0], [1.0, 0.5, 0.25], [0.0, 0.2, 1.0], [0.95, 1.0, 0.5], [0.6, 0.01, 0.75]])
    dm = Explanation("DiffMask", [" ".join(WORDS)], ["layer 0", "layer 1", "layer 2"], "max", words=[WORDS],
                     word_scores=[scores], verdicts=["converged", "needed", "unsettled"])
    ig = Explanation("IntegratedGradients", [" ".join(WORDS)], ["score"], "sum", words=[WORDS],
                     word_scores=[torch.linspace(-1, 1, len(WORDS))[:, None]])
    path = tmp_path / "depth.html"
    path.write_text(depth_view(dm, [ig]))
    return path, scores


def _shown(tmp_path, path, layer):
    command = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", f"--user-data-dir={tmp_path / 'profile'}",
               "--dump-dom", path.as_uri() + f"#layer={layer}"]
    dom = subprocess.run(command, capture_output=True, text=True, timeout=120, cwd=tmp_path).stdout
    import re

    cells = re.findall(r'<span class="w d" data-text="(\d+)" data-word="(\d+)"[^>]*data-score="([\d.]+)"[^>]*'
                       r'style="background: rgba?\(0, 160, 0(?:, ([\d.]+))?\);"', dom)
    # the browser writes an opaque colour as rgb(...)
    return dom, {(int(t), int(j)): (float(score), float(alpha or 1.0)) for t, j, score, alpha in cells}


def test_the_depth_page_shades_the_words_with_the_layer_its_slider_picks(tmp_path):
    path, scores = _depth_page(tmp_path)
    for layer in (0, 1, 2):
        dom, shown = _shown(tmp_path, path, layer)
        assert sorted(shown) == [(0, j) for j in range(len(WORDS))]  # the script shaded every word
        for (_, j), (score, alpha) in shown.items():
            assert score == pytest.approx(float(scores[j, layer]), abs=1e-6)
            assert alpha == pytest.approx(float(scores[j, layer]), abs=2e-3)
        assert f'id="depth-label">layer {layer}<' in dom
    dom, _ = _shown(tmp_path, path, 2)
    assert 'id="depth-verdict"><span class="verdict unsettled" data-verdict="unsettled">not converged: unsettled' in dom
    legend = _legend(dom)
    assert "keep probability" in legend and "red negative" in legend and "<b>needed</b>" in legend
    assert "<th>IntegratedGradients</th>" in dom  # the other method's row beside
    assert "http" not in path.read_text().replace("http-equiv", "")  # nothing fetched at view time


def test_the_committed_sst_depth_page_shades_each_sentence_with_the_depth_its_slider_picks(tmp_path):
    # docs/results/sst-depth.html, drawn by the sst-depth-page study from a saved probe: every depth shows the
    # keep probabilities its JSON records, with that depth's verdict
    results = Path(__file__).resolve().parents[2] / "docs" / "results"
    data = json.loads((results / "sst-depth.json").read_text())
    path = results / "sst-depth.html"
    for depth in (0, len(data["columns"]) - 1):
        dom, shown = _shown(tmp_path, path, depth)
        expected = {(t, j): row[depth] for t, keep in enumerate(data["keep"]) for j, row in enumerate(keep)}
        assert sorted(shown) == sorted(expected)
        for cell, (score, alpha) in shown.items():
            assert score == pytest.approx(expected[cell], abs=1e-6)
            assert alpha == pytest.approx(expected[cell], abs=1 / 255)  # the browser keeps an alpha in 8 bits
        verdict = data["verdicts"][depth]
        shown_verdict = dom.split('id="depth-verdict">', 1)[1].split("</span>", 1)[0]
        assert f'data-verdict="{verdict}">' in shown_verdict
    assert "keep probability" in _legend(dom)
    assert "http" not in path.read_text().replace("http-equiv", "")
