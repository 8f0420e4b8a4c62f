"""Several masked passes of one batch as one stacked pass (captum_diffmask.diffmask.stacking),
and the fit and evaluation that use it: the same numbers as one pass per layer."""

import pytest
import torch

from captum_diffmask import DiffMask
from captum_diffmask.diffmask.stacking import masked_logits, repeated_call, stacked_logits, stacked_replacements

from tiny_models import tiny_bert, token_batch


def _loader(n_batches=4, seed=0):
    return [token_batch(batch=4, length=9, seed=seed + i) for i in range(n_batches)]


def _captured(mode="hidden", num_layers=3):
    dm = DiffMask(tiny_bert(num_layers=num_layers), mode=mode)
    return (dm, *_capture(dm, seed=3))


def _capture(dm, seed):
    call = dm.prepare_batch(token_batch(batch=4, length=9, seed=seed), None, "batch")
    states, original = dm.capture(call, dm.locator.names)
    return call, states, original


def test_a_repeated_call_repeats_the_batch_and_only_the_batch():
    dm, call, _, _ = _captured()
    odd = torch.arange(5)  # not the batch's size: left alone
    repeated = repeated_call(type(call)(**{**call.__dict__, "extra": (*call.extra, odd, None)}), 3)
    assert torch.equal(repeated.ids, torch.cat([call.ids] * 3))
    assert torch.equal(repeated.mask, torch.cat([call.mask] * 3))
    assert torch.equal(repeated.extra[0], torch.cat([call.extra[0]] * 3))
    assert repeated.extra[-2] is odd and repeated.extra[-1] is None
    assert repeated.module_outputs is call.module_outputs  # the capture's records still re-used


def test_stacked_replacements_fill_only_the_rows_of_the_passes_that_replace_a_site():
    a, b, c = (torch.full((2, 3, 4), float(v)) for v in (1, 2, 3))
    stacked = stacked_replacements([{"x": a, "y": b}, {"x": c}], batch=2)
    assert torch.equal(stacked["x"], torch.cat([a, c]))  # every pass replaces x
    computed = torch.full((4, 3, 4), 9.0)
    assert torch.equal(stacked["y"](computed), torch.cat([b, computed[2:]]))


def _replacements(dm, states, layers, seed=0):
    torch.manual_seed(seed)
    out = []
    for k in layers:
        site, baseline = dm.gates.masked_site(k) if dm.probe is not None else (f"hidden.{k}", None)
        state = states[site]
        noise = torch.rand(state.shape[:2] + (1,))
        out.append({site: (noise * state + (1 - noise) * state.mean()).requires_grad_(True)})
    return out


@pytest.mark.parametrize("mode, layers", [("hidden", [0, 2, 3]), ("input", None)])
def test_one_stacked_pass_gives_each_pass_its_logits_and_gradients(mode, layers):
    dm, call, states, _ = _captured(mode)
    if mode == "input":  # every depth replaces the input, each with its own tensor
        layers = [0, 1, 2]
        torch.manual_seed(0)
        per_pass = [{"input": (states["input"] * torch.rand(states["input"].shape[:2] + (1,))).requires_grad_(True)}
                    for _ in layers]
    else:
        per_pass = _replacements(dm, states, layers)
    separate = [dm.replaced_logits(call, replaced) for replaced in per_pass]
    grads_separate = torch.autograd.grad(sum(l.square().sum() for l in separate), [v for r in per_pass for v in r.values()])
    passes = []
    replaced_logits = dm.replaced_logits

    def counted(*args):
        passes.append(args[0].ids.shape[0])
        return replaced_logits(*args)

    stacked = stacked_logits(counted, call, per_pass)
    assert passes == [len(per_pass) * call.ids.shape[0]]  # one pass, the batch stacked
    grads_stacked = torch.autograd.grad(sum(l.square().sum() for l in stacked), [v for r in per_pass for v in r.values()])
    for one, other in zip(separate, stacked):
        assert torch.allclose(one, other, atol=1e-5)
    for one, other in zip(grads_separate, grads_stacked):
        assert torch.allclose(one, other, atol=1e-5)
    assert max(float((a - b).abs().max()) for a, b in zip(separate[1:], separate[:-1])) > 1e-3  # the passes differ


