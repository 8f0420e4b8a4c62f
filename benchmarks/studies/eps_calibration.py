r"""calibrate_eps on the toy task and on the SST MiniLM: the eps a target
agreement picks, the rungs it walks, the chosen masks checked on held-out data
the calibration did not see, and the ladder's time against one fit from
scratch at the chosen eps.

Commands::

    python -m benchmarks study eps-calibration --markdown docs/results/eps-calibration-toy.md
    python -m benchmarks study eps-calibration --task sst --markdown docs/results/eps-calibration-sst.md

``--task toy``: the toy suite's GRU of seed 0 (cached) and its data; hidden
mode at the FFNN output (layer 1). ``--task sst``: the sst suite's fine-tuned
MiniLM and its DiffMask settings but eps, one depth (``--layer``, default 3)
in ``--mode`` (default input), beside the suite's own frontier
(``docs/results/sst-eps-frontier.md``). What each calibration reads is in
:data:`SETUP`.
"""

from __future__ import annotations

import argparse
import copy
import json
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

from benchmarks.fit_presets import PAPER_L0

#: The question this study answers (``python -m benchmarks list``).
QUESTION = ("calibrate_eps on the toy task and the SST MiniLM: the eps an agreement target picks, its frontier, "
            "its cost against one fit")
#: Each task's ladder of eps values (nats).
LADDERS = {"toy": (0.01, 0.05, 0.2, 0.5, 1.0), "sst": (0.0025, 0.005, 0.01, 0.02, 0.04)}
#: What each task's run is, for the report.
SETUP = {
    "toy": ("The toy suite's GRU of seed 0 (cached) and its data; hidden mode at the FFNN output (layer 1), where "
            "the ground truth is the query digits. The held-out set is split in two: the calibration scores its "
            "rungs on the first half, and the chosen probe is scored again on the second."),
    "sst": ("The sst suite's fine-tuned MiniLM (cached) and its DiffMask settings but eps (batch 32, the L0 as "
            "the share kept, bfloat16 passes, at most 5 000 steps), one depth. The suite's 400 validation "
            "sentences and 1000 more are set aside from SST train, as the suite's frontier does "
            "(sst-eps-frontier.md): the fits read the other train sentences, the calibration scores its rungs on "
            "the 1000, and the chosen probe is scored again on the 400. No dev sentence is read."),
}
#: Where each task's rung is chosen: held-out data the fits never see, apart from what is then scored.
CHOSEN_ON = {"toy": "the first half of the toy held-out set (never fitted on)",
             "sst": "1000 SST train sentences the fits never see"}
#: The suite's frontier the SST calibration is compared with (JSON lines per mode).
SST_FRONTIER = "docs/results/sst-eps-frontier-{mode}-train.jsonl"

def measure(agreement: float, seed: int) -> Dict[str, Any]:
    r"""The toy calibration, the chosen probe on the unseen half, and one fit
    from scratch at the chosen eps (the time reference)."""
    import torch

    from benchmarks.suites.toy import DEFAULTS, load_toy_model, score, seed_data
    from captum_diffmask import calibrate_eps, DiffMask
    from captum_diffmask.evaluation.toy_task import toy_sites

    started = datetime.now(timezone.utc).isoformat(timespec="seconds")
    config = copy.deepcopy(DEFAULTS)
    train, valid = seed_data(config, 0)
    model, info = load_toy_model(config, 0, train, valid, verbose=False)
    half = len(valid) // 2
    calibration, unseen = valid.subset(torch.arange(half)), valid.subset(torch.arange(half, len(valid)))
    # the paper's L0, as the toy suite's
    options = {"sites": toy_sites(model), "padding_mask_arg": 1, **PAPER_L0}
    fit = {"layers": [1], "seed": seed, "verbose": False}
    start = time.perf_counter()
    result = calibrate_eps(model, train.loader(128, shuffle=True, seed=seed),
                           [(calibration.ids, calibration.query, calibration.mask)], mode="hidden",
                           agreement=agreement, ladder=LADDERS["toy"], explainer_options=options, **fit)
    out = _record("toy", agreement, seed, info, result, time.perf_counter() - start, started)
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


