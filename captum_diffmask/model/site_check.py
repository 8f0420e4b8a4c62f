"""The sites checked against the model's own hidden states, once per explainer.

A Hugging Face model called without a ``forward_func`` reports its hidden states:
the captured ``hidden.k`` must be its ``hidden_states[k]`` at the real positions
(``hidden.L`` may differ by the final normalisation some models apply to their
last state). Models whose ``hidden_states`` start after the first block (Mamba,
RWKV: block k's output is their ``hidden_states[k]``) are matched one site on.
The sites' layouts are learnt here: blocks that run on (T, B, H) states (XLNet),
on (B, H, T) states (SqueezeBERT, whose encoder calls its blocks' ``forward``
past their hooks: read inside them), several residual streams, and a window of
the positions (a prompt before the ids, n-gram streams after them).
"""

from __future__ import annotations

from typing import Any, Dict, Mapping, Optional, Sequence, Tuple

import torch
from torch import nn, Tensor

from captum_diffmask.model.arguments import PreparedCall
from captum_diffmask.model.batches import hf_extras
from captum_diffmask.model.forward import cache_off, frozen, hooks_and_attributes_restored
from captum_diffmask.model.site_finding import HOW_TO_PASS_SITES
from captum_diffmask.model.sites import SiteLocator


def checked_sites(model: nn.Module, locator: SiteLocator, num_layers: int, call: PreparedCall) -> SiteLocator:
    r"""
    The sites of ``locator`` checked on the batch of ``call`` against the
    model's own hidden states, in the layout they were found in.

    Args:

        model (nn.Module): a Hugging Face model (``output_hidden_states``).
        locator (SiteLocator): the sites found or given.
        num_layers (int): L, the blocks.
        call (PreparedCall): the first batch.

    Returns:
        *SiteLocator*: ``locator``, or the same sites read in the layout the
        model keeps them in; as given when the model reports no states.

    Raises:
        ValueError naming ``sites`` (the site that is not the model's own, or the
        count of states that differs); FloatingPointError when the model's own
        states are not finite.
    """
    states, reference, locator = _own_states(model, locator, num_layers, call)
    if reference is None:
        return locator  # the model returns no states to compare with
    paths = dict((n, p) for n, p, _ in locator.describe())
    name = type(model).__name__
    if len(reference) != num_layers + 1:
        raise ValueError(
            f"sites: {num_layers} blocks were found (hidden.1 read at {paths['hidden.1']}, ...), but "
            f"{name} returns {len(reference)} hidden_states, not {num_layers + 1}; " + HOW_TO_PASS_SITES)
    missing = [k for k in range(num_layers + 1) if f"hidden.{k}" not in states]
    if missing:
        raise ValueError(f"sites: hidden.{missing[0]} (read at {paths[f'hidden.{missing[0]}']}) did not run in a "
                         f"forward pass of {name}; " + HOW_TO_PASS_SITES)
    locator = locator.with_streams(states, tuple(call.ids.shape))
    _check_finite(model, reference[:num_layers])
    real = call.mask.bool()
    states, locator = _on_the_ids(locator, states, reference, real)
    if any(_states_match(states, reference, real, offset) for offset in (0, 1)):
        return locator
    transposed = _transposed(locator, states, reference, real)
    if transposed is None:
        k = next(k for k in range(num_layers) if not _same_state(states[f"hidden.{k}"], reference[k], real))
        raise ValueError(
            f"sites: hidden.{k} (read at {paths[f'hidden.{k}']}) is not the model's own hidden_states[{k}] "
            f"in {name}; " + HOW_TO_PASS_SITES)
    return transposed


def _own_states(
    model: nn.Module, locator: SiteLocator, num_layers: int, call: PreparedCall
) -> Tuple[Dict[str, Tensor], Optional[Sequence[Tensor]], SiteLocator]:
    r"""The input and hidden sites as captured and the model's own hidden states,
    from one pass, with the locator they were read by: where a hidden site's hook
    never fires but the sites inside the blocks do
    (:meth:`SiteLocator.inside_blocks`), those."""
    names = ["input"] + [f"hidden.{k}" for k in range(num_layers + 1)]
    kwargs = dict(zip(hf_extras(model), call.extra))
    kwargs = {k: v for k, v in kwargs.items() if v is not None}
    states, output = _capture_own(model, locator, names, call.ids, kwargs)
    inner = locator.inside_blocks() if len(states) < len(names) else None
    if inner is not None:
        inner_states, inner_output = _capture_own(model, inner, names, call.ids, kwargs)
        if len(inner_states) == len(names):
            locator, states, output = inner, inner_states, inner_output
    return states, own_hidden_states(model, output, call.ids, kwargs), locator


def _capture_own(
    model: nn.Module, locator: SiteLocator, names: Sequence[str], ids: Tensor, kwargs: Mapping[str, Any]
) -> Tuple[Dict[str, Tensor], Any]:
    with torch.no_grad(), frozen(model), hooks_and_attributes_restored(model), \
            cache_off(model), locator.capture(names) as states:
        output = model(input_ids=ids, output_hidden_states=True, **kwargs)
    return states, output