def test_pass_groups_put_together_what_can_share_a_pass():
    for mode, same_site in (("input", [[0, 1, 2, 3]]), ("hidden", [[0], [1], [2], [3]])):
        dm = DiffMask(tiny_bert(num_layers=3), mode=mode)
        dm.fit(_loader(1), max_steps=1, seed=0, verbose=False)
        assert dm.gates.pass_groups([0, 1, 2, 3]) == same_site
        assert dm.gates.pass_groups([0, 1, 2, 3], "all") == [[0, 1, 2, 3]]
        assert dm.gates.pass_groups([0, 1, 2, 3], "none") == [[0], [1], [2], [3]]
    dm = DiffMask(tiny_bert(num_layers=3), mode="heads")
    dm.fit(_loader(1), max_steps=1, seed=0, verbose=False)
    assert dm.gates.pass_groups([1, 2, 3], "all") == [[1], [2], [3]]  # gated in a context of their own
    call = dm.prepare_batch(token_batch(seed=3), None, "batch")
    states, _ = dm.capture(call, dm.locator.names)
    gates = {k: dm.gates.deterministic(states, k, "threshold", call.mask) for k in (1, 2)}
    with pytest.raises(ValueError, match="share a pass"):
        masked_logits(dm.gates, dm.replaced_logits, call, states, gates)


def _fit(mode, stack, passes=None):
    dm = DiffMask(tiny_bert(num_layers=3), mode=mode)
    with torch.no_grad():
        dm.model.classifier.weight.mul_(30.0)  # an output that masking moves
    if passes is not None:
        replaced_logits = dm.replaced_logits
        dm.replaced_logits = lambda *args: passes.append(args[0].ids.shape[0]) or replaced_logits(*args)
    history = dm.fit(_loader(), max_steps=12, seed=0, verbose=False, lr=0.3, eps=0.02,
                     compute={"stack_layers": stack}, convergence={"until_converged": False})
    return dm, history


def _gate_logits(dm):
    r"""Every layer's gate logits on a batch the fit did not see."""
    call, states, _ = _capture(dm, seed=7)
    with torch.no_grad():
        return dm.gates.logits_of_layers(states, list(range(dm.num_layers + 1)), call.mask)


@pytest.mark.parametrize("mode, stack", [("input", "same_site"), ("hidden", "all")])
def test_a_stacked_fit_is_the_fit_of_one_pass_per_layer(mode, stack):
    passes = []
    stacked, history = _fit(mode, stack, passes)
    separate, reference = _fit(mode, "none")
    # the same arithmetic in other matrix shapes: float-level differences, which
    # Adam can turn into small steps where a gradient is near zero (input mode,
    # whose products are larger, ends within 2e-3 of the separate fit)
    for row, expected in zip(history, reference):
        for key in ("kl", "l0", "lambda"):
            assert row[key] == pytest.approx(expected[key], rel=2e-2, abs=1e-5), (row["layer"], key)
    # the probes compute the same gates (their weight-normed directions may
    # drift apart where their norm, not their direction, carries the step)
    one, other = _gate_logits(stacked), _gate_logits(separate)
    for k in one:
        assert torch.allclose(one[k], other[k], atol=5e-2), k
    assert min(row["l0"] for row in history) < 0.99  # gates closed: the masks had something to do
    # each step's sampled gates of its 4 layers in one pass of 4 x 4 rows; the
    # deployed gates of those layers whose gates are not all open in one more
    assert passes.count(16) >= 12 and all(size % 4 == 0 and size <= 16 for size in passes)
    with pytest.raises(ValueError, match="stack_layers"):
        DiffMask(tiny_bert(), mode=mode).fit(_loader(1), compute={"stack_layers": "rows"})


def test_evaluation_stacks_the_depths_and_scores_as_each_depth_alone():
    dm, _ = _fit("input", "same_site")
    stacked = dm.evaluate(_loader(2, seed=20))
    alone = {k: dm.evaluate(_loader(2, seed=20), layers=[k])[k] for k in range(dm.num_layers + 1)}
    for k, scores in stacked.items():
        for key, value in scores.items():
            assert value == pytest.approx(alone[k][key], rel=1e-4, abs=1e-6), (k, key)
    assert any(scores["l0"] < 1.0 for scores in stacked.values())
