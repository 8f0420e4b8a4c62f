"""The GRU sentiment classifier of De Cao et al. (2020), Section 5: a single-layer
GRU over frozen word embeddings, 5 classes from its last state; its training and
its sites."""

from __future__ import annotations

import copy
from typing import Dict, Iterable, List, Optional, Tuple

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch import Tensor
from tqdm.auto import tqdm

from benchmarks.tasks.sst.encoding import SSTData


class SSTClassifier(nn.Module):
    r"""
    A single-layer GRU sentiment classifier over frozen word embeddings (the
    model of the paper's erasure comparison, with MiniLM vectors in place of
    BERT's):

    .. math::
        x_t = E[w_t], \quad h_t = \mathrm{GRU}(x_t, h_{t-1}), \quad
        \mathrm{logits} = W h_n + b

    with ``E`` frozen and ``h_n`` the state at the last real word.

    Explicit sites for the library (:func:`sst_sites`): ``input`` and
    ``hidden.0`` are the word embeddings (the output of ``embedding``: masking
    the input replaces words), ``hidden.1`` the GRU outputs ``h_t``.

    Args:

        vectors (Tensor): (V, H) the embedding table (row 0 = ``<pad>``).
        hidden_size (int, optional): GRU size. Default: 128
        num_classes (int, optional): Default: 5
        dropout (float, optional): dropout on the embeddings and on ``h_n``
                    while training. Default: 0.3
    """

    def __init__(self, vectors: Tensor, hidden_size: int = 128, num_classes: int = 5, dropout: float = 0.3) -> None:
        super().__init__()
        if not isinstance(vectors, Tensor) or vectors.dim() != 2:
            raise ValueError(f"vectors must be a (V, H) tensor, got {getattr(vectors, 'shape', type(vectors).__name__)}")
        self.embedding = nn.Embedding.from_pretrained(vectors.float(), freeze=True, padding_idx=0)
        self.dropout = nn.Dropout(dropout)
        self.gru = nn.GRU(vectors.shape[1], hidden_size, batch_first=True)
        self.classifier = nn.Linear(hidden_size, num_classes)

    @property
    def embedding_dim(self) -> int:
        return self.embedding.embedding_dim

    def forward(self, ids: Tensor, mask: Optional[Tensor] = None) -> Tensor:
        r"""
        Args:

            ids (Tensor): (B, T) word ids.
            mask (Tensor, optional): (B, T), True at real words, a prefix of each
                        row; all real when None. Default: None

        Returns:
            *Tensor* (B, num_classes) logits.
        """
        x = self.dropout(self.embedding(ids))
        # No packing: the GRU runs left to right, so its state at the last real
        # word does not depend on the pads after it, and a replaced site keeps
        # its shape.
        out, _ = self.gru(x)
        batch, length = ids.shape
        if mask is None:
            lengths = torch.full((batch,), length, device=ids.device)
        else:
            lengths = mask.long().sum(1).clamp(min=1)
        last = (lengths - 1).view(batch, 1, 1).expand(-1, 1, out.shape[-1])
        return self.classifier(self.dropout(out.gather(1, last).squeeze(1)))

    @torch.no_grad()
    def extend_embeddings(self, vectors: Tensor) -> None:
        r"""Appends rows to the frozen embedding table (for words seen only
        outside train; the trained weights are untouched)."""
        if vectors.dim() != 2 or vectors.shape[1] != self.embedding_dim:
            raise ValueError(f"vectors must be (N, {self.embedding_dim}), got {tuple(vectors.shape)}")
        if vectors.shape[0] == 0:
            return
        table = torch.cat([self.embedding.weight, vectors.to(self.embedding.weight)], 0)
        self.embedding.weight = nn.Parameter(table, requires_grad=False)
        self.embedding.num_embeddings = table.shape[0]


def sst_sites(model: SSTClassifier) -> Dict[str, object]:
    r"""
    The sites of :class:`SSTClassifier` in the library's explicit form:
    ``input`` = ``hidden.0`` = the word embeddings (``model.embedding``),
    ``hidden.1`` = the GRU outputs (``model.gru``, its first output).
    Use with ``padding_mask_arg=0`` and ``additional_forward_args=(mask,)``.
    """
    return {"input": model.embedding, "hidden": [model.embedding, model.gru]}


@torch.no_grad()
def predict(model: nn.Module, data: SSTData, batch_size: int = 512) -> Tensor:
    r"""(N,) long predicted classes (the model in eval mode)."""
    model.eval()
    out = [model(ids, mask).argmax(-1) for ids, mask in data.batches(batch_size)]
    return torch.cat(out)


@torch.no_grad()
def peakedness(model: nn.Module, data: SSTData, batch_size: int = 512) -> Dict[str, float]:
    r"""
    How peaked the model's output distributions are on ``data``: what decides
    whether a divergence bound on the output keeps its argmax.

    Returns:
        *dict*: ``max_probability`` (the mean probability of the predicted class),
        ``margin`` (the mean gap between it and the runner-up) and
        ``over_half`` (the share of sentences whose predicted class has
        probability > 0.5), all in [0, 1].
    """
    model.eval()
    probs = torch.cat([torch.softmax(model(ids, mask).float(), -1) for ids, mask in data.batches(batch_size)])
    top = probs.topk(2, dim=-1).values
    return {"max_probability": float(top[:, 0].mean()), "margin": float((top[:, 0] - top[:, 1]).mean()),
            "over_half": float((top[:, 0] > 0.5).float().mean())}


