"""How :meth:`DiffMask.fit` trains the probe: its options, one training step, the
epochs until convergence, and the checkpoint selection on held-out batches.

One step: a capture pass without gradients (every site and the original
logits), the layers trained on the batch (all of the trained layers, or one
drawn from them, ``layers_per_batch``), for each of them gates sampled from the
probe, a pass with the site replaced by ``z * h + (1 - z) * b`` and the
Lagrangian ``L0 + lambda_k * (mean KL - eps)``: the probe and baselines descend
on the sum, each ``lambda_k`` moves by the multiplier rule and is clamped.
"""

from __future__ import annotations

import collections.abc
import contextlib
import copy
import dataclasses
import difflib
import inspect
import itertools
import logging
import math
import random
import time
import warnings
from dataclasses import dataclass
from typing import Any, Callable, ContextManager, Dict, Iterable, List, Mapping, Optional, Protocol, Sequence, Tuple, Union

import torch
from torch import Tensor
from tqdm.auto import tqdm

from captum_diffmask.model.attribution import check_layer, PreparedCall
from captum_diffmask.model.checks import check_choice
from captum_diffmask.diffmask.constrained.pi_control import PIMultiplierControl
from captum_diffmask.diffmask.constrained.convergence import Convergence, LayerMonitor, SETTLED, warn_unconverged
from captum_diffmask.diffmask.fit.distributed import (
    all_sum, any_rank, average_gradients, global_batch_sizes, is_distributed, rank_and_world, reads_its_own_shard,
    shared_seed, shared_uniform, sharded,
)
from captum_diffmask.model.forward import Batch, frozen
from captum_diffmask.diffmask.gates import COMPONENT_MODES, Gates, VOTE_SAMPLING
from captum_diffmask.diffmask.constrained.lookahead import Lookahead
from captum_diffmask.model.divergences import example_kl, log_probs, same_prediction
from captum_diffmask.diffmask.sparsity import l0_penalty, score_function_term
from captum_diffmask.diffmask.constrained.multipliers import LagrangeMultipliers, MULTIPLIER_RULES, multiplier_rates
from captum_diffmask.diffmask.fit.fit_state import FitCheckpoint, PathLike, Position, rng_states, set_rng_states
from captum_diffmask.model.rng import preserved_rng
from captum_diffmask.diffmask.stacking import masked_logits

#: Where the fit reports its progress: one line per trained layer and epoch, at
#: INFO, when ``verbose`` (attach a handler, or ``logging.basicConfig(level=logging.INFO)``).
LOGGER = logging.getLogger("captum_diffmask")

#: The probe's optimisers :class:`FitOptions` knows.
OPTIMIZERS = ("adam", "rmsprop", "lookahead-rmsprop")
#: What :class:`FitOptions` ``layers_per_batch`` takes.
LAYERS_PER_BATCH = ("one", "all")
#: What :class:`FitOptions` ``stack_layers`` takes.
STACK_LAYERS = ("same_site", "all", "none")
#: What :class:`FitOptions` ``precision`` takes.
PRECISIONS = ("float32", "bfloat16")
#: What :class:`FitOptions` ``constraint`` takes.
CONSTRAINTS = ("sampled", "deployed", "deterministic")
#: The ``"pi"`` multiplier's settings :class:`FitOptions` ``controller`` takes.
CONTROLLER_SETTINGS = ("kp", "ki", "smoothing", "max_error", "floor")
#: The ``"pi"`` multiplier's step on log lambda when ``lr_lambda`` is None.
DEFAULT_PI_RATE = 0.01
#: :class:`FitOptions` ``l0_floor`` by mode when it is None (modes not named: 0,
#: the paper's expected L0). Empty: the floor raised the mean ROC AUC of the
#: component modes on tracr programs no report scores (0.80 -> 0.91 at 0.05), but
#: on a tiny BERT it closed a needed head past eps (KL 0.073 > 0.05), so it is not
#: yet a default (``docs/guide/components.md``).
DEFAULT_L0_FLOOR: Dict[str, float] = {}
#: A pinned starting baseline: one (H,) vector (input mode), or layer -> (H,) (hidden mode).
InitBaseline = Union[None, Tensor, Mapping[int, Tensor]]


class Fittable(Protocol):
    r"""
    What the fit needs of the explainer it trains (:class:`~captum_diffmask.DiffMask`
    offers it): the model and its sites, the probe and multipliers with their
    gates, and the passes that read and replace sites.
    """

    model: torch.nn.Module
    mode: str
    l0: str
    probe: Optional[torch.nn.Module]
    lambdas: Optional[LagrangeMultipliers]
    site_sizes: Dict[str, int]
    fitted_layers: List[int]
    convergence: Dict[int, Any]

    @property
    def num_layers(self) -> int: ...  # noqa: E704 - a protocol's signature

    @property
    def gated_layers(self) -> List[int]: ...  # noqa: E704 - the layers a fit trains by default

    @property
    def independent_layers(self) -> bool: ...  # noqa: E704

    @property
    def gates(self) -> Gates: ...  # noqa: E704

    @property
    def site_names(self) -> List[str]: ...  # noqa: E704

    def follow_model(self) -> None: ...  # noqa: E704

    def config(self) -> Dict[str, Any]: ...  # noqa: E704

    def prepare_batch(self, batch: Any, layer: Any, argument: str) -> PreparedCall: ...  # noqa: E704

    def capture(self, call: PreparedCall, names: Optional[Iterable[str]] = None,
                stop_early: bool = False) -> Tuple[Dict[str, Tensor], Optional[Tensor]]: ...  # noqa: E704

    def replaced_logits(self, call: PreparedCall, replacements: Mapping[str, Any]) -> Tensor: ...  # noqa: E704

    def build_probe(self, states: Dict[str, Tensor], mask: Tensor, reduce: Any = None,
                    call: Optional[PreparedCall] = None) -> None: ...  # noqa: E704

    def restore_probe(self, site_sizes: Mapping[str, int], probe: Mapping[str, Any],
                      lambdas: Mapping[str, Any]) -> None: ...  # noqa: E704

    def evaluate(self, dataloader: Iterable[Batch], layers: Optional[Sequence[int]] = None,
                 rule: str = "threshold") -> Dict[int, Dict[str, float]]: ...  # noqa: E704


