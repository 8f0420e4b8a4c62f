"""Per-example masks: DiffMask without a probe, and REINFORCE."""

import itertools

import pytest
import torch

from captum_diffmask.model import divergences
from captum_diffmask.methods import per_example
from captum_diffmask.methods.per_example import MaskResult, PerExampleDiffMask
from captum_diffmask.methods.reinforce import REINFORCE
from captum_diffmask.model.sites import SiteLocator
from captum_diffmask.evaluation.toy_task import toy_ground_truth, toy_sites

from tiny_models import tiny_bert, token_batch

STEPS = 300


@pytest.fixture(scope="module")
def toy_masks(toy_setup):
    r"""Masks at the FFNN output (layer 1) of 128 held-out examples, with the mean
    FFNN output over the held-out set as the baseline."""
    model, _, _, valid = toy_setup
    data = valid.subset(torch.arange(128))
    locator = SiteLocator.locate(model, toy_sites(model))
    with torch.no_grad(), locator.capture(["hidden.1"]) as states:
        model(valid.ids, valid.query, valid.mask)
    baseline = states["hidden.1"][valid.mask].mean(0)
    results = {}
    for cls in (PerExampleDiffMask, REINFORCE):
        torch.manual_seed(0)
        explainer = cls(model, sites=toy_sites(model), padding_mask_arg=1)
        results[cls.__name__] = explainer.fit_masks(
            data.ids, (data.query, data.mask), layer=1, steps=STEPS, baselines=baseline, verbose=False
        )
    return model, data, baseline, locator, results


@pytest.mark.parametrize("name", ["PerExampleDiffMask", "REINFORCE"])
def test_toy_masks_keep_the_prediction_and_drop_other_digits(toy_masks, name):
    _, data, baseline, _, results = toy_masks
    result = results[name]
    assert isinstance(result, MaskResult)
    assert torch.equal(result.baseline[data.mask], baseline.expand(int(data.mask.sum()), -1))
    assert result.keep.shape == result.mask.shape == data.ids.shape
    assert (result.keep[~data.mask] == 0).all() and (result.mask[~data.mask] == 0).all()
    assert set(result.mask.unique().tolist()) <= {0.0, 1.0}
    assert torch.equal(result.mask, (result.keep > 0.5).float())
    assert ((result.lambdas >= 0) & (result.lambdas <= 200)).all()
    truth = toy_ground_truth(data.ids, data.query, data.mask).bool()
    other = data.mask & ~truth
    kept_prediction = result.agreement.float().mean().item()
    dropped_other = (result.mask[other] == 0).float().mean().item()
    # measured (300 steps, seeds 0-2): both keep the prediction on 99-100% of the
    # 128 examples and drop 97-100% of the other digits, keeping about one token
    # per example (mean KL 0.03)
    assert kept_prediction >= 0.9, kept_prediction
    assert dropped_other >= 0.8, dropped_other
    assert result.kl.mean() < 0.1


def _smallest_sufficient_subset(model, locator, data, state, baseline, i):
    r"""Brute force: the fewest real positions to keep (others := baseline) so
    that the predicted class does not change."""
    length = int(data.mask[i].sum())
    gates = torch.ones(2**length, data.ids.shape[1])
    gates[:, :length] = torch.tensor(list(itertools.product([0.0, 1.0], repeat=length)))
    n = gates.shape[0]
    masked = gates.unsqueeze(-1) * state[i] + (1 - gates.unsqueeze(-1)) * baseline
    with torch.no_grad():
        original = model(data.ids[i : i + 1], data.query[i : i + 1], data.mask[i : i + 1])
        with locator.replace({"hidden.1": masked}):
            logits = model(data.ids[i].expand(n, -1), data.query[i].expand(n, -1), data.mask[i].expand(n, -1))
    same = (logits > 0) == (original > 0)
    return int(gates[:, :length].sum(1)[same].min())


