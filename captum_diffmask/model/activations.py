"""What a site's activation is inside a module's output, and a function of a (B, T, H)
activation adapted to the layout a model keeps it in: tokens first, features
first, several residual streams side by side, a window of the positions, one run
of a module that runs several times. The hooks of :mod:`captum_diffmask.model.sites`
are built from these."""

from __future__ import annotations

from collections import OrderedDict
from typing import Any, Callable, Mapping, Optional, Tuple

import torch
from torch import nn, Tensor


def first_tensor(value: Any) -> Tensor:
    r"""The activation inside a module's output: the tensor itself, the first
    element of a tuple or list, or the first field of a ``ModelOutput``/mapping."""
    if isinstance(value, Tensor):
        return value
    if isinstance(value, (tuple, list)) and value and isinstance(value[0], Tensor):
        return value[0]
    if isinstance(value, Mapping) and value:
        first = next(iter(value.values()))
        if isinstance(first, Tensor):
            return first
    raise TypeError(
        f"cannot find the activation tensor in a module output of type "
        f"{type(value).__name__}"
    )


def with_first_tensor(value: Any, new: Tensor) -> Any:
    r"""``value`` with its activation tensor swapped for ``new``, keeping the
    container type (Tensor, tuple, list or ``ModelOutput``)."""
    if isinstance(value, Tensor):
        return new
    if isinstance(value, tuple):
        if hasattr(value, "_fields"):  # a NamedTuple (Reformer's outputs)
            return type(value)(new, *value[1:])
        return (new,) + tuple(value[1:])
    if isinstance(value, list):
        return [new] + list(value[1:])
    if isinstance(value, Mapping):
        fields = OrderedDict(value)
        first_key = next(iter(fields))
        fields[first_key] = new
        return type(value)(**fields)
    raise TypeError(f"cannot replace the activation in a {type(value).__name__}")


def repeat_batch(output: Any, times: int, batch: int) -> Any:
    r"""
    A recorded module output repeated ``times`` along the batch (dim 0), as Captum
    repeats a batch (``torch.cat([x] * times)``): tensors with ``batch`` rows,
    inside tuples, lists and dicts (ModelOutput included); anything else as is
    (a bias shared by the batch, T5's (1, heads, T, T) position bias, broadcasts).

    Args:

        output (Any): a module output.
        times (int): the number of copies.
        batch (int): the recorded batch's size.

    Returns:
        *Any* of the same structure.
    """
    return map_tensors(output, lambda t: torch.cat([t] * times) if t.dim() > 0 and t.shape[0] == batch else t)


def copied(output: Any) -> Any:
    r"""A module output with each tensor cloned (same structure): a recorded
    activation must not change when the model later edits it in place (CTRL
    scales its embedding lookup with ``*=``)."""
    return map_tensors(output, torch.Tensor.clone)


def map_tensors(output: Any, fn: Callable[[Tensor], Tensor]) -> Any:
    if isinstance(output, Tensor):
        return fn(output)
    if isinstance(output, dict):
        return type(output)(**{key: map_tensors(value, fn) for key, value in output.items()})
    if isinstance(output, tuple) and hasattr(output, "_fields"):  # a NamedTuple
        return type(output)(*(map_tensors(value, fn) for value in output))
    if isinstance(output, (tuple, list)):
        return type(output)(map_tensors(value, fn) for value in output)
    return output


def on_call(fn: Callable[[Tensor], Optional[Tensor]], call: int) -> Tuple[Callable[[Tensor], Optional[Tensor]], Callable[..., None]]:
    r"""``fn`` applied on the ``call``-th run of a module in a forward pass only,
    and the root pre-hook that starts the count again at every forward pass."""
    count = [0]

    def counted(activation: Tensor) -> Optional[Tensor]:
        run = count[0]
        count[0] += 1
        return fn(activation) if run == call else None

    def reset(module: nn.Module, args: Any) -> None:
        count[0] = 0

    return counted, reset


def transposed(fn: Callable[[Tensor], Optional[Tensor]], tokens_at: int) -> Callable[[Tensor], Optional[Tensor]]:
    r"""``fn`` for an activation whose tokens are on axis ``tokens_at``, 0
    ((T, B, H)) or 2 ((B, H, T)): it sees (B, T, H), and what it returns goes
    back in the activation's own order."""
    def swapped(activation: Tensor) -> Optional[Tensor]:
        new = fn(activation.transpose(tokens_at, 1))
        return None if new is None else new.transpose(tokens_at, 1)

    return swapped


def streams_layout(state: Tensor, batch_tokens: Tuple[int, int]) -> str:
    r"""``"after_tokens"`` for a (B, T, S, H) state, ``"first"`` for (S, B, T, H),
    ``""`` otherwise (:attr:`Site.streams`)."""
    if state.dim() != 4:
        return ""
    if tuple(state.shape[:2]) == tuple(batch_tokens):
        return "after_tokens"
    if tuple(state.shape[1:3]) == tuple(batch_tokens):
        return "first"
    return ""


def streams_side_by_side(fn: Callable[[Tensor], Optional[Tensor]], streams: str) -> Callable[[Tensor], Optional[Tensor]]:
    r"""``fn`` for an activation with several residual streams: it sees each
    token's streams side by side, (B, T, S * H), and what it returns goes back
    in the activation's own layout."""
    def side_by_side(activation: Tensor) -> Optional[Tensor]:
        ordered = activation.permute(1, 2, 0, 3) if streams == "first" else activation
        new = fn(ordered.flatten(2))
        if new is None:
            return None
        new = new.reshape(ordered.shape)
        return new.permute(2, 0, 1, 3) if streams == "first" else new

    return side_by_side


def windowed(fn: Callable[[Tensor], Optional[Tensor]], offset: int, ratio: int) -> Callable[[Tensor], Optional[Tensor]]:
    r"""``fn`` for an activation of T' positions of which the ids' are
    ``offset .. offset + (T' - offset) // ratio`` (:attr:`Site.window`): it
    sees those, and what it returns goes back among the others."""
    def on_the_ids(activation: Tensor) -> Optional[Tensor]:
        end = offset + (activation.shape[1] - offset) // ratio
        new = fn(activation[:, offset:end])
        if new is None:
            return None
        return torch.cat([activation[:, :offset], new, activation[:, end:]], dim=1)

    return on_the_ids
