r"""Transformers compiled by tracr (Lindner et al. 2023) from RASP programs, as
PyTorch modules, with the components each program uses.

tracr compiles a RASP program into the weights of a transformer in which every
computation has a known place: an attention head or an MLP of a given layer. That
assignment is a ground truth that no one here wrote, for methods that say which
heads and MLP units a model needs (``docs`` of the components work). tracr runs on
JAX; :func:`convert` copies a compiled model's weights into
:class:`TracrTransformer`, a plain PyTorch module whose per-head outputs (before
the output projection) and MLP units pass through named identity modules
(``heads``, ``units``), where hooks can read or replace them.

tracr is the ``components`` extra (``pip install -e ".[components]"``, which pulls
JAX); :func:`compile_program` says so when it is missing.
"""

from __future__ import annotations

import argparse
import math
import sys
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np
import torch
from torch import nn, Tensor

#: The library programs compiled here: name -> (what it computes, vocabulary, maximum length).
PROGRAMS: Dict[str, Tuple[str, Tuple[Any, ...], int]] = {
    "frac_prevs": ("the fraction of the tokens so far that are 'x' (numerical)", ("x", "y", "z"), 6),
    "sort_unique": ("the tokens sorted (categorical; the tokens are distinct)", (1, 2, 3, 4, 5), 5),
    "hist": ("how often each token occurs in the sequence (categorical)", ("a", "b", "c"), 6),
    # three with heads and units that the program leaves unused (tracr gives every
    # layer as many heads and units as its busiest one needs)
    "reverse": ("the tokens reversed (categorical)", ("a", "b", "c"), 5),
    "sort": ("the tokens sorted, repeats allowed (categorical)", (1, 2, 3, 4), 5),
    "sort_freq": ("the tokens sorted by how often they occur, most frequent first (categorical)", ("a", "b", "c"), 5),
    # development programs (unused heads and units too): the component modes'
    # settings are chosen on these, never on the programs a report scores
    "palindrome": ("whether each token equals its mirror image (categorical)", ("a", "b", "c"), 5),
    "sort_desc": ("the tokens sorted, largest first (categorical; the tokens are distinct)", (1, 2, 3, 4, 5), 5),
    "reverse_sorted": ("the tokens sorted, then reversed (categorical; the tokens are distinct)", (1, 2, 3, 4, 5), 5),
    "sort_freq_asc": ("the tokens sorted by how often they occur, least frequent first (categorical)", ("a", "b", "c"), 5),
}
#: The programs whose inputs hold each token at most once.
DISTINCT_TOKENS = ("sort_unique", "sort_desc", "reverse_sorted")
#: The programs the component modes' settings are chosen on (never reported).
DEVELOPMENT_PROGRAMS = ("palindrome", "sort_desc", "reverse_sorted", "sort_freq_asc")


def _program(name: str) -> Any:
    from tracr.compiler import lib
    from tracr.rasp import rasp

    if name == "frac_prevs":
        return lib.make_frac_prevs(rasp.tokens == "x")
    if name == "sort_unique":
        return lib.make_sort_unique(rasp.tokens, rasp.tokens)
    if name == "hist":
        return lib.make_hist()
    if name == "reverse":
        return lib.make_reverse(rasp.tokens)
    if name == "sort":
        return lib.make_sort(rasp.tokens, rasp.tokens, max_seq_len=PROGRAMS[name][2], min_key=1)
    if name == "sort_freq":
        return lib.make_sort_freq(max_seq_len=PROGRAMS[name][2])
    if name == "palindrome":
        return rasp.categorical(rasp.SequenceMap(lambda x, y: x == y, rasp.tokens, lib.make_reverse(rasp.tokens)))
    if name == "sort_desc":
        return lib.make_sort_unique(rasp.tokens, rasp.categorical(rasp.Map(lambda x: -x, rasp.tokens)))
    if name == "reverse_sorted":
        return lib.make_reverse(lib.make_sort_unique(rasp.tokens, rasp.tokens))
    if name == "sort_freq_asc":
        return lib.make_sort(rasp.tokens, lib.make_hist(), max_seq_len=PROGRAMS[name][2], min_key=1)
    raise KeyError(f"name must be one of {sorted(PROGRAMS)}, got {name!r}")