@dataclass
class FitOptions:
    r"""
    The options of :meth:`DiffMask.fit`, checked before any forward pass.

    Attributes:
        epochs (int, optional): the most passes over the data loader (a cap);
                    None: as many as the steps need.
        eps (float): the margin on KL(original || masked), nats, on the batch mean.
        lr (float): learning rate of the gate networks.
        lr_baseline (float): learning rate of the baselines (0 keeps them fixed).
        lr_lambda (float or sequence of float, optional): the multipliers' rate,
                    one for all or one per layer (L + 1 values, layer 0 first);
                    None: the rule's own (``"pi"``: 0.01 on log lambda; the
                    others: 1.0).
        layers (sequence of int, optional): the trained layers; all when None.
        layers_per_batch (str): ``"all"`` (default): every one of them on
                    every batch, each with its own masked pass and all sharing
                    the batch's capture pass, with one optimiser step on the sum
                    of their Lagrangians (the full expectation over the layers
                    instead of a one-layer sample); ``"one"``: one of them drawn,
                    uniformly, per batch (the authors'; an epoch then costs about
                    one layer's step per batch, and each layer gets 1 / len(layers)
                    of the steps).
        stack_layers (str): which of a step's layers share one masked pass,
                    their batches stacked (:mod:`captum_diffmask.diffmask.stacking`: the
                    same arithmetic): ``"same_site"`` (default) the layers whose
                    gates replace the same site (input mode's, every depth
                    masking the input; the other modes' sites differ, so their
                    passes stay one per layer); ``"all"`` every layer of the step,
                    the pass starting at the shallowest replaced site (hidden
                    mode's deeper layers then re-run blocks before their site:
                    more arithmetic, fewer kernel launches, for a device where a
                    pass costs its launches); ``"none"`` one pass per layer,
                    one layer's graph in memory at a time. Component modes
                    always run one pass per layer.
        max_steps (int, optional): the most steps (optimiser steps, one per
                    batch) in all (a cap). When neither it nor ``epochs`` is
                    given, the convergence criterion's budget: ``convergence.budget``
                    steps at each layer (4 000 by default, ten times the fewest
                    that can converge), so that a fit ends in bounded time.
        seed (int, optional): seeds the probe's initialisation, the gate noise and
                    the layer draw, on a fork of the global RNG (the caller's
                    state is left as found).
        verbose (bool): a tqdm progress bar per epoch with the last window's
                    figures.
        optimizer (str): ``"adam"`` (betas 0.9, 0.99), ``"rmsprop"`` (centred)
                    or ``"lookahead-rmsprop"`` (centred RMSprop in Lookahead, k 6,
                    alpha 0.5: the authors') for the probe and baselines.
        validation (iterable, optional): held-out batches scored after every
                    epoch with deterministic gates; the probe of the sparsest epoch
                    that keeps ``eps_valid`` and ``agreement_valid`` at every
                    trained layer is restored at the end.
        eps_valid (float, optional): the selection's KL bound; ``eps`` when None.
        agreement_valid (float): the selection's least share of examples whose
                    masked argmax equals the original one.
        multiplier (str): ``"pi"`` (a PI controller on each layer's
                    smoothed divergence, in log space:
                    :mod:`captum_diffmask.diffmask.constrained.pi_control`), ``"damped"`` (additive
                    rise while violated, geometric decay while the constraint
                    holds), ``"balanced"`` (a rise that
                    mirrors the decay for small violations: the KL is held at eps,
                    the gates close more slowly) or ``"ascent"`` (see
                    :meth:`LagrangeMultipliers.optimizer`).
        constraint (str): what the multipliers hold within eps:
                    ``"sampled"``, the mean KL under the sampled gates the
                    probe is trained with (the paper), or ``"deployed"``, the
                    larger of that and the KL under the deterministic gates
                    that :meth:`DiffMask.attribute` and
                    :meth:`DiffMask.masked_forward` return (one more masked
                    pass per layer and step, without gradients): what is
                    deployed then meets the constraint the fit targets; or
                    ``"deterministic"``, the deterministic gates' KL alone (the
                    same extra pass): the probe still descends the sampled KL,
                    but relaxed draws between closed and open that the
                    deployed read-out never makes (a gate held at an
                    intermediate keep probability) do not hold the multiplier
                    up. Default: ``"deployed"``.
        controller (dict, optional): settings of the ``"pi"`` multiplier
                    (:class:`~captum_diffmask.diffmask.constrained.pi_control.PIMultiplierControl`:
                    ``kp``, ``ki``, ``smoothing``, ``max_error``, ``floor``).
        precision (str): the analysed model's passes during the fit:
                    ``"float32"``, or ``"bfloat16"`` (autocast: about 2.5x faster
                    on CPUs with AMX and on GPUs; on SST with MiniLM the output
                    moves by a KL of 1e-5 on average, far below any eps). The
                    probe, the divergences and the multipliers stay float32, and
                    ``attribute``, ``evaluate`` and the checkpoint selection run
                    the model as it is.
        vote_sampling (str): input mode, how the gate of layer k is sampled:
                    ``"product"`` (the authors': the product of k + 1 relaxed
                    vote samples) or ``"joint"`` (one Hard Concrete gate whose
                    ``P(z != 0)`` is the product of the votes' probabilities,
                    :meth:`~captum_diffmask.diffmask.hard_concrete.HardConcrete.with_prob_nonzero`). Both have the
                    same keep probability, L0 and attribution; a product of
                    relaxed samples also shrinks the kept tokens (each factor a
                    little below 1), which the deterministic read-out does not.
        lagrangian (str): what the probe descends: ``"plain"``, the Lagrangian
                    ``L0 + lambda * (KL - eps)``, or ``"normalized"``, the same
                    divided by ``1 + lambda`` (lambda held fixed in the divisor):
                    the same stationary points, with a gradient whose scale
                    stays that of the larger of the two terms whatever lambda.
        until_converged (bool): stop once every trained layer has converged.
        freeze_converged (bool): where each layer's gate networks, baselines
                    and multiplier are its own (hidden mode; input mode with
                    ``votes="per_depth"``), stop training a layer once it has
                    converged or ended ``needed``, keeping the probe its verdict
                    was judged on, while the other layers go on (with
                    ``until_converged``). Without it a settled layer keeps
                    training until every layer is settled at the same time, and
                    its window means can drift out of the criterion again.
                    Tied votes (``votes="tied"``) serve several depths, so no layer is frozen there.
        convergence (Convergence, optional): the criterion; ``Convergence()``
                    when None.
        init_baseline (Tensor or dict, optional): where the baselines start
                    instead of the mean state of the first batch: an (H,) vector
                    in input mode, ``{layer: (H,) vector}`` in hidden mode,
                    ``{layer: (count, width)}`` in the component modes (zeros:
                    zero ablation); with ``lr_baseline=0`` they stay there.
        activations (str): ``"all"``: every step keeps the activations of every
                    site from its capture pass; ``"needed"``: only those of the
                    sites up to the step's layer (less memory for deep models,
                    the same fit).
        checkpoint (str or PathLike, optional): a file the fit's whole state is
                    written to every ``checkpoint_every`` steps and at its end; a
                    fit given a file that exists resumes from it and ends with the
                    probe of an uninterrupted fit; one that ended at its cap goes
                    on when ``max_steps`` or ``epochs`` is raised
                    (:mod:`captum_diffmask.diffmask.fit.fit_state`).
        checkpoint_every (int): steps between two writes of ``checkpoint``.
        l0_floor (float, optional): the least gradient of the L0 in an open
                    gate's logit (its value unchanged,
                    :meth:`~captum_diffmask.diffmask.hard_concrete.HardConcrete.log_prob_nonzero_floored`):
                    the plain expected L0's vanishes as a gate saturates open, and
                    a gate the probe opened wide on some inputs then stays open
                    however little the output needs it. None: the mode's default,
                    :data:`DEFAULT_L0_FLOOR` (0, the paper's L0, in every mode
                    for now).
        score_gradient (bool): add to the KL's pathwise gradient a
                    score-function estimate through each gate's open/closed
                    event, with the batch's mean KL as baseline
                    (:func:`~captum_diffmask.diffmask.sparsity.score_function_term`):
                    where the output is a step function of a gate's value the
                    pathwise gradient is zero and a needed gate can close
                    unnoticed (``docs/guide/components.md``). The constraint's
                    value is unchanged. Default: False
        lambda_max (float): the multipliers' ceiling. The authors' 200 binds
                    where many gates each matter little but together a lot (a
                    per-task mask over a real model's heads: the constraint
                    stays violated with every multiplier at 200,
                    ``docs/results/components-sst-per-task.md``). Default: 200.0
    """

    epochs: Optional[int] = None
    eps: float = 0.1
    lr: float = 3e-3
    lr_baseline: float = 1e-3
    lr_lambda: Union[None, float, Sequence[float]] = None
    layers: Optional[Sequence[int]] = None
    layers_per_batch: str = "all"
    stack_layers: str = "same_site"
    max_steps: Optional[int] = None
    seed: Optional[int] = None
    verbose: bool = True
    optimizer: str = "adam"
    validation: Optional[Iterable[Batch]] = None
    eps_valid: Optional[float] = None
    agreement_valid: float = 0.0
    multiplier: str = "pi"
    lagrangian: str = "plain"
    constraint: str = "deployed"
    controller: Optional[Mapping[str, float]] = None
    precision: str = "float32"
    vote_sampling: str = "joint"
    until_converged: bool = True
    freeze_converged: bool = True
    convergence: Optional[Convergence] = None
    init_baseline: InitBaseline = None
    activations: str = "all"
    checkpoint: Optional[PathLike] = None
    checkpoint_every: int = 100
    l0_floor: Optional[float] = None
    score_gradient: bool = False
    lambda_max: float = 200.0

    def l0_floor_for(self, mode: str) -> float:
        r"""``l0_floor``, or ``mode``'s default when it is None."""
        return float(DEFAULT_L0_FLOOR.get(mode, 0.0) if self.l0_floor is None else self.l0_floor)

    @property
    def multiplier_rate(self) -> Union[float, Sequence[float]]:
        r"""``lr_lambda``, or the multiplier rule's own rate when it is None."""
        if self.lr_lambda is not None:
            return self.lr_lambda
        return DEFAULT_PI_RATE if self.multiplier == "pi" else 1.0

    def check(self, num_layers: int, gated_layers: Optional[Sequence[int]] = None) -> List[int]:
        r"""Validates every option (errors name it); returns the trained layers
        (``gated_layers``, by default ``0 .. num_layers``, when ``layers`` is None)."""
        if self.epochs is not None:
            _check_int(self.epochs, "epochs")
        if self.max_steps is not None:
            _check_int(self.max_steps, "max_steps")
        _check_int(self.checkpoint_every, "checkpoint_every")
        for name in ("lr", "lambda_max"):
            _check_positive(getattr(self, name), name)
        for name in ("eps", "lr_baseline") + (("l0_floor",) if self.l0_floor is not None else ()):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0:
                raise ValueError(f"{name} must be a number >= 0, got {value!r}")
        gated = list(range(num_layers + 1)) if gated_layers is None else list(gated_layers)
        layers = gated if self.layers is None else list(self.layers)
        if not layers:
            raise ValueError("layers must name at least one layer")
        for k in layers:
            check_layer(k, num_layers)
            if k not in gated:
                raise ValueError(f"layers: {k} has no gates here; the layers are {gated}")
        if not self.agreement_valid <= 1:
            raise ValueError(f"agreement_valid must be <= 1, got {self.agreement_valid!r}")
        if self.eps_valid is not None and not self.eps_valid >= 0:
            raise ValueError(f"eps_valid must be >= 0, got {self.eps_valid!r}")
        if self.optimizer not in OPTIMIZERS:
            raise ValueError(f"optimizer must be one of {OPTIMIZERS}, got {self.optimizer!r}")
        if self.multiplier not in MULTIPLIER_RULES:
            raise ValueError(f"multiplier must be one of {MULTIPLIER_RULES}, got {self.multiplier!r}")
        multiplier_rates(self.multiplier_rate, num_layers + 1)
        check_choice(self.constraint, CONSTRAINTS, "constraint")
        check_choice(self.precision, PRECISIONS, "precision")
        check_choice(self.vote_sampling, VOTE_SAMPLING, "vote_sampling")
        unknown = set(self.controller or {}) - set(CONTROLLER_SETTINGS)
        if unknown:
            raise ValueError(f"controller: unknown settings {sorted(unknown)}; it takes {CONTROLLER_SETTINGS}")
        check_choice(self.activations, ("all", "needed"), "activations")
        check_choice(self.layers_per_batch, LAYERS_PER_BATCH, "layers_per_batch")
        check_choice(self.stack_layers, STACK_LAYERS, "stack_layers")
        check_choice(self.lagrangian, ("plain", "normalized"), "lagrangian")
        for name in ("until_converged", "freeze_converged", "score_gradient"):
            if not isinstance(getattr(self, name), bool):
                raise TypeError(f"{name} must be True or False, got {getattr(self, name)!r}")
        if self.convergence is not None and not isinstance(self.convergence, Convergence):
            raise TypeError(f"convergence must be a Convergence, got {type(self.convergence).__name__}")
        return layers