def measure_sst(agreement: float, seed: int, mode: str, layer: int, data_dir: Optional[str]) -> Dict[str, Any]:
    r"""The SST calibration at one depth, the chosen probe on the suite's 400
    validation sentences, and one fit from scratch at the chosen eps."""
    from benchmarks.common.minilm.fitting import fit_arguments, OnDevice
    from benchmarks.common.minilm.loading import load_model, validation_split
    from benchmarks.suites import sst
    from benchmarks.tasks import sst_bert
    from benchmarks.tasks.sst import read_sst
    from captum_diffmask import calibrate_eps, DiffMask
    from captum_diffmask.diffmask import grouped_options
    from captum_diffmask.model.forward import model_device

    started = datetime.now(timezone.utc).isoformat(timespec="seconds")
    config = copy.deepcopy(sst.DEFAULTS)
    train, dev = read_sst("train", data_dir), read_sst("dev", data_dir)
    model, tokenizer, info = load_model(config, train, dev, verbose=True)
    fit_sentences, valid = validation_split({**config["diffmask"], "validation_from": "train"}, train, dev)
    fit_sentences, scored = validation_split({"validation_sentences": 1000, "validation_from": "train"},
                                             fit_sentences, dev)
    encode = lambda sentences: sst_bert.encode_sst(sentences, tokenizer, 128)  # noqa: E731
    fitted, valid_enc, scored_enc = encode(fit_sentences), encode(valid), encode(scored)
    init, options, batch_size, _ = fit_arguments(config, mode)
    options.pop("eps", None)
    fit = {"layers": [layer], "seed": seed, "verbose": True, **grouped_options(options)}
    device = model_device(model)
    batches = lambda data, size, shuffle: OnDevice(  # noqa: E731
        data.loader(size, shuffle=shuffle, seed=None, sort_by_length=True), device)
    start = time.perf_counter()
    result = calibrate_eps(model, batches(fitted, batch_size, True), batches(scored_enc, 128, False), mode=mode,
                           agreement=agreement, ladder=LADDERS["sst"], explainer_options=init, **fit)
    out = _record("sst", agreement, seed, {k: v for k, v in info.items() if k != "history"}, result,
                  time.perf_counter() - start, started)
    out.update({"mode": mode, "layer": layer, "frontier_before": _suite_frontier(mode, layer)})
    if result.eps is None:
        return out
    out["unseen"] = result.explainer.evaluate(batches(valid_enc, 128, False))[layer]
    start = time.perf_counter()
    DiffMask(model, mode=mode, **init).fit(batches(fitted, batch_size, True), eps=result.eps, **fit)
    out["one_fit_seconds"] = time.perf_counter() - start
    return out


def _record(task: str, agreement: float, seed: int, model: Dict[str, Any], result: Any, seconds: float,
            started: str) -> Dict[str, Any]:
    r"""What every calibration's JSON holds."""
    from benchmarks.records import environment
    from captum_diffmask.diffmask.calibration import WARM_WINDOWS

    return {"task": task, "agreement": agreement, "ladder": list(LADDERS[task]), "seed": seed, "model": model,
            "calibration": result.to_dict(), "ladder_seconds": seconds, "warm_windows": WARM_WINDOWS,
            "chosen_on": {"eps": {"on": "train", "why": CHOSEN_ON[task]}},
            "environment": environment(), "started_utc": started}


def _suite_frontier(mode: str, layer: int) -> List[Dict[str, Any]]:
    r"""The sst suite's committed frontier at ``layer`` in ``mode``: per eps and
    seed the share of held-out predictions kept, the masked share and the verdict."""
    path = Path(__file__).resolve().parents[2] / SST_FRONTIER.format(mode=mode)
    rows = []
    for line in path.read_text(encoding="utf-8").splitlines() if path.is_file() else []:
        run = json.loads(line)
        for seed in run["seeds"]:
            for row in seed["per_layer"]:
                if row["layer"] == layer:
                    # the sweep's shares are in percent
                    rows.append({"eps": run["options"]["eps"], "seed": seed["seed"], "agreement": row["agreement"] / 100,
                                 "masked": row["masked"] / 100, "verdict": row["status"],
                                 "fit_seconds": seed["fit_seconds"]})
    return sorted(rows, key=lambda row: (row["eps"], row["seed"]))


#: Each task's title and what its unseen check is, for the report.
TITLES = {"toy": "calibrate_eps on the toy task", "sst": "calibrate_eps on the SST MiniLM"}
UNSEEN = {"toy": "the held-out half the calibration never read", "sst": "the suite's 400 validation sentences"}


