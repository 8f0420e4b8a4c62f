"""The paper's toy task (Sec. 4) written as text for a decoder-only language model.

An example ``x = <x_1 .. x_t>`` with query ``<n, m>`` becomes the prompt
``<n> <m> : x_1 .. x_t ->`` (the query's digits as tokens of their own) and the answer token ``yes`` (more ``n`` than ``m``) or
``no``. A config-built Llama-style decoder is trained on the answer token (the
next-token output at the prompt's last position); prompts are left-padded, so the
answer is always read at the last column.

The ground truth is the paper's: the digits of ``x`` that hold ``n`` or ``m``. It
is defined on the digit positions only; the query, ``:`` and ``->`` are where the
question is asked and read, and are left out of the score (as the GRU's query is a
separate input in the original task).
"""

from __future__ import annotations

import copy
import math
import time
from dataclasses import dataclass
from typing import Any, Dict, Iterator, Optional, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor

from captum_diffmask.model.forward import padded_positions
from captum_diffmask.model.rng import preserved_rng
from captum_diffmask.evaluation.toy_task import ToyData, toy_ground_truth

#: Token ids: padding, the separator, the arrow, the answers, then the digits.
PAD, COLON, ARROW, YES, NO = 0, 1, 2, 3, 4
DIGIT0 = 5
SPECIAL_TOKENS = {PAD: "<pad>", COLON: ":", ARROW: "->", YES: "yes", NO: "no"}


def vocabulary_size(digits: int) -> int:
    r"""The decoder's vocabulary: five special tokens, the digits of ``x``, then
    the query's digits (tokens of their own, see :func:`encode_toy`)."""
    return DIGIT0 + 2 * digits


def token_text(token: int, digits: int = 10) -> str:
    if token in SPECIAL_TOKENS:
        return SPECIAL_TOKENS[token]
    return str(token - DIGIT0) if token < DIGIT0 + digits else f"<{token - DIGIT0 - digits}>"


@dataclass(frozen=True)
class ToyText:
    r"""
    Toy examples as left-padded prompts.

    Args:

        ids (Tensor): (N, T + 4) long prompts ``n m : x ->``, left-padded with 0.
        mask (Tensor): (N, T + 4) long, 1 at real tokens.
        answers (Tensor): (N,) long, ``YES`` or ``NO``.
        digits (Tensor): (N, T + 4) bool, True at the positions of ``x``.
        truth (Tensor): (N, T + 4) float, 1 at the digits of ``x`` holding ``n`` or ``m``.
    """

    ids: Tensor
    mask: Tensor
    answers: Tensor
    digits: Tensor
    truth: Tensor

    def __len__(self) -> int:
        return self.ids.shape[0]

    def subset(self, index: Tensor) -> "ToyText":
        return ToyText(self.ids[index], self.mask[index], self.answers[index], self.digits[index], self.truth[index])

    def batches(self, batch_size: int, shuffle: bool = False, seed: int = 0) -> Iterator[Tuple[Tensor, Tensor]]:
        r"""``(ids, mask)`` batches; shuffled by a generator of its own when asked."""
        order = (torch.randperm(len(self), generator=torch.Generator().manual_seed(seed)) if shuffle
                 else torch.arange(len(self)))
        for start in range(0, len(self), batch_size):
            index = order[start:start + batch_size]
            yield self.ids[index], self.mask[index]


def encode_toy(data: ToyData, digits: int = 10) -> ToyText:
    r"""The examples of ``data`` as prompts ``<n> <m> : x ->`` (see the module).
    The query's digits are tokens of their own, ``<0> .. <9>``, as a prompt
    format marks its fields: with rotary positions a decoder finds the query by
    content, not by an offset that changes with the length of ``x``."""
    count, length = data.ids.shape
    lengths = data.mask.sum(1)
    width = length + 4
    ids = torch.zeros(count, width, dtype=torch.long)
    positions = torch.zeros(count, width, dtype=torch.bool)
    truth = torch.zeros(count, width)
    gt = toy_ground_truth(data.ids, data.query, data.mask)
    for row in range(count):
        t = int(lengths[row])
        start = width - (t + 4)
        ids[row, start:start + 2] = data.query[row] + DIGIT0 + digits
        ids[row, start + 2] = COLON
        ids[row, start + 3:start + 3 + t] = data.ids[row, :t] + DIGIT0
        ids[row, -1] = ARROW
        positions[row, start + 3:start + 3 + t] = True
        truth[row, start + 3:start + 3 + t] = gt[row, :t]
    mask = (torch.arange(width).unsqueeze(0) >= (width - (lengths + 4)).unsqueeze(1)).long()
    answers = torch.where(data.labels > 0.5, torch.tensor(YES), torch.tensor(NO))
    return ToyText(ids, mask, answers, positions, truth)