def fit_options(options: Union[None, FitOptions, Mapping[str, Any]], overrides: Mapping[str, Any]) -> FitOptions:
    r"""
    The options of a fit: ``options`` (a :class:`FitOptions`, a dict of its
    fields, or None for the defaults) with ``overrides`` set over them.

    Raises:
        TypeError naming an unknown option (with the closest known name) or an
        ``options`` of another type.
    """
    if options is None:
        options = FitOptions()
    elif isinstance(options, Mapping):
        overrides, options = {**options, **overrides}, FitOptions()
    elif not isinstance(options, FitOptions):
        raise TypeError(f"options must be a FitOptions, a dict of its fields or None, got {type(options).__name__}")
    known = [f.name for f in dataclasses.fields(FitOptions)]
    for name in overrides:
        if name not in known:
            close = difflib.get_close_matches(name, known, n=1)
            hint = f"; did you mean {close[0]!r}?" if close else "."
            raise TypeError(f"fit: unknown option {name!r}{hint} The options are FitOptions' fields: {', '.join(known)}")
    return dataclasses.replace(options, **overrides)


def signed_with_options(function: Callable[..., Any]) -> Callable[..., Any]:
    r"""Gives ``function`` (which takes the options as ``**overrides``) a
    signature that lists every :class:`FitOptions` field as a keyword-only
    parameter with its default: ``help()``, editors and the option routing of
    ``compare`` see the options by name, documented once in :class:`FitOptions`."""
    signature = inspect.signature(function)
    kept = [p for p in signature.parameters.values() if p.kind != inspect.Parameter.VAR_KEYWORD]
    taken = {p.name for p in kept}
    options = [inspect.Parameter(f.name, inspect.Parameter.KEYWORD_ONLY, default=f.default, annotation=f.type)
               for f in dataclasses.fields(FitOptions) if f.name not in taken]
    function.__signature__ = signature.replace(parameters=kept + options)  # type: ignore[attr-defined]
    return function


