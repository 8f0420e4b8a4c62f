"""What a finished fit leaves beside its probe: its options, how far it went and
on how much data, as plain values (the record a saved probe carries and its
model card states)."""

from __future__ import annotations

import dataclasses
from typing import Any, Dict, Iterable, Mapping

from captum_diffmask.diffmask.fit.fit_state import FitState
from captum_diffmask.diffmask.fit.options import FitOptions
from captum_diffmask.model.json_values import json_values


def data_size(dataloader: Iterable[Any]) -> Dict[str, Any]:
    r"""The batches of one pass over ``dataloader`` and the examples in them,
    where they can be counted without a pass (a sequence of batches; None
    otherwise)."""
    if not isinstance(dataloader, (list, tuple)):
        return {"batches_per_epoch": len(dataloader) if hasattr(dataloader, "__len__") else None,
                "examples_per_epoch": None}
    examples = 0
    for batch in dataloader:
        first = next(iter(batch.values())) if isinstance(batch, Mapping) else \
            batch[0] if isinstance(batch, (list, tuple)) else batch
        examples += int(first.shape[0]) if hasattr(first, "shape") else 0
    return {"batches_per_epoch": len(dataloader), "examples_per_epoch": examples or None}


def fit_record(options: FitOptions, state: FitState, data: Mapping[str, Any]) -> Dict[str, Any]:
    r"""
    The record of a finished fit.

    Args:

        options (FitOptions): its options.
        state (FitState): its state at the end.
        data (dict): :func:`data_size` of its data.

    Returns:
        *dict* (JSON-ready): ``options`` (``validation`` and ``checkpoint`` as
        whether they were given), ``steps``, ``epochs``, ``ended`` (what ended
        the loop) and the data's ``batches_per_epoch`` and ``examples_per_epoch``.
    """
    values = {field.name: getattr(options, field.name) for field in dataclasses.fields(options)}
    values["validation"] = options.validation is not None
    values["checkpoint"] = options.checkpoint is not None
    for group in ("convergence", "compute", "optimization"):
        values[group] = dataclasses.asdict(values[group])
    return {"options": json_values(values), "steps": state.step, "epochs": state.epoch, "ended": state.ended,
            **json_values(dict(data))}
