"""The MiniLM suites' attributions: any method over a data set sentence by
sentence, and the comparison methods set up."""

from __future__ import annotations

from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

import torch
from torch import Tensor

from benchmarks.tasks.sst_bert import EncodedSST

from benchmarks.methods import MethodContext, prepare, PreparedMethod
from benchmarks.progress import bar


def per_sentence(data: EncodedSST, batch_size: int, fn: Callable[..., Tensor], verbose: bool = False,
                  desc: str = "", device: Optional[torch.device] = None, extra: Sequence[str] = ()) -> List[Tensor]:
    r"""``fn(ids, mask, *extra) -> (B, T[, L])`` over ``data`` in length-sorted
    batches (moved to ``device`` when given); one CPU tensor per sentence (its
    real tokens only), in row order. ``extra`` names further (N, T) tensors of
    ``data`` cut and passed the same way (e.g. ``"token_type_ids"``)."""
    lengths = data.attention_mask.sum(1)
    order = torch.argsort(lengths, stable=True)
    out: List[Optional[Tensor]] = [None] * len(data)
    for start in bar(range(0, len(data), batch_size), verbose, desc=desc):
        rows = order[start : start + batch_size]
        longest = int(lengths[rows].max())
        tensors = [getattr(data, name)[rows, :longest] for name in ("input_ids", "attention_mask", *extra)]
        if device is not None:
            tensors = [t.to(device) for t in tensors]
        scores = fn(*tensors).detach().float().cpu()
        for i, row in enumerate(rows.tolist()):
            out[row] = scores[i, : int(lengths[row])]
    return out  # type: ignore[return-value]


def attribute_at(method: Any, ids: Tensor, mask: Tensor, layer: int) -> Tensor:
    r"""``method``'s (B, T) attributions at ``layer``: a prepared method or any
    Captum-style explainer (``attribute(ids, additional_forward_args=(mask,), layer=...)``)."""
    if isinstance(method, PreparedMethod):
        return method.attribute(ids, (mask,), layer)
    return method.attribute(ids, additional_forward_args=(mask,), layer=layer)


def prepare_method(
    name: str, options: Mapping[str, Any], record: Dict[str, Any], ctx: MethodContext, layers: int
) -> Tuple[Any, float]:
    r"""
    One comparison method set up at the last layer through
    :func:`benchmarks.methods.prepare` (the bottleneck's statistics estimated at
    every layer, for the heatmaps).

    Args:

        name (str): a registered method's name.
        options (Mapping): its options.
        record (dict): its record.
        ctx (MethodContext): the model, its training data and the seed.
        layers (int): the model's number of blocks.

    Returns:
        *tuple* ``(method, setup seconds)``; errors propagate.
    """
    handle = prepare(name, ctx, options)
    if name == "PerSampleBottleneck":  # statistics of every layer, for the heatmaps
        for k in range(layers):
            handle.explainer.fit_statistics(ctx.train_loader(int(options.get("batch_size", 64)), ctx.seed),
                                            layer=k, max_batches=options.get("max_batches"))
    return handle, handle.setup_seconds
