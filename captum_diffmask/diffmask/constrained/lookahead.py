"""Lookahead (Zhang et al. 2019), the wrapper of the DiffMask authors' optimiser
("Lookahead RMSprop", their appendix tables): every ``k`` steps of the inner
optimiser the weights move back to ``slow + alpha * (fast - slow)``."""

from __future__ import annotations

from typing import Any, Callable, Dict, List, Optional

import torch


class Lookahead(torch.optim.Optimizer):
    r"""
    Lookahead around an inner optimiser.

    Args:

        inner (torch.optim.Optimizer): the fast optimiser (its parameter groups
                    are this optimiser's).
        k (int, optional): fast steps between synchronisations. Default: 6 (the
                    authors')
        alpha (float, optional): the slow weights' step toward the fast ones.
                    Default: 0.5 (the authors')
    """

    def __init__(self, inner: torch.optim.Optimizer, k: int = 6, alpha: float = 0.5) -> None:
        if isinstance(k, bool) or not isinstance(k, int) or k < 1:
            raise ValueError(f"k must be an int >= 1, got {k!r}")
        if not 0.0 < alpha <= 1.0:
            raise ValueError(f"alpha must be in (0, 1], got {alpha!r}")
        self.inner, self.k, self.alpha = inner, k, float(alpha)
        self.param_groups = inner.param_groups
        self.defaults = inner.defaults
        self.state: Dict[Any, Any] = inner.state
        self.slow: List[List[torch.Tensor]] = [[p.detach().clone() for p in g["params"]] for g in self.param_groups]
        self.steps = 0

    @torch.no_grad()
    def step(self, closure: Optional[Callable[[], Any]] = None) -> Any:  # type: ignore[override]
        loss = self.inner.step(closure)
        self.steps += 1
        if self.steps % self.k == 0:
            for group, slow in zip(self.param_groups, self.slow):
                for p, s in zip(group["params"], slow):
                    s.add_(p.detach() - s, alpha=self.alpha)
                    p.copy_(s)
        return loss

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.inner.zero_grad(set_to_none=set_to_none)

    def state_dict(self) -> Dict[str, Any]:
        return {"inner": self.inner.state_dict(), "slow": [[s.clone() for s in g] for g in self.slow],
                "steps": self.steps}

    def load_state_dict(self, state_dict: Dict[str, Any]) -> None:
        self.inner.load_state_dict(state_dict["inner"])
        self.slow = [[s.clone() for s in g] for g in state_dict["slow"]]
        self.steps = int(state_dict["steps"])
