"""DiffMask as a Captum attribution: fit an amortised probe once, attribute in one pass."""

from __future__ import annotations

import copy
import hashlib
import os
import random
import time
import warnings
from typing import Any, Callable, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple, Union

import torch
from captum.log import log_usage
from torch import nn, Tensor
from tqdm.auto import tqdm

from .attribution import SiteAttribution
from .forward import Batch, check_token_ids, format_additional_args, frozen, model_device, split_batch
from .convergence import Convergence, LayerMonitor, warn_unconverged
from .hard_concrete import DIFFMASK_DEFAULTS, HardConcrete
from .objective import (
    kl_divergence, L0_KINDS, l0_penalty, LagrangeMultipliers, log_probs, MULTIPLIER_RULES, multiplier_rates,
)
from .probes import HiddenGateProbe, InputGateProbe, mix_baseline
from .sites import SiteLocator

_MODES = ("input", "hidden")

#: :meth:`DiffMask.fit` options that restore the optimisation of the reports made
#: before fit ran to convergence (with ``lr=1e-3, epochs=10`` where a report left
#: those at their defaults then).
LEGACY_FIT: Dict[str, Any] = {"optimizer": "rmsprop", "multiplier": "ascent", "until_converged": False}
_CHECKPOINT_FORMAT = 1


def model_signature(model: nn.Module) -> str:
    r"""A fingerprint of a model's architecture: its class and parameter shapes."""
    parts = [type(model).__name__] + [
        f"{name}:{tuple(p.shape)}" for name, p in model.named_parameters()
    ]
    return hashlib.sha1("|".join(parts).encode()).hexdigest()


def check_layer(layer: Any, num_layers: int, allow_none: bool = True) -> Optional[int]:
    r"""Validates ``layer`` (0..L, or None for all); ValueError naming it otherwise."""
    if layer is None and allow_none:
        return None
    if isinstance(layer, bool) or not isinstance(layer, int):
        raise TypeError(f"layer must be an int in 0..{num_layers}, got {layer!r}")
    if not 0 <= layer <= num_layers:
        raise ValueError(f"layer must be in 0..{num_layers}, got {layer}")
    return layer


class _FitLoop:
    r"""The state of one :meth:`DiffMask.fit` run across epochs: the layers and
    their draw, the optimizers (built on the first batch), the step count and
    the convergence monitors, which decide when the loop is done."""

    def __init__(
        self,
        layers: List[int],
        rng: random.Random,
        eps: float,
        max_steps: Optional[int],
        until_converged: bool,
        monitors: Dict[int, LayerMonitor],
        settings: Tuple[Any, ...],
    ) -> None:
        self.layers, self.rng, self.eps = layers, rng, eps
        self.max_steps, self.until_converged = max_steps, until_converged
        self.monitors, self.settings = monitors, settings
        self.optimizers: Optional[Tuple[torch.optim.Optimizer, torch.optim.Optimizer]] = None
        self.step = 0
        self.done = False
        self.converged = False

    def after_step(self, layer: int, record: Mapping[str, float], lam: float) -> bool:
        r"""Counts the step and records it at ``layer``; True when it closed one
        of that layer's windows."""
        self.step += 1
        closed = self.monitors[layer].record(record["kl"], record["l0"], lam)
        if self.max_steps is not None and self.step >= self.max_steps:
            self.done = True
        elif closed and self.until_converged:
            self.converged = all(m.status() == "converged" for m in self.monitors.values())
            self.done = self.converged
        return closed

    def stopped_by(self, epochs: int) -> str:
        r"""What ended the run, for the warning: the cap it reached, or
        ``until_converged=False``."""
        if self.max_steps is not None and self.step >= self.max_steps and not self.converged:
            return f"the cap max_steps={self.max_steps}"
        if not self.until_converged:
            return f"epochs={epochs} with until_converged=False"
        return f"the cap epochs={epochs} ({self.step} steps)"


