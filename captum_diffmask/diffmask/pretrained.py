"""Probes saved the way models are shared: a directory with the weights in
safetensors, the configuration and the fit's record in JSON, and a model card.

``DiffMask.save_pretrained(directory)`` writes it; ``DiffMask.from_pretrained(
directory, model)`` reads it back. Reading it runs no code (no pickle: tensors
from safetensors, everything else from JSON), and a directory written for
another model, or for the same architecture with other weights, is refused by
name (:func:`~captum_diffmask.diffmask.saved_probe.check_model`).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Dict, List, Mapping, Union

from safetensors import SafetensorError
from safetensors.torch import load_file, save_file
from torch import nn

from captum_diffmask.diffmask.constrained.convergence import SETTLED
from captum_diffmask.diffmask.fit.distributed import is_main_process
from captum_diffmask.diffmask.saved_probe import checkpoint_contents, explainer_from

PathLike = Union[str, "os.PathLike[str]"]
#: The files of a saved directory, and all of them.
WEIGHTS, CONFIG, RECORD, CARD = "probe.safetensors", "config.json", "fit_record.json", "README.md"
_TENSORS = ("probe", "lambdas")


def write_directory(directory: PathLike, contents: Mapping[str, Any], model: Mapping[str, Any]) -> None:
    r"""
    Writes a saved probe's contents as a directory.

    Args:

        directory (str or PathLike): created if missing; its files are replaced.
        contents (mapping): :func:`~captum_diffmask.diffmask.saved_probe.checkpoint_contents`.
        model (mapping): the explained model's ``class`` and ``name`` (its
                    ``config.name_or_path``, or None), for the model card.
    """
    folder = Path(directory)
    folder.mkdir(parents=True, exist_ok=True)
    tensors = {f"{group}.{name}": value.detach().cpu().contiguous().clone()
               for group in _TENSORS for name, value in contents[group].items()}
    save_file(tensors, str(folder / WEIGHTS), metadata={"format": "captum_diffmask probe"})
    config = {key: value for key, value in contents.items() if key not in _TENSORS + ("convergence", "fit_record")}
    config["model_class"], config["model_name"] = model["class"], model.get("name")
    (folder / CONFIG).write_text(json.dumps(config, indent=1), encoding="utf-8")
    record = {"convergence": contents["convergence"], "fit": contents["fit_record"]}
    (folder / RECORD).write_text(json.dumps(record, indent=1), encoding="utf-8")
    (folder / CARD).write_text(model_card(config, record), encoding="utf-8")


def read_directory(directory: PathLike) -> Dict[str, Any]:
    r"""
    A saved directory's contents, as :func:`write_directory` took them.

    Raises:
        ValueError naming ``directory`` and the file: missing, unreadable, or not
        a saved probe.
    """
    folder = Path(directory)
    if not folder.is_dir():
        raise ValueError(f"directory: {directory} is not a directory")
    contents: Dict[str, Any] = {}
    for name in (CONFIG, RECORD):
        try:
            contents[name] = json.loads((folder / name).read_text(encoding="utf-8"))
        except (OSError, ValueError) as error:
            raise ValueError(f"directory: {folder / name} is missing or not JSON ({type(error).__name__}); "
                             "save_pretrained writes it") from error
    try:
        tensors = load_file(str(folder / WEIGHTS))
    except (OSError, SafetensorError) as error:
        raise ValueError(f"directory: {folder / WEIGHTS} is missing or not a safetensors file "
                         f"({type(error).__name__}); save_pretrained writes it") from error
    checkpoint = dict(contents[CONFIG])
    if "model_signature" not in checkpoint or "config" not in checkpoint:
        raise ValueError(f"directory: {folder / CONFIG} is not a saved DiffMask probe's configuration")
    for group in _TENSORS:
        checkpoint[group] = {name.split(".", 1)[1]: value for name, value in tensors.items()
                             if name.startswith(group + ".")}
    checkpoint["convergence"] = contents[RECORD].get("convergence", {})
    checkpoint["fit_record"] = contents[RECORD].get("fit", {})
    return checkpoint


def model_card(config: Mapping[str, Any], record: Mapping[str, Any]) -> str:
    r"""The directory's README: what model the probe explains, how to load it,
    how it was fitted, and each layer's verdict with its figures."""
    fit = record.get("fit") or {}
    options = fit.get("options") or {}
    convergence = record.get("convergence") or {}
    settled = sum(report.get("status") in SETTLED for report in convergence.values())
    named = f" (`{config['model_name']}`)" if config.get("model_name") else ""
    lines = [f"# DiffMask probe for a `{config['model_class']}`{named}", "",
             f"A fitted DiffMask probe (`captum_diffmask`, {config['config']['mode']} mode; {settled} of "
             f"{len(convergence)} layers settled) that explains a "
             f"`{config['model_class']}`{named} with weights fingerprint `{config['weights']}` (its architecture: "
             f"`{config['model_signature']}`). Loading it for a model with other sites, shapes or weights is "
             "refused.", "", "```python", "from captum_diffmask import DiffMask", "",
             "dm = DiffMask.from_pretrained(\"THIS_DIRECTORY\", model)  # the model it was fitted on",
             "scores = dm.attribute(input_ids, additional_forward_args=(attention_mask,), layer=None)", "```", "",
             "## How it was fitted", ""]
    if fit:
        data = ", ".join(f"{value} {name.replace('_', ' ')}" for name, value in fit.items()
                         if name in ("batches_per_epoch", "examples_per_epoch") and value is not None)
        lines += [f"{fit.get('steps')} steps over {fit.get('epochs')} epochs ({data or 'data size not known'}); "
                  f"the loop ended: {fit.get('ended')}. eps {options.get('eps')}, lr {options.get('lr')}, "
                  f"seed {options.get('seed')}; every option in `fit_record.json`.", ""]
    else:
        lines += ["Not recorded (a probe saved before fits kept their record).", ""]
    lines += _verdict_table(convergence)
    lines += ["", "## Files", "", f"- `{WEIGHTS}`: the probe, its baselines and multipliers (safetensors).",
              f"- `{CONFIG}`: the explainer's options, the model's sites and fingerprints.",
              f"- `{RECORD}`: each layer's convergence report and the fit's options.", ""]
    return "\n".join(lines)


