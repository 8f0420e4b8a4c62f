"""compare(): methods side by side on a user's own model, from names or fitted
explainers, with the table, the figures and JSON."""

import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch

from captum_diffmask import compare, DiffMask
from captum_diffmask.methods import prepare_method, route_options
from captum_diffmask.methods import IntegratedGradients

from tiny_models import tiny_bert, token_batch

FEW = {"steps": 3}


def _train():
    return [token_batch(seed=s) for s in range(3)]


def test_names_and_fitted_explainers_side_by_side(tmp_path):
    model = tiny_bert()
    ids, mask = token_batch()
    dm = DiffMask(model, mode="input")
    dm.fit(_train(), max_steps=4, convergence={"until_converged": False}, seed=0, verbose=False)
    result = compare(
        model, ids, [dm, "IntegratedGradients", ("Occlusion", {}), ("PerSampleBottleneck", FEW), ("Guan", FEW)],
        layer=1, additional_forward_args=(mask,), train_data=_train(),
    )
    assert list(result.methods) == ["DiffMask", "IntegratedGradients", "Occlusion", "PerSampleBottleneck", "Guan"]
    for name, scores in result.scores.items():
        assert scores.shape == ids.shape, name
        assert (scores[mask == 0] == 0).all(), name
        assert result.seconds_per_example(name) > 0 and result.ratio_to_forward(name) > 0
    assert torch.equal(result.scores["DiffMask"], dm.attribute(ids, additional_forward_args=(mask,), layer=1))
    assert result.methods["DiffMask"].every_layer.shape == (*ids.shape, 3)
    table = result.table()
    assert table.count("\n| ") == 6 and "x one forward pass" in table  # header + 5 methods
    # input-mode DiffMask scores the input tokens, the others hidden.1 at layer 1: the table says so
    assert result.methods["DiffMask"].scored == "input (probe read to depth 1)"
    assert result.methods["Occlusion"].scored == "hidden.1"
    assert "score different things (hidden.1, input)" in table
    figures = result.plot(tmp_path / "panels.png")
    assert len(figures) == 2  # the panels and DiffMask's per-layer heatmap
    assert (tmp_path / "panels.png").stat().st_size > 0 and (tmp_path / "panels-DiffMask-layers.png").exists()
    again = json.loads(json.dumps(result.to_dict()))
    assert again["methods"]["Guan"]["scores"] == result.scores["Guan"].tolist()
    assert again["layer"] == 1 and len(again["tokens"]) == ids.shape[0]
    verdicts = {k: dm.convergence[k]["status"] for k in range(3)}
    assert result.methods["DiffMask"].verdicts == verdicts and result.methods["Guan"].verdicts == {}
    assert again["methods"]["DiffMask"]["verdicts"] == {str(k): v for k, v in verdicts.items()}
    page = result.to_html()
    for name, scores in result.scores.items():  # the terminal's rows, on the page
        row = f"<td>{name}</td><td>{'x'.join(map(str, scores.shape))}</td><td>{result.methods[name].scored}</td>"
        assert row in page and f"<td>{result.seconds_per_example(name):.3g}</td>" in page
    # DiffMask's row at layer 1 and its three per-layer rows, and IG's check of its gap, on every example
    assert page.count("data-verdict=") == 5 * ids.shape[0]
    check = result.methods["IntegratedGradients"].verdicts[1]
    assert check.startswith("checked: completeness gap") and f"<td>{check}</td>" in page and f"| {check} |" in table


def test_a_named_diffmask_is_fitted_within_the_stated_budget():
    model = tiny_bert()
    ids, mask = token_batch()
    with pytest.warns(UserWarning, match="converged"):
        result = compare(model, ids, [("DiffMask", {"mode": "hidden", "eps": 0.05})], layer=2,
                         additional_forward_args=(mask,), train_data=_train(), fit_steps=5)
    info = result.methods["DiffMask"].info
    assert info["fit_steps"] == 5 and set(info["convergence"]) == {2}  # fitted at the compared layer only
    assert info["fit_options"]["eps"] == 0.05


def test_target_reaches_the_methods_that_attribute_a_class_only():
    model = tiny_bert()
    ids, mask = token_batch()
    by_class = [compare(model, ids, ["IntegratedGradients", ("Guan", FEW)], layer=0,
                        additional_forward_args=(mask,), target=c) for c in (0, 1)]
    ig = [r.scores["IntegratedGradients"] for r in by_class]
    assert not torch.equal(*ig)
    assert torch.equal(by_class[0].scores["Guan"], by_class[1].scores["Guan"])  # no target, no error