def compile_program(name: str) -> Any:
    r"""
    Compiles one of :data:`PROGRAMS` with tracr.

    Args:

        name (str): a key of :data:`PROGRAMS`.

    Returns:
        tracr's ``AssembledTransformerModel`` (BOS token ``"BOS"``).

    Raises:
        ImportError: tracr is not installed (the ``components`` extra).
    """
    try:
        from tracr.compiler import compiling
    except ImportError as error:  # pragma: no cover - depends on the environment
        raise ImportError("tracr is not installed: pip install -e \".[components]\" (tracr-pypi, JAX)") from error
    _, vocabulary, max_length = PROGRAMS[name]
    return compiling.compile_rasp_to_model(_program(name), vocab=set(vocabulary), max_seq_len=max_length,
                                           compiler_bos="BOS")


@dataclass
class TracrWeights:
    r"""A compiled model's weights and shape, free of JAX (numpy arrays).

    Attributes:
        num_layers, num_heads, key_size, mlp_hidden (int): the model's shape
                    (every layer has an attention block and an MLP).
        causal (bool): causal attention.
        arrays (dict): haiku's parameter names -> ``{"w": ..., "b": ...}`` or
                    ``{"embeddings": ...}``.
        unembed (np.ndarray): (D, O) the residual read out as the output space.
        categorical (bool): the output is the argmax over O (else O = 1, a number).
        vocabulary (dict): input token -> id (BOS included).
    """

    num_layers: int
    num_heads: int
    key_size: int
    mlp_hidden: int
    causal: bool
    arrays: Dict[str, Dict[str, np.ndarray]]
    unembed: np.ndarray
    categorical: bool
    vocabulary: Dict[Any, int]


def weights_of(assembled: Any) -> TracrWeights:
    r"""The weights of a tracr ``AssembledTransformerModel`` (needs tracr)."""
    import haiku as hk
    import jax.numpy as jnp

    config = assembled.model_config
    if config.layer_norm:
        raise ValueError("assembled: compiled with layer norm, which the converter does not model")
    width = len(assembled.residual_labels)

    @hk.without_apply_rng
    @hk.transform
    def read_out(x: Any) -> Any:
        return assembled.get_compiled_model().unembed(x, use_unembed_argmax=False)

    unembed = np.asarray(read_out.apply(assembled.params, jnp.eye(width))).reshape(width, -1)
    categorical = _is_categorical(assembled)
    arrays = {name: {key: np.asarray(value) for key, value in group.items()} for name, group in assembled.params.items()}
    return TracrWeights(config.num_layers, config.num_heads, config.key_size, config.mlp_hidden_size,
                        bool(config.causal), arrays, unembed, categorical,
                        dict(assembled.input_encoder.encoding_map))


def _is_categorical(assembled: Any) -> bool:
    r"""Whether the output is decoded by an argmax (a categorical output encoder)."""
    from tracr.transformer import encoder

    return isinstance(assembled.output_encoder, encoder.CategoricalEncoder)


