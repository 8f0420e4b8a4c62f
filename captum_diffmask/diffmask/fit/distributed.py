"""DiffMask's fit across several processes (``torch.distributed``, e.g. under
``torchrun``): every rank reads its shard of the batches, the gradients of the
probe, the baselines and the multipliers are averaged, and the figures that decide
the fit (KL, kept share, agreement) are the global ones, so every rank takes the
same steps and ends with the same probe.

A global step is one batch per rank; the fit equals a single-process fit whose
batches are the ranks' batches concatenated in rank order (the gate noise is drawn
for the whole global batch on every rank, each keeping its rows).
"""

from __future__ import annotations

import random
from typing import Any, Iterable, Iterator, List, Optional, Sequence, Tuple

import torch
import torch.distributed as dist
from torch import Tensor


def is_distributed() -> bool:
    r"""A process group is initialised with more than one process."""
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def rank_and_world() -> Tuple[int, int]:
    r"""``(rank, world size)``; ``(0, 1)`` outside a process group."""
    if not is_distributed():
        return 0, 1
    return dist.get_rank(), dist.get_world_size()


def is_main_process() -> bool:
    r"""Rank 0, or the only process: the one that writes files."""
    return rank_and_world()[0] == 0


def all_sum(tensor: Tensor) -> Tensor:
    r"""The sum of ``tensor`` over the ranks (itself outside a process group)."""
    if not is_distributed():
        return tensor
    total = tensor.clone()
    dist.all_reduce(total, op=dist.ReduceOp.SUM)
    return total


def reads_its_own_shard(batches: Any) -> bool:
    r"""The data loader already gives each rank its own batches (a
    ``DistributedSampler``), so the fit does not shard it again."""
    sampler = getattr(batches, "sampler", None)
    inner = getattr(getattr(batches, "batch_sampler", None), "sampler", None)
    return any(isinstance(s, torch.utils.data.DistributedSampler) for s in (sampler, inner))


def any_rank(flag: bool) -> bool:
    r"""Whether ``flag`` holds on any rank (every rank gets the same answer)."""
    if not is_distributed():
        return flag
    value = torch.tensor([1.0 if flag else 0.0])
    dist.all_reduce(value, op=dist.ReduceOp.SUM)
    return bool(value.item() > 0)


def shared_seed(seed: Optional[int]) -> Optional[int]:
    r"""``seed``, or, in a process group without one, a seed drawn on rank 0 and
    sent to every rank (the layer draw and the gate noise must agree)."""
    if seed is not None or not is_distributed():
        return seed
    value = torch.tensor([random.SystemRandom().randrange(2**31) if is_main_process() else 0], dtype=torch.long)
    dist.broadcast(value, src=0)
    return int(value.item())


def sharded(batches: Iterable[Any], rank: int, world: int) -> Iterator[Any]:
    r"""Rank ``rank``'s batches: of every ``world`` consecutive batches, the one
    at its position; an incomplete last group is dropped (every rank takes the
    same number of steps)."""
    group: List[Any] = []
    for batch in batches:
        group.append(batch)
        if len(group) == world:
            yield group[rank]
            group = []


def global_batch_sizes(local: int, device: torch.device) -> List[int]:
    r"""Every rank's batch size, in rank order."""
    if not is_distributed():
        return [local]
    sizes = [torch.zeros(1, dtype=torch.long, device=device) for _ in range(dist.get_world_size())]
    dist.all_gather(sizes, torch.tensor([local], dtype=torch.long, device=device))
    return [int(s.item()) for s in sizes]


def shared_uniform(shape: Sequence[int], sizes: Sequence[int], rank: int, device: torch.device) -> Tensor:
    r"""Uniform noise for this rank's rows of the global batch: every rank draws
    the rows of every rank, in rank order, and keeps its own, so the random stream
    is the one a single process would draw for the concatenated batch."""
    mine = None
    for r, size in enumerate(sizes):
        draw = torch.rand((size, *shape[1:]), device=device)
        if r == rank:
            mine = draw
    assert mine is not None
    return mine


def average_gradients(parameters: Iterable[Tensor], weight: float) -> None:
    r"""Each gradient becomes the weighted sum over the ranks (``weight`` = this
    rank's share of the global batch), so the step follows the global mean loss."""
    for parameter in parameters:
        if parameter.grad is not None:
            parameter.grad.mul_(weight)
            dist.all_reduce(parameter.grad, op=dist.ReduceOp.SUM)


def check_same(parameters: Iterable[Tensor]) -> float:
    r"""The largest difference between this rank's parameters and rank 0's (0 when
    the ranks agree)."""
    worst = 0.0
    for parameter in parameters:
        reference = parameter.detach().clone()
        dist.broadcast(reference, src=0)
        worst = max(worst, float((reference - parameter.detach()).abs().max()))
    return worst
