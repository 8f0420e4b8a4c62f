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
import inspect
from typing import Any, Callable, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple, TypeVar, Union

import torch
from captum.attr import Attribution
from captum.log import log_usage
from torch import nn, Tensor

from captum_diffmask.model.activations import repeat_batch
from captum_diffmask.model.arguments import (
    BaselineType, ForwardFunc, PaddingMaskArg, PreparedCall, resolve_baseline, site_for_layer,
)
from captum_diffmask.model.batches import to_device
from captum_diffmask.model.forward import (
    evaluation_mode, format_additional_args, is_hf_model, model_device, ModelForward,
)
from captum_diffmask.model.inputs import (
    check_positions, check_text_model, check_token_ids, check_vocabulary, position_limit,
)
from captum_diffmask.model.rng import preserved_rng
from captum_diffmask.model.site_check import checked_sites
from captum_diffmask.model.sites import Replacement, SiteLocator

#: Where the sites are: a :class:`SiteLocator`, a dict ``{"input": ..., "hidden": [...]}``,
#: or None to locate them (Hugging Face models).
SitesType = Union[None, SiteLocator, Mapping[str, Any]]

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
        check_keywords(f"{type(args[0]).__name__ if args else method.__qualname__}.attribute()", kwargs, method)
        model = getattr(args[0], "model", None) if args else None
        with preserved_rng(), evaluation_mode(model if isinstance(model, nn.Module) else None):
            return logged(*args, **kwargs)

    call.attribution_call = True  # type: ignore[attr-defined]  # for the contract's tests
    return call  # type: ignore[return-value]


#: The words that open a method's verdict on its own numbers, passed and failed.
CHECKED, FAILED_CHECK = "checked", "failed check"


def check_verdict(finding: str, passed: bool) -> str:
    r"""
    The verdict of a method without a fit of its own on its last call's numbers
    (Integrated Gradients' completeness gap), which views show where a fitted
    probe shows its convergence status.

    Args:

        finding (str): what was measured, e.g. ``"completeness gap 0.003 of F(h) - F(b)"``.
        passed (bool): within the method's tolerance.

    Returns:
        *str*: ``"checked: <finding>"`` or ``"failed check: <finding>"``.
    """
    return f"{CHECKED if passed else FAILED_CHECK}: {finding}"


#: Why a keyword of Captum's own methods is not taken, where the reason is not
#: the method's docstring's alone.
NOT_TAKEN = {"baselines": "it has no baseline argument (DiffMask replaces gated positions by the baseline its "
                          "fit learned; IntegratedGradients and Occlusion take baselines=)"}


