"""Where a model's sites are: found by what its modules are, not by a list of
models. A registry by architecture for the families whose layout is known
(BERT, RoBERTa, XLM-R, ELECTRA, DistilBERT, GPT-2, ALBERT's shared blocks), an
encoder-decoder's encoder, and a generic rule for any Hugging Face-like model:
the input embeddings and the outermost list of blocks (checked afterwards
against the model's own hidden states, :func:`~captum_diffmask.model.site_check.checked_sites`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Tuple, Union

from torch import nn

#: A site given by the user: a module, a dotted path inside the model, or either
#: of those paired with the port ``"output"`` (default) or ``"input"``, and
#: optionally with the index of the module's run in one forward pass.
SiteSpec = Union[nn.Module, str, Tuple[Union[nn.Module, str], str], Tuple[Union[nn.Module, str], str, int]]

#: How to pass sites, for the errors that cannot find or check them.
HOW_TO_PASS_SITES = (
    "Pass them explicitly: sites={'input': <token embedding module or dotted path>, "
    "'hidden': [<module or path whose output is hidden.0>, <block 0>, ..., "
    "<block L-1>]}; use (module, 'input') to read a module's first input instead "
    "of its output."
)


@dataclass(frozen=True)
class ArchitectureSites:
    r"""Where the sites of one Hugging Face architecture live, as dotted paths
    relative to ``model.base_model``.

    ``hidden0`` is ``None`` when ``hidden.0`` is read as the input of the first
    block (e.g. GPT-2 adds position embeddings without an embeddings module).
    """

    input: str
    hidden0: Optional[str]
    blocks: str


#: Registry of architectures by ``config.model_type``.
ARCHITECTURES: Dict[str, ArchitectureSites] = {
    "bert": ArchitectureSites("embeddings.word_embeddings", "embeddings", "encoder.layer"),
    "roberta": ArchitectureSites(
        "embeddings.word_embeddings", "embeddings", "encoder.layer"
    ),
    "xlm-roberta": ArchitectureSites(
        "embeddings.word_embeddings", "embeddings", "encoder.layer"
    ),
    # ELECTRA may project the embeddings (embedding_size != hidden_size), so
    # hidden.0 is read where the blocks receive it.
    "electra": ArchitectureSites("embeddings.word_embeddings", None, "encoder.layer"),
    "distilbert": ArchitectureSites(
        "embeddings.word_embeddings", "embeddings", "transformer.layer"
    ),
    "gpt2": ArchitectureSites("wte", None, "h"),
}


def find_site_specs(model: nn.Module) -> Tuple[SiteSpec, List[SiteSpec]]:
    r"""
    Where the sites of ``model`` are, found by what the modules are: the
    registry by ``config.model_type`` (:data:`ARCHITECTURES`, ALBERT's shared
    blocks), an encoder-decoder's encoder (recognised by its config), else the
    generic rule (the input embeddings and the blocks, :func:`_block_lists`).

    Args:

        model (nn.Module): the analysed model.

    Returns:
        *tuple* ``(input, hidden)``: the spec of the ``input`` site and those of
        ``hidden.0 .. hidden.L``.

    Raises:
        ValueError: when they cannot be found; the message says how to pass them.
    """
    config = getattr(model, "config", None)
    model_type = getattr(config, "model_type", None)
    base = getattr(model, "base_model", model)
    if not isinstance(base, nn.Module):
        base = model
    if model_type == "albert":
        return _albert_sites(base, config)
    arch = ARCHITECTURES.get(model_type) if model_type else None
    if arch is not None:
        try:
            embeddings = base.get_submodule(arch.input)
            blocks = base.get_submodule(arch.blocks)
            hidden0: SiteSpec = base.get_submodule(arch.hidden0) if arch.hidden0 is not None else (blocks[0], "input")
        except AttributeError:
            pass  # a variant with other module names: the generic rule
        else:
            return embeddings, [hidden0] + list(blocks)
    # An encoder-decoder by its config: transformers 5 gives encoder-only
    # models a get_encoder() too (returning themselves or their base).
    get_encoder = getattr(model, "get_encoder", None)
    if getattr(config, "is_encoder_decoder", False) and callable(get_encoder) \
            and isinstance(get_encoder(), nn.Module):
        return _encoder_sites(model, get_encoder())
    return _generic_sites(model)


def _input_embeddings(model: nn.Module) -> Optional[nn.Module]:
    r"""``model.get_input_embeddings()``, or None where the model has none or does
    not implement it (transformers raises NotImplementedError, e.g. for CANINE's
    character hashing)."""
    get_embeddings = getattr(model, "get_input_embeddings", None)
    try:
        embeddings = get_embeddings() if callable(get_embeddings) else None
    except NotImplementedError:
        return None
    if isinstance(embeddings, (nn.ModuleList, nn.Sequential)):
        # one table per codebook (MusicGen's decoders): with one codebook it is
        # the token embedding; with several, a token's input is their sum
        if len(embeddings) != 1:
            raise ValueError(
                f"sites: {type(model).__name__}.get_input_embeddings() gives {len(embeddings)} embedding tables "
                "(one per codebook), whose outputs the model sums; DiffMask gates one (B, T, H) state. "
                + HOW_TO_PASS_SITES
            )
        embeddings = embeddings[0]
    return embeddings if isinstance(embeddings, nn.Module) else None


def _generic_sites(model: nn.Module) -> Tuple[SiteSpec, List[SiteSpec]]:
    r"""The input embeddings (``get_input_embeddings()``) and the model's blocks
    (:func:`_block_lists`)."""
    embeddings = _input_embeddings(model)
    blocks = _block_lists(model, embeddings)
    if embeddings is None or blocks is None:
        missing = (
            "the input embeddings (model.get_input_embeddings())"
            if embeddings is None
            else "a list of blocks (an nn.ModuleList of same-class modules)"
        )
        raise ValueError(f"sites: could not locate {missing} in {type(model).__name__}. " + HOW_TO_PASS_SITES)
    return embeddings, _hidden_specs(*blocks)


def _hidden_specs(first: nn.ModuleList, last: nn.ModuleList) -> List[SiteSpec]:
    r"""``hidden.0`` as the input of the first module of layer 0, ``hidden.k``
    as the output of the last module of layer k-1."""
    return [(first[0], "input")] + list(last)


def _encoder_sites(model: nn.Module, encoder: nn.Module) -> Tuple[SiteSpec, List[SiteSpec]]:
    r"""An encoder-decoder's sites are its encoder's: the embedding module the
    encoder calls (its first run, when the decoder calls the same module) and
    the encoder's blocks; decoder layers only when named explicitly."""
    embeddings = getattr(encoder, "embed_tokens", None)
    if not isinstance(embeddings, nn.Module):
        embeddings = _input_embeddings(encoder)
    blocks = _block_lists(encoder, embeddings)
    if not isinstance(embeddings, nn.Module) or blocks is None:
        raise ValueError(f"sites: could not locate the encoder's embeddings and blocks in {type(model).__name__}. "
                         + HOW_TO_PASS_SITES)
    get_decoder = getattr(model, "get_decoder", None)
    decoder = get_decoder() if callable(get_decoder) else None
    shared = any(m is embeddings for m in decoder.modules()) if isinstance(decoder, nn.Module) else False
    # the encoder runs first, so its embedding lookup is the module's first run
    input_site: SiteSpec = (embeddings, "output", 0) if shared else embeddings
    return input_site, _hidden_specs(*blocks)


