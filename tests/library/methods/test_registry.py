"""One registry (captum_diffmask.methods.registry): a method added in one module
is seen by compare, the command line and the benchmarks' list."""

import importlib
import sys
import textwrap

import pytest
import torch
import transformers as hf

from captum_diffmask import compare
from captum_diffmask.methods import method_class, register_method, registered_methods, unregister_method

from tiny_models import tiny_bert, tiny_wordpiece, token_batch

TOY = textwrap.dedent('''
    import torch

    from captum_diffmask.methods import register_method
    from captum_diffmask.model.attribution import attribution_call, SiteAttribution


    @register_method
    class Reverse(SiteAttribution):
        label = "ReversePosition"
        summary = "the earlier a token, the higher its score (a toy)"
        uses_target = False

        @attribution_call
        def attribute(self, inputs, target=None, additional_forward_args=None, layer=0):
            call = self._prepare(inputs, additional_forward_args, layer)
            scores = torch.arange(call.ids.shape[1], 0, -1, dtype=torch.float).expand(call.ids.shape)
            return self._finish(scores, call)
''')


@pytest.fixture
def toy_method(tmp_path, monkeypatch):
    (tmp_path / "toy_method.py").write_text(TOY)
    monkeypatch.syspath_prepend(str(tmp_path))
    module = importlib.import_module("toy_method")
    yield module.Reverse
    unregister_method("ReversePosition")
    sys.modules.pop("toy_method", None)


def test_a_method_added_in_one_module_is_seen_by_compare_the_cli_and_the_benchmarks(toy_method, tmp_path, capsys):
    from benchmarks.__main__ import main as benchmarks_main
    from captum_diffmask.interface.cli import main as cli_main

    assert registered_methods()["ReversePosition"] is toy_method
    model = tiny_bert()
    ids, mask = token_batch()
    result = compare(model, ids, ["ReversePosition"], additional_forward_args=(mask,), layer=1)
    expected = torch.arange(ids.shape[1], 0, -1, dtype=torch.float).expand(ids.shape) * mask
    assert torch.equal(result.scores["ReversePosition"], expected)
    # the command line, on a saved tiny model
    words = ["a", "film", "dull"]
    config = hf.BertConfig(vocab_size=5 + len(words), hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                           intermediate_size=37, num_labels=3, max_position_embeddings=32)
    hf.BertForSequenceClassification(config).save_pretrained(tmp_path / "model")
    tiny_wordpiece(words).save_pretrained(tmp_path / "model")
    assert cli_main(["explain", str(tmp_path / "model"), "a dull film", "--method", "ReversePosition",
                     "--quiet"]) == 0
    assert "ReversePosition" in capsys.readouterr().out
    # the benchmarks' list
    assert benchmarks_main(["list"]) == 0
    assert "ReversePosition      the earlier a token, the higher its score (a toy)" in capsys.readouterr().out


def test_a_name_is_one_class_and_unknown_names_are_refused_naming_the_registered_ones(toy_method):
    class Other(toy_method):
        pass

    with pytest.raises(ValueError, match="'ReversePosition' is toy_method.Reverse's already"):
        register_method(Other)
    register_method(toy_method)  # the same class again: nothing changes
    with pytest.raises(ValueError, match=r"unknown method 'Nope'; the registered ones are \['Attention', "):
        method_class("Nope")
    with pytest.raises(TypeError, match="no attribute"):
        register_method(int)
    with pytest.raises(KeyError, match="Nope"):
        unregister_method("Nope")