def test_errors_are_raised_or_recorded():
    model = tiny_bert()
    ids, mask = token_batch()
    with pytest.raises(ValueError, match="train_data"):
        compare(model, ids, ["DiffMask"], additional_forward_args=(mask,))
    result = compare(model, ids, ["DiffMask", ("Occlusion", {})], additional_forward_args=(mask,), errors="record")
    assert "train_data" in result.methods["DiffMask"].error and result.methods["DiffMask"].scores is None
    assert "failed" in result.table() and set(result.scores) == {"Occlusion"}
    with pytest.raises(ValueError, match="unknown method"):
        compare(model, ids, ["Saliency"], additional_forward_args=(mask,))
    with pytest.raises(TypeError, match="methods"):
        compare(model, ids, [42], additional_forward_args=(mask,))


def test_the_same_method_twice_gets_two_names_and_tokens_come_from_a_tokenizer():
    class Tokenizer:
        def convert_ids_to_tokens(self, ids):
            return [f"w{i}" for i in ids]

    model = tiny_bert()
    ids, mask = token_batch()
    result = compare(model, ids, [("IntegratedGradients", {"n_steps": 4}), ("IntegratedGradients", {"n_steps": 8})],
                     additional_forward_args=(mask,), tokenizer=Tokenizer())
    assert list(result.methods) == ["IntegratedGradients", "IntegratedGradients #2"]
    assert result.tokens[0][0] == f"w{int(ids[0, 0])}"
    assert result.methods["IntegratedGradients #2"].options == {"n_steps": 8}


def test_route_options_sends_each_option_where_it_is_named():
    def init(model, mode="input"):
        pass

    def fit(data, eps=0.1, **kwargs):
        pass

    routed, ignored = route_options({"mode": "hidden", "eps": 0.2, "other": 1}, [("init", init), ("fit", fit)])
    assert routed == {"init": {"mode": "hidden"}, "fit": {"eps": 0.2, "other": 1}} and ignored == []
    routed, ignored = route_options({"nope": 1}, [("init", init)])
    assert ignored == ["nope"]


def test_prepare_method_refuses_an_option_no_signature_takes_and_reports_the_setup_time():
    prepared = prepare_method(("IntegratedGradients", {"n_steps": 4}), tiny_bert())
    assert isinstance(prepared.explainer, IntegratedGradients) and prepared.explainer.n_steps == 4
    assert prepared.setup_seconds >= 0
    with pytest.raises(ValueError, match=r"IntegratedGradients takes no option \['no_such_option'\].*misspelt"):
        prepare_method(("IntegratedGradients", {"n_steps": 4, "no_such_option": 3}), tiny_bert())
    with pytest.raises(ValueError, match=r"PerSampleBottleneck takes no option \['stepz'\]"):
        compare(tiny_bert(), token_batch()[0], [("PerSampleBottleneck", {"stepz": 5})], train_data=_train())


SCRIPT = """
import json, sys, warnings
import torch
from transformers import BertConfig, BertForSequenceClassification
from captum_diffmask import compare, DiffMask

torch.manual_seed(0)
config = BertConfig(vocab_size=50, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                    intermediate_size=37, num_labels=3, max_position_embeddings=64)
model = BertForSequenceClassification(config).eval()
ids = torch.randint(3, 50, (4, 9), generator=torch.Generator().manual_seed(0))
mask = torch.ones_like(ids)
mask[0, 6:] = 0
batches = [(ids, mask)] * 3
dm = DiffMask(model, mode="hidden")
with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    dm.fit(batches, max_steps=3, until_converged=False, verbose=False)
result = compare(model, ids, [dm, ("IntegratedGradients", {"n_steps": 4}), "Occlusion",
                              ("PerSampleBottleneck", {"steps": 2}), ("Guan", {"steps": 2})],
                 layer=2, additional_forward_args=(mask,), train_data=batches)
print(result.table())
result.plot("figure.png")
json.dump(result.to_dict(), open("comparison.json", "w"))
assert "benchmarks" not in sys.modules
print("OK", sorted(result.scores))
"""


def test_compare_runs_outside_the_repository(tmp_path):
    # only the installed package: no repository folder on the path, no benchmarks
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(SCRIPT)], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "OK ['DiffMask', 'Guan', 'IntegratedGradients', 'Occlusion', 'PerSampleBottleneck']" in done.stdout
    assert (tmp_path / "figure.png").stat().st_size > 0 and (tmp_path / "figure-DiffMask-layers.png").exists()
    stored = json.loads((tmp_path / "comparison.json").read_text())
    assert set(stored["methods"]) == {"DiffMask", "IntegratedGradients", "Occlusion", "PerSampleBottleneck", "Guan"}


class _DropsEverything:
    """A mask method whose keep probability is 0.009 everywhere (0 at padding)."""

    scores_are_probabilities = True
    uses_target = False

    def attribute(self, inputs, additional_forward_args=None, layer=0):
        return torch.full(inputs.shape, 0.009) * additional_forward_args[0]


