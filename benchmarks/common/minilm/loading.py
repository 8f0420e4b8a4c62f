"""The MiniLM suites' model and data: the fine-tuned classifier (cached), the SST
splits and their encodings."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

import torch
from torch import nn

from benchmarks.tasks import sst_bert
from benchmarks.tasks.sst import LABEL_NAMES, read_sst, SSTSentence
from benchmarks.tasks.sst_bert import EncodedSST

from benchmarks.progress import log_to_stderr
from benchmarks.records import cached


def _build_model(config: Mapping[str, Any], train: Sequence[SSTSentence]) -> Tuple[nn.Module, Any]:
    options = config["model"]
    source = options.get("source", "minilm")
    if source == "minilm":
        model, tokenizer = sst_bert.load_minilm(num_labels=len(LABEL_NAMES))
    elif source == "tiny":
        words = sorted({w.lower() for s in train for w in s.words})
        model, tokenizer = sst_bert.tiny_bert(words, num_labels=len(LABEL_NAMES), seed=int(options.get("seed", 0)))
    else:
        raise ValueError(f"model.source must be 'minilm' or 'tiny', got {source!r}")
    return sst_bert.keep_first_layers(model, options.get("num_layers")), tokenizer


def load_model(
    config: Mapping[str, Any], train: Sequence[SSTSentence], dev: Sequence[SSTSentence], verbose: bool
) -> Tuple[nn.Module, Any, Dict[str, Any]]:
    r"""The fine-tuned classifier: from the cache when this configuration and data
    were fine-tuned before, else fine-tuned on ``train`` for the configured
    epochs, the last kept (``dev`` is scored after each epoch, for the record)."""
    options = config["model"]
    model, tokenizer = _build_model(config, train)
    key = {
        "options": options, "train": [s.text for s in train], "train_labels": [s.label for s in train],
        "dev": [s.text for s in dev], "signature": sum(p.numel() for p in model.parameters()),
        # the last epoch is kept (no epoch is chosen on dev): not the model the best dev epoch gave before
        "kept_epoch": "last",
    }

    def build() -> Dict[str, Any]:
        train_enc = sst_bert.encode_sst(train, tokenizer, int(options.get("max_length", 128)))
        dev_enc = sst_bert.encode_sst(dev, tokenizer, int(options.get("max_length", 128)))
        start = time.perf_counter()
        history = sst_bert.fine_tune(
            model, train_enc, dev_enc, epochs=int(options["epochs"]), lr=float(options["lr"]),
            batch_size=int(options["batch_size"]), warmup=float(options.get("warmup", 0.1)),
            seed=int(options.get("seed", 0)), verbose=verbose,
        )
        return {"state_dict": model.state_dict(), "history": history, "seconds": time.perf_counter() - start}

    payload, hit = cached("sst-bert", key, build, use_cache=bool(config.get("cache", True)))
    if hit:
        model.load_state_dict(payload["state_dict"])
    model.eval()
    info = {"cached": hit, "history": payload["history"], "fine_tune_seconds": payload["seconds"],
            "parameters": sum(p.numel() for p in model.parameters()), "layers": model.config.num_hidden_layers,
            "source": options.get("source", "minilm")}
    return model, tokenizer, info


def subset(sentences: List[SSTSentence], limit: Optional[int]) -> List[SSTSentence]:
    r"""At most ``limit`` sentences spread evenly over the list (so the length mix
    stays the split's)."""
    if limit is None or limit >= len(sentences):
        return sentences
    picks = torch.linspace(0, len(sentences) - 1, int(limit)).round().long().unique()
    return [sentences[i] for i in picks.tolist()]


def validation_split(
    diffmask: Mapping[str, Any], train: List[SSTSentence], dev: List[SSTSentence]
) -> Tuple[List[SSTSentence], List[SSTSentence]]:
    r"""
    The sentences DiffMask is fitted on and those its checkpoint is selected on.

    Args:

        diffmask (Mapping): the suite's ``diffmask`` settings: ``validation_sentences``
                    (how many, spread evenly) and ``validation_from``: ``"train"``
                    (default; set aside from the fit's sentences, so the selection
                    never reads a sentence the report scores) or ``"dev"`` (the
                    suite's earlier choice; the fit keeps every train sentence).
        train, dev (list of SSTSentence): the splits.

    Returns:
        *tuple* of the fit's sentences and the validation sentences.
    """
    source = diffmask.get("validation_from", "train")
    if source not in ("train", "dev"):
        raise ValueError(f"validation_from must be 'train' or 'dev', got {source!r}")
    if source == "dev":
        return train, subset(dev, diffmask.get("validation_sentences"))
    limit = diffmask.get("validation_sentences")
    if limit is None or int(limit) >= len(train):
        raise ValueError(f"validation_sentences must be fewer than the {len(train)} train sentences "
                         f"with validation_from='train', got {limit!r}")
    held = set(subset(list(range(len(train))), limit))
    return [s for i, s in enumerate(train) if i not in held], [s for i, s in enumerate(train) if i in held]


@dataclass
class FineTuned:
    r"""A fine-tuned model of one run.

    Attributes:
        model (nn.Module): the fine-tuned model, in eval mode.
        tokenizer (Any): its tokenizer.
        model_info (dict): the model's record in the results.
    """

    model: nn.Module
    tokenizer: Any
    model_info: Dict[str, Any]

    @property
    def layers(self) -> int:
        r"""The model's number of blocks."""
        return int(self.model.config.num_hidden_layers)


@dataclass
class Bench(FineTuned):
    r"""The fine-tuned classifier and the encoded sentences of one run
    (:class:`FineTuned`'s attributes, and:)

    Attributes:
        train (EncodedSST): the sentences DiffMask is fitted on (the train
                    split less the validation sentences when those come from it).
        valid (EncodedSST): the sentences DiffMask's fit validates on
                    (:func:`validation_split`).
        evaluated (EncodedSST): the sentences of the evaluated split.
    """

    train: EncodedSST
    valid: EncodedSST
    evaluated: EncodedSST


def load_bench(config: Mapping[str, Any], verbose: bool) -> Bench:
    r"""
    The fine-tuned model (:func:`load_model`) and the encoded splits.

    Args:

        config (Mapping): the suite's configuration.
        verbose (bool): progress bars and a line for the model.

    Returns:
        *Bench*, its ``model_info`` with the dev scores and the sentence counts.
    """
    split = config.get("split", "dev")
    data_dir = config.get("data_dir")
    train_sentences = subset(read_sst("train", data_dir), config.get("train_sentences"))
    dev_sentences = read_sst("dev", data_dir)
    eval_sentences = subset(dev_sentences if split == "dev" else read_sst("test", data_dir), config.get("eval_sentences"))
    model, tokenizer, model_info = load_model(config, train_sentences, dev_sentences, verbose)
    max_length = int(config["model"].get("max_length", 128))
    fit_sentences, valid_sentences = validation_split(config["diffmask"], train_sentences, dev_sentences)
    train = sst_bert.encode_sst(fit_sentences, tokenizer, max_length)
    dev = sst_bert.encode_sst(dev_sentences, tokenizer, max_length)
    evaluated = sst_bert.encode_sst(eval_sentences, tokenizer, max_length)
    valid = sst_bert.encode_sst(valid_sentences, tokenizer, max_length)
    dev_scores = sst_bert.evaluate(model, dev)
    model_info.update({"dev_accuracy": 100.0 * dev_scores["accuracy"], "dev_macro_f1": 100.0 * dev_scores["macro_f1"],
                       "train_sentences": len(train_sentences), "fit_sentences": len(train), "validation_sentences": len(valid),
                       "validation_from": config["diffmask"].get("validation_from", "train"), "evaluated_sentences": len(evaluated)})
    log_to_stderr(verbose, f"[sst] model: dev accuracy {model_info['dev_accuracy']:.2f}, "
                           f"macro-F1 {model_info['dev_macro_f1']:.2f} ({'cached' if model_info['cached'] else 'fine-tuned'})")
    return Bench(model, tokenizer, model_info, train, valid, evaluated)
