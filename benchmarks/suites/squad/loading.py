"""The squad suite's data and model: the split by article, the QA MiniLM
fine-tuned on the training articles (cached like the SST model), its answers
on the held-out articles, and the windows DiffMask is fitted and analysed on."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Mapping, Optional, Tuple

import torch
from torch import nn

from benchmarks.progress import log
from benchmarks.records import cached
from benchmarks.common.minilm.loading import FineTuned, subset
from benchmarks.tasks.sst import default_data_dir
from benchmarks.tasks.squad import (
    best_spans, encode_squad, read_squad, span_text, split_by_article, SquadExample, SquadFeatures, squad_scores,
)
from benchmarks.tasks.squad_qa import evaluate_qa, fine_tune_qa, load_minilm_qa, span_logits
from benchmarks.tasks.sst_bert import keep_first_layers, tiny_bert

#: Where SQuAD v1.1 dev is looked for when ``data.path`` is None: ``../shared/data`` beside the checkout.
DEFAULT_PATH = default_data_dir() / "squad" / "dev-v1.1.json"


def run_device(config: Mapping[str, Any]) -> torch.device:
    r"""Where the run's model computes: ``config["device"]`` (e.g. ``"cuda"``),
    the CPU when it is None. The windows stay on the CPU; each batch goes to
    the model's device and each result comes back."""
    name = config.get("device") or "cpu"
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device: {name!r} asked for, but torch sees no CUDA device here")
    return device


def load_squad_split(config: Mapping[str, Any]) -> Tuple[List[SquadExample], List[SquadExample]]:
    r"""(fine-tuning, held-out) questions of ``config["data"]``: SQuAD v1.1 dev
    split by article."""
    data = config["data"]
    examples = read_squad(data.get("path") or DEFAULT_PATH)
    return split_by_article(examples, float(data["held_out"]), int(data["split_seed"]))


def _build_model(options: Mapping[str, Any], train: List[SquadExample]) -> Tuple[nn.Module, Any]:
    r"""The untrained QA model of ``options["source"]``: MiniLM with a new span
    head, or a config-built tiny BERT over the training questions' words (tests),
    cut to ``num_layers`` blocks."""
    source = options.get("source", "minilm")
    if source == "minilm":
        model, tokenizer = load_minilm_qa(int(options["seed"]))
    elif source == "tiny":
        from transformers import BertForQuestionAnswering

        words = sorted({w for e in train for w in (e.question + " " + e.context).split()})
        model, tokenizer = tiny_bert(words, num_labels=2, seed=int(options["seed"]), model_class=BertForQuestionAnswering)
    else:
        raise ValueError(f"model.source must be 'minilm' or 'tiny', got {source!r}")
    return keep_first_layers(model, options.get("num_layers")), tokenizer


def load_qa_model(
    config: Mapping[str, Any], train: List[SquadExample], held_out: List[SquadExample], verbose: bool,
    factory: Optional[Callable[[], Tuple[nn.Module, Any]]] = None,
) -> Tuple[nn.Module, Any, Dict[str, Any]]:
    r"""
    The QA model: from the cache when this configuration and these questions
    were fine-tuned before, else fine-tuned on ``train`` (:func:`fine_tune_qa`)
    and scored on ``held_out`` (official EM / F1).

    Args:

        config (dict): :data:`DEFAULTS`-shaped; ``model`` holds the windows and
                    the fine-tuning options.
        train, held_out (list of SquadExample): the two sides of the split.
        verbose (bool): progress bars and one line per epoch.
        factory (callable, optional): ``() -> (model, fast tokenizer)`` with an
                    untrained span head; when None, ``model.source``'s: MiniLM
                    (:func:`load_minilm_qa`) or a tiny config-built BERT.

    Returns:
        *tuple* ``(model, tokenizer, info)``; ``info`` has ``cached``,
        ``history``, ``fine_tune_seconds``, ``windows`` (training windows) and
        ``held_out`` (``exact_match``, ``f1``, ``count``).
    """
    options = dict(config["model"])
    model, tokenizer = (factory or (lambda: _build_model(options, train)))()
    model.to(run_device(config))
    key = {"options": options, "train": [e.id for e in train], "held_out": [e.id for e in held_out],
           "signature": sum(p.numel() for p in model.parameters())}
    length, stride = int(options["max_length"]), int(options["doc_stride"])

    def build() -> Dict[str, Any]:
        windows = encode_squad(train, tokenizer, length, stride)
        start = time.perf_counter()
        history = fine_tune_qa(model, windows, epochs=int(options["epochs"]), lr=float(options["lr"]),
                               batch_size=int(options["batch_size"]), warmup=float(options["warmup"]),
                               seed=int(options["seed"]), max_steps=options.get("max_steps"), verbose=verbose,
                               log=lambda line: log(verbose, f"[squad] {line}"))
        seconds = time.perf_counter() - start
        scores = evaluate_qa(model, held_out, encode_squad(held_out, tokenizer, length, stride))
        state = {k: v.detach().cpu() for k, v in model.state_dict().items()}  # loadable on any machine
        return {"state_dict": state, "history": history, "seconds": seconds, "windows": len(windows),
                "held_out": scores}

    payload, hit = cached("squad-qa", key, build, use_cache=bool(config.get("cache", True)))
    if hit:
        model.load_state_dict(payload["state_dict"])
    model.eval()
    info = {"cached": hit, "history": payload["history"], "fine_tune_seconds": payload["seconds"],
            "windows": payload["windows"], "held_out": payload["held_out"]}
    how = "cached" if hit else f"fine-tuned in {info['fine_tune_seconds']:.0f} s"
    log(verbose, f"[squad] held-out EM {info['held_out']['exact_match']:.2f}, F1 {info['held_out']['f1']:.2f} ({how})")
    return model, tokenizer, info


