"""The scaling report, ``docs/results/scaling.md``: DiffMask's fit throughput with
one and two ``gloo`` processes on this machine, and a paper-and-pencil estimate
of memory and time for a 7B-parameter model.

    python -m benchmarks study scaling measure --out out/scaling    # the grid of runs (a few minutes)
    python -m benchmarks study scaling report --runs out/scaling --out docs/results/scaling.md

``measure`` launches :mod:`benchmarks.studies.distributed_fit` once per task (toy, SST
MiniLM), mode and layout: one process with every core, one process with one
thread, and two processes under ``torchrun`` with one thread each. The SST runs
need the sst suite's cached MiniLM (``python -m benchmarks run sst`` fine-tunes
it once). ``report`` reads the runs' JSON files; no number in the report is
typed by hand.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

#: The question this study answers (``python -m benchmarks list``).
QUESTION = "DiffMask's fit throughput with one and two gloo processes (the scaling report)"

#: ``(processes, threads per process)`` of the measured layouts.
LAYOUTS = [(1, 2), (1, 1), (2, 1)]
#: Global steps per run: within one epoch of either task at batch 32 (toy: 112
#: batches, SST: 267), long enough that the first batch's statistics are a small part.
STEPS = {"toy": 50, "sst": 40}


def measure(out: Path, tasks: Sequence[str] = ("toy", "sst"), modes: Sequence[str] = ("input", "hidden")) -> None:
    r"""Runs every task x mode x layout of :data:`LAYOUTS`, one after the other
    (so no two compete for the cores); the launcher writes one JSON per run."""
    out.mkdir(parents=True, exist_ok=True)
    for task in tasks:
        for mode in modes:
            for processes, threads in LAYOUTS:
                launcher = [sys.executable, "-m", "benchmarks.studies.distributed_fit"]
                if processes > 1:
                    launcher = [sys.executable, "-m", "torch.distributed.run", "--standalone",
                                f"--nproc_per_node={processes}", "-m", "benchmarks.studies.distributed_fit"]
                command = launcher + ["--task", task, "--mode", mode, "--steps", str(STEPS[task]),
                                      "--threads", str(threads), "--out", str(out)]
                print(" ".join(command[1:]), file=sys.stderr, flush=True)
                subprocess.run(command, check=True, env={**os.environ, "OMP_NUM_THREADS": str(threads)})


@dataclass
class ModelShape:
    r"""A decoder transformer's shape, for the estimate.

    Attributes:
        name (str): what it is.
        parameters (float): its parameter count.
        layers (int): its blocks.
        hidden (int): the residual width H.
        ffn (int): the MLP's inner width (gated: two projections of it).
        bytes_per_value (int): 2 for bf16 / fp16 weights and activations.
    """

    name: str = "Llama-2-7B"
    parameters: float = 6.74e9
    layers: int = 32
    hidden: int = 4096
    ffn: int = 11008
    bytes_per_value: int = 2


def estimate(shape: ModelShape, tokens_per_step: int, tokens_per_epoch: int, flops_per_second: float) -> Dict[str, Any]:
    r"""
    Memory per step and time per epoch of DiffMask's fit on ``shape``, per mode.

    The counts (GB = 1e9 bytes):

    - the model's weights, frozen: ``parameters * bytes_per_value``;
    - the probe in float32 with its gradient and Adam's two moments (16 bytes a
      parameter): one gate network per site ``hidden.0 .. hidden.L`` with a
      hidden layer of H/4 (fit's default), reading ``[input; hidden.j]`` (2H)
      in input mode and ``hidden.j`` (H) in hidden mode;
    - the clean pass's captured sites, L + 1 states of H values a token;
    - the probe's saved float32 features (input mode: all L + 1 votes every
      step; hidden mode: the drawn layer's network only);
    - the masked pass's activations saved for the backward pass, per token and
      block: the two norms' inputs and outputs, q, k, v, the attention output
      and its projection's input (8 H), the MLP's input (1 H) and its gate, up,
      activation and product (4 ffn) - attention scores not kept (a fused
      kernel); hidden mode re-runs (and keeps) the blocks after the drawn layer
      only, on average half of them.

    Time: a forward costs 2 FLOPs a parameter a token. Input mode runs the clean
    forward, the masked forward and the backward to the input (activation
    gradients only, no weight gradients: about one forward): 6 P a token. Hidden
    mode's masked forward and backward cover, on average, half the blocks: 4 P.

    Args:

        shape (ModelShape): the model.
        tokens_per_step (int): real tokens of one training batch.
        tokens_per_epoch (int): real tokens of the training set.
        flops_per_second (float): the sustained rate assumed.

    Returns:
        *dict* ``{"input": {...}, "hidden": {...}}`` with the memory terms in GB,
        their total, and the seconds per epoch.
    """
    H, L, gb = shape.hidden, shape.layers, 1e9
    width = H // 4
    weights = shape.parameters * shape.bytes_per_value / gb
    sites = (L + 1) * H * tokens_per_step * shape.bytes_per_value / gb
    block_activations = (9 * H + 4 * shape.ffn) * shape.bytes_per_value * tokens_per_step / gb
    result: Dict[str, Any] = {}
    for mode, reads, networks_per_step, blocks, flops in (
        ("input", 2 * H, L + 1, L, 6), ("hidden", H, 1, L / 2, 4),
    ):
        probe_parameters = (L + 1) * (reads * width + 2 * width + 1)
        terms = {
            "weights": weights,
            "probe_and_adam": probe_parameters * 16 / gb,
            "captured_sites": sites,
            "probe_activations": networks_per_step * (reads + 2 * width) * 4 * tokens_per_step / gb,
            "model_activations": blocks * block_activations,
        }
        result[mode] = {"probe_parameters": probe_parameters, "memory_gb": terms, "total_gb": sum(terms.values()),
                        "seconds_per_epoch": flops * shape.parameters * tokens_per_epoch / flops_per_second}
    return result


def _load_runs(runs: Path) -> List[Dict[str, Any]]:
    found = [json.loads(p.read_text()) for p in sorted(runs.glob("run-*-*-*x*.json"))]
    if not found:
        raise FileNotFoundError(f"runs: no run-*.json in {runs}; run `python -m benchmarks study scaling measure --out {runs}`")
    return found


def _reference(found: List[Dict[str, Any]], run: Dict[str, Any], threads: int) -> Optional[Dict[str, Any]]:
    return next((r for r in found if r["task"] == run["task"] and r["mode"] == run["mode"]
                 and r["world_size"] == 1 and r["threads_per_process"] == threads), None)


def _ratio(run: Dict[str, Any], reference: Optional[Dict[str, Any]]) -> str:
    return f"{run['tokens_per_second'] / reference['tokens_per_second']:.2f}x" if reference else "-"


def _throughput_table(found: List[Dict[str, Any]]) -> List[str]:
    lines = ["| task | mode | processes x threads | steps | ms a step | examples/s | tokens/s | "
             "x one process, 2 threads | x one process, 1 thread | largest probe difference across ranks |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for run in sorted(found, key=lambda r: (r["task"], r["mode"], r["world_size"], -r["threads_per_process"])):
        difference = f"{run['max_probe_difference_across_ranks']:.1e}" if run["world_size"] > 1 else "-"
        lines.append(f"| {run['task']} | {run['mode']} | {run['world_size']} x {run['threads_per_process']} | "
                     f"{run['steps']} | {1000 * run['seconds'] / run['steps']:.1f} | {run['examples_per_second']:.0f} | "
                     f"{run['tokens_per_second']:.0f} | {_ratio(run, _reference(found, run, 2))} | "
                     f"{_ratio(run, _reference(found, run, 1))} | {difference} |")
    return lines


#: The estimate's batch (real tokens a step) and sustained FLOP rate.
TOKENS_PER_STEP, FLOPS_PER_SECOND = 4096, 400e12


def _estimate_lines(found: List[Dict[str, Any]]) -> Tuple[List[str], Dict[str, Any]]:
    sst = next((r for r in found if r["task"] == "sst"), None)
    tokens_per_epoch = sst["train_tokens"] if sst else 8544 * 25
    shape, tokens_per_step, rate = ModelShape(), TOKENS_PER_STEP, FLOPS_PER_SECOND
    result = estimate(shape, tokens_per_step, tokens_per_epoch, rate)
    lines = [
        f"{shape.name} ({shape.parameters / 1e9:.2f} B parameters, {shape.layers} blocks, H = {shape.hidden}, "
        f"MLP {shape.ffn}, bf16), {tokens_per_step} real tokens a step (e.g. 32 sentences of 128 tokens), "
        f"an epoch of SST train ({tokens_per_epoch} tokens"
        f"{' with the MiniLM tokenizer' if sst else ', assumed'}), {rate / 1e12:.0f} TFLOP/s sustained "
        "(about 40 % of an H100's dense bf16 peak). The formulas are `benchmarks.studies.scaling.estimate`'s docstring.",
        "", "| | input mode | hidden mode |", "|---|---|---|",
    ]
    for term in result["input"]["memory_gb"]:
        lines.append(f"| {term.replace('_', ' ')} (GB) | {result['input']['memory_gb'][term]:.1f} | "
                     f"{result['hidden']['memory_gb'][term]:.1f} |")
    lines += [
        f"| **memory per step (GB)** | **{result['input']['total_gb']:.0f}** | **{result['hidden']['total_gb']:.0f}** |",
        f"| probe parameters (M) | {result['input']['probe_parameters'] / 1e6:.0f} | {result['hidden']['probe_parameters'] / 1e6:.0f} |",
        f"| time per SST epoch (s) | {result['input']['seconds_per_epoch']:.0f} | {result['hidden']['seconds_per_epoch']:.0f} |",
        f"| 100 epochs, the paper's length (min) | {100 * result['input']['seconds_per_epoch'] / 60:.0f} | "
        f"{100 * result['hidden']['seconds_per_epoch'] / 60:.0f} |",
    ]
    record = {"shape": asdict(shape), "tokens_per_step": tokens_per_step, "tokens_per_epoch": tokens_per_epoch,
              "flops_per_second": rate, "result": result}
    return lines, record


def write_report(runs: Path, out: Path, device_note: Optional[str] = None) -> None:
    r"""Writes the report from the JSON files in ``runs``."""
    found = _load_runs(runs)
    lines = [
        "# Scaling DiffMask's fit", "",
        "Commands: `python -m benchmarks study scaling measure --out out/scaling` then "
        "`python -m benchmarks study scaling report --runs out/scaling --out docs/results/scaling.md`. "
        f"Machine: {platform.machine()}, {os.cpu_count()} cores, {platform.python_version()}, "
        f"torch {_torch_version()}; the runs one after the other on an otherwise idle machine.", "",
        "## One and two processes (gloo, CPU)", "",
        "Each run fits DiffMask for a fixed number of global steps of batch 32 per process "
        "(`benchmarks.studies.distributed_fit`; the first batch's statistics included): toy task (the toy suite's model, "
        "eps 0.05) and the SST MiniLM of the `sst` suite (l0 'mean', eps 0.02). Tokens are real (unpadded) tokens "
        "of every rank's batches. Two processes take a global batch twice as large per step, so the ratio compares "
        "throughput, not steps.", "",
    ]
    lines += _throughput_table(found)
    lines += [
        "", "All layouts share the same two cores: a second process adds no compute here, it splits the "
        "cores and adds the gradient exchange (all-reduces every step). Against one single-threaded process, "
        "the two-process runs show what the second process's core buys once that exchange is paid; data "
        "parallelism pays when each rank has a device of its own.",
        "", "The probe's parameters after the fit are compared across ranks in every two-process run (the last "
        "column, 0 when identical). That the two-process probe equals a single-process fit on the same global "
        "batches within 1e-5 is `tests/library/test_distributed.py`.", "",
        "## On a GPU", "",
        device_note or "This task was not lent a GPU machine, so the SST MiniLM fit on a GPU and a paper-length "
        "(100 epochs) fit are not measured here; the estimate below is the plan for them.", "",
        "## Estimate for a 7B-parameter model", "",
    ]
    estimate_lines, record = _estimate_lines(found)
    lines += estimate_lines
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("\n".join(lines) + "\n")
    out.with_suffix(".json").write_text(json.dumps({"runs": found, "estimate": record}, indent=2))


def _torch_version() -> str:
    import torch

    return torch.__version__


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks study scaling", description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    run = commands.add_parser("measure", help="run the grid of fits")
    run.add_argument("--out", required=True)
    run.add_argument("--tasks", nargs="+", default=["toy", "sst"], choices=["toy", "sst"])
    report = commands.add_parser("report", help="write the report from the runs")
    report.add_argument("--runs", required=True)
    report.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    if args.command == "measure":
        measure(Path(args.out), args.tasks)
    else:
        write_report(Path(args.runs), Path(args.out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
