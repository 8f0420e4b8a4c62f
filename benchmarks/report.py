"""The report writer: ``report.md`` from a suite's results.

It reads these keys of the results (all but ``methods`` optional):

- ``suite``, ``title``, ``description``, ``mode``, ``wall_seconds``, ``started_utc``;
- ``metrics``: ``[{"key", "label"}]``, the score columns; for each key the method
  records hold ``KEY``, ``KEY_std`` (over seeds) and ``KEY_std_examples``;
- ``methods``: ``{NAME: {...scores, "seconds_per_example", "ratio_to_forward",
  "setup_seconds", "status", "error", "per_seed"}}``;
- ``paper``: ``{NAME: {KEY: number}}`` and ``paper_source``; ``reference_label``
  names that column (default ``"paper"``);
- ``extra_sections``: markdown lines of a suite's own, after the scores and speed;
- ``speed``: ``{"batch_size", "forward_seconds", "forward_seconds_per_example", "threads"}``;
- ``checks``: ``[{"target", "value", "met"}]``;
- ``figures``: ``[{"file", "caption"}]``, paths relative to the report;
- ``notes``: markdown lines; ``config``; ``environment``.
"""

from __future__ import annotations

import json
import math
import os
import shlex
from typing import Any, Callable, List, Mapping, Optional, Sequence, Union

from benchmarks.records import to_jsonable


def fmt(value: Any, digits: int = 3) -> str:
    r"""A number for a table: ``inf``, ``n/a`` for NaN/None, else ``digits`` decimals."""
    if value is None:
        return "n/a"
    if isinstance(value, str):
        return value
    if isinstance(value, bool):
        return str(value)
    if isinstance(value, int):
        return str(value)
    value = float(value)
    if math.isnan(value):
        return "n/a"
    if math.isinf(value):
        return "inf" if value > 0 else "-inf"
    return f"{value:.{digits}f}"


def fmt_seconds(value: Any) -> str:
    r"""Seconds with a unit that keeps 3 significant digits (µs, ms, s)."""
    if value is None or (isinstance(value, float) and (math.isnan(value) or math.isinf(value))):
        return fmt(value)
    value = float(value)
    if value < 1e-3:
        return f"{value * 1e6:.3g} µs"
    if value < 1.0:
        return f"{value * 1e3:.3g} ms"
    return f"{value:.3g} s"


