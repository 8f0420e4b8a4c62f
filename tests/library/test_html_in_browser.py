"""The HTML views rendered by a real headless browser (Chromium): every word is
on the page, and a DiffMask row that drops everything looks empty while one
that keeps everything is coloured."""

import shutil
import subprocess

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


def _diffmask(kept):
    scores = torch.full((len(WORDS), 1), kept)
    return Explanation("DiffMask", [" ".join(WORDS)], ["layer 0"], "max", words=[WORDS], word_scores=[scores])


def test_every_word_is_on_the_rendered_page(tmp_path):
    dom = _chromium(tmp_path, _diffmask(0.5).to_html(), "--dump-dom").stdout
    assert dom.count("class=\"w\"") == len(WORDS)
    for word in WORDS:
        assert f">{word}</span>" in dom


def test_a_row_that_drops_everything_looks_empty_and_one_that_keeps_everything_does_not(tmp_path):
    assert _green_pixels(tmp_path, _diffmask(0.009).to_html()) == 0  # not scaled up to its maximum
    assert _green_pixels(tmp_path, _diffmask(1.0).to_html()) > 500


def test_a_comparison_page_renders_every_method_and_token(tmp_path):
    mask = torch.ones(1, len(WORDS), dtype=torch.bool)
    methods = {"DiffMask": MethodResult("DiffMask", torch.zeros(1, len(WORDS)), probabilities=True),
               "IntegratedGradients": MethodResult("IntegratedGradients", torch.linspace(-1, 1, len(WORDS))[None])}
    page = Comparison(methods, [WORDS], mask, 0, 1.0).to_html()
    dom = _chromium(tmp_path, page, "--dump-dom").stdout
    assert dom.count("class=\"w\"") == 2 * len(WORDS) and dom.count("<tr>") == 2
