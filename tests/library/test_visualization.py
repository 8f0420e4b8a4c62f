"""The figures: what they draw (the normalised numbers), the files, and bad input."""

import matplotlib
import numpy as np
import pytest
import torch

from captum_diffmask.interface.figures import attribution_panels, hidden_state_scatter, layer_heatmap, normalize_unit

PNG = b"\x89PNG\r\n\x1a\n"


def test_normalize_unit_scales_each_row_by_its_max():
    rows = np.array([[1.0, 2.0, 4.0], [-1.0, 0.0, 0.0], [0.5, np.nan, np.inf]])
    out = normalize_unit(rows)
    np.testing.assert_allclose(out[0], [0.25, 0.5, 1.0])
    np.testing.assert_allclose(out[1], [0.0, 0.0, 0.0])  # nothing positive stays zero
    np.testing.assert_allclose(out[2], [1.0, 0.0, 0.0])  # non-finite entries count as 0
    np.testing.assert_allclose(normalize_unit(torch.tensor([3.0, -2.0, 1.5])), [1.0, 0.0, 0.5])


def test_attribution_panels_draw_the_normalised_rows(tmp_path):
    backend = matplotlib.rcParams["backend"]
    tokens = ["8", "1", "3", "8"]
    hidden = {"ground truth": [1, 1, 0, 1], "method": torch.tensor([0.2, 0.4, 0.1, 0.0])}
    inputs = {"signed": [-1.0, 2.0, 1.0, 0.5]}
    path = tmp_path / "sub" / "panel.png"
    figure = attribution_panels(tokens, [("hidden", hidden), ("input", inputs)], path=path,
                                title="t", highlight=[True, True, False, True])
    assert path.read_bytes()[:8] == PNG
    images = [ax.images[0].get_array() for ax in figure.axes if ax.images]
    assert len(images) == 2
    np.testing.assert_allclose(images[0], [[1, 1, 0, 1], [0.5, 1.0, 0.25, 0.0]])
    np.testing.assert_allclose(images[1], [[0.0, 1.0, 0.5, 0.25]])
    labels = [t.get_text() for t in figure.axes[0].get_yticklabels()]
    assert labels == ["ground truth", "method"]
    marked = [t.get_color() for t in figure.axes[0].get_xticklabels()]
    assert marked[0] == marked[1] == marked[3] != marked[2]
    assert matplotlib.rcParams["backend"] == backend  # no pyplot, no backend switch


def test_attribution_panels_reject_bad_input():
    with pytest.raises(ValueError, match="panels"):
        attribution_panels(["a", "b"], [("p", {"row": [1.0, 2.0, 3.0]})])
    with pytest.raises(ValueError, match="panels"):
        attribution_panels(["a"], [])
    with pytest.raises(ValueError, match="highlight"):
        attribution_panels(["a", "b"], [("p", {"row": [1.0, 2.0]})], highlight=[True])


def test_hidden_state_scatter_colours_by_category(tmp_path):
    states = torch.tensor([[0.0, 0.0], [1.0, 1.0], [2.0, 2.0], [3.0, 3.0], [4.0, 4.0]])
    categories = ["neither", "= n", "= m", "neither", "= n"]
    path = tmp_path / "scatter.png"
    figure = hidden_state_scatter(states, categories, path=path, order=["neither", "= n", "= m"])
    assert path.read_bytes()[:8] == PNG
    ax = figure.axes[0]
    offsets = [c.get_offsets() for c in ax.collections]
    np.testing.assert_allclose(offsets[0], [[0, 0], [3, 3]])
    np.testing.assert_allclose(offsets[1], [[1, 1], [4, 4]])
    np.testing.assert_allclose(offsets[2], [[2, 2]])
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["neither (2)", "= n (2)", "= m (1)"]
    # subsampling keeps max_points points
    figure = hidden_state_scatter(torch.randn(50, 2), ["a"] * 50, max_points=10)
    assert len(figure.axes[0].collections[0].get_offsets()) == 10
    with pytest.raises(ValueError, match="states"):
        hidden_state_scatter(torch.zeros(3, 3), ["a"] * 3)
    with pytest.raises(ValueError, match="categories"):
        hidden_state_scatter(torch.zeros(3, 2), ["a"] * 2)


def test_layer_heatmap(tmp_path):
    scores = torch.tensor([[1.0, 0.2], [0.9, 0.95], [1.0, 0.0]])
    path = tmp_path / "layers.png"
    figure = layer_heatmap(["x", "y", "z"], scores, path=path)
    assert path.read_bytes()[:8] == PNG
    np.testing.assert_allclose(figure.axes[0].images[0].get_array(), scores.T.numpy(), rtol=1e-6)
    assert [t.get_text() for t in figure.axes[0].get_yticklabels()] == ["layer 0", "layer 1"]
    with pytest.raises(ValueError, match="scores"):
        layer_heatmap(["x", "y"], scores)
    with pytest.raises(ValueError, match="layer_labels"):
        layer_heatmap(["x", "y", "z"], scores, layer_labels=["only one"])


def test_normalize_per_layer_divides_each_layer_by_its_largest_absolute_score():
    from captum_diffmask.interface.figures import normalize_per_layer

    scores = np.array([[1.0, -4.0, 0.0], [2.0, 2.0, 0.0]])
    out = normalize_per_layer(scores)
    assert np.allclose(out, [[0.5, -1.0, 0.0], [1.0, 0.5, 0.0]])


def test_layer_heatmaps_one_panel_per_method(tmp_path):
    from captum_diffmask.interface.figures import layer_heatmaps

    tokens = ["[CLS]", "a", "film", "[SEP]"]
    panels = {"DiffMask": (np.random.rand(4, 3), ["E", "1", "2"]), "attention": (np.random.rand(4, 2), None)}
    figure = layer_heatmaps(tokens, panels, tmp_path / "h.png", title="sentence 1")
    assert (tmp_path / "h.png").stat().st_size > 1000
    assert [ax.get_title() for ax in figure.axes[:2]] == ["DiffMask", "attention"]
    with pytest.raises(ValueError, match="attention"):
        layer_heatmaps(tokens, {"attention": (np.random.rand(3, 2), None)})
