"""DiffMask.fit's options for training what is deployed, the multiplier's
controller, the budget that follows the convergence criterion and the model's
precision (captum_diffmask.diffmask.fit.options)."""

import dataclasses
import warnings

import pytest
import torch

from captum_diffmask import Convergence, DiffMask, DiffMaskConvergenceWarning
from captum_diffmask.diffmask.constrained.multiplier_rules import GradientRule
from captum_diffmask.diffmask.fit.history import epoch_seconds, last_rows
from captum_diffmask.diffmask.fit.options import FitOptions
from captum_diffmask.diffmask.fit.step import lagrangian, StepPlan
from captum_diffmask.model.divergences import example_kl, log_probs

from tiny_models import tiny_bert, token_batch


def _loader(n_batches=6, seed=0):
    return [token_batch(batch=4, length=9, seed=seed + i) for i in range(n_batches)]


def _midway(mode):
    r"""A probe whose gates are open at some positions and closed at others (a
    position's logit varies: the networks' output gain raised, their bias 0), on a
    model whose output masking moves (a sharpened classifier)."""
    model = tiny_bert()
    with torch.no_grad():
        model.classifier.weight.mul_(50.0)
    dm = DiffMask(model, mode=mode)
    dm.fit(_loader(1), max_steps=1, seed=0, verbose=False)
    networks = dm.probe.votes if mode == "input" else dm.probe.gates
    with torch.no_grad():
        for net in networks.nets:
            net.gain2.fill_(3.0)
            net.bias.fill_(0.0)
    return dm


def _one_step(dm, options, layer, seed=0):
    call = dm.prepare_batch(_loader(1, seed=7)[0], None, "batch")
    states, original = dm.capture(call, dm.locator.names)
    plan = StepPlan(options, options.kl_constraint())
    torch.manual_seed(seed)
    loss, records = lagrangian(dm, call, states, original, [layer], [call.ids.shape[0]], plan)
    record = records[layer]
    return call, loss, record


@pytest.mark.parametrize("mode", ["input", "hidden"])
def test_the_deployed_kl_is_that_of_the_gates_masked_forward_applies(mode):
    dm = _midway(mode)
    options = FitOptions(eps=0.05, optimization={"constraint": "deployed"})
    divergences = []
    for layer in range(dm.num_layers + 1):
        call, _, record = _one_step(dm, options, layer)
        gates, masked, original = dm.masked_forward(call.ids, call.extra, layer=layer)
        expected = float(example_kl(log_probs(original), log_probs(masked)).mean())
        assert record["kl_deployed"] == pytest.approx(expected, rel=1e-5, abs=1e-7)
        assert 0 < gates.mean() < 1  # some positions masked
        assert record["constraint"] == max(record["kl"], record["kl_deployed"])
        divergences.append(expected)
    assert max(divergences) > 1e-3  # and it shows in the output
    # the sampled constraint (the paper's) records no deployed KL
    _, _, record = _one_step(dm, FitOptions(eps=0.05, optimization={"constraint": "sampled"}), 1)
    assert "kl_deployed" not in record and record["constraint"] == record["kl"]


@pytest.mark.parametrize("mode", ["input", "hidden"])
def test_the_deterministic_constraint_is_the_deployed_kl_alone(mode):
    dm = _midway(mode)
    gaps = []
    for layer in range(dm.num_layers + 1):
        _, loss_max, both = _one_step(dm, FitOptions(eps=0.05, optimization={"constraint": "deployed"}), layer)
        _, loss_det, alone = _one_step(dm, FitOptions(eps=0.05, optimization={"constraint": "deterministic"}), layer)
        # the same draws: the same sampled and deployed KL, and the same loss
        assert alone["kl"] == pytest.approx(both["kl"]) and alone["kl_deployed"] == pytest.approx(both["kl_deployed"])
        assert float(loss_det) == pytest.approx(float(loss_max))
        assert alone["constraint"] == alone["kl_deployed"]
        gaps.append(both["constraint"] - alone["constraint"])
    # where the relaxed draws cost more than the deterministic gates (this probe's
    # hidden layers), only "deployed" holds them
    assert min(gaps) >= 0 and (mode == "input" or max(gaps) > 1e-4)