def test_per_example_diffmask_finds_the_exact_optimum_on_short_sequences(toy_masks):
    model, data, baseline, locator, results = toy_masks
    with torch.no_grad(), locator.capture(["hidden.1"]) as states:
        model(data.ids, data.query, data.mask)
    short = torch.nonzero(data.mask.sum(1) <= 6)[:, 0].tolist()
    assert len(short) >= 40
    optimum = torch.tensor(
        [_smallest_sufficient_subset(model, locator, data, states["hidden.1"], baseline, i) for i in short]
    )
    shares = {}
    for name, result in results.items():
        size = result.mask[short].sum(1).long()
        assert (size[result.agreement[short]] >= optimum[result.agreement[short]]).all()  # sanity of the search
        shares[name] = ((size == optimum) & result.agreement[short]).float().mean().item()
    # measured on the 65 short sequences (optimum: 46 x 0 tokens, 19 x 1 token),
    # seeds 0-2: PerExampleDiffMask 0.72-0.86, REINFORCE 0.75-0.80 (the misses
    # keep one token more than needed: the KL constraint asks for more than an
    # unchanged argmax)
    assert shares["PerExampleDiffMask"] >= 0.6, shares
    assert shares["REINFORCE"] >= 0.5, shares


@pytest.mark.parametrize("cls", [PerExampleDiffMask, REINFORCE])
def test_select_sparsest_returns_a_checked_mask_never_larger_than_the_last(toy_setup, cls):
    model, _, _, valid = toy_setup
    data = valid.subset(torch.arange(64))
    runs = {}
    for select in ("last", "sparsest"):
        # the checks draw no random numbers: both runs follow the same trajectory
        torch.manual_seed(3)
        explainer = cls(model, sites=toy_sites(model), padding_mask_arg=1)
        runs[select] = explainer.fit_masks(
            data.ids, (data.query, data.mask), layer=1, steps=60, lr=0.1, verbose=False,
            select=select, check_every=7,
        )
    last, sparsest = runs["last"], runs["sparsest"]
    assert (last.step == 60).all()
    assert sparsest.step.shape == (64,)
    assert ((sparsest.step % 7 == 0) | (sparsest.step == 60)).all()
    # every example whose last mask keeps the class keeps it with no more tokens
    size_last, size_sparsest = last.mask.sum(1), sparsest.mask.sum(1)
    assert sparsest.agreement[last.agreement].all()
    assert (size_sparsest[last.agreement] <= size_last[last.agreement]).all()
    # an earlier step is only returned when it keeps the class
    earlier = sparsest.step < 60
    assert sparsest.agreement[earlier].all()
    if cls is PerExampleDiffMask:
        # at lr 0.1 the multipliers overshoot and reopen some gates late in the
        # search (measured, seeds 3-5: 3-5 of the 64 examples end sparser earlier)
        assert earlier.any(), "no example took an earlier, sparser mask"
    # where the last step is returned, it is exactly the plain run's result
    same = sparsest.step == 60
    assert torch.equal(sparsest.mask[same], last.mask[same])
    assert torch.allclose(sparsest.keep[same], last.keep[same])


def _toy_search(toy_setup, cls, seed=3, n=64, **options):
    model, _, _, valid = toy_setup
    data = valid.subset(torch.arange(n))
    torch.manual_seed(seed)
    explainer = cls(model, sites=toy_sites(model), padding_mask_arg=1, **options.pop("init", {}))
    return explainer.fit_masks(data.ids, (data.query, data.mask), layer=1, verbose=False, **options)


def _no_argmax(*args, **kwargs):
    raise AssertionError("the argmax check was called")


@pytest.mark.parametrize("cls", [PerExampleDiffMask, REINFORCE])
@pytest.mark.parametrize("select", ["last", "feasible"])
@pytest.mark.parametrize("divergence, eps", [("kl", 0.05), ("prediction", 0.6)])
def test_selection_uses_nothing_beyond_the_objective(toy_setup, cls, select, divergence, eps, monkeypatch):
    options = dict(steps=60, lr=0.1, eps=eps, select=select, check_every=3, divergence=divergence)
    plain = _toy_search(toy_setup, cls, **options)
    # the argmax check (the erasure optimum's success test) swapped for a function that raises
    monkeypatch.setattr(per_example, "same_prediction", _no_argmax)
    monkeypatch.setattr(divergences, "same_prediction", _no_argmax)
    blind = _toy_search(toy_setup, cls, **options)
    assert torch.equal(blind.mask, plain.mask) and torch.equal(blind.step, plain.step)
    assert torch.equal(blind.keep, plain.keep) and torch.equal(blind.kl, plain.kl)
    # the oracle selection does use it: the swap is seen
    with pytest.raises(AssertionError, match="argmax check"):
        _toy_search(toy_setup, cls, **{**options, "select": "sparsest"})


