"""What the comparison methods share beyond :class:`SiteAttribution`: the
per-example optimisation loop."""

from __future__ import annotations

from typing import Callable, Optional

import torch
from torch import Tensor
from tqdm.auto import tqdm

from ..attribution import PreparedCall, site_for_layer, SiteAttribution

__all__ = ["PreparedCall", "SiteAttribution", "optimize", "site_for_layer"]


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
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise ValueError(f"steps must be an int >= 1, got {steps!r}")
    for step in tqdm(range(steps), desc=desc, disable=None if verbose else True, leave=False):
        optimizer.zero_grad(set_to_none=True)
        loss = loss_fn(step)
        loss.backward()
        optimizer.step()
        if after_step is not None:
            after_step(step)