#: The models the toy prompts are written for: a Llama-style decoder (causal
#: attention) or a BERT-style encoder (every position reads every other).
ARCHITECTURES = ("decoder", "encoder")


def toy_decoder(digits: int, layers: int = 2, hidden: int = 64, heads: int = 4, seed: int = 0,
                init_std: float = 0.02, architecture: str = "decoder") -> Any:
    r"""A config-built model for the toy prompts: a Llama-style decoder
    (``LlamaForCausalLM``), or with ``architecture="encoder"`` a BERT encoder
    with a language-model head (``BertForMaskedLM``: bidirectional attention,
    no dropout, as the decoder has none), the answer read at the last column
    either way."""
    if architecture not in ARCHITECTURES:
        raise ValueError(f"architecture must be one of {ARCHITECTURES}, got {architecture!r}")
    if architecture == "encoder":
        return _toy_encoder(digits, layers, hidden, heads, seed, init_std)
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=vocabulary_size(digits), hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads,
        num_key_value_heads=heads, intermediate_size=2 * hidden, max_position_embeddings=64,
        pad_token_id=PAD, bos_token_id=COLON, eos_token_id=ARROW, tie_word_embeddings=False, initializer_range=init_std,
    )
    with preserved_rng(seed):
        return LlamaForCausalLM(config)


def _toy_encoder(digits: int, layers: int, hidden: int, heads: int, seed: int, init_std: float) -> Any:
    from transformers import BertConfig, BertForMaskedLM

    config = BertConfig(
        vocab_size=vocabulary_size(digits), hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads,
        intermediate_size=2 * hidden, max_position_embeddings=64, type_vocab_size=1, pad_token_id=PAD,
        hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, initializer_range=init_std, tie_word_embeddings=False,
    )
    with preserved_rng(seed):
        return BertForMaskedLM(config)


def answer_logits(model: Any, ids: Tensor, mask: Tensor) -> Tensor:
    r"""(B, V) next-token logits at the last column (every prompt ends there)."""
    return model(input_ids=ids, attention_mask=mask, **padded_positions(model, mask)).logits[:, -1]


@torch.no_grad()
def decoder_accuracy(model: Any, data: ToyText, batch_size: int = 1000) -> float:
    r"""The share of prompts whose argmax next token is the answer."""
    was_training = model.training
    model.eval()
    right = 0
    for start in range(0, len(data), batch_size):
        chunk = slice(start, start + batch_size)
        right += int((answer_logits(model, data.ids[chunk], data.mask[chunk]).argmax(-1) == data.answers[chunk]).sum())
    model.train(was_training)
    return right / len(data)


def train_decoder(
    train: ToyText, valid: ToyText, digits: int, layers: int = 2, hidden: int = 64, heads: int = 4,
    epochs: int = 60, batch_size: int = 64, lr: float = 3e-3, target_accuracy: float = 0.995, seed: int = 0,
    init_std: float = 0.02, log: Optional[Any] = None, architecture: str = "decoder",
) -> Tuple[Any, Dict[str, Any]]:
    r"""
    Trains :func:`toy_decoder` (of ``architecture``) on the answer token (cross-entropy at the last
    column, AdamW, a linear warm-up over the first epoch and a cosine decay), keeping the state of
    the best accuracy on ``valid`` (the examples it stops on: keep them apart from any scored set);
    stops early at ``target_accuracy``.

    Returns:
        *tuple* ``(model in eval mode, info)``, info with ``accuracy``,
        ``epochs`` and ``train_seconds``.
    """
    start = time.perf_counter()
    model = toy_decoder(digits, layers, hidden, heads, seed, init_std, architecture)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01)
    steps_per_epoch = -(-len(train) // batch_size)
    total = steps_per_epoch * epochs
    # a linear warm-up over the first epoch, then a cosine decay to 0 at the last
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: min(1.0, (step + 1) / steps_per_epoch)
                                                 * 0.5 * (1.0 + math.cos(math.pi * min(step, total) / total)))
    best, best_state, epoch = -1.0, None, 0
    with preserved_rng(seed):
        for epoch in range(1, epochs + 1):
            model.train()
            order = torch.randperm(len(train), generator=torch.Generator().manual_seed(seed * 1000 + epoch))
            for index in order.split(batch_size):
                logits = answer_logits(model, train.ids[index], train.mask[index])
                loss = F.cross_entropy(logits, train.answers[index])
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
                schedule.step()
            accuracy = decoder_accuracy(model, valid)
            if log is not None:
                log(f"epoch {epoch}: accuracy {accuracy:.4f} on the examples it stops on")
            if accuracy > best:
                best, best_state = accuracy, copy.deepcopy(model.state_dict())
            if best >= target_accuracy:
                break
    model.load_state_dict(best_state)
    model.eval()
    return model, {"accuracy": best, "epochs": epoch, "train_seconds": time.perf_counter() - start}
