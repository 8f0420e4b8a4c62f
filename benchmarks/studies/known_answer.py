r"""
Right where the answer is known: DiffMask with fit's defaults on a transformer
whose answer is known, in input mode at every depth.

Part ``toy-encoder``: the paper's toy task written as tokens for a small
BERT-style encoder (the toy-lm suite's encoder, :mod:`benchmarks.tasks.toy_lm`):
``<n> <m> : x_1 .. x_t ->``, the answer read at the last position. The output
needs the query and the digits of ``x`` that hold ``n`` or ``m`` (the ground
truth); the other digits carry nothing. What must hold, fixed before the run:

- fit's defaults settle every depth (``converged`` or ``needed``);
- at the top depth the mask keeps what the output needs and drops the rest: a
  mean keep probability of at least :data:`KEEP` on the ground-truth digits and
  at most :data:`DROP` on the other digits;
- depth 0 (the embeddings, which cannot see the query) keeps more of the digits
  than the top depth.

Usage::

    python -m benchmarks study known-answer --markdown docs/results/known-answer.md [--seed 3] [--quick]
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
import time
import warnings
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Sequence

import torch

from benchmarks.records import environment, to_jsonable
from benchmarks.suites import toy_lm
from benchmarks.suites.toy import seed_data
from benchmarks.tasks.toy_lm import decoder_accuracy, encode_toy
from captum_diffmask import DiffMask, DiffMaskConvergenceWarning
from captum_diffmask.diffmask.constrained.convergence import SETTLED

#: The question this study answers (``python -m benchmarks list``).
QUESTION = "whether fit's defaults find the known answer on transformers whose answer is known"

#: The least mean keep probability on what the output needs, at the top depth.
KEEP = 0.9
#: The most mean keep probability on what it does not need, at the top depth.
DROP = 0.2

#: The toy-lm suite's encoder, as its report was run (seeds 3-5 chose nothing here).
ENCODER = {"model": {"architecture": "encoder"}}
#: What ``--quick`` changes: fewer examples and epochs (a smoke run, not the targets').
QUICK = {"data": {"num_examples": 3000}, "model": {"epochs": 2}}


def _merged(base: Mapping[str, Any], change: Mapping[str, Any]) -> Dict[str, Any]:
    out = copy.deepcopy(dict(base))
    for key, value in change.items():
        out[key] = _merged(out[key], value) if isinstance(value, Mapping) and isinstance(out.get(key), Mapping) else value
    return out


def toy_encoder(seed: int, quick: bool = False, max_steps: Optional[int] = None, verbose: bool = False) -> Dict[str, Any]:
    r"""
    The part ``toy-encoder``: the encoder trained (or from the cache), DiffMask
    in input mode at every depth with fit's defaults, each depth's keep
    probabilities by the prompts' parts on the held-out prompts, and the checks.

    Args:

        seed (int): the data's and the encoder's seed.
        quick (bool, optional): :data:`QUICK`'s smaller run. Default: False
        max_steps (int, optional): a cap on the fit (tests); None: fit's own budget.
        verbose (bool, optional): progress lines. Default: False

    Returns:
        *dict* with ``model`` (held-out accuracy, cached), ``fit`` (steps,
        seconds, verdicts), ``depths`` (per depth the mean keep probability of
        each part) and ``checks`` (name, value, target, met).
    """
    config = _merged(toy_lm.DEFAULTS, ENCODER)
    if quick:
        config = _merged(config, QUICK)
    train_data, valid_data = seed_data(config, seed)
    digits = int(config["data"]["vocab_size"])
    train, valid = encode_toy(train_data, digits), encode_toy(valid_data, digits)
    model, info = toy_lm.load_decoder(config, seed, train, valid, verbose)
    dm = DiffMask(model, mode="input", output="last")
    start = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DiffMaskConvergenceWarning)  # the verdicts are reported per depth
        dm.fit(list(train.batches(64, shuffle=True, seed=seed)), seed=seed, verbose=verbose,
               **({} if max_steps is None else {"max_steps": max_steps}))
    seconds = time.perf_counter() - start
    keep = dm.attribute(valid.ids, additional_forward_args=(valid.mask,), layer=None)  # (N, T, L + 1)
    groups = toy_lm.position_groups(valid)
    depths = [{"depth": k, **{name: float(keep[..., k][where].mean()) for name, where in groups.items()}}
              for k in range(keep.shape[-1])]
    verdicts = {str(k): str(report["status"]) for k, report in sorted(dm.convergence.items())}
    return {"model": {"seed": seed, "accuracy": decoder_accuracy(model, valid), "cached": info["cached"],
                      "layers": model.config.num_hidden_layers},
            "fit": {"steps": dm.fit_record.get("steps"), "seconds": seconds, "verdicts": verdicts},
            "depths": depths, "checks": checks(depths, verdicts)}


def checks(depths: Sequence[Mapping[str, float]], verdicts: Mapping[str, str]) -> List[Dict[str, Any]]:
    r"""The three checks of the module's docstring, each with its value and target."""
    top, bottom = depths[-1], depths[0]
    settled = sum(v in SETTLED for v in verdicts.values())

    def digits(row: Mapping[str, float]) -> float:
        return (row["digits (ground truth)"] + row["digits (others)"]) / 2

    return [
        {"check": "fit's defaults settle every depth", "value": f"{settled} of {len(verdicts)}",
         "target": "all", "met": settled == len(verdicts)},
        {"check": "the top depth keeps the ground-truth digits", "value": round(top["digits (ground truth)"], 3),
         "target": f">= {KEEP}", "met": top["digits (ground truth)"] >= KEEP},
        {"check": "the top depth drops the other digits", "value": round(top["digits (others)"], 3),
         "target": f"<= {DROP}", "met": top["digits (others)"] <= DROP},
        {"check": "depth 0 keeps more of the digits than the top depth",
         "value": f"{digits(bottom):.3f} vs {digits(top):.3f}", "target": "more", "met": digits(bottom) > digits(top)},
    ]


