import dataclasses

import pytest
import torch
from captum.attr import Attribution
from captum.metrics import sensitivity_max

from captum_diffmask import DiffMask
from captum_diffmask.diffmask.fit.option_groups import Validation

from tiny_models import tiny_bert, tiny_model, token_batch, VOCAB


def _loader(n_batches=6, seed=0):
    return [token_batch(batch=4, length=9, seed=seed + i) for i in range(n_batches)]


@pytest.mark.parametrize("kind", ["bert", "distilbert", "gpt2"])
@pytest.mark.parametrize("mode", ["input", "hidden"])
def test_fit_and_attribute_shapes_values_and_padding(kind, mode):
    model = tiny_model(kind)
    dm = DiffMask(model, mode=mode)
    assert isinstance(dm, Attribution) and not dm.multiplies_by_inputs
    history = dm.fit(_loader(), epochs=2, seed=0, verbose=False)
    assert history and {"epoch", "layer", "kl", "l0", "agreement", "lambda", "steps"} <= set(history[0])
    assert all(0 <= h["l0"] <= 1 and h["kl"] >= 0 and h["lambda"] >= 0 for h in history)
    ids, mask = token_batch(seed=99)
    for layer in range(dm.num_layers + 1):
        attr = dm.attribute(ids, additional_forward_args=(mask,), layer=layer)
        assert attr.shape == ids.shape
        assert torch.isfinite(attr).all() and attr.min() >= 0 and attr.max() <= 1
        assert (attr[mask == 0] == 0).all()
    every = dm.attribute(ids, additional_forward_args=(mask,), layer=None)
    assert every.shape == (*ids.shape, dm.num_layers + 1)
    assert torch.allclose(every[..., 1], dm.attribute(ids, additional_forward_args=(mask,), layer=1))
    if mode == "input":  # a token kept at layer k was kept by every earlier vote
        assert (every[..., 1:] <= every[..., :-1] + 1e-6).all()
    assert dm.attribute((ids,), additional_forward_args=(mask,), layer=0)[0].shape == ids.shape


def test_fit_leaves_model_untouched_and_learns_to_mask():
    model = tiny_bert()
    before = {n: p.clone() for n, p in model.state_dict().items()}
    model.train()
    dm = DiffMask(model, mode="hidden")
    history = dm.fit(_loader(8), epochs=4, eps=0.05, seed=0, verbose=False)
    assert model.training and all(p.requires_grad for p in model.parameters())
    assert all(torch.equal(before[n], p) for n, p in model.state_dict().items())
    first = [h["l0"] for h in history if h["epoch"] == 1]
    last = [h["l0"] for h in history if h["epoch"] == 4]
    assert sum(last) / len(last) < sum(first) / len(first)  # gates close as it trains


def test_padded_positions_give_no_nan_even_when_fully_padded_rows():
    model = tiny_bert()
    dm = DiffMask(model, mode="input")
    ids, mask = token_batch()
    mask[1, 1:] = 0
    ids[1, 1:] = 0
    dm.fit([(ids, mask)] * 3, epochs=1, seed=0, verbose=False)
    attr = dm.attribute(ids, additional_forward_args=(mask,), layer=None)
    assert torch.isfinite(attr).all() and (attr[1, 1:] == 0).all()


@pytest.mark.parametrize("kind", ["bert", "distilbert", "gpt2"])
@pytest.mark.parametrize("mode", ["input", "hidden"])
def test_save_load_round_trips_attributions_exactly(tmp_path, kind, mode):
    model = tiny_model(kind)
    dm = DiffMask(model, mode=mode)
    dm.fit(_loader(3), epochs=1, seed=0, verbose=False)
    ids, mask = token_batch(seed=5)
    expected = dm.attribute(ids, additional_forward_args=(mask,), layer=None)
    path = tmp_path / "dm.pt"
    dm.save(path)
    loaded = DiffMask.load(path, model)
    assert loaded.mode == mode
    assert torch.equal(loaded.attribute(ids, additional_forward_args=(mask,), layer=None), expected)