@dataclass
class Bench(FineTuned):
    r"""The fine-tuned QA model (with a fast tokenizer), the windows and the
    model's answers of one run (:class:`FineTuned`'s attributes, and:)

    Attributes:
        train (SquadFeatures): windows of the fine-tuning articles DiffMask is fitted on.
        valid (SquadFeatures): windows of the fine-tuning articles held apart
                    from the fit, on which it validates.
        held_out (list of SquadExample): every held-out question.
        windows (SquadFeatures): the analysed questions' windows
                    (``example_index`` into ``held_out``).
        questions (list of int): the analysed questions (indices into ``held_out``).
        spans (list): per held-out question, the model's ``(window, start, end)``
                    (window: a row of ``windows`` for analysed questions, None
                    when no span) and ``answers`` its text.
    """

    train: SquadFeatures
    valid: SquadFeatures
    held_out: List[SquadExample]
    windows: SquadFeatures
    questions: List[int]
    spans: Dict[int, Optional[Tuple[int, int, int]]]
    answers: List[str]


def load_bench(config: Mapping[str, Any], verbose: bool) -> Bench:
    r"""
    The split, the fine-tuned model (:func:`load_qa_model`), its answers and
    official score on the scored held-out questions (all by default), and the
    windows of the analysed questions and of DiffMask's training and validation.

    Args:

        config (Mapping): the suite's configuration.
        verbose (bool): progress bars and a line for the model.

    Returns:
        *Bench*; ``model_info`` holds the split, the windows' settings and the
        held-out score computed in this run.
    """
    train_questions, held_out = load_squad_split(config)
    train_questions = subset(train_questions, config.get("train_questions"))
    model, tokenizer, info = load_qa_model(config, train_questions, held_out, verbose)
    length, stride = int(config["model"]["max_length"]), int(config["model"]["doc_stride"])
    scored = subset(list(range(len(held_out))), config.get("scored_questions"))
    questions = subset(scored, config.get("analysis_questions"))
    windows = _windows_of(encode_squad(held_out, tokenizer, length, stride), scored)
    starts, ends = span_logits(model, windows)
    spans = best_spans(windows, starts, ends, len(held_out))
    answers = [span_text(e, windows, s) for e, s in zip(held_out, spans)]
    scores = squad_scores({held_out[q].id: answers[q] for q in scored}, [held_out[q] for q in scored])
    analysed = _windows_of(windows, questions)
    wanted = set(questions)
    rows = {old: new for new, old in enumerate(w for w, q in enumerate(windows.example_index.tolist()) if q in wanted)}
    kept_spans = {q: None if spans[q] is None else (rows[spans[q][0]], *spans[q][1:]) for q in questions}
    fit_windows = encode_squad(train_questions, tokenizer, length, stride)
    valid_rows = _spread(len(fit_windows), int(config["diffmask"].get("validation_windows", 256)))
    train_rows = sorted(set(range(len(fit_windows))) - set(valid_rows))
    info.update({"split": _split_record(config, train_questions, held_out), "held_out_run": scores,
                 "held_out_windows": len(windows), "analysed_questions": len(questions),
                 "analysed_windows": len(analysed), "max_length": length, "doc_stride": stride,
                 "layers": int(model.config.num_hidden_layers), "source": config["model"].get("source", "minilm"),
                 "parameters": sum(p.numel() for p in model.parameters()),
                 "diffmask_train_windows": len(train_rows), "diffmask_valid_windows": len(valid_rows)})
    log(verbose, f"[squad] held-out (this run): EM {scores['exact_match']:.2f}, F1 {scores['f1']:.2f} "
                 f"over {scores['count']} questions; {len(questions)} analysed ({len(analysed)} windows)")
    return Bench(model, tokenizer, info, fit_windows.subset(train_rows), fit_windows.subset(valid_rows), held_out,
                 analysed, questions, kept_spans, answers)


def _windows_of(windows: SquadFeatures, questions: List[int]) -> SquadFeatures:
    r"""The windows of ``questions``, in order."""
    wanted = set(questions)
    return windows.subset([w for w, q in enumerate(windows.example_index.tolist()) if q in wanted])


def _spread(count: int, limit: int) -> List[int]:
    r"""At most ``limit`` of ``range(count)`` spread evenly."""
    return subset(list(range(count)), limit) if count else []


def _split_record(config: Mapping[str, Any], train: List[SquadExample], held_out: List[SquadExample]) -> Dict[str, Any]:
    r"""The split as the report states it: articles and questions on each side."""
    return {"held_out_share": float(config["data"]["held_out"]), "seed": int(config["data"]["split_seed"]),
            "train_articles": len({e.title for e in train}), "train_questions": len(train),
            "held_out_articles": len({e.title for e in held_out}), "held_out_questions": len(held_out),
            "held_out_titles": sorted({e.title for e in held_out})}
