"""The per-example optimisation loop of the learned-mask methods (the
bottleneck, Guan, per-example DiffMask, REINFORCE) and their optimisers."""

from __future__ import annotations

from typing import Callable, Optional

import torch
from torch import Tensor
from tqdm.auto import tqdm

from captum_diffmask.model.checks import check_choice, check_positive_int

__all__ = ["OPTIMIZERS", "make_optimizer", "optimize"]

#: The optimisers of the per-example methods.
OPTIMIZERS = ("rmsprop", "adam")


def make_optimizer(kind: str, parameter: Tensor, lr: float) -> torch.optim.Optimizer:
    r"""
    The optimiser of a per-example method's parameters.

    Args:

        kind (str): ``"rmsprop"`` (centred, as the authors' code) or ``"adam"``
                    (torch's defaults).
        parameter (Tensor): the per-example parameters (a leaf that requires grad).
        lr (float): the learning rate, > 0.

    Returns:
        *torch.optim.Optimizer*; errors name ``optimizer`` or ``lr``.
    """
    check_choice(kind, OPTIMIZERS, "optimizer")
    if isinstance(lr, bool) or not isinstance(lr, (int, float)) or not lr > 0:
        raise ValueError(f"lr must be a number > 0, got {lr!r}")
    if kind == "rmsprop":
        return torch.optim.RMSprop([parameter], lr=lr, centered=True)
    return torch.optim.Adam([parameter], lr=lr)


def optimize(
    loss_fn: Callable[[int], Tensor],
    optimizer: torch.optim.Optimizer,
    steps: int,
    desc: str,
    verbose: bool = True,
    after_step: Optional[Callable[[int], None]] = None,
) -> None:
    r"""
    The per-example optimisation loop shared by the learned-mask methods: all
    examples of the batch at once, each with its own parameters.

    Args:

        loss_fn (Callable): ``loss_fn(step) -> scalar loss`` (a sum or mean over the
                    batch of per-example losses, so examples do not interact).
        optimizer (torch.optim.Optimizer): over the per-example parameters.
        steps (int): number of steps, >= 1.
        desc (str): progress bar label.
        verbose (bool, optional): show a tqdm progress bar. Default: True
        after_step (Callable, optional): ``after_step(step)`` after each update
                    (e.g. multiplier ascent and clamping). Default: None
    """
    check_positive_int(steps, "steps")
    for step in tqdm(range(steps), desc=desc, disable=None if verbose else True, leave=False):
        optimizer.zero_grad(set_to_none=True)
        loss = loss_fn(step)
        loss.backward()
        optimizer.step()
        if after_step is not None:
            after_step(step)