class TracrAttention(nn.Module):
    r"""tracr's multi-head attention: ``softmax(q k^T / sqrt(K))`` over the
    unmasked keys, per-head outputs (B, T, H, K) through :attr:`heads`, then the
    output projection."""

    def __init__(self, width: int, num_heads: int, key_size: int) -> None:
        super().__init__()
        self.num_heads, self.key_size = num_heads, key_size
        self.query = nn.Linear(width, num_heads * key_size)
        self.key = nn.Linear(width, num_heads * key_size)
        self.value = nn.Linear(width, num_heads * key_size)
        self.heads = nn.Identity()  # (B, T, H, K): where a head's output can be read or replaced
        self.linear = nn.Linear(num_heads * key_size, width)

    def forward(self, x: Tensor, allowed: Tensor) -> Tensor:
        batch, length, _ = x.shape
        split = lambda t: t.view(batch, length, self.num_heads, self.key_size)  # noqa: E731
        q, k, v = split(self.query(x)), split(self.key(x)), split(self.value(x))
        logits = torch.einsum("bthd,bshd->bhts", q, k) / math.sqrt(self.key_size)
        logits = logits.masked_fill(~allowed.unsqueeze(1), -1e30)
        heads = torch.einsum("bhts,bshd->bthd", logits.softmax(-1), v)
        return self.linear(self.heads(heads).reshape(batch, length, -1))


class TracrMLP(nn.Module):
    r"""tracr's MLP: ``linear_2(relu(linear_1(x)))``, the units (B, T, U) through :attr:`units`."""

    def __init__(self, width: int, hidden: int) -> None:
        super().__init__()
        self.linear_1, self.linear_2 = nn.Linear(width, hidden), nn.Linear(hidden, width)
        self.units = nn.Identity()

    def forward(self, x: Tensor) -> Tensor:
        return self.linear_2(self.units(torch.relu(self.linear_1(x))))


class TracrLayer(nn.Module):
    r"""One layer: attention then MLP, each added to the residual stream (no layer norm)."""

    def __init__(self, width: int, weights: TracrWeights) -> None:
        super().__init__()
        self.attention = TracrAttention(width, weights.num_heads, weights.key_size)
        self.mlp = TracrMLP(width, weights.mlp_hidden)

    def forward(self, x: Tensor, allowed: Tensor) -> Tensor:
        x = x + self.attention(x, allowed)
        return x + self.mlp(x)


class TracrTransformer(nn.Module):
    r"""
    A tracr-compiled transformer in PyTorch (:func:`convert`).

    ``forward(ids, mask=None)`` returns (B, T, O): the residual stream read out as
    the output space (a categorical program's prediction is the argmax over O; a
    numerical one's O = 1 is its value). ``layers[l].attention.heads`` and
    ``layers[l].mlp.units`` are identity modules on the per-head outputs and the
    MLP units.
    """

    def __init__(self, weights: TracrWeights) -> None:
        super().__init__()
        width = weights.arrays["token_embed"]["embeddings"].shape[1]
        self.causal, self.categorical, self.vocabulary = weights.causal, weights.categorical, dict(weights.vocabulary)
        self.token_embed = nn.Embedding(*weights.arrays["token_embed"]["embeddings"].shape)
        self.position_embed = nn.Embedding(*weights.arrays["pos_embed"]["embeddings"].shape)
        self.layers = nn.ModuleList(TracrLayer(width, weights) for _ in range(weights.num_layers))
        self.unembed = nn.Linear(width, weights.unembed.shape[1], bias=False)
        self._load(weights)

    @torch.no_grad()
    def _load(self, weights: TracrWeights) -> None:
        copy = lambda target, array: target.copy_(torch.from_numpy(np.array(array, dtype=np.float32)))  # noqa: E731
        copy(self.token_embed.weight, weights.arrays["token_embed"]["embeddings"])
        copy(self.position_embed.weight, weights.arrays["pos_embed"]["embeddings"])
        copy(self.unembed.weight, weights.unembed.T)
        for index, layer in enumerate(self.layers):
            modules = {"attn/query": layer.attention.query, "attn/key": layer.attention.key,
                       "attn/value": layer.attention.value, "attn/linear": layer.attention.linear,
                       "mlp/linear_1": layer.mlp.linear_1, "mlp/linear_2": layer.mlp.linear_2}
            for name, module in modules.items():
                group = weights.arrays[f"transformer/layer_{index}/{name}"]
                copy(module.weight, group["w"].T)  # haiku's (in, out) is torch's (out, in) transposed
                copy(module.bias, group["b"])

    def get_input_embeddings(self) -> nn.Embedding:
        r"""The token embedding (where the library finds a model's input site)."""
        return self.token_embed

    def encode(self, tokens: List[Any]) -> Tensor:
        r"""(1, T) ids of a token list that starts with ``"BOS"``."""
        return torch.tensor([[self.vocabulary[token] for token in tokens]])

    def forward(self, ids: Tensor, mask: Optional[Tensor] = None) -> Tensor:
        length = ids.shape[1]
        keys = torch.ones_like(ids, dtype=torch.bool) if mask is None else mask.bool()
        allowed = keys.unsqueeze(1).expand(-1, length, -1)  # (B, T, T): query t may read key s
        if self.causal:
            allowed = allowed & torch.ones(length, length, dtype=torch.bool, device=ids.device).tril()
        x = self.token_embed(ids) + self.position_embed(torch.arange(length, device=ids.device))
        for layer in self.layers:
            x = layer(x, allowed)
        return self.unembed(x)