def check_keywords(caller: str, given: Iterable[str], *functions: Callable[..., Any]) -> None:
    r"""
    Refuses a keyword that none of ``functions`` takes by name (a function with
    ``**kwargs`` takes any), with a TypeError that names it, why where known
    (:data:`NOT_TAKEN`), and what ``caller`` takes (Python's own error names
    the inner function a call was passed on to, and neither of the others).
    """
    parameters = [inspect.signature(f).parameters for f in functions]
    takes = [name for p in parameters for name, each in p.items()
             if name != "self" and each.kind not in (each.VAR_POSITIONAL, each.VAR_KEYWORD)]
    if any(each.kind is each.VAR_KEYWORD for p in parameters[-1:] for each in p.values()):
        return
    for name in given:
        if name not in takes:
            why = f": {NOT_TAKEN[name]}" if name in NOT_TAKEN else ""
            raise TypeError(f"{caller} does not take {name}={why}; it takes {', '.join(dict.fromkeys(takes))}")


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
        check_text_model(model)
        self.model_forward = ModelForward(model, forward_func, padding_mask_arg, output)
        Attribution.__init__(self, self.model_forward)
        self.model = model
        self.locator = SiteLocator.locate(model, sites)
        #: whether the sites passed the self-check (:meth:`_check_sites`)
        self._sites_checked = False
        embedding = self.locator.site("input").module
        #: the number of token ids the input embedding takes (None: not an nn.Embedding)
        self._vocabulary_size = embedding.num_embeddings if isinstance(embedding, nn.Embedding) else None
        #: the most tokens a call may hold (None: no learned table of positions)
        self._position_limit = position_limit(model)

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
        r"""Validates ``inputs`` (named ``argument`` in errors; token ids, a
        batch tuple ``(ids, *additional_forward_args)`` or a mapping batch such
        as a tokenizer's output, whose targets are dropped), ``layer`` and the
        padding mask, and puts the tensors on the model's device. A batch
        tuple's scores come back as one tensor (its extras are not scored)."""
        if isinstance(inputs, Mapping) or (isinstance(inputs, (tuple, list)) and len(inputs) > 1):
            if additional_forward_args is not None:
                raise ValueError(f"additional_forward_args must be None when {argument} is a batch "
                                 f"{'mapping' if isinstance(inputs, Mapping) else 'tuple'} (its attention_mask "
                                 "and token_type_ids are read from it)")
            inputs, additional_forward_args = self.model_forward.split_batch(inputs)
        ids, was_tuple = check_token_ids(inputs, argument)
        site = self._site(layer)
        device = ids.device
        check_vocabulary(ids, self._vocabulary_size, argument)
        check_positions(ids, self._position_limit, argument)
        ids, extra = to_device(ids, format_additional_args(additional_forward_args), model_device(self.model))
        if self.model_forward.forward_func is None and is_hf_model(self.model):
            self.model_forward.keywords(extra)  # before any pass: what the model lacks, named
        length = ids.shape[1]
        ids, extra = self.model_forward.padded_to_window(ids, extra)
        mask = self.model_forward.padding_mask(ids, extra)
        empty = (~mask).all(dim=1).nonzero().flatten().tolist()
        if empty:  # its scores would be all 0, which reads as "nothing matters"
            raise ValueError(f"{argument}: row {empty[0]} has no real token (its padding mask is all 0"
                             f"{f'; {len(empty)} such rows' if len(empty) > 1 else ''}): drop it from the batch")
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
        r"""Once per explainer, on its first batch: the sites against the model's
        own hidden states (:func:`~captum_diffmask.model.site_check.checked_sites`),
        whose layouts are learnt there."""
        if self.model_forward.forward_func is None and is_hf_model(self.model):
            self.locator = checked_sites(self.model, self.locator, self.num_layers, call)
        self._sites_checked = True

    def replaced_logits(self, call: PreparedCall, replacements: Mapping[str, Replacement]) -> Tensor:
        r"""Logits with sites replaced; gradients flow into the replacements. After
        :meth:`capture` on the same ids (or on ids that Captum repeated along the
        batch), the sites before the first replaced one are not recomputed."""
        reused: Dict[str, Any] = {}
        if call.module_outputs is not None and call.captured_ids is not None:
            times = _repeats(call.captured_ids, call.ids)
            if times:
                reused = self._reused_before(call.module_outputs, list(replacements), times,
                                             call.captured_ids.shape[0])
        with self.locator.reuse(reused), self.locator.replace(replacements):
            return self.model_forward(call.ids, call.extra)

    def _reused_before(
        self, module_outputs: Mapping[str, Any], sites: Sequence[str], times: int = 1, batch: int = 0
    ) -> Dict[str, Any]:
        r"""The recorded outputs of the site modules up to the first of ``sites``
        (that one included: its replacement hook still runs), for
        :meth:`SiteLocator.reuse`, repeated ``times`` along the batch of ``batch`` rows."""
        names = self.locator.names
        first = min(names.index(self.locator.site(s).name) for s in sites)
        return {
            name: repeat_batch(module_outputs[name], times, batch) if times > 1 else module_outputs[name]
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


def method_name(method: Any) -> str:
    r"""The name ``method`` goes by in tables and reports: its ``name()`` (the
    name it is registered under), or its class name for an object that does not
    say (one of Captum's own)."""
    named = getattr(method, "name", None)
    return named() if callable(named) else type(method).__name__


def method_trait(method: Any, trait: str) -> Any:
    r"""What ``method`` says of itself (``uses_target``, ``needs_data``,
    ``scores_are_probabilities``, ...), with :class:`SiteAttribution`'s default
    for an object that does not say (e.g. one of Captum's own attributions):
    the defaults live in one place."""
    return getattr(method, trait, getattr(SiteAttribution, trait))
