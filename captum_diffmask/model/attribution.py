"""The base of every attribution in the library: sites, model calls, input checks,
output shape.

A method subclasses :class:`SiteAttribution` and implements ``attribute`` with
:meth:`SiteAttribution._prepare` at the start and :meth:`SiteAttribution._finish`
at the end, so that every method reads the same sites, calls the model the same
way and returns (B, T) scores, higher = more important, 0 at padding.

For the comparison methods ``layer`` selects the site: 0 is the ``input`` site (the
token embeddings), k >= 1 is ``hidden.k`` (the output of block k-1).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any, Callable, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple, TypeVar, Union

import torch
from captum.attr import Attribution
from captum.log import log_usage
from torch import nn, Tensor

from captum_diffmask.model.batches import to_device
from captum_diffmask.model.forward import (
    cache_off, check_token_ids, check_vocabulary, evaluation_mode, format_additional_args, frozen,
    hooks_and_attributes_restored, is_hf_model, model_device, ModelForward,
)
from captum_diffmask.model.rng import preserved_rng
from captum_diffmask.model.site_finding import HOW_TO_PASS_SITES
from captum_diffmask.model.sites import repeat_batch, Replacement, SiteLocator

#: Captum-style targets: a class for every example, one per example, or None.
TargetType = Union[None, int, List[int], Tensor]
#: What replaces a state: None (the method's default), a constant, a vector (H,)
#: for every token, or a full (B, T, H) tensor.
BaselineType = Union[None, float, Tensor]
#: Token ids (B, T), or a 1-tuple of them (Captum's convention; the result follows).
InputType = Union[Tensor, Tuple[Tensor]]
#: Where the sites are: a :class:`SiteLocator`, a dict ``{"input": ..., "hidden": [...]}``,
#: or None to locate them (Hugging Face models).
SitesType = Union[None, SiteLocator, Mapping[str, Any]]
#: ``forward_func(ids, *additional_forward_args)`` returning logits, or None for the model.
ForwardFunc = Optional[Callable[..., Any]]
#: The index of the padding mask in ``additional_forward_args``, ``"auto"`` or None.
PaddingMaskArg = Union[int, str, None]

_Method = TypeVar("_Method", bound=Callable[..., Any])


def attribution_call(method: _Method) -> _Method:
    r"""
    Wraps an ``attribute``: Captum's usage log, the analysed model in eval mode
    (a model left in ``train()`` would attribute with dropout on, a different
    answer at every call; its modes are restored after), and the caller's random
    number generators left as found (a stochastic method draws on a fork of the
    global RNG that continues the caller's sequence, then rewinds it; see
    :func:`captum_diffmask.model.rng.preserved_rng`).
    """
    logged = log_usage()(method)

    @functools.wraps(method)
    def call(*args: Any, **kwargs: Any) -> Any:
        model = getattr(args[0], "model", None) if args else None
        with preserved_rng(), evaluation_mode(model if isinstance(model, nn.Module) else None):
            return logged(*args, **kwargs)

    call.attribution_call = True  # type: ignore[attr-defined]  # for the contract's tests
    return call  # type: ignore[return-value]


def reject_target(target: Any, method: str, preserved: str = "the whole output distribution") -> None:
    r"""For methods that preserve the whole output rather than one class: a
    ``target`` is an error (naming it), never silently ignored."""
    if target is not None:
        raise ValueError(
            f"target must be None for {method}: it preserves {preserved}, not one class; got {target!r}"
        )


def resolve_baseline(
    baselines: BaselineType, state: Tensor, mask: Tensor, default: str = "zeros", argument: str = "baselines"
) -> Tensor:
    r"""
    The reference state (B, T, H) that replaces ``state``.

    Args:

        baselines (float or Tensor, optional): a constant, a vector (H,) for every
                    token (e.g. a fitted DiffMask's learned baseline), or a full
                    (B, T, H) tensor; None for ``default``.
        state (Tensor): (B, T, H) the site's states.
        mask (Tensor): (B, T) bool, True at real tokens.
        default (str, optional): ``"zeros"``, or ``"mean"`` (the mean state over
                    the batch's real tokens). Default: ``"zeros"``
        argument (str, optional): the name used in errors. Default: ``"baselines"``

    Returns:
        *Tensor* (B, T, H), detached, equal to ``state`` at padded positions
        (padding is never moved).
    """
    if baselines is None:
        if default == "mean":
            weights = mask.to(state.device).float().unsqueeze(-1)
            mean = (state.float() * weights).sum((0, 1)) / weights.sum().clamp(min=1.0)
            full = mean.to(state.dtype).expand_as(state)
        else:
            full = torch.zeros_like(state)
    elif isinstance(baselines, (int, float)) and not isinstance(baselines, bool):
        full = torch.full_like(state, float(baselines))
    elif isinstance(baselines, Tensor):
        if baselines.shape == state.shape[-1:]:
            full = baselines.to(state).expand_as(state)
        elif baselines.shape == state.shape:
            full = baselines.to(state)
        else:
            raise ValueError(
                f"{argument} must be None, a float, a tensor ({state.shape[-1]},) or a tensor "
                f"{tuple(state.shape)} shaped like the site state, got shape {tuple(baselines.shape)}"
            )
    else:
        raise TypeError(f"{argument} must be None, a float or a Tensor, got {type(baselines).__name__}")
    return torch.where(mask.to(state.device).unsqueeze(-1), full.detach(), state)


@dataclass
class PreparedCall:
    r"""The validated pieces of one ``attribute`` call.

    Attributes:
        ids (Tensor): (B, T) token ids.
        extra (tuple): ``additional_forward_args`` as a tuple.
        mask (Tensor): (B, T) bool, True at real tokens.
        site (str, optional): the site a method attributes to at ``layer``; None
                    when the call spans several (DiffMask's ``layer=None``, a
                    training batch).
        was_tuple (bool): ``inputs`` came as a 1-tuple (the result will too).
        module_outputs (dict, optional): the site modules' outputs recorded by
                    the capture pass, for partial re-runs; None before it.
        captured_ids (Tensor, optional): the ids of that capture pass.
        input_device (torch.device, optional): where the caller's ids were; the
                    scores go back there.
        length (int, optional): the caller's T when the ids were padded to the
                    model's window (:meth:`ModelForward.padded_to_window`); the
                    scores are cut back to it. None: not padded.
    """

    ids: Tensor
    extra: Tuple[Any, ...]
    mask: Tensor
    site: Optional[str]
    was_tuple: bool
    module_outputs: Optional[Dict[str, Any]] = None
    captured_ids: Optional[Tensor] = None
    input_device: Optional[torch.device] = None
    length: Optional[int] = None

    def trimmed(self, per_token: Tensor) -> Tensor:
        r"""(B, T', ...) per-token values cut back to the caller's T."""
        return per_token if self.length is None else per_token[:, : self.length]


def check_layer(layer: Any, num_layers: int, allow_none: bool = False) -> Optional[int]:
    r"""
    Validates a layer index.

    Args:

        layer (int or None): the layer, 0..L.
        num_layers (int): L.
        allow_none (bool, optional): whether None (every layer) is accepted.
                    Default: False

    Returns:
        *int* or None: ``layer``.

    Raises:
        TypeError or ValueError naming ``layer``.
    """
    if layer is None and allow_none:
        return None
    if isinstance(layer, bool) or not isinstance(layer, int):
        raise TypeError(f"layer must be an int in 0..{num_layers}, got {layer!r}")
    if not 0 <= layer <= num_layers:
        raise ValueError(f"layer must be in 0..{num_layers}, got {layer}")
    return layer


def site_for_layer(layer: Any, num_layers: int) -> str:
    r"""``"input"`` for layer 0, ``"hidden.k"`` for k in 1..L; errors name ``layer``."""
    check_layer(layer, num_layers)
    return "input" if layer == 0 else f"hidden.{layer}"


class SiteAttribution(Attribution):
    r"""
    Base of the comparison methods: a Captum ``Attribution`` over the sites of a
    model.

    Every replaced pass re-runs only what follows the replaced site (the model is
    frozen, so what precedes it is what the capture pass recorded): for the last
    layer's states that is the classifier head alone. Set ``rerun = "full"`` on
    an instance to re-run the whole model instead (e.g. a model whose site
    modules run more than once per forward pass).

    Args:

        model (nn.Module): the analysed model; in eval mode with its parameters
                    frozen while a method runs, both restored afterwards.
        sites (SiteLocator or dict, optional): where ``input`` and
                    ``hidden.0 .. hidden.L`` live (:meth:`SiteLocator.locate`);
                    found automatically for Hugging Face models. Default: None
        forward_func (Callable, optional): ``forward_func(ids, *extra)`` returning
                    logits; the model itself when None. Default: None
        padding_mask_arg (int, str or None, optional): index of the padding mask in
                    ``additional_forward_args``; ``"auto"``: 0 for Hugging Face
                    models, none otherwise. Default: ``"auto"``
        output (str, optional): the distributions kept or attributed:
                    ``"classes"``, ``"last"``, ``"all"`` or ``"span"``
                    (:class:`~captum_diffmask.model.forward.ModelForward`); ``"auto"``
                    reads them from the output's form. Default: ``"auto"``

    Every method's ``attribute(inputs, target=None, additional_forward_args=None,
    layer=0, ...)`` reads these arguments the same way (each method documents
    ``target`` and its own options):

        inputs (Tensor, tuple[Tensor] or mapping): token ids (B, T), a 1-tuple of
                    them (the scores are then a 1-tuple too), or a tokenizer's
                    batch (its attention mask is the padding mask; labels in it
                    never reach the model).
        additional_forward_args (Any, optional): the model's other positional
                    arguments, e.g. ``(attention_mask,)``; None with a mapping
                    batch. Default: None
        layer (int, optional): the site attributed: 0 for the token embeddings
                    (``input``), k >= 1 for ``hidden.k``, checked against 0..L.
                    Default: 0
    """

    #: ``"partial"`` (re-run only what follows a replaced site) or ``"full"``.
    rerun: str = "partial"
    #: Whether ``target`` selects the class attributed (else it must be None).
    uses_target: bool = True
    #: Whether ``attribute`` takes ``baselines=`` (what replaces a state).
    uses_baselines: bool = False
    #: Whether the scores are probabilities of being kept (or a 0/1 mask), in
    #: [0, 1] on an absolute scale: figures draw them as they are, never scaled
    #: to their maximum (a mask that drops every token must look empty).
    scores_are_probabilities: bool = False
    #: The method's name in tables and reports (the class name when None).
    label: Optional[str] = None
    #: One line on what the method does, for listings.
    summary: str = ""
    #: Whether the method learns from a data set before it attributes
    #: (:meth:`prepare_on_data`): a fit, statistics.
    needs_data: bool = False
    #: The name of the method's own call that learns from data (``"fit"``,
    #: ``"fit_statistics"``), whose options ``compare`` routes to it.
    data_step: Optional[str] = None
    #: Captum's ``multiplies_by_inputs``: whether the scores are a product with
    #: the state's difference from the baseline (Integrated Gradients).
    scores_multiply_inputs: bool = False
    #: Captum's ``has_convergence_delta()``: whether ``attribute`` can return
    #: ``(scores, delta)`` with ``return_convergence_delta=True``.
    reports_convergence_delta: bool = False

    def __init__(
        self, model: nn.Module, sites: SitesType = None, forward_func: ForwardFunc = None,
        padding_mask_arg: PaddingMaskArg = "auto", output: str = "auto",
    ) -> None:
        self.model_forward = ModelForward(model, forward_func, padding_mask_arg, output)
        Attribution.__init__(self, self.model_forward)
        self.model = model
        self.locator = SiteLocator.locate(model, sites)
        #: whether the sites passed the self-check (:meth:`_check_sites`)
        self._sites_checked = False
        embedding = self.locator.site("input").module
        #: the number of token ids the input embedding takes (None: not an nn.Embedding)
        self._vocabulary_size = embedding.num_embeddings if isinstance(embedding, nn.Embedding) else None

    @property
    def multiplies_by_inputs(self) -> bool:
        return self.scores_multiply_inputs

    def has_convergence_delta(self) -> bool:
        return self.reports_convergence_delta

    @property
    def num_layers(self) -> int:
        r"""L, the number of blocks: the sites are ``input``, ``hidden.0`` .. ``hidden.L``."""
        return self.locator.num_layers

    @classmethod
    def name(cls) -> str:
        r"""The method's name in tables and reports: :attr:`label`, else the class name."""
        return cls.label or cls.__name__

    def is_prepared(self, layer: Optional[int]) -> bool:
        r"""Whether the method can attribute at ``layer`` now; a method that
        :attr:`needs_data` is not before :meth:`prepare_on_data`."""
        return True

    def prepare_on_data(
        self, train_data: Iterable[Any], layer: Optional[int], options: Mapping[str, Any], seed: int = 0,
        verbose: bool = False, max_steps: Optional[int] = None,
    ) -> Dict[str, Any]:
        r"""
        Learns what the method needs from a data set to attribute at ``layer``
        (nothing, for a method that does not :attr:`needs_data`).

        Args:

            train_data (iterable): batches as ``DiffMask.fit`` takes them.
            layer (int or None): the layer to attribute (None: every layer).
            options (dict): options of :attr:`data_step`.
            seed (int, optional): seeds what is learned. Default: 0
            verbose (bool, optional): progress bars. Default: False
            max_steps (int, optional): a budget of optimisation steps, where
                        the method optimises and ``options`` set none. Default: None

        Returns:
            *dict*: what the preparation reports (JSON-ready).
        """
        return {}

    def attributes_every_layer(self) -> bool:
        r"""Whether ``attribute(layer=None)`` gives every layer's scores at once
        ((B, T, L + 1)) now."""
        return False

    @property
    def site_names(self) -> List[str]:
        r"""The names of the model's sites in the order a forward pass runs them
        (the input, then each block's output)."""
        return list(self.locator.names)

    def attribute_future(self) -> None:
        raise NotImplementedError(f"attribute_future is not implemented for {type(self).__name__}")

    def scored(self, layer: Any) -> str:
        r"""
        What ``attribute(..., layer=layer)`` scores, in words, for tables that set
        methods side by side.

        Args:

            layer (int or None): as ``attribute`` takes it.

        Returns:
            *str*: the site (``"input"``, ``"hidden.k"``), or ``"every layer"``.
        """
        site = self._site(layer)
        return "every layer" if site is None else site

    # ------------------------------------------------------------- helpers
    def _site(self, layer: Any) -> Optional[str]:
        r"""The site attributed at ``layer`` (``site_for_layer``); a method with
        another reading of ``layer`` overrides it."""
        return site_for_layer(layer, self.num_layers)

    def _prepare(
        self, inputs: Any, additional_forward_args: Any, layer: Any, argument: str = "inputs"
    ) -> PreparedCall:
        r"""Validates ``inputs`` (named ``argument`` in errors; token ids, or a
        mapping batch such as a tokenizer's output, whose targets are dropped),
        ``layer`` and the padding mask, and puts the tensors on the model's device."""
        if isinstance(inputs, Mapping):
            if additional_forward_args is not None:
                raise ValueError(f"additional_forward_args must be None when {argument} is a mapping batch "
                                 "(its attention_mask and token_type_ids are read from it)")
            inputs, additional_forward_args = self.model_forward.split_batch(inputs)
        ids, was_tuple = check_token_ids(inputs, argument)
        site = self._site(layer)
        device = ids.device
        check_vocabulary(ids, self._vocabulary_size, argument)
        ids, extra = to_device(ids, format_additional_args(additional_forward_args), model_device(self.model))
        length = ids.shape[1]
        ids, extra = self.model_forward.padded_to_window(ids, extra)
        mask = self.model_forward.padding_mask(ids, extra)
        return PreparedCall(ids, extra, mask, site, was_tuple, input_device=device,
                            length=length if ids.shape[1] != length else None)

    def prepare_batch(self, batch: Any, layer: Any, argument: str) -> PreparedCall:
        r""":meth:`_prepare` for a data-loader batch (see :mod:`captum_diffmask.model.batches`)."""
        ids, extra = self.model_forward.split_batch(batch)
        return self._prepare(ids, extra, layer, argument)

    @staticmethod
    def _finish(scores: Tensor, call: PreparedCall) -> Union[Tensor, Tuple[Tensor]]:
        r"""(B, T) or (B, T, K) float scores with padding set to 0, on the device
        of the inputs, in their structure."""
        mask = call.mask.float()
        if scores.dim() == 3:
            mask = mask.unsqueeze(-1)
        scores = call.trimmed(scores.detach().float() * mask).to(call.input_device or scores.device)
        return (scores,) if call.was_tuple else scores

    @staticmethod
    def _finish_per_input(scores: Tensor, call: PreparedCall) -> Union[Tensor, Tuple[Tensor]]:
        r"""Scores of components per input ((B, count) or (B, L, count): no
        positions to trim or zero), on the device of the inputs, in their structure."""
        scores = scores.detach().float().to(call.input_device or scores.device)
        return (scores,) if call.was_tuple else scores

    def capture(
        self, call: PreparedCall, names: Optional[Iterable[str]] = None, stop_early: bool = False
    ) -> Tuple[Dict[str, Tensor], Optional[Tensor]]:
        r"""
        One pass without gradients that reads the sites ``names`` (default: the
        call's site).

        With partial re-runs (``rerun == "partial"``) and a whole pass, it also
        records every site module's output into ``call`` for
        :meth:`replaced_logits`. ``stop_early`` ends the pass as soon as the
        sites are read (no logits, nothing recorded).

        Returns:
            *tuple* ``(states, logits)``: site name -> (B, T, H), and the (B, C)
            logits (None with ``stop_early``).
        """
        if not self._sites_checked:
            self._check_sites(call)
        wanted = [call.site] if names is None else list(names)
        partial = self.rerun == "partial" and self.locator.reusable and not stop_early
        outputs: Optional[Dict[str, Any]] = {} if partial else None
        recorded = self.locator.names if outputs is not None else wanted
        logits: Optional[Tensor] = None
        with torch.no_grad(), self.locator.capture(recorded, stop_early=stop_early, module_outputs=outputs) as states:
            logits = self.model_forward(call.ids, call.extra)
        call.module_outputs, call.captured_ids = outputs, call.ids
        return states, logits

    def _check_sites(self, call: PreparedCall) -> None:
        r"""Once per explainer, on its first batch: the captured ``hidden.k`` must be
        the model's own ``hidden_states[k]`` at the real positions (Hugging Face
        models called without a ``forward_func``); ``hidden.L`` may differ by the
        final normalisation some models apply to their last hidden state. Models
        whose ``hidden_states`` start after the first block (Mamba, RWKV: block
        k's output is their ``hidden_states[k]``) are matched one site on. The
        sites' layouts are learnt here: blocks run on (T, B, H) states (XLNet),
        on (B, H, T) states (SqueezeBERT, whose encoder calls its blocks'
        ``forward`` past their hooks: read inside them), several streams."""
        if self.model_forward.forward_func is not None or not is_hf_model(self.model):
            self._sites_checked = True
            return
        states, reference = self._own_states(call)
        if reference is None:
            self._sites_checked = True  # the model returns no states to compare with
            return
        paths = dict((n, p) for n, p, _ in self.locator.describe())
        model = type(self.model).__name__
        if len(reference) != self.num_layers + 1:
            raise ValueError(
                f"sites: {self.num_layers} blocks were found (hidden.1 read at {paths['hidden.1']}, ...), but "
                f"{model} returns {len(reference)} hidden_states, not {self.num_layers + 1}; " + HOW_TO_PASS_SITES)
        missing = [k for k in range(self.num_layers + 1) if f"hidden.{k}" not in states]
        if missing:
            raise ValueError(f"sites: hidden.{missing[0]} (read at {paths[f'hidden.{missing[0]}']}) did not run in a "
                             f"forward pass of {model}; " + HOW_TO_PASS_SITES)
        self.locator = self.locator.with_streams(states, tuple(call.ids.shape))
        _check_finite(self.model, reference[: self.num_layers])
        real = call.mask.bool()
        states = self._on_the_ids(states, reference, real)
        if not any(_states_match(states, reference, real, offset) for offset in (0, 1)) \
                and not self._transposed_match(states, reference, real):
            k = next(k for k in range(self.num_layers) if not _same_state(states[f"hidden.{k}"], reference[k], real))
            raise ValueError(
                f"sites: hidden.{k} (read at {paths[f'hidden.{k}']}) is not the model's own hidden_states[{k}] "
                f"in {model}; " + HOW_TO_PASS_SITES)
        self._sites_checked = True

    def _own_states(self, call: PreparedCall) -> Tuple[Dict[str, Tensor], Optional[Sequence[Tensor]]]:
        r"""The input and hidden sites as captured, and the model's own hidden states, from
        one pass; where a hidden site's hook never fires but the sites inside
        the blocks do (:meth:`SiteLocator.inside_blocks`), those from now on."""
        names = ["input"] + [f"hidden.{k}" for k in range(self.num_layers + 1)]
        kwargs = dict(zip(("attention_mask", "token_type_ids"), call.extra))
        kwargs = {k: v for k, v in kwargs.items() if v is not None}
        states, output = self._capture_own(self.locator, names, call.ids, kwargs)
        inner = self.locator.inside_blocks() if len(states) < len(names) else None
        if inner is not None:
            inner_states, inner_output = self._capture_own(inner, names, call.ids, kwargs)
            if len(inner_states) == len(names):
                self.locator, states, output = inner, inner_states, inner_output
        return states, own_hidden_states(self.model, output, call.ids, kwargs)

    def _capture_own(
        self, locator: SiteLocator, names: Sequence[str], ids: Tensor, kwargs: Mapping[str, Any]
    ) -> Tuple[Dict[str, Tensor], Any]:
        with torch.no_grad(), frozen(self.model), hooks_and_attributes_restored(self.model), \
                cache_off(self.model), locator.capture(names) as states:
            output = self.model(input_ids=ids, output_hidden_states=True, **kwargs)
        return states, output

    def _on_the_ids(self, states: Dict[str, Tensor], reference: Sequence[Tensor], real: Tensor) -> Dict[str, Tensor]:
        r"""For a model whose blocks run on more positions than the ids (a prompt
        before them, n-gram streams after them), the window of the ids'
        positions under which the captured states are the model's own
        (:meth:`SiteLocator.windowed`); the states on it, or as they were."""
        length = real.shape[1]
        longer = {name: state.shape[1] for name, state in states.items()
                  if state.dim() == 3 and state.shape[0] == real.shape[0] and state.shape[1] > length}
        if not longer or len(set(longer.values())) != 1:
            return states
        total = next(iter(longer.values()))
        windows = [(total - length, 1)] + ([(0, total // length)] if total % length == 0 else [])
        for offset, ratio in windows:
            on_ids = {name: state[:, offset:offset + (state.shape[1] - offset) // ratio] if name in longer else state
                      for name, state in states.items()}
            if any(_states_match(on_ids, reference, real, shift) for shift in (0, 1)):
                self.locator = self.locator.windowed(list(longer), offset, ratio)
                return on_ids
        return states

    def _transposed_match(self, states: Mapping[str, Tensor], reference: Sequence[Tensor], real: Tensor) -> bool:
        r"""Whether the captured states are the model's own read tokens first
        ((T, B, H), as XLNet runs its blocks) or features first ((B, H, T), as
        SqueezeBERT's convolutions); if so, the sites are read so from now on
        (:meth:`SiteLocator.tokens_first`, :meth:`SiteLocator.features_first`)."""
        flipped = {name: state.transpose(0, 1) for name, state in states.items() if state.dim() == 3}
        if len(flipped) == len(states) and _states_match(flipped, reference, real, 0):
            self.locator = self.locator.tokens_first()
            return True
        features_first = [name for name, state in states.items()
                          if state.dim() == 3 and state.shape[1] != real.shape[1] and state.shape[2] == real.shape[1]]
        flipped = {name: state.transpose(1, 2) if name in features_first else state for name, state in states.items()}
        if features_first and any(_states_match(flipped, reference, real, offset) for offset in (0, 1)):
            self.locator = self.locator.features_first(features_first)
            return True
        return False

    def replaced_logits(self, call: PreparedCall, replacements: Mapping[str, Replacement]) -> Tensor:
        r"""Logits with sites replaced; gradients flow into the replacements. After
        :meth:`capture` on the same ids (or on ids that Captum repeated along the
        batch), the sites before the first replaced one are not recomputed."""
        reused: Dict[str, Any] = {}
        if call.module_outputs is not None and call.captured_ids is not None:
            times = _repeats(call.captured_ids, call.ids)
            if times:
                reused = self._reused_before(call.module_outputs, list(replacements), times)
        with self.locator.reuse(reused), self.locator.replace(replacements):
            return self.model_forward(call.ids, call.extra)

    def _reused_before(self, module_outputs: Mapping[str, Any], sites: Sequence[str], times: int = 1) -> Dict[str, Any]:
        r"""The recorded outputs of the site modules up to the first of ``sites``
        (that one included: its replacement hook still runs), for
        :meth:`SiteLocator.reuse`, repeated ``times`` along the batch."""
        names = self.locator.names
        first = min(names.index(self.locator.site(s).name) for s in sites)
        return {
            name: repeat_batch(module_outputs[name], times) if times > 1 else module_outputs[name]
            for name in names[: first + 1]
            if name in module_outputs
        }


class ReplacingAttribution(SiteAttribution):
    r"""
    Base of the methods that replace a site's states by a reference state (the
    baseline): Integrated Gradients' path start, what Occlusion and exact
    erasure put in place of a token. The constructor's ``baselines`` is the
    default; ``attribute(..., baselines=)`` overrides it for one call.

    Args:

        model, sites, forward_func, padding_mask_arg, output: the analysed model and how
                    to call it, as in :class:`SiteAttribution`.
        baselines (float or Tensor, optional): the reference state: None for zeros
                    (the authors' choice), a constant, a vector (H,) for every token
                    (e.g. a fitted DiffMask's learned baseline) or a full (B, T, H)
                    tensor. Padded positions always keep their state. Default: None
    """

    uses_baselines = True

    def __init__(
        self, model: nn.Module, sites: SitesType = None, forward_func: ForwardFunc = None,
        padding_mask_arg: PaddingMaskArg = "auto", output: str = "auto",
        baselines: BaselineType = None,
    ) -> None:
        super().__init__(model, sites, forward_func, padding_mask_arg, output)
        self.baselines = baselines

    def baseline_for(self, call: PreparedCall, state: Tensor, baselines: BaselineType = None) -> Tensor:
        r"""
        The reference state of one call.

        Args:

            call (PreparedCall): the prepared call (its padding mask is read).
            state (Tensor): (B, T, H) the site's states.
            baselines (float or Tensor, optional): the call's ``baselines``; the
                        constructor's when None. Default: None

        Returns:
            *Tensor* (B, T, H), equal to ``state`` at padding (:func:`resolve_baseline`).
        """
        return resolve_baseline(self.baselines if baselines is None else baselines, state, call.mask)


def _repeats(captured: Tensor, ids: Tensor) -> int:
    r"""m when ``ids`` is ``captured`` repeated m times along the batch (how Captum
    expands a batch), else 0 (the recorded outputs do not apply)."""
    if ids is captured:
        return 1
    batch = captured.shape[0]
    if batch == 0 or ids.shape[0] % batch or ids.shape[1:] != captured.shape[1:]:
        return 0
    times = ids.shape[0] // batch
    return times if torch.equal(ids.reshape(times, *captured.shape), captured.expand(times, *captured.shape)) else 0


def resolve_target(logits: Tensor, target: TargetType, argument: str = "target") -> Optional[Tensor]:
    r"""
    The class whose output is attributed, per example.

    Args:

        logits (Tensor): (B, C) class logits, (B, K, C) for K distributions per
                    example (e.g. a span's start and end), or (B,) / (B, 1) for one
                    binary logit.
        target (int, list, Tensor or None): for (B, C) logits an int, a list of B
                    ints or a (B,) tensor; for (B, K, C) logits a (B, K) tensor or
                    a list of B sequences of K ints; None means the predicted
                    class (of each distribution). For a binary logit it must be
                    None (the logit itself is attributed).

    Returns:
        *Tensor* (B,) or (B, K) long; None for a binary logit.
    """
    batch = logits.shape[0]
    if logits.dim() == 3:
        return _resolve_targets(logits, target, argument)
    if logits.dim() == 1 or (logits.dim() == 2 and logits.shape[1] == 1):
        if target is not None:
            raise ValueError(
                f"{argument} must be None for a model with one binary logit (the logit "
                f"itself is attributed), got {target!r}"
            )
        return None
    num_classes = logits.shape[-1]
    if target is None:
        return logits.argmax(-1)
    if isinstance(target, bool):
        raise TypeError(f"{argument} must be an int, a list of ints or a (B,) tensor, got a bool")
    if isinstance(target, int):
        target = torch.full((batch,), target, dtype=torch.long, device=logits.device)
    elif isinstance(target, (list, tuple)):
        if not all(isinstance(t, int) and not isinstance(t, bool) for t in target):
            raise TypeError(f"{argument}: a list target must hold ints, got {target!r}")
        target = torch.tensor(list(target), dtype=torch.long, device=logits.device)
    elif isinstance(target, Tensor):
        if target.dtype.is_floating_point or target.dtype == torch.bool:
            raise TypeError(f"{argument} must hold integer class indices, got dtype {target.dtype}")
        if target.dim() == 0:
            target = target.expand(batch)
        target = target.to(device=logits.device, dtype=torch.long)
    else:
        raise TypeError(
            f"{argument} must be None, an int, a list of ints or a (B,) tensor, got "
            f"{type(target).__name__}"
        )
    if target.shape != (batch,):
        raise ValueError(f"{argument} must have one class per example ({batch}), got shape {tuple(target.shape)}")
    if bool(((target < 0) | (target >= num_classes)).any()):
        raise ValueError(f"{argument} must be in 0..{num_classes - 1}, got {target.tolist()}")
    return target


def _resolve_targets(logits: Tensor, target: Any, argument: str) -> Tensor:
    r"""One class per distribution of (B, K, C) logits: (B, K) long."""
    batch, count, classes = logits.shape
    if target is None:
        return logits.argmax(-1)
    if isinstance(target, (list, tuple)):
        target = torch.tensor([list(row) for row in target], dtype=torch.long, device=logits.device)
    if not isinstance(target, Tensor) or target.dtype.is_floating_point or target.dtype == torch.bool:
        raise TypeError(f"{argument} must be a ({batch}, {count}) tensor or a list of {count} ints per example")
    target = target.to(device=logits.device, dtype=torch.long)
    if target.shape != (batch, count):
        raise ValueError(f"{argument} must have shape ({batch}, {count}) (one class per distribution), "
                         f"got {tuple(target.shape)}")
    if bool(((target < 0) | (target >= classes)).any()):
        raise ValueError(f"{argument} must be in 0..{classes - 1}, got {target.tolist()}")
    return target


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


def method_trait(method: Any, trait: str) -> Any:
    r"""What ``method`` says of itself (``uses_target``, ``needs_data``,
    ``scores_are_probabilities``, ...), with :class:`SiteAttribution`'s default
    for an object that does not say (e.g. one of Captum's own attributions):
    the defaults live in one place."""
    return getattr(method, trait, getattr(SiteAttribution, trait))
