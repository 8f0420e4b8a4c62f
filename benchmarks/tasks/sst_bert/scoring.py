"""Macro-F1 and a model's scores on an encoded split."""

from __future__ import annotations

from typing import Any, Dict, Optional

import torch
import torch.nn as nn
from torch import Tensor


from benchmarks.tasks.sst_bert.encoding import EncodedSST


def macro_f1(predictions: Tensor, labels: Tensor, num_classes: int = 5) -> float:
    r"""
    Macro-averaged F1: the mean over **all** ``num_classes`` classes of
    :func:`class_f1`.

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
    return float(class_f1(predictions, labels, num_classes).mean())


def class_f1(predictions: Tensor, labels: Tensor, num_classes: int = 5, rows: Optional[Tensor] = None) -> Tensor:
    r"""
    Each class's ``F1_c = 2 TP_c / (2 TP_c + FP_c + FN_c)`` (0 where a class has
    no gold and no predicted example).

    Args:

        predictions, labels, num_classes: as :func:`macro_f1`.
        rows (Tensor, optional): (R, N) indices into the N examples: the F1 of
                    each of R resamples of them (a bootstrap), in one pass.
                    Default: None (the examples as given)

    Returns:
        *Tensor* (num_classes,) float64 in [0, 1]; (R, num_classes) with ``rows``.
    """
    predictions, labels = torch.as_tensor(predictions).long().flatten(), torch.as_tensor(labels).long().flatten()
    if predictions.shape != labels.shape:
        raise ValueError(f"predictions and labels must have the same length, got {len(predictions)} and {len(labels)}")
    for name, t in (("predictions", predictions), ("labels", labels)):
        if t.numel() and (int(t.min()) < 0 or int(t.max()) >= num_classes):
            raise ValueError(f"{name} must lie in 0..{num_classes - 1}")
    drawn = torch.arange(len(labels)).unsqueeze(0) if rows is None else rows
    cells = num_classes ** 2
    # one confusion matrix per resample: its cells offset by the resample's index
    index = torch.arange(drawn.shape[0]).unsqueeze(1) * cells + labels[drawn] * num_classes + predictions[drawn]
    confusion = torch.bincount(index.flatten(), minlength=drawn.shape[0] * cells).view(-1, num_classes, num_classes).double()
    tp = confusion.diagonal(dim1=-2, dim2=-1)
    fp = confusion.sum(-2) - tp
    fn = confusion.sum(-1) - tp
    denominator = 2 * tp + fp + fn
    f1 = torch.where(denominator > 0, 2 * tp / denominator.clamp(min=1), torch.zeros_like(tp))
    return f1[0] if rows is None else f1


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
            logits = output_logits(model(input_ids=encoded.input_ids[index, :longest],
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


def output_logits(output: Any) -> Tensor:
    return output.logits if hasattr(output, "logits") else output