def fmt_ratio(value: Any) -> str:
    if value is None or (isinstance(value, float) and (math.isnan(value) or math.isinf(value))):
        return fmt(value)
    value = float(value)
    return f"{value:.2f}x" if value < 10 else f"{value:,.0f}x"


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    r"""A GitHub markdown table."""
    def cell(value: Any) -> str:
        return str(value).replace("|", "\\|").replace("\n", " ")

    lines = ["| " + " | ".join(cell(h) for h in headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    for row in rows:
        lines.append("| " + " | ".join(cell(c) for c in row) + " |")
    return "\n".join(lines)


def _mean_std(record: Mapping[str, Any], key: str) -> str:
    mean = record.get(key)
    std = record.get(f"{key}_std")
    if mean is None or fmt(mean) in ("n/a", "inf"):
        return fmt(mean)
    seeds = record.get("seeds_ok", 1)
    return f"{fmt(mean)} ± {fmt(std)}" if seeds and seeds > 1 else fmt(mean)


def scores_section(results: Mapping[str, Any]) -> List[str]:
    metrics = results.get("metrics") or []
    methods = results.get("methods", {})
    paper = results.get("paper", {})
    reference = results.get("reference_label", "paper")
    seeds = len(results.get("config", {}).get("seeds", [])) or 1
    lines = ["## Scores", ""]
    if not metrics:
        return []
    headers = ["method"]
    for metric in metrics:
        label = metric.get("label", metric["key"])
        headers += [f"{label}, ours" + (f" (mean ± std over {seeds} seeds)" if seeds > 1 else ""),
                    f"{label}, {reference}", f"{metric['key'].upper()} std over examples"]
    rows = []
    for name, record in methods.items():
        row: List[Any] = [f"`{name}`"]
        for metric in metrics:
            key = metric["key"]
            if record.get("status") != "ok":
                row += [record.get("status", "failed"), fmt(paper.get(name, {}).get(key)), ""]
                continue
            row += [_mean_std(record, key), fmt(paper.get(name, {}).get(key), 2), fmt(record.get(f"{key}_std_examples"))]
        rows.append(row)
    lines.append(table(headers, rows))
    lines.append("")
    lines.append(
        "Lower is better. Per seed, each number is the mean over held-out examples with a non-empty ground "
        "truth; the table gives the mean of those per-seed means and, with several seeds, their std across "
        "seeds; the last column of each metric is the std over examples (averaged over seeds), the spread the "
        "paper's notebook printed."
    )
    if results.get("paper_source"):
        lines += ["", f"{reference[0].upper()}{reference[1:]} numbers: {results['paper_source']}"]
    return lines + [""]


def speed_section(results: Mapping[str, Any]) -> List[str]:
    speed = results.get("speed") or {}
    methods = results.get("methods", {})
    if not speed:
        return []
    lines = ["## Speed", ""]
    lines.append(
        f"One plain forward pass of the model on the same batch of {speed.get('batch_size')} held-out examples "
        f"takes {fmt_seconds(speed.get('forward_seconds'))} ({fmt_seconds(speed.get('forward_seconds_per_example'))} "
        f"per example; median of {speed.get('forward_calls', '?')} calls, torch threads: {speed.get('threads', '?')}). "
        "Every method attributes that same batch (median of up to a few calls within a time budget); "
        "setup is paid once per model (DiffMask's fit on the training set, the bottleneck's statistics)."
    )
    lines.append("")
    reference = methods.get("DiffMask", {}).get("seconds_per_example")
    rows = []
    for name, record in methods.items():
        if record.get("status") != "ok":
            rows.append([f"`{name}`", record.get("status", "failed"), "", "", ""])
            continue
        per_example = record.get("seconds_per_example")
        relative = (per_example / reference) if (reference and per_example is not None and reference > 0) else math.nan
        rows.append([
            f"`{name}`",
            fmt_seconds(record.get("setup_seconds")),
            fmt_seconds(per_example),
            fmt_ratio(record.get("ratio_to_forward")),
            fmt_ratio(relative),
        ])
    lines.append(table(["method", "setup (once)", "seconds per example", "x one forward pass", "x DiffMask"], rows))
    return lines + [""]


def checks_section(results: Mapping[str, Any]) -> List[str]:
    checks = results.get("checks") or []
    if not checks:
        return []
    rows = [[c["target"], c.get("value", ""), "yes" if c.get("met") else "**no**"] for c in checks]
    return ["## Targets", "", table(["target", "this run", "met"], rows), ""]


def failures_section(results: Mapping[str, Any]) -> List[str]:
    failed = [(n, r) for n, r in results.get("methods", {}).items() if r.get("error")]
    if not failed:
        return []
    lines = ["## Methods that failed or are not available", ""]
    for name, record in failed:
        lines.append(f"- `{name}` ({record.get('status', 'failed')}): {record['error']}")
    lines.append("")
    lines.append("Tracebacks are in the per-seed records of the results JSON.")
    return lines + [""]


def figures_section(results: Mapping[str, Any]) -> List[str]:
    figures = results.get("figures") or []
    if not figures:
        return []
    lines = ["## Figures", ""]
    for figure in figures:
        lines += [f"![{os.path.basename(figure['file'])}]({figure['file']})", "", figure.get("caption", ""), ""]
    return lines


def per_seed_section(results: Mapping[str, Any]) -> List[str]:
    metrics = results.get("metrics") or []
    rows = []
    for name, record in results.get("methods", {}).items():
        for seed_record in record.get("per_seed", []):
            if "error" in seed_record:
                rows.append([f"`{name}`", seed_record.get("seed")] + ["failed"] * len(metrics) + ["", ""])
                continue
            rows.append(
                [f"`{name}`", seed_record.get("seed")]
                + [fmt(seed_record.get(m["key"]), 4) for m in metrics]
                + [fmt_seconds(seed_record.get("setup_seconds")), fmt_seconds(seed_record.get("attribute_seconds"))]
            )
    if not rows:
        return []
    headers = ["method", "seed"] + [m.get("label", m["key"]) for m in metrics] + ["setup", "attribute all held-out"]
    return ["## Per seed", "", table(headers, rows), ""]


def run_line(results: Mapping[str, Any], suite: Any, run: str, wall_seconds: Any) -> str:
    r"""
    The line under a report's title: the suite, how it ran, its wall time, the
    machine, when it started and the commit.

    Args:

        results (Mapping): a suite's results with the runner's keys.
        suite (Any): the suite's name, as the line shows it.
        run (str): what follows the mode, e.g. ``"run, seeds [0, 1]"``.
        wall_seconds (Any): the time the line gives.

    Returns:
        *str*: one markdown line.
    """
    env = results.get("environment", {})
    return (
        f"Suite `{suite}`, **{results.get('mode', '?')}** {run}, "
        f"{fmt(wall_seconds, 1)} s wall time, torch threads: {env.get('threads', '?')} "
        f"({env.get('cpu', '?')}), started {results.get('started_utc', '?')}"
        + (f", commit `{env['git_commit']}`" if env.get("git_commit") else "")
        + ". Every number below was produced by this run."
    )


def notes_section(notes: Sequence[str]) -> List[str]:
    r"""A bullet per note under ``## Notes``; nothing without notes."""
    if not notes:
        return []
    return ["## Notes", ""] + [f"- {n}" for n in notes] + [""]


#: What a choice's ``on`` means, for the reports.
CHOSEN_ON_KINDS = {
    "train": "training data the fits and the scores do not use (held-out train sentences or examples)",
    "development": "other tasks or data sets than the scored ones",
    "rule": "a rule fixed in advance, nothing measured",
}


def chosen_on_section(results: Mapping[str, Any]) -> List[str]:
    r"""``## What each choice was made on``: a row per entry of the run's
    ``chosen_on`` (``{choice: {"on", "why"}}``); nothing when it has none."""
    chosen = results.get("chosen_on") or {}
    if not chosen:
        return []
    kinds = "; ".join(f"`{kind}`: {text}" for kind, text in CHOSEN_ON_KINDS.items())
    rows = [[choice, f"`{entry.get('on')}`", entry.get("why", "")] for choice, entry in chosen.items()]
    return ["## What each choice was made on", "",
            f"No choice below was made on what this report scores. {kinds[0].upper()}{kinds[1:]}.", "",
            table(["choice", "made on", "how"], rows), ""]


def configuration_section(config: Mapping[str, Any]) -> List[str]:
    r"""The run's configuration as a JSON block."""
    return ["## Configuration", "", "```json", json.dumps(to_jsonable(config), indent=2), "```", ""]


def environment_section(env: Mapping[str, Any]) -> List[str]:
    r"""The run's environment (versions, threads, CPU) as a table."""
    rows = [[k, f"`{v}`" if v is not None else "n/a"] for k, v in env.items()]
    return ["## Environment", "", table(["", ""], rows), ""]


def reproduce_command(results: Mapping[str, Any], out: str = "DIR") -> str:
    r"""The command line that reruns this configuration (the runner records it)."""
    if results.get("command"):
        return str(results["command"])
    config = results.get("config", {})
    parts = ["python -m benchmarks run", str(results.get("suite", "SUITE")), "--out", out]
    if config.get("quick"):
        parts.append("--quick")
    return " ".join(parts)


def study_name(module: str) -> str:
    r"""A study's name for ``python -m benchmarks study NAME``: its module's, with
    dashes (``benchmarks.studies.sst_sweep`` -> ``sst-sweep``)."""
    return module.rpartition(".")[2].replace("_", "-")


def write_study_markdown(path: Optional[str], module: str, arguments: Sequence[str],
                         render: Callable[[str], str]) -> None:
    r"""
    A study's report, when ``path`` is given: ``render`` called with the
    command that reproduces it (``python -m benchmarks study NAME ARGUMENTS``,
    quoted for a shell).

    Args:

        path (str, optional): where the markdown goes; None writes nothing.
        module (str): the study's module, e.g. ``benchmarks.studies.components_dev``.
        arguments (sequence of str): the command line's arguments as given.
        render (callable): command -> the report's markdown.
    """
    if path:
        command = f"python -m benchmarks study {study_name(module)} " + shlex.join(arguments)
        with open(path, "w", encoding="utf-8") as out:
            out.write(render(command))


def write_report(results: Mapping[str, Any], path: Union[str, "os.PathLike[str]"], json_name: str = "results.json") -> str:
    r"""
    Writes the markdown report of ``results`` to ``path``.

    Args:

        results (Mapping): a suite's results with the runner's keys.
        path (str or PathLike): the report file.
        json_name (str, optional): the results file beside it, for references.
                    Default: ``"results.json"``

    Returns:
        *str*: the markdown.
    """
    env = results.get("environment", {})
    config = results.get("config", {})
    lines: List[str] = [f"# {results.get('title', results.get('suite', 'benchmark'))}", ""]
    lines.append(run_line(results, results.get("suite"), f"run, seeds {config.get('seeds')}", results.get("wall_seconds")))
    if results.get("description"):
        lines += ["", f"{results['description'][0].upper()}{results['description'][1:]}."]
    lines.append("")
    for section in (scores_section, speed_section):
        lines += section(results)
    # a suite's own sections (markdown lines), between the scores and the targets
    lines += list(results.get("extra_sections") or [])
    for section in (checks_section, failures_section, figures_section):
        lines += section(results)
    lines += notes_section(results.get("notes") or [])
    lines += chosen_on_section(results)
    lines += per_seed_section(results)
    lines += configuration_section(config)
    lines += environment_section(env)
    lines += [
        "## Reproduce", "",
        "```bash", reproduce_command(results), "```", "",
        f"All numbers are also in `{json_name}` ({results.get('json_conventions', 'strict JSON')}). "
        "Trained toy models are cached in `~/.cache/captum_diffmask` (or `$CAPTUM_DIFFMASK_CACHE`) "
        "and reused while the configuration is unchanged.",
        "",
    ]
    text = "\n".join(lines)
    with open(path, "w", encoding="utf-8") as handle:
        handle.write(text)
    return text
