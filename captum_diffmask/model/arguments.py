"""What the arguments of an ``attribute`` call become before any method runs: the
validated pieces of one call (:class:`PreparedCall`), the layer and the site it
names, the attributed class (``target``) and the reference state that replaces a
site (``baselines``), each checked with errors that name the argument."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Tuple, Union

import torch
from torch import Tensor

#: Captum-style targets: a class for every example, one per example, or None.
TargetType = Union[None, int, List[int], Tensor]


#: What replaces a state: None (the method's default), a constant, a vector (H,)
#: for every token, or a full (B, T, H) tensor.
BaselineType = Union[None, float, Tensor]


#: Token ids (B, T), or a 1-tuple of them (Captum's convention; the result follows).
InputType = Union[Tensor, Tuple[Tensor]]


#: ``forward_func(ids, *additional_forward_args)`` returning logits, or None for the model.
ForwardFunc = Optional[Callable[..., Any]]


#: The index of the padding mask in ``additional_forward_args``, ``"auto"`` or None.
PaddingMaskArg = Union[int, str, None]


def reject_target(target: Any, method: str, preserved: str = "the whole output distribution") -> None:
    r"""For methods that preserve the whole output rather than one class: a
    ``target`` is an error (naming it), never silently ignored."""
    if target is not None:
        raise ValueError(
            f"target must be None for {method}: it preserves {preserved}, not one class; got {target!r}"
        )


def resolve_baseline(
    baselines: BaselineType, state: Tensor, mask: Tensor, default: str = "zeros", argument: str = "baselines"
) -> Tensor:
    r"""
    The reference state (B, T, H) that replaces ``state``.

    Args:

        baselines (float or Tensor, optional): a constant, a vector (H,) for every
                    token (e.g. a fitted DiffMask's learned baseline), or a full
                    (B, T, H) tensor; None for ``default``.
        state (Tensor): (B, T, H) the site's states.
        mask (Tensor): (B, T) bool, True at real tokens.
        default (str, optional): ``"zeros"``; ``"mean"``, the mean state over
                    the batch's real tokens; or ``"example_mean"``, each
                    example's mean over its own real tokens (a row's baseline
                    then does not depend on the rest of the batch; zeros for a
                    row of one real token, whose mean is its own state).
                    Default: ``"zeros"``
        argument (str, optional): the name used in errors. Default: ``"baselines"``

    Returns:
        *Tensor* (B, T, H), detached, equal to ``state`` at padded positions
        (padding is never moved).
    """
    if baselines is None:
        if default in ("mean", "example_mean"):
            weights = mask.to(state.device).float().unsqueeze(-1)
            over = (1,) if default == "example_mean" else (0, 1)
            count = weights.sum(over, keepdim=True)
            mean = (state.float() * weights).sum(over, keepdim=True) / count.clamp(min=1.0)
            if default == "example_mean":
                mean = mean * (count > 1)  # one token: its mean is itself, which would attribute nothing
            full = mean.to(state.dtype).expand_as(state)
        else:
            full = torch.zeros_like(state)
    elif isinstance(baselines, (int, float)) and not isinstance(baselines, bool):
        full = torch.full_like(state, float(baselines))
    elif isinstance(baselines, Tensor):
        if baselines.shape == state.shape[-1:]:
            full = baselines.to(state).expand_as(state)
        elif baselines.shape == state.shape:
            full = baselines.to(state)
        else:
            raise ValueError(
                f"{argument} must be None, a float, a tensor ({state.shape[-1]},) or a tensor "
                f"{tuple(state.shape)} shaped like the site state, got shape {tuple(baselines.shape)}"
            )
    else:
        raise TypeError(f"{argument} must be None, a float or a Tensor, got {type(baselines).__name__}")
    return torch.where(mask.to(state.device).unsqueeze(-1), full.detach(), state)


@dataclass
class PreparedCall:
    r"""The validated pieces of one ``attribute`` call.

    Attributes:
        ids (Tensor): (B, T) token ids.
        extra (tuple): ``additional_forward_args`` as a tuple.
        mask (Tensor): (B, T) bool, True at real tokens.
        site (str, optional): the site a method attributes to at ``layer``; None
                    when the call spans several (DiffMask's ``layer=None``, a
                    training batch).
        was_tuple (bool): ``inputs`` came as a 1-tuple (the result will too).
        module_outputs (dict, optional): the site modules' outputs recorded by
                    the capture pass, for partial re-runs; None before it.
        captured_ids (Tensor, optional): the ids of that capture pass.
        input_device (torch.device, optional): where the caller's ids were; the
                    scores go back there.
        length (int, optional): the caller's T when the ids were padded to the
                    model's window (:meth:`ModelForward.padded_to_window`); the
                    scores are cut back to it. None: not padded.
    """

    ids: Tensor
    extra: Tuple[Any, ...]
    mask: Tensor
    site: Optional[str]
    was_tuple: bool
    module_outputs: Optional[Dict[str, Any]] = None
    captured_ids: Optional[Tensor] = None
    input_device: Optional[torch.device] = None
    length: Optional[int] = None

    def trimmed(self, per_token: Tensor) -> Tensor:
        r"""(B, T', ...) per-token values cut back to the caller's T."""
        return per_token if self.length is None else per_token[:, : self.length]


def check_layer(layer: Any, num_layers: int, allow_none: bool = False) -> Optional[int]:
    r"""
    Validates a layer index.

    Args:

        layer (int or None): the layer, 0..L.
        num_layers (int): L.
        allow_none (bool, optional): whether None (every layer) is accepted.
                    Default: False

    Returns:
        *int* or None: ``layer``.

    Raises:
        TypeError or ValueError naming ``layer``.
    """
    if layer is None and allow_none:
        return None
    if isinstance(layer, bool) or not isinstance(layer, int):
        raise TypeError(f"layer must be an int in 0..{num_layers}, got {layer!r}")
    if not 0 <= layer <= num_layers:
        raise ValueError(f"layer must be in 0..{num_layers}, got {layer}")
    return layer


def site_for_layer(layer: Any, num_layers: int) -> str:
    r"""``"input"`` for layer 0, ``"hidden.k"`` for k in 1..L; errors name ``layer``."""
    check_layer(layer, num_layers)
    return "input" if layer == 0 else f"hidden.{layer}"


def resolve_target(logits: Tensor, target: TargetType, argument: str = "target") -> Optional[Tensor]:
    r"""
    The class whose output is attributed, per example.

    Args:

        logits (Tensor): (B, C) class logits, (B, K, C) for K distributions per
                    example (e.g. a span's start and end), or (B,) / (B, 1) for one
                    binary logit.
        target (int, list, Tensor or None): for (B, C) logits an int, a list of B
                    ints or a (B,) tensor; for (B, K, C) logits a (B, K) tensor or
                    a list of B sequences of K ints; None means the predicted
                    class (of each distribution). For a binary logit it must be
                    None (the logit itself is attributed).

    Returns:
        *Tensor* (B,) or (B, K) long; None for a binary logit.
    """
    batch = logits.shape[0]
    if logits.dim() == 3:
        return _resolve_targets(logits, target, argument)
    if logits.dim() == 1 or (logits.dim() == 2 and logits.shape[1] == 1):
        if target is not None:
            raise ValueError(
                f"{argument} must be None for a model with one binary logit (the logit "
                f"itself is attributed), got {target!r}"
            )
        return None
    num_classes = logits.shape[-1]
    if target is None:
        return logits.argmax(-1)
    if isinstance(target, bool):
        raise TypeError(f"{argument} must be an int, a list of ints or a (B,) tensor, got a bool")
    if isinstance(target, int):
        target = torch.full((batch,), target, dtype=torch.long, device=logits.device)
    elif isinstance(target, (list, tuple)):
        if not all(isinstance(t, int) and not isinstance(t, bool) for t in target):
            raise TypeError(f"{argument}: a list target must hold ints, got {target!r}")
        target = torch.tensor(list(target), dtype=torch.long, device=logits.device)
    elif isinstance(target, Tensor):
        if target.dtype.is_floating_point or target.dtype == torch.bool:
            raise TypeError(f"{argument} must hold integer class indices, got dtype {target.dtype}")
        if target.dim() == 0:
            target = target.expand(batch)
        target = target.to(device=logits.device, dtype=torch.long)
    else:
        raise TypeError(
            f"{argument} must be None, an int, a list of ints or a (B,) tensor, got "
            f"{type(target).__name__}"
        )
    if target.shape != (batch,):
        raise ValueError(f"{argument} must have one class per example ({batch}), got shape {tuple(target.shape)}")
    if bool(((target < 0) | (target >= num_classes)).any()):
        raise ValueError(f"{argument} must be in 0..{num_classes - 1}, got {target.tolist()}")
    return target


def _resolve_targets(logits: Tensor, target: Any, argument: str) -> Tensor:
    r"""One class per distribution of (B, K, C) logits: (B, K) long."""
    batch, count, classes = logits.shape
    if target is None:
        return logits.argmax(-1)
    if isinstance(target, (list, tuple)):
        target = torch.tensor([list(row) for row in target], dtype=torch.long, device=logits.device)
    if not isinstance(target, Tensor) or target.dtype.is_floating_point or target.dtype == torch.bool:
        raise TypeError(f"{argument} must be a ({batch}, {count}) tensor or a list of {count} ints per example")
    target = target.to(device=logits.device, dtype=torch.long)
    if target.shape != (batch, count):
        raise ValueError(f"{argument} must have shape ({batch}, {count}) (one class per distribution), "
                         f"got {tuple(target.shape)}")
    if bool(((target < 0) | (target >= classes)).any()):
        raise ValueError(f"{argument} must be in 0..{classes - 1}, got {target.tolist()}")
    return target