def _albert_sites(base: nn.Module, config: Any) -> Tuple[SiteSpec, List[SiteSpec]]:
    r"""ALBERT applies its shared block group L times: ``hidden.k`` is the k-th run
    of the group it uses at layer k-1 (a call-indexed site), ``hidden.0`` the
    projection of the embeddings into the hidden size."""
    encoder = base.get_submodule("encoder")
    layers, groups = int(config.num_hidden_layers), int(config.num_hidden_groups)
    runs: Dict[int, int] = {}
    hidden: List[SiteSpec] = [encoder.get_submodule("embedding_hidden_mapping_in")]
    for i in range(layers):
        group = int(i / (layers / groups))  # as AlbertTransformer picks it
        hidden.append((encoder.albert_layer_groups[group], "output", runs.get(group, 0)))
        runs[group] = runs.get(group, 0) + 1
    return base.get_submodule("embeddings.word_embeddings"), hidden


def _block_lists(
    model: nn.Module, embeddings: Optional[nn.Module]
) -> Optional[Tuple[nn.ModuleList, nn.ModuleList]]:
    r"""
    The lists whose modules start and end each layer: the blocks' list twice,
    or, where a layer's parts sit in parallel lists as long as the config's
    layer count under one parent (XLM's ``attentions``, ``layer_norm1``,
    ``ffns``, ``layer_norm2``), the first and the last of those lists in the
    order the parent registers them (the self-check verifies the order).
    """
    blocks = _block_list(model, embeddings)
    if blocks is None:
        return None
    depth = _config_depth(model)
    parent = next((m for m in model.modules() if any(c is blocks for c in m.children())), None)
    siblings = [c for c in parent.children() if isinstance(c, nn.ModuleList) and len(c) == depth] \
        if parent is not None and len(blocks) == depth else []
    if len(siblings) > 1 and blocks is siblings[0]:
        return siblings[0], siblings[-1]
    return blocks, blocks


