"""DiffMask checkpoints: what a fitted probe is saved with, and the checks that
keep it from being loaded onto another model."""

from __future__ import annotations

import hashlib
import os
import pickle
import zipfile
from typing import TYPE_CHECKING, Any, Dict, Union

import torch
from torch import nn

if TYPE_CHECKING:  # pragma: no cover
    from .diffmask import DiffMask

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


def save_checkpoint(explainer: "DiffMask", path: Union[str, os.PathLike]) -> None:
    r"""Writes ``explainer``'s probe, baselines and multipliers with what identifies
    its model: the sites, the parameter shapes and a fingerprint of the weights."""
    assert explainer.probe is not None and explainer.lambdas is not None
    torch.save(
        {
            "format": CHECKPOINT_FORMAT,
            "config": explainer._config(),
            "site_sizes": dict(explainer.site_sizes),
            "sites": [list(s) for s in explainer.locator.describe()],
            "model_signature": model_signature(explainer.model),
            "weights": weights_fingerprint(explainer.model),
            "probe": explainer.probe.state_dict(),
            "lambdas": explainer.lambdas.state_dict(),
            "fitted_layers": list(explainer.fitted_layers),
        },
        path,
    )


def read_checkpoint(path: Union[str, os.PathLike]) -> Dict[str, Any]:
    r"""The checkpoint's contents; ValueError naming ``path`` for a file that is
    missing, truncated, corrupted or not a DiffMask checkpoint."""
    if not os.path.isfile(path):
        raise ValueError(f"path: {path} does not exist")
    try:
        checkpoint = torch.load(path, map_location="cpu", weights_only=True)
    except (RuntimeError, OSError, EOFError, pickle.UnpicklingError, zipfile.BadZipFile, ValueError) as error:
        raise ValueError(
            f"path: {path} is not a readable DiffMask checkpoint (truncated or corrupted?): "
            f"{type(error).__name__}"
        ) from error
    if not isinstance(checkpoint, dict) or checkpoint.get("format") not in (1, CHECKPOINT_FORMAT):
        raise ValueError(f"path: {path} is not a DiffMask checkpoint")
    return checkpoint


def check_model(checkpoint: Dict[str, Any], explainer: "DiffMask", check_weights: bool) -> None:
    r"""Refuses a checkpoint fitted on another model: other sites, other parameter
    shapes, or (``check_weights``) other parameter values."""
    saved_sites = [tuple(s) for s in checkpoint["sites"]]
    if saved_sites != explainer.locator.describe():
        raise ValueError(f"model: the checkpoint was fitted on a model with sites {saved_sites}, "
                         f"this model has {explainer.locator.describe()}")
    if checkpoint["model_signature"] != model_signature(explainer.model):
        raise ValueError("model: the checkpoint was fitted on another model (its parameter shapes differ from "
                         f"those of this {type(explainer.model).__name__})")
    saved = checkpoint.get("weights")
    if check_weights and saved is not None and saved != weights_fingerprint(explainer.model):
        raise ValueError("model: the checkpoint was fitted on a model with other weights (same architecture, "
                         "other parameter values); pass check_weights=False to load it anyway")
