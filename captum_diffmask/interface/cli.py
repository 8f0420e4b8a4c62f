"""The ``captum-diffmask`` command line: fit a DiffMask probe on a model and a
file of texts, explain texts with any method, compare methods.

::

    captum-diffmask fit MODEL EXAMPLES --out probe.pt [--mode input] [--eps 0.1] [--max-steps N] [--checkpoint STATE]
    captum-diffmask explain MODEL [TEXT ...] [--file F] [--method DiffMask --probe probe.pt] [--format html]
    captum-diffmask compare MODEL [TEXT ...] [--file F] --methods IntegratedGradients Occlusion [--format table]

``MODEL`` is a directory that ``from_pretrained`` reads (config, weights with
the head ``--head`` names, tokenizer) or an installed package that ships one (a
module with ``get_model_path()``); a checkpoint without the head's weights is
refused (:func:`load_model`). ``EXAMPLES`` and ``--file``
are a text file (one text per line) or JSON lines (a ``"text"`` field per line).
A bad argument, file or model ends with one line on stderr and exit code 2. Progress
bars show on a terminal; ``--quiet`` silences them. ``python -m benchmarks``
stays the command for the paper's experiments.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import os
import sys
import warnings
from typing import Any, Iterator, List, NoReturn, Optional, Sequence, Tuple

HEADS = {"classification": "AutoModelForSequenceClassification", "causal-lm": "AutoModelForCausalLM",
         "question-answering": "AutoModelForQuestionAnswering"}


class UsageError(Exception):
    r"""A bad argument or input file: reported as one line, exit code 2."""


def main(argv: Optional[Sequence[str]] = None) -> int:
    r"""Runs the command line; returns the exit code (0; 2 for a usage error, one
    line on stderr; 130 when interrupted)."""
    try:
        args = _parser().parse_args(argv)
    except SystemExit as done:  # --help, or a bad argument already reported
        return done.code if isinstance(done.code, int) else 2
    from transformers.utils import logging as transformers_logging

    from captum_diffmask.diffmask.fit.history import log_lines

    bars = transformers_logging.is_progress_bar_enabled()
    if args.quiet:
        transformers_logging.disable_progress_bar()
    try:
        with log_lines(not args.quiet and not sys.stderr.isatty(), timestamps=True), _warning_lines(args.command):
            return {"fit": _fit, "explain": _explain, "compare": _compare}[args.command](args)
    except (UsageError, ValueError, OSError) as error:
        # the library's refusals (ValueError) name the argument and the fix: the
        # message, not the traceback, is what a user of the command line needs
        message = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        print(f"captum-diffmask {args.command}: error: {message}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        resume = " (the same command resumes the fit from --checkpoint)" if getattr(args, "checkpoint", None) else ""
        print(f"captum-diffmask {args.command}: interrupted{resume}", file=sys.stderr)
        return 130
    finally:
        if bars:  # as it was: main() also runs inside other programs (and tests)
            transformers_logging.enable_progress_bar()



@contextlib.contextmanager
def _warning_lines(command: str) -> Iterator[None]:
    r"""Warnings inside the block as ``captum-diffmask VERB: warning: ...``
    (not Python's file and line, which point into this module); as before after."""
    def show(message: Any, category: type, *_: Any, **__: Any) -> None:
        print(f"captum-diffmask {command}: warning: {message}", file=sys.stderr)

    with warnings.catch_warnings():
        warnings.showwarning = show
        yield


#: The defaults of fit's options as the command line shows them (a test keeps
#: them equal to :class:`~captum_diffmask.diffmask.fit.options.FitOptions`'s and
#: to :func:`~captum_diffmask.model.texts.text_batches`').
FIT_DEFAULTS = {"eps": 0.1, "lr": 3e-3, "max_steps": None, "epochs": None, "seed": None, "batch_size": 16}
#: DiffMask's modes, as ``fit --mode`` takes them.
MODES = ("input", "hidden", "heads", "units")


class _DefaultsShown(argparse.ArgumentDefaultsHelpFormatter):
    r"""Every flag's default in its help, unless the help says it already, or
    the flag has none to show (a switch, a required flag)."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if "(default" in text or action.required or isinstance(action, argparse._StoreTrueAction) \
                or action.default in (None, [], argparse.SUPPRESS):
            return text
        return super()._get_help_string(action)


class _OneLineParser(argparse.ArgumentParser):
    r"""argparse, with a bad argument reported as the other errors are: one line
    (argparse's usage block above it would make it several), exit code 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def _parser() -> argparse.ArgumentParser:
    parser = _OneLineParser(prog="captum-diffmask", description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    formatter = _DefaultsShown
    fit = commands.add_parser("fit", help="fit a DiffMask probe and save it", formatter_class=formatter)
    _model_arguments(fit)
    fit.add_argument("examples", help="a text file (one text per line) or JSON lines with a 'text' field")
    fit.add_argument("--out", required=True, help="where the probe goes: a file for a name ending in .pt "
                     "(DiffMask.save), else a directory of safetensors, JSON and a model card "
                     "(DiffMask.save_pretrained); its folder must exist")
    fit.add_argument("--mode", choices=MODES, default="input",
                     help="what is gated: input tokens, hidden states, attention heads or MLP units")
    fit.add_argument("--eps", type=float, default=FIT_DEFAULTS["eps"],
                     help="the KL (nats) the masked output may differ from the original by")
    fit.add_argument("--layers", type=int, nargs="+", default=None, metavar="K",
                     help="the layers to fit (default: every layer)")
    fit.add_argument("--max-steps", type=int, default=FIT_DEFAULTS["max_steps"],
                     help="the most optimiser steps (default: none: the fit runs until every layer has its "
                          "verdict, within the convergence criterion's budget of 4000 steps a layer)")
    fit.add_argument("--epochs", type=int, default=FIT_DEFAULTS["epochs"],
                     help="the most passes over EXAMPLES (default: as many as the steps need)")
    fit.add_argument("--lr", type=float, default=FIT_DEFAULTS["lr"], help="the gate networks' learning rate")
    fit.add_argument("--seed", type=int, default=FIT_DEFAULTS["seed"],
                     help="seeds the probe's start and the gate noise (default: unseeded)")
    fit.add_argument("--batch-size", type=int, default=FIT_DEFAULTS["batch_size"], help="texts per batch")
    fit.add_argument("--checkpoint", help="write the fit's state here as it goes; a state there is resumed "
                                          "(a killed fit), or gone on with when --max-steps is larger "
                                          "(default: none written)")
    fit.add_argument("--option", action="append", default=[], metavar="NAME=JSON", dest="options",
                     help="any other option of DiffMask.fit, e.g. 'compute={\"precision\": \"bfloat16\"}' or "
                          "'convergence={\"window\": 50}'; repeatable")
    for name, help_text in (("explain", "scores of texts, per word"), ("compare", "methods side by side")):
        command = commands.add_parser(name, help=help_text, formatter_class=formatter)
        _model_arguments(command)
        command.add_argument("texts", nargs="*", help="texts to explain (or --file)")
        command.add_argument("--file", help="a text file or JSON lines of texts (default: the texts given)")
        command.add_argument("--probe", help="a probe written by 'fit', its file or directory (DiffMask; "
                             "default: none)")
        command.add_argument("--layer", default="0", help="the layer to attribute at, or 'all' (DiffMask)")
        command.add_argument("--out", help="write the result here (default: stdout)")
        command.add_argument("--no-check-weights", dest="check_weights", action="store_false",
                             help="use a probe fitted on other weights of the same architecture (DiffMask.load's "
                                  "check_weights=False), e.g. after fine-tuning further")
    from captum_diffmask.methods.registry import registered_methods

    names = ", ".join(registered_methods())
    commands.choices["explain"].add_argument("--method", default="DiffMask",
                                             help=f"the method, by its registered name: {names} "
                                                  "(DiffMask needs --probe)")
    commands.choices["explain"].add_argument("--format", choices=("terminal", "html", "json"), default="terminal",
                                             help="words with their scores on the terminal, an HTML page, or JSON")
    commands.choices["compare"].add_argument("--methods", nargs="+", required=True, metavar="NAME",
                                             help=f"the methods, by their registered names: {names} "
                                                  "(DiffMask needs --probe)")
    commands.choices["compare"].add_argument("--format", choices=("table", "html", "json"), default="table",
                                             help="a table of scores, times and metrics; an HTML page; or JSON")
    commands.choices["compare"].add_argument("--metrics", nargs="+", default=[],
                                             choices=("comprehensiveness", "sufficiency"),
                                             help="ERASER's faithfulness scores per method (AOPC)")
    return parser


def _model_arguments(command: argparse.ArgumentParser) -> None:
    command.add_argument("model", help="a model directory, or a package that ships one (get_model_path())")
    command.add_argument("--head", choices=tuple(HEADS), default="classification",
                         help="the head the model is loaded with")
    command.add_argument("--max-length", type=_positive, default=None, metavar="N",
                         help="truncate texts to N tokens (default: 128, or the model's positions if fewer)")
    command.add_argument("--quiet", action="store_true", help="no progress bars or log lines")


def _positive(value: str) -> int:
    if not value.isdigit() or int(value) < 1:
        raise argparse.ArgumentTypeError(f"must be a whole number >= 1, got {value!r}")
    return int(value)


def load_model(name: str, head: str = "classification") -> Tuple[Any, Any]:
    r"""
    The model (eval mode) and its tokenizer from a directory or a package. A model
    whose checkpoint lacks weights of the head (or of any part) is refused:
    transformers would draw them at random at every load, so a probe fitted on one
    load would not fit the next, and scores would explain a random draw.

    Args:

        name (str): a directory that ``from_pretrained`` reads, or an importable
                    module with ``get_model_path()``.
        head (str, optional): a key of :data:`HEADS`. Default: "classification"

    Returns:
        *tuple* ``(model, tokenizer)``.

    Raises:
        UsageError: naming what is missing.
    """
    import transformers
    from transformers.utils import logging as transformers_logging

    path = name if os.path.isdir(name) else _package_model_path(name)
    verbosity = transformers_logging.get_verbosity()
    transformers_logging.set_verbosity_error()  # its table of missing weights: the refusal below says it
    try:
        tokenizer = transformers.AutoTokenizer.from_pretrained(path)
        model, info = getattr(transformers, HEADS[head]).from_pretrained(path, output_loading_info=True)
    except (OSError, ValueError) as error:
        raise UsageError(f"MODEL {name!r}: cannot load a {head} model and tokenizer from {path}: "
                         f"{str(error).splitlines()[0]}") from error
    finally:
        transformers_logging.set_verbosity(verbosity)
    drawn = _drawn_at_random(info)
    if drawn:
        shown = ", ".join(drawn[:4]) + (f" and {len(drawn) - 4} more" if len(drawn) > 4 else "")
        raise UsageError(f"MODEL {name!r} has no trained {head} head: its checkpoint lacks {shown}, which "
                         "transformers draws at random at every load; fine-tune the model with this head, "
                         "save_pretrained it, and pass that directory (or pick --head to match the checkpoint)")
    return model.eval(), tokenizer


def _drawn_at_random(info: dict) -> List[str]:
    r"""The weights ``from_pretrained``'s loading info says it initialised: missing
    from the checkpoint, or there with another shape (named first in a tuple)."""
    mismatched = [k[0] if isinstance(k, (tuple, list)) else k for k in info.get("mismatched_keys", [])]
    return sorted(info.get("missing_keys", [])) + sorted(str(k) for k in mismatched)


def _max_length(args: argparse.Namespace, model: Any) -> int:
    r"""``--max-length``, or its default, against the model's positions."""
    from captum_diffmask.model.inputs import position_limit

    limit = position_limit(model)
    if args.max_length is None:
        return 128 if limit is None else min(128, limit)
    if limit is not None and args.max_length > limit:
        raise UsageError(f"--max-length {args.max_length}: the model has {limit} positions; pass at most {limit}")
    return args.max_length


def _check_folder(path: Optional[str], flag: str) -> None:
    r"""Before any work: ``path``'s folder exists (a fit is not lost at its end)."""
    if path is not None and not os.path.isdir(os.path.dirname(os.path.abspath(path))):
        raise UsageError(f"{flag} {path}: the folder {os.path.dirname(os.path.abspath(path))} does not exist")


def _package_model_path(name: str) -> str:
    try:
        module = importlib.import_module(name.replace("-", "_"))
    except ImportError:
        raise UsageError(f"MODEL {name!r} is neither a directory nor an installed package") from None
    if not callable(getattr(module, "get_model_path", None)):
        raise UsageError(f"MODEL {name!r}: the package has no get_model_path() to find its model")
    return str(module.get_model_path())


def read_texts(path: str) -> List[str]:
    r"""The texts of a file (:func:`captum_diffmask.model.texts.read_texts`); a bad file
    is a :class:`UsageError`."""
    from captum_diffmask.model.texts import read_texts as read

    try:
        return read(path)
    except ValueError as error:
        raise UsageError(str(error)) from None


def _texts(args: argparse.Namespace) -> List[str]:
    from captum_diffmask.model.texts import as_texts

    texts = list(args.texts) + (read_texts(args.file) if args.file else [])
    if not texts:
        raise UsageError("give texts as arguments or --file")
    try:
        return as_texts(texts, "TEXT")  # before any model loads: no text of no words
    except ValueError as error:
        raise UsageError(str(error)) from None


def _layer(value: str) -> Optional[int]:
    if value == "all":
        return None
    if not value.isdigit():
        raise UsageError(f"--layer must be a number >= 0 or 'all', got {value!r}")
    return int(value)


def _fit(args: argparse.Namespace) -> int:
    from captum_diffmask.diffmask.constrained.convergence import SETTLED
    from captum_diffmask.diffmask.explainer import DiffMask
    from captum_diffmask.diffmask.fit.options import fit_options
    from captum_diffmask.model.texts import text_batches

    if args.batch_size < 1 or (args.max_steps is not None and args.max_steps < 1) or not args.eps > 0:
        raise UsageError("--batch-size and --max-steps must be >= 1 and --eps > 0")
    options = {"eps": args.eps, "layers": args.layers, "max_steps": args.max_steps, "epochs": args.epochs,
               "lr": args.lr, "seed": args.seed, "verbose": not args.quiet, **_options(args.options)}
    if args.checkpoint is not None:
        options["checkpoint"] = args.checkpoint
    try:
        fit_options(None, options)  # every name known, before any model loads
    except TypeError as error:
        raise UsageError(str(error)) from None
    _check_folder(args.out, "--out")
    _check_folder(args.checkpoint, "--checkpoint")
    texts = read_texts(args.examples)
    model, tokenizer = load_model(args.model, args.head)
    explainer = DiffMask(model, mode=args.mode)
    explainer.fit(text_batches(texts, tokenizer, args.batch_size, _max_length(args, model), by_length=True), **options)
    if args.out.endswith(".pt"):
        explainer.save(args.out)
    else:
        explainer.save_pretrained(args.out)
    statuses = [report["status"] for report in explainer.convergence.values()]
    settled = sum(status in SETTLED for status in statuses)
    print(f"fitted on {len(texts)} texts ({args.mode} mode, eps {args.eps}); {settled} of {len(statuses)} layers "
          f"settled ({statuses.count('converged')} converged, {statuses.count('needed')} needed: every gate kept "
          f"because the output needs it); probe written to {args.out}")
    return 0


def _options(settings: Sequence[str]) -> dict:
    r"""``--option NAME=JSON`` settings as a dict of fit options."""
    options = {}
    for setting in settings:
        name, sep, text = setting.partition("=")
        if not sep or not name.strip():
            raise UsageError(f"--option takes NAME=JSON, got {setting!r}")
        try:
            options[name.strip()] = json.loads(text)
        except json.JSONDecodeError as error:
            raise UsageError(f"--option {name}: the value is not JSON ({error}); quote strings, e.g. '\"adam\"'")
    return options


def _method(args: argparse.Namespace, name: str, model: Any, layer: Optional[int]) -> Tuple[Any, dict]:
    r"""The explainer and its attribute options: DiffMask from ``--probe``,
    any other method by name."""
    from captum_diffmask.diffmask.explainer import DiffMask
    from captum_diffmask.methods.preparation import prepare_method

    if name == "DiffMask":
        load = DiffMask.from_pretrained if os.path.isdir(args.probe) else DiffMask.load
        try:
            return load(args.probe, model, check_weights=args.check_weights), {}
        except ValueError as error:  # named as the command line names them
            text = str(error).replace("check_weights=False", "--no-check-weights")
            raise UsageError(text.replace("path: ", "--probe ", 1).replace("directory: ", "--probe ", 1)) from None
    prepared = prepare_method(name, model, layer=layer, verbose=not args.quiet)
    return prepared.explainer, prepared.attribute_kwargs


def _check_methods(args: argparse.Namespace, names: Sequence[str]) -> None:
    r"""Before any model loads: each name is a method, and DiffMask has its probe."""
    from captum_diffmask.methods.registry import method_class

    for name in names:
        try:
            method_class(name)
        except ValueError as error:
            raise UsageError(str(error).replace("methods: ", "", 1)) from None
    if "DiffMask" in names:
        if not args.probe:
            raise UsageError("DiffMask needs --probe, a file or directory written by 'captum-diffmask fit'")
        if not os.path.exists(args.probe):
            raise UsageError(f"--probe {args.probe}: no such file or directory")


def _explain(args: argparse.Namespace) -> int:
    from captum_diffmask.interface.explanation import explain

    texts, layer = _texts(args), _layer(args.layer)
    _check_methods(args, [args.method])
    _check_folder(args.out, "--out")
    model, tokenizer = load_model(args.model, args.head)
    method, options = _method(args, args.method, model, layer)
    result = explain(method, texts, tokenizer, layer=layer, max_length=_max_length(args, model), **options)
    if args.format == "terminal":
        _write(args.out, str(result))
    else:
        _write(args.out, result.to_html() if args.format == "html" else json.dumps(result.to_dict(), indent=1))
    return 0


def _compare(args: argparse.Namespace) -> int:
    from captum_diffmask.interface.side_by_side import compare

    texts, layer = _texts(args), _layer(args.layer)
    _check_methods(args, args.methods)
    _check_folder(args.out, "--out")
    model, tokenizer = load_model(args.model, args.head)
    methods = [_method(args, "DiffMask", model, layer)[0] if name == "DiffMask" else name for name in args.methods]
    batch = tokenizer(texts, padding=True, truncation=True, max_length=_max_length(args, model), return_tensors="pt")
    result = compare(model, batch, methods, layer=layer, tokenizer=tokenizer, verbose=not args.quiet,
                     metrics=args.metrics)
    output = {"table": result.table, "html": result.to_html, "json": lambda: json.dumps(result.to_dict())}
    _write(args.out, output[args.format]())
    return 0


def _write(path: Optional[str], text: str) -> None:
    if path is None:
        print(text)
        return
    with open(path, "w", encoding="utf-8") as handle:
        handle.write(text)
    print(f"written to {path}")


def run() -> None:
    r"""The console script's entry point."""
    sys.exit(main())


if __name__ == "__main__":
    run()