def _check_int(value: Any, name: str) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be an int >= 1, got {value!r}")


def _check_positive(value: Any, name: str) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise ValueError(f"{name} must be a number > 0, got {value!r}")


class _FitLoop:
    r"""The state of one fit across epochs: the layers and their draw, the
    optimisers (built on the first batch), the step count and the convergence
    monitors, which decide when the loop is done."""

    def __init__(self, options: FitOptions, layers: List[int], independent_layers: bool) -> None:
        self.options, self.layers = options, layers
        self.eps = float(options.eps)
        self.rng = random.Random(options.seed)
        criterion = options.convergence or Convergence()
        self.trained = sorted(set(layers))
        # the layers still trained: a settled layer whose probe is its own is frozen
        self.active = list(self.trained)
        self.freezes = options.freeze_converged and options.until_converged and independent_layers
        self.monitors = {k: LayerMonitor(k, self.eps, criterion) for k in self.trained}
        self.open_share = criterion.open_share
        self.max_steps = options.max_steps
        if options.max_steps is None and options.epochs is None:
            # the criterion's budget at each layer; a layer drawn one batch in
            # len(trained) gets that share of the steps
            self.max_steps = criterion.budget * (1 if options.layers_per_batch == "all" else len(self.trained))
        self.optimizers: Optional[Tuple[torch.optim.Optimizer, MultiplierUpdate]] = None
        self.step = 0
        self.done = False
        self.converged = False

    def state_dict(self) -> Dict[str, Any]:
        r"""What a resumed fit needs of the loop (the optimisers are saved apart)."""
        return {"step": self.step, "rng": self.rng.getstate(), "active": list(self.active),
                "monitors": {k: m.state_dict() for k, m in self.monitors.items()}, "done": self.done,
                "converged": self.converged}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.step, self.active = int(state["step"]), list(state["active"])
        for k, monitor in state["monitors"].items():
            self.monitors[k].load_state_dict(monitor)
        self.rng.setstate(state["rng"])
        self.done, self.converged = bool(state["done"]), bool(state["converged"])

    def draw(self) -> List[int]:
        r"""The layers trained on the next batch: one drawn uniformly, or all."""
        if self.options.layers_per_batch == "all":
            return self.active
        return [self.rng.choice([k for k in self.layers if k in self.active])]

    def after_step(self, records: Mapping[int, Mapping[str, float]], lams: Mapping[int, float]) -> List[int]:
        r"""Counts the step and records it at each of its layers; the layers of
        which it closed a window."""
        self.step += 1
        closed = [k for k, record in records.items()
                  if self.monitors[k].record(record["constraint"], record["l0"], lams[k], record.get("closure"))]
        if self.freezes:
            self._freeze_settled(closed)
        max_steps = self.max_steps
        if max_steps is not None and self.step >= max_steps:
            self.done = True
        elif closed and self.options.until_converged:
            self.converged = all(m.status() in SETTLED for m in self.monitors.values())
            self.done = self.converged
        return closed

    def _freeze_settled(self, closed: Sequence[int]) -> None:
        r"""Stops training the layers of ``closed`` that are settled, while
        another layer still trains (the last one ends the fit as it is)."""
        for k in closed:
            if self.monitors[k].status() in SETTLED and len(self.active) > 1:
                self.active.remove(k)
                LOGGER.info("DiffMask fit: layer %d %s after %d of its steps; frozen, %d layers still train",
                            k, self.monitors[k].status(), self.monitors[k].steps, len(self.active))

    def stopped_by(self) -> str:
        r"""What ended the run, for the warning: the cap it reached, or
        ``until_converged=False``."""
        options = self.options
        if self.max_steps is not None and self.step >= self.max_steps and not self.converged:
            if options.max_steps is None:
                return f"the criterion's budget of {self.max_steps} steps (convergence.max_windows)"
            return f"the cap max_steps={options.max_steps}"
        if not options.until_converged:
            return f"epochs={options.epochs} with until_converged=False"
        return f"the cap epochs={options.epochs} ({self.step} steps)"


# ------------------------------------------------------------------ the fit
def run_fit(explainer: Fittable, dataloader: Iterable[Batch], options: FitOptions) -> List[Dict[str, Any]]:
    r"""Trains ``explainer``'s probe as :meth:`DiffMask.fit` documents; returns
    the history and sets ``explainer.convergence``."""
    layers = options.check(explainer.num_layers, explainer.gated_layers)
    _check_reiterable(dataloader, options.epochs)
    explainer.follow_model()
    options = dataclasses.replace(options, seed=shared_seed(options.seed))
    loop = _FitLoop(options, layers, independent_layers=explainer.independent_layers)
    explainer.fitted_layers = sorted(set(explainer.fitted_layers) | set(loop.trained))
    selection = None if options.validation is None else CheckpointSelection(options, layers)
    saver = None if options.checkpoint is None else FitCheckpoint(options.checkpoint, options.checkpoint_every)
    seeded = preserved_rng(options.seed) if options.seed is not None else contextlib.nullcontext()
    with frozen(explainer.model), seeded:
        run = _Run(explainer, loop, selection, saver)
        if saver is not None and saver.exists():
            run.resume(saver.read(explainer.config(), layers))
            run.reopen()
        if not run.finished:
            run.train(dataloader)
            if selection is not None:
                selection.restore(explainer, run.history)
            explainer.convergence = {k: m.report() for k, m in loop.monitors.items()}
            run.save(finished=True)
    if rank_and_world()[0] == 0:
        warn_unconverged(loop.monitors, loop.stopped_by(), stacklevel=4)
    return run.history


