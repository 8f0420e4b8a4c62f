"""Token scores pooled into word scores."""

from __future__ import annotations


import torch
from torch import Tensor



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
