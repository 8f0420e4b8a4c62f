"""Values as JSON holds them: what a report, a saved probe's record and a
comparison's ``to_dict`` write."""

from __future__ import annotations

import math
from typing import Any, Mapping, Optional

from torch import Tensor


def finite(value: float) -> Optional[float]:
    r"""``value`` as a float, or None when it is not finite (JSON has no NaN)."""
    return float(value) if math.isfinite(value) else None


def json_values(value: Any) -> Any:
    r"""
    ``value`` with mappings as dicts of string keys, tuples as lists, tensors
    as lists (a scalar as its number), non-finite floats as None and any other
    object as its ``repr``, so that ``json.dumps`` takes it.
    """
    if isinstance(value, Tensor):
        return value.tolist()
    if isinstance(value, Mapping):
        return {str(k): json_values(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_values(v) for v in value]
    if isinstance(value, float):
        return finite(value)
    if value is None or isinstance(value, (bool, int, str)):
        return value
    return repr(value)