@pytest.mark.parametrize("mode", ["input", "hidden"])
def test_the_deployed_kl_of_all_open_gates_is_zero_without_a_masked_pass(mode, monkeypatch):
    dm = DiffMask(tiny_bert(), mode=mode)
    dm.fit(_loader(1), max_steps=1, seed=0, verbose=False)  # the gates start open (bias 5)
    passes = []
    replaced = dm.replaced_logits
    monkeypatch.setattr(dm, "replaced_logits", lambda *a, **k: passes.append(1) or replaced(*a, **k))
    _, _, record = _one_step(dm, FitOptions(eps=0.05, optimization={"constraint": "deployed"}), dm.num_layers)
    assert record["kl_deployed"] == 0.0 and record["constraint"] == record["kl"]
    assert len(passes) == 1  # the sampled gates' pass only


def test_the_deployed_constraint_drives_the_multiplier_when_it_is_the_larger(monkeypatch):
    dm = _midway("hidden")
    seen = []
    original_step = GradientRule.step

    def spy(self, values):
        before = dm.lambdas.values.detach().clone()
        original_step(self, values)
        seen.append((before, dm.lambdas.values.detach().clone(), dict(values)))

    monkeypatch.setattr(GradientRule, "step", spy)
    dm.fit(_loader(2), max_steps=2, seed=0, verbose=False,
           optimization={"constraint": "deployed", "multiplier": "ascent", "lr_lambda": 1.0}, eps=0.05)
    for before, after, values in seen:
        for k, value in values.items():
            # plain ascent: lambda moves by exactly the violation of the larger KL
            expected = min(max(float(before[k]) + value - 0.05, 0.0), 200.0)
            assert float(after[k]) == pytest.approx(expected, rel=1e-5, abs=1e-6)


