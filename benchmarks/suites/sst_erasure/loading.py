"""The sst-erasure suite's data and model: the SST splits, the token unit (the
classifier's word pieces, or words), the GRU classifier (trained once and
cached), the erasure baseline, and the sentences every method is scored on."""

from __future__ import annotations

import functools
import hashlib
import sys
import time
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

import torch
from torch import Tensor

from benchmarks.tasks.sst import (
    encode, mean_word_vector, peakedness, predict, read_sst, SSTClassifier, SSTData, SSTSentence,
    train_sst_classifier, Vocabulary, word_vector_source,
)

from benchmarks.progress import log
from benchmarks.records import cached

#: The token units: the classifier's word pieces with [CLS]/[SEP] (the paper's), or words.
UNITS = ("piece", "word")
#: What replaces an erased token (``baseline``), see :func:`erasure_baseline`.
BASELINES = ("mean", "zero", "mask")


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


@dataclass
class TokenUnit:
    r"""
    What a token is: how sentences become rows of ids, and the embedding table
    those ids index.

    Attributes:
        name (str): ``"piece"`` (the classifier's word pieces, ``[CLS]`` and
                    ``[SEP]`` included) or ``"word"``.
        encode (Callable): sentences -> :class:`SSTData`.
        vectors (Tensor): (V, H) the frozen embedding table.
        vocabulary (Vocabulary or None): the word unit's ids (None for pieces,
                    whose ids are the tokenizer's).
        special_ids (dict): ``[MASK]``'s id where the unit has one.
    """

    name: str
    encode: Callable[[Sequence[SSTSentence]], SSTData]
    vectors: Tensor
    vocabulary: Optional[Vocabulary]
    special_ids: Dict[str, int]


def token_unit(config: Mapping[str, Any], train: Sequence[SSTSentence], seed: int) -> TokenUnit:
    r"""
    The configured token unit (``unit``), with its embeddings (``embeddings``,
    ``random_dim``).

    Args:

        config (Mapping): the suite's configuration.
        train (sequence of SSTSentence): the training sentences (the word
                    vocabulary; the test tokenizer's vocabulary).
        seed (int): seeds random vectors.

    Returns:
        *TokenUnit*.
    """
    unit = config.get("unit", "piece")
    embeddings, dim = config.get("embeddings", "minilm"), int(config.get("random_dim", 32))
    if unit == "piece":
        from benchmarks.tasks.sst_pieces import encode_pieces, piece_tokenizer, piece_vectors

        tokenizer = piece_tokenizer(embeddings, train)
        return TokenUnit(unit, functools.partial(encode_pieces, tokenizer=tokenizer),
                         piece_vectors(embeddings, tokenizer, dim, seed), None,
                         {"mask": int(tokenizer.mask_token_id)})
    if unit == "word":
        vocabulary = Vocabulary.from_sentences(train)
        vectors = word_vector_source(embeddings, dim, seed)(vocabulary.itos)
        return TokenUnit(unit, functools.partial(encode, vocabulary=vocabulary), vectors, vocabulary, {})
    raise ValueError(f"unit must be one of {UNITS}, got {unit!r}")


def load_model(
    config: Mapping[str, Any], train: List[SSTSentence], dev: List[SSTSentence], seed: int, verbose: bool
) -> Tuple[SSTClassifier, TokenUnit, Dict[str, Any]]:
    r"""The GRU classifier for this configuration: from the cache when it was
    trained before, else trained on ``train`` (its sentences, or every phrase of
    its trees with ``model.phrases``), its epoch kept by ``model.select`` (the
    suite's: the last; "best" selects on ``dev``) and cached."""
    model_cfg = dict(config["model"])
    phrases = bool(model_cfg.pop("phrases", False))
    unit = token_unit(config, train, seed)
    embeddings = config.get("embeddings", "minilm")
    key = {
        "task": "sst-gru", "format": 2, "unit": unit.name, "embeddings": embeddings,
        "random_dim": int(config.get("random_dim", 32)) if embeddings == "random" else None,
        "train": [len(train), _sentences_digest(train)], "dev": [len(dev), _sentences_digest(dev)],
        "phrases": phrases, "model": model_cfg, "seed": seed,
    }

    def build() -> Dict[str, Any]:
        start = time.perf_counter()
        examples = read_sst("train", config.get("data_dir"), config.get("train_sentences"), phrases=True) if phrases else train
        model, dev_accuracy, history = train_sst_classifier(
            unit.encode(examples), unit.encode(dev), unit.vectors, seed=seed, sort_by_length=phrases,
            verbose=verbose and sys.stderr.isatty(), **model_cfg,
        )
        state = {k: v for k, v in model.state_dict().items() if k != "embedding.weight"}  # rebuilt from the unit
        return {"state_dict": state, "dev_accuracy": float(dev_accuracy), "history": history,
                "train_examples": len(examples), "train_seconds": time.perf_counter() - start}

    payload, hit = cached("sst-gru", key, build, use_cache=bool(config.get("cache", True)))
    model = SSTClassifier(unit.vectors, hidden_size=model_cfg["hidden_size"], dropout=model_cfg.get("dropout", 0.3))
    model.load_state_dict({**payload["state_dict"], "embedding.weight": model.embedding.weight})
    model.eval()
    info = {
        "dev_accuracy": payload["dev_accuracy"], "history": payload["history"], "cached": hit,
        "train_seconds": payload["train_seconds"], "unit": unit.name, "vocabulary": int(unit.vectors.shape[0]),
        "train_sentences": len(train), "train_examples": payload["train_examples"], "phrases": phrases,
        "dev_sentences": len(dev), "embeddings": embeddings,
        "embedding_dim": model.embedding_dim, "hidden_size": model_cfg["hidden_size"],
    }
    return model, unit, info


