"""Fine-tuning (AdamW, linear warm-up and decay, a fixed number of epochs, the last
kept)."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Tuple

import torch
import torch.nn as nn
import torch.nn.functional as F
from tqdm.auto import tqdm


from benchmarks.tasks.sst_bert.encoding import EncodedSST
from benchmarks.tasks.sst_bert.scoring import evaluate, output_logits


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
    the sentence labels) for ``epochs`` epochs and keeps the last: the number of
    epochs is fixed in advance, so no epoch is chosen on the sentences a suite
    then scores (``dev`` is evaluated after every epoch, for the record only).

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
        dev (EncodedSST): sentences scored after every epoch (the history's
                    ``dev_*`` figures); nothing is chosen on them.
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
        weights the model holds on return: the last). The model is left in eval
        mode.
    """
    _check_fine_tune(train, dev, epochs, batch_size, warmup)
    optimizer, parameters = bert_adamw(model, lr, weight_decay)
    scheduler = warmup_then_decay(optimizer, epochs * -(-len(train) // batch_size), warmup)
    run = _FineTuning(model, train, dev, optimizer, scheduler, parameters, max_grad_norm, batch_size, epochs, seed, verbose)
    history: List[Dict[str, Any]] = []
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        for epoch in range(1, epochs + 1):
            history.append({**run.epoch(epoch), "selected": epoch == epochs})
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
            logits = output_logits(self.model(input_ids=ids, attention_mask=mask))
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
