"""A fit's state on disk, so that a long fit survives an interruption.

``DiffMask.fit(..., checkpoint=path)`` writes the whole state of the fit every
``checkpoint_every`` steps and at its end: the probe, baselines and multipliers,
both optimisers, the loop (step, drawn layers, convergence monitors, frozen
layers), the history, where in which epoch it stands, and the random number
generators (at the start of that epoch and now). A second call with the same
path resumes from there: the epoch's batches are drawn again from its starting
RNG and the ones already trained are skipped, then the RNG is set to where the
first call stood, so the resumed fit ends with the probe of an uninterrupted one
wherever the batches' order depends only on torch's RNG (a ``DataLoader`` with
``shuffle=True``, or a fixed order). A fit that had finished is not trained
again: its probe and history are restored, unless a cap stopped it and the new
call's caps (``max_steps``, ``epochs``) are larger: then it goes on from where
it stopped, in the same epoch, and ends as one call with those caps would.

The file is written to a temporary name and then renamed, so a process killed
while writing leaves the previous state. It holds tensors and plain values only
(every part of the fit writes its ``state_dict``), and is read with
``weights_only=True``: loading a state runs no code, and a state survives a move
of the classes that wrote it. A state of format 1 (pickled objects) is refused
by name, never unpickled.
"""

from __future__ import annotations

import os
import pickle
from dataclasses import dataclass, field, fields
from typing import Any, Dict, List, Mapping, Optional, Union

import torch

from captum_diffmask.model.rng import cuda_devices

#: Bumped when the layout of a fit state changes (2: tensors and plain values only).
FIT_STATE_FORMAT = 2

PathLike = Union[str, "os.PathLike[str]"]


def rng_states() -> Dict[str, Any]:
    r"""torch's global RNG states: the CPU's and every initialised GPU's."""
    return {"cpu": torch.get_rng_state(), "cuda": [torch.cuda.get_rng_state(d) for d in cuda_devices()]}


def set_rng_states(states: Dict[str, Any]) -> None:
    r"""Restores :func:`rng_states`."""
    torch.set_rng_state(states["cpu"])
    for device, state in zip(cuda_devices(), states["cuda"]):
        torch.cuda.set_rng_state(state, device)


#: What ended a fit's loop (:attr:`FitState.ended`).
ENDINGS = ("converged", "cooldown", "max_steps", "epochs")


@dataclass
class FitState:
    r"""
    Where a fit stands: everything of its loop that a resumed fit needs, as
    plain values and tensors.

    Attributes:
        step (int): the optimiser steps taken.
        epoch (int): the epoch it is in, from 1.
        batches (int): the batches of that epoch trained.
        seconds (float): the seconds of training in that epoch.
        epoch_rng (dict, optional): torch's RNG as it was when that epoch's
                    batches were first drawn (a resumed epoch draws them again).
        active (list of int): the layers still trained (a settled layer whose
                    probe is its own is frozen).
        ended (str, optional): None while the loop trains; then what ended it
                    (:data:`ENDINGS`): ``"converged"`` (every trained layer
                    settled), ``"cooldown"`` (the cool-down that followed ran
                    its steps and every layer settled again on them),
                    ``"max_steps"`` (the step cap, or the criterion's budget),
                    ``"epochs"`` (the epochs ran out).
        finished (bool): the call wrapped up after its loop ended (the epoch's
                    history rows, the checkpoint selection, the verdicts): a
                    fit resumed from a finished state is not trained again.
        sums (dict): per layer, the running sums of the epoch's step records.
        history (list of dict): the history rows of the epochs done.
        cooling_from (int, optional): the step the cool-down began at
                    (``Convergence.cooldown``); None before it.
        deployed (dict): per layer, the deterministic gates' KL last measured
                    (``compute.deployed_every``): what the constraint reads
                    on the steps in between.
        rng_to_restore (dict, optional): torch's RNG as a state left it when it
                    was written; a resumed fit sets it once the batches of the
                    epoch it resumes in that were trained are skipped, so that
                    it goes on as the uninterrupted fit would. None otherwise.
    """

    step: int = 0
    epoch: int = 1
    batches: int = 0
    seconds: float = 0.0
    epoch_rng: Optional[Dict[str, Any]] = None
    active: List[int] = field(default_factory=list)
    ended: Optional[str] = None
    finished: bool = False
    sums: Dict[int, Dict[str, float]] = field(default_factory=dict)
    history: List[Dict[str, Any]] = field(default_factory=list)
    cooling_from: Optional[int] = None
    deployed: Dict[int, float] = field(default_factory=dict)
    rng_to_restore: Optional[Dict[str, Any]] = None

    @property
    def stopped_by_cap(self) -> bool:
        r"""Whether a cap ended the loop (the steps inside an epoch, or the epochs)."""
        return self.ended in ("max_steps", "epochs")

    def state_dict(self) -> Dict[str, Any]:
        r"""The fields as a dict (the resume marker is not written: a state read
        back gets the RNG of its writing instead)."""
        state = {f.name: getattr(self, f.name) for f in fields(self)}
        state.pop("rng_to_restore")
        return state

    @staticmethod
    def reopened(state: Mapping[str, Any], layers: List[int]) -> Dict[str, Any]:
        r"""
        A finished fit's state (:meth:`state_dict`) as one its cap stopped
        (which a call with a larger cap goes on from, in the epoch it stopped
        in), with every layer of ``layers`` trained and no cool-down under
        way: a continuation of the fit with its optimisers' states, which keep
        the rates it ended at.

        Args:

            state (dict): a :meth:`state_dict`.
            layers (list of int): the layers the continuation trains.

        Returns:
            *dict*, a :meth:`state_dict`.
        """
        # a fit that ended at an epoch's end has no running sums: it goes on with the next epoch
        ended = "max_steps" if state["sums"] else "epochs"
        return {**state, "finished": True, "ended": ended, "cooling_from": None, "active": list(layers)}

    @classmethod
    def from_state_dict(cls, state: Mapping[str, Any], rng: Optional[Dict[str, Any]] = None) -> "FitState":
        r"""A state from :meth:`state_dict`; ``rng``: torch's RNG as it was when
        the state was written (:attr:`rng_to_restore`)."""
        return cls(**{**state, "active": list(state["active"]), "sums": dict(state["sums"]),
                      "deployed": dict(state.get("deployed", {})),
                      "history": list(state["history"]), "rng_to_restore": rng})