def report(data: Dict[str, Any], command: str) -> str:
    r"""The markdown report."""
    task = data.get("task", "toy")
    calibration = data["calibration"]
    where = f" {data['mode'].capitalize()} mode, layer {data['layer']}." if task == "sst" else ""
    lines = [f"# {TITLES[task]}", "", f"Command: `{command}`. {SETUP[task]}{where}",
             "", f"Target: keep the model's prediction on at least {data['agreement']:.0%} of the held-out "
             f"examples. Ladder: {', '.join(f'{e:g}' for e in data['ladder'])} nats, walked from the middle "
             "(looser while the rungs meet the target, else tighter), each rung warm-started from the one before "
             f"and given {data.get('warm_windows', 10)} of the criterion's windows to settle; the rows in the order "
             "walked.", "",
             "| eps | held-out agreement | KL (nats) | masked share | verdict | the rung's fit, s |",
             "|---|---|---|---|---|---|"]
    for row in calibration["frontier"]:
        lines.append(f"| {row['eps']:g} | {row['agreement']:.3f} | {row['kl']:.4f} | {row['masked']:.3f} | "
                     f"{row['verdict']} | {row['seconds']:.0f} |")
    lines += ["", _headline(data), "", f"Why: {calibration['reason']}. Every choice was made on {data['chosen_on']['eps']['why']}."]
    if "unseen" in data:
        unseen = data["unseen"]
        truth = (f", and its keep probabilities are at JS {unseen['js_to_ground_truth']:.4f} from the ground truth "
                 "(the query digits)" if "js_to_ground_truth" in unseen else "")
        ratio = data["ladder_seconds"] / data["one_fit_seconds"]
        lines += ["", f"On {UNSEEN[task]}, the chosen probe keeps the prediction on {unseen['agreement']:.3f} of the "
                  f"examples (KL {unseen['kl']:.4f}, {1 - unseen['l0']:.3f} of the states masked){truth}.", "",
                  f"Cost: the whole ladder took {data['ladder_seconds']:.0f} s, one fit from scratch at the chosen "
                  f"eps {data['one_fit_seconds']:.0f} s: **{ratio:.2f}x one fit** "
                  f"({data['environment']['threads']} torch threads, {data['environment']['cpu']})."]
    return "\n".join(lines + _frontier_before(data)) + "\n"


def _frontier_before(data: Dict[str, Any]) -> List[str]:
    r"""The sst suite's own frontier at the same depth, beside the calibration's."""
    rows = data.get("frontier_before")
    if not rows:
        return []
    lines = ["", "## Beside the suite's frontier", "",
             f"The sst suite's frontier at the same depth (`{SST_FRONTIER.format(mode=data['mode'])}`, "
             "`sst-eps-frontier.md`): fits from scratch at each eps on the same sentences, on the model the suite "
             "had then (its fine-tuning kept the best dev epoch; this calibration's model keeps the last), scored "
             "on the same 1000 train sentences.", "",
             "| eps | seed | held-out agreement | masked share | verdict | its fit, s |", "|---|---|---|---|---|---|"]
    lines += [f"| {r['eps']:g} | {r['seed']} | {r['agreement']:.3f} | {r['masked']:.3f} | {r['verdict']} | "
              f"{r['fit_seconds']:.0f} |" for r in rows]
    return lines


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
    parser.add_argument("--task", choices=sorted(LADDERS), default="toy", help="the toy task or the SST MiniLM "
                        "(default: toy)")
    parser.add_argument("--agreement", type=float, default=0.95, help="the target share of predictions kept "
                        "(default: 0.95)")
    parser.add_argument("--seed", type=int, default=0, help="the fits' seed (default: 0)")
    parser.add_argument("--mode", choices=("input", "hidden"), default="input", help="sst: the mode (default: input)")
    parser.add_argument("--layer", type=int, default=3, help="sst: the depth calibrated (default: 3)")
    parser.add_argument("--data-dir", help="sst: the SST files (default: $CAPTUM_DIFFMASK_DATA, else ../shared/data)")
    args = parser.parse_args(argv)
    if args.task == "sst":
        data = measure_sst(args.agreement, args.seed, args.mode, args.layer, args.data_dir)
    else:
        data = measure(args.agreement, args.seed)
    task = "" if args.task == "toy" else f" --task {args.task}"
    command = f"python -m benchmarks study eps-calibration{task} --markdown {args.markdown}"
    out = Path(args.markdown)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(report(data, command), encoding="utf-8")
    out.with_suffix(".json").write_text(json.dumps(data, indent=1, default=str), encoding="utf-8")
    print(report(data, command))
    return 0