def test_the_figure_draws_keep_probabilities_as_they_are_and_relative_scores_scaled():
    model = tiny_bert()
    ids, mask = token_batch()
    result = compare(model, ids, [_DropsEverything(), ("IntegratedGradients", {"n_steps": 4})], layer=1,
                     additional_forward_args=(mask,))
    assert result.methods["_DropsEverything"].probabilities and not result.methods["IntegratedGradients"].probabilities
    figure = result.plot()[0]
    drawn = figure.axes[0].images[0].get_array()
    labels = [label.get_text() for label in figure.axes[0].get_yticklabels()]
    assert labels == ["_DropsEverything (P kept)", "IntegratedGradients (/ max)"]
    assert abs(float(drawn[0].max()) - 0.009) < 1e-6  # empty, not scaled up to 1
    assert abs(float(drawn[1].max()) - 1.0) < 1e-6


def test_the_html_page_sets_the_methods_side_by_side_on_the_same_scales_as_the_figure():
    model = tiny_bert()
    ids, mask = token_batch()
    result = compare(model, ids, [_DropsEverything(), ("IntegratedGradients", {"n_steps": 4})], layer=1,
                     additional_forward_args=(mask,))
    page = result.to_html(examples=[0])
    real = int(mask[0].sum())
    examples = page.split("class='legend'", 1)[1]  # after the table of times and the legend
    assert page.startswith("<!DOCTYPE html>") and examples.count("<tr>") == 2
    assert page.count("class='w'") == 2 * real  # every real token once per method, no padding
    assert page.count("rgba(0,160,0,0.009)") == real  # the dropped row stays (almost) empty
    assert "rgba(0,160,0,1.000)" in page or "rgba(200,0,0,1.000)" in page  # IG scaled to its largest


def test_a_tokenizers_batch_encoding_is_taken_as_attribute_takes_it():
    from transformers import BatchEncoding

    model = tiny_bert()
    ids, mask = token_batch()
    encoded = BatchEncoding({"input_ids": ids, "attention_mask": mask})
    from_mapping = compare(model, encoded, ["Occlusion"], layer=0)
    from_tensors = compare(model, ids, ["Occlusion"], layer=0, additional_forward_args=(mask,))
    assert torch.equal(from_mapping.scores["Occlusion"], from_tensors.scores["Occlusion"])
    assert (from_mapping.scores["Occlusion"][mask == 0] == 0).all()
    with pytest.raises(ValueError, match="additional_forward_args must be None"):
        compare(model, encoded, ["Occlusion"], additional_forward_args=(mask,))


def test_metrics_add_each_methods_faithfulness_and_plausibility_as_the_metric_functions_give_them():
    from captum_diffmask.evaluation.faithfulness import eraser_scores, plausibility, TokenEraser

    model = tiny_bert()
    ids, mask = token_batch()
    rationale = torch.zeros_like(mask, dtype=torch.bool)
    rationale[:, 1:3] = True
    result = compare(model, ids, ["Occlusion", ("IntegratedGradients", {"n_steps": 4})], layer=0,
                     additional_forward_args=(mask,), metrics=["comprehensiveness", "sufficiency", "plausibility"],
                     rationales=rationale)
    for name in ("Occlusion", "IntegratedGradients"):
        scores = result.scores[name]
        erased = eraser_scores(TokenEraser(model), ids, scores, (mask,))
        metrics = result.methods[name].metrics
        assert metrics["comprehensiveness"] == pytest.approx(float(erased["aopc_comprehensiveness"].mean()))
        assert metrics["sufficiency"] == pytest.approx(float(erased["aopc_sufficiency"].mean()))
        assert metrics["plausibility"] == pytest.approx(float(plausibility(scores, rationale, mask.bool())["auprc"].mean()))
    table = result.table()
    assert "| comprehensiveness | sufficiency | plausibility |" in table
    assert json.loads(json.dumps(result.to_dict()))["methods"]["Occlusion"]["metrics"]["sufficiency"] is not None


def test_metrics_refuse_unknown_names_and_plausibility_without_rationales():
    model = tiny_bert()
    ids, mask = token_batch()
    with pytest.raises(ValueError, match="metrics must be a list of"):
        compare(model, ids, ["Occlusion"], additional_forward_args=(mask,), metrics=["aopc!"])
    with pytest.raises(ValueError, match="'plausibility' needs rationales="):
        compare(model, ids, ["Occlusion"], additional_forward_args=(mask,), metrics=["plausibility"])


def test_to_dataframe_needs_pandas_and_says_so(monkeypatch):
    model = tiny_bert()
    ids, mask = token_batch()
    result = compare(model, ids, ["Occlusion"], additional_forward_args=(mask,), metrics=["sufficiency"])
    monkeypatch.setitem(sys.modules, "pandas", None)
    with pytest.raises(ImportError, match=r"captum_diffmask\[dataframe\]"):
        result.to_dataframe()
    monkeypatch.undo()
    pandas = pytest.importorskip("pandas", reason="pandas is the dataframe extra")
    frame = result.to_dataframe()
    assert list(frame.index) == ["Occlusion"] and frame.loc["Occlusion", "sufficiency"] == pytest.approx(
        result.methods["Occlusion"].metrics["sufficiency"])
