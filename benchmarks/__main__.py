"""``python -m benchmarks list``, ``python -m benchmarks run SUITE --out DIR``,
``python -m benchmarks study NAME [ARGS]`` and ``python -m benchmarks report
DIR/results.json``."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any, Dict, List, Optional


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks",
        description="captum_diffmask benchmarks: every attribution method scored side by side.",
    )
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("list", help="the suites, and which methods are available now")
    run = commands.add_parser("run", help="run a suite and write DIR/results.json, DIR/report.md, DIR/figures/")
    run.add_argument("suite", help="the suite to run (see `list`)")
    run.add_argument("--out", required=True, help="output directory (created)")
    run.add_argument("--quick", action="store_true", help="the quick configuration (minutes, one seed)")
    run.add_argument("--seeds", type=int, default=None, help="run seeds 0..N-1 (default: the suite's)")
    run.add_argument("--methods", nargs="+", default=None, metavar="NAME",
                     help="only these methods (names as in `list`; default: the suite's)")
    run.add_argument("--threads", type=int, default=None,
                     help="torch threads during the run (default: the suite's, 1 for toy)")
    run.add_argument("--no-cache", action="store_true", help="retrain models instead of reusing cached ones")
    run.add_argument("--stem", default=None,
                     help="write DIR/STEM.json and DIR/STEM.md instead of results.json and report.md")
    run.add_argument("--quiet", action="store_true", help="no progress bars or log lines")
    run.add_argument("--set", action="append", default=[], metavar="KEY=JSON", dest="settings",
                     help="change one setting of the suite's configuration (dicts merge), e.g. "
                          "--set 'fit={\"optimizer\": \"rmsprop\"}' or --set data_seeds=[101,102]; repeatable")
    run.add_argument("--split", choices=("dev", "test", "train"), default=None,
                     help="the evaluated SST split (sst suites; default dev; train, sst-erasure only: "
                          "to choose methods' settings without looking at dev)")
    run.add_argument("--data-dir", default=None, metavar="D",
                     help="directory holding sst/ (sst suites; default $CAPTUM_DIFFMASK_DATA, else ../shared/data)")
    study = commands.add_parser("study", help="run a study (see `list`): one question beside the suites",
                                add_help=False)
    study.add_argument("name", help="the study (see `list`)")
    study.add_argument("args", nargs=argparse.REMAINDER, help="the study's own arguments (NAME --help for them)")
    report = commands.add_parser("report", help="write the report of a finished run again from its JSON")
    report.add_argument("json", help="DIR/results.json (or DIR/STEM.json) of a finished run")
    return parser


def _list() -> None:
    from benchmarks.methods import methods_listed
    from benchmarks.runner import load_suite, SUITES

    print("suites:")
    for name in SUITES:
        try:
            description = load_suite(name).DESCRIPTION
        except Exception as error:  # noqa: BLE001 - one broken suite must not hide the others
            description = f"(cannot be loaded: {type(error).__name__}: {error})"
        print(f"  {name:<12} {description}")
    from .studies import registered_studies

    print("studies (python -m benchmarks study NAME --help):")
    for name, question in registered_studies().items():
        print(f"  {name:<24} {question}")
    print("methods (captum_diffmask.methods.registered_methods()):")
    for name, summary in methods_listed().items():
        print(f"  {name:<20} {summary}")


def _study(name: str, args: List[str]) -> int:
    r"""Runs the study ``name`` with its own arguments; its exit code (0 when
    its ``main`` returns nothing or a result)."""
    from .studies import load_study

    try:
        study = load_study(name)
    except ValueError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    code = study.main(list(args))
    return code if isinstance(code, int) else 0


def parse_settings(settings: List[str]) -> Dict[str, Any]:
    r"""``["KEY=JSON", ...]`` as one overrides dict (later settings merge into
    earlier ones, dicts recursively)."""
    from benchmarks.runner import merge

    overrides: Dict[str, Any] = {}
    for setting in settings:
        key, sep, text = setting.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"--set takes KEY=JSON, got {setting!r}")
        try:
            value = json.loads(text)
        except json.JSONDecodeError as error:
            raise ValueError(f"--set {key}: the value is not JSON ({error}); quote strings, e.g. '\"rmsprop\"'")
        overrides = merge(overrides, {key.strip(): value})
    return overrides


def main(argv: Optional[List[str]] = None) -> int:
    args = _parser().parse_args(argv)
    if args.command == "list":
        _list()
        return 0
    if args.command == "study":
        return _study(args.name, args.args)
    from benchmarks.runner import limit_onednn_cache, rewrite_report, run_suite
    from captum_diffmask.diffmask.fit.history import log_lines

    limit_onednn_cache()
    if args.command == "report":
        try:
            print(rewrite_report(args.json))
        except ValueError as error:
            print(f"error: {error}", file=sys.stderr)
            return 2
        return 0

    try:
        overrides = parse_settings(args.settings)
    except ValueError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    if args.threads is not None:
        if args.threads < 1:
            print("error: --threads must be >= 1", file=sys.stderr)
            return 2
        overrides["threads"] = args.threads
    if args.no_cache:
        overrides["cache"] = False
    if args.split is not None:
        overrides["split"] = args.split
    if args.data_dir is not None:
        overrides["data_dir"] = args.data_dir
    # off a terminal (a run's log) a long fit shows where it is by its line per layer and epoch
    try:
        with log_lines(not args.quiet and not sys.stderr.isatty(), timestamps=True):
            run_suite(args.suite, args.out, quick=args.quick, seeds=args.seeds, methods=args.methods,
                      overrides=overrides or None, verbose=not args.quiet, stem=args.stem)
    except ValueError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
