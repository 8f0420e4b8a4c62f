r"""calibrate_eps on the toy task: the eps a target agreement picks, the rungs
it walks, the chosen masks checked on held-out data the calibration did not
see, and the ladder's time against one fit from scratch at the chosen eps.

Command: ``python -m benchmarks study eps-calibration --markdown docs/results/eps-calibration-toy.md``.
The toy suite's GRU of seed 0 (cached) and its data; hidden mode at the FFNN
output (layer 1), where the ground truth is the query digits. The held-out set
is split in two: the calibration scores its rungs on the first half, and the
chosen probe is scored again on the second.
"""

from __future__ import annotations

import argparse
import copy
import json
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Dict, Optional, Sequence

#: The question this study answers (``python -m benchmarks list``).
QUESTION = "calibrate_eps on the toy task: the eps an agreement target picks, its frontier, its cost against one fit"
LADDER = (0.01, 0.05, 0.2, 0.5, 1.0)
#: What the run is, for the report.
SETUP = ("The toy suite's GRU of seed 0 (cached) and its data; hidden mode at the FFNN output (layer 1), where "
         "the ground truth is the query digits. The held-out set is split in two: the calibration scores its "
         "rungs on the first half, and the chosen probe is scored again on the second.")


#: Where the rung is chosen: held-out data the fits never see, apart from the half that is then scored.
CHOSEN_ON = "the first half of the toy held-out set (never fitted on)"

def measure(agreement: float, seed: int) -> Dict[str, Any]:
    r"""The calibration, the chosen probe on the unseen half, and one fit from
    scratch at the chosen eps (the time reference)."""
    import torch

    from benchmarks.records import environment
    from benchmarks.suites.toy import DEFAULTS, load_toy_model, score, seed_data
    from captum_diffmask import calibrate_eps, DiffMask
    from captum_diffmask.evaluation.toy_task import toy_sites

    started = datetime.now(timezone.utc).isoformat(timespec="seconds")
    config = copy.deepcopy(DEFAULTS)
    train, valid = seed_data(config, 0)
    model, info = load_toy_model(config, 0, train, valid, verbose=False)
    half = len(valid) // 2
    calibration, unseen = valid.subset(torch.arange(half)), valid.subset(torch.arange(half, len(valid)))
    options = {"sites": toy_sites(model), "padding_mask_arg": 1}
    fit = {"layers": [1], "seed": seed, "verbose": False}
    start = time.perf_counter()
    result = calibrate_eps(model, train.loader(128, shuffle=True, seed=seed),
                           [(calibration.ids, calibration.query, calibration.mask)], mode="hidden",
                           agreement=agreement, ladder=LADDER, explainer_options=options, **fit)
    ladder_seconds = time.perf_counter() - start
    out: Dict[str, Any] = {"agreement": agreement, "ladder": list(LADDER), "seed": seed, "model": info,
                           "calibration": result.to_dict(), "ladder_seconds": ladder_seconds,
                           "chosen_on": {"eps": {"on": "train", "why": CHOSEN_ON}},
                           "environment": environment(), "started_utc": started}
    if result.eps is None:
        return out
    dm = result.explainer
    out["unseen"] = dm.evaluate([(unseen.ids, unseen.query, unseen.mask)])[1]
    keep = dm.attribute(unseen.ids, additional_forward_args=(unseen.query, unseen.mask), layer=1)
    out["unseen"]["js_to_ground_truth"] = score(keep, unseen)["js"]
    start = time.perf_counter()
    DiffMask(model, mode="hidden", **options).fit(train.loader(128, shuffle=True, seed=seed), eps=result.eps, **fit)
    out["one_fit_seconds"] = time.perf_counter() - start
    return out


def report(data: Dict[str, Any], command: str) -> str:
    r"""The markdown report."""
    calibration = data["calibration"]
    lines = ["# calibrate_eps on the toy task", "", f"Command: `{command}`. {SETUP}",
             "", f"Target: keep the model's prediction on at least {data['agreement']:.0%} of the held-out "
             f"examples. Ladder: {', '.join(f'{e:g}' for e in data['ladder'])} nats, walked from the middle "
             "(looser while the rungs meet the target, else tighter), each rung warm-started from the one before "
             "and given 10 of the criterion's windows to settle; the rows in the order walked.", "",
             "| eps | held-out agreement | KL (nats) | masked share | verdict | the rung's fit, s |",
             "|---|---|---|---|---|---|"]
    for row in calibration["frontier"]:
        lines.append(f"| {row['eps']:g} | {row['agreement']:.3f} | {row['kl']:.4f} | {row['masked']:.3f} | "
                     f"{row['verdict']} | {row['seconds']:.0f} |")
    lines += ["", _headline(data), "", f"Why: {calibration['reason']}. Every choice was made on {data['chosen_on']['eps']['why']}."]
    if "unseen" in data:
        unseen = data["unseen"]
        ratio = data["ladder_seconds"] / data["one_fit_seconds"]
        lines += ["", f"On the held-out half the calibration never read, the chosen probe keeps the prediction on "
                  f"{unseen['agreement']:.3f} of the examples (KL {unseen['kl']:.4f}, {1 - unseen['l0']:.3f} of the "
                  f"states masked), and its keep probabilities are at JS {unseen['js_to_ground_truth']:.4f} from "
                  "the ground truth (the query digits).", "",
                  f"Cost: the whole ladder took {data['ladder_seconds']:.0f} s, one fit from scratch at the chosen "
                  f"eps {data['one_fit_seconds']:.0f} s: **{ratio:.2f}x one fit** "
                  f"({data['environment']['threads']} torch threads, {data['environment']['cpu']})."]
    return "\n".join(lines) + "\n"


def _headline(data: Dict[str, Any]) -> str:
    r"""The report's bold sentence: the chosen eps, its agreement and the next rung's."""
    calibration = data["calibration"]
    if calibration["eps"] is None:
        return f"**No rung of the ladder keeps {data['agreement']:.0%} of the predictions**"
    rows = {row["eps"]: row["agreement"] for row in calibration["frontier"]}
    looser = [eps for eps in rows if eps > calibration["eps"]]
    after = (f", {rows[min(looser)]:.3f} at the next rung, eps {min(looser):g}" if looser else "")
    cost = (f"; the ladder took {data['ladder_seconds'] / data['one_fit_seconds']:.1f}x one fit"
            if data.get("one_fit_seconds") else "")
    return (f"**A target of {data['agreement']:.2f} picks eps {calibration['eps']:g}: held-out agreement "
            f"{rows[calibration['eps']]:.3f} there{after}{cost}**")


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--markdown", required=True, help="write the report here (its JSON beside it)")
    parser.add_argument("--agreement", type=float, default=0.95, help="the target share of predictions kept "
                        "(default: 0.95)")
    parser.add_argument("--seed", type=int, default=0, help="the fits' seed (default: 0)")
    args = parser.parse_args(argv)
    data = measure(args.agreement, args.seed)
    command = f"python -m benchmarks study eps-calibration --markdown {args.markdown}"
    out = Path(args.markdown)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(report(data, command), encoding="utf-8")
    out.with_suffix(".json").write_text(json.dumps(data, indent=1, default=str), encoding="utf-8")
    print(report(data, command))
    return 0
