"""What a fit builds once its probe exists (on the first batch, or restored from
a state): the baselines pinned where the caller asked, the probe's optimiser and
the rule that moves the multipliers."""

from __future__ import annotations

from typing import Mapping, Tuple

import torch
from torch import Tensor

from captum_diffmask.diffmask.constrained.constraint import KLConstraint
from captum_diffmask.diffmask.constrained.lookahead import Lookahead
from captum_diffmask.diffmask.constrained.multiplier_rules import multiplier_rule, MultiplierRule
from captum_diffmask.diffmask.fit.fittable import Fittable
from captum_diffmask.diffmask.fit.option_groups import InitBaseline
from captum_diffmask.diffmask.fit.options import FitOptions
from captum_diffmask.diffmask.gates import COMPONENT_MODES
from captum_diffmask.model.arguments import check_layer


def build_optimizers(
    explainer: Fittable, options: FitOptions, constraint: KLConstraint
) -> Tuple[torch.optim.Optimizer, MultiplierRule]:
    r"""The probe's optimiser (gate networks at ``lr``, baselines at
    ``optimization.lr_baseline``) and the rule that moves the multipliers."""
    assert explainer.probe is not None and explainer.lambdas is not None
    recipe = options.optimization
    baselines = {id(p) for n, p in explainer.probe.named_parameters() if n.startswith("baseline")}
    gates = [p for p in explainer.probe.parameters() if id(p) not in baselines]
    base = [p for p in explainer.probe.parameters() if id(p) in baselines]
    groups = [{"params": gates, "lr": options.lr}, {"params": base, "lr": recipe.lr_baseline}]
    if recipe.optimizer in ("rmsprop", "lookahead-rmsprop"):
        # The authors' choice (wrapped in Lookahead in their code). Centred: it
        # divides by the gradient's spread, which vanishes once the multiplier is
        # ~0 and the L0 term alone drives the gates, and they then close all
        # together within a few dozen steps (docs/reproduction/fit-defaults.md, "The damped rule").
        probe_opt: torch.optim.Optimizer = torch.optim.RMSprop(groups, centered=True)
        if recipe.optimizer == "lookahead-rmsprop":
            probe_opt = Lookahead(probe_opt)
    else:
        # beta2 0.99, not 0.999: after the multiplier has pushed gates open, the
        # small L0 gradient regains its scale within ~100 steps.
        probe_opt = torch.optim.Adam(groups, betas=(0.9, 0.99))
    rule = multiplier_rule(explainer.lambdas, constraint, recipe.multiplier, recipe.lr_lambda, recipe.lambda_max,
                           recipe.controller)
    return probe_opt, rule




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

