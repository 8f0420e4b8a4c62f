"""Where a model's components are: each block's attention heads and MLP units, as
sites that can be read and gated.

A block's **heads** are read where their outputs lie side by side, the input of
the attention's output projection ((B, T, heads * head_dim): BERT's
``attention.output.dense``, GPT-2's ``attn.c_proj``, Llama's ``self_attn.o_proj``);
its **units** are the activations its MLP's down projection reads ((B, T, U):
BERT's ``output.dense``, GPT-2's ``mlp.c_proj``, Llama's ``mlp.down_proj``). Both
are found by one rule, with no list of models: in each block (the modules of the
sites ``hidden.1 .. hidden.L``), the attention module is the first submodule whose
class name says attention, its output projection the last linear map in it that
writes the hidden size; the down projection is the last such map of the block
outside the attention.

This module says *where* (:func:`locate_components`, or :func:`named_components`
for modules the caller names) and reads or gates what is
there (:func:`read_components`, :func:`gate_components`); what the gates are is
up to the caller. Hooks are removed on exit, also when the forward raises.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Callable, Dict, Iterator, List, Mapping, Optional, Tuple, Union

import torch
from torch import nn, Tensor

from captum_diffmask.model.sites import SiteLocator

#: The kinds of component.
KINDS = ("heads", "units")
#: Attribute names under which attention modules keep their number of heads.
_HEAD_ATTRIBUTES = ("num_heads", "num_attention_heads", "n_head", "n_heads")


@dataclass(frozen=True)
class ComponentSite:
    r"""
    The components of one block, read at the input of one projection.

    Args:

        name (str): ``"heads.k"`` or ``"units.k"`` (k = 1 .. L, the block whose
                    output is ``hidden.k``).
        layer (int): k.
        module (nn.Module): the projection whose input holds the components side
                    by side.
        count (int): the number of components (heads, or units).
        width (int): the features of each (a head's dimension; 1 for a unit).
    """

    name: str
    layer: int
    module: nn.Module
    count: int
    width: int


def _is_linear(module: nn.Module) -> bool:
    r"""Whether ``module`` is a linear map: ``nn.Linear``, or GPT-2's ``Conv1D``."""
    return isinstance(module, nn.Linear) or type(module).__name__ == "Conv1D"


def _out_features(module: nn.Module) -> int:
    return module.out_features if isinstance(module, nn.Linear) else getattr(module, "nf", None)


def _projections(module: nn.Module, hidden: int) -> List[Tuple[str, nn.Module]]:
    r"""The linear maps inside ``module`` that write ``hidden`` features, in order."""
    return [(name, child) for name, child in module.named_modules() if _is_linear(child) and _out_features(child) == hidden]


def _in_features(module: nn.Module) -> int:
    return module.in_features if isinstance(module, nn.Linear) else module.weight.shape[0]


def _attention(block: nn.Module) -> Optional[nn.Module]:
    for child in block.modules():
        if child is not block and "attention" in type(child).__name__.lower():
            return child
    return None


def _head_count(model: nn.Module, attention: nn.Module) -> Optional[int]:
    for owner in (*attention.modules(), getattr(model, "config", None)):  # the attention module first
        for attribute in _HEAD_ATTRIBUTES:
            value = getattr(owner, attribute, None)
            if isinstance(value, int) and value > 0:
                return value
    return None


def _blocks(model: nn.Module, locator: SiteLocator) -> List[nn.Module]:
    blocks = []
    for k in range(1, locator.num_layers + 1):
        site = locator.site(f"hidden.{k}")
        if site.port != "output" or site.call is not None:
            raise ValueError(f"model: {type(model).__name__}'s block {k} is not read at a module's output "
                             "(its hidden sites are laid out otherwise), so its components cannot be located")
        blocks.append(site.module)
    return blocks


def locate_components(model: nn.Module, kind: str = "heads", locator: Optional[SiteLocator] = None,
                      ) -> List[ComponentSite]:
    r"""
    The heads or units of every block of ``model``.

    Args:

        model (nn.Module): the analysed model.
        kind (str, optional): ``"heads"`` or ``"units"``. Default: ``"heads"``
        locator (SiteLocator, optional): the model's sites; located when None.
                    Default: None

    Returns:
        *list* of :class:`ComponentSite`, one per block (``layer`` 1 .. L).

    Raises:
        ValueError: a block without the component, named with the block and
                    what was looked for.
    """
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")
    locator = SiteLocator.locate(model) if locator is None else locator
    hidden = _hidden_size(model, locator)
    return [_block_site(model, block, layer, kind, hidden) for layer, block in enumerate(_blocks(model, locator), 1)]


def _block_site(model: nn.Module, block: nn.Module, layer: int, kind: str, hidden: int) -> ComponentSite:
    attention = _attention(block)
    where = f"block {layer} ({type(block).__name__})"
    if attention is None:
        raise ValueError(f"model: no attention module (a submodule whose class name says attention) in {where}")
    if kind == "heads":
        inside = _projections(attention, hidden)
        heads = _head_count(model, attention)
        if not inside or heads is None or _in_features(inside[-1][1]) % heads:
            raise ValueError(f"model: no output projection of {heads} heads found in {where}'s attention")
        module = inside[-1][1]
        return ComponentSite(f"heads.{layer}", layer, module, heads, _in_features(module) // heads)
    attention_maps = {id(m) for _, m in _projections(attention, hidden)}
    outside = [m for _, m in _projections(block, hidden) if id(m) not in attention_maps]
    if not outside:
        raise ValueError(f"model: no MLP down projection (a linear map to the hidden size outside the attention) "
                         f"in {where}")
    return ComponentSite(f"units.{layer}", layer, outside[-1], _in_features(outside[-1]), 1)


#: A block's components named by hand (:func:`named_components`): the module whose
#: input holds them side by side; with the number of components; with their width.
ComponentSpec = Union[nn.Module, Tuple[nn.Module, int], Tuple[nn.Module, int, int]]


def named_components(kind: str, specs: Mapping[int, ComponentSpec], num_layers: int) -> List[ComponentSite]:
    r"""
    The heads or units of every block, at modules the caller names (for a model
    whose blocks :func:`locate_components`'s rule does not read).

    Args:

        kind (str): ``"heads"`` or ``"units"``.
        specs (mapping): block k (1..L, every one) -> the module whose input's last
                    dimension holds the block's components side by side: the
                    module alone for units of a linear map (one unit per input
                    feature); ``(module, count)`` for a linear map's input split
                    into ``count`` components (heads); ``(module, count, width)``
                    for any module.
        num_layers (int): L.

    Returns:
        *list* of :class:`ComponentSite`, one per block, in block order.

    Raises:
        ValueError: naming ``components``: a block missing or out of range, a
                    count or width that is not a positive int, a module whose
                    input width is unknown or not ``count * width``.
    """
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")
    blocks = sorted(specs)
    if blocks != list(range(1, num_layers + 1)):
        raise ValueError(f"components: name every block 1..{num_layers} once (layer k is block k), got {blocks}")
    return [_named_site(kind, k, specs[k]) for k in blocks]


def _named_site(kind: str, layer: int, spec: ComponentSpec) -> ComponentSite:
    module, *shape = spec if isinstance(spec, tuple) else (spec,)
    where = f"components[{layer}]"
    if not isinstance(module, nn.Module) or len(shape) > 2:
        raise ValueError(f"{where}: give a module, (module, count) or (module, count, width), got {spec!r}")
    features = _in_features(module) if _is_linear(module) else None
    if not shape and kind == "heads":
        raise ValueError(f"{where}: give the number of heads, (module, count)")
    count = shape[0] if shape else features
    width = shape[1] if len(shape) == 2 else (features // count if features is not None and count else None)
    for name, value in (("count", count), ("width", width)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{where}: {name} must be an int >= 1 (give (module, count, width) for a module "
                             f"that is not a linear map), got {value!r}")
    if features is not None and count * width != features:
        raise ValueError(f"{where}: {count} components of width {width} do not fill the module's {features} "
                         "input features")
    return ComponentSite(f"{kind}.{layer}", layer, module, count, width)


def _hidden_size(model: nn.Module, locator: SiteLocator) -> int:
    r"""The width of the residual stream: the config's, else the input embedding's."""
    config = getattr(model, "config", None)
    for attribute in ("hidden_size", "n_embd", "d_model"):
        value = getattr(config, attribute, None)
        if isinstance(value, int):
            return value
    embedding = locator.site("input").module
    if isinstance(embedding, nn.Embedding):
        return embedding.embedding_dim
    raise ValueError(f"model: {type(model).__name__} has no config hidden size and no nn.Embedding input")


#: What a hook does with one site's (B, T, count, width) components: a replacement, or None.
Rewrite = Callable[[ComponentSite, Tensor], Optional[Tensor]]


@contextlib.contextmanager
def _pre_hooks(sites: List[ComponentSite], fn: Rewrite) -> Iterator[None]:
    handles = []
    try:
        for site in sites:
            def hook(module: nn.Module, args: Tuple[Tensor, ...], site: ComponentSite = site) -> Optional[Tuple]:
                x = args[0]
                new = fn(site, x.view(*x.shape[:-1], site.count, site.width))
                return None if new is None else (new.reshape(x.shape), *args[1:])
            handles.append(site.module.register_forward_pre_hook(hook))
        yield
    finally:
        for handle in handles:
            handle.remove()


@contextlib.contextmanager
def read_components(sites: List[ComponentSite]) -> Iterator[Dict[str, Tensor]]:
    r"""
    Records each site's components during the forward passes in the block.

    Yields:
        *dict* name -> (B, T, count, width), filled as the model runs (the
        last pass's).
    """
    seen: Dict[str, Tensor] = {}

    def record(site: ComponentSite, components: Tensor) -> None:
        seen[site.name] = components.detach()

    with _pre_hooks(sites, record):
        yield seen


@contextlib.contextmanager
def gate_components(
    sites: List[ComponentSite], gates: Mapping[str, Tensor], baselines: Optional[Mapping[str, Tensor]] = None,
) -> Iterator[None]:
    r"""
    Replaces components by ``g * c + (1 - g) * b`` in the block.

    Args:

        sites (list of ComponentSite): where.
        gates (mapping): name -> (B, T, count) per position, or (B, count) per
                    input, in [0, 1] (1 keeps the component); gradients flow.
        baselines (mapping, optional): name -> (count, width) what replaces a
                    closed component; zeros when None or missing. Default: None
    """
    missing = [site.name for site in sites if site.name not in gates]
    if missing:
        raise ValueError(f"gates: no gates for {missing}")

    def gate(site: ComponentSite, components: Tensor) -> Tensor:
        g = gates[site.name].to(components.dtype)
        g = (g.unsqueeze(1) if g.dim() == 2 else g).unsqueeze(-1)  # (B, 1 or T, count, 1)
        base = (baselines or {}).get(site.name)
        base = torch.zeros_like(components[0, 0]) if base is None else base.to(components)
        return g * components + (1 - g) * base

    with _pre_hooks(sites, gate):
        yield
