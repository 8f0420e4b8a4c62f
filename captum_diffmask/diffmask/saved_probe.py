"""DiffMask checkpoints: what a fitted probe is saved with, and the checks that
keep it from being loaded onto another model."""

from __future__ import annotations

import hashlib
import os
from typing import Any, Dict, Mapping, Sequence, Union

import torch
from torch import nn

from captum_diffmask.model.fingerprint import weights_fingerprint
from captum_diffmask.model.json_values import json_values

#: The current format; format 1 (no weights fingerprint) still loads.
CHECKPOINT_FORMAT = 2


def model_signature(model: nn.Module) -> str:
    r"""A fingerprint of a model's architecture: its class and parameter shapes."""
    parts = [type(model).__name__] + [f"{name}:{tuple(p.shape)}" for name, p in model.named_parameters()]
    return hashlib.sha1("|".join(parts).encode()).hexdigest()


@torch.no_grad()
def checkpoint_contents(explainer: Any) -> Dict[str, Any]:
    r"""
    What a saved probe holds: the probe, baselines and multipliers with what
    identifies its model (the sites, the parameter shapes and a fingerprint of
    the weights), the explainer's options that shape the probe, the layers a
    fit trained, each layer's convergence report and the fit's record.

    Args:

        explainer (DiffMask): a fitted explainer.

    Returns:
        *dict*: tensors under ``probe`` and ``lambdas`` (``state_dict``\ s), plain
        values under every other key.
    """
    return {
        "format": CHECKPOINT_FORMAT,
        "config": dict(explainer.config()),
        "site_sizes": dict(explainer.site_sizes),
        "sites": [list(s) for s in explainer.locator.describe()],
        "model_signature": model_signature(explainer.model),
        "weights": weights_fingerprint(explainer.model),
        "probe": explainer.probe.state_dict(),
        "lambdas": explainer.lambdas.state_dict(),
        "fitted_layers": list(explainer.fitted_layers),
        "convergence": json_values(dict(explainer.convergence)),
        "fit_record": json_values(dict(explainer.fit_record)),
    }


def save_checkpoint(path: Union[str, os.PathLike], contents: Mapping[str, Any]) -> None:
    r"""Writes :func:`checkpoint_contents` to one file ``path`` (torch's format,
    read back with ``weights_only=True``)."""
    torch.save(dict(contents), path)


def explainer_from(cls: Any, checkpoint: Mapping[str, Any], model: nn.Module, check_weights: bool,
                   **options: Any) -> Any:
    r"""
    The explainer a checkpoint's contents describe, for ``model``.

    Args:

        cls (type): :class:`~captum_diffmask.DiffMask` (or a subclass).
        checkpoint (mapping): :func:`checkpoint_contents`, as read back.
        model (nn.Module): the analysed model; must be the one it was fitted on.
        check_weights (bool): refuse other parameter values (:func:`check_model`).
        **options: the constructor's other arguments (``sites``, ...).

    Returns:
        the explainer, fitted.
    """
    config = dict(checkpoint["config"])
    config["stretch"] = tuple(config["stretch"])
    config.setdefault("votes", "tied")  # written before per-depth votes existed
    explainer = cls(model, **options, **config)
    check_model(checkpoint, explainer.model, explainer.locator.describe(), check_weights)
    explainer.restore_probe(checkpoint["site_sizes"], checkpoint["probe"], checkpoint["lambdas"])
    # written before fitted layers were recorded: every layer, as then
    explainer.fitted_layers = list(checkpoint.get("fitted_layers", range(explainer.num_layers + 1)))
    explainer.convergence = {int(k): dict(v) for k, v in checkpoint.get("convergence", {}).items()}
    explainer.fit_record = dict(checkpoint.get("fit_record", {}))
    return explainer


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
