r"""
Where DiffMask's spread across fit seeds on SST comes from, measured on
SST **train** sentences only (no dev sentence is read, so nothing here is tuned on
what the sst suite reports).

The train split is shuffled once (``random.Random(123)``): 500 sentences are held
out and attributed, 400 are set aside, the remaining 7644 are fitted on. For each
seed, DiffMask (the sst suite's model and task settings: ``l0="mean"``, eps 0.01
hidden / 0.02 input, windows of 50 steps, one layer drawn per batch as the sst
suite ran before fit's default became every layer per batch; ``--fit
'{"layers_per_batch": "all"}'`` for that) is fitted for ``--epochs`` epochs with
``until_converged=False`` and no checkpoint selection; after every epoch the held-out
sentences are attributed at every layer, with the probe as it is (``raw``) and with
an exponential moving average of its weights over the steps (``ema``, decay 0.998):
if the spread came from where each fit stands in an oscillation when it stops,
averaging the weights would shrink it.

It prints, per epoch, the mean std across seeds of the (sentence, token, layer)
attributions (the suite's stability figure) and the change of the first seed's
attributions since the previous epoch, and writes the per-epoch attributions to
``--out`` (a torch file) for per-layer analysis. ``--beta2`` sets Adam's second-
moment decay (fit's default 0.99) by patching the probe's optimiser.

Usage::

    python -m benchmarks study sst-seed-spread --mode hidden --seeds 0 1 --epochs 10 --out spread.pt [--beta2 0.9]
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from typing import Any, Dict, List, Optional

import torch

import captum_diffmask.diffmask.fit.loop as fitting
from benchmarks.common.minilm.fitting import OnDevice
from benchmarks.suites import sst as suite
from benchmarks.tasks import sst_bert
from benchmarks.tasks.sst import read_sst
from captum_diffmask import Convergence, DiffMask
from captum_diffmask.diffmask import grouped_options

#: The question this study answers (``python -m benchmarks list``).
QUESTION = "the spread of DiffMask's attributions across fit seeds, per epoch, on train sentences"

#: The decay of the probe's weight average.
EMA_DECAY = 0.998


class _Watch:
    r"""Patches the fit loop's training step (to average the probe's weights) and
    its epoch rows (to attribute the held-out sentences, raw and averaged);
    :meth:`close` restores both."""

    def __init__(self, held: sst_bert.EncodedSST, beta2: Optional[float]) -> None:
        self.held, self.beta2 = held, beta2
        self.snapshots: Dict[str, List[List[torch.Tensor]]] = {"raw": [], "ema": []}
        self.average: Dict[str, torch.Tensor] = {}
        self._step, self._rows, self._build = fitting.training_step, fitting.epoch_rows, fitting.build_optimizers
        fitting.training_step, fitting.epoch_rows = self.step, self.rows
        fitting.build_optimizers = self.build

    def close(self) -> None:
        fitting.training_step, fitting.epoch_rows = self._step, self._rows
        fitting.build_optimizers = self._build

    def build(self, explainer: DiffMask, options: Any, constraint: Any) -> Any:
        probe_opt, lambda_opt = self._build(explainer, options, constraint)
        if self.beta2 is not None:
            for group in probe_opt.param_groups:
                group["betas"] = (group["betas"][0], self.beta2)
        return probe_opt, lambda_opt

    def step(self, explainer: DiffMask, *args: Any, **kwargs: Any) -> Dict[str, float]:
        record = self._step(explainer, *args, **kwargs)
        with torch.no_grad():
            for name, p in explainer.probe.named_parameters():
                if name not in self.average:
                    self.average[name] = p.detach().clone()
                else:
                    self.average[name].mul_(EMA_DECAY).add_(p.detach(), alpha=1 - EMA_DECAY)
        return record

    def rows(self, explainer: DiffMask, *args: Any, **kwargs: Any) -> Any:
        self.snapshots["raw"].append(self._attribute(explainer))
        saved = {n: p.detach().clone() for n, p in explainer.probe.named_parameters()}
        self._load(explainer, self.average)
        self.snapshots["ema"].append(self._attribute(explainer))
        self._load(explainer, saved)
        return self._rows(explainer, *args, **kwargs)

    def _attribute(self, explainer: DiffMask) -> List[torch.Tensor]:
        return suite.per_sentence(self.held, 128, lambda ids, mask: explainer.attribute(
            ids, additional_forward_args=(mask,), layer=None), device=torch.device("cpu"))

    @staticmethod
    def _load(explainer: DiffMask, values: Dict[str, torch.Tensor]) -> None:
        with torch.no_grad():
            for name, p in explainer.probe.named_parameters():
                p.copy_(values[name])


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks study sst-seed-spread", description=__doc__.split("\n\n")[1])
    parser.add_argument("--mode", choices=("input", "hidden"), default="hidden")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--beta2", type=float, default=None, help="Adam's beta2 for the probe (default: fit's)")
    parser.add_argument("--fit", type=json.loads, default={},
                        help="more of fit's options, JSON, e.g. '{\"layers_per_batch\": \"all\"}'")
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--out", required=True, help="torch file for the per-epoch attributions")
    args = parser.parse_args(argv)
    if len(args.seeds) < 2:
        parser.error("--seeds: the spread needs at least two seeds")
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    train_all = read_sst("train")
    model, tokenizer, _ = suite.load_model(suite.DEFAULTS, train_all, read_sst("dev"), False)
    order = list(range(len(train_all)))
    random.Random(123).shuffle(order)
    encode = lambda rows: sst_bert.encode_sst([train_all[i] for i in rows], tokenizer, 128)  # noqa: E731
    held, fit_on = encode(order[:500]), encode(order[900:])
    eps = 0.01 if args.mode == "hidden" else 0.02
    per_seed = {}
    for seed in args.seeds:
        watch = _Watch(held, args.beta2)
        try:
            torch.manual_seed(seed)
            explainer = DiffMask(model, mode=args.mode, l0="mean", votes="tied")  # the committed report's probe
            start = time.perf_counter()
            batches = OnDevice(fit_on.loader(32, shuffle=True, seed=seed, sort_by_length=True), torch.device("cpu"))
            options = {"eps": eps, "epochs": args.epochs, "until_converged": False,
                       "convergence": Convergence(window=50), "layers_per_batch": "one", **args.fit}
            explainer.fit(batches, seed=seed, verbose=False, **grouped_options(options))
        finally:
            watch.close()
        print(f"seed {seed}: fit {time.perf_counter() - start:.0f} s", flush=True)
        per_seed[seed] = watch.snapshots
        torch.save(per_seed, args.out)
    for kind in ("raw", "ema"):
        line = []
        for epoch in range(args.epochs):
            spread = suite.stability([per_seed[s][kind][epoch] for s in args.seeds])["mean_std"]
            moved = (suite.stability([per_seed[args.seeds[0]][kind][epoch - 1], per_seed[args.seeds[0]][kind][epoch]])
                     ["mean_std"] if epoch else float("nan"))
            line.append(f"{epoch + 1}: {spread:.4f} (moved {moved:.4f})")
        print(f"{kind}: std across seeds per epoch: " + ", ".join(line), flush=True)
    _print_last_epoch(per_seed, args.seeds)
    return 0


def _print_last_epoch(per_seed: Dict[int, Dict[str, List[Any]]], seeds: List[int]) -> None:
    r"""The last epoch's raw attributions: the std across seeds per layer, and
    each seed's mean keep per layer."""
    last = [per_seed[s]["raw"][-1] for s in seeds]
    spread = suite.stability(last)
    print("last epoch, std across seeds per layer: "
          + ", ".join(f"{row['mean_std']:.3f}" for row in spread["per_layer"]), flush=True)
    for seed, attributions in zip(seeds, last):
        keep = torch.cat([a.reshape(-1, a.shape[-1]) for a in attributions]).mean(0)
        print(f"seed {seed}: mean keep per layer: " + ", ".join(f"{v:.2f}" for v in keep.tolist()), flush=True)


if __name__ == "__main__":
    sys.exit(main())