class _Run:
    r"""One call of the fit: the epochs it trains, where it stands in them, and
    the writes of its state to ``saver`` (with the resumption from it)."""

    def __init__(self, explainer: Fittable, loop: _FitLoop, selection: Optional["CheckpointSelection"],
                 saver: Optional[FitCheckpoint]) -> None:
        self.explainer, self.loop, self.selection, self.saver = explainer, loop, selection, saver
        self.history: List[Dict[str, Any]] = []
        self.position = Position()
        self.sums: Dict[int, Dict[str, float]] = {}
        self.rng: Optional[Dict[str, Any]] = None  # where a resumed fit's RNG stood
        self.finished = False
        self.began = time.perf_counter()  # the current epoch's start, less a resumed epoch's earlier part

    def train(self, dataloader: Iterable[Batch]) -> None:
        options, loop = self.loop.options, self.loop
        rank, world = rank_and_world()
        shard = world > 1 and not reads_its_own_shard(dataloader)
        start = self.position.epoch
        for epoch in itertools.count(start) if options.epochs is None else range(start, options.epochs + 1):
            bar = self._epoch_batches(sharded(dataloader, rank, world) if shard else dataloader, epoch)
            # an epoch resumed part-way counts the seconds its earlier part took
            self.began, before, resumed = time.perf_counter() - self.position.seconds, loop.step, self.position.batches
            self.sums = train_epoch(self.explainer, bar, loop, self.sums, self._after_step)
            if loop.step == before and not resumed:
                raise ValueError(f"dataloader: no batches in epoch {epoch}" if epoch > 1 else "dataloader: no batches")
            self.position.seconds = time.perf_counter() - self.began
            rows = epoch_rows(self.explainer, epoch, self.sums, self.position.seconds, loop.monitors)
            if self.selection is not None:
                self.selection.after_epoch(self.explainer, epoch, rows)
            self.history.extend(rows)
            if options.verbose and rank == 0:
                _log_epoch(epoch, options.epochs, rows)
            if loop.done:
                break  # the sums stay: a fit reopened with a larger cap goes on in this epoch
            self.sums = {}

    def _epoch_batches(self, batches: Iterable[Batch], epoch: int) -> Iterable[Batch]:
        r"""The epoch's batches behind a progress bar; for the epoch a resumed fit
        stopped in, drawn again from its starting RNG, the trained ones skipped,
        then the RNG set to where the fit stood."""
        options, rank = self.loop.options, rank_and_world()[0]
        resuming = self.rng is not None and epoch == self.position.epoch
        if resuming:
            assert self.position.epoch_rng is not None
            set_rng_states(self.position.epoch_rng)
        else:
            self.position = Position(epoch, 0, rng_states())
        # tqdm.auto iterates `batches` once when it is made (and drops that
        # iterator): a loader that draws from an RNG or counts its passes draws
        # twice an epoch, and every committed report's fit drew so; a resumed
        # epoch is drawn through the same bar
        bar = tqdm(batches, desc=f"DiffMask fit {epoch}/{options.epochs or '-'}",
                   disable=None if options.verbose and rank == 0 else True, leave=False)
        if not resuming:
            return bar
        assert self.rng is not None
        iterator = iter(bar)
        for _ in range(self.position.batches):
            next(iterator, None)
        set_rng_states(self.rng)
        self.rng = None
        return iterator

    def _after_step(self) -> None:
        self.position.batches += 1
        if self.saver is not None and self.saver.due(self.loop.step):
            self.position.seconds = time.perf_counter() - self.began
            self.save(finished=False)

    def reopen(self) -> None:
        r"""
        Reopens a resumed fit that ended at its cap (``max_steps`` or ``epochs``)
        when this call's caps allow more: it goes on in the epoch it stopped in
        (that epoch's history rows are dropped; the state's running sums of the
        epoch give them again at its end), so that it ends with the probe of
        one call with the larger cap. A fit that
        converged stays finished, and so does one whose probe the checkpoint
        selection restored (its last probe is gone).
        """
        loop, options, epoch = self.loop, self.loop.options, self.position.epoch
        if not self.finished or loop.converged or self.selection is not None:
            return
        if loop.max_steps is not None and loop.step >= loop.max_steps:
            return
        if loop.done:  # the step cap stopped it inside an epoch: on in that epoch
            # (a state written before the epoch's sums were kept has none to go on with)
            if (options.epochs is not None and epoch > options.epochs) or not self.sums:
                return
            self.history = [row for row in self.history if row["epoch"] != epoch]
        else:  # its epochs ran out: on with the next one, from the RNG as it ended
            if options.epochs is not None and epoch >= options.epochs:
                return
            assert self.rng is not None
            set_rng_states(self.rng)
            self.rng, self.position, self.sums = None, Position(epoch + 1), {}
        self.finished = loop.done = False
        LOGGER.info("DiffMask fit: reopened at step %d (epoch %d): its cap was reached, this call's is %s",
                    loop.step, epoch, loop.max_steps if loop.max_steps is not None else f"epochs={options.epochs}")

    def save(self, finished: bool) -> None:
        r"""Writes the fit's state (only the first process of a distributed fit)."""
        if self.saver is None or rank_and_world()[0] != 0 or self.loop.optimizers is None:
            return
        explainer, (probe_opt, multipliers) = self.explainer, self.loop.optimizers
        assert explainer.probe is not None and explainer.lambdas is not None
        self.saver.write({
            "config": explainer.config(), "layers": self.loop.layers, "site_sizes": explainer.site_sizes,
            "probe": explainer.probe.state_dict(), "lambdas": explainer.lambdas.state_dict(),
            "probe_optimizer": probe_opt.state_dict(), "multipliers": multipliers.state_dict(),
            "loop": self.loop.state_dict(), "selection": None if self.selection is None else self.selection.best,
            "history": self.history, "sums": self.sums, "position": vars(self.position), "rng": rng_states(),
            "convergence": explainer.convergence, "finished": finished,
        })

    def resume(self, state: Mapping[str, Any]) -> None:
        r"""Restores a state :meth:`save` wrote."""
        explainer = self.explainer
        explainer.restore_probe(state["site_sizes"], state["probe"], state["lambdas"])
        self.loop.optimizers = build_optimizers(explainer, self.loop.options)
        self.loop.optimizers[0].load_state_dict(state["probe_optimizer"])
        self.loop.optimizers[1].load_state_dict(state["multipliers"])
        self.loop.load_state_dict(state["loop"])
        if self.selection is not None:
            self.selection.best = state["selection"]
        explainer.convergence = dict(state["convergence"])
        self.history, self.sums = list(state["history"]), dict(state["sums"])
        self.position, self.rng, self.finished = Position(**state["position"]), state["rng"], bool(state["finished"])
        LOGGER.info("DiffMask fit: resumed from %s at step %d (epoch %d)%s", self.saver.path if self.saver else "",
                    self.loop.step, self.position.epoch, ", finished" if self.finished else "")


def model_precision(precision: str, device: torch.device) -> ContextManager[Any]:
    r"""The context the analysed model's passes of a fit run in: nothing for
    ``"float32"``, bfloat16 autocast on ``device`` for ``"bfloat16"``."""
    if precision == "float32":
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=torch.bfloat16)


def _check_reiterable(dataloader: Iterable[Batch], epochs: Optional[int]) -> None:
    r"""A one-shot iterator (a generator, ``iter(loader)``) yields one epoch only:
    with a cap of several epochs (or none) it would end the fit early, silently."""
    # an Iterator has __next__; a DataLoader or a list does not (and calling iter()
    # on a DataLoader would draw from its generator, changing the first epoch)
    if (epochs is None or epochs > 1) and isinstance(dataloader, collections.abc.Iterator):
        raise ValueError(
            f"dataloader is a one-shot iterator (it can be read once), but epochs={epochs}: pass a list or a "
            "DataLoader, which can be read again every epoch, or epochs=1"
        )


