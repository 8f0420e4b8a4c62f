"""The options of :meth:`DiffMask.fit <captum_diffmask.diffmask.explainer.DiffMask.fit>`:
each documented once, in :class:`FitOptions`, and checked before any forward
pass; :func:`fit_options` merges the caller's with the defaults."""

from __future__ import annotations

import dataclasses
import difflib
import inspect
from dataclasses import dataclass
from typing import Any, Callable, Dict, Iterable, List, Mapping, Optional, Sequence, Union

from torch import Tensor

from captum_diffmask.diffmask.constrained.constraint import KLConstraint, MEASURES
from captum_diffmask.diffmask.constrained.convergence import Convergence
from captum_diffmask.diffmask.constrained.multiplier_rules import MULTIPLIER_RULES
from captum_diffmask.diffmask.constrained.multipliers import multiplier_rates
from captum_diffmask.diffmask.constrained.pi_control import DEFAULT_PI_RATE
from captum_diffmask.diffmask.fit.fit_state import PathLike
from captum_diffmask.diffmask.gates import VOTE_SAMPLING
from captum_diffmask.model.arguments import check_layer
from captum_diffmask.model.checks import check_choice
from captum_diffmask.model.forward import Batch

#: The probe's optimisers :class:`FitOptions` knows.
OPTIMIZERS = ("adam", "rmsprop", "lookahead-rmsprop")
#: What :class:`FitOptions` ``layers_per_batch`` takes.
LAYERS_PER_BATCH = ("one", "all")
#: What :class:`FitOptions` ``stack_layers`` takes.
STACK_LAYERS = ("same_site", "all", "none")
#: What :class:`FitOptions` ``precision`` takes.
PRECISIONS = ("float32", "bfloat16")
#: The ``"pi"`` multiplier's settings :class:`FitOptions` ``controller`` takes.
CONTROLLER_SETTINGS = ("kp", "ki", "smoothing", "max_error", "floor")
#: :class:`FitOptions` ``l0_floor`` by mode when it is None (modes not named: 0,
#: the paper's expected L0). Empty: the floor raised the mean ROC AUC of the
#: component modes on tracr programs no report scores (0.80 -> 0.91 at 0.05), but
#: on a tiny BERT it closed a needed head past eps (KL 0.073 > 0.05), so it is not
#: yet a default (``docs/guide/components.md``).
DEFAULT_L0_FLOOR: Dict[str, float] = {}
#: A pinned starting baseline: one (H,) vector (input mode), or layer -> (H,) (hidden mode).
InitBaseline = Union[None, Tensor, Mapping[int, Tensor]]



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

    def kl_constraint(self) -> KLConstraint:
        r"""The fit's constraint: ``eps`` and what the multipliers hold (``constraint``)."""
        return KLConstraint(self.eps, self.constraint)

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
        check_choice(self.constraint, MEASURES, "constraint")
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