def test_load_refuses_a_checkpoint_for_another_model(tmp_path):
    dm = DiffMask(tiny_bert())
    dm.fit(_loader(2), epochs=1, seed=0, verbose=False)
    path = tmp_path / "dm.pt"
    dm.save(path)
    with pytest.raises(ValueError, match="model: .*sites"):
        DiffMask.load(path, tiny_bert(num_layers=3))
    with pytest.raises(ValueError, match="model: .*sites"):
        DiffMask.load(path, tiny_model("roberta"))
    other_head = tiny_bert()
    other_head.classifier = torch.nn.Linear(32, 5)  # same sites, other parameter shapes
    with pytest.raises(ValueError, match="model: .*another model"):
        DiffMask.load(path, other_head)
    torch.save({"something": 1}, tmp_path / "other.pt")
    with pytest.raises(ValueError, match="not a DiffMask checkpoint"):
        DiffMask.load(tmp_path / "other.pt", tiny_bert())


def test_bad_input_errors_name_the_argument():
    model = tiny_bert()
    dm = DiffMask(model)
    ids, mask = token_batch()
    with pytest.raises(ValueError, match="not fitted.*fit"):
        dm.attribute(ids, additional_forward_args=(mask,), layer=0)
    dm.fit(_loader(1), epochs=1, verbose=False)
    with pytest.raises(ValueError, match="layer must be in 0..2"):
        dm.attribute(ids, additional_forward_args=(mask,), layer=3)
    with pytest.raises(TypeError, match="layer"):
        dm.attribute(ids, additional_forward_args=(mask,), layer="1")
    with pytest.raises(TypeError, match="inputs must hold integer token ids"):
        dm.attribute(ids.float(), additional_forward_args=(mask,), layer=0)
    with pytest.raises(ValueError, match=r"inputs must have shape \(batch, tokens\)"):
        dm.attribute(ids[0], layer=0)
    with pytest.raises(ValueError, match="padding mask"):
        dm.attribute(ids, additional_forward_args=(mask[:, :3],), layer=0)
    with pytest.raises(ValueError, match="mode"):
        DiffMask(model, mode="both")
    with pytest.raises(ValueError, match="epochs"):
        dm.fit(_loader(1), epochs=0)
    with pytest.raises(ValueError, match="layer must be in"):
        dm.fit(_loader(1), epochs=1, layers=[5])
    with pytest.raises(ValueError, match="sites=.*'hidden'"):
        DiffMask(torch.nn.Sequential(torch.nn.Embedding(5, 4), torch.nn.Linear(4, 2)))


def test_captum_sensitivity_max_runs_with_a_token_substitution_perturbation():
    model = tiny_bert()
    dm = DiffMask(model, mode="hidden")
    dm.fit(_loader(3), epochs=1, seed=0, verbose=False)
    ids, mask = token_batch(seed=7)

    def substitute_one_token(inputs):
        # token ids are discrete: perturb by swapping one real token for another id
        (ids_,) = inputs if isinstance(inputs, tuple) else (inputs,)
        perturbed = ids_.clone()
        position = torch.randint(0, 5, (ids_.shape[0],))
        perturbed[torch.arange(ids_.shape[0]), position] = torch.randint(3, VOCAB, (ids_.shape[0],))
        return (perturbed,) if isinstance(inputs, tuple) else perturbed

    torch.manual_seed(0)
    sensitivity = sensitivity_max(
        dm.attribute, ids, perturb_func=substitute_one_token, n_perturb_samples=4,
        additional_forward_args=(mask,), layer=1,
    )
    assert sensitivity.shape == (ids.shape[0],)
    assert torch.isfinite(sensitivity).all() and (sensitivity >= 0).all()