@pytest.mark.parametrize("cls", [PerExampleDiffMask, REINFORCE])
def test_select_feasible_returns_the_sparsest_checked_mask_within_the_constraint(toy_setup, cls):
    options = dict(steps=60, lr=0.1, eps=0.05, check_every=7)
    last = _toy_search(toy_setup, cls, select="last", **options)
    feasible = _toy_search(toy_setup, cls, select="feasible", **options)
    assert ((feasible.step % 7 == 0) | (feasible.step == 60)).all()
    # an example whose last mask meets KL <= eps gets one no larger
    ok = last.kl <= 0.05
    assert ok.sum() >= 10
    assert (feasible.mask.sum(1)[ok] <= last.mask.sum(1)[ok]).all()
    assert (feasible.kl[ok] <= 0.05).all()
    # an earlier step is returned only when its mask met the constraint
    earlier = feasible.step < 60
    assert (feasible.kl[earlier] <= 0.05).all()
    same = ~earlier
    assert torch.equal(feasible.mask[same], last.mask[same])


@pytest.mark.parametrize("cls", [PerExampleDiffMask, REINFORCE])
def test_the_prediction_divergence_keeps_the_class_of_every_returned_mask(toy_setup, cls):
    eps = 0.6  # < log 2: the predicted class stays ahead of its strongest rival
    result = _toy_search(toy_setup, cls, steps=60, lr=0.1, eps=eps, select="feasible", check_every=3,
                         divergence="prediction")
    predicted = result.log_p.argmax(-1, keepdim=True)
    own = result.log_q.gather(-1, predicted).squeeze(-1)
    rival = result.log_q.scatter(-1, predicted, float("-inf")).max(-1).values
    assert torch.allclose(result.kl, torch.log1p(torch.exp(rival - own)), atol=1e-6)
    assert (result.kl <= eps + 1e-6).all() and result.agreement.all()
    assert (result.step > 0).sum() >= 10  # most examples found a sparser mask than all of them
    assert (result.mask.sum(1) < toy_setup[3].subset(torch.arange(64)).mask.sum(1)).sum() >= 10


@pytest.mark.parametrize("cls", [PerExampleDiffMask, REINFORCE])
def test_with_no_sparser_admissible_mask_every_token_is_kept(toy_setup, cls):
    # eps = 0: only a mask that keeps every token (the original output) is admissible
    options = dict(steps=60, lr=0.1, eps=0.0, check_every=3)
    last = _toy_search(toy_setup, cls, select="last", **options)
    result = _toy_search(toy_setup, cls, select="feasible", **options)
    real = toy_setup[3].subset(torch.arange(64)).mask
    assert (last.mask.sum(1) < real.sum(1)).sum() >= 32  # the gates did close: the last mask drops tokens
    assert torch.equal(result.mask.bool(), real) and (result.kl == 0).all()


def test_reinforce_authors_reward_never_lets_lambda_reach_the_gates(toy_setup):
    options = dict(steps=40, lr=0.1, eps=0.05, select="last")
    runs = {}
    for reward in ("authors", "lagrangian"):
        for lr_lambda in (0.01, 5.0):
            runs[reward, lr_lambda] = _toy_search(toy_setup, REINFORCE, init={"reward": reward}, lr_lambda=lr_lambda,
                                                  **options)
    authors_slow, authors_fast = runs["authors", 0.01], runs["authors", 5.0]
    assert not torch.equal(authors_slow.lambdas, authors_fast.lambdas)  # the multipliers do move
    assert torch.equal(authors_slow.keep, authors_fast.keep)  # but the gates never see them
    assert not torch.equal(runs["lagrangian", 0.01].keep, runs["lagrangian", 5.0].keep)
    with pytest.raises(ValueError, match="reward"):
        REINFORCE(toy_setup[0], sites=toy_sites(toy_setup[0]), padding_mask_arg=1, reward="corrected")