def _on_the_ids(
    locator: SiteLocator, states: Dict[str, Tensor], reference: Sequence[Tensor], real: Tensor
) -> Tuple[Dict[str, Tensor], SiteLocator]:
    r"""For a model whose blocks run on more positions than the ids (a prompt
    before them, n-gram streams after them), the window of the ids' positions
    under which the captured states are the model's own
    (:meth:`SiteLocator.windowed`): the states on it and the windowed locator,
    or both as they were."""
    length = real.shape[1]
    longer = {name: state.shape[1] for name, state in states.items()
              if state.dim() == 3 and state.shape[0] == real.shape[0] and state.shape[1] > length}
    if not longer or len(set(longer.values())) != 1:
        return states, locator
    total = next(iter(longer.values()))
    windows = [(total - length, 1)] + ([(0, total // length)] if total % length == 0 else [])
    for offset, ratio in windows:
        on_ids = {name: state[:, offset:offset + (state.shape[1] - offset) // ratio] if name in longer else state
                  for name, state in states.items()}
        if any(_states_match(on_ids, reference, real, shift) for shift in (0, 1)):
            return on_ids, locator.windowed(list(longer), offset, ratio)
    return states, locator


def _transposed(
    locator: SiteLocator, states: Mapping[str, Tensor], reference: Sequence[Tensor], real: Tensor
) -> Optional[SiteLocator]:
    r"""The locator that reads the sites tokens first ((T, B, H), as XLNet runs
    its blocks) or features first ((B, H, T), as SqueezeBERT's convolutions)
    when the captured states are the model's own read so
    (:meth:`SiteLocator.tokens_first`, :meth:`SiteLocator.features_first`);
    None when neither matches."""
    flipped = {name: state.transpose(0, 1) for name, state in states.items() if state.dim() == 3}
    if len(flipped) == len(states) and _states_match(flipped, reference, real, 0):
        return locator.tokens_first()
    features_first = [name for name, state in states.items()
                      if state.dim() == 3 and state.shape[1] != real.shape[1] and state.shape[2] == real.shape[1]]
    flipped = {name: state.transpose(1, 2) if name in features_first else state for name, state in states.items()}
    if features_first and any(_states_match(flipped, reference, real, offset) for offset in (0, 1)):
        return locator.features_first(features_first)
    return None


def own_hidden_states(model: nn.Module, output: Any, ids: Tensor, kwargs: Mapping[str, Any]) -> Optional[Sequence[Tensor]]:
    r"""
    The hidden states a model reports for the sites to be checked against: an
    encoder-decoder's encoder states (``encoder_hidden_states``, or its
    encoder's own ``hidden_states`` when the output carries only the decoder's,
    as T5Gemma's classifier does), else ``hidden_states``; None when there
    are none.
    """
    encoder_states = getattr(output, "encoder_hidden_states", None)
    if encoder_states is not None:
        return encoder_states
    get_encoder = getattr(model, "get_encoder", None)
    if getattr(getattr(model, "config", None), "is_encoder_decoder", False) and callable(get_encoder):
        with torch.no_grad():
            encoded = get_encoder()(input_ids=ids, output_hidden_states=True,
                                    **{k: v for k, v in kwargs.items() if k == "attention_mask"})
        return getattr(encoded, "hidden_states", None)
    return getattr(output, "hidden_states", None)


def _states_match(states: Mapping[str, Tensor], reference: Sequence[Tensor], real: Tensor, offset: int) -> bool:
    r"""Whether ``hidden.{k + offset}`` equals ``reference[k]`` at the ``real``
    positions for every k but the last (a model may normalise its last state)."""
    return all(_same_state(states[f"hidden.{k + offset}"], reference[k], real) for k in range(len(reference) - 1))


def _same_state(state: Tensor, own: Tensor, real: Tensor) -> bool:
    r"""Whether a captured (B, T, H) state equals the model's at the real positions."""
    state, own = state.float(), own.float()
    if state.shape != own.shape:
        return False
    if state.shape[:2] == real.shape:
        state, own = state[real], own[real]
    return torch.allclose(state, own, atol=1e-4, rtol=1e-3)


def _check_finite(model: nn.Module, reference: Sequence[Tensor]) -> None:
    r"""FloatingPointError naming the parameters when a hidden state holds NaN or
    inf: without it a broken model reads as a site mismatch (NaN != NaN)."""
    for k, own in enumerate(reference):
        if not bool(torch.isfinite(own).all()):
            bad = [name for name, p in model.named_parameters() if not bool(torch.isfinite(p).all())]
            raise FloatingPointError(
                f"the model's hidden_states[{k}] are not finite (NaN or inf): "
                + (f"its parameters {bad[:5]} hold NaN or inf" if bad else "check its inputs and weights"))