class FitCheckpoint:
    r"""
    Writes and reads one fit's state.

    Args:

        path (str or PathLike): the file.
        every (int): write after every ``every`` steps (and at the end).
    """

    def __init__(self, path: PathLike, every: int) -> None:
        self.path, self.every = os.fspath(path), int(every)

    def due(self, step: int) -> bool:
        r"""Whether the state is written after ``step``."""
        return step % self.every == 0

    def exists(self) -> bool:
        return os.path.exists(self.path)

    def write(self, state: Dict[str, Any]) -> None:
        r"""Writes ``state`` atomically (a temporary file, then a rename)."""
        temporary = f"{self.path}.tmp"
        torch.save({"format": FIT_STATE_FORMAT, **state}, temporary)
        os.replace(temporary, self.path)

    def read(self, config: Mapping[str, Any], layers: List[int], model: Optional[str] = None) -> Dict[str, Any]:
        r"""The state written by a fit of the same probe (its ``config``) and
        ``layers`` on the same model (``model``: the fingerprint of its weights;
        a state written before states held one is not checked); ValueError
        naming ``checkpoint`` otherwise."""
        try:
            state = torch.load(self.path, map_location="cpu", weights_only=True)
        except pickle.UnpicklingError as error:
            if "Unsupported global" in str(error):  # a format-1 state pickled the library's objects
                raise ValueError(
                    f"checkpoint: {self.path} is a fit state of an earlier version (format 1: pickled objects) or "
                    "not a fit state of this library; it is not loaded, since unpickling runs code: delete it, "
                    "or pass a new path to start afresh"
                ) from None
            raise ValueError(f"checkpoint: {self.path} is not a readable fit state ({type(error).__name__})") from None
        except Exception as error:  # noqa: BLE001 - any unreadable file
            raise ValueError(f"checkpoint: {self.path} is not a readable fit state ({type(error).__name__})") from None
        if not isinstance(state, dict) or state.get("format") != FIT_STATE_FORMAT:
            raise ValueError(f"checkpoint: {self.path} is not a fit state of this version (format {FIT_STATE_FORMAT})")
        if state["config"] != dict(config) or state["layers"] != layers:
            raise ValueError(
                f"checkpoint: {self.path} was written by a fit of another probe or other layers "
                f"({state['config']}, layers {state['layers']}); pass a new path to start afresh"
            )
        if model is not None and state.get("model", model) != model:
            raise ValueError(f"checkpoint: {self.path} was written by a fit on another model (other weights); "
                             "a probe is tied to its model's weights: pass a new path to start afresh")
        return state
