"""Exact erasure search: the smallest set of tokens whose states keep the prediction.

The reference the paper measures erasure-based attributions against: for one
example, every subset of its real positions is a candidate "keep" set; the
states of all other real positions at the site are replaced by a fixed baseline
and the model is run. The answer is a smallest subset for which the predicted
class does not change. The search is exhaustive by increasing size, so its cost
grows as ``sum_{j <= k} C(n, j)`` for n real tokens and a minimal size k, which
limits it to short inputs or small k.
"""

from __future__ import annotations

import itertools
import math
import warnings
from dataclasses import dataclass, replace as _replace_fields
from typing import Any, Iterator, List, Optional, Sequence, Tuple, Union

import torch
from torch import nn, Tensor
from tqdm.auto import tqdm

from captum_diffmask.methods.registry import register_method
from captum_diffmask.model.arguments import (
    BaselineType, ForwardFunc, InputType, PaddingMaskArg, PreparedCall, resolve_target, TargetType,
)
from captum_diffmask.model.attribution import attribution_call, ReplacingAttribution, SitesType
from captum_diffmask.model.checks import check_positive_int
from captum_diffmask.model.divergences import log_probs
from captum_diffmask.model.forward import frozen
from captum_diffmask.model.rng import preserved_rng


@dataclass
class ErasureResult:
    r"""
    The outcome of :meth:`ExactErasure.search` for a batch of B examples.

    Attributes:
        masks (Tensor): (B, T) float, 1 at the kept positions of one minimal subset
                    (the first in lexicographic order of positions), 0 elsewhere and
                    at padding; all 0 for an unsolved example.
        size (Tensor): (B,) long, the minimal number of kept tokens; -1 when the
                    example was not solved within the budget.
        solved (Tensor): (B,) bool, False when the budget ran out first.
        num_evaluations (Tensor): (B,) long, masks (model evaluations) spent on
                    each example.
        all_masks (list of Tensor, optional): with ``all_solutions=True``, per
                    example a (K_i, T) float tensor holding every minimal subset
                    found, in lexicographic order ((0, T) when unsolved); else None.
        complete (Tensor, optional): with ``all_solutions=True``, (B,) bool: every
                    subset of the minimal size was evaluated, so ``all_masks`` holds
                    all minimal subsets (False when the budget ran out inside that
                    size, or the example is unsolved); else None.
    """

    masks: Tensor
    size: Tensor
    solved: Tensor
    num_evaluations: Tensor
    all_masks: Optional[List[Tensor]] = None
    complete: Optional[Tensor] = None


class _ExampleSearch:
    r"""The enumeration state of one example: subsets of its real positions by
    increasing size, lexicographic within a size."""

    def __init__(self, positions: Sequence[int], budget: int, all_solutions: bool) -> None:
        self.positions = list(positions)
        self.budget = budget
        self.all_solutions = all_solutions
        self.size = 0
        self.combos: Iterator[Tuple[int, ...]] = iter([()])
        self.remaining_at_size = 1  # C(n, size) not yet handed out
        self.spent = 0
        self.solutions: List[Tuple[int, ...]] = []
        self.solved_size: Optional[int] = None
        self.done = False
        self.complete = False

    def take(self, limit: int) -> List[Tuple[int, ...]]:
        r"""Up to ``limit`` next subsets, all of the current size (a batch never
        mixes sizes of one example, so a solution is known minimal before the
        next size is started)."""
        if self.done:
            return []
        if self.remaining_at_size == 0:
            self._next_size()
            if self.done:
                return []
        count = min(limit, self.remaining_at_size, self.budget - self.spent)
        batch = list(itertools.islice(self.combos, count))
        self.remaining_at_size -= len(batch)
        self.spent += len(batch)
        return batch

    def _next_size(self) -> None:
        if self.size >= len(self.positions):  # even keeping everything failed
            self.done = True
            return
        self.size += 1
        self.combos = itertools.combinations(self.positions, self.size)
        self.remaining_at_size = math.comb(len(self.positions), self.size)

    def report(self, subsets: List[Tuple[int, ...]], kept: List[bool]) -> None:
        r"""Records the outcome of subsets handed out by :meth:`take`, in order."""
        for subset, ok in zip(subsets, kept):
            if ok:
                self.solutions.append(subset)
                if not self.all_solutions:
                    break
        if self.solutions:
            self.solved_size = self.size
            if not self.all_solutions or self.remaining_at_size == 0:
                self.done = True
                self.complete = self.remaining_at_size == 0
                return
        if self.spent >= self.budget:
            self.done = True


