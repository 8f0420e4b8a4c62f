"""DiffMask checkpoints: what a fitted probe is saved with, and the checks that
keep it from being loaded onto another model."""

from __future__ import annotations

import hashlib
import os
from typing import Any, Dict, Mapping, Optional, Sequence, Union

import torch
from torch import nn

#: The current format; format 1 (no weights fingerprint) still loads.
CHECKPOINT_FORMAT = 2


def model_signature(model: nn.Module) -> str:
    r"""A fingerprint of a model's architecture: its class and parameter shapes."""
    parts = [type(model).__name__] + [f"{name}:{tuple(p.shape)}" for name, p in model.named_parameters()]
    return hashlib.sha1("|".join(parts).encode()).hexdigest()


@torch.no_grad()
def weights_fingerprint(model: nn.Module) -> str:
    r"""A fingerprint of a model's parameter values: per parameter the sum and the
    sum of squares in float64, rounded to 6 significant digits (the same weights on
    another device or in another order of summation give the same text)."""
    parts = []
    for name, p in model.named_parameters():
        values = p.detach().double()
        parts.append(f"{name}:{float(values.sum()):.6g}:{float(values.pow(2).sum()):.6g}")
    return hashlib.sha1("|".join(parts).encode()).hexdigest()


def save_checkpoint(
    path: Union[str, os.PathLike], model: nn.Module, sites: Sequence[Sequence[str]], config: Mapping[str, Any],
    site_sizes: Mapping[str, int], probe: nn.Module, lambdas: nn.Module, fitted_layers: Sequence[int],
    convergence: Optional[Mapping[int, Mapping[str, Any]]] = None,
) -> None:
    r"""
    Writes a fitted probe, its baselines and multipliers with what identifies
    its model: the sites, the parameter shapes and a fingerprint of the weights.

    Args:

        path (str or PathLike): the file to write.
        model (nn.Module): the analysed model.
        sites (sequence): the model's sites as ``SiteLocator.describe()`` gives them.
        config (dict): the explainer's options that shape the probe.
        site_sizes (dict): site name -> H.
        probe (nn.Module): the gate networks and baselines.
        lambdas (nn.Module): the Lagrange multipliers.
        fitted_layers (sequence of int): the layers a fit trained.
        convergence (mapping, optional): layer -> its convergence report (the
                    explainer's ``convergence``: the verdicts a view shows).
    """
    torch.save(
        {
            "format": CHECKPOINT_FORMAT,
            "config": dict(config),
            "site_sizes": dict(site_sizes),
            "sites": [list(s) for s in sites],
            "model_signature": model_signature(model),
            "weights": weights_fingerprint(model),
            "probe": probe.state_dict(),
            "lambdas": lambdas.state_dict(),
            "fitted_layers": list(fitted_layers),
            "convergence": _plain(dict(convergence or {})),
        },
        path,
    )


def _plain(value: Any) -> Any:
    r"""``value`` as the dicts, lists, strings, numbers and None that
    ``torch.load(weights_only=True)`` reads back (tensors and numpy numbers as
    Python numbers)."""
    if isinstance(value, Mapping):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, (str, bool, int, float)) or value is None:
        return value
    if hasattr(value, "item"):
        return value.item()
    return str(value)


def read_checkpoint(path: Union[str, os.PathLike]) -> Dict[str, Any]:
    r"""The checkpoint's contents; ValueError naming ``path`` for a file that is
    missing, truncated, corrupted or not a DiffMask checkpoint."""
    if not os.path.isfile(path):
        raise ValueError(f"path: {path} does not exist")
    try:
        checkpoint = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as error:  # noqa: BLE001 - bytes that are not a checkpoint fail in any of many ways
        raise ValueError(
            f"path: {path} is not a readable DiffMask checkpoint (truncated or corrupted?): "
            f"{type(error).__name__}"
        ) from error
    if not isinstance(checkpoint, dict) or checkpoint.get("format") not in (1, CHECKPOINT_FORMAT):
        raise ValueError(f"path: {path} is not a DiffMask checkpoint")
    return checkpoint


def check_model(checkpoint: Dict[str, Any], model: nn.Module, sites: Sequence[Sequence[str]], check_weights: bool) -> None:
    r"""Refuses a checkpoint fitted on another model than ``model`` (whose sites
    are ``sites``, as ``SiteLocator.describe()`` gives them): other sites, other
    parameter shapes, or (``check_weights``) other parameter values."""
    saved_sites = [tuple(s) for s in checkpoint["sites"]]
    sites = [tuple(s) for s in sites]
    if saved_sites != sites:
        raise ValueError(f"model: the checkpoint was fitted on a model with sites {saved_sites}, "
                         f"this model has {sites}")
    if checkpoint["model_signature"] != model_signature(model):
        raise ValueError("model: the checkpoint was fitted on another model (its parameter shapes differ from "
                         f"those of this {type(model).__name__})")
    saved = checkpoint.get("weights")
    if check_weights and saved is not None and saved != weights_fingerprint(model):
        raise ValueError("model: the checkpoint was fitted on a model with other weights (same architecture, "
                         "other parameter values); pass check_weights=False to load it anyway")
