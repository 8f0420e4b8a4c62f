"""The authors' checkpoint rule: the probe of the sparsest epoch that keeps a
bound on held-out batches (``DiffMask.fit(validation=...)``)."""

from __future__ import annotations

import copy
import time
import warnings
from typing import Any, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

from captum_diffmask.diffmask.fit.fittable import Fittable
from captum_diffmask.model.forward import Batch


class CheckpointSelection:
    r"""
    The authors' checkpoint rule: after every epoch the probe is scored on held-out
    batches with deterministic gates, and the probe of the sparsest epoch (the
    smallest mean kept share over the layers) whose every trained layer keeps
    KL <= ``bound`` and agreement >= ``agreement`` is restored at the
    end.

    Args:

        validation (iterable): the held-out batches.
        layers (sequence of int): the trained layers.
        bound (float): the largest KL (nats) a selected epoch keeps at every
                    layer (the fit's ``eps_valid``, else its constraint's eps).
        agreement (float, optional): the least share of examples whose masked
                    argmax is the original one. Default: 0.0
    """

    def __init__(self, validation: Iterable[Batch], layers: Sequence[int], bound: float,
                 agreement: float = 0.0) -> None:
        self.validation = validation
        self.layers = sorted(set(layers))
        self.bound = float(bound)
        self.agreement = float(agreement)
        self.best: Optional[Tuple[float, int, Dict[str, Any]]] = None  # (mean kept, epoch, state)

    def after_epoch(self, explainer: Fittable, epoch: int, rows: List[Dict[str, Any]]) -> None:
        r"""Scores the probe into ``rows`` and keeps its state if it is the best yet."""
        start = time.perf_counter()
        scores = explainer.evaluate(self.validation, self.layers, "threshold")
        seconds = time.perf_counter() - start
        for row in rows:
            row.update({f"valid_{key}": value for key, value in scores[row["layer"]].items()})
            row["valid_seconds"] = seconds
        keeps = all(v["kl"] <= self.bound and v["agreement"] >= self.agreement for v in scores.values())
        sparsity = sum(v["l0"] for v in scores.values()) / len(scores)
        if keeps and (self.best is None or sparsity < self.best[0]):
            self.best = (sparsity, epoch, _state(explainer))

    def restore(self, explainer: Fittable, history: List[Dict[str, Any]]) -> None:
        r"""Restores the best epoch's probe (or warns that none kept the bound)
        and marks its rows ``selected``."""
        if self.best is None:
            warnings.warn(
                f"DiffMask.fit: no epoch kept KL <= {self.bound} and agreement >= {self.agreement} "
                "on the validation batches at every layer; the last epoch's probe is kept",
                stacklevel=4,
            )
        else:
            _load_state(explainer, self.best[2])
        chosen = history[-1]["epoch"] if self.best is None else self.best[1]
        for row in history:
            row["selected"] = row["epoch"] == chosen


def _state(explainer: Fittable) -> Dict[str, Any]:
    assert explainer.probe is not None and explainer.lambdas is not None
    return copy.deepcopy({"probe": explainer.probe.state_dict(), "lambdas": explainer.lambdas.state_dict()})


def _load_state(explainer: Fittable, state: Mapping[str, Any]) -> None:
    assert explainer.probe is not None and explainer.lambdas is not None
    explainer.probe.load_state_dict(state["probe"])
    explainer.lambdas.load_state_dict(state["lambdas"])
