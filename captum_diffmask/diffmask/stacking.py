"""Several masked passes of one batch run as one pass over the batch repeated.

A fit step trains every layer on the same batch, and each layer's gates need a
pass of the model with its site replaced. The model is frozen, so those passes
differ only in what is put in place of the sites: stacked along the batch (the
ids repeated once per pass, as Captum repeats a batch for Integrated
Gradients), pass i's replacement goes into rows ``i * B .. (i + 1) * B`` of its
site and the model runs once. The arithmetic is the same; a device whose pass
costs its kernel launches (a GPU) saves most of the launches, a CPU what larger
matrix products gain (input mode on MiniLM: one pass per layer takes 1.17x the
stacked step, ``docs/results/stacking-speed.md``).
"""

from __future__ import annotations

import contextlib
import dataclasses
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, TYPE_CHECKING

import torch
from torch import Tensor

from captum_diffmask.model.arguments import PreparedCall
from captum_diffmask.model.sites import Replacement

if TYPE_CHECKING:  # the gates only describe the replacement; no import at run time
    from captum_diffmask.diffmask.gates import Gates

#: ``replaced_logits(call, replacements) -> logits``, as
#: :meth:`~captum_diffmask.model.attribution.SiteAttribution.replaced_logits`.
ReplacedLogits = Callable[[PreparedCall, Mapping[str, Replacement]], Tensor]


def repeated_call(call: PreparedCall, times: int) -> PreparedCall:
    r"""
    ``call`` with its batch repeated ``times`` along dim 0: the ids, the mask and
    every tensor of ``extra`` whose first dimension is the batch (an attention
    mask, token type ids); the capture pass's records stay, so that
    :meth:`~captum_diffmask.model.attribution.SiteAttribution.replaced_logits` still
    re-runs only the blocks after the first replaced site.

    Args:

        call (PreparedCall): the batch's call, (B, T) ids.
        times (int): the number of copies, >= 1.

    Returns:
        *PreparedCall* with (times * B, T) ids.
    """
    batch = call.ids.shape[0]

    def repeat(value: Any) -> Any:
        if isinstance(value, Tensor) and value.dim() > 0 and value.shape[0] == batch:
            return torch.cat([value] * times)
        return value

    return dataclasses.replace(call, ids=repeat(call.ids), mask=repeat(call.mask),
                               extra=tuple(repeat(value) for value in call.extra))


def stacked_replacements(per_pass: Sequence[Mapping[str, Tensor]], batch: int) -> Dict[str, Replacement]:
    r"""
    The replacements of several passes as those of one stacked pass.

    Args:

        per_pass (sequence of dict): each pass's ``site -> (B, T, H)`` replacement.
        batch (int): B.

    Returns:
        *dict* ``site -> replacement`` for the (len(per_pass) * B, T, H) pass: a
        site every pass replaces gets the passes' tensors concatenated; one that
        only some replace, a function that puts theirs in their rows and leaves
        the others' rows as the pass computed them.
    """
    sites: Dict[str, Dict[int, Tensor]] = {}
    for index, replacements in enumerate(per_pass):
        for site, value in replacements.items():
            sites.setdefault(site, {})[index] = value
    stacked: Dict[str, Replacement] = {}
    for site, rows in sites.items():
        if len(rows) == len(per_pass):
            stacked[site] = torch.cat([rows[i] for i in range(len(per_pass))])
        else:
            stacked[site] = _rows_replaced(rows, batch)
    return stacked


def _rows_replaced(rows: Mapping[int, Tensor], batch: int) -> Callable[[Tensor], Tensor]:
    def substitute(activation: Tensor) -> Tensor:
        chunks = list(activation.split(batch))
        for index, value in rows.items():
            chunks[index] = value
        return torch.cat(chunks)

    return substitute


def stacked_logits(
    replaced_logits: ReplacedLogits, call: PreparedCall, per_pass: Sequence[Mapping[str, Tensor]]
) -> List[Tensor]:
    r"""
    The logits of several masked passes of one batch, computed as one pass.

    Args:

        replaced_logits (callable): ``(call, replacements) -> logits``, the
                    explainer's :meth:`~captum_diffmask.model.attribution.SiteAttribution.replaced_logits`.
        call (PreparedCall): the batch's call, (B, T) ids, after its capture pass.
        per_pass (sequence of dict): each pass's ``site -> (B, T, H)`` replacement
                    (no pass may need a context of its own: component gates do).

    Returns:
        *list* of each pass's logits, (B, C) or (B, K, C), in the order of ``per_pass``;
        gradients flow into every replacement.
    """
    if not per_pass:
        return []
    if len(per_pass) == 1:
        return [replaced_logits(call, per_pass[0])]
    batch = call.ids.shape[0]
    logits = replaced_logits(repeated_call(call, len(per_pass)), stacked_replacements(per_pass, batch))
    return list(logits.split(batch))


def masked_logits(
    read_out: "Gates", replaced_logits: ReplacedLogits, call: PreparedCall, states: Dict[str, Tensor],
    gates: Mapping[int, Tensor], baseline: Optional[Callable[[int], Tensor]] = None,
) -> Dict[int, Tensor]:
    r"""
    Per layer, the logits with its site replaced under its gates; the layers'
    passes run as one (:func:`stacked_logits`).

    Args:

        read_out (Gates): the probe's gates (:meth:`Gates.replacement` says what
                    each layer's gates change).
        replaced_logits (callable): as in :func:`stacked_logits`.
        call (PreparedCall): the batch's call, after its capture pass.
        states (dict): that pass's activations.
        gates (dict): ``layer -> (B, T)`` gates ((B, count) in the component
                    modes); several layers only where :meth:`Gates.pass_groups`
                    put them together (a component mode's gates need a context
                    of their own, so they come one layer at a time).
        baseline (callable, optional): ``layer -> `` what closed gates mix in;
                    the learned baseline when None. Default: None

    Returns:
        *dict* ``layer -> logits`` (B, C) or (B, K, C).
    """
    changes = {k: read_out.replacement(states, g, k, None if baseline is None else baseline(k)) for k, g in gates.items()}
    if len(changes) == 1:
        (layer, (replaced, context)), = changes.items()
        with context:
            return {layer: replaced_logits(call, replaced)}
    if any(not isinstance(context, contextlib.nullcontext) for _, context in changes.values()):
        raise ValueError(f"layers {sorted(changes)}: gates that need a context of their own cannot share a pass")
    logits = stacked_logits(replaced_logits, call, [replaced for replaced, _ in changes.values()])
    return dict(zip(changes, logits))