def _verdict_table(convergence: Mapping[str, Any]) -> List[str]:
    lines = ["## Verdicts per layer", "",
             "A layer's probe is a result to read when its fit ended `converged` or `needed`.", "",
             "| layer | verdict | its steps | kept share | KL | lambda |", "|---|---|---|---|---|---|"]
    for layer, report in sorted(convergence.items(), key=lambda item: int(item[0])):
        window = (report.get("windows") or [{}])[-1]
        figures = [f"{window[key]:.4g}" if isinstance(window.get(key), (int, float)) else "-"
                   for key in ("kept", "kl", "lam")]
        lines.append(f"| {layer} | {report.get('status')} | {report.get('steps')} | " + " | ".join(figures) + " |")
    if not convergence:
        lines.append("| - | not recorded | | | | |")
    return lines + ["", "The figures are means over the layer's last window of steps."]


class SharedProbe:
    r"""``save_pretrained`` and ``from_pretrained`` for :class:`~captum_diffmask.DiffMask`."""

    def save_pretrained(self, directory: PathLike) -> None:
        r"""
        Saves the fitted probe as a directory the way models are shared: the
        weights in ``probe.safetensors``, the configuration and the model's
        fingerprints in ``config.json``, each layer's verdict and the fit's
        options and data size in ``fit_record.json``, and a model card
        (``README.md``). No pickle: :meth:`from_pretrained` runs no code.

        Args:

            directory (str or PathLike): created if missing; under
                        ``torch.distributed`` only rank 0 writes it.
        """
        if not getattr(self, "is_fitted", False):
            raise ValueError("DiffMask is not fitted: nothing to save")
        if is_main_process():
            model = getattr(self, "model")
            name = getattr(getattr(model, "config", None), "name_or_path", None) or None
            write_directory(directory, checkpoint_contents(self), {"class": type(model).__name__, "name": name})

    @classmethod
    def from_pretrained(cls, directory: PathLike, model: nn.Module, check_weights: bool = True,
                        **options: Any) -> Any:
        r"""
        Loads a directory written by :meth:`save_pretrained` for ``model``.

        Args:

            directory (str or PathLike): the directory.
            model (nn.Module): the model it was fitted on.
            check_weights (bool, optional): refuse a model with other parameter
                        values (the same architecture). Default: True
            **options: the constructor's other arguments (``sites``,
                        ``forward_func``, ``padding_mask_arg``, ``components``).

        Returns:
            *DiffMask*, fitted, with its verdicts (``convergence``) and the fit's
            record (``fit_record``).

        Raises:
            ValueError naming ``directory`` (a missing or unreadable file) or
            ``model`` (other sites, shapes, or weights).
        """
        return explainer_from(cls, read_directory(directory), model, check_weights, **options)

