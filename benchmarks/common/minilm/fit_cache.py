"""DiffMask's fits on disk: a fit of the MiniLM suites is stored once it ends and
loaded by any later run with the same model, sentences, settings and seed, and
a fit that is stopped (a killed run, a session that ends) resumes from its last
state (the squad suite's fits too, on SQuAD windows). The step cap (``max_steps``) is not part of what names a fit: a fit that
converged before its cap is the same fit under any larger one, and a fit that
its cap stopped keeps its state, so that a larger cap goes on from where it
stopped (only its unsettled layers still train). A full SST run needs some
hours of fits on 2 cores; this lets it span several invocations."""

from __future__ import annotations

import datetime
import hashlib
import json
import os
from pathlib import Path
from typing import Any, Callable, Dict, Mapping, Optional, Tuple, Union

import torch
from torch import nn

import captum_diffmask
from captum_diffmask import DiffMask
from captum_diffmask.model.fingerprint import weights_fingerprint
from captum_diffmask.diffmask.constrained.convergence import SETTLED
from benchmarks.tasks.squad import SquadFeatures
from benchmarks.tasks.sst_bert import EncodedSST

from benchmarks.records import git_commit, cache_dir, config_hash, to_jsonable

#: Bumped when a stored fit's meaning changes (what the key holds, what the
#: record holds), so that older files are not read as this layout.
FIT_CACHE_VERSION = 4

#: The settings that cap a fit rather than define it, kept out of its key.
CAP = "max_steps"

#: ``fit(model, mode, train, valid, config, seed, verbose, checkpoint) ->
#: (explainer, record)``, :func:`benchmarks.common.minilm.fitting.fit_diffmask`.
Fit = Callable[..., Tuple[DiffMask, Dict[str, Any]]]
#: ``certify(explainer, mode, train, valid, config, seed, verbose, state=None) ->
#: certificate`` (a dict, or None; ``state``: the fit's state file, which the
#: further steps go on from), :func:`benchmarks.common.minilm.fitting.certify_fit`.
Certify = Callable[..., Optional[Dict[str, Any]]]
#: What a fit is fitted and held out on: SST sentences or SQuAD windows.
FitData = Union[EncodedSST, SquadFeatures]


def mode_settings(config: Mapping[str, Any], mode: str) -> Dict[str, Any]:
    r"""A suite's ``diffmask`` settings for ``mode``: the shared ones with the
    mode's own (``config["diffmask"][mode]``) over them."""
    return {**config["diffmask"], **config["diffmask"].get(mode, {})}


def _tensor_digest(*tensors: torch.Tensor) -> str:
    digest = hashlib.sha1()
    for t in tensors:
        digest.update(str(tuple(t.shape)).encode())
        digest.update(t.detach().cpu().contiguous().numpy().tobytes())
    return digest.hexdigest()


def fit_key(
    model: nn.Module, mode: str, train: FitData, valid: FitData, config: Mapping[str, Any], seed: int
) -> Dict[str, Any]:
    r"""What determines a fit: the mode, the seed, the suite's ``diffmask``
    settings (the mode's own merged in), the model's weights, the fit's and the
    held-out sentences, and the library's and this cache's versions. Neither the
    step cap (:data:`CAP`; a record holds it) nor the code of the fit is in it:
    a record names the commit it was fitted at."""
    settings = mode_settings(config, mode)
    for key in ("input", "hidden", CAP, "certificate"):  # the certificate is measured of a fit, not part of it
        settings.pop(key, None)
    return {
        "version": FIT_CACHE_VERSION, "captum_diffmask": captum_diffmask.__version__, "mode": mode, "seed": int(seed),
        "settings": json.loads(json.dumps(settings, sort_keys=True, default=str)),
        "model": weights_fingerprint(model),
        "train": _data_digest(train), "valid": _data_digest(valid),
    }


def _data_digest(data: Any) -> str:
    r"""The digest of what a fit reads of its data: the ids, the mask and the
    targets (SST's labels; SQuAD windows' token types and answer positions)."""
    if hasattr(data, "labels"):
        return _tensor_digest(data.input_ids, data.attention_mask, data.labels)
    return _tensor_digest(data.input_ids, data.attention_mask, data.token_type_ids, data.start_positions,
                          data.end_positions)


