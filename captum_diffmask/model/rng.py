"""The caller's random number generators are left as they were found.

A fit with ``seed=`` and every ``attribute`` call run on a fork of torch's global
RNG (the CPU's and, once CUDA is in use, every GPU's): what they draw does not
move the caller's sequence.
"""

from __future__ import annotations

import contextlib
from typing import Iterator, List, Optional

import torch


def cuda_devices() -> List[int]:
    r"""The GPUs whose RNG is in use (CUDA initialised)."""
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        return list(range(torch.cuda.device_count()))
    return []


@contextlib.contextmanager
def preserved_rng(seed: Optional[int] = None) -> Iterator[None]:
    r"""
    Runs the block on a fork of torch's global RNG and restores the caller's
    state on exit, also after an exception.

    Args:

        seed (int, optional): seeds the fork (``torch.manual_seed``); when None
                    the block continues the caller's sequence, which is then
                    rewound. Default: None
    """
    with torch.random.fork_rng(devices=cuda_devices()):
        if seed is not None:
            torch.manual_seed(int(seed))
        yield