@register_method
class ExactErasure(ReplacingAttribution):
    r"""
    Exact erasure search at a site: the smallest set of real tokens whose states
    must be kept for the model's prediction to stay the same when the states of
    all other real tokens are replaced by a fixed baseline.

    Objective: ``min |S|`` over subsets S of the real positions such that
    ``argmax log_probs(f(h_S)) == argmax log_probs(f(h))`` (or ``== target``),
    where ``h_S`` keeps ``h_t`` for t in S and at padding and puts the baseline
    ``b`` elsewhere. Subsets are enumerated by increasing size k = 0, 1, 2, ...,
    lexicographically within a size, and each example stops at the first size
    with a solution. The empty set is a candidate: an example whose prediction
    survives erasing every token has size 0.

    Readout: the 0/1 mask of one minimal subset (the lexicographically first), 1
    = kept. :meth:`search` also gives the size, whether the search finished within
    the budget, the cost, and optionally every minimal subset.

    Cost: ``sum_{j=0}^{k} C(n, j)`` model evaluations for n real tokens and a
    minimal size k (with ``all_solutions=False`` it stops at the first solution of
    size k), at most ``budget`` per example, ``eval_batch_size`` evaluations per
    forward pass, batched across the examples.

    Args:

        model, sites, forward_func, padding_mask_arg, output, baselines: the analysed
                    model, how to call it and the state that replaces erased tokens,
                    as in :class:`~captum_diffmask.model.attribution.ReplacingAttribution`.
                    None (zeros) erases as the authors' exact search did; a vector
                    (H,) such as a fitted DiffMask's learned baseline
                    (``dm.learned_baseline(k)``: the input's at depth k, or
                    ``hidden.k``'s) makes the search the exact counterpart of
                    DiffMask's objective. Default: None
        budget (int, optional): the most masks evaluated per example; an example
                    not solved within it is reported unsolved. Default: 20000
        eval_batch_size (int, optional): masks per forward pass (across
                    examples). Default: 256
        verbose (bool, optional): show a tqdm progress bar. Default: True
    """

    summary = "smallest kept subset that keeps the prediction (exhaustive)"
    scores_are_probabilities = True  # a 0/1 mask

    def __init__(
        self, model: nn.Module, sites: SitesType = None, forward_func: ForwardFunc = None,
        padding_mask_arg: PaddingMaskArg = "auto", output: str = "auto",
        baselines: BaselineType = None,
        budget: int = 20_000,
        eval_batch_size: int = 256,
        verbose: bool = True,
    ) -> None:
        super().__init__(model, sites, forward_func, padding_mask_arg, output, baselines)
        self.budget = budget
        self.eval_batch_size = eval_batch_size
        self.verbose = verbose
        self._check_options()

    def _check_options(self) -> None:
        check_positive_int(self.budget, "budget")
        check_positive_int(self.eval_batch_size, "eval_batch_size")

    @attribution_call
    def attribute(  # type: ignore[override]
        self, inputs: InputType, target: TargetType = None, additional_forward_args: Any = None,
        layer: int = 0,
        *,
        baselines: BaselineType = None,
    ) -> Union[Tensor, Tuple[Tensor]]:
        r"""
        Searches, per example, a smallest set of tokens that keeps the
        prediction with the rest replaced (see :meth:`search`), and returns one.

        Args:

            inputs, additional_forward_args, layer: as for every method
                        (:class:`~captum_diffmask.model.attribution.SiteAttribution`).
            target (int, list or Tensor, optional): for (B, C) logits the class
                        that must stay the argmax; None = the predicted class (the
                        prediction must be unchanged). Must be None for one binary
                        logit. Default: None
            baselines (float or Tensor, optional): this call's reference state
                        (the constructor's when None). Default: None

        Returns:
            *Tensor* (B, T) 0/1 float: one minimal kept subset per example (1 =
            kept), 0 at padding; all 0 for examples not solved within the budget,
            about which a warning is emitted.
        """
        call = self._prepare(inputs, additional_forward_args, layer)
        result = self._search(call, target, all_solutions=False, baselines=baselines)
        unsolved = int((~result.solved).sum())
        if unsolved:
            warnings.warn(
                f"ExactErasure: {unsolved} of {len(result.solved)} examples not solved within "
                f"budget={self.budget} evaluations; their masks are all 0",
                stacklevel=2,
            )
        return self._finish(result.masks, call)

    def search(
        self,
        inputs: Union[Tensor, Tuple[Tensor]],
        additional_forward_args: Any = None,
        layer: int = 0,
        all_solutions: bool = False,
        target: TargetType = None,
        baselines: BaselineType = None,
    ) -> ErasureResult:
        r"""
        Runs the search and returns everything it found.

        Args:

            inputs, additional_forward_args, layer: as for every method
                        (:class:`~captum_diffmask.model.attribution.SiteAttribution`).
            all_solutions (bool, optional): enumerate the whole minimal size and
                        return every minimal subset in ``all_masks``. Default: False
            target (optional): as in :meth:`attribute`. Default: None
            baselines (optional): as in :meth:`attribute`. Default: None

        Returns:
            :class:`ErasureResult`.
        """
        call = self._prepare(inputs, additional_forward_args, layer)
        with preserved_rng():
            return self._search(call, target, all_solutions=bool(all_solutions), baselines=baselines)

    # ------------------------------------------------------------------ search
    def _search(
        self, call: PreparedCall, target: TargetType, all_solutions: bool, baselines: BaselineType
    ) -> ErasureResult:
        self._check_options()
        states, logits = self.capture(call)
        assert logits is not None
        state = states[call.site].detach()
        baseline = self.baseline_for(call, state, baselines)
        explicit = resolve_target(logits, target)  # also validates target
        wanted = log_probs(logits).argmax(-1) if explicit is None else explicit

        searches = [
            _ExampleSearch(torch.nonzero(call.mask[i]).flatten().tolist(), self.budget, all_solutions)
            for i in range(call.ids.shape[0])
        ]
        with frozen(self.model), torch.no_grad(), tqdm(
            desc="exact erasure", unit="mask", disable=None if self.verbose else True, leave=False
        ) as progress:
            while True:
                examples, subsets, spans = self._next_batch(searches)
                if not subsets:
                    break
                kept = self._evaluate(call, state, baseline, wanted, examples, subsets, call.ids.shape[1])
                for i, start, stop in spans:
                    searches[i].report(subsets[start:stop], kept[start:stop])
                progress.update(len(subsets))
        return _result(searches, call.ids.shape[1], all_solutions, call.ids.device)

    def _next_batch(
        self, searches: Sequence[_ExampleSearch]
    ) -> Tuple[List[int], List[Tuple[int, ...]], List[Tuple[int, int, int]]]:
        r"""Up to ``eval_batch_size`` next candidate subsets across the examples:
        their example, the subsets, and each example's (example, start, stop)."""
        examples: List[int] = []
        subsets: List[Tuple[int, ...]] = []
        spans: List[Tuple[int, int, int]] = []
        for i, example in enumerate(searches):
            room = self.eval_batch_size - len(subsets)
            if room <= 0:
                break
            taken = example.take(room)
            if taken:
                spans.append((i, len(subsets), len(subsets) + len(taken)))
                subsets.extend(taken)
                examples.extend([i] * len(taken))
        return examples, subsets, spans

    def _evaluate(
        self,
        call: PreparedCall,
        state: Tensor,
        baseline: Tensor,
        wanted: Tensor,
        examples: List[int],
        subsets: List[Tuple[int, ...]],
        length: int,
    ) -> List[bool]:
        r"""Runs the model once on the candidate masks; True where the target
        class stays the argmax."""
        device = state.device
        index = torch.tensor(examples, dtype=torch.long, device=device)
        keep = torch.zeros(len(subsets), length, dtype=torch.bool)
        rows = [r for r, subset in enumerate(subsets) for _ in subset]
        cols = [c for subset in subsets for c in subset]
        if rows:
            keep[rows, cols] = True
        keep = keep.to(device) | ~call.mask[index]  # padding is never erased
        masked = torch.where(keep.unsqueeze(-1), state[index], baseline[index])
        batch = call.ids.shape[0]
        extra = tuple(
            a[index] if isinstance(a, Tensor) and a.dim() >= 1 and a.shape[0] == batch else a
            for a in call.extra
        )
        sub_call = _replace_fields(call, ids=call.ids[index], extra=extra, mask=call.mask[index])
        logits = self.replaced_logits(sub_call, {call.site: masked})
        same = log_probs(logits).argmax(-1) == wanted[index]
        return same.reshape(same.shape[0], -1).all(-1).tolist()


def _result(searches: Sequence[_ExampleSearch], length: int, all_solutions: bool, device: torch.device) -> ErasureResult:
    r"""The searches' outcome as tensors (see :class:`ErasureResult`)."""
    batch = len(searches)
    masks = torch.zeros(batch, length, device=device)
    size = torch.full((batch,), -1, dtype=torch.long, device=device)
    solved = torch.zeros(batch, dtype=torch.bool, device=device)
    for i, example in enumerate(searches):
        if example.solutions:
            masks[i, list(example.solutions[0])] = 1.0
            size[i] = example.solved_size
            solved[i] = True
    all_masks = complete = None
    if all_solutions:
        all_masks = []
        for example in searches:
            rows = torch.zeros(len(example.solutions), length, device=device)
            for row, subset in enumerate(example.solutions):
                rows[row, list(subset)] = 1.0
            all_masks.append(rows)
        complete = torch.tensor([e.complete for e in searches], dtype=torch.bool, device=device)
    spent = torch.tensor([e.spent for e in searches], dtype=torch.long, device=device)
    return ErasureResult(masks, size, solved, spent, all_masks, complete)