def _log_epoch(epoch: int, epochs: Optional[int], rows: List[Dict[str, Any]]) -> None:
    for row in rows:
        LOGGER.info(
            "DiffMask fit epoch %d/%s, layer %d: KL %.4g, kept share %.3f, lambda %.3g, agreement %.3f, %d steps, %s",
            epoch, epochs or "-", row["layer"], row["kl"], row["l0"], row["lambda"], row["agreement"], row["steps"],
            row["status"],
        )


def train_epoch(
    explainer: Fittable, batches: Iterable[Batch], loop: _FitLoop, sums: Optional[Dict[int, Dict[str, float]]] = None,
    after_step: Optional[Callable[[], None]] = None,
) -> Dict[int, Dict[str, float]]:
    r"""One pass over ``batches`` (or fewer steps, when the loop ends); the sums
    of each trained layer's step records, added to ``sums`` (an epoch resumed
    part-way); ``after_step`` is called after each step."""
    sums = {} if sums is None else sums
    for batch in batches:
        if loop.done:  # a fit resumed from the step that ended it
            break
        call = explainer.prepare_batch(batch, None, "dataloader batch")
        layers = loop.draw()
        with model_precision(loop.options.precision, call.ids.device):
            states, original = explainer.capture(call, _sites_to_keep(explainer, max(layers), loop))
        assert original is not None
        if loop.optimizers is None:
            if explainer.probe is None:
                explainer.build_probe(states, call.mask, all_sum if is_distributed() else None, call)
            pin_baselines(explainer, loop.options.init_baseline)
            loop.optimizers = build_optimizers(explainer, loop.options)
        records = training_step(explainer, call, states, original, layers, loop)
        for k, record in records.items():
            acc = sums.setdefault(k, {"steps": 0})
            for key in ("kl", "l0", "agreement", "kl_deployed"):
                if key in record:
                    acc[key] = acc.get(key, 0.0) + record[key]
            acc["steps"] += 1
        assert explainer.lambdas is not None
        closed = loop.after_step(records, {k: float(explainer.lambdas(k).detach()) for k in records})
        if closed and hasattr(batches, "set_postfix"):
            k = closed[-1]
            window = loop.monitors[k].windows[-1]
            batches.set_postfix(layer=k, kept=f"{window.kept:.3f}", kl=f"{window.kl:.4f}",
                                lam=f"{window.lam:.3g}", status=loop.monitors[k].status())
        if after_step is not None:
            after_step()
        if loop.done:
            break
    return sums


def _sites_to_keep(explainer: Fittable, layer: int, loop: _FitLoop) -> List[str]:
    r"""The sites whose activations a step keeps: every site (``activations="all"``,
    and the first batch, which builds the probe), or those up to ``hidden.k``, the
    ones a step whose deepest layer is k reads or re-uses (``"needed"``)."""
    names = explainer.site_names
    if loop.options.activations == "all" or explainer.probe is None or loop.optimizers is None:
        return names
    if layer == 0 and explainer.mode in COMPONENT_MODES:  # the joint mask reads every block's input
        return names
    return names[: names.index(f"hidden.{layer}") + 1]


def training_step(
    explainer: Fittable, call: PreparedCall, states: Dict[str, Tensor], original: Tensor, layers: Sequence[int],
    loop: _FitLoop,
) -> Dict[int, Dict[str, float]]:
    r"""One optimiser step on the sum of the Lagrangians of ``layers``; per layer,
    the step's mean KL, expected kept share and agreement (over every process's
    batch)."""
    assert explainer.probe is not None and explainer.lambdas is not None and loop.optimizers is not None
    probe_opt, multipliers = loop.optimizers
    probe_opt.zero_grad(set_to_none=True)
    multipliers.zero_grad()
    rank, world = rank_and_world()
    sizes = global_batch_sizes(call.ids.shape[0], call.ids.device)
    records: Dict[int, Dict[str, float]] = {}
    for group in explainer.gates.pass_groups(layers, loop.options.stack_layers):
        # one backward per masked pass: only that pass's graph is held in memory
        loss, group_records = _lagrangian(explainer, call, states, original, group, sizes, loop)
        loss.backward()
        records.update(group_records)
    if world > 1:  # the gradient of the global batch's mean loss, on every rank
        average_gradients([*explainer.probe.parameters(), explainer.lambdas.values], sizes[rank] / sum(sizes))
    probe_opt.step()
    multipliers.step(records)
    return records


def _lagrangian(
    explainer: Fittable, call: PreparedCall, states: Dict[str, Tensor], original: Tensor, layers: Sequence[int],
    sizes: Sequence[int], loop: _FitLoop,
) -> Tuple[Tensor, Dict[int, Dict[str, float]]]:
    r"""The sum over ``layers`` of ``L0 + lambda_k * (mean KL - eps)`` with freshly
    sampled gates, their masked passes run as one (``sizes``: every process's
    batch size), and each layer's record of the step."""
    assert explainer.probe is not None and explainer.lambdas is not None
    rank, world = rank_and_world()
    options = loop.options
    noise = (lambda shape: shared_uniform(shape, sizes, rank, call.ids.device)) if world > 1 else None
    logits = explainer.gates.logits_of_layers(states, layers, call.mask)  # one probe call for the group
    samples = {k: explainer.gates.sample_with_plain(states, k, options.vote_sampling, noise, call.mask,
                                                   options.l0_floor_for(explainer.mode), logits[k]) for k in layers}
    masked = _masked_logits(explainer, call, states, {k: sample[0] for k, sample in samples.items()}, options.precision)
    log_p = log_probs(original)
    total, records = torch.zeros((), device=original.device), {}
    for k, (gates, log_keep, plain) in samples.items():
        loss, records[k] = _layer_loss(explainer, call, log_p, masked[k], gates, log_keep, plain, k, loop)
        _check_finite(loop.step + 1, k, {"the model's logits": original, "the masked logits": masked[k],
                                         "the gates": gates, "the loss": loss})
        total = total + loss
    for k in layers:
        if loop.monitors[k].measures_closure():
            records[k]["closure"] = _closure_kl(explainer, call, states, log_p, samples[k][1], k, loop.open_share,
                                                options.precision)
    if options.constraint != "sampled":
        deployed = _mean_kls_with_gates(
            explainer, call, states, log_p, {k: samples[k][1].detach() > math.log(0.5) for k in layers}, options.precision)
        for k in layers:
            records[k]["kl_deployed"] = deployed[k]
            records[k]["constraint"] = (deployed[k] if options.constraint == "deterministic"
                                        else max(records[k]["kl"], deployed[k]))
    return total, records