def convert(assembled: Any) -> TracrTransformer:
    r"""A PyTorch copy of a tracr ``AssembledTransformerModel`` (needs tracr)."""
    return TracrTransformer(weights_of(assembled)).eval()


def used_components(weights: TracrWeights, tolerance: float = 0.0) -> Dict[str, np.ndarray]:
    r"""
    The components the compiled program uses: a head is used when any of its
    query, key, value or output weights is non-zero, an MLP unit when its input
    or output weights are (tracr leaves every other weight at zero).

    Returns:
        *dict*: ``heads`` (L, H) bool and ``units`` (L, U) bool.
    """
    heads = np.zeros((weights.num_layers, weights.num_heads), dtype=bool)
    units = np.zeros((weights.num_layers, weights.mlp_hidden), dtype=bool)
    size = weights.key_size
    for layer in range(weights.num_layers):
        w = {part: weights.arrays[f"transformer/layer_{layer}/{part}"]["w"]
             for part in ("attn/query", "attn/key", "attn/value", "attn/linear", "mlp/linear_1", "mlp/linear_2")}
        for head in range(weights.num_heads):
            columns = slice(head * size, (head + 1) * size)
            parts = [w[p][:, columns] for p in ("attn/query", "attn/key", "attn/value")] + [w["attn/linear"][columns]]
            heads[layer, head] = any(np.abs(p).max() > tolerance for p in parts)
        units[layer] = (np.abs(w["mlp/linear_1"]).max(0) > tolerance) | (np.abs(w["mlp/linear_2"]).max(1) > tolerance)
    return {"heads": heads, "units": units}


def study_arguments(description: str, programs: Sequence[str], argv: Sequence[str],
                    add: Optional[Callable[[argparse.ArgumentParser], None]] = None) -> Tuple[argparse.Namespace, List[str]]:
    r"""
    A tracr study's command line: ``--programs`` (default ``programs``; a name
    that is not in :data:`PROGRAMS` is an error that names it), ``--kinds``,
    ``--markdown``, and the study's own arguments (``add(parser)``).

    Returns:
        *tuple* ``(args, arguments)``: the parsed arguments and the command
        line's arguments as given (``argv``, or ``sys.argv[1:]`` when empty).
    """
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--programs", nargs="+", default=list(programs))
    parser.add_argument("--kinds", nargs="+", default=["heads", "units"])
    parser.add_argument("--markdown", default=None, help="write the report here")
    if add is not None:
        add(parser)
    arguments = list(argv) or sys.argv[1:]
    args = parser.parse_args(arguments)
    unknown = [p for p in args.programs if p not in PROGRAMS]
    if unknown:
        parser.error(f"--programs: {unknown} are not tracr programs here {sorted(PROGRAMS)}")
    return args, arguments