def _block_list(model: nn.Module, embeddings: Optional[nn.Module]) -> Optional[nn.ModuleList]:
    r"""
    The model's blocks: of the outermost ``nn.ModuleList`` s that hold either
    modules of one class or as many modules as the config has layers (a hybrid
    stack), the one

    1. with as many blocks as the (text) config has layers (not a list of
       MarkupLM's 50 xpath embeddings);
    2. in the same tower as the input embeddings (the longest shared module
       path: a multimodal model's language model, not its vision tower);
    3. the longest, then the least nested.

    Returns:
        *nn.ModuleList* or None when the model has no such list.
    """
    depth = _config_depth(model)
    lists = [(path, module) for path, module in model.named_modules() if isinstance(module, nn.ModuleList)
             and len(module) > 0 and (len({type(c) for c in module}) == 1 or len(module) == depth)]
    # a list inside another list's element is part of a block (MobileBERT's
    # feed-forward stack), not the blocks
    outermost = [(path, module) for path, module in lists
                 if not any(path.startswith(other + ".") for other, _ in lists)]
    if not outermost:
        return None
    paths = {module: path for path, module in model.named_modules()}
    anchor = paths.get(embeddings, "").split(".") if embeddings is not None else []

    def preference(item: Tuple[str, nn.ModuleList]) -> Tuple[bool, int, int, int]:
        parts = item[0].split(".") if item[0] else []
        shared = next((i for i, (a, b) in enumerate(zip(parts, anchor)) if a != b), min(len(parts), len(anchor)))
        return len(item[1]) == depth, shared, len(item[1]), -len(parts)

    return max(outermost, key=preference)[1]


def _config_depth(model: nn.Module) -> Optional[int]:
    r"""The number of layers the model's (text) config declares, if any."""
    config = getattr(model, "config", None)
    get_text_config = getattr(config, "get_text_config", None)
    if callable(get_text_config):
        try:
            config = get_text_config()
        except Exception:  # a config that cannot say: no preference from it
            pass
    for name in ("num_hidden_layers", "num_layers", "n_layer", "n_layers"):
        try:
            value = getattr(config, name, None)
        except Exception:  # e.g. a per-layer attribute that has no one value
            value = None
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    return None