def markdown(result: Mapping[str, Any], command: str) -> str:
    r"""The report of one run."""
    part = result["toy-encoder"]
    names = [k for k in part["depths"][0] if k != "depth"]
    rows = ["| depth | verdict | " + " | ".join(names) + " |", "|---" * (len(names) + 2) + "|"]
    for row in part["depths"]:
        rows.append(f"| {row['depth']} | {part['fit']['verdicts'].get(str(row['depth']), 'n/a')} | "
                    + " | ".join(f"{row[n]:.3f}" for n in names) + " |")
    check_rows = ["| check | value | target | met |", "|---|---|---|---|"]
    check_rows += [f"| {c['check']} | {c['value']} | {c['target']} | **{'met' if c['met'] else 'missed'}** |"
                   for c in part["checks"]]
    model = part["model"]
    return "\n".join([
        "# Right where the answer is known", "",
        f"Command: `{command}`. " + __doc__.split("\n\n")[1].replace("\n", " ").strip(), "",
        "## The toy task on a BERT-style encoder", "",
        f"Encoder of seed {model['seed']} ({model['layers']} blocks; held-out accuracy {100 * model['accuracy']:.2f} %, "
        f"{'from the cache' if model['cached'] else 'trained in this run'}). DiffMask in input mode at every depth "
        f"with fit's defaults: {part['fit']['steps']} steps, {part['fit']['seconds']:.0f} s. Mean keep probability "
        "on the held-out prompts, by part:", "",
        "\n".join(rows), "", "\n".join(check_rows), "",
        "Thresholds fixed before the run: " + f"keep >= {KEEP} on what the output needs, <= {DROP} on the rest.", ""])


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks study known-answer", description=__doc__.split("\n\n")[1])
    parser.add_argument("--markdown", required=True, help="write the report here (its JSON beside it)")
    parser.add_argument("--seed", type=int, default=3, help="the data's and the encoder's seed (default: 3)")
    parser.add_argument("--quick", action="store_true", help="a smaller smoke run")
    parser.add_argument("--verbose", action="store_true")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    result = {"toy-encoder": toy_encoder(args.seed, args.quick, verbose=args.verbose), "environment": environment()}
    command = f"python -m benchmarks study known-answer --markdown {args.markdown} --seed {args.seed}" + \
        (" --quick" if args.quick else "")
    path = Path(args.markdown)
    path.write_text(markdown(result, command))
    path.with_suffix(".json").write_text(json.dumps(to_jsonable({**result, "command": command}), indent=1) + "\n")
    print(markdown(result, command), file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