@pytest.mark.parametrize("kind", ["bert", "distilbert", "gpt2", "electra"])
def test_partial_rerun_gives_the_masked_logits_of_a_full_rerun(kind):
    model = tiny_model(kind)
    dm = DiffMask(model, mode="hidden")
    ids, mask = token_batch()
    call = dm._prepare(ids, (mask,), None)
    states, original = dm.capture(call, dm.locator.names)  # records the site modules' outputs
    assert call.module_outputs
    fresh = dm._prepare(ids, (mask,), None)  # nothing recorded: a full re-run
    torch.manual_seed(0)
    for k in range(dm.num_layers + 1):
        site = f"hidden.{k}"
        gates = torch.rand(ids.shape)
        noise = 3.0 * torch.randn(states[site].shape[-1])
        masked_state = gates.unsqueeze(-1) * states[site] + (1 - gates.unsqueeze(-1)) * noise
        full = dm.replaced_logits(fresh, {site: masked_state})
        partial = dm.replaced_logits(call, {site: masked_state})
        assert torch.allclose(partial, full, atol=1e-5), (kind, k)
        assert (full - original).abs().max() > 1e-4  # the mask matters
    assert not any("forward" in vars(m) for m in model.modules())  # patches removed


def test_partial_rerun_skips_the_blocks_before_the_site():
    model = tiny_bert()
    dm = DiffMask(model, mode="hidden")
    ids, mask = token_batch()
    call = dm._prepare(ids, (mask,), None)
    states, _ = dm.capture(call, dm.locator.names)
    ran = []
    handle = model.bert.encoder.layer[0].attention.register_forward_hook(lambda *a: ran.append(1))
    try:
        dm.replaced_logits(call, {"hidden.1": states["hidden.1"]})
        assert ran == []  # block 0 was not recomputed
        dm.replaced_logits(dm._prepare(ids, (mask,), None), {"hidden.1": states["hidden.1"]})
        assert ran == [1]
    finally:
        handle.remove()


# ---------------------------------------------------- evaluation, selection
def _constant_gates(monkeypatch, dm, logit):
    from captum_diffmask.diffmask.gates import Gates

    probe_logits = Gates.logits
    monkeypatch.setattr(Gates, "logits", lambda gates, states, layer, mask=None: torch.full_like(
        probe_logits(gates, states, layer, mask), logit))


@pytest.mark.parametrize("mode", ["input", "hidden"])
def test_masked_forward_with_open_gates_is_the_plain_forward(mode, monkeypatch):
    model = tiny_bert()
    dm = DiffMask(model, mode=mode)
    dm.fit(_loader(2), epochs=1, seed=0, verbose=False, max_steps=1)
    ids, mask = token_batch(seed=5)
    _constant_gates(monkeypatch, dm, 10.0)  # every gate far open: the replacement must be the identity
    with torch.no_grad():
        plain = model(ids, attention_mask=mask).logits
    for layer in range(dm.num_layers + 1):
        gates, masked, original = dm.masked_forward(ids, (mask,), layer=layer)
        assert torch.equal(gates, mask.float())
        assert torch.allclose(masked, plain, atol=1e-5) and torch.allclose(original, plain, atol=1e-5)
    with pytest.raises(ValueError, match="layer"):
        dm.masked_forward(ids, (mask,))


def test_masked_forward_closed_gates_use_the_baseline(monkeypatch):
    model = tiny_bert()
    dm = DiffMask(model, mode="hidden")
    dm.fit(_loader(2), epochs=1, seed=0, verbose=False, max_steps=1)
    ids, mask = token_batch(seed=5)
    _constant_gates(monkeypatch, dm, -10.0)
    gates, masked, _ = dm.masked_forward(ids, (mask,), layer=2)
    assert gates.sum() == 0
    # by hand: the last layer's output replaced by its baseline everywhere
    baseline = dm.probe.baselines[2].detach()
    with dm.locator.replace({"hidden.2": baseline.expand(*ids.shape, -1).clone()}), torch.no_grad():
        expected = model(ids, attention_mask=mask).logits
    assert torch.allclose(masked, expected, atol=1e-5)


