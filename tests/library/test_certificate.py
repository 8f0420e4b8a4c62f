"""certify: a settled probe trained further stays put and counts, an unsettled one
moves and does not; the single-position closure that judges "needed" without the
probe's ranking is each example's cheapest position closed alone."""

import warnings

import pytest
import torch

from captum_diffmask import certify, CertificateTolerances, DiffMask
from captum_diffmask.diffmask.certificate import single_closure_kl
from captum_diffmask.evaluation.toy_task import toy_sites
from captum_diffmask.model.divergences import example_kl, log_probs

from tiny_models import sensitized, tiny_bert, token_batch

pytestmark = pytest.mark.filterwarnings("ignore::captum_diffmask.DiffMaskConvergenceWarning")


def test_a_settled_probe_counts_and_a_capped_one_moves_and_does_not(toy_setup):
    model, _, train, valid = toy_setup
    held_out = list(valid.loader(128, shuffle=False, seed=0))
    settled = DiffMask(model, mode="hidden", sites=toy_sites(model), padding_mask_arg=1)
    # with the cool-down the suites fit with: at the fit's own rates a settled probe jitters around its answer
    # (docs/results/certificate-noise.md), and on some CPUs this one's held-out KL then moved by half of eps
    settled.fit(train.loader(128, shuffle=True, seed=0), eps=0.05, layers=[1], seed=0, verbose=False,
                convergence={"cooldown": 500})
    assert settled.convergence[1]["status"] == "converged"
    scores = settled.attribute(valid.ids[:64], additional_forward_args=(valid.query[:64], valid.mask[:64]), layer=1)

    certificate = certify(settled, train.loader(128, shuffle=True, seed=1), held_out)
    layer = certificate.layers[1]
    assert certificate.counted == [1] and layer.reasons == [] and layer.within_bound
    assert layer.keep_change < 0.05 and abs(layer.masked_after - layer.masked_before) < 0.02
    assert 0.3 < layer.masked_before < 0.7  # a mask, not all open or all closed
    # the explainer is left with the probe the certificate judged
    again = settled.attribute(valid.ids[:64], additional_forward_args=(valid.query[:64], valid.mask[:64]), layer=1)
    assert torch.equal(scores, again) and settled.convergence[1]["status"] == "converged"
    assert certificate.to_dict()["layers"]["1"]["counted"] is True and "1 of 1 probes count" in str(certificate)

    capped = DiffMask(model, mode="hidden", sites=toy_sites(model), padding_mask_arg=1)
    capped.fit(train.loader(128, shuffle=True, seed=0), eps=0.05, layers=[1], seed=0, verbose=False, max_steps=60)
    moved = certify(capped, train.loader(128, shuffle=True, seed=1), held_out).layers[1]
    assert not moved.counted and moved.masked_after - moved.masked_before > 0.2 and moved.keep_change > 0.2
    assert any("masked share moved" in r for r in moved.reasons) and any("verdict is" in r for r in moved.reasons)


def test_single_closure_kl_is_each_examples_cheapest_position_closed_alone():
    model = sensitized(tiny_bert())  # an untrained tiny BERT barely reads its tokens
    ids, mask = token_batch(batch=4, length=7, seed=3)
    mask[1, 5:] = 0  # padding is never closed
    dm = DiffMask(model, mode="hidden")
    dm.fit([(ids, mask)], eps=0.1, layers=[0], max_steps=3, seed=0, verbose=False)
    measured = single_closure_kl(dm, [(ids, mask)], layer=0, examples=3)

    call = dm.prepare_batch((ids, mask), None, "batch")
    states, original = dm.capture(call, dm.locator.names)
    site, baseline = dm.gates.masked_site(0)
    log_p, cheapest = log_probs(original), []
    for row in range(3):
        kls = []
        for position in range(int(mask[row].sum())):
            replaced = states[site].clone()
            replaced[row, position] = baseline
            with torch.no_grad():
                kls.append(float(example_kl(log_p, log_probs(dm.replaced_logits(call, {site: replaced})))[row]))
        assert max(kls) > 2 * min(kls)  # the positions differ: the cheapest is a choice
        cheapest.append(min(kls))
    assert measured == pytest.approx(sum(cheapest) / 3, rel=1e-4)
    assert measured > 1e-4


def test_clear_errors_name_the_argument():
    with pytest.raises(ValueError, match="tolerances.steps"):
        CertificateTolerances(steps=0)
    with pytest.raises(ValueError, match="tolerances.keep"):
        CertificateTolerances(keep=-1.0)
    with pytest.raises(ValueError, match="no fit to certify"):
        certify(DiffMask(tiny_bert()), [], [])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dm = DiffMask(tiny_bert(), mode="hidden")
        ids, mask = token_batch()
        dm.fit([(ids, mask)], eps=0.1, layers=[1], max_steps=2, verbose=False)
    dm.fit_record = {}
    with pytest.raises(ValueError, match="give eps="):
        certify(dm, [(ids, mask)], [(ids, mask)])


