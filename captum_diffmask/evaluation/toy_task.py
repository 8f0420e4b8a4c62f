#!/usr/bin/env python3
"""The toy task of De Cao et al. (2020), "How do Decisions Emerge across Layers
in Neural Models? Interpretation with Differentiable Masking", Section 4.

Given a sequence of digits ``x = <x_1, ..., x_t>`` and a query ``<n, m>`` of two
distinct digits, the task is to decide whether ``x`` contains more ``n`` than
``m``. Only the positions holding ``n`` or ``m`` matter, which gives a ground
truth for attributions to the hidden states of the model (the per-position FFNN
output), where the query has already been mixed in.

This module provides the data generator (:func:`generate_toy_data`), the model
of the paper's appendix (:class:`ToyModel`), its training loop
(:func:`train_toy_model`), the sites at which the model is attributed
(:func:`toy_sites`) and the ground truth (:func:`toy_ground_truth`).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Dict, Iterator, List, Optional, Tuple, Union

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch import Tensor
from torch.utils.data import DataLoader, TensorDataset
from tqdm.auto import tqdm

from captum_diffmask.model.rng import preserved_rng


@dataclass(frozen=True)
class ToyData:
    r"""
    A set of toy-task examples, padded to a common length.

    Args:

        ids (Tensor): Digit ids of the sequences, of shape (N, T), dtype long.
                    Padded positions hold id 0, which is also a real digit, so
                    ``mask`` must be used to tell them apart.
        query (Tensor): The queries ``<n, m>``, of shape (N, 2), dtype long.
        mask (Tensor): Of shape (N, T), dtype bool; True at real positions.
                    Real positions form a prefix of each row.
        labels (Tensor): Of shape (N,), dtype float, 1.0 where the sequence
                    holds more ``n`` than ``m`` and 0.0 otherwise.
    """

    ids: Tensor
    query: Tensor
    mask: Tensor
    labels: Tensor

    def __len__(self) -> int:
        return self.ids.shape[0]

    def subset(self, index: Tensor) -> ToyData:
        r"""
        Args:

            index (Tensor): Indices (long, of shape (K,)) or a boolean mask (of
                        shape (N,)) selecting the examples to keep.

        Returns:
            ToyData: The selected examples, in the order of ``index``.
        """
        return ToyData(
            ids=self.ids[index],
            query=self.query[index],
            mask=self.mask[index],
            labels=self.labels[index],
        )

    def split(self, holdout_fraction: float, seed: int = 0) -> Tuple[ToyData, ToyData]:
        r"""
        Randomly splits the examples into two disjoint sets.

        Args:

            holdout_fraction (float): Share of the examples put in the second
                        (held-out) set, in (0, 1). The held-out size is
                        ``round(N * holdout_fraction)``.
            seed (int, optional): Seed of the random permutation.
                        Default: 0

        Returns:
            tuple[ToyData, ToyData]: ``(rest, holdout)``.
        """
        if not 0.0 < holdout_fraction < 1.0:
            raise ValueError(
                f"holdout_fraction must be in (0, 1), got {holdout_fraction}"
            )
        num_holdout = int(round(len(self) * holdout_fraction))
        if num_holdout == 0 or num_holdout == len(self):
            raise ValueError(
                f"holdout_fraction={holdout_fraction} leaves one of the two sets "
                f"of {len(self)} examples empty"
            )
        generator = torch.Generator().manual_seed(seed)
        perm = torch.randperm(len(self), generator=generator)
        return self.subset(perm[num_holdout:]), self.subset(perm[:num_holdout])

    def batches(
        self, batch_size: int, shuffle: bool = False, seed: int = 0
    ) -> Iterator[Tuple[Tensor, Tensor, Tensor]]:
        r"""
        Iterates over the examples in batches, in the
        ``(inputs, *additional_forward_args)`` form of :meth:`ToyModel.forward`.

        Args:

            batch_size (int): Number of examples per batch; the last batch may
                        be smaller.
            shuffle (bool, optional): Whether to visit the examples in a random
                        order. Default: False
            seed (int, optional): Seed of that order, used only when
                        ``shuffle`` is True. Default: 0

        Yields:
            tuple[Tensor, Tensor, Tensor]: ``(ids, query, mask)`` of shapes
            (B, T), (B, 2) and (B, T).
        """
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        if shuffle:
            generator = torch.Generator().manual_seed(seed)
            order = torch.randperm(len(self), generator=generator)
        else:
            order = torch.arange(len(self))
        for start in range(0, len(self), batch_size):
            index = order[start : start + batch_size]
            yield self.ids[index], self.query[index], self.mask[index]

    def loader(
        self, batch_size: int, shuffle: bool = False, seed: int = 0
    ) -> DataLoader:
        r"""
        Args:

            batch_size (int): Number of examples per batch.
            shuffle (bool, optional): Whether to visit the examples in a random
                        order. Default: False
            seed (int, optional): Seed of that order. Default: 0

        Returns:
            DataLoader: Over ``TensorDataset(ids, query, mask)``; each batch is
            a list ``[ids, query, mask]`` of shapes (B, T), (B, 2) and (B, T).
        """
        # A dedicated generator keeps the order reproducible without touching
        # the global RNG.
        generator = torch.Generator().manual_seed(seed) if shuffle else None
        return DataLoader(
            TensorDataset(self.ids, self.query, self.mask),
            batch_size=batch_size,
            shuffle=shuffle,
            generator=generator,
        )


def generate_toy_data(
    num_examples: int = 10_000,
    vocab_size: int = 10,
    max_length: int = 10,
    seed: int = 0,
) -> ToyData:
    r"""
    Samples toy-task examples as in Appendix "Hyperparameters > Toy task" of
    the paper.

    Per example, the query ``<n, m>`` is a uniformly drawn pair of distinct
    digits, and the length is uniform in ``{1, ..., max_length}``. Each element
    is drawn independently: with probability 0.5 uniformly from ``{n, m}``,
    otherwise uniformly from the other ``vocab_size - 2`` digits. The label is
    ``#n > #m`` counted over the real positions.

    Args:

        num_examples (int, optional): Number of examples N. Default: 10000
        vocab_size (int, optional): Number of digits V; at least 3 so that
                    there is a digit outside the query. Default: 10
        max_length (int, optional): Maximum sequence length T. Default: 10
        seed (int, optional): Seed of the generator. Default: 0

    Returns:
        ToyData: ``ids`` (N, T) long, padded with id 0; ``query`` (N, 2) long;
        ``mask`` (N, T) bool; ``labels`` (N,) float.
    """
    if num_examples < 1:
        raise ValueError(f"num_examples must be >= 1, got {num_examples}")
    if vocab_size < 3:
        raise ValueError(f"vocab_size must be >= 3, got {vocab_size}")
    if max_length < 1:
        raise ValueError(f"max_length must be >= 1, got {max_length}")

    g = torch.Generator().manual_seed(seed)
    N, T, V = num_examples, max_length, vocab_size

    # m = n + an offset in 1..V-1 (mod V) is uniform over the digits != n, so
    # the pair is uniform over ordered pairs of distinct digits.
    n = torch.randint(0, V, (N, 1), generator=g)
    m = (n + torch.randint(1, V, (N, 1), generator=g)) % V
    lengths = torch.randint(1, T + 1, (N, 1), generator=g)

    from_query = torch.rand(N, T, generator=g) < 0.5
    pick_n = torch.rand(N, T, generator=g) < 0.5
    query_digit = torch.where(pick_n, n, m)
    # A uniform draw over 0..V-3, shifted past the two query digits in
    # increasing order, is uniform over the V-2 other digits.
    lo, hi = torch.minimum(n, m), torch.maximum(n, m)
    other = torch.randint(0, V - 2, (N, T), generator=g)
    other = other + (other >= lo).long()
    other = other + (other >= hi).long()
    ids = torch.where(from_query, query_digit, other)

    mask = torch.arange(T).unsqueeze(0) < lengths
    count_n = ((ids == n) & mask).sum(1)
    count_m = ((ids == m) & mask).sum(1)
    labels = (count_n > count_m).float()
    # Pads get a real id on purpose: a model (or an attribution) that ignores
    # the mask is then wrong rather than silently right.
    ids = ids.masked_fill(~mask, 0)

    return ToyData(ids=ids, query=torch.cat([n, m], dim=1), mask=mask, labels=labels)


class ToyModel(nn.Module):
    r"""
    The toy-task classifier of the paper's appendix:

    .. math::
        h^{(1)}_i = \mathrm{FFNN}([n'; m'; x'_i]), \quad
        h^{(2)}_i = \mathrm{GRU}(h^{(1)}_i, h^{(2)}_{i-1}), \quad
        y = w^\top h^{(2)}_t + b

    where ``n', m'`` come from a query embedding and ``x'_i`` from an input
    embedding, and the FFNN is ``[3 * embedding_dim -> hidden_size, tanh,
    state_size]``.

    The input embeddings and the FFNN output are computed by calling the
    submodules ``embed_input`` and ``encoder``, so forward hooks on them can
    read and replace those states (see :func:`toy_sites`).

    Args:

        vocab_size (int, optional): Number of digits V. Default: 10
        embedding_dim (int, optional): Size of both embeddings. Default: 64
        hidden_size (int, optional): Hidden size of the FFNN and of the GRU.
                    Default: 64
        state_size (int, optional): Size of the FFNN output (the GRU input).
                    Default: 2
    """

    def __init__(
        self,
        vocab_size: int = 10,
        embedding_dim: int = 64,
        hidden_size: int = 64,
        state_size: int = 2,
    ) -> None:
        super().__init__()
        self.embed_query = nn.Embedding(vocab_size, embedding_dim)
        self.embed_input = nn.Embedding(vocab_size, embedding_dim)
        self.encoder = nn.Sequential(
            nn.Linear(3 * embedding_dim, hidden_size),
            nn.Tanh(),
            nn.Linear(hidden_size, state_size),
        )
        self.gru = nn.GRU(state_size, hidden_size, batch_first=True)
        self.head = nn.Linear(hidden_size, 1)

    def forward(
        self, ids: Tensor, query: Tensor, mask: Optional[Tensor] = None
    ) -> Tensor:
        r"""
        Args:

            ids (Tensor): Digit ids, of shape (B, T), dtype long.
            query (Tensor): Queries ``<n, m>``, of shape (B, 2), dtype long.
            mask (Tensor, optional): Of shape (B, T), True at real positions,
                        which must form a prefix of each row. None means all
                        positions are real. Default: None

        Returns:
            Tensor: The logit of ``#n > #m``, of shape (B,).
        """
        batch_size, seq_len = ids.shape
        x = self.embed_input(ids)  # (B, T, d)
        q = self.embed_query(query).reshape(batch_size, 1, -1)  # (B, 1, 2d)
        q = q.expand(-1, x.shape[1], -1)
        h = self.encoder(torch.cat([q, x], dim=-1))  # (B, T, state_size)
        # No packing: the GRU is unidirectional, so its output at the last real
        # position does not depend on the pads after it. Running over the full
        # padded batch keeps hooked (possibly replaced) states intact.
        out, _ = self.gru(h)  # (B, T, hidden)
        if mask is None:
            lengths = torch.full((batch_size,), seq_len, device=ids.device)
        else:
            lengths = mask.long().sum(1).clamp(min=1)
        last = (lengths - 1).view(batch_size, 1, 1).expand(-1, 1, out.shape[-1])
        return self.head(out.gather(1, last).squeeze(1)).squeeze(-1)


def toy_sites(model: ToyModel) -> Dict[str, Union[nn.Module, List[nn.Module]]]:
    r"""
    The sites at which the toy model is attributed, in the library's explicit
    form.

    Args:

        model (ToyModel): The model.

    Returns:
        dict: ``"input"``: the token embeddings (``embed_input``);
        ``"hidden"``: ``[embed_input, encoder]``, i.e. ``hidden.0`` is the
        embeddings and ``hidden.1`` the FFNN output, the state the paper
        attributes to.
    """
    return {
        "input": model.embed_input,
        "hidden": [model.embed_input, model.encoder],
    }


def toy_ground_truth(ids: Tensor, query: Tensor, mask: Tensor) -> Tensor:
    r"""
    The paper's ground truth for attributions at the FFNN output: the real
    positions holding either query digit.

    Args:

        ids (Tensor): Digit ids, of shape (N, T).
        query (Tensor): Queries ``<n, m>``, of shape (N, 2).
        mask (Tensor): Of shape (N, T), True at real positions.

    Returns:
        Tensor: Of shape (N, T), dtype float; 1.0 where a real position holds
        ``n`` or ``m`` and 0.0 elsewhere.
    """
    hit = (ids == query[:, 0:1]) | (ids == query[:, 1:2])
    return (hit & mask.bool()).float()


@torch.no_grad()
def accuracy(model: nn.Module, data: ToyData, batch_size: int = 1024) -> float:
    r"""
    Args:

        model (nn.Module): A model mapping ``(ids, query, mask)`` to logits of
                    shape (B,). It is put in eval mode.
        data (ToyData): The examples.
        batch_size (int, optional): Evaluation batch size. Default: 1024

    Returns:
        float: The share of examples where ``logit > 0`` matches the label.
    """
    model.eval()
    device = next(model.parameters()).device
    correct = 0
    start = 0
    for ids, query, mask in data.batches(batch_size):
        logits = model(ids.to(device), query.to(device), mask.to(device))
        labels = data.labels[start : start + ids.shape[0]].to(device)
        correct += int(((logits > 0).float() == labels).sum())
        start += ids.shape[0]
    return correct / len(data)


def _train_epoch(model: ToyModel, optimizer: torch.optim.Optimizer, train: ToyData, batch_size: int, seed: int) -> float:
    r"""One pass over ``train`` in an order drawn from ``seed`` (reproducible, and
    independent of how many epochs ran before); the last batch's loss."""
    model.train()
    order = torch.randperm(len(train), generator=torch.Generator().manual_seed(seed))
    loss = torch.zeros(())
    for start in range(0, len(train), batch_size):
        index = order[start : start + batch_size]
        logits = model(train.ids[index], train.query[index], train.mask[index])
        loss = F.binary_cross_entropy_with_logits(logits, train.labels[index])
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
    return float(loss.item())


def train_toy_model(
    train: ToyData,
    valid: Optional[ToyData] = None,
    *,
    epochs: int = 40,
    batch_size: int = 128,
    lr: float = 5e-3,
    seed: int = 0,
    embedding_dim: int = 64,
    hidden_size: int = 64,
    target_accuracy: float = 0.995,
    verbose: bool = False,
) -> Tuple[ToyModel, float]:
    r"""
    Trains a :class:`ToyModel` with Adam on the binary cross-entropy.

    The defaults (lr 5e-3, stopping at 99.5 % validation accuracy) reach that
    accuracy in about 7-14 epochs on the paper's 9k/1k split; 2e-2 stalls around
    98.5 %. The authors' loss also subtracts an entropy term taken across the
    batch (their logits have shape (B,)); it is left out here.

    Args:

        train (ToyData): training examples.
        valid (ToyData, optional): validation examples, for early stopping and
                    the returned accuracy; ``train`` when None. Default: None
        epochs (int, optional): the most epochs. Default: 40
        batch_size (int, optional): Default: 128
        lr (float, optional): Adam's learning rate. Default: 5e-3
        seed (int, optional): seeds the initialisation and the shuffling (the
                    caller's global RNG is left as found). Default: 0
        embedding_dim, hidden_size (int, optional): the model's sizes. Default: 64
        target_accuracy (float, optional): stop at the first epoch end with at
                    least this validation accuracy. Default: 0.995
        verbose (bool, optional): a progress bar over epochs. Default: False

    Returns:
        *tuple* ``(model, accuracy)``: the weights that scored best on ``valid``
        at an epoch end (in eval mode), and that accuracy.
    """
    eval_data = train if valid is None else valid
    # The digits are 0..V-1 and both query digits occur in every example, so
    # the largest id seen gives V.
    vocab_size = 1 + max(int(t.max()) for t in (train.ids, train.query, eval_data.ids, eval_data.query))
    with preserved_rng(seed):
        model = ToyModel(vocab_size, embedding_dim=embedding_dim, hidden_size=hidden_size)
        optimizer = torch.optim.Adam(model.parameters(), lr=lr)
        progress = tqdm(range(epochs), desc="toy model", disable=not verbose)
        # Validation accuracy fluctuates by a point or so between epochs, so the
        # best weights seen are kept rather than those of the last epoch.
        best_acc = accuracy(model, eval_data)
        best_state = copy.deepcopy(model.state_dict())
        for epoch in progress:
            loss = _train_epoch(model, optimizer, train, batch_size, seed * 100_003 + epoch)
            acc = accuracy(model, eval_data)
            if acc > best_acc:
                best_acc, best_state = acc, copy.deepcopy(model.state_dict())
            progress.set_postfix(loss=loss, acc=f"{acc:.4f}")
            if acc >= target_accuracy:
                break
        progress.close()

    model.load_state_dict(best_state)
    model.eval()
    return model, best_acc
