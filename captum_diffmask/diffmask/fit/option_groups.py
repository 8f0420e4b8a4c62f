"""The fit's options beyond the first screen, in groups a user rarely opens: how
the fit spends compute (:class:`Compute`), the optimisation recipe and its
research options (:class:`Optimization`), and the held-out batches of the
checkpoint selection (:class:`Validation`). The convergence criterion is the
fourth group (:class:`~captum_diffmask.diffmask.constrained.convergence.Convergence`).

Each group is a frozen dataclass; :meth:`DiffMask.fit` also takes a dict of its
fields (``compute={"precision": "bfloat16"}``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable, Mapping, Optional, Sequence, Union

from torch import Tensor

from captum_diffmask.diffmask.constrained.constraint import MEASURES
from captum_diffmask.diffmask.constrained.multiplier_rules import MULTIPLIER_RULES
from captum_diffmask.diffmask.constrained.multipliers import multiplier_rates
from captum_diffmask.diffmask.gates import VOTE_SAMPLING
from captum_diffmask.model.checks import check_choice
from captum_diffmask.model.forward import Batch

#: The probe's optimisers :class:`Optimization` knows.
OPTIMIZERS = ("adam", "rmsprop", "lookahead-rmsprop")
#: What :class:`Compute` ``layers_per_batch`` takes.
LAYERS_PER_BATCH = ("one", "all")
#: What :class:`Compute` ``stack_layers`` takes.
STACK_LAYERS = ("same_site", "all", "none")
#: What :class:`Compute` ``precision`` takes.
PRECISIONS = ("float32", "bfloat16")
#: The ``"pi"`` multiplier's settings :class:`Optimization` ``controller`` takes.
CONTROLLER_SETTINGS = ("kp", "ki", "smoothing", "max_error", "floor")
#: A pinned starting baseline: one (H,) vector (input mode), or layer -> (H,) (hidden mode).
InitBaseline = Union[None, Tensor, Mapping[int, Tensor]]


@dataclass(frozen=True)
class Compute:
    r"""
    How a fit spends compute and memory.

    Attributes:
        precision (str): the analysed model's passes during the fit:
                    ``"float32"``, or ``"bfloat16"`` (autocast: about 2.5x faster
                    on CPUs with AMX and on GPUs; on SST with MiniLM the output
                    moves by a KL of 1e-5 on average, far below any eps). The
                    probe, the divergences and the multipliers stay float32, and
                    ``attribute``, ``evaluate`` and the checkpoint selection run
                    the model as it is. Default: ``"float32"``
        layers_per_batch (str): ``"all"``: every trained layer on every batch,
                    each with its own masked pass and all sharing the batch's
                    capture pass, with one optimiser step on the sum of their
                    Lagrangians (the full expectation over the layers); ``"one"``:
                    one of them drawn, uniformly, per batch (the authors'; an
                    epoch then costs about one layer's step per batch, and each
                    layer gets 1 / len(layers) of the steps). Default: ``"all"``
        stack_layers (str): which of a step's layers share one masked pass,
                    their batches stacked (:mod:`captum_diffmask.diffmask.stacking`,
                    the same arithmetic): ``"same_site"``, the layers whose
                    gates replace the same site (input mode's depths);
                    ``"all"``, every layer of the step, the pass starting at the
                    shallowest replaced site (more arithmetic, fewer kernel
                    launches, for a device where a pass costs its launches);
                    ``"none"``, one pass per layer, one layer's graph in memory
                    at a time. Component modes always run one pass per layer.
                    Default: ``"same_site"``
        activations (str): ``"all"``: every step keeps the activations of every
                    site from its capture pass; ``"needed"``: only those of the
                    sites up to the step's layer (less memory for deep models,
                    the same fit). Default: ``"all"``
        checkpoint_every (int): steps between two writes of the fit's state
                    (``checkpoint``). Default: 100
        deployed_every (int): steps between two measurements of the
                    deterministic gates' KL that the ``"deployed"`` and
                    ``"deterministic"`` constraints hold (a pass per layer
                    without gradients: about a third of an input-mode layer's
                    step); in between, a layer's constraint reads its last
                    measured value. Default: 2
    """

    precision: str = "float32"
    layers_per_batch: str = "all"
    stack_layers: str = "same_site"
    activations: str = "all"
    checkpoint_every: int = 100
    deployed_every: int = 2

    def check(self) -> None:
        r"""Validates every field (errors name it)."""
        check_choice(self.precision, PRECISIONS, "precision")
        check_choice(self.layers_per_batch, LAYERS_PER_BATCH, "layers_per_batch")
        check_choice(self.stack_layers, STACK_LAYERS, "stack_layers")
        check_choice(self.activations, ("all", "needed"), "activations")
        check_count(self.checkpoint_every, "checkpoint_every")
        check_count(self.deployed_every, "deployed_every")


@dataclass(frozen=True)
class Optimization:
    r"""
    The optimisation recipe: the probe's optimiser, the multipliers' rule, and
    the research options the reports measured. Fit's defaults are the recipe the
    reports settled on (``docs/reproduction/fit-defaults.md``).

    Attributes:
        optimizer (str): ``"adam"`` (betas 0.9, 0.99), ``"rmsprop"`` (centred)
                    or ``"lookahead-rmsprop"`` (centred RMSprop in Lookahead, k 6,
                    alpha 0.5: the authors') for the probe and baselines.
                    Default: ``"adam"``
        lr_baseline (float): learning rate of the baselines (0 keeps them
                    fixed). Default: 1e-3
        multiplier (str): ``"pi"``, a PI controller on each layer's smoothed
                    divergence in log space
                    (:mod:`~captum_diffmask.diffmask.constrained.pi_control`);
                    ``"damped"``, ``"ascent"`` or ``"rmsprop"`` (the authors'),
                    gradient rules (:meth:`LagrangeMultipliers.optimizer`).
                    Default: ``"pi"``
        lr_lambda (float or sequence of float, optional): the multipliers' rate,
                    one for all or one per layer (L + 1 values, layer 0 first);
                    None: the rule's own (``"pi"``: 0.01 on log lambda; the
                    others: 1.0). Default: None
        lambda_max (float): the multipliers' ceiling. The authors' 200 binds
                    where many gates each matter little but together a lot (a
                    per-task mask over a real model's heads,
                    ``docs/results/components-sst-per-task.md``). Default: 200.0
        controller (dict, optional): settings of the ``"pi"`` multiplier
                    (:class:`~captum_diffmask.diffmask.constrained.pi_control.PIMultiplierControl`:
                    ``kp``, ``ki``, ``smoothing``, ``max_error``, ``floor``; raise
                    ``floor`` where a needed component's multiplier cycles,
                    ``docs/guide/components.md``). Default: None
        constraint (str): what the multipliers hold within eps
                    (:class:`~captum_diffmask.diffmask.constrained.constraint.KLConstraint`):
                    ``"deployed"``, the larger of the sampled gates' KL and the
                    KL of the deterministic gates ``attribute`` returns;
                    ``"sampled"`` (the paper); ``"deterministic"``.
                    Default: ``"deployed"``
        init_baseline (Tensor or dict, optional): where the baselines start
                    instead of the mean state of the first batch: an (H,) vector
                    in input mode, ``{layer: (H,) vector}`` in hidden mode,
                    ``{layer: (count, width)}`` in the component modes (zeros:
                    zero ablation); with ``lr_baseline=0`` they stay there.
                    Default: None
        vote_sampling (str): input mode, how the gate of layer k is sampled:
                    ``"joint"``, one Hard Concrete gate whose ``P(z != 0)`` is the
                    product of the votes'
                    (:meth:`~captum_diffmask.diffmask.hard_concrete.HardConcrete.with_prob_nonzero`),
                    or ``"product"`` (the authors': the product of k + 1 relaxed
                    vote samples, which also shrinks the kept tokens a little).
                    Default: ``"joint"``
        l0_floor (float): the least gradient of the L0 in an open gate's logit
                    (its value unchanged,
                    :meth:`~captum_diffmask.diffmask.hard_concrete.HardConcrete.log_prob_nonzero_floored`):
                    0 is the paper's L0, whose gradient vanishes as a gate
                    saturates open. Default: 0.0
        score_gradient (bool): add to the KL's pathwise gradient a
                    score-function estimate through each gate's open/closed
                    event (:func:`~captum_diffmask.diffmask.sparsity.score_function_term`),
                    for outputs that are a step function of a gate's value
                    (``docs/guide/components.md``). Default: False
    """

    optimizer: str = "adam"
    lr_baseline: float = 1e-3
    multiplier: str = "pi"
    lr_lambda: Union[None, float, Sequence[float]] = None
    lambda_max: float = 200.0
    controller: Optional[Mapping[str, float]] = None
    constraint: str = "deployed"
    init_baseline: InitBaseline = None
    vote_sampling: str = "joint"
    l0_floor: float = 0.0
    score_gradient: bool = False

    def check(self, num_layers: int) -> None:
        r"""Validates every field (errors name it); ``num_layers``: L."""
        check_positive(self.lambda_max, "lambda_max")
        for name in ("lr_baseline", "l0_floor"):
            check_not_negative(getattr(self, name), name)
        check_choice(self.optimizer, OPTIMIZERS, "optimizer")
        check_choice(self.multiplier, MULTIPLIER_RULES, "multiplier")
        if self.lr_lambda is not None:
            multiplier_rates(self.lr_lambda, num_layers + 1)
        check_choice(self.constraint, MEASURES, "constraint")
        check_choice(self.vote_sampling, VOTE_SAMPLING, "vote_sampling")
        unknown = set(self.controller or {}) - set(CONTROLLER_SETTINGS)
        if unknown:
            raise ValueError(f"controller: unknown settings {sorted(unknown)}; it takes {CONTROLLER_SETTINGS}")
        if not isinstance(self.score_gradient, bool):
            raise TypeError(f"score_gradient must be True or False, got {self.score_gradient!r}")


@dataclass(frozen=True)
class Validation:
    r"""
    Held-out batches for the authors' checkpoint rule: after every epoch the
    probe is scored on them with deterministic gates, and the probe of the
    sparsest epoch that keeps the bounds at every trained layer is restored at
    the end (:class:`~captum_diffmask.diffmask.fit.selection.CheckpointSelection`).

    Attributes:
        batches (iterable): the held-out batches, as ``fit`` takes them.
        eps (float, optional): the largest KL (nats); the fit's ``eps`` when
                    None. Default: None
        agreement (float): the least share of examples whose masked argmax is
                    the original one. Default: 0.0
    """

    batches: Iterable[Batch]
    eps: Optional[float] = None
    agreement: float = 0.0

    def check(self) -> None:
        r"""Validates the bounds (errors name them)."""
        if self.eps is not None and not self.eps >= 0:
            raise ValueError(f"validation.eps must be >= 0, got {self.eps!r}")
        if not self.agreement <= 1:
            raise ValueError(f"validation.agreement must be <= 1, got {self.agreement!r}")


def check_count(value: Any, name: str) -> None:
    r"""An int >= 1, or ValueError naming ``name``."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be an int >= 1, got {value!r}")


def check_positive(value: Any, name: str) -> None:
    r"""A number > 0, or ValueError naming ``name``."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise ValueError(f"{name} must be a number > 0, got {value!r}")


def check_not_negative(value: Any, name: str) -> None:
    r"""A number >= 0, or ValueError naming ``name``."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0:
        raise ValueError(f"{name} must be a number >= 0, got {value!r}")