class FitFiles:
    r"""
    A fit's files in :func:`benchmarks.records.cache_dir`: ``probe`` (the
    fitted probe, ``DiffMask.save``), ``record`` (the fit's record, JSON, with
    its key, cap, commit and date) and ``state`` (the fit's state,
    ``DiffMask.fit(checkpoint=...)``; kept once the fit is stored only when its
    cap stopped it, for a larger cap to go on from).

    Args:

        key (dict): the fit's :func:`fit_key`.
        cap (int, optional): the fit's ``max_steps``.
        folder (Path, optional): where the files are. Default: the cache folder
    """

    def __init__(self, key: Mapping[str, Any], cap: Optional[int] = None, folder: Optional[Path] = None) -> None:
        self.key, self.cap = dict(key), cap
        stem = f"diffmask-fit-{key['mode']}-seed{key['seed']}-{config_hash(self.key)}"
        folder = cache_dir() if folder is None else Path(folder)
        self.probe, self.record, self.state = (folder / f"{stem}{suffix}" for suffix in (".pt", ".json", ".state"))

    def any_cap(self) -> Optional[Dict[str, Any]]:
        r"""The stored record of this key, at any cap, or None."""
        if not (self.probe.exists() and self.record.exists()):
            return None
        try:
            record = json.loads(self.record.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None
        return record if record.get("key") == json.loads(json.dumps(self.key, default=str)) else None

    def stored(self) -> Optional[Dict[str, Any]]:
        r"""The stored record when it is this fit at this cap: fitted with the
        same cap, or settled at every layer within this one; else None."""
        record = self.any_cap()
        if record is None or record.get(CAP) == self.cap:
            return record
        within = self.cap is None or record["info"]["steps"] <= self.cap
        return record if _settled(record["info"]["convergence"]) and within else None

    def goes_on(self) -> bool:
        r"""Whether the state on disk is one a fit with this cap goes on from: an
        unfinished fit's, or a stored fit's that a smaller cap stopped."""
        if not self.state.exists():
            return False
        record = self.any_cap()
        return record is None or (record.get(CAP) is not None and self.cap is not None and record[CAP] < self.cap)

    def load(self, model: nn.Module) -> Optional[Tuple[DiffMask, Dict[str, Any]]]:
        r"""The stored probe on ``model`` with its record (``info``), or None."""
        record = self.stored()
        if record is None:
            return None
        explainer = DiffMask.load(str(self.probe), model)
        info = dict(record["info"])
        explainer.convergence = {int(k): report for k, report in info["convergence"].items()}
        info["stored"] = {k: record[k] for k in ("commit", "date", CAP) if k in record}
        return explainer, info

    def store(self, explainer: DiffMask, info: Mapping[str, Any], keep_state: bool = False) -> None:
        r"""Writes the probe and the record (each to a temporary name first, so a
        reader sees a whole file or none); removes the fit's state unless its
        cap stopped it or ``keep_state`` (a certificate goes on from it)."""
        self.probe.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.probe.with_suffix(f".tmp{os.getpid()}")
        explainer.save(str(tmp))
        os.replace(tmp, self.probe)
        record = {"key": self.key, CAP: self.cap, "commit": git_commit(), "date": datetime.date.today().isoformat(),
                  "info": to_jsonable(dict(info))}
        tmp = self.record.with_suffix(f".tmp{os.getpid()}")
        tmp.write_text(json.dumps(record), encoding="utf-8")
        os.replace(tmp, self.record)
        if _settled(explainer.convergence) and not keep_state and self.state.exists():
            self.state.unlink()


    def add_to_record(self, extra: Mapping[str, Any]) -> None:
        r"""Adds ``extra`` to the stored record's ``info`` (what was measured of
        the stored fit later, e.g. its certificate), keeping the record's commit
        and date, which say when the fit was made."""
        record = json.loads(self.record.read_text(encoding="utf-8"))
        record["info"].update(to_jsonable(dict(extra)))
        tmp = self.record.with_suffix(f".tmp{os.getpid()}")
        tmp.write_text(json.dumps(record), encoding="utf-8")
        os.replace(tmp, self.record)


def _settled(convergence: Mapping[Any, Mapping[str, Any]]) -> bool:
    r"""Whether every layer of a fit's convergence report has its verdict (the fit stopped by itself)."""
    return all(report["status"] in SETTLED for report in convergence.values())


def fit_files(
    model: nn.Module, mode: str, train: FitData, valid: FitData, config: Mapping[str, Any], seed: int,
) -> FitFiles:
    r"""The files of this fit, at the cap the settings give it."""
    settings = mode_settings(config, mode)
    return FitFiles(fit_key(model, mode, train, valid, config, seed), settings.get(CAP))


def stored_fit(
    model: nn.Module, mode: str, train: FitData, valid: FitData, config: Mapping[str, Any], seed: int,
) -> Optional[Tuple[DiffMask, Dict[str, Any]]]:
    r"""The stored fit of this key on ``model`` with its record (``info``, with
    ``info["stored"]``), or None: none stored, or ``config["cache"]`` False."""
    if not config.get("cache", True):
        return None
    return fit_files(model, mode, train, valid, config, seed).load(model)


def cached_fit(
    fit: Fit, model: nn.Module, mode: str, train: FitData, valid: FitData, config: Mapping[str, Any], seed: int,
    verbose: bool,
) -> Tuple[DiffMask, Dict[str, Any]]:
    r"""
    ``fit(...)`` through the cache: the stored fit when there is one at this
    cap (:meth:`FitFiles.stored`), else a fit that writes its state as it goes
    (resuming an unfinished state of the same fit, or going on from the state of
    one a smaller cap stopped) and is stored when it ends. With
    ``config["cache"]`` False: a plain fit.

    Args:

        fit (Fit): the fitting function.
        model (nn.Module): the fine-tuned classifier.
        mode (str): ``"input"`` or ``"hidden"``.
        train (FitData): the fit's sentences (or windows).
        valid (FitData): the held-out train sentences (or windows).
        config (Mapping): the suite's configuration.
        seed (int): the fit's seed.
        verbose (bool): progress.

    Returns:
        *tuple* ``(explainer, info)``; ``info["stored"]`` (the commit, date and
        cap of the fit) when it was loaded; ``info["resumed"]`` when it went on
        from a state on disk.
    """
    if not config.get("cache", True):
        return fit(model, mode, train, valid, config, seed, verbose)
    files = fit_files(model, mode, train, valid, config, seed)
    loaded = files.load(model)
    if loaded is not None:
        return loaded
    files.state.parent.mkdir(parents=True, exist_ok=True)
    resumed, earlier = files.goes_on(), files.any_cap()
    if not resumed:  # a fit afresh replaces another cap's (so that a state beside a record is that record's fit's)
        for path in (files.state, files.record, files.probe):
            if path.exists():
                path.unlink()
        earlier = None
    explainer, info = fit(model, mode, train, valid, config, seed, verbose, checkpoint=str(files.state))
    info["resumed"] = resumed
    if resumed and earlier is not None:
        info["went_on_from_cap"] = earlier[CAP]
    files.store(explainer, info, keep_state=bool(mode_settings(config, mode).get("certificate")))
    return explainer, info


def certified_fit(
    fit: Fit, certify: Certify, model: nn.Module, mode: str, train: FitData, valid: FitData,
    config: Mapping[str, Any], seed: int, verbose: bool,
) -> Tuple[DiffMask, Dict[str, Any]]:
    r"""
    :func:`cached_fit`, then :func:`with_certificate`.

    Returns:
        *tuple* ``(explainer, info)`` as :func:`cached_fit`.
    """
    explainer, info = cached_fit(fit, model, mode, train, valid, config, seed, verbose)
    return explainer, with_certificate(certify, explainer, info, mode, train, valid, config, seed, verbose)


def with_certificate(
    certify: Certify, explainer: DiffMask, info: Dict[str, Any], mode: str, train: FitData, valid: FitData,
    config: Mapping[str, Any], seed: int, verbose: bool,
) -> Dict[str, Any]:
    r"""
    ``info`` with the fit's convergence certificate in ``info["certificate"]``
    (``certify(explainer, mode, train, valid, config, seed, verbose, state)``):
    when the settings ask for one (``diffmask.certificate``) and ``info`` holds
    none at these tolerances, or one of fresh optimiser states where the fit's
    state is kept (``state``: the further steps go on from it), it is measured
    and kept in the fit's stored record.

    Returns:
        *dict* ``info``, updated in place.
    """
    if not certificate_due(explainer.model, info, mode, train, valid, config, seed):
        return info
    files = fit_files(explainer.model, mode, train, valid, config, seed)
    cached = config.get("cache", True) and files.state.exists()
    info["certificate"] = certify(explainer, mode, train, valid, config, seed, verbose,
                                  state=str(files.state) if cached else None)
    if config.get("cache", True) and files.any_cap() is not None:
        files.add_to_record({"certificate": info["certificate"]})
    return info


def certificate_due(
    model: nn.Module, info: Mapping[str, Any], mode: str, train: FitData, valid: FitData,
    config: Mapping[str, Any], seed: int,
) -> bool:
    r"""
    Whether :func:`with_certificate` measures the certificate of the fit whose
    record is ``info``: the settings ask for one (``diffmask.certificate``)
    and ``info`` holds none at these tolerances, or one of fresh optimiser
    states where the fit cache keeps the fit's state.
    """
    wanted = mode_settings(config, mode).get("certificate")
    if not wanted:
        return False
    held = info.get("certificate") or {}
    stale = any(held.get("tolerances", {}).get(k) != v for k, v in wanted.items())
    if stale:
        return True
    cached = config.get("cache", True) and fit_files(model, mode, train, valid, config, seed).state.exists()
    return bool(cached and not held.get("continued"))


def fitted_where(record: Mapping[str, Any]) -> str:
    r"""Where a fit's record says it ran, for a report: this run, or the fit
    cache (its commit and date); and whether it resumed a stopped fit's state
    or went on from the state of a fit a smaller cap stopped."""
    stored = record.get("stored")
    where = f"fit cache (commit {stored['commit']}, {stored['date']})" if stored else "this run"
    if record.get("went_on_from_cap") is not None:
        return where + f", went on from the state of the fit the cap max_steps={record['went_on_from_cap']} stopped"
    return where + (", resumed from a stopped fit's state" if record.get("resumed") else "")