def accuracy(model: nn.Module, data: SSTData, batch_size: int = 512) -> float:
    r"""The share of sentences whose predicted class is the gold label."""
    return float((predict(model, data, batch_size) == data.labels).float().mean())


def mean_word_vector(model: SSTClassifier, data: SSTData) -> Tensor:
    r"""
    The mean word embedding over the real words of ``data`` (each occurrence
    counts, so frequent words weigh more): the fixed baseline that replaces
    erased words in the SST erasure comparison.

    Returns:
        *Tensor* (H,) float32.
    """
    counts = torch.bincount(data.ids[data.mask], minlength=model.embedding.num_embeddings).float()
    return (counts @ model.embedding.weight.float()) / counts.sum().clamp(min=1.0)


def train_sst_classifier(
    train: SSTData,
    dev: SSTData,
    vectors: Tensor,
    *,
    hidden_size: int = 128,
    epochs: int = 20,
    batch_size: int = 64,
    lr: float = 2e-3,
    weight_decay: float = 0.0,
    dropout: float = 0.3,
    seed: int = 0,
    max_steps: Optional[int] = None,
    select: str = "best",
    sort_by_length: bool = False,
    verbose: bool = False,
) -> Tuple[SSTClassifier, float, List[Dict[str, float]]]:
    r"""
    Trains :class:`SSTClassifier` on the sentence labels of ``train`` (Adam,
    cross-entropy; the embeddings stay frozen) and keeps the weights of the epoch
    with the best ``dev`` accuracy (or those of the last epoch).

    Args:

        train (SSTData): training sentences (encoded with the vocabulary whose
                    vectors are ``vectors``).
        dev (SSTData): model-selection sentences.
        vectors (Tensor): (V, H) the embedding table.
        hidden_size, dropout: as in :class:`SSTClassifier`.
        epochs (int, optional): passes over ``train``. Default: 20
        batch_size (int, optional): Default: 64
        lr (float, optional): Adam learning rate. Default: 2e-3
        weight_decay (float, optional): Adam weight decay. Default: 0.0
        seed (int, optional): initialisation and order; the global RNG is
                    restored afterwards. Default: 0
        max_steps (int, optional): stop after this many updates (short runs).
                    Default: None
        select (str, optional): ``"best"``: the epoch with the best dev accuracy;
                    ``"last"``: the last epoch (e.g. for tiny test runs, where a
                    constant prediction can win on a small dev set).
                    Default: ``"best"``
        sort_by_length (bool, optional): batches of sentences of similar length
                    (shuffled buckets, :func:`batch_order`): much less padding
                    when training on the treebank's phrases. Default: False
        verbose (bool, optional): a progress bar over epochs. Default: False

    Returns:
        *tuple* ``(model, dev_accuracy, history)``: the model in eval mode with
        the selected weights, its dev accuracy, and per epoch ``{"epoch",
        "loss", "train_accuracy", "dev_accuracy"}``.
    """
    if select not in ("best", "last"):
        raise ValueError(f"select must be 'best' or 'last', got {select!r}")
    for name, value in (("epochs", epochs), ("batch_size", batch_size)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be an int >= 1, got {value!r}")
    history: List[Dict[str, float]] = []
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = SSTClassifier(vectors, hidden_size=hidden_size, dropout=dropout)
        params = [p for p in model.parameters() if p.requires_grad]
        optimizer = torch.optim.Adam(params, lr=lr, weight_decay=weight_decay)
        best_acc, best_state = -1.0, copy.deepcopy(model.state_dict())
        steps = 0
        progress = tqdm(range(1, epochs + 1), desc="SST GRU", disable=None if verbose else True, leave=False)
        for epoch in progress:
            batches = train.batches(batch_size, shuffle=True, seed=seed * 100_003 + epoch, with_labels=True,
                                    sort_by_length=sort_by_length)
            total, correct, loss_sum, steps = _train_pass(model, batches, optimizer, params, steps, max_steps)
            dev_acc = accuracy(model, dev)
            history.append({"epoch": epoch, "loss": loss_sum / max(total, 1),
                            "train_accuracy": correct / max(total, 1), "dev_accuracy": dev_acc})
            if dev_acc > best_acc or select == "last":
                best_acc, best_state = dev_acc, copy.deepcopy(model.state_dict())
            progress.set_postfix(loss=f"{loss_sum / max(total, 1):.3f}", dev=f"{dev_acc:.3f}")
            if max_steps is not None and steps >= max_steps:
                break
        progress.close()
    model.load_state_dict(best_state)
    model.eval()
    return model, best_acc, history


def _train_pass(
    model: SSTClassifier, batches: Iterable[Tuple[Tensor, ...]], optimizer: torch.optim.Optimizer,
    params: List[nn.Parameter], steps: int, max_steps: Optional[int],
) -> Tuple[int, int, float, int]:
    r"""One pass over the labelled ``batches`` (stopping once ``steps`` reaches
    ``max_steps``): the sentences seen, those predicted right (training mode),
    the summed cross-entropy, and the updates made so far."""
    model.train()
    total, correct, loss_sum = 0, 0, 0.0
    for ids, mask, labels in batches:
        logits = model(ids, mask)
        loss = F.cross_entropy(logits, labels)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        nn.utils.clip_grad_norm_(params, 5.0)
        optimizer.step()
        total += len(labels)
        correct += int((logits.argmax(-1) == labels).sum())
        loss_sum += loss.item() * len(labels)
        steps += 1
        if max_steps is not None and steps >= max_steps:
            break
    return total, correct, loss_sum, steps