@pytest.mark.parametrize("mode", ["input", "hidden"])
def test_fit_with_validation_restores_the_sparsest_feasible_epoch(mode):
    model = tiny_bert()
    dm = DiffMask(model, mode=mode)
    valid = _loader(2, seed=50)
    history = dm.fit(_loader(6), epochs=4, eps=0.5, seed=0, verbose=False, validation=Validation(valid, eps=1.0))
    assert {"valid_kl", "valid_l0", "valid_agreement", "selected"} <= set(history[0])
    chosen = {h["epoch"] for h in history if h["selected"]}
    assert len(chosen) == 1
    epoch = chosen.pop()
    per_epoch = {}
    for h in history:
        per_epoch.setdefault(h["epoch"], []).append(h)
    feasible = {e: sum(r["valid_l0"] for r in rows) / len(rows) for e, rows in per_epoch.items()
                if all(r["valid_kl"] <= 1.0 for r in rows)}
    assert epoch == min(feasible, key=feasible.get)
    # the restored probe is the one that was scored at that epoch
    scores = dm.evaluate(valid, layers=sorted({h["layer"] for h in per_epoch[epoch]}))
    for row in per_epoch[epoch]:
        assert scores[row["layer"]]["kl"] == pytest.approx(row["valid_kl"], abs=1e-5)
        assert scores[row["layer"]]["l0"] == pytest.approx(row["valid_l0"], abs=1e-6)


def test_fit_with_validation_warns_when_no_epoch_keeps_the_constraint(monkeypatch):
    dm = DiffMask(tiny_bert(), mode="hidden")
    monkeypatch.setattr(dm, "_evaluate", lambda loader, layers, rule: {k: {"kl": 9.0, "agreement": 0.0, "l0": 0.1} for k in layers})
    with pytest.warns(UserWarning, match="no epoch kept"):
        history = dm.fit(_loader(2), epochs=2, seed=0, verbose=False, validation=_loader(1))
    assert all(h["selected"] == (h["epoch"] == 2) for h in history)
    with pytest.raises(ValueError, match="validation.eps must be >= 0"):
        dm.fit(_loader(1), epochs=1, verbose=False, validation={"batches": _loader(1), "eps": -1.0})


def test_fit_takes_one_multiplier_rate_per_layer():
    dm = DiffMask(tiny_bert(), mode="hidden")
    rates = [0.0] * dm.num_layers + [5.0]  # only the last layer's multiplier may move
    history = dm.fit(_loader(3), epochs=2, seed=0, verbose=False, optimization={"lr_lambda": rates})
    assert {h["layer"] for h in history} - {dm.num_layers}  # other layers were trained too
    values = dm.lambdas().tolist()
    assert values[:-1] == [1.0] * dm.num_layers  # rate 0: unchanged whatever the violation
    assert values[-1] != 1.0
    with pytest.raises(ValueError, match=f"lr_lambda must be a float or {dm.num_layers + 1} rates"):
        dm.fit(_loader(1), epochs=1, verbose=False, optimization={"lr_lambda": [1.0, 2.0]})


@pytest.mark.parametrize("mode", ["input", "hidden"])
@pytest.mark.parametrize("init_bias", [5.0, 2.0, 0.0])
def test_init_bias_sets_the_keep_probability_at_the_start(tmp_path, mode, init_bias):
    # lr 1e-9: one step builds the probe and moves nothing measurable, so the
    # attributions are the initial gates: P(z != 0) = sigmoid(b - T log(-l / r))
    # (the last layer of each gate network starts at ~0), a product over the
    # votes in input mode
    model = tiny_bert()
    dm = DiffMask(model, mode=mode, init_bias=init_bias)
    dm.fit(_loader(1), epochs=1, lr=1e-9, optimization={"lr_baseline": 0.0}, seed=0, verbose=False)
    low, high = dm.stretch
    p_open = torch.sigmoid(torch.tensor(init_bias - dm.temperature * torch.log(torch.tensor(-low / high)).item()))
    ids, mask = token_batch(seed=3)
    attributions = dm.attribute(ids, additional_forward_args=(mask,), layer=None)
    real = mask.bool()
    for k in range(dm.num_layers + 1):
        expected = p_open ** (k + 1) if mode == "input" else p_open
        assert torch.allclose(attributions[..., k][real], expected.expand(int(real.sum())), atol=0.01)
    path = tmp_path / "dm.pt"
    dm.save(path)
    assert DiffMask.load(path, model).init_bias == init_bias