def test_the_deployed_kl_measured_every_few_steps_is_held_in_between(monkeypatch):
    import captum_diffmask.diffmask.fit.loop as loop
    import captum_diffmask.diffmask.fit.step as step

    def fit(every):
        dm, measured, records = _midway("hidden"), [], []
        original_kls, original_step = step._mean_kls_with_gates, loop.training_step
        monkeypatch.setattr(step, "_mean_kls_with_gates", lambda *a, **k: measured.append(set(a[4])) or original_kls(*a, **k))
        monkeypatch.setattr(loop, "training_step", lambda *a, **k: records.append(original_step(*a, **k)) or records[-1])
        dm.fit(_loader(6), max_steps=6, seed=0, verbose=False, layers=[1, 2], compute={"deployed_every": every},
               convergence={"until_converged": False})
        return measured, records

    measured, records = fit(3)
    assert measured == [{1}, {2}, {1}, {2}]  # steps 1 and 4 only (hidden layers: a pass each)
    for held in (1, 2, 4, 5):  # steps 2, 3, 5, 6 hold the last measured value
        for k in (1, 2):
            assert records[held][k]["kl_deployed"] == records[3 * (held // 3)][k]["kl_deployed"]
            assert records[held][k]["constraint"] == max(records[held][k]["kl"], records[held][k]["kl_deployed"])
    assert len({records[i][1]["kl_deployed"] for i in (0, 3)}) == 2  # and the measurements differ
    every_step, _ = fit(1)
    assert len(every_step) == 12
    with pytest.raises(ValueError, match="deployed_every must be an int >= 1"):
        DiffMask(tiny_bert()).fit(_loader(1), max_steps=1, compute={"deployed_every": 0})


@pytest.mark.parametrize("multiplier", ["ascent", "pi"])
def test_lambda_max_is_the_multipliers_ceiling(multiplier):
    # eps 1e-6 cannot hold: the multipliers rise to the ceiling and stay there
    tops = {}
    for ceiling in (200.0, 1000.0):
        dm = _midway("hidden")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            rate = 500.0 if multiplier == "ascent" else 1.0
            dm.fit(_loader(2), max_steps=60, seed=0, verbose=False, eps=1e-6,
                   optimization={"multiplier": multiplier, "lr_lambda": rate, "lambda_max": ceiling})
        tops[ceiling] = float(dm.lambdas.values.detach().max())
    assert tops[200.0] == pytest.approx(200.0) and 200.0 < tops[1000.0] <= 1000.0 + 1e-3
    with pytest.raises(ValueError, match="lambda_max"):
        DiffMask(tiny_bert(), mode="hidden").fit(_loader(1), optimization={"lambda_max": 0.0})


def test_pi_multiplier_falls_while_the_constraint_is_slack_and_rises_while_violated():
    pi = {"multiplier": "pi", "lr_lambda": 0.1}
    for eps, direction in ((10.0, -1), (1e-6, 1)):  # nothing can break a KL of 10
        dm = DiffMask(tiny_bert(), mode="hidden")
        dm.fit(_loader(4), max_steps=8, seed=0, verbose=False, lr=0.3, eps=eps, optimization=pi)
        assert all((float(v) - 1.0) * direction > 0 for v in dm.lambdas.values.detach()), dm.lambdas.values
    with pytest.raises(ValueError, match="controller"):
        DiffMask(tiny_bert(), mode="hidden").fit(_loader(1),
                                                 optimization={"multiplier": "pi", "controller": {"gain": 1.0}})
    with pytest.raises(ValueError, match="constraint"):
        DiffMask(tiny_bert(), mode="hidden").fit(_loader(1), optimization={"constraint": "both"})


def test_a_fit_without_caps_stops_at_the_criterions_budget_and_says_so():
    # a criterion that nothing meets (the kept share may not move at all), 6 windows of 2 steps a layer
    strict = Convergence(window=2, patience=2, tol_kept=0.0, max_windows=6)
    dm = DiffMask(tiny_bert(), mode="hidden")
    with pytest.warns(DiffMaskConvergenceWarning, match="budget of 12 steps"):
        # not frozen: with 2-step windows a collapsing layer can pass for settled on the way
        history = dm.fit(_loader(3), eps=0.1, seed=0, verbose=False, lr=0.3,
                         convergence=dataclasses.replace(strict, freeze_converged=False))
    assert {k: r["steps"] for k, r in dm.convergence.items()} == {0: 12, 1: 12, 2: 12}
    assert history[-1]["epoch"] == 4  # 3 batches an epoch: the budget, not an epoch count, ended it
    # one layer drawn per batch: each layer's share of the budget
    dm = DiffMask(tiny_bert(), mode="hidden")
    with pytest.warns(DiffMaskConvergenceWarning, match="budget of 36 steps"):
        dm.fit(_loader(3), eps=0.1, seed=0, verbose=False, compute={"layers_per_batch": "one"},
               convergence=dataclasses.replace(strict, freeze_converged=False))
    with pytest.raises(ValueError, match="max_windows"):
        Convergence(patience=3, max_windows=3)


def test_a_small_data_set_converges_with_the_defaults_budget():
    """Three batches are enough: the criterion's steps are not capped by an epoch count."""
    loose = Convergence(window=10, patience=2, tol_kept=1.0, tol_lambda=100.0, tol_kl=1e6, open_share=1.1)
    dm = DiffMask(tiny_bert(), mode="hidden")
    with warnings.catch_warnings():
        warnings.simplefilter("error", DiffMaskConvergenceWarning)
        history = dm.fit(_loader(3), seed=0, verbose=False, convergence=loose)
    assert all(r["converged"] and r["steps"] == 30 for r in dm.convergence.values())
    assert history[-1]["epoch"] == 10


@pytest.mark.parametrize("mode, votes, freeze, frozen", [
    ("hidden", "per_depth", True, True), ("hidden", "per_depth", False, False),
    ("input", "per_depth", True, True), ("input", "tied", True, False)])
def test_each_layer_is_frozen_once_it_has_converged_where_its_probe_is_its_own(mode, votes, freeze, frozen):
    """One layer drawn per batch, so that the layers converge at different steps
    (30 of their own, by a criterion every window meets): frozen, a converged
    layer gets no more steps while the others go on; not frozen (or in input
    mode with shared votes, which serve several depths), the layers drawn most
    run past 30."""
    loose = Convergence(window=10, patience=2, tol_kept=1.0, tol_lambda=100.0, tol_kl=1e6, open_share=1.1)
    dm = DiffMask(tiny_bert(), mode=mode, votes=votes)
    history = dm.fit(_loader(3), seed=0, verbose=False, compute={"layers_per_batch": "one"},
                     convergence=dataclasses.replace(loose, freeze_converged=freeze))
    steps = {k: r["steps"] for k, r in dm.convergence.items()}
    assert all(r["converged"] for r in dm.convergence.values())
    if frozen:
        assert steps == {0: 30, 1: 30, 2: 30}
        last = last_rows(history)
        assert min(r["epoch"] for r in last.values()) < history[-1]["epoch"]  # a layer stopped epochs before the end
    else:
        assert max(steps.values()) > 30


def test_freeze_converged_must_be_a_bool():
    with pytest.raises(TypeError, match="freeze_converged"):
        DiffMask(tiny_bert(), mode="hidden").fit(_loader(2), max_steps=1, verbose=False,
                                                 convergence={"freeze_converged": "yes"})


def test_one_shot_iterators_are_refused_without_an_epoch_cap():
    with pytest.raises(ValueError, match="one-shot iterator"):
        DiffMask(tiny_bert(), mode="hidden").fit(iter(_loader(2)), verbose=False)


@pytest.mark.parametrize("mode", ["input", "hidden"])
def test_bfloat16_runs_the_models_passes_of_the_fit_only(mode):
    model = tiny_bert()
    dtypes = []
    hook = model.bert.encoder.layer[1].output.dense.register_forward_hook(lambda m, i, o: dtypes.append(o.dtype))
    try:
        dm = DiffMask(model, mode=mode)
        dm.fit(_loader(2), max_steps=2, seed=0, verbose=False, compute={"precision": "bfloat16"})
        assert dtypes and set(dtypes) == {torch.bfloat16}
        dtypes.clear()
        ids, mask = token_batch(seed=3)
        attributions = dm.attribute(ids, additional_forward_args=(mask,), layer=dm.num_layers)
        dm.masked_forward(ids, (mask,), layer=1)
    finally:
        hook.remove()
    assert set(dtypes) == {torch.float32} and attributions.dtype == torch.float32
    assert all(p.dtype == torch.float32 for p in dm.probe.parameters())
    with pytest.raises(ValueError, match="precision"):
        DiffMask(tiny_bert(), mode=mode).fit(_loader(1), compute={"precision": "half"})


def test_fit_takes_its_options_once_as_fit_options_a_dict_or_overrides():
    from captum_diffmask.diffmask.fit.options import fit_options, FitOptions

    base = FitOptions(eps=0.05, max_steps=7)
    assert fit_options(base, {"max_steps": 3}) == FitOptions(eps=0.05, max_steps=3)
    assert fit_options({"eps": 0.05}, {"seed": 1}) == FitOptions(eps=0.05, seed=1)
    assert fit_options(None, {}) == FitOptions()
    with pytest.raises(TypeError, match="unknown option 'stepz'. The options are FitOptions' fields: eps, layers"):
        fit_options(None, {"stepz": 5})
    with pytest.raises(TypeError, match="unknown option 'max_step'; did you mean 'max_steps'"):
        fit_options(None, {"max_step": 5})
    with pytest.raises(TypeError, match="options must be a FitOptions"):
        fit_options(5, {})
    dm = DiffMask(tiny_bert(), mode="hidden")
    with pytest.raises(TypeError, match="unknown option 'epoch'; did you mean 'epochs'"):
        dm.fit(_loader(2), epoch=1)
    assert dm.probe is None  # refused before any pass
    history = dm.fit(_loader(2), FitOptions(max_steps=2, verbose=False), seed=0, convergence={"until_converged": False})
    assert [row["steps"] for row in history] == [2] * (dm.num_layers + 1)


def test_fit_has_twelve_options_and_puts_release_0_1_flat_names_in_their_groups_with_a_warning():
    import inspect

    from captum_diffmask.diffmask.fit.option_groups import Compute, Validation
    from captum_diffmask.diffmask.fit.options import fit_options, FitOptions, grouped_options

    names = [f.name for f in dataclasses.fields(FitOptions)]
    assert len(names) <= 12 and set(names) <= set(inspect.signature(DiffMask.fit).parameters)
    with pytest.warns(DeprecationWarning, match=r"fit\(precision=..., until_converged=...\): the option is now in its "
                                                r"group, compute=\{'precision': ...\}, convergence="):
        options = fit_options(FitOptions(compute=Compute(stack_layers="none")),
                              {"precision": "bfloat16", "until_converged": False})
    assert options.compute == Compute(precision="bfloat16", stack_layers="none")  # merged into the given group
    assert options.convergence.until_converged is False and options.convergence.window == 100
    batches = _loader(1)
    assert grouped_options({"validation": batches, "eps_valid": 0.2}) == {"validation": Validation(batches, eps=0.2)}
    assert grouped_options({"eps_valid": 0.2}) == {}  # bounds without held-out batches select nothing
    assert FitOptions(validation=batches).validation == Validation(batches)
    with pytest.raises(TypeError, match="compute: unknown field 'precison'; did you mean 'precision'"):
        FitOptions(compute={"precison": "bfloat16"})
    with pytest.raises(TypeError, match="unknown option 'lagrangian'"):  # removed: no report or default used it
        fit_options(None, {"lagrangian": "normalized"})


def test_the_score_gradient_changes_the_probe_but_not_the_constraint_it_records():
    runs = {}
    for score in (False, True):
        dm = DiffMask(tiny_bert(), mode="hidden")
        dm.fit(_loader(2), seed=0, verbose=False, max_steps=6, optimization={"score_gradient": score})
        runs[score] = dm.probe.state_dict()
    plain, scored = runs[False], runs[True]
    assert any(not torch.equal(plain[name], scored[name]) for name in plain)
    with pytest.raises(TypeError, match="score_gradient"):
        DiffMask(tiny_bert(), mode="hidden").fit(_loader(2), max_steps=1, verbose=False,
                                                 optimization={"score_gradient": "yes"})


def test_the_score_gradient_leaves_the_first_step_s_kl_as_it_was():
    kls = []
    for score in (False, True):
        dm = DiffMask(tiny_bert(), mode="hidden")
        history = dm.fit(_loader(1), seed=0, verbose=False, max_steps=1, optimization={"score_gradient": score})
        kls.append([row["kl"] for row in history])
    assert kls[0] == kls[1]  # the same sampled gates, the same KL: the term is 0 in value


#: A criterion every layer meets at its third window of 10 steps, with a cool-down of 30.
LOOSE_COOLING = Convergence(window=10, patience=2, tol_kept=1.0, tol_lambda=100.0, tol_kl=1e6, open_share=1.1,
                            cooldown=30, cooldown_factor=0.1)


def _moving(monkeypatch, moving) -> None:
    r"""Layer 0 reads as unsettled while ``moving(its steps)``."""
    from captum_diffmask.diffmask.constrained.convergence import LayerMonitor

    status = LayerMonitor.status
    monkeypatch.setattr(LayerMonitor, "status",
                        lambda self: "unsettled" if self.layer == 0 and moving(self.steps) else status(self))


def _fitted_without_warning(convergence: Convergence) -> DiffMask:
    dm = DiffMask(tiny_bert(), mode="hidden")
    with warnings.catch_warnings():
        warnings.simplefilter("error", DiffMaskConvergenceWarning)
        dm.fit(_loader(3), seed=0, verbose=False, convergence=convergence)
    return dm


def test_a_cool_down_goes_on_until_every_layer_settles_again_on_its_windows_or_a_cap_ends_it(monkeypatch):
    # settled at step 30, the cool-down's 30 steps end at 60, where layer 0
    # moves; on until its window at 80 holds
    _moving(monkeypatch, lambda steps: 40 < steps <= 70)
    dm = _fitted_without_warning(LOOSE_COOLING)
    assert dm.fit_record["ended"] == "cooldown" and dm.fit_record["steps"] == 80
    assert all(r["converged"] for r in dm.convergence.values())

    # a cap inside the extension ends the fit, which says the layer did not settle
    capped = DiffMask(tiny_bert(), mode="hidden")
    with pytest.warns(DiffMaskConvergenceWarning, match="max_steps=70"):
        capped.fit(_loader(3), seed=0, verbose=False, convergence=LOOSE_COOLING, max_steps=70)
    assert capped.fit_record["ended"] == "max_steps" and not capped.convergence[0]["converged"]


def test_a_cool_down_begins_at_the_criterions_budget_at_the_latest(monkeypatch):
    # layer 0 moves until its step 60: the budget (5 windows of 10) is spent at
    # 50 with it unsettled, the cool-down begins there; its 30 steps end at 80,
    # where it has settled on the cooled windows. No cap is given: the fit's
    # budget is the criterion's plus the cool-down's
    _moving(monkeypatch, lambda steps: steps <= 60)
    budgeted = dataclasses.replace(LOOSE_COOLING, max_windows=5)
    dm = _fitted_without_warning(budgeted)
    assert dm.fit_record["ended"] == "cooldown" and dm.fit_record["steps"] == 80
    # without a cool-down the budget ends the fit with the layer unsettled
    plain = DiffMask(tiny_bert(), mode="hidden")
    with pytest.warns(DiffMaskConvergenceWarning, match="budget of 50 steps"):
        plain.fit(_loader(3), seed=0, verbose=False, convergence=dataclasses.replace(budgeted, cooldown=0))
    assert plain.fit_record["ended"] == "max_steps" and not plain.convergence[0]["converged"]


def test_a_cool_down_trains_every_layer_further_at_the_scaled_rates_and_judges_its_windows(monkeypatch):
    import captum_diffmask.diffmask.fit.loop as loop

    built, build = [], loop.build_optimizers
    monkeypatch.setattr(loop, "build_optimizers", lambda *a: built.append(build(*a)) or built[-1])
    loose = LOOSE_COOLING
    dm = _fitted_without_warning(loose)
    # settled at 30 steps, then 30 more at every layer
    assert all(r["converged"] and r["steps"] == 60 for r in dm.convergence.values())
    assert dm.fit_record["ended"] == "cooldown" and dm.fit_record["steps"] == 60
    probe_opt, rule = built[0]
    assert [g["lr"] for g in probe_opt.param_groups] == pytest.approx([3e-4, 1e-4])
    assert [g["lr"] for g in rule.optimizer.param_groups] == pytest.approx([1e-3] * 3)  # one per layer

    # without a cool-down the same fit ends where it settled, at the full rates
    built.clear()
    plain = DiffMask(tiny_bert(), mode="hidden")
    plain.fit(_loader(3), seed=0, verbose=False, convergence=dataclasses.replace(loose, cooldown=0))
    assert plain.fit_record["ended"] == "converged" and plain.fit_record["steps"] == 30
    assert [g["lr"] for g in built[0][0].param_groups] == pytest.approx([3e-3, 1e-3])

    # one layer drawn per batch: each layer frozen at its 30th step; the
    # cool-down's 30 steps a layer are 90 of the fit's, shared among the
    # layers, and it ends where a layer's window next closes
    one = {"layers_per_batch": "one"}
    plain = DiffMask(tiny_bert(), mode="hidden")
    plain.fit(_loader(3), seed=0, verbose=False, compute=one, convergence=dataclasses.replace(loose, cooldown=0))
    cooled = DiffMask(tiny_bert(), mode="hidden")
    cooled.fit(_loader(3), seed=0, verbose=False, compute=one, convergence=loose)
    extra = cooled.fit_record["steps"] - plain.fit_record["steps"]
    assert cooled.fit_record["ended"] == "cooldown" and 90 <= extra < 90 + 3 * 10
    assert sum(r["steps"] for r in cooled.convergence.values()) == 3 * 30 + extra


def test_a_cool_down_long_enough_for_its_windows_is_required():
    with pytest.raises(ValueError, match=r"cooldown must be 0 or at least \(patience \+ 1\) \* window = 400"):
        Convergence(cooldown=300)
    with pytest.raises(ValueError, match="cooldown_factor"):
        Convergence(cooldown=400, cooldown_factor=0.0)
    with pytest.raises(ValueError, match="convergence.cooldown must be an int"):
        Convergence(cooldown=True)


def test_log_lines_show_the_fits_lines_inside_the_block_and_leave_the_logger_as_found(capsys):
    import logging

    from captum_diffmask.diffmask.fit.history import log_lines

    logger = logging.getLogger("captum_diffmask")
    level, handlers = logger.level, list(logger.handlers)
    with log_lines():
        logger.info("DiffMask fit: layer 3 converged")
    with log_lines(False):
        logger.info("not shown")
    logger.info("not shown either")
    assert capsys.readouterr().err.splitlines() == ["DiffMask fit: layer 3 converged"]
    assert (logger.level, logger.handlers) == (level, handlers)


def test_a_fits_training_seconds_count_each_epoch_once():
    history = [{"epoch": 2, "layer": 1, "seconds": 4.5},  # layer 0 frozen in epoch 2
               {"epoch": 1, "layer": 0, "seconds": 10.0}, {"epoch": 1, "layer": 1, "seconds": 10.0}]
    assert epoch_seconds(history) == {1: 10.0, 2: 4.5} and list(epoch_seconds(history)) == [1, 2]
    assert sum(epoch_seconds(history).values()) == 14.5
    assert sum(epoch_seconds([]).values()) == 0.0
