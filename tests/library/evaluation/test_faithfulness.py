"""Faithfulness and plausibility metrics on a hand-made model whose answer is
known: it reads token 0 only."""

import math

import pytest
import torch
from torch import nn

from captum_diffmask.evaluation.faithfulness import (
    eraser_scores, FRACTIONS, plausibility, token_infidelity, token_sensitivity, TokenEraser, top_fraction,
)
from captum_diffmask.methods import IntegratedGradients


class ReadsFirstToken(nn.Module):
    r"""Class logits from the embedding of token 0 alone (times its attention-mask entry)."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.embed = nn.Embedding(20, 4)
        self.head = nn.Linear(4, 3)
        with torch.no_grad():
            self.embed.weight.mul_(4.0)

    def forward(self, ids, mask):
        return self.head(self.embed(ids)[:, 0] * mask[:, :1].float())


SITES = lambda model: {"input": model.embed, "hidden": [model.embed]}  # noqa: E731


def _data():
    ids = torch.randint(1, 20, (6, 10), generator=torch.Generator().manual_seed(1))
    mask = torch.ones_like(ids)
    mask[0, 7:] = 0
    first = torch.zeros(ids.shape)
    first[:, 0] = 1.0
    random = torch.rand(ids.shape, generator=torch.Generator().manual_seed(2))
    random[:, 0] = 0.0  # the chance scores never rank token 0 first here
    return ids, mask, first, random


@pytest.mark.parametrize("removal", ["baseline", "attention"])
def test_scoring_the_read_token_first_gets_the_full_drop_and_random_less(removal):
    model = ReadsFirstToken().eval()
    ids, mask, first, random = _data()
    eraser = TokenEraser(model, removal=removal, sites=SITES(model), padding_mask_arg=0)
    good = eraser_scores(eraser, ids, first, (mask,))
    chance = eraser_scores(eraser, ids, random, (mask,))
    empty = eraser.probabilities(ids, (mask,), torch.zeros_like(mask, dtype=torch.bool),
                                 eraser.class_probabilities(ids, (mask,), mask.float()).argmax(-1))
    full_drop = good["full"] - empty
    for column in range(len(FRACTIONS)):
        assert torch.allclose(good["comprehensiveness"][:, column], full_drop, atol=1e-6)
        assert torch.allclose(good["sufficiency"][:, column], torch.zeros(6), atol=1e-6)
    # the chance scores keep token 0 until the top-k reaches it: less comprehensive, less sufficient
    assert (chance["aopc_comprehensiveness"] < good["aopc_comprehensiveness"] - 1e-3).all()
    assert (chance["aopc_sufficiency"] > good["aopc_sufficiency"] + 1e-3).all()
    assert torch.allclose(good["aopc_comprehensiveness"], good["comprehensiveness"].mean(-1))
    assert torch.allclose(chance["aopc_sufficiency"], chance["sufficiency"].mean(-1))


def test_top_fraction_takes_at_least_one_real_token_and_never_padding():
    scores = torch.tensor([[0.1, 0.9, 0.5, 0.7], [0.3, 0.2, 0.8, 0.1]])
    mask = torch.tensor([[True, True, True, False], [True, True, True, True]])
    assert top_fraction(scores, mask, 0.01).tolist() == [[False, True, False, False], [False, False, True, False]]
    assert top_fraction(scores, mask, 0.5).tolist() == [[False, True, True, False], [True, False, True, False]]
    assert top_fraction(scores, mask, 1.0).tolist() == mask.tolist()
    with pytest.raises(ValueError, match="fraction"):
        top_fraction(scores, mask, 0.0)


def test_plausibility_matches_hand_computations():
    scores = torch.tensor([[0.9, 0.1, 0.5, 0.3, 0.0]])
    rationale = torch.tensor([[1, 0, 0, 1, 1]]).bool()
    mask = torch.tensor([[1, 1, 1, 1, 0]]).bool()  # the last marked token is padding: not counted
    result = plausibility(scores, rationale, mask)
    # ranking 0 (hit), 2, 3 (hit), 1: precision 1/1 at the first hit and 2/3 at the second
    assert result["auprc"].item() == pytest.approx((1 + 2 / 3) / 2)
    # top 2 = {0, 2} against {0, 3}: one hit, F1 = 2 * 1 / (2 + 2)
    assert result["token_f1"].item() == pytest.approx(0.5)
    assert plausibility(scores, rationale, mask, k=[1])["token_f1"].item() == pytest.approx(2 / 3)
    assert math.isnan(plausibility(scores, torch.zeros_like(rationale), mask)["auprc"].item())


def test_infidelity_and_sensitivity_with_token_perturbations():
    model = ReadsFirstToken().eval()
    ids, mask, first, random = _data()
    eraser = TokenEraser(model, sites=SITES(model), padding_mask_arg=0)
    faithful = token_infidelity(eraser, ids, first, (mask,), n_perturb_samples=20)
    chance = token_infidelity(eraser, ids, random, (mask,), n_perturb_samples=20)
    assert faithful.shape == (6,) and (faithful >= 0).all()
    assert faithful.mean() < chance.mean()
    ig = IntegratedGradients(model, sites=SITES(model), padding_mask_arg=0)
    sensitivity = token_sensitivity(ig.attribute, ids, mask.bool(), 20, additional_forward_args=(mask,),
                                    n_perturb_samples=3, n_steps=4)
    assert sensitivity.shape == (6,) and torch.isfinite(sensitivity).all()
    def first_token(x, additional_forward_args=None):  # Captum passes a 1-tuple, as to attribute
        ids_ = x[0] if isinstance(x, tuple) else x
        scores = torch.zeros(ids_.shape).index_fill_(1, torch.tensor([0]), 1.0)
        return (scores,) if isinstance(x, tuple) else scores

    constant = token_sensitivity(first_token, ids, mask.bool(), 20, additional_forward_args=(mask,), n_perturb_samples=3)
    assert torch.equal(constant, torch.zeros(6))  # an explanation that never moves


def test_removal_is_checked():
    model = ReadsFirstToken().eval()
    with pytest.raises(ValueError, match="removal must be one of"):
        TokenEraser(model, removal="zeros", sites=SITES(model), padding_mask_arg=0)
    with pytest.raises(ValueError, match="padding_mask_arg"):
        TokenEraser(model, removal="attention", sites=SITES(model), padding_mask_arg=None)


def test_tokens_outside_the_candidates_are_always_kept():
    model = ReadsFirstToken().eval()
    ids, mask, _, random = _data()
    eraser = TokenEraser(model, sites=SITES(model), padding_mask_arg=0)
    candidates = mask.bool().clone()
    candidates[:, 0] = False  # token 0, the one the model reads, is never removed
    result = eraser_scores(eraser, ids, random, (mask,), candidates=candidates)
    assert torch.allclose(result["comprehensiveness"], torch.zeros(6, len(FRACTIONS)), atol=1e-6)
    assert torch.allclose(result["sufficiency"], torch.zeros(6, len(FRACTIONS)), atol=1e-6)
    with pytest.raises(ValueError, match="candidates"):
        eraser_scores(eraser, ids, random, (mask,), candidates=candidates[:, :3])


def test_token_infidelity_is_captums_definition_computed_by_hand():
    # the same perturbations (the seeded generator's first draw, examples repeated
    # consecutively as Captum expands them), the formula written out: the optimal
    # scale beta = E[I.a df] / E[(I.a)^2] per example, then E[(beta I.a - df)^2]
    from tiny_models import tiny_bert, token_batch

    model = tiny_bert()
    ids, mask = token_batch()
    eraser = TokenEraser(model)
    scores = torch.randn(ids.shape, generator=torch.Generator().manual_seed(1))
    n, drop = 7, 0.3
    ours = token_infidelity(eraser, ids, scores, (mask,), n_perturb_samples=n, drop=drop, seed=5)

    with torch.no_grad():
        probs = eraser.class_probabilities(ids, (mask,), mask.float())
        classes = probs.argmax(-1)
        real = mask.bool().repeat_interleave(n, 0)
        removed = (torch.rand(real.shape, generator=torch.Generator().manual_seed(5)) < drop) & real
        rows = ids.repeat_interleave(n, 0)
        perturbed = eraser.class_probabilities(rows, (mask.repeat_interleave(n, 0),), real.float() - removed.float())
    target = classes.repeat_interleave(n, 0)
    drop_in_output = (probs.repeat_interleave(n, 0) - perturbed).gather(-1, target[:, None]).squeeze(-1)
    dot = (removed.float() * (scores * mask).repeat_interleave(n, 0)).sum(-1)
    dot, drop_in_output = dot.view(-1, n), drop_in_output.view(-1, n)
    beta = (dot * drop_in_output).mean(-1) / (dot * dot).mean(-1)
    by_hand = ((beta[:, None] * dot - drop_in_output) ** 2).mean(-1)
    assert torch.allclose(ours, by_hand.clamp(min=0.0), atol=1e-12, rtol=1e-4)  # values of ~1e-6
    assert by_hand.abs().max() > 1e-7  # not two zeros


def test_token_sensitivity_is_captums_definition_computed_by_hand():
    # the same substitutions (the seeded generator's draws, examples repeated
    # consecutively), the formula written out: max over the samples of
    # ||e(x') - e(x)|| / ||e(x)||
    from captum_diffmask.methods import Occlusion
    from tiny_models import tiny_bert, token_batch, VOCAB

    model = tiny_bert()
    ids, mask = token_batch()
    occlusion = Occlusion(model)
    n = 4
    ours = token_sensitivity(occlusion.attribute, ids, mask.bool(), VOCAB, additional_forward_args=(mask,),
                             n_perturb_samples=n, seed=3)

    generator = torch.Generator().manual_seed(3)
    real = mask.bool().repeat_interleave(n, 0)
    noise = torch.rand(real.shape, generator=generator).masked_fill(~real, 2.0)
    chosen = noise.argsort(-1)[:, :1]
    values = torch.randint(0, VOCAB, chosen.shape, generator=generator)
    perturbed = ids.repeat_interleave(n, 0).scatter(1, chosen, values)
    perturbed = torch.where(real, perturbed, ids.repeat_interleave(n, 0))
    original = occlusion.attribute(ids, additional_forward_args=(mask,))
    changed = occlusion.attribute(perturbed, additional_forward_args=(mask.repeat_interleave(n, 0),))
    change = (changed - original.repeat_interleave(n, 0)).norm(dim=-1) / original.norm(dim=-1).repeat_interleave(n, 0)
    by_hand = change.view(-1, n).max(-1).values
    assert torch.allclose(ours, by_hand, atol=1e-6, rtol=1e-4)
    assert by_hand.min() > 1e-3  # a substituted token moves the scores


def test_captums_own_infidelity_and_sensitivity_run_on_token_ids_in_one_call():
    from captum.metrics import infidelity, sensitivity_max

    from captum_diffmask.evaluation import token_removal, token_substitution
    from captum_diffmask.methods import Occlusion, RandomAttribution
    from tiny_models import tiny_bert, token_batch, VOCAB

    model = tiny_bert()
    ids, mask = token_batch()

    def forward(ids, mask):
        return model(input_ids=ids, attention_mask=mask).logits.softmax(-1)

    target = forward(ids, mask).argmax(-1)
    occlusion = Occlusion(model, baselines=0.0)
    scores = {"occlusion": occlusion.attribute(ids, additional_forward_args=(mask,), layer=0),
              "random": RandomAttribution(model).attribute(ids, additional_forward_args=(mask,))}
    gaps = {name: infidelity(forward, token_removal(4, pad_id=0, share=0.3, seed=1), ids, s,
                             additional_forward_args=(mask,), target=target, n_perturb_samples=30, normalize=True)
            for name, s in scores.items()}
    assert gaps["occlusion"].shape == (4,) and (gaps["occlusion"] >= -1e-6).all()
    assert gaps["occlusion"].mean() < gaps["random"].mean()  # the faithful scores explain the drops better
    perturb = token_removal(4, pad_id=0, share=0.5, seed=0)
    removed, perturbed = perturb(ids)
    assert (removed[mask == 0] == 0).all() and (perturbed[removed == 1] == 4).all()
    assert torch.equal(perturbed[removed == 0], ids[removed == 0]) and removed.sum() > 0
    change = sensitivity_max(occlusion.attribute, ids, token_substitution(VOCAB, pad_id=0, seed=2),
                             perturb_radius=0.3, additional_forward_args=(mask,), n_perturb_samples=3)
    assert change.shape == (4,) and (change > 0).all()
    substituted = token_substitution(VOCAB, pad_id=0, seed=2)(ids, 0.5)
    assert torch.equal(substituted[mask == 0], ids[mask == 0]) and (substituted != ids).any()
    with pytest.raises(ValueError, match=r"share must be in \(0, 1\]"):
        token_removal(4, share=0.0)