def test_fit_refuses_unknown_optimisation_settings_before_any_forward_pass():
    dm = DiffMask(tiny_bert(), mode="hidden")
    with pytest.raises(ValueError, match="multiplier must be one of"):
        dm.fit(_loader(1), optimization={"multiplier": "pid"})
    with pytest.raises(ValueError, match="optimizer must be one of"):
        dm.fit(_loader(1), optimization={"optimizer": "sgd"})
    with pytest.raises(TypeError, match="convergence must be a Convergence or a dict of its fields"):
        dm.fit(_loader(1), convergence=10)
    with pytest.raises(TypeError, match="convergence: unknown field 'windw'; did you mean 'window'"):
        dm.fit(_loader(1), convergence={"windw": 10})
    with pytest.raises(ValueError, match="dataloader: no batches"):
        dm.fit([])
    assert not dm.is_fitted


def test_fit_stops_once_every_layer_has_converged_and_reports_each(monkeypatch):
    from captum_diffmask import Convergence

    dm = DiffMask(tiny_bert(), mode="hidden")
    # a criterion every layer meets as soon as it has 3 windows of 2 steps
    loose = Convergence(window=2, patience=2, tol_kept=1.0, tol_lambda=100.0, tol_kl=1e6, open_share=1.1)
    history = dm.fit(_loader(6), epochs=50, eps=0.1, seed=0, verbose=False, convergence=loose)
    steps = sum(h["steps"] for h in history)
    assert steps < 50 * 6  # stopped before the cap
    assert all(r["converged"] and r["steps"] >= 6 for r in dm.convergence.values())
    assert set(dm.convergence) == {0, 1, 2}
    assert history[-1]["status"] == "converged"
    # until_converged=False runs every epoch: 3 epochs of 6 batches, each
    # training the 3 layers (every layer on every batch, the default)
    dm2 = DiffMask(tiny_bert(), mode="hidden")
    history2 = dm2.fit(_loader(6), epochs=3, eps=0.1, seed=0, verbose=False,
                       convergence=dataclasses.replace(loose, until_converged=False))
    assert sum(h["steps"] for h in history2) == 18 * 3


@pytest.mark.parametrize("mode", ["input", "hidden"])
def test_keeping_only_the_needed_activations_fits_the_same_probe(mode, monkeypatch):
    model = tiny_bert()
    probes, kept = {}, {}
    for activations in ("all", "needed"):
        dm = DiffMask(model, mode=mode)
        seen = []
        capture = dm.capture
        monkeypatch.setattr(dm, "capture", lambda call, names=None, **kw: (seen.append(len(list(names))), capture(call, names, **kw))[1])
        # one layer drawn per batch: a step at a shallow layer needs fewer sites
        dm.fit(_loader(6), epochs=1, seed=0, convergence={"until_converged": False},
               compute={"activations": activations, "layers_per_batch": "one"}, verbose=False)
        probes[activations], kept[activations] = dm.probe.state_dict(), seen
    for name, value in probes["all"].items():
        assert torch.equal(value, probes["needed"][name]), name
    assert kept["all"] == [4] * 6  # input, hidden.0 .. hidden.2 at every step
    assert kept["needed"][0] == 4 and max(kept["needed"][1:]) <= 4 and min(kept["needed"][1:]) < 4


