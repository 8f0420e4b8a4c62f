"""Each method says what it is (its name, a summary, whether and how it learns
from data); compare and the harness read that, never the method's class."""

import ast
import pathlib

import pytest

from captum_diffmask.model.attribution import method_trait, SiteAttribution
from captum_diffmask.methods import method_class, prepare_method, registered_methods
from captum_diffmask.methods import RandomAttribution

from tiny_models import tiny_bert, token_batch

ROOT = pathlib.Path(__file__).resolve().parents[3]


def test_every_library_method_describes_itself():
    methods = registered_methods()
    assert list(methods)[0] == "DiffMask"
    for name, cls in methods.items():
        assert issubclass(cls, SiteAttribution), cls  # one contract, Random included
        assert cls.summary and cls.name() == name, cls
        if cls.needs_data:
            assert callable(getattr(cls, cls.data_step)), cls
    learners = [name for name, cls in methods.items() if cls.needs_data]
    assert learners == ["DiffMask", "PerSampleBottleneck", "ReadoutBottleneck"]
    assert {"AttributionPatching", "Attention", "Random"} <= set(methods)
    assert method_class("RandomAttribution") is method_class("Random") is RandomAttribution  # release 0.1's name


def test_the_harness_lists_the_registry():
    from benchmarks.methods import methods_listed

    assert methods_listed() == {name: cls.summary for name, cls in registered_methods().items()}


def test_defaults_for_an_object_that_does_not_describe_itself_live_on_the_base():
    class Foreign:  # e.g. one of Captum's own attributions
        def attribute(self, inputs, target=None):
            return inputs

    assert method_trait(Foreign(), "uses_target") is True  # Captum's contract takes a target
    assert method_trait(Foreign(), "needs_data") is False
    assert method_trait(Foreign(), "scores_are_probabilities") is False


class _Learner(RandomAttribution):
    r"""A user's method that learns from data, to show that compare prepares
    any method by what it says of itself."""

    needs_data = True
    data_step = "learn"

    def __init__(self, model, **kwargs):
        super().__init__(model, **kwargs)
        self.seen = None

    def learn(self, batches, rate=1.0):
        self.seen = (len(list(batches)), rate)

    def is_prepared(self, layer):
        return self.seen is not None

    def prepare_on_data(self, train_data, layer, options, seed=0, verbose=False, max_steps=None):
        self.learn(train_data, **options)
        return {"batches": self.seen[0]}


def test_compare_prepares_a_method_by_what_it_says_not_by_its_class():
    model = tiny_bert()
    learner = _Learner(model)
    batches = [token_batch(seed=s) for s in range(3)]
    with pytest.raises(ValueError, match=r"train_data is needed to prepare _Learner \(_Learner.learn learns"):
        prepare_method(learner, model)
    prepared = prepare_method(learner, model, train_data=batches)
    assert learner.seen == (3, 1.0) and prepared.info == {"batches": 3}
    again = prepare_method(learner, model, train_data=batches)  # prepared already: not again
    assert again.info == {}


def test_random_takes_a_tokenizers_batch_and_checks_the_layer_as_every_method():
    ids, mask = token_batch()
    method = RandomAttribution(tiny_bert(), seed=0)
    from_dict = method.attribute({"input_ids": ids, "attention_mask": mask})
    assert from_dict.shape == ids.shape and (from_dict[mask == 0] == 0).all()
    with pytest.raises(ValueError, match="layer"):
        method.attribute(ids, additional_forward_args=(mask,), layer=7)


def _isinstance_on_a_method(path):
    names = {cls.__name__ for cls in registered_methods().values()}
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "isinstance" and len(node.args) == 2:
            second = node.args[1]
            classes = second.elts if isinstance(second, ast.Tuple) else [second]
            found = {getattr(c, "id", getattr(c, "attr", None)) for c in classes} & names
            if found:
                yield f"{path}:{node.lineno} {sorted(found)}"


def test_no_isinstance_on_a_method_in_compare_or_the_benchmarks():
    paths = [ROOT / "captum_diffmask" / "interface" / "side_by_side.py", ROOT / "captum_diffmask" / "methods" / "registry.py",
             *sorted((ROOT / "benchmarks").rglob("*.py"))]
    assert [hit for path in paths for hit in _isinstance_on_a_method(path)] == []


def test_the_isinstance_check_would_catch_one(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("if isinstance(explainer, (DiffMask, int)):\n    pass\n")
    assert len(list(_isinstance_on_a_method(bad))) == 1