# fresh optimiser states at the rates the fit ended at, or the fit's own states (which hold them)
@pytest.mark.parametrize("from_state", [False, True])
def test_after_a_cool_down_the_continuation_goes_on_at_the_rates_the_fit_ended_at(monkeypatch, tmp_path, from_state):
    import captum_diffmask.diffmask.fit.loop as loop
    from captum_diffmask import Convergence

    built, build = [], loop.build_optimizers
    monkeypatch.setattr(loop, "build_optimizers", lambda *a: built.append(build(*a)) or built[-1])
    batches = [token_batch(batch=4, length=9, seed=i) for i in range(3)]
    loose = Convergence(window=10, patience=2, tol_kept=1.0, tol_lambda=100.0, tol_kl=1e6, open_share=1.1,
                        cooldown=30, cooldown_factor=0.1)
    dm = DiffMask(tiny_bert(), mode="hidden")
    dm.fit(batches, seed=0, verbose=False, lr=0.02, optimization={"lr_lambda": 0.05}, convergence=loose,
           checkpoint=str(tmp_path / "fit.state"))
    record = dm.fit_record
    assert record["ended"] == "cooldown"
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=".*goes on at the rates")  # the rates asked are the state's
        certificate = certify(dm, batches, batches[:1], CertificateTolerances(steps=20),
                              state=tmp_path / "fit.state" if from_state else None)
    probe_opt, rule = built[-1]  # the continuation's: no cool-down of its own
    assert [g["lr"] for g in probe_opt.param_groups] == pytest.approx([0.002, 1e-4])
    assert [g["lr"] for g in rule.optimizer.param_groups] == pytest.approx([0.005] * 3)
    assert dm.fit_record == record and sorted(certificate.layers) == [0, 1, 2]
    assert certificate.continued is from_state


def test_the_recorded_cooldown_factor_is_read_from_a_convergence_or_its_dict_and_defaults_to_convergences():
    from captum_diffmask import Convergence
    from captum_diffmask.diffmask.certificate import recorded_cooldown_factor

    assert recorded_cooldown_factor({"convergence": Convergence(cooldown=500, cooldown_factor=0.25)}) == 0.25
    assert recorded_cooldown_factor({"convergence": {"cooldown_factor": 0.5}}) == 0.5
    assert recorded_cooldown_factor({"convergence": {"cooldown": 30}}) == Convergence.cooldown_factor
    assert recorded_cooldown_factor({}) == Convergence.cooldown_factor


# stopped by its step cap inside an epoch, and by its epochs (7 of 3 batches: 21 steps)
@pytest.mark.parametrize("cap", [{"max_steps": 20}, {"epochs": 7}])
def test_with_the_fits_state_the_further_steps_are_the_fit_gone_on(tmp_path, cap):
    from captum_diffmask.diffmask.certificate import held_out_figures

    model, batches = tiny_bert(), [token_batch(batch=4, length=9, seed=i) for i in range(3)]
    held_out, going = batches[:2], {"until_converged": False, "freeze_converged": False}
    options = dict(layers=[0, 2], eps=0.1, lr=0.02, seed=0, verbose=False, convergence=going)
    dm = DiffMask(model, mode="hidden")
    dm.fit(batches, **cap, checkpoint=str(tmp_path / "fit.state"), **options)
    steps = dm.fit_record["steps"]
    assert steps == 20 or dm.fit_record["ended"] == "epochs"
    before = held_out_figures(dm, held_out, [0, 2])
    certificate = certify(dm, batches, held_out, CertificateTolerances(steps=12), state=tmp_path / "fit.state")
    longer = DiffMask(model, mode="hidden")  # the same fit, uninterrupted, 12 steps longer
    longer.fit(batches, max_steps=steps + 12, **options)
    after = held_out_figures(longer, held_out, [0, 2])
    for k in (0, 2):
        layer = certificate.layers[k]
        assert layer.kl_after == pytest.approx(after[k]["kl"], rel=1e-5, abs=1e-9)
        assert layer.masked_after == pytest.approx(after[k]["masked"], abs=1e-9)
        assert layer.keep_change == pytest.approx(float((after[k]["keep"] - before[k]["keep"]).abs().mean()), abs=1e-6)
    assert certificate.continued and certificate.to_dict()["continued"] is True
    assert "with the fit's optimiser states" in str(certificate)
    # fresh optimiser states (no state) take other steps: what the comparison above tells apart
    fresh = certify(dm, batches, held_out, CertificateTolerances(steps=12))
    assert not fresh.continued
    assert max(abs(fresh.layers[k].keep_change - certificate.layers[k].keep_change) for k in (0, 2)) > 1e-4
    assert (tmp_path / "fit.state").exists() and (tmp_path / "fit.state").stat().st_size > 0  # read, not changed


def test_a_state_that_is_not_the_explainers_fit_is_refused(tmp_path):
    model, batches = tiny_bert(), [token_batch(batch=4, length=9, seed=i) for i in range(2)]
    options = dict(eps=0.1, lr=0.02, verbose=False, max_steps=6, convergence={"until_converged": False})
    dm, other = DiffMask(model, mode="hidden"), DiffMask(model, mode="hidden")
    dm.fit(batches, layers=[0, 1], seed=0, checkpoint=str(tmp_path / "a.state"), **options)
    other.fit(batches, layers=[0, 1], seed=1, checkpoint=str(tmp_path / "b.state"), **options)
    with pytest.raises(ValueError, match="certify: state .*b.state holds another probe"):
        certify(dm, batches, batches, CertificateTolerances(steps=2), state=tmp_path / "b.state")
    narrower = DiffMask(model, mode="hidden")
    narrower.fit(batches, layers=[1], seed=0, checkpoint=str(tmp_path / "c.state"), **options)
    with pytest.raises(ValueError, match="certify: state .*other layers"):
        certify(narrower, batches, batches, CertificateTolerances(steps=2), state=tmp_path / "a.state")
