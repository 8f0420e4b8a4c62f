"""Faithfulness and plausibility of token attributions, for any model and any
method's (B, T) scores.

- **Comprehensiveness** and **sufficiency** (DeYoung et al., ERASER, 2020): with
  ``y`` the class the model predicts on the whole input, ``p(y | x) - p(y | x
  without its top-k tokens)`` and ``p(y | x) - p(y | x with only its top-k
  tokens)``, at top-k fractions of the real tokens; **AOPC** is their mean over
  the fractions. A faithful attribution has a high comprehensiveness and a low
  sufficiency.
- **Infidelity** and **sensitivity** through Captum's ``infidelity`` and
  ``sensitivity_max``, with perturbations suited to token ids: tokens removed at
  random (infidelity, on a token-presence vector), and tokens substituted at
  random (sensitivity).
- **Plausibility** against per-token human labels: the area under the
  precision-recall curve (average precision) and the token F1 of the top-k
  tokens against a rationale mask.

Tokens are removed in one of two ways (:data:`REMOVALS`): their input embedding is
replaced by a baseline vector (``"baseline"``; zeros unless given), or they are
deleted from the attention mask (``"attention"``). Padding is never touched.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Dict, Optional, Sequence, Tuple, Union

import torch
from captum.metrics import infidelity, sensitivity_max
from torch import nn, Tensor
from tqdm.auto import tqdm

from captum_diffmask.evaluation.perturbations import token_substitution
from captum_diffmask.model.arguments import ForwardFunc, PaddingMaskArg, resolve_target
from captum_diffmask.model.attribution import SitesType
from captum_diffmask.model.batches import to_device
from captum_diffmask.model.checks import check_choice
from captum_diffmask.model.forward import format_additional_args, frozen, model_device, ModelForward
from captum_diffmask.model.divergences import log_probs
from captum_diffmask.model.inputs import check_token_ids
from captum_diffmask.model.sites import SiteLocator

#: The top-k fractions of the real tokens that ERASER's metrics are taken at.
FRACTIONS = (0.01, 0.05, 0.10, 0.20, 0.50)
#: How tokens are removed.
REMOVALS = ("baseline", "attention")


def top_fraction(scores: Tensor, mask: Tensor, fraction: float) -> Tensor:
    r"""
    The top ``ceil(fraction * n)`` real tokens of each row by score (at least
    one), ties broken by position.

    Args:

        scores (Tensor): (B, T) scores, higher = more important.
        mask (Tensor): (B, T) bool, True at real tokens.
        fraction (float): in (0, 1].

    Returns:
        *Tensor* (B, T) bool.
    """
    if not 0 < fraction <= 1:
        raise ValueError(f"fraction must be in (0, 1], got {fraction!r}")
    real = mask.bool()
    ranked = torch.where(real, scores.float(), torch.full_like(scores, -math.inf, dtype=torch.float32))
    order = torch.sort(ranked, dim=-1, descending=True, stable=True).indices
    counts = (real.sum(-1).float() * fraction).ceil().clamp(min=1).long()
    top = torch.arange(real.shape[1], device=real.device).unsqueeze(0) < counts.unsqueeze(1)
    keep = torch.zeros_like(real)
    keep.scatter_(1, order, top)
    return keep & real


class TokenEraser:
    r"""
    Runs the model with tokens removed and reads the probability of a class.

    Args:

        model (nn.Module): the analysed model.
        removal (str, optional): ``"baseline"`` (the removed tokens' input
                    embeddings replaced by ``baseline``) or ``"attention"`` (their
                    attention-mask entries set to 0). Default: ``"baseline"``
        baseline (Tensor or int, optional): the replacement embedding: an (H,)
                    vector, or a token id whose embedding is used (e.g. the
                    tokenizer's ``[MASK]``); zeros when None. Default: None
        sites, forward_func, padding_mask_arg, output: as in
                    :class:`~captum_diffmask.model.attribution.SiteAttribution`; the
                    output must be one distribution per example.
    """

    def __init__(
        self, model: nn.Module, removal: str = "baseline", baseline: Union[None, int, Tensor] = None,
        sites: SitesType = None, forward_func: ForwardFunc = None, padding_mask_arg: PaddingMaskArg = "auto",
        output: str = "auto",
    ) -> None:
        check_choice(removal, REMOVALS, "removal")
        self.model = model
        self.model_forward = ModelForward(model, forward_func, padding_mask_arg, output)
        self.locator = SiteLocator.locate(model, sites)
        if removal == "attention" and self.model_forward.padding_mask_arg is None:
            raise ValueError("removal='attention' needs the model's attention mask: set padding_mask_arg")
        self.removal, self.baseline = removal, baseline

    def _baseline(self, state: Tensor) -> Tensor:
        if self.baseline is None:
            return torch.zeros(state.shape[-1], dtype=state.dtype, device=state.device)
        if isinstance(self.baseline, int) and not isinstance(self.baseline, bool):
            embedding = self.locator.site("input").module
            if not isinstance(embedding, nn.Embedding):
                raise TypeError("baseline: a token id needs an nn.Embedding at the input site; pass an (H,) vector")
            return embedding.weight[self.baseline].detach().to(state)
        if not isinstance(self.baseline, Tensor) or self.baseline.shape != state.shape[-1:]:
            raise ValueError(f"baseline must be None, a token id or a ({state.shape[-1]},) tensor")
        return self.baseline.detach().to(state)

    @torch.no_grad()
    def logits(self, ids: Tensor, extra: Tuple[Any, ...], presence: Tensor) -> Tensor:
        r"""(B, C) logits of the model with each real token weighted by
        ``presence`` (B, T) in [0, 1]: 1 kept, 0 removed (attention removal
        rounds it)."""
        mask = self.model_forward.padding_mask(ids, extra)
        kept = torch.where(mask, presence.to(ids.device).float(), torch.ones_like(presence, dtype=torch.float32))
        with frozen(self.model):
            if self.removal == "attention":
                index = self.model_forward.padding_mask_arg
                deleted = (mask & (kept > 0.5)).to(extra[index].dtype)
                logits = self.model_forward(ids, extra[:index] + (deleted,) + extra[index + 1:])
            else:
                def mix(state: Tensor) -> Tensor:
                    z = kept.unsqueeze(-1).to(state.dtype)
                    return z * state + (1 - z) * self._baseline(state)

                with self.locator.replace({"input": mix}):
                    logits = self.model_forward(ids, extra)
        if logits.dim() > 2:
            raise ValueError("faithfulness metrics need one distribution per example (output 'classes' or 'last')")
        return logits

    def class_probabilities(self, ids: Tensor, extra: Tuple[Any, ...], presence: Tensor) -> Tensor:
        r"""(B, C) class probabilities with the tokens weighted by ``presence``
        (one binary logit: C = 2, class 1 is "logit > 0")."""
        return log_probs(self.logits(ids, extra, presence)).exp()

    def probabilities(self, ids: Tensor, extra: Tuple[Any, ...], keep: Tensor, classes: Tensor) -> Tensor:
        r"""(B,) probability of ``classes`` with only the ``keep`` (B, T) tokens."""
        probs = self.class_probabilities(ids, extra, keep.float())
        return probs.gather(-1, classes.unsqueeze(-1)).squeeze(-1)


def _chunks(total: int, batch_size: Optional[int]) -> Sequence[slice]:
    size = total if batch_size is None else max(int(batch_size), 1)
    return [slice(start, start + size) for start in range(0, total, size)]


def _prepared(eraser: TokenEraser, inputs: Tensor, additional_forward_args: Any) -> Tuple[Tensor, Tuple[Any, ...], Tensor]:
    ids, _ = check_token_ids(inputs)
    ids, extra = to_device(ids, format_additional_args(additional_forward_args), model_device(eraser.model))
    return ids, extra, eraser.model_forward.padding_mask(ids, extra)


def _rows(value: Any, part: slice, batch: int) -> Any:
    return value[part] if isinstance(value, Tensor) and value.dim() >= 1 and value.shape[0] == batch else value


def eraser_scores(
    eraser: TokenEraser, inputs: Tensor, scores: Tensor, additional_forward_args: Any = None,
    fractions: Sequence[float] = FRACTIONS, target: Any = None, batch_size: Optional[int] = 64, verbose: bool = False,
    candidates: Optional[Tensor] = None,
) -> Dict[str, Any]:
    r"""
    Comprehensiveness and sufficiency of ``scores`` at each top-k fraction, and
    their AOPC, per example.

    Args:

        eraser (TokenEraser): the model and how tokens are removed.
        inputs (Tensor): (B, T) token ids.
        scores (Tensor): (B, T) attributions, higher = more important.
        additional_forward_args (Any, optional): the model's other arguments.
        fractions (sequence of float, optional): top-k fractions of the real
                    tokens. Default: :data:`FRACTIONS`
        target (optional): the class whose probability is read; None: the class
                    predicted on the whole input. Default: None
        batch_size (int, optional): examples per forward pass. Default: 64
        verbose (bool, optional): a progress bar. Default: False
        candidates (Tensor, optional): (B, T) bool, the tokens that may be
                    removed; the top-k fractions are of these, and the other
                    real tokens are always kept (e.g. a tokenizer's special
                    tokens, as ERASER removes words only). None: every real
                    token. Default: None

    Returns:
        *dict*: ``comprehensiveness`` and ``sufficiency`` (B, F), their
        ``aopc_comprehensiveness`` and ``aopc_sufficiency`` (B,) (means over the F
        fractions), ``full`` (B,) the probability on the whole input, and
        ``fractions``.
    """
    ids, extra, mask = _prepared(eraser, inputs, additional_forward_args)
    if scores.shape != ids.shape:
        raise ValueError(f"scores must have the shape of inputs {tuple(ids.shape)}, got {tuple(scores.shape)}")
    if candidates is not None and candidates.shape != ids.shape:
        raise ValueError(f"candidates must have the shape of inputs {tuple(ids.shape)}, got {tuple(candidates.shape)}")
    removable = mask if candidates is None else mask & candidates.to(mask.device).bool()
    fractions = [float(f) for f in fractions]
    parts = {"comprehensiveness": [], "sufficiency": [], "full": []}
    for part in tqdm(_chunks(ids.shape[0], batch_size), desc="faithfulness", disable=None if verbose else True):
        part_ids, part_mask = ids[part], mask[part]
        part_extra = tuple(_rows(a, part, ids.shape[0]) for a in extra)
        probs = eraser.class_probabilities(part_ids, part_extra, part_mask.float())
        classes = resolve_target(probs, _rows(target, part, ids.shape[0]))
        full = probs.gather(-1, classes.unsqueeze(-1)).squeeze(-1)
        comp, suff = [], []
        fixed = part_mask & ~removable[part]  # real tokens that are never removed
        for fraction in fractions:
            top = top_fraction(scores[part].to(part_ids.device), removable[part], fraction)
            comp.append(full - eraser.probabilities(part_ids, part_extra, part_mask & ~top, classes))
            suff.append(full - eraser.probabilities(part_ids, part_extra, top | fixed, classes))
        parts["comprehensiveness"].append(torch.stack(comp, -1))
        parts["sufficiency"].append(torch.stack(suff, -1))
        parts["full"].append(full)
    result: Dict[str, Any] = {key: torch.cat(value).cpu() for key, value in parts.items()}
    result["aopc_comprehensiveness"] = result["comprehensiveness"].mean(-1)
    result["aopc_sufficiency"] = result["sufficiency"].mean(-1)
    result["fractions"] = fractions
    return result


def token_infidelity(
    eraser: TokenEraser, inputs: Tensor, scores: Tensor, additional_forward_args: Any = None, target: Any = None,
    n_perturb_samples: int = 10, drop: float = 0.2, seed: int = 0,
) -> Tensor:
    r"""
    Captum's ``infidelity`` (normalised) of token scores, with token removal as
    the perturbation: the input is a presence vector (1 = kept) and each
    perturbation removes a random ``drop`` share of the real tokens; infidelity is
    the mean squared error between ``sum of the removed tokens' scores`` (scaled
    optimally) and the drop of the target class's probability.

    Args:

        eraser (TokenEraser): the model and how tokens are removed.
        inputs (Tensor): (B, T) token ids.
        scores (Tensor): (B, T) attributions.
        additional_forward_args (Any, optional): the model's other arguments.
        target (optional): the class; None: the class predicted on the whole input.
        n_perturb_samples (int, optional): perturbations per example. Default: 10
        drop (float, optional): the share of real tokens each one removes. Default: 0.2
        seed (int, optional): seeds the perturbations (a private generator).

    Returns:
        *Tensor* (B,) >= 0; lower = more faithful.
    """
    ids, extra, mask = _prepared(eraser, inputs, additional_forward_args)
    probs = eraser.class_probabilities(ids, extra, mask.float())
    classes = resolve_target(probs, target)
    generator = torch.Generator().manual_seed(int(seed))

    def forward(presence: Tensor, expanded_ids: Tensor, *expanded_extra: Any) -> Tensor:
        return eraser.class_probabilities(expanded_ids, tuple(expanded_extra), presence)

    def perturb(presence: Tensor) -> Tuple[Tensor, Tensor]:
        times = presence.shape[0] // ids.shape[0]
        real = mask.repeat_interleave(times, 0)
        removed = (torch.rand(presence.shape, generator=generator) < drop).to(presence.device) & real
        return removed.float(), presence - removed.float()

    return infidelity(forward, perturb, mask.float(), scores.to(ids.device).float() * mask,
                      additional_forward_args=(ids, *extra), target=classes, n_perturb_samples=n_perturb_samples,
                      normalize=True).detach().cpu().clamp(min=0.0)  # rounding can give -1e-8


def token_sensitivity(
    explanation_func: Callable[..., Tensor], inputs: Tensor, mask: Tensor, vocabulary_size: int,
    additional_forward_args: Any = None, n_perturb_samples: int = 5, substitutions: int = 1, seed: int = 0,
    **explanation_kwargs: Any,
) -> Tensor:
    r"""
    Captum's ``sensitivity_max`` of an explanation with token substitution as the
    perturbation: each sample replaces ``substitutions`` random real tokens by
    random ids, and the largest relative change of the scores is kept.

    Args:

        explanation_func (Callable): ``explanation_func(ids,
                    additional_forward_args=..., **explanation_kwargs)`` returning
                    (B, T) scores, e.g. a method's ``attribute``.
        inputs (Tensor): (B, T) token ids.
        mask (Tensor): (B, T) bool, True at real tokens (only they are substituted).
        vocabulary_size (int): ids are drawn from ``0 .. vocabulary_size - 1``.
        additional_forward_args (Any, optional): the model's other arguments.
        n_perturb_samples (int, optional): perturbations per example. Default: 5
        substitutions (int, optional): tokens substituted per sample. Default: 1
        seed (int, optional): seeds the substitutions (a private generator).

    Returns:
        *Tensor* (B,) >= 0; lower = more stable.
    """
    perturb = token_substitution(vocabulary_size, substitutions=substitutions, seed=seed, real=mask)
    return sensitivity_max(explanation_func, inputs, perturb_func=perturb, n_perturb_samples=n_perturb_samples,
                           additional_forward_args=additional_forward_args, **explanation_kwargs).detach().cpu()


def plausibility(scores: Tensor, rationale: Tensor, mask: Tensor, k: Optional[Sequence[int]] = None) -> Dict[str, Tensor]:
    r"""
    Agreement of scores with a human rationale, per example.

    Args:

        scores (Tensor): (B, T) attributions.
        rationale (Tensor): (B, T) bool, True at the tokens humans marked.
        mask (Tensor): (B, T) bool, True at real tokens.
        k (sequence of int, optional): per example the number of top tokens the
                    token F1 takes; the size of the rationale when None.

    Returns:
        *dict*: ``auprc`` (B,), the average precision of the scores' ranking of the
        real tokens against the rationale (NaN for an empty rationale), and
        ``token_f1`` (B,), the F1 of the top-k tokens against it.
    """
    real, marked = mask.bool(), rationale.bool() & mask.bool()
    auprc, f1 = [], []
    for row in range(scores.shape[0]):
        positions = real[row].nonzero().flatten()
        order = positions[torch.sort(scores[row, positions].float(), descending=True, stable=True).indices]
        hits = marked[row, order].float()
        total = hits.sum()
        if total == 0:
            auprc.append(math.nan)
        else:
            precision = hits.cumsum(0) / torch.arange(1, len(hits) + 1)
            auprc.append(float((precision * hits).sum() / total))
        size = int(total) if k is None else int(k[row])
        top = hits[:size].sum()
        denominator = size + float(total)
        f1.append(float(2 * top / denominator) if denominator > 0 else math.nan)
    return {"auprc": torch.tensor(auprc), "token_f1": torch.tensor(f1)}
