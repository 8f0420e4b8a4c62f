r"""
Seconds per DiffMask fit step with the layers' masked passes stacked
(``stack_layers``) against one pass per layer, on a MiniLM-sized question
answering model with the squad suite's fit settings (batches of 8 windows of
170 tokens, bfloat16, the mean L0): the measurement that chose
``stack_layers="all"`` for the squad suite's hidden-mode fit on a GPU.

The weights are random (a step's time does not depend on them), so it needs
neither the pretrained model nor data: only the model's configuration (BERT's
``all-MiniLM-L6-v2`` sizes by default). A step's time is the difference of two
fits' times (``--steps`` and ``--warmup`` steps) divided by the difference of
their steps, so that start-up costs cancel.

Usage::

    python -m benchmarks study stacking-speed-qa --device cuda [--steps 25 --warmup 5]
"""

from __future__ import annotations

import argparse
import sys
import time
import warnings
from typing import Dict, List, Optional

import torch
from transformers import BertConfig, BertForQuestionAnswering

from benchmarks.records import synchronize
from captum_diffmask import DiffMask

#: The question this study answers (``python -m benchmarks list``).
QUESTION = "the same stacking choice timed on a MiniLM-sized QA model with random weights, on any device"

#: all-MiniLM-L6-v2's sizes.
MINILM = {"vocab_size": 30522, "hidden_size": 384, "num_hidden_layers": 6, "num_attention_heads": 12,
          "intermediate_size": 1536, "max_position_embeddings": 512}
#: The choices timed per mode.
CHOICES = {"input": ("same_site", "none"), "hidden": ("none", "all")}


def fit_seconds(model: torch.nn.Module, batches: List, mode: str, stack: str, steps: int) -> float:
    r"""Wall seconds of a ``steps``-step fit of a fresh DiffMask in ``mode``."""
    explainer = DiffMask(model, mode=mode, l0="mean")
    device = next(model.parameters()).device
    synchronize(device)
    start = time.perf_counter()
    explainer.fit(batches, eps=1.0, compute={"precision": "bfloat16", "stack_layers": stack}, max_steps=steps,
                  verbose=False, seed=0)
    synchronize(device)
    return time.perf_counter() - start


def measure(device: str, steps: int, warmup: int, attention: str = "eager", batch_size: int = 8,
            length: int = 170) -> Dict[str, Dict[str, float]]:
    r"""
    Seconds per fit step for each choice of :data:`CHOICES`, on ``device``
    with ``attention`` (``attn_implementation``), ``batch_size`` windows of
    ``length`` tokens.

    Returns:
        *dict* ``{mode: {stack_layers: seconds a step}}``.
    """
    torch.manual_seed(0)
    model = BertForQuestionAnswering._from_config(BertConfig(**MINILM), attn_implementation=attention)
    model = model.to(device).eval()
    generator = torch.Generator().manual_seed(0)
    batches = [tuple(t.to(device) for t in (torch.randint(1000, 30000, (batch_size, length), generator=generator),
                                            torch.ones(batch_size, length, dtype=torch.long),
                                            torch.zeros(batch_size, length, dtype=torch.long)))
               for _ in range(16)]
    seconds: Dict[str, Dict[str, float]] = {}
    for mode, choices in CHOICES.items():
        for stack in choices:
            short, long = (fit_seconds(model, batches, mode, stack, n) for n in (warmup, steps))
            seconds.setdefault(mode, {})[stack] = (long - short) / (steps - warmup)
    return seconds


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks study stacking-speed-qa", description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--steps", type=int, default=25)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--attention", default="eager", help="the model's attn_implementation")
    args = parser.parse_args(argv)
    if args.steps <= args.warmup:
        parser.error("--steps must be larger than --warmup")
    warnings.filterwarnings("ignore")
    for mode, by_choice in measure(args.device, args.steps, args.warmup, args.attention).items():
        for stack, seconds in by_choice.items():
            print(f"{mode} stack_layers={stack}: {seconds:.4f} s/step")
    return 0


if __name__ == "__main__":
    sys.exit(main())
