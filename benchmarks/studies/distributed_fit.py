"""DiffMask fitted by several processes under ``torchrun``: the launcher, and the
throughput measurement behind ``docs/results/scaling.md``.

    torchrun --nproc_per_node=2 -m benchmarks.studies.distributed_fit --task sst --steps 60 --out out/scaling
    python -m benchmarks study distributed-fit --task sst --steps 60 --out out/scaling      # one process

Every rank reads its shard of the training batches (the fit shards them: every
rank reads the loader and keeps its batch of each group of ``world`` batches), the
gradients are averaged, and rank 0 writes
``DIR/run-<task>-<mode>-<processes>x<threads>.json``: the fit's throughput
(training examples and real tokens a second, counting every rank's batch), its
steps, and the largest difference between any rank's probe and rank 0's.
:mod:`benchmarks.studies.scaling` runs the grid of these and writes the report. Backend
``gloo`` on CPUs, ``nccl`` when every rank has a GPU (``--device cuda``).
"""

from __future__ import annotations

import argparse
import json
import os
import time
import warnings
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

import torch
import torch.distributed as dist
from torch import nn

from captum_diffmask import DiffMask
from captum_diffmask.diffmask.fit.distributed import check_same, is_main_process, rank_and_world

#: The question this study answers (``python -m benchmarks list``).
QUESTION = "a DiffMask fit under torchrun: several processes, one global batch"

#: Per task: the constructor's options and fit's eps (the toy suite's and the sst suite's).
# (input mode's votes tied across depths, as the committed report fitted them)
TASK_OPTIONS = {"toy": ({"l0": "expected", "votes": "tied"}, 0.05), "sst": ({"l0": "mean", "votes": "tied"}, 0.02)}


def _toy(batch_size: int) -> Tuple[nn.Module, Dict[str, Any], List[Any]]:
    from captum_diffmask.evaluation.toy_task import generate_toy_data, toy_sites, train_toy_model

    train, valid = generate_toy_data(4000, seed=0).split(0.1, seed=0)
    model, _ = train_toy_model(train, valid, seed=0, epochs=10)
    return model, {"sites": toy_sites(model), "padding_mask_arg": 1}, list(train.loader(batch_size, seed=0))


def _sst(batch_size: int) -> Tuple[nn.Module, Dict[str, Any], List[Any]]:
    from benchmarks.common.minilm.loading import load_model
    from benchmarks.suites.sst import DEFAULTS
    from benchmarks.tasks import sst_bert
    from benchmarks.tasks.sst import read_sst

    train, dev = read_sst("train"), read_sst("dev")
    model, tokenizer, _ = load_model(DEFAULTS, train, dev, verbose=False)  # the sst suite's cached MiniLM
    encoded = sst_bert.encode_sst(train, tokenizer, 128)
    return model, {}, list(encoded.loader(batch_size, shuffle=True, seed=0, sort_by_length=True))


#: task name -> builder of ``(model, DiffMask's options, training batches)`` at a batch size.
TASKS = {"toy": _toy, "sst": _sst}


def run(task: str, steps: int, batch_size: int, mode: str, device: str) -> Dict[str, Any]:
    r"""Fits DiffMask for ``steps`` global steps; the figures rank 0 reports."""
    rank, world = rank_and_world()
    model, options, batches = TASKS[task](batch_size)
    if steps * world > len(batches):
        raise ValueError(f"steps: {steps} steps of {world} batches exceed one epoch of {task} ({len(batches)} batches)")
    model.to(device)
    extra, eps = TASK_OPTIONS[task]
    explainer = DiffMask(model, mode=mode, **options, **extra)
    start = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a fixed number of steps: not meant to converge
        # one layer drawn per step, as the committed scaling report ran: a step
        # is then one batch through one masked pass (the unit the report times)
        history = explainer.fit(batches, max_steps=steps, epochs=1000, seed=0, eps=eps, verbose=False,
                                convergence={"until_converged": False}, compute={"layers_per_batch": "one"})
    seconds = time.perf_counter() - start
    done = sum(row["steps"] for row in history)
    # within one epoch the fit reads the batches in order, each rank one of every
    # ``world``: the first ``done * world`` are the ones read
    read = batches[: done * world]
    tokens = sum(int(batch[-1].sum()) for batch in read)
    assert explainer.probe is not None
    difference = check_same(explainer.probe.parameters()) if world > 1 else 0.0
    return {
        "task": task, "mode": mode, "world_size": world, "threads_per_process": torch.get_num_threads(),
        "device": str(next(model.parameters()).device), "steps": done, "batch_size_per_process": batch_size,
        "seconds": seconds, "examples_per_second": sum(len(batch[0]) for batch in read) / seconds,
        "tokens_per_second": tokens / seconds,
        "train_examples": sum(len(batch[0]) for batch in batches),
        "train_tokens": sum(int(batch[-1].sum()) for batch in batches),
        "max_probe_difference_across_ranks": difference, "last": history[-1],
    }


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks study distributed-fit", description=__doc__.split("\n\n")[0])
    parser.add_argument("--task", choices=("toy", "sst"), default="toy")
    parser.add_argument("--mode", choices=("input", "hidden"), default="hidden")
    parser.add_argument("--steps", type=int, default=60, help="global steps (one batch per process each)")
    parser.add_argument("--batch-size", type=int, default=32, help="per process")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=None, help="torch threads per process (default: cores / processes)")
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    world = int(os.environ.get("WORLD_SIZE", "1"))
    torch.set_num_threads(args.threads or max((os.cpu_count() or 1) // world, 1))
    if world > 1:
        dist.init_process_group("nccl" if args.device.startswith("cuda") else "gloo")
    try:
        result = run(args.task, args.steps, args.batch_size, args.mode, args.device)
        if is_main_process():
            out = Path(args.out)
            out.mkdir(parents=True, exist_ok=True)
            (out / f"run-{args.task}-{args.mode}-{world}x{torch.get_num_threads()}.json").write_text(json.dumps(result, indent=2))
            print(json.dumps({k: v for k, v in result.items() if k != "last"}))
        if world > 1:
            dist.barrier()  # no rank tears the group down while another still talks to it
    finally:
        if world > 1:
            dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
