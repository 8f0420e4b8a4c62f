r"""
How many steps do the squad suite's DiffMask fits need to converge?

The suite's model (the cached fine-tuned MiniLM) and DiffMask settings, with
every layer trained on every batch and no step cap; the training windows are
fed ``--chunk`` batches at a time as one "epoch", so the per-layer convergence
status (:class:`captum_diffmask.Convergence`), the training KL, kept share and
multiplier, and the validation scores are printed every ``--chunk`` steps of
every layer. Only the fine-tuning articles' windows are read (training and
validation); nothing here is scored on the held-out articles.

Usage (a GPU makes it minutes: 235 s input, 137 s hidden for 8 chunks of 250 on
an H200; on one CPU thread one chunk of 250 batches takes about 20 min in input
mode)::

    python -m benchmarks study squad-convergence --device cuda --chunk 250 --epochs 8 --out squad-convergence.json
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
import time
from typing import Any, Dict, Iterator, List, Optional, Sequence

import torch

from benchmarks.common.minilm.fitting import fit_diffmask
from benchmarks.runner import build_config, load_suite
from benchmarks.suites.squad import load_bench

#: The question this study answers (``python -m benchmarks list``).
QUESTION = "the SQuAD fits' verdicts, chunk by chunk"

HISTORY_KEYS = ("epoch", "layer", "kl", "l0", "lambda", "steps", "status", "valid_kl", "valid_l0", "valid_agreement")


class _Chunks:
    r"""The training windows' batches (shuffled once), ``chunk`` of them per
    iteration, cycling through the list: one iteration is one "epoch" of fit."""

    def __init__(self, batches: List[Any], chunk: int) -> None:
        self.batches, self.chunk, self.at = batches, chunk, 0

    def __iter__(self) -> Iterator[Any]:
        for _ in range(self.chunk):
            yield self.batches[self.at % len(self.batches)]
            self.at += 1

    def __len__(self) -> int:
        return self.chunk


class _ChunkedWindows:
    r"""Stands in for the bench's training windows: ``loader`` gives :class:`_Chunks`."""

    def __init__(self, features: Any, chunk: int) -> None:
        self.features, self.chunk = features, chunk

    def loader(self, batch_size: int, shuffle: bool = True, seed: int = 0, sort_by_length: bool = True) -> _Chunks:
        return _Chunks(self.features.loader(batch_size, shuffle=shuffle, seed=seed, sort_by_length=sort_by_length),
                       self.chunk)


def fit_in_chunks(bench: Any, config: Dict[str, Any], mode: str, chunk: int, epochs: int, seed: int) -> Dict[str, Any]:
    r"""One fit in ``mode``: the per-(chunk, layer) history, the final
    convergence report per layer, the selected chunk and the seconds."""
    options = {k: copy.deepcopy(v) for k, v in config["diffmask"].items()
               if k not in ("validation_windows", "input", "hidden")}
    options.update({"layers_per_batch": "all", "epochs": epochs})
    start = time.perf_counter()
    _, record = fit_diffmask(bench.model, mode, _ChunkedWindows(bench.train, chunk), bench.valid,
                             {"diffmask": options}, seed, False)
    return {"seconds": time.perf_counter() - start, "selected_epoch": record["selected_epoch"],
            "history": [{k: h.get(k) for k in HISTORY_KEYS} for h in record["history"]],
            "convergence": record["convergence"]}


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--chunk", type=int, default=250, help="batches per reported 'epoch'")
    parser.add_argument("--epochs", type=int, default=8, help="chunks in all")
    parser.add_argument("--modes", nargs="+", default=["input", "hidden"], choices=["input", "hidden"])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--data", default=None, help="SQuAD v1.1 dev JSON (default: ../shared/data/squad)")
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--set", default=None, help="the suite's configuration overridden, JSON")
    parser.add_argument("--out", required=True, help="JSON file")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    overrides = json.loads(args.set) if args.set else {}
    if args.data:
        overrides["data"] = {**overrides.get("data", {}), "path": args.data}
    overrides["device"] = args.device  # the suite's own setting: the model and its batches there
    config = build_config(load_suite("squad"), overrides=overrides)
    bench = load_bench(config, True)
    results: Dict[str, Any] = {"args": vars(args), "device": str(args.device)}
    for mode in args.modes:
        results[mode] = fit_in_chunks(bench, config, mode, args.chunk, args.epochs, args.seed)
        print(f"== {mode}: {results[mode]['seconds']:.0f} s, selected chunk {results[mode]['selected_epoch']}")
        for row in results[mode]["history"]:
            print(f"{mode} chunk {row['epoch']} layer {row['layer']}: {row['status']:10s} KL {row['kl']:.3f} "
                  f"kept {row['l0']:.3f} lambda {row['lambda']:.1f}", flush=True)
        with open(args.out, "w", encoding="utf-8") as f:
            json.dump(results, f, default=str, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