def erasure_baseline(name: str, model: SSTClassifier, train: SSTData, unit: TokenUnit) -> Tensor:
    r"""
    What replaces an erased token, the same for exact erasure and every method
    that replaces tokens.

    Args:

        name (str): ``"mean"``: the mean token vector over the train sentences
                    (each occurrence counts); ``"zero"``: the zero vector;
                    ``"mask"``: the ``[MASK]`` piece's vector (piece unit only).
        model (SSTClassifier): the GRU (its embedding table).
        train (SSTData): the encoded train sentences.
        unit (TokenUnit): the token unit.

    Returns:
        *Tensor* (H,) float32.
    """
    if name == "mean":
        return mean_word_vector(model, train)
    if name == "zero":
        return torch.zeros(model.embedding_dim)
    if name == "mask" and "mask" in unit.special_ids:
        return model.embedding.weight[unit.special_ids["mask"]].detach().float().clone()
    raise ValueError(f"baseline must be one of {BASELINES} ('mask' with unit='piece'), got {name!r}")


def select_sentences(data: SSTData, max_tokens: int, max_sentences: Optional[int]) -> Tensor:
    r"""Row indices of the sentences with at most ``max_tokens`` tokens; with
    ``max_sentences``, that many spread evenly over them (so the length mix
    stays the split's)."""
    rows = torch.nonzero(data.lengths <= max_tokens).flatten()
    if max_sentences is not None and max_sentences < len(rows):
        picks = torch.linspace(0, len(rows) - 1, int(max_sentences)).round().long()
        rows = rows[picks.unique()]
    return rows


@dataclass
class Bench:
    r"""The model and the sentences of one run.

    Attributes:
        model (SSTClassifier): the GRU (word unit: its embeddings extended to the
                    evaluated split's words when ``extend_vocabulary``).
        model_info (dict): the model's record in the results.
        unit (TokenUnit): what a token is.
        train (SSTData): the training sentences.
        baseline (Tensor): (H,) what erased tokens become (:func:`erasure_baseline`).
        evaluated (SSTData): the evaluated split.
        short (SSTData): its sentences of at most ``max_tokens`` tokens (or the
                    ``max_sentences`` picked among them), sorted by length.
    """

    model: SSTClassifier
    model_info: Dict[str, Any]
    unit: TokenUnit
    train: SSTData
    baseline: Tensor
    evaluated: SSTData
    short: SSTData


def load_bench(config: Mapping[str, Any], seed: int, verbose: bool) -> Bench:
    r"""
    The GRU (:func:`load_model`) and the encoded sentences of the configured split.

    Args:

        config (Mapping): the suite's configuration.
        seed (int): the GRU's seed (and the random vectors').
        verbose (bool): a line per step.

    Returns:
        *Bench*.
    """
    split = config.get("split", "dev")
    train_sentences, dev_sentences, eval_sentences = load_splits(config)
    model, unit, model_info = load_model(config, train_sentences, dev_sentences, seed, verbose)
    how = "cached" if model_info["cached"] else f"trained in {model_info['train_seconds']:.1f} s"
    log(verbose, f"[sst-erasure] GRU dev accuracy {model_info['dev_accuracy']:.4f} ({how})")
    train = unit.encode(train_sentences)
    # before any extension: train words only
    baseline = erasure_baseline(config.get("baseline", "mean"), model, train, unit)
    if unit.vocabulary is not None and config.get("extend_vocabulary", True):
        new_words = unit.vocabulary.extend(w for s in eval_sentences for w in s.words)
        if new_words:
            source = word_vector_source(config.get("embeddings", "minilm"), int(config.get("random_dim", 32)), seed)
            model.extend_embeddings(source(new_words))
        model_info["extended_words"] = len(new_words)
    evaluated = unit.encode(eval_sentences)
    model_info[f"{split}_accuracy_evaluated"] = float((predict(model, evaluated) == evaluated.labels).float().mean())

    max_tokens = int(config["max_tokens"])
    rows = select_sentences(evaluated, max_tokens, config.get("max_sentences"))
    rows = rows[torch.argsort(evaluated.lengths[rows], stable=True)]  # by length: chunks pad little
    short = evaluated.subset(rows)
    model_info["cut"] = {"max_tokens": max_tokens, "unit": unit.name, "split_sentences": len(evaluated),
                         "within": int((evaluated.lengths <= max_tokens).sum()), "searched": len(short)}
    log(verbose, f"[sst-erasure] {model_info['cut']['within']} of {len(evaluated)} {split} sentences have "
                 f"<= {max_tokens} {unit.name}s ({len(short)} searched)")
    model_info["peakedness_searched"] = peakedness(model, short)
    return Bench(model, model_info, unit, train, baseline, evaluated, short)
