"""The sst-erasure suite's data and model: the SST splits, the GRU classifier
(trained once and cached), and the sentences every method is scored on."""

from __future__ import annotations

import hashlib
import sys
import time
from dataclasses import dataclass
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

import torch
from torch import Tensor

from benchmarks.tasks.sst import (
    encode,
    mean_word_vector,
    predict,
    read_sst,
    SSTClassifier,
    SSTData,
    SSTSentence,
    train_sst_classifier,
    Vocabulary,
    word_vector_source,
)

from ...progress import log
from ...runner import cached


def _sentences_digest(sentences: Sequence[SSTSentence]) -> str:
    digest = hashlib.sha256()
    for sentence in sentences:
        digest.update(f"{sentence.label}\t{sentence.text}\n".encode("utf-8"))
    return digest.hexdigest()[:16]


def load_splits(config: Mapping[str, Any]) -> Tuple[List[SSTSentence], List[SSTSentence], List[SSTSentence]]:
    r"""``(train, dev, evaluated)`` sentences; ``evaluated`` is dev itself for
    ``split="dev"`` (all of it, whatever ``dev_sentences`` limits for model
    selection), and train itself for ``split="train"`` (for choosing methods'
    settings without looking at dev)."""
    split = config.get("split", "dev")
    if split not in ("dev", "test", "train"):
        raise ValueError(f"split must be 'dev', 'test' or 'train', got {split!r}")
    data_dir = config.get("data_dir")
    train = read_sst("train", data_dir, config.get("train_sentences"))
    dev_all = read_sst("dev", data_dir)
    dev = dev_all[: config["dev_sentences"]] if config.get("dev_sentences") else dev_all
    evaluated = {"dev": dev_all, "train": train}.get(split) or read_sst("test", data_dir)
    return train, dev, evaluated


def load_model(
    config: Mapping[str, Any], train: List[SSTSentence], dev: List[SSTSentence], seed: int, verbose: bool
) -> Tuple[SSTClassifier, Vocabulary, Dict[str, Any]]:
    r"""The GRU classifier for this configuration: from the cache when it was
    trained before, else trained on ``train``, selected on ``dev`` and cached."""
    model_cfg = dict(config["model"])
    embeddings = config.get("embeddings", "minilm")
    source = word_vector_source(embeddings, int(config.get("random_dim", 32)), seed)
    key = {
        "task": "sst-gru", "format": 1, "embeddings": embeddings,
        "random_dim": int(config.get("random_dim", 32)) if embeddings == "random" else None,
        "train": [len(train), _sentences_digest(train)], "dev": [len(dev), _sentences_digest(dev)],
        "model": model_cfg, "seed": seed,
    }

    def build() -> Dict[str, Any]:
        start = time.perf_counter()
        vocabulary = Vocabulary.from_sentences(train)
        vectors = source(vocabulary.itos)
        model, dev_accuracy, history = train_sst_classifier(
            encode(train, vocabulary), encode(dev, vocabulary), vectors, seed=seed,
            verbose=verbose and sys.stderr.isatty(), **model_cfg,
        )
        return {
            "state_dict": model.state_dict(), "itos": list(vocabulary.itos), "dev_accuracy": float(dev_accuracy),
            "history": history, "train_seconds": time.perf_counter() - start,
        }

    payload, hit = cached("sst-gru", key, build, use_cache=bool(config.get("cache", True)))
    vocabulary = Vocabulary(payload["itos"][2:])
    state = payload["state_dict"]
    model = SSTClassifier(state["embedding.weight"], hidden_size=model_cfg["hidden_size"],
                          dropout=model_cfg.get("dropout", 0.3))
    model.load_state_dict(state)
    model.eval()
    info = {
        "dev_accuracy": payload["dev_accuracy"], "history": payload["history"], "cached": hit,
        "train_seconds": payload["train_seconds"], "vocabulary": len(vocabulary),
        "train_sentences": len(train), "dev_sentences": len(dev), "embeddings": embeddings,
        "embedding_dim": model.embedding_dim, "hidden_size": model_cfg["hidden_size"],
    }
    return model, vocabulary, info


def select_sentences(data: SSTData, max_words: int, max_sentences: Optional[int]) -> Tensor:
    r"""Row indices of the sentences with at most ``max_words`` words; with
    ``max_sentences``, that many spread evenly over the split (so the length mix
    stays the split's)."""
    rows = torch.nonzero(data.lengths <= max_words).flatten()
    if max_sentences is not None and max_sentences < len(rows):
        picks = torch.linspace(0, len(rows) - 1, int(max_sentences)).round().long()
        rows = rows[picks.unique()]
    return rows


@dataclass
class Bench:
    r"""The model and the sentences of one run.

    Attributes:
        model (SSTClassifier): the GRU, its embeddings extended to the evaluated
                    split's words when ``extend_vocabulary``.
        model_info (dict): the model's record in the results.
        train (SSTData): the training sentences.
        baseline (Tensor): (H,) the mean word vector over train, what erased words become.
        evaluated (SSTData): the evaluated split.
        short (SSTData): its sentences of at most ``max_words`` words (or the
                    ``max_sentences`` picked among them), sorted by length.
    """

    model: SSTClassifier
    model_info: Dict[str, Any]
    train: SSTData
    baseline: Tensor
    evaluated: SSTData
    short: SSTData


def load_bench(config: Mapping[str, Any], seed: int, verbose: bool) -> Bench:
    r"""
    The GRU (:func:`load_model`) and the encoded sentences of the configured split.

    Args:

        config (Mapping): the suite's configuration.
        seed (int): the GRU's seed (and the random word vectors').
        verbose (bool): a line per step.

    Returns:
        *Bench*.
    """
    split = config.get("split", "dev")
    train_sentences, dev_sentences, eval_sentences = load_splits(config)
    model, vocabulary, model_info = load_model(config, train_sentences, dev_sentences, seed, verbose)
    how = "cached" if model_info["cached"] else f"trained in {model_info['train_seconds']:.1f} s"
    log(verbose, f"[sst-erasure] GRU dev accuracy {model_info['dev_accuracy']:.4f} ({how})")
    train = encode(train_sentences, vocabulary)
    baseline = mean_word_vector(model, train)  # before any extension: train words only

    if config.get("extend_vocabulary", True):
        new_words = vocabulary.extend(w for s in eval_sentences for w in s.words)
        if new_words:
            source = word_vector_source(config.get("embeddings", "minilm"), int(config.get("random_dim", 32)), seed)
            model.extend_embeddings(source(new_words))
        model_info["extended_words"] = len(new_words)
    evaluated = encode(eval_sentences, vocabulary)
    model_info[f"{split}_accuracy_evaluated"] = float((predict(model, evaluated) == evaluated.labels).float().mean())

    rows = select_sentences(evaluated, int(config["max_words"]), config.get("max_sentences"))
    rows = rows[torch.argsort(evaluated.lengths[rows], stable=True)]  # by length: chunks pad little
    short = evaluated.subset(rows)
    log(verbose, f"[sst-erasure] {len(short)} of {len(evaluated)} {split} sentences with <= {config['max_words']} words")
    return Bench(model, model_info, train, baseline, evaluated, short)