def _masked_logits(
    explainer: Fittable, call: PreparedCall, states: Dict[str, Tensor], gates: Mapping[int, Tensor], precision: str,
    baseline: Optional[Callable[[int], Tensor]] = None,
) -> Dict[int, Tensor]:
    r""":func:`~captum_diffmask.diffmask.stacking.masked_logits` with the model's passes in ``precision``."""
    with model_precision(precision, call.ids.device):
        return masked_logits(explainer.gates, explainer.replaced_logits, call, states, gates, baseline)


def _layer_loss(
    explainer: Fittable, call: PreparedCall, log_p: Tensor, masked: Tensor, gates: Tensor, log_keep: Tensor,
    plain: Tensor, layer: int, loop: _FitLoop,
) -> Tuple[Tensor, Dict[str, float]]:
    r"""``L0 + lambda_k * (mean KL - eps)`` of one layer from its masked logits,
    and the step's record of that layer."""
    assert explainer.lambdas is not None
    options = loop.options
    log_q = log_probs(masked)
    kl = example_kl(log_p, log_q)
    real = explainer.gates.positions(call.mask, layer)
    penalty = l0_penalty(log_keep, real, explainer.l0)
    lam, violation = explainer.lambdas(layer), kl.mean() - loop.eps
    if options.score_gradient:  # 0 in value: the multiplier sees the same violation
        violation = violation + score_function_term(kl, gates, plain, real)
    if options.lagrangian == "normalized":
        # the probe descends (L0 + lambda * c) / (1 + lambda): the same stationary
        # points, but a gradient whose scale does not grow with lambda, so that a
        # spike of lambda does not leave Adam's second moment hundreds of times
        # larger than the L0 gradient that must close the gates afterwards; the
        # multiplier still receives the violation c itself
        weight = lam.detach()
        loss = (penalty.mean() + weight * violation) / (1 + weight) + lam * violation.detach()
    else:
        loss = penalty.mean() + lam * violation
    record = _step_record(kl, log_keep, log_p, log_q, real)
    record["constraint"] = record["kl"]
    return loss, record


def _closure_kl(
    explainer: Fittable, call: PreparedCall, states: Dict[str, Tensor], log_p: Tensor, log_keep: Tensor,
    layer: int, open_share: float, precision: str,
) -> float:
    r"""The mean KL with every gate open but those of the ``1 - open_share``
    share of the batch's real gates (positions, or components) that the probe
    ranks least needed (lowest P(z != 0); at least one), which are closed: can a
    layer whose gates are all open close any of them?"""
    real = explainer.gates.positions(call.mask, layer).bool()
    scores = log_keep.detach().masked_fill(~real, float("inf")).flatten()
    count = max(1, math.ceil((1.0 - open_share) * int(real.sum())))
    keep = torch.ones_like(scores, dtype=torch.bool)
    keep[torch.topk(scores, count, largest=False).indices] = False
    return _mean_kls_with_gates(explainer, call, states, log_p, {layer: keep.view_as(real)}, precision)[layer]


def _mean_kls_with_gates(
    explainer: Fittable, call: PreparedCall, states: Dict[str, Tensor], log_p: Tensor, keep: Mapping[int, Tensor],
    precision: str,
) -> Dict[int, float]:
    r"""Per layer, the batch's mean KL(original || masked) with binary gates
    ``keep`` (layer -> (B, T) or (B, count)), without gradients, over every
    process's batch; the layers' passes run as one."""
    with torch.no_grad():
        # a layer whose gates are all open is the model itself (a fit's first
        # hundreds of steps, and layers that keep everything): no pass needed
        closing = {k: g for k, g in keep.items() if not bool(g.all())}
        read_out = explainer.gates
        masked = _masked_logits(explainer, call, states, {k: g.float() for k, g in closing.items()}, precision,
                                baseline=lambda k: read_out.masked_site(k)[1].detach()) if closing else {}
        kls = {k: example_kl(log_p, log_probs(masked[k])) if k in masked else torch.zeros(log_p.shape[0], device=log_p.device)
               for k in keep}
    if not is_distributed():
        return {k: float(kl.mean()) for k, kl in kls.items()}
    # every layer's sum in one collective: the batch size is the same for all of them
    totals = all_sum(torch.stack([kl.sum() for kl in kls.values()] + [torch.tensor(float(log_p.shape[0]), device=log_p.device)])
                     .float().cpu()).tolist()
    return {k: total / totals[-1] for k, total in zip(kls, totals[:-1])}


def _step_record(kl: Tensor, log_keep: Tensor, log_p: Tensor, log_q: Tensor, mask: Tensor) -> Dict[str, float]:
    r"""The step's mean KL, expected kept share and agreement, summed over the
    processes' batches before the division."""
    real = mask.float()
    if not is_distributed():  # the figures as a single process has always computed them
        with torch.no_grad():
            kept = (log_keep.exp() * real).sum() / real.sum().clamp(min=1.0)
            agreement = same_prediction(log_p, log_q).float().mean()
        return {"kl": float(kl.detach().mean()), "l0": float(kept), "agreement": float(agreement)}
    with torch.no_grad():
        sums = torch.stack([
            kl.detach().sum(), (log_keep.exp() * real).sum(), real.sum(),
            same_prediction(log_p, log_q).float().sum(), torch.tensor(float(kl.shape[0]), device=kl.device),
        ]).float().cpu()
    total_kl, kept, positions, agree, examples = all_sum(sums).tolist()
    return {"kl": total_kl / examples, "l0": kept / max(positions, 1.0), "agreement": agree / examples}


def _check_finite(step: int, layer: int, values: Mapping[str, Tensor]) -> None:
    r"""Stops the fit at the first non-finite value, naming the step, the layer
    and what went non-finite (a fit would otherwise go on, NaN in every record)."""
    bad = [what for what, value in values.items() if not bool(torch.isfinite(value.detach()).all())]
    if any_rank(bool(bad)):  # every process stops together, none waits for the others
        what = bad[0] if bad else "a value on another process"
        raise FloatingPointError(
            f"DiffMask.fit: {what} became non-finite at step {step} (layer {layer}); check the model "
            "for NaN or inf weights or inputs, or lower lr"
        )


def build_optimizers(explainer: Fittable, options: FitOptions) -> Tuple[torch.optim.Optimizer, "MultiplierUpdate"]:
    r"""The probe's optimiser (gate networks at ``lr``, baselines at
    ``lr_baseline``) and the multipliers' update."""
    assert explainer.probe is not None and explainer.lambdas is not None
    baselines = {id(p) for n, p in explainer.probe.named_parameters() if n.startswith("baseline")}
    gates = [p for p in explainer.probe.parameters() if id(p) not in baselines]
    base = [p for p in explainer.probe.parameters() if id(p) in baselines]
    groups = [{"params": gates, "lr": options.lr}, {"params": base, "lr": options.lr_baseline}]
    if options.optimizer in ("rmsprop", "lookahead-rmsprop"):
        # The authors' choice (wrapped in Lookahead in their code). Centred: it
        # divides by the gradient's spread, which vanishes once the multiplier is
        # ~0 and the L0 term alone drives the gates, and they then close all
        # together within a few dozen steps (docs/reproduction/fit-defaults.md, "The damped rule").
        probe_opt: torch.optim.Optimizer = torch.optim.RMSprop(groups, centered=True)
        if options.optimizer == "lookahead-rmsprop":
            probe_opt = Lookahead(probe_opt)
    else:
        # beta2 0.99, not 0.999: after the multiplier has pushed gates open, the
        # small L0 gradient regains its scale within ~100 steps.
        probe_opt = torch.optim.Adam(groups, betas=(0.9, 0.99))
    return probe_opt, MultiplierUpdate(explainer.lambdas, options)