@pytest.mark.parametrize("mode", ["input", "hidden"])
def test_every_layer_per_batch_trains_each_layer_once_a_step_on_one_capture(mode, monkeypatch):
    dm = DiffMask(tiny_bert(), mode=mode)
    captures = []
    capture = dm.capture
    monkeypatch.setattr(dm, "capture", lambda call, names=None, **kw: (captures.append(1), capture(call, names, **kw))[1])
    history = dm.fit(_loader(5), epochs=2, eps=0.05, seed=0, verbose=False, convergence={"until_converged": False},
                     compute={"layers_per_batch": "all"}, layers=[0, 2])
    assert len(captures) == 10  # one capture pass a batch, shared by the layers
    assert {(h["epoch"], h["layer"]): h["steps"] for h in history} == {(e, k): 5 for e in (1, 2) for k in (0, 2)}
    assert {k: r["steps"] for k, r in dm.convergence.items()} == {0: 10, 2: 10}
    # every trained layer's multiplier moved (each saw its own violation), the untrained one did not
    assert dm.lambdas.values[1] == 1.0 and dm.lambdas.values[0] != 1.0 and dm.lambdas.values[2] != 1.0


def test_every_layer_per_batch_counts_max_steps_in_batches():
    dm = DiffMask(tiny_bert(), mode="hidden")
    history = dm.fit(_loader(6), epochs=5, seed=0, verbose=False, compute={"layers_per_batch": "all"}, max_steps=4)
    assert {h["layer"]: h["steps"] for h in history} == {0: 4, 1: 4, 2: 4}
    with pytest.raises(ValueError, match="layers_per_batch"):
        DiffMask(tiny_bert(), mode="hidden").fit(_loader(1), compute={"layers_per_batch": "every"})



@pytest.mark.parametrize("mode", ["input", "hidden"])
def test_masked_forward_layers_equals_masked_forward_at_each_layer_with_one_capture(mode, monkeypatch):
    dm = DiffMask(tiny_bert(), mode=mode)
    dm.fit(_loader(2), epochs=1, seed=0, verbose=False, max_steps=3, lr=0.3)
    ids, mask = token_batch(seed=5)
    one_by_one = {k: dm.masked_forward(ids, (mask,), layer=k) for k in range(dm.num_layers + 1)}
    captures = []
    capture = dm.capture
    monkeypatch.setattr(dm, "capture", lambda *args, **kwargs: captures.append(1) or capture(*args, **kwargs))
    together = dm.masked_forward_layers(ids, (mask,))
    assert len(captures) == 1 and sorted(together) == list(range(dm.num_layers + 1))
    for k, (gates, masked, original) in together.items():
        assert torch.equal(gates, one_by_one[k][0])
        assert torch.allclose(masked, one_by_one[k][1], atol=1e-6) and torch.equal(original, one_by_one[k][2])
    with pytest.raises(ValueError, match="at least one layer"):
        dm.masked_forward_layers(ids, (mask,), layers=[])


def test_a_layer_the_fit_did_not_train_is_refused_also_after_a_save_and_load(tmp_path):
    ids, mask = token_batch()
    model = tiny_bert()
    dm = DiffMask(model, mode="hidden")
    dm.fit([(ids, mask)] * 2, layers=[1], max_steps=2, seed=0, convergence={"until_converged": False}, verbose=False)
    assert dm.fitted_layers == [1]
    assert dm.attribute(ids, additional_forward_args=(mask,), layer=1).shape == ids.shape
    for layer in (0, None):
        with pytest.raises(ValueError, match=r"fitted at layers \[1\], not at \[0"):
            dm.attribute(ids, additional_forward_args=(mask,), layer=layer)
    with pytest.raises(ValueError, match="not at \\[2\\]"):
        dm.masked_forward(ids, additional_forward_args=(mask,), layer=2)
    assert list(dm.evaluate([(ids, mask)])) == [1]  # the fitted layers by default
    path = tmp_path / "dm.pt"
    dm.save(path)
    loaded = DiffMask.load(path, model)
    assert loaded.fitted_layers == [1]
    with pytest.raises(ValueError, match="not at \\[0\\]"):
        loaded.attribute(ids, additional_forward_args=(mask,), layer=0)
    # a second fit adds its layers
    dm.fit([(ids, mask)] * 2, layers=[0], max_steps=2, seed=0, convergence={"until_converged": False}, verbose=False)
    assert dm.fitted_layers == [0, 1]
    assert dm.attribute(ids, additional_forward_args=(mask,), layer=0).shape == ids.shape
