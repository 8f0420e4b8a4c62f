"""Argument checks shared by every method: each error names the argument."""

from __future__ import annotations

from typing import Any, Sequence


def check_positive_int(value: Any, name: str, allow_none: bool = False) -> None:
    r"""An int >= 1 (None too, with ``allow_none``); ValueError naming ``name``."""
    if value is None and allow_none:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be an int >= 1, got {value!r}")


def check_non_negative(value: Any, name: str) -> None:
    r"""A real number >= 0 (not NaN, not a bool); ValueError naming ``name``."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0:
        raise ValueError(f"{name} must be a number >= 0, got {value!r}")


def check_choice(value: Any, choices: Sequence[str], name: str) -> None:
    r"""One of ``choices``; ValueError naming ``name`` and the choices."""
    if value not in choices:
        raise ValueError(f"{name} must be one of {tuple(choices)}, got {value!r}")