def test_readouts_and_multipliers_release_the_gates_when_the_constraint_is_slack():
    model = tiny_bert()
    ids, mask = token_batch(seed=1)
    for cls in (PerExampleDiffMask, REINFORCE):
        explainer = cls(model)
        torch.manual_seed(0)
        keep = explainer.attribute(ids, additional_forward_args=(mask,), layer=2, steps=5, verbose=False)
        assert keep.shape == ids.shape and (keep[mask == 0] == 0).all()
        assert ((keep >= 0) & (keep <= 1)).all() and (keep[mask == 1] > 0.5).all()  # still open
        # a margin no masking reaches: the multipliers fall to 0 and the L0 term
        # closes every gate (REINFORCE needs a few hundred steps: its moving
        # baseline, still negative from the slack, adds noise until it decays)
        torch.manual_seed(0)
        result = explainer.fit_masks(ids, (mask,), layer=2, eps=5.0, steps=300, verbose=False)
        assert (result.lambdas == 0).all() and (result.mask == 0).all(), cls.__name__
        torch.manual_seed(0)
        hard = explainer.attribute((ids,), additional_forward_args=(mask,), layer=2, eps=5.0, steps=300, readout="mask", verbose=False)
        assert isinstance(hard, tuple) and torch.equal(hard[0], result.mask)


@pytest.mark.parametrize("cls", [PerExampleDiffMask, REINFORCE])
def test_tiny_bert_layers_shapes(cls):
    model = tiny_bert()
    ids, mask = token_batch(seed=5)
    explainer = cls(model)
    for layer in (0, 2):
        result = explainer.fit_masks(ids, (mask,), layer=layer, steps=3, samples=2, optimizer="rmsprop", verbose=False)
        assert result.keep.shape == result.mask.shape == ids.shape
        assert result.kl.shape == result.agreement.shape == result.lambdas.shape == (ids.shape[0],)
        assert torch.isfinite(result.keep).all() and torch.isfinite(result.kl).all()
        assert result.baseline.shape == (*ids.shape, 32)


@pytest.mark.parametrize("cls", [PerExampleDiffMask, REINFORCE])
def test_bad_input_errors_name_the_argument(cls):
    model = tiny_bert()
    ids, mask = token_batch()
    explainer = cls(model)
    run = lambda **kw: explainer.attribute(ids, additional_forward_args=(mask,), steps=1, verbose=False, **kw)  # noqa: E731
    with pytest.raises(ValueError, match="layer"):
        run(layer=4)
    with pytest.raises(ValueError, match="baseline"):
        run(layer=1, baselines=torch.zeros(7))
    with pytest.raises(TypeError, match="baseline"):
        run(layer=1, baselines=[0.0] * 32)
    with pytest.raises(ValueError, match="readout"):
        run(layer=1, readout="probability")
    with pytest.raises(ValueError, match="eps"):
        run(layer=1, eps=-0.1)
    with pytest.raises(ValueError, match="samples"):
        run(layer=1, samples=0)
    with pytest.raises(ValueError, match="optimizer"):
        run(layer=1, optimizer="sgd")
    with pytest.raises(ValueError, match="select"):
        run(layer=1, select="best")
    with pytest.raises(ValueError, match="divergence"):
        run(layer=1, divergence="js")
    with pytest.raises(ValueError, match="check_every"):
        run(layer=1, check_every=0)
    with pytest.raises(ValueError, match="inputs"):
        explainer.attribute(ids.reshape(-1), additional_forward_args=(mask,), layer=1, steps=1, verbose=False)
    with pytest.raises(ValueError, match="additional_forward_args"):
        explainer.attribute(ids, additional_forward_args=(mask[:, :3],), layer=1, steps=1, verbose=False)


@pytest.mark.parametrize("cls", [PerExampleDiffMask, REINFORCE])
def test_each_call_says_how_many_of_its_masks_meet_the_constraint(toy_setup, cls):
    import re

    from captum_diffmask.interface.verdicts import is_settled, layer_verdict

    model, _, _, valid = toy_setup
    method = cls(model, sites=toy_sites(model), padding_mask_arg=1)
    extra = (valid.query[:8], valid.mask[:8])
    result = method.fit_masks(valid.ids[:8], extra, layer=0, steps=60, eps=0.05, verbose=False)
    method.attribute(valid.ids[:8], additional_forward_args=extra, layer=0, steps=60, eps=0.05, verbose=False)
    found = re.fullmatch(r"(checked|failed check): (\d) of 8 masks within eps 0.05", method.last_check[0])
    assert found, method.last_check
    met = int(found.group(2))
    assert (found.group(1) == "checked") == (met == 8) and abs(met - int((result.kl <= 0.05).sum())) <= 2
    assert layer_verdict(method, 0) == method.last_check[0] and is_settled(layer_verdict(method, 0)) == (met == 8)