class MultiplierUpdate:
    r"""
    Moves the multipliers after a step from what the step observed.

    ``"pi"``: :class:`~captum_diffmask.diffmask.constrained.pi_control.PIMultiplierControl` on each
    trained layer's constraint value. The gradient rules (``"damped"``,
    ``"balanced"``, ``"ascent"``): the multipliers' optimiser on their gradient,
    the violation ``D - eps``; with ``constraint="sampled"`` that gradient is the
    one backward left on them, with ``"deployed"`` it is set from the step's
    constraint values (the larger of the sampled and the deployed KL, or the
    deployed KL alone with ``"deterministic"``).

    Args:

        lambdas (LagrangeMultipliers): the multipliers.
        options (FitOptions): ``multiplier``, ``lr_lambda``, ``eps``,
                    ``constraint``, ``controller`` and ``lambda_max``.
    """

    def __init__(self, lambdas: LagrangeMultipliers, options: FitOptions) -> None:
        self.lambdas, self.eps = lambdas, float(options.eps)
        lambdas.max_value = float(options.lambda_max)
        self.from_records = options.constraint != "sampled"
        self.control: Optional[PIMultiplierControl] = None
        self.optimizer: Optional[torch.optim.Optimizer] = None
        if options.multiplier == "pi":
            self.control = PIMultiplierControl(lambdas, self.eps, lr=options.multiplier_rate, **(options.controller or {}))
        else:
            self.optimizer = lambdas.optimizer(options.multiplier_rate, rule=options.multiplier, eps=self.eps)

    def zero_grad(self) -> None:
        self.lambdas.zero_grad(set_to_none=True)

    def state_dict(self) -> Dict[str, Any]:
        if self.control is not None:
            return {"control": self.control.state_dict()}
        assert self.optimizer is not None
        return {"optimizer": self.optimizer.state_dict()}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        if self.control is not None:
            self.control.load_state_dict(state["control"])
        else:
            assert self.optimizer is not None
            self.optimizer.load_state_dict(state["optimizer"])

    def step(self, records: Mapping[int, Mapping[str, float]]) -> None:
        r"""One update from ``records``: layer -> the step's record, with its
        ``constraint`` value."""
        if self.control is not None:
            self.control.step({k: r["constraint"] for k, r in records.items()})
        else:
            assert self.optimizer is not None
            if self.from_records:
                grad = torch.zeros_like(self.lambdas.values)
                for k, record in records.items():
                    grad[k] = record["constraint"] - self.eps
                self.lambdas.values.grad = grad
            self.optimizer.step()
        self.lambdas.clamp_()


def pin_baselines(explainer: Fittable, init_baseline: InitBaseline) -> None:
    r"""Copies ``init_baseline`` into the probe's baselines (see
    :class:`FitOptions`); errors name ``init_baseline``."""
    if init_baseline is None:
        return
    assert explainer.probe is not None
    if explainer.mode == "input":
        if not isinstance(init_baseline, Tensor):
            raise TypeError("init_baseline must be an (H,) Tensor in input mode")
        targets = {f"input (depth {k})": (baseline, init_baseline) for k, baseline in enumerate(explainer.probe.baselines)}
    else:
        if not isinstance(init_baseline, Mapping):
            raise TypeError(f"init_baseline must be a dict {{layer: Tensor}} in {explainer.mode} mode")
        targets = {}
        for k, vector in init_baseline.items():
            check_layer(k, explainer.num_layers)
            if k == 0 and explainer.mode in COMPONENT_MODES:  # baselines are per block, also for the joint mask
                raise ValueError(f"init_baseline: layer 0 has no gates in {explainer.mode} mode (give the blocks "
                                 "1..L, also for the joint mask)")
            site, parameter = explainer.gates.masked_site(k)
            targets[site] = (parameter, vector)
    for site, (parameter, vector) in targets.items():
        if not isinstance(vector, Tensor) or tuple(vector.shape) != tuple(parameter.shape):
            shape = tuple(vector.shape) if isinstance(vector, Tensor) else type(vector).__name__
            raise ValueError(f"init_baseline for {site} must have shape {tuple(parameter.shape)}, got {shape}")
        with torch.no_grad():
            parameter.copy_(vector.detach().to(parameter))


def last_rows(history: Iterable[Mapping[str, Any]]) -> Dict[int, Mapping[str, Any]]:
    r"""Each layer's last row of a fit's ``history`` (a layer frozen once
    converged has no rows in the epochs after; the last epoch's rows miss it)."""
    return {int(row["layer"]): row for row in history}


def epoch_rows(
    explainer: Fittable, epoch: int, sums: Mapping[int, Mapping[str, float]], seconds: float,
    monitors: Mapping[int, LayerMonitor],
) -> List[Dict[str, Any]]:
    r"""The history rows of one epoch, one per layer trained in it."""
    assert explainer.lambdas is not None
    rows = []
    for k in sorted(sums):
        n = sums[k]["steps"]
        status = monitors[k].status()
        row = {
            "epoch": epoch, "layer": k, "kl": sums[k]["kl"] / n, "l0": sums[k]["l0"] / n,
            "agreement": sums[k]["agreement"] / n, "lambda": float(explainer.lambdas(k).detach()),
            "steps": n, "seconds": seconds, "status": status, "converged": status in SETTLED,
        }
        if "kl_deployed" in sums[k]:
            row["kl_deployed"] = sums[k]["kl_deployed"] / n
        rows.append(row)
    return rows


# ------------------------------------------------------------ checkpoints
class CheckpointSelection:
    r"""
    The authors' checkpoint rule: after every epoch the probe is scored on held-out
    batches with deterministic gates, and the probe of the sparsest epoch (the
    smallest mean kept share over the layers) whose every trained layer keeps
    KL <= ``eps_valid`` and agreement >= ``agreement_valid`` is restored at the
    end.

    Args:

        options (FitOptions): ``validation``, ``eps_valid`` (``eps`` when None)
                    and ``agreement_valid``.
        layers (sequence of int): the trained layers.
    """

    def __init__(self, options: FitOptions, layers: Sequence[int]) -> None:
        assert options.validation is not None
        self.validation = options.validation
        self.layers = sorted(set(layers))
        self.bound = float(options.eps if options.eps_valid is None else options.eps_valid)
        self.agreement = float(options.agreement_valid)
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