class DiffMask(SiteAttribution):
    r"""
    Differentiable Masking (De Cao, Schlichtkrull, Aziz and Titov, EMNLP 2020).

    A probe reads the model's hidden states up to layer k and predicts, per token,
    a Hard Concrete gate; gated-off positions are replaced by a learned baseline.
    :meth:`fit` trains the probe to close as many gates as possible while the
    masked model's output stays within ``KL(original || masked) <= eps``
    (a Lagrangian with one multiplier per layer). :meth:`attribute` then returns
    the probability that each gate stays open: one capture pass, no sampling.

    - ``mode="input"``: gates on the input token embeddings; at layer k the token
      is kept only if every vote read from ``hidden.0 .. hidden.k`` is non-zero.
      The attribution at layer k says which input tokens the model, as far as it
      has read them at depth k, still needs.
    - ``mode="hidden"``: gates on the states of ``hidden.k``, read from
      ``hidden.k``; it says which states at depth k store what the prediction needs.

    Args:

        model (nn.Module): the analysed model; frozen and in eval mode while fitted.
        mode (str, optional): ``"input"`` or ``"hidden"``. Default: ``"input"``
        sites (SiteLocator or dict, optional): where ``input`` and
                    ``hidden.0 .. hidden.L`` live; located automatically for
                    Hugging Face models (see :meth:`SiteLocator.locate`).
                    Default: None
        forward_func (Callable, optional): ``forward_func(ids, *extra)`` returning
                    logits; the model itself when None. Default: None
        padding_mask_arg (int, str or None, optional): index of the padding mask in
                    ``additional_forward_args``; ``"auto"`` = 0 for Hugging Face
                    models, none otherwise. Default: ``"auto"``
        temperature (float, optional): Hard Concrete temperature. Default: 0.2
        stretch (tuple[float, float], optional): Hard Concrete ``(l, r)``.
                    Default: ``(-0.2, 1.0)``
        probe_hidden_size (int, optional): hidden size of each gate network;
                    ``max(H // 4, 32)`` with H the largest site size when None.
                    Default: None
        l0 (str, optional): the sparsity term: ``"expected"`` (the paper: sum of
                    ``P(z != 0)`` over real tokens), ``"mean"`` (that sum over the
                    number of real tokens: the expected share kept, the same scale
                    for every length) or ``"log"`` (the authors' code: mean of
                    ``log P(z != 0)``). Default: ``"expected"``
        probe_reads_input (bool, optional): input mode: vote j reads
                    ``[input; hidden.j]`` (the paper) or ``hidden.j`` alone.
                    Default: True
        rerun (str, optional): hidden mode, while fitting: ``"partial"`` re-runs only
                    what comes after the masked site (the earlier sites' outputs
                    from the capture pass stand in for their modules; the model is
                    frozen, so they are the same); ``"full"`` re-runs the whole
                    model. Partial assumes each site module runs once per forward.
                    Default: ``"partial"``
        init_bias (float, optional): the gate networks' initial bias; 5 (the
                    authors') starts every gate open, ``P(z != 0) ~ 0.995``, and
                    a gate then needs many steps to close. Default: 5.0

    Examples::

        >>> dm = DiffMask(model, mode="hidden")
        >>> history = dm.fit(train_loader, epochs=10, eps=0.1)
        >>> attributions = dm.attribute(input_ids, additional_forward_args=(mask,), layer=3)
    """

    def __init__(
        self,
        model: nn.Module,
        mode: str = "input",
        sites: Union[None, SiteLocator, Mapping[str, Any]] = None,
        forward_func: Optional[Callable[..., Any]] = None,
        padding_mask_arg: Union[int, str, None] = "auto",
        temperature: float = DIFFMASK_DEFAULTS[0],
        stretch: Tuple[float, float] = DIFFMASK_DEFAULTS[1:],
        probe_hidden_size: Optional[int] = None,
        l0: str = "expected",
        probe_reads_input: bool = True,
        rerun: str = "partial",
        init_bias: float = 5.0,
    ) -> None:
        if mode not in _MODES:
            raise ValueError(f"mode must be 'input' or 'hidden', got {mode!r}")
        if rerun not in ("partial", "full"):
            raise ValueError(f"rerun must be 'partial' or 'full', got {rerun!r}")
        if l0 not in L0_KINDS:
            raise ValueError(f"l0 must be one of {L0_KINDS}, got {l0!r}")
        HardConcrete(torch.zeros(1), temperature, stretch)  # validates both
        SiteAttribution.__init__(self, model, sites, forward_func, padding_mask_arg)
        self.mode = mode
        self.temperature = float(temperature)
        self.stretch = (float(stretch[0]), float(stretch[1]))
        self.probe_hidden_size = probe_hidden_size
        self.l0 = l0
        self.probe_reads_input = bool(probe_reads_input)
        self.rerun = rerun
        self.init_bias = float(init_bias)
        self.probe: Optional[nn.Module] = None
        self.lambdas: Optional[LagrangeMultipliers] = None
        self.site_sizes: Dict[str, int] = {}
        #: after :meth:`fit`: layer -> its convergence report (see
        #: :meth:`LayerMonitor.report`); empty before
        self.convergence: Dict[int, Dict[str, Any]] = {}

    @property
    def is_fitted(self) -> bool:
        return self.probe is not None

    # -------------------------------------------------------------- internals
    def _needed_sites(self, layer: Optional[int]) -> List[str]:
        last = self.num_layers if layer is None else layer
        if self.mode == "input":
            return ["input"] + [f"hidden.{j}" for j in range(last + 1)]
        if layer is None:
            return [f"hidden.{j}" for j in range(self.num_layers + 1)]
        return [f"hidden.{layer}"]

    def _build(self, states: Dict[str, Tensor], mask: Tensor) -> None:
        r"""Creates the probe from the site sizes seen in the first batch."""
        self.site_sizes = {name: int(state.shape[-1]) for name, state in states.items()}
        self._make_modules()
        assert self.probe is not None
        self.probe.init_baselines(states, mask)

    def _make_modules(self) -> None:
        hidden_sizes = [self.site_sizes[f"hidden.{j}"] for j in range(self.num_layers + 1)]
        width = self.probe_hidden_size or max(max(self.site_sizes.values()) // 4, 32)
        if self.mode == "input":
            self.probe = InputGateProbe(
                self.site_sizes["input"], hidden_sizes, width, read_input=self.probe_reads_input,
                init_bias=self.init_bias,
            )
        else:
            self.probe = HiddenGateProbe(hidden_sizes, width, init_bias=self.init_bias)
        self.lambdas = LagrangeMultipliers(self.num_layers + 1)
        device = model_device(self.model)
        self.probe.to(device)
        self.lambdas.to(device)

    def _gate_logits(self, states: Dict[str, Tensor], layer: Optional[int]) -> Tensor:
        r"""(B, T, layer + 1) vote logits (input mode), (B, T) gate logits (hidden
        mode), or (B, T, L + 1) for every layer when ``layer`` is None (hidden mode).
        The networks a call needs are evaluated together, in one batched call."""
        assert self.probe is not None
        if self.mode == "input":
            last = self.num_layers if layer is None else layer
            hidden = [states[f"hidden.{j}"] for j in range(last + 1)]
            return self.probe(states["input"], hidden)
        if layer is None:
            every = range(self.num_layers + 1)
            return self.probe.layers([states[f"hidden.{j}"] for j in every], every)
        return self.probe(states[f"hidden.{layer}"], layer)

    def _hard_concrete(self, logits: Tensor) -> HardConcrete:
        return HardConcrete(logits, self.temperature, self.stretch)

    def _capture(
        self,
        ids: Tensor,
        extra: Tuple[Any, ...],
        names: Sequence[str],
        run_all: bool,
        module_outputs: Optional[Dict[str, Any]] = None,
    ) -> Tuple[Dict[str, Tensor], Optional[Tensor]]:
        with torch.no_grad():
            with self.locator.capture(names, stop_early=not run_all, module_outputs=module_outputs) as states:
                logits = self.model_forward(ids, extra)
                return states, logits
        return states, None  # the forward pass stopped once the sites were read

    # -------------------------------------------------------------------- fit
    def fit(
        self,
        dataloader: Iterable[Batch],
        epochs: int = 100,
        eps: float = 0.1,
        lr: float = 3e-3,
        lr_baseline: float = 1e-3,
        lr_lambda: Union[float, Sequence[float]] = 1.0,
        layers: Optional[Sequence[int]] = None,
        max_steps: Optional[int] = None,
        seed: Optional[int] = None,
        verbose: bool = True,
        optimizer: str = "adam",
        validation: Optional[Iterable[Batch]] = None,
        eps_valid: Optional[float] = None,
        agreement_valid: float = 0.0,
        multiplier: str = "damped",
        until_converged: bool = True,
        convergence: Optional[Convergence] = None,
    ) -> List[Dict[str, Any]]:
        r"""
        Trains the probe and the baselines (the model stays frozen) until every
        trained layer has converged, or a cap is reached.

        Each step: one capture pass without gradients (all sites and the original
        logits), a layer k drawn uniformly from ``layers``, gates sampled from the
        probe, one pass with the site replaced by ``z * h + (1 - z) * b``, and the
        Lagrangian ``L0 + lambda_k * (mean KL - eps)``: the probe and baselines
        descend, ``lambda_k`` ascends (``multiplier``), clamped to [0, 200].

        The fit stops once every trained layer has converged (``convergence``: the
        kept share and the multiplier have settled and the constraint holds; see
        :class:`Convergence` and ``docs/diffmask.md``); ``epochs`` and
        ``max_steps`` are caps. When it stops with a layer unconverged (the cap
        reached, the constraint still violated, every gate open with the
        constraint slack, or every gate closed) a
        :class:`DiffMaskConvergenceWarning` names the layer, its figures and what
        to try. :attr:`convergence` holds the per-layer report afterwards.

        The defaults (Adam at lr 3e-3, the damped multiplier, run to convergence)
        were chosen on the toy task (``docs/diffmask.md``, "Convergence"); the
        earlier recipe is ``optimizer="rmsprop", multiplier="ascent", lr=1e-3,
        epochs=10, until_converged=False``.

        Args:

            dataloader (iterable): batches as ``attribute`` takes them: token ids
                        (B, T), or ``(ids, *additional_forward_args)``, or a mapping
                        with ``input_ids``/``attention_mask``. Iterated once per
                        epoch.
            epochs (int, optional): the most passes over ``dataloader``.
                        Default: 100
            eps (float, optional): the margin on KL(original || masked) in nats.
                        Default: 0.1
            lr (float, optional): learning rate of the gate networks. Default: 3e-3
            lr_baseline (float, optional): learning rate of the baselines. Default: 1e-3
            lr_lambda (float or sequence of float, optional): the multipliers' rate
                        of ascent, or one per layer (L + 1 values, layer 0
                        first). Default: 1.0
            layers (sequence of int, optional): the layers to train; all when None.
                        Default: None
            max_steps (int, optional): the most steps in all. Default: None
            seed (int, optional): seeds torch's RNG (probe init and gate noise).
                        Default: None
            verbose (bool, optional): tqdm progress bar. Default: True
            optimizer (str, optional): ``"adam"`` (betas 0.9, 0.99) or
                        ``"rmsprop"`` (centred, the authors') for the probe and
                        baselines. Centred RMSprop divides by the gradient's
                        spread, which vanishes when the L0 term alone drives the
                        gates: they then close all at once. Default: ``"adam"``
            validation (iterable, optional): held-out batches (as ``dataloader``).
                        After every epoch the probe is scored on them with
                        deterministic gates (:meth:`evaluate`, every trained layer),
                        and at the end the probe of the **sparsest epoch that keeps
                        the constraint** is restored: mean KL <= ``eps_valid`` and
                        agreement >= ``agreement_valid`` at every trained layer,
                        the smallest mean share of kept positions over the layers
                        (the authors' checkpoint rule). When no epoch keeps it, the
                        last epoch stays and a warning says so. Default: None
            eps_valid (float, optional): the KL bound of the selection; ``eps``
                        when None. Default: None
            agreement_valid (float, optional): the least share of examples whose
                        masked argmax equals the original one. Default: 0.0
            multiplier (str, optional): the multipliers' update (see
                        :meth:`LagrangeMultipliers.optimizer`): ``"damped"``
                        (additive rise while violated, geometric decay while the
                        constraint holds) or ``"ascent"`` (plain gradient ascent).
                        Default: ``"damped"``
            until_converged (bool, optional): stop once every trained layer has
                        converged; False runs every epoch (the convergence report
                        and warning still come). Default: True
            convergence (Convergence, optional): the criterion's thresholds;
                        ``Convergence()`` when None. Default: None

        Returns:
            *list* of dicts, one per (epoch, layer) trained in it, with the means of
            ``kl`` (nats), ``l0`` (share of real tokens whose gate is open),
            ``agreement`` (masked argmax == original argmax), the final ``lambda``
            the number of ``steps``, the epoch's training ``seconds`` (all
            layers), and the layer's convergence ``status`` at the epoch's end
            (one of ``converged``, ``unsettled``, ``violated``, ``open``,
            ``closed``) with ``converged`` (bool); with ``validation`` also
            ``valid_kl``, ``valid_l0``, ``valid_agreement`` (deterministic gates),
            ``valid_seconds`` and ``selected`` (True on the rows of the restored
            epoch).
        """
        train_layers = self._check_fit_args(
            epochs, eps, layers, agreement_valid, eps_valid, lr_lambda, optimizer, multiplier
        )
        criterion = Convergence() if convergence is None else convergence
        if not isinstance(criterion, Convergence):
            raise TypeError(f"convergence must be a Convergence, got {type(criterion).__name__}")
        bound = float(eps if eps_valid is None else eps_valid)
        best: Optional[Tuple[float, int, Dict[str, Any]]] = None  # (mean l0, epoch, state)
        if seed is not None:
            torch.manual_seed(seed)
        loop = _FitLoop(
            layers=train_layers, rng=random.Random(seed), eps=float(eps), max_steps=max_steps,
            until_converged=bool(until_converged),
            monitors={k: LayerMonitor(k, eps, criterion) for k in sorted(set(train_layers))},
            settings=(optimizer, lr, lr_baseline, lr_lambda, multiplier),
        )
        history: List[Dict[str, Any]] = []
        with frozen(self.model):
            for epoch in range(1, epochs + 1):
                bar = tqdm(dataloader, desc=f"DiffMask fit {epoch}/{epochs}", disable=None if verbose else True, leave=False)
                epoch_start = time.perf_counter()
                sums = self._train_epoch(bar, loop)
                if loop.step == 0:
                    raise ValueError("dataloader: no batches")
                rows = self._epoch_rows(epoch, sums, time.perf_counter() - epoch_start, loop.monitors)
                if validation is not None and self.probe is not None:
                    sparsity, keeps = self._validate(validation, rows, train_layers, bound, agreement_valid)
                    if keeps and (best is None or sparsity < best[0]):
                        best = (sparsity, epoch, self._state())
                history.extend(rows)
                if loop.done:
                    break
        if validation is not None and self.probe is not None:
            self._restore_best(best, history, bound, agreement_valid)
        self.convergence = {k: m.report() for k, m in loop.monitors.items()}
        warn_unconverged(loop.monitors, loop.stopped_by(epochs))
        return history

    def _check_fit_args(
        self,
        epochs: Any,
        eps: Any,
        layers: Optional[Sequence[int]],
        agreement_valid: Any,
        eps_valid: Any,
        lr_lambda: Union[float, Sequence[float]],
        optimizer: Any,
        multiplier: Any,
    ) -> List[int]:
        r"""Checks fit's arguments before any forward pass; returns the layers."""
        if isinstance(epochs, bool) or not isinstance(epochs, int) or epochs < 1:
            raise ValueError(f"epochs must be an int >= 1, got {epochs!r}")
        if not eps >= 0:
            raise ValueError(f"eps must be >= 0, got {eps!r}")
        train_layers = list(range(self.num_layers + 1)) if layers is None else list(layers)
        if not train_layers:
            raise ValueError("layers must name at least one layer")
        for k in train_layers:
            check_layer(k, self.num_layers, allow_none=False)
        if not agreement_valid <= 1:
            raise ValueError(f"agreement_valid must be <= 1, got {agreement_valid!r}")
        if eps_valid is not None and not eps_valid >= 0:
            raise ValueError(f"eps_valid must be >= 0, got {eps_valid!r}")
        if optimizer not in ("adam", "rmsprop"):
            raise ValueError(f"optimizer must be 'adam' or 'rmsprop', got {optimizer!r}")
        if multiplier not in MULTIPLIER_RULES:
            raise ValueError(f"multiplier must be one of {MULTIPLIER_RULES}, got {multiplier!r}")
        multiplier_rates(lr_lambda, self.num_layers + 1)  # now, not after the first forward pass
        return train_layers

    def _train_epoch(self, batches: Iterable[Batch], loop: "_FitLoop") -> Dict[int, Dict[str, float]]:
        r"""One pass over ``batches`` (or fewer steps, when the loop ends); the
        sums of each trained layer's step records."""
        sums: Dict[int, Dict[str, float]] = {}
        for batch in batches:
            ids, extra = split_batch(batch)
            ids, _ = check_token_ids(ids, "dataloader batch")
            mask = self.model_forward.padding_mask(ids, extra)
            outputs: Optional[Dict[str, Any]] = {} if self.mode == "hidden" and self.rerun == "partial" else None
            names = self.locator.names if outputs is not None else self._needed_sites(None)
            states, original = self._capture(ids, extra, names, run_all=True, module_outputs=outputs)
            if self.probe is None:
                self._build(states, mask)
            if loop.optimizers is None:
                loop.optimizers = self._optimizers(*loop.settings, eps=loop.eps)
            k = loop.rng.choice(loop.layers)
            record = self._step(ids, extra, mask, states, original, k, loop.eps, loop.optimizers, outputs)
            acc = sums.setdefault(k, {"kl": 0.0, "l0": 0.0, "agreement": 0.0, "steps": 0})
            for key in ("kl", "l0", "agreement"):
                acc[key] += record[key]
            acc["steps"] += 1
            assert self.lambdas is not None
            if loop.after_step(k, record, float(self.lambdas(k).detach())) and hasattr(batches, "set_postfix"):
                window = loop.monitors[k].windows[-1]
                batches.set_postfix(layer=k, kept=f"{window.kept:.3f}", kl=f"{window.kl:.4f}",
                                    lam=f"{window.lam:.3g}", status=loop.monitors[k].status())
            if loop.done:
                break
        return sums

    def _epoch_rows(
        self, epoch: int, sums: Mapping[int, Mapping[str, float]], seconds: float, monitors: Mapping[int, LayerMonitor]
    ) -> List[Dict[str, Any]]:
        assert self.lambdas is not None
        rows = []
        for k in sorted(sums):
            n = sums[k]["steps"]
            status = monitors[k].status()
            rows.append({
                "epoch": epoch, "layer": k, "kl": sums[k]["kl"] / n, "l0": sums[k]["l0"] / n,
                "agreement": sums[k]["agreement"] / n, "lambda": float(self.lambdas(k).detach()),
                "steps": n, "seconds": seconds, "status": status, "converged": status == "converged",
            })
        return rows

    def _validate(
        self, validation: Iterable[Batch], rows: List[Dict[str, Any]], layers: Sequence[int], bound: float, agreement: float
    ) -> Tuple[float, bool]:
        r"""Scores the probe on ``validation`` into ``rows``; (mean kept share over
        the layers, whether every layer keeps the selection's constraint)."""
        start = time.perf_counter()
        scores = self._evaluate(validation, sorted(set(layers)), "threshold")
        seconds = time.perf_counter() - start
        for row in rows:
            row.update({f"valid_{key}": value for key, value in scores[row["layer"]].items()})
            row["valid_seconds"] = seconds
        keeps = all(v["kl"] <= bound and v["agreement"] >= agreement for v in scores.values())
        return sum(v["l0"] for v in scores.values()) / len(scores), keeps

    def _restore_best(
        self, best: Optional[Tuple[float, int, Dict[str, Any]]], history: List[Dict[str, Any]], bound: float, agreement: float
    ) -> None:
        if best is None:
            warnings.warn(
                f"DiffMask.fit: no epoch kept KL <= {bound} and agreement >= {agreement} "
                "on the validation batches at every layer; the last epoch's probe is kept",
                stacklevel=3,
            )
        else:
            self._load_state(best[2])
        chosen = history[-1]["epoch"] if best is None else best[1]
        for row in history:
            row["selected"] = row["epoch"] == chosen

    def _state(self) -> Dict[str, Any]:
        assert self.probe is not None and self.lambdas is not None
        return copy.deepcopy({"probe": self.probe.state_dict(), "lambdas": self.lambdas.state_dict()})

    def _load_state(self, state: Mapping[str, Any]) -> None:
        assert self.probe is not None and self.lambdas is not None
        self.probe.load_state_dict(state["probe"])
        self.lambdas.load_state_dict(state["lambdas"])

    def _optimizers(
        self, kind: str, lr: float, lr_baseline: float, lr_lambda: Union[float, Sequence[float]], multiplier: str, eps: float
    ) -> Tuple[torch.optim.Optimizer, torch.optim.Optimizer]:
        assert self.probe is not None and self.lambdas is not None
        baselines = {id(p) for n, p in self.probe.named_parameters() if n.startswith("baseline")}
        gates = [p for p in self.probe.parameters() if id(p) not in baselines]
        base = [p for p in self.probe.parameters() if id(p) in baselines]
        groups = [{"params": gates, "lr": lr}, {"params": base, "lr": lr_baseline}]
        if kind == "rmsprop":
            # The authors' choice. Centred: it divides by the gradient's spread,
            # which vanishes once the multiplier is ~0 and the L0 term alone
            # drives the gates, and they then close all together within a few
            # dozen steps (docs/diffmask.md, "Convergence").
            probe_opt: torch.optim.Optimizer = torch.optim.RMSprop(groups, centered=True)
        elif kind == "adam":
            # beta2 0.99, not 0.999: after the multiplier has pushed gates open,
            # the small L0 gradient regains its scale within ~100 steps.
            probe_opt = torch.optim.Adam(groups, betas=(0.9, 0.99))
        else:
            raise ValueError(f"optimizer must be 'adam' or 'rmsprop', got {kind!r}")
        return probe_opt, self.lambdas.optimizer(lr_lambda, rule=multiplier, eps=eps)

    def _step(
        self,
        ids: Tensor,
        extra: Tuple[Any, ...],
        mask: Tensor,
        states: Dict[str, Tensor],
        original: Tensor,
        layer: int,
        eps: float,
        optimizers: Tuple[torch.optim.Optimizer, torch.optim.Optimizer],
        module_outputs: Optional[Dict[str, Any]] = None,
    ) -> Dict[str, float]:
        assert self.probe is not None and self.lambdas is not None
        probe_opt, lambda_opt = optimizers
        dist = self._hard_concrete(self._gate_logits(states, layer))
        gates = dist.rsample()
        log_keep = dist.log_prob_nonzero()
        if self.mode == "input":
            gates = gates.prod(-1)  # kept only if every vote up to k is non-zero
            log_keep = log_keep.sum(-1)
        site, baseline = self._masked_site(layer)
        masked_state = mix_baseline(states[site], gates, baseline)
        masked = self._masked_logits(ids, extra, site, masked_state, module_outputs)
        log_p, log_q = log_probs(original), log_probs(masked)
        kl = kl_divergence(log_p, log_q)
        penalty = l0_penalty(log_keep, mask, self.l0)
        constraint = kl.mean() - eps
        loss = penalty.mean() + self.lambdas(layer) * constraint
        probe_opt.zero_grad(set_to_none=True)
        lambda_opt.zero_grad(set_to_none=True)
        loss.backward()
        probe_opt.step()
        lambda_opt.step()
        self.lambdas.clamp_()
        real = mask.float()
        with torch.no_grad():
            kept = (log_keep.exp() * real).sum() / real.sum().clamp(min=1.0)
            agreement = (log_p.argmax(-1) == log_q.argmax(-1)).float().mean()
        return {"kl": float(kl.detach().mean()), "l0": float(kept), "agreement": float(agreement)}

    def _masked_site(self, layer: int) -> Tuple[str, Tensor]:
        r"""The site the gates of ``layer`` replace, and its baseline (H,)."""
        assert self.probe is not None
        if self.mode == "input":
            return "input", self.probe.baseline
        return f"hidden.{layer}", self.probe.baselines[layer]

    def _masked_logits(
        self,
        ids: Tensor,
        extra: Tuple[Any, ...],
        site: str,
        masked_state: Tensor,
        module_outputs: Optional[Dict[str, Any]] = None,
    ) -> Tensor:
        r"""Logits with ``site`` replaced; with recorded ``module_outputs``, the
        sites up to ``site`` are not recomputed (see :meth:`SiteLocator.reuse`)."""
        reused = self._reused_before(module_outputs, [site]) if module_outputs is not None else {}
        with self.locator.reuse(reused), self.locator.replace({site: masked_state}):
            return self.model_forward(ids, extra)

    # -------------------------------------------------------------- attribute
    @log_usage()
    def attribute(
        self,
        inputs: Union[Tensor, Tuple[Tensor]],
        target: Any = None,
        additional_forward_args: Any = None,
        layer: Optional[int] = None,
    ) -> Union[Tensor, Tuple[Tensor]]:
        r"""
        The probability that each token (input mode) or state (hidden mode) is kept.

        One capture pass (stopped as soon as the needed sites are read), the probe,
        and ``P(z != 0)`` in closed form; no sampling.

        Args:

            inputs (Tensor or tuple[Tensor]): token ids (B, T).
            target: ignored; DiffMask explains the whole output distribution.
                        Accepted for Captum compatibility. Default: None
            additional_forward_args (Any, optional): the model's other positional
                        arguments (e.g. the attention mask). Default: None
            layer (int, optional): the depth k the probe reads, 0..L; None for all.
                        Default: None

        Returns:
            *Tensor* (or a 1-tuple, when ``inputs`` is a tuple) of **attributions**
            in [0, 1]: (B, T) for a layer, (B, T, L + 1) for ``layer=None``; 0 at
            padded positions.
        """
        if not self.is_fitted:
            raise ValueError("DiffMask is not fitted: call fit(...) or DiffMask.load(...) before attribute")
        ids, was_tuple = check_token_ids(inputs)
        layer = check_layer(layer, self.num_layers)
        mask = self.model_forward.padding_mask(ids, additional_forward_args)
        states, _ = self._capture(ids, additional_forward_args, self._needed_sites(layer), run_all=False)
        with torch.no_grad():
            keep = self._keep_probabilities(states, layer)
        keep = keep * (mask.unsqueeze(-1) if keep.dim() == 3 else mask).to(keep.dtype)
        return (keep,) if was_tuple else keep

    def _keep_probabilities(self, states: Dict[str, Tensor], layer: Optional[int]) -> Tensor:
        last = self.num_layers if layer is None else layer
        if self.mode == "input":
            log_votes = self._hard_concrete(self._gate_logits(states, last)).log_prob_nonzero()
            keep = log_votes.cumsum(-1).exp()  # P(every vote up to j is non-zero)
            return keep if layer is None else keep[..., layer]
        return self._hard_concrete(self._gate_logits(states, layer)).prob_nonzero()

    # ------------------------------------------------------------- evaluation
    def _deterministic_gates(self, states: Dict[str, Tensor], layer: int, rule: str) -> Tensor:
        r"""(B, T) noise-free gates of ``layer``: ``"threshold"`` keeps a position
        when its attribution (``P(z != 0)``; input mode: of every vote up to
        ``layer``) exceeds 0.5; ``"louizos"`` is the clamped test-time gate
        (input mode: the product of the votes' gates)."""
        if rule == "threshold":
            return (self._keep_probabilities(states, layer) > 0.5).float()
        if rule != "louizos":
            raise ValueError(f"rule must be 'threshold' or 'louizos', got {rule!r}")
        gates = self._hard_concrete(self._gate_logits(states, layer)).deterministic_gate("louizos")
        return gates.prod(-1) if self.mode == "input" else gates

    @torch.no_grad()
    def masked_forward(
        self,
        inputs: Union[Tensor, Tuple[Tensor]],
        additional_forward_args: Any = None,
        layer: Optional[int] = None,
        rule: str = "threshold",
    ) -> Tuple[Tensor, Tensor, Tensor]:
        r"""
        The model's output with the probe's gates applied without noise: actual
        erasure, for faithfulness checks.

        Args:

            inputs (Tensor or tuple[Tensor]): token ids (B, T).
            additional_forward_args (Any, optional): the model's other positional
                        arguments (e.g. the attention mask). Default: None
            layer (int): the depth k the probe reads, 0..L (required).
            rule (str, optional): ``"threshold"`` (binary: kept where the
                        attribution exceeds 0.5) or ``"louizos"`` (the clamped
                        test-time Hard Concrete gate, values in [0, 1]).
                        Default: ``"threshold"``

        Returns:
            *tuple* ``(gates, masked_logits, original_logits)``: gates (B, T) in
            [0, 1] (0 at padding; 1 = kept), the logits (B, C) of the model with
            the site mixed as ``z * h + (1 - z) * b``, and its logits unmasked.
        """
        if not self.is_fitted:
            raise ValueError("DiffMask is not fitted: call fit(...) or DiffMask.load(...) first")
        if layer is None:
            raise ValueError(f"layer must be given: an int in 0..{self.num_layers}")
        ids, _ = check_token_ids(inputs)
        layer = check_layer(layer, self.num_layers, allow_none=False)
        extra = format_additional_args(additional_forward_args)
        with frozen(self.model):
            mask = self.model_forward.padding_mask(ids, extra)
            gates, masked, original = self._masked_batch(ids, extra, [layer], rule)[layer]
        return gates * mask.to(gates.dtype), masked, original

    def _masked_batch(
        self, ids: Tensor, extra: Tuple[Any, ...], layers: Sequence[int], rule: str
    ) -> Dict[int, Tuple[Tensor, Tensor, Tensor]]:
        r"""One capture pass, then for each layer its deterministic gates and the
        masked logits (only the part after the site re-run where possible)."""
        outputs: Optional[Dict[str, Any]] = {} if self.mode == "hidden" and self.rerun == "partial" else None
        names = self.locator.names if outputs is not None else self._needed_sites(None)
        states, original = self._capture(ids, extra, names, run_all=True, module_outputs=outputs)
        assert original is not None
        results = {}
        for k in layers:
            gates = self._deterministic_gates(states, k, rule)
            site, baseline = self._masked_site(k)
            masked = self._masked_logits(ids, extra, site, mix_baseline(states[site], gates, baseline), outputs)
            results[k] = (gates, masked, original)
        return results

    @torch.no_grad()
    def evaluate(
        self,
        dataloader: Iterable[Batch],
        layers: Optional[Sequence[int]] = None,
        rule: str = "threshold",
    ) -> Dict[int, Dict[str, float]]:
        r"""
        Scores the fitted probe on held-out batches with deterministic gates.

        Args:

            dataloader (iterable): batches as :meth:`fit` takes them.
            layers (sequence of int, optional): the layers to score; all when None.
                        Default: None
            rule (str, optional): see :meth:`masked_forward`. Default: ``"threshold"``

        Returns:
            *dict* ``layer -> {"kl", "agreement", "l0"}``: the mean
            KL(original || masked) in nats and the share of examples whose argmax
            is unchanged, over examples; the share of real positions kept
            (gate > 0), over positions.
        """
        if not self.is_fitted:
            raise ValueError("DiffMask is not fitted: call fit(...) or DiffMask.load(...) first")
        chosen = list(range(self.num_layers + 1)) if layers is None else [check_layer(k, self.num_layers, allow_none=False) for k in layers]
        if not chosen:
            raise ValueError("layers must name at least one layer")
        with frozen(self.model):
            return self._evaluate(dataloader, chosen, rule)

    def _evaluate(self, dataloader: Iterable[Batch], layers: Sequence[int], rule: str) -> Dict[int, Dict[str, float]]:
        sums = {k: {"kl": 0.0, "agreement": 0.0, "kept": 0.0} for k in layers}
        examples, positions = 0, 0.0
        for batch in dataloader:
            ids, extra = split_batch(batch)
            ids, _ = check_token_ids(ids, "validation batch")
            mask = self.model_forward.padding_mask(ids, extra).float()
            with torch.no_grad():
                for k, (gates, masked, original) in self._masked_batch(ids, extra, layers, rule).items():
                    log_p, log_q = log_probs(original), log_probs(masked)
                    sums[k]["kl"] += float(kl_divergence(log_p, log_q).sum())
                    sums[k]["agreement"] += float((log_p.argmax(-1) == log_q.argmax(-1)).float().sum())
                    sums[k]["kept"] += float(((gates > 0).float() * mask).sum())
            examples += ids.shape[0]
            positions += float(mask.sum())
        if examples == 0:
            raise ValueError("validation: no batches")
        return {
            k: {"kl": v["kl"] / examples, "agreement": v["agreement"] / examples, "l0": v["kept"] / max(positions, 1.0)}
            for k, v in sums.items()
        }

    # ------------------------------------------------------------ checkpoints
    def _config(self) -> Dict[str, Any]:
        return {
            "mode": self.mode,
            "temperature": self.temperature,
            "stretch": list(self.stretch),
            "probe_hidden_size": self.probe_hidden_size,
            "l0": self.l0,
            "probe_reads_input": self.probe_reads_input,
            "rerun": self.rerun,
            "init_bias": self.init_bias,
        }

    def save(self, path: Union[str, os.PathLike]) -> None:
        r"""
        Saves the fitted probe, baselines and multipliers with what identifies the
        model they belong to (its sites and parameter shapes).

        Args:

            path (str or PathLike): the file to write.
        """
        if not self.is_fitted:
            raise ValueError("DiffMask is not fitted: nothing to save")
        assert self.probe is not None and self.lambdas is not None
        torch.save(
            {
                "format": _CHECKPOINT_FORMAT,
                "config": self._config(),
                "site_sizes": dict(self.site_sizes),
                "sites": [list(s) for s in self.locator.describe()],
                "model_signature": model_signature(self.model),
                "probe": self.probe.state_dict(),
                "lambdas": self.lambdas.state_dict(),
            },
            path,
        )

    @classmethod
    def load(
        cls,
        path: Union[str, os.PathLike],
        model: nn.Module,
        sites: Union[None, SiteLocator, Mapping[str, Any]] = None,
        forward_func: Optional[Callable[..., Any]] = None,
        padding_mask_arg: Union[int, str, None] = "auto",
    ) -> "DiffMask":
        r"""
        Loads a checkpoint written by :meth:`save` for ``model``.

        Args:

            path (str or PathLike): the checkpoint.
            model (nn.Module): the analysed model; must be the one it was fitted on
                        (same architecture, same sites).
            sites, forward_func, padding_mask_arg: as in the constructor.

        Returns:
            *DiffMask*, fitted.

        Raises:
            ValueError: the checkpoint belongs to another model or is not a
                        DiffMask checkpoint.
        """
        checkpoint = torch.load(path, map_location="cpu", weights_only=True)
        if not isinstance(checkpoint, dict) or checkpoint.get("format") != _CHECKPOINT_FORMAT:
            raise ValueError(f"path: {path} is not a DiffMask checkpoint")
        config = dict(checkpoint["config"])
        config["stretch"] = tuple(config["stretch"])
        explainer = cls(model, sites=sites, forward_func=forward_func, padding_mask_arg=padding_mask_arg, **config)
        saved_sites = [tuple(s) for s in checkpoint["sites"]]
        if saved_sites != explainer.locator.describe():
            raise ValueError(
                f"model: the checkpoint was fitted on a model with sites {saved_sites}, "
                f"this model has {explainer.locator.describe()}"
            )
        if checkpoint["model_signature"] != model_signature(model):
            raise ValueError(
                "model: the checkpoint was fitted on another model (its parameter "
                f"shapes differ from those of this {type(model).__name__})"
            )
        explainer.site_sizes = dict(checkpoint["site_sizes"])
        explainer._make_modules()
        assert explainer.probe is not None and explainer.lambdas is not None
        explainer.probe.load_state_dict(checkpoint["probe"])
        explainer.lambdas.load_state_dict(checkpoint["lambdas"])
        return explainer
