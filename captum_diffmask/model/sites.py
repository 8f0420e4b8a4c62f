"""Sites: the places in a model whose activations every method reads and replaces.

For a model with L blocks there are L + 2 sites, in the order the data flows:

- ``input``: the token embeddings (before position/type embeddings);
- ``hidden.0``: the input of the first block (for BERT-like models, the output of
  the embeddings module);
- ``hidden.k``, k = 1..L: the output of block k-1 (Hugging Face's
  ``hidden_states[k]`` numbering).

A :class:`SiteLocator` holds them (found by :mod:`captum_diffmask.model.site_finding`,
or the modules the user names) and offers context managers built on plain torch
hooks, always removed in ``finally``:
:meth:`SiteLocator.capture` records activations during a forward pass and
:meth:`SiteLocator.replace` substitutes them.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Callable, Dict, Iterator, List, Mapping, Optional, Sequence, Tuple, Union

from torch import nn, Tensor

from captum_diffmask.model.activations import (
    copied, first_tensor, on_call, streams_layout, streams_side_by_side, transposed, windowed, with_first_tensor,
)
from captum_diffmask.model.site_finding import find_site_specs, HOW_TO_PASS_SITES, SiteSpec

#: A replacement: a tensor shaped like the activation, or a function of it.
Replacement = Union[Tensor, Callable[[Tensor], Tensor]]

_PORTS = ("output", "input")


@dataclass(frozen=True)
class Site:
    r"""One readable and replaceable activation.

    Args:

        name (str): ``"input"`` or ``"hidden.k"``.
        module (nn.Module): the module the hook sits on.
        port (str): ``"output"`` (a forward hook on the module's output) or
                    ``"input"`` (a forward pre-hook on its first input).
        call (int, optional): for a module that runs several times in one forward
                    pass (ALBERT's shared block, an embedding that an encoder and a
                    decoder share), which run the site is, from 0; None when the
                    module runs once. Default: None
        tokens_first (bool, optional): the module's activation is (T, B, H), as
                    in XLNet; the hooks show it to the library as (B, T, H) and
                    put a replacement back as (T, B, H). Default: False
        features_first (bool, optional): the module's activation is (B, H, T), as
                    in SqueezeBERT's convolutions; shown as (B, T, H), put back as
                    (B, H, T). Default: False
        streams (str, optional): where a model with several residual streams
                    keeps them: ``""`` (one stream), ``"after_tokens"`` ((B, T, S, H),
                    DeepSeek V4's hyper-connections) or ``"first"`` ((S, B, T, H),
                    Gemma 3n's AltUp). The hooks show the library a token's
                    streams side by side, (B, T, S * H), so one gate replaces a
                    token in every stream. Default: ``""``
        window (tuple of int, optional): ``(offset, ratio)`` for a model that runs
                    its blocks on more positions than the ids: of T' positions,
                    the ids' are ``offset .. offset + (T' - offset) // ratio``
                    (CPM-Ant prepends a fixed prompt, ``(P, 1)``; ProphetNet
                    appends its n-gram streams, ``(0, n + 1)``). The hooks show
                    those T and put a replacement back among the others.
                    Default: ``(0, 1)``, every position
    """

    name: str
    module: nn.Module
    port: str = "output"
    call: Optional[int] = None
    tokens_first: bool = False
    features_first: bool = False
    streams: str = ""
    window: Tuple[int, int] = (0, 1)


def _resolve_module(model: nn.Module, spec: Union[nn.Module, str], what: str) -> nn.Module:
    if isinstance(spec, nn.Module):
        return spec
    if isinstance(spec, str):
        try:
            return model.get_submodule(spec)
        except AttributeError as error:
            raise ValueError(
                f"sites: {what} path {spec!r} is not a submodule of "
                f"{type(model).__name__}"
            ) from error
    raise TypeError(
        f"sites: {what} must be an nn.Module or a dotted path, got "
        f"{type(spec).__name__}"
    )


def _parse_spec(model: nn.Module, spec: SiteSpec, name: str) -> Site:
    port, call = "output", None
    if isinstance(spec, tuple):
        if len(spec) not in (2, 3) or spec[1] not in _PORTS or (
            len(spec) == 3 and (isinstance(spec[2], bool) or not isinstance(spec[2], int) or spec[2] < 0)
        ):
            raise ValueError(
                f"sites: {name} must be (module or path, 'output' | 'input'[, call index >= 0]), got {spec!r}"
            )
        spec, port, call = (spec + (None,))[:3] if len(spec) == 2 else spec
    return Site(name, _resolve_module(model, spec, name), port, call)


class SiteLocator:
    r"""
    The ordered sites ``input, hidden.0, ..., hidden.L`` of a model, with capture
    and replace contexts on plain torch hooks.

    Args:

        model (nn.Module): the analysed model.
        input (SiteSpec): the token-embedding site.
        hidden (sequence of SiteSpec): ``hidden.0`` .. ``hidden.L`` in data-flow
                    order; at least one.

    Use :meth:`locate` to build one for a Hugging Face model or from a dict.
    """

    def __init__(self, model: nn.Module, input: SiteSpec, hidden: Sequence[SiteSpec]) -> None:
        if not isinstance(model, nn.Module):
            raise TypeError(f"model must be an nn.Module, got {type(model).__name__}")
        if isinstance(hidden, (str, nn.Module, tuple)) or len(hidden) == 0:
            raise ValueError("sites: 'hidden' must be a non-empty list of sites")
        self.model = model
        sites = [_parse_spec(model, input, "input")]
        sites += [_parse_spec(model, spec, f"hidden.{k}") for k, spec in enumerate(hidden)]
        self._sites: "OrderedDict[str, Site]" = OrderedDict((s.name, s) for s in sites)

    # ------------------------------------------------------------------ lookup
    @classmethod
    def locate(
        cls,
        model: nn.Module,
        sites: Union[None, "SiteLocator", Mapping[str, Any]] = None,
    ) -> "SiteLocator":
        r"""
        Finds the sites of ``model``.

        Args:

            model (nn.Module): the analysed model.
            sites (SiteLocator or dict, optional): explicit sites,
                        ``{"input": spec, "hidden": [spec, ...]}``; when None the
                        architecture registry is used (BERT, RoBERTa, DistilBERT,
                        ELECTRA, GPT-2), then a generic fallback (the input
                        embeddings and the blocks: :mod:`~captum_diffmask.model.site_finding`).
                        Default: None

        Returns:
            *SiteLocator* for ``model``.

        Raises:
            ValueError: when the sites cannot be found; the message says how to
                        pass them.
        """
        if isinstance(sites, SiteLocator):
            if sites.model is not model:
                raise ValueError("sites: the SiteLocator was built for another model")
            return sites
        if sites is not None:
            if not isinstance(sites, Mapping) or set(sites) != {"input", "hidden"}:
                raise ValueError(
                    "sites must be a SiteLocator or a dict with exactly the keys "
                    "'input' and 'hidden'. " + HOW_TO_PASS_SITES
                )
            return cls(model, sites["input"], sites["hidden"])
        return cls(model, *find_site_specs(model))

    @property
    def names(self) -> List[str]:
        r"""All site names in data-flow order: ``["input", "hidden.0", ...]``."""
        return list(self._sites)

    @property
    def num_layers(self) -> int:
        r"""L: the last hidden site is ``hidden.L``; ``layer`` ranges over 0..L."""
        return len(self._sites) - 2

    def site(self, name: str) -> Site:
        r"""The site called ``name``; ValueError naming the valid ones otherwise."""
        if name not in self._sites:
            raise ValueError(f"unknown site {name!r}; the sites are {self.names}")
        return self._sites[name]

    def describe(self) -> List[Tuple[str, str, str]]:
        r"""``(name, module path, port)`` for each site, for reports and checkpoints;
        a call-indexed site's path ends with ``#k`` (its k-th run)."""
        paths = {module: path for path, module in reversed(list(self.model.named_modules()))}
        return [(s.name, paths.get(s.module, "?") + ("" if s.call is None else f"#{s.call}"), s.port)
                for s in self._sites.values()]

    # ----------------------------------------------------------------- hooking
    def _register(self, site: Site, fn: Callable[[Tensor], Optional[Tensor]], prepend: bool) -> Any:
        r"""Registers ``fn(activation) -> replacement or None`` on a site (on the
        site's run only, for a module that runs several times in a forward pass)."""
        if site.tokens_first:
            fn = transposed(fn, 0)
        if site.features_first:
            fn = transposed(fn, 2)
        if site.streams:
            fn = streams_side_by_side(fn, site.streams)
        if site.window != (0, 1):
            fn = windowed(fn, *site.window)
        if site.call is not None:
            fn, reset = on_call(fn, site.call)
            return _Handles([self.model.register_forward_pre_hook(reset), self._hook(site, fn, prepend)])
        return self._hook(site, fn, prepend)

    @staticmethod
    def _hook(site: Site, fn: Callable[[Tensor], Optional[Tensor]], prepend: bool) -> Any:
        if site.port == "output":

            def output_hook(module: nn.Module, args: Any, output: Any) -> Any:
                new = fn(first_tensor(output))
                return None if new is None else with_first_tensor(output, new)

            return site.module.register_forward_hook(output_hook, prepend=prepend)

        def input_hook(module: nn.Module, args: Tuple[Any, ...], kwargs: Dict[str, Any]) -> Any:
            if args:
                new = fn(first_tensor(args[0]))
                return None if new is None else ((new,) + tuple(args[1:]), kwargs)
            key = "hidden_states" if "hidden_states" in kwargs else next(
                (k for k, v in kwargs.items() if isinstance(v, Tensor)), None
            )
            if key is None:
                raise TypeError(f"site {site.name}: the module received no tensor input")
            new = fn(kwargs[key])
            if new is None:
                return None
            return args, {**kwargs, key: new}

        return site.module.register_forward_pre_hook(
            input_hook, with_kwargs=True, prepend=prepend
        )

    @property
    def reusable(self) -> bool:
        r"""Whether a replaced pass may reuse recorded site outputs: every site's
        module runs once per forward pass (no call-indexed sites), and holds the
        batch first (a reused output is repeated along its first axis)."""
        return all(site.call is None and not site.tokens_first and site.streams != "first"
                   for site in self._sites.values())

    def tokens_first(self) -> "SiteLocator":
        r"""The same sites read as (T, B, H) activations (:attr:`Site.tokens_first`):
        for a model that runs its blocks on tokens-first states."""
        return self._changed({name: {"tokens_first": True} for name in self._sites})

    def features_first(self, names: Sequence[str]) -> "SiteLocator":
        r"""The same sites, ``names`` read as (B, H, T) activations
        (:attr:`Site.features_first`)."""
        return self._changed({name: {"features_first": True} for name in names})

    def _changed(self, changes: Mapping[str, Mapping[str, Any]]) -> "SiteLocator":
        r"""A copy with the fields ``changes[name]`` of each named site replaced
        (the locator's layouts, learnt by the sites' self-check)."""
        changed = copy.copy(self)
        changed._sites = OrderedDict((name, dataclasses.replace(site, **changes.get(name, {})))
                                     for name, site in self._sites.items())
        return changed

    def inside_blocks(self) -> Optional["SiteLocator"]:
        r"""
        The same sites one level down, for a model that calls its blocks'
        ``forward`` directly (SqueezeBERT), so that no hook on a block fires: a
        ``hidden.k`` read at a block's input is read at the input of its first
        child module, one read at a block's output at the output of its last.

        Returns:
            *SiteLocator*, or None when a hidden site's module has no children
            or is call-indexed.
        """
        changes = {}
        for name, site in self._sites.items():
            if name == "input":
                continue
            children = list(site.module.children())
            if not children or site.call is not None:
                return None
            changes[name] = {"module": children[0] if site.port == "input" else children[-1]}
        return self._changed(changes)

    def windowed(self, names: Sequence[str], offset: int, ratio: int) -> "SiteLocator":
        r"""The same sites, ``names`` read on the ids' positions only
        (:attr:`Site.window`)."""
        return self._changed({name: {"window": (offset, ratio)} for name in names})

    def with_streams(self, states: Mapping[str, Tensor], batch_tokens: Tuple[int, int]) -> "SiteLocator":
        r"""
        The same sites, each read as (B, T, S * H) where its captured activation
        holds several residual streams (:attr:`Site.streams`).

        Args:

            states (dict): site name -> an activation captured as the hooks
                        give it now (without a streams layout).
            batch_tokens (tuple of int): (B, T) of that pass.

        Returns:
            *SiteLocator*, this one when no site holds several streams.
        """
        layouts = {name: streams_layout(state, batch_tokens) for name, state in states.items()}
        if not any(layouts.values()):
            return self
        return self._changed({name: {"streams": layout} for name, layout in layouts.items() if layout})

    @contextlib.contextmanager
    def capture(
        self,
        names: Optional[Sequence[str]] = None,
        stop_early: bool = False,
        module_outputs: Optional[Dict[str, Any]] = None,
    ) -> Iterator[Dict[str, Tensor]]:
        r"""
        Records site activations during the forward passes run inside the block.

        Args:

            names (sequence of str, optional): the sites to record; all when None.
                        Default: None
            stop_early (bool, optional): abort the forward pass as soon as every
                        requested site has been recorded (the rest of the model is
                        not needed); the block then ends at that forward call.
                        Default: False
            module_outputs (dict, optional): when given, output-port sites also
                        store their module's whole output (tuple, ModelOutput, ...)
                        here, for :meth:`reuse`. Default: None

        Returns:
            *dict* from site name to the activation tensor (B, T, H), filled as the
            forward pass reaches each site. Activations keep their graph unless
            the pass runs under ``torch.no_grad()``.
        """
        wanted = self.names if names is None else [self.site(n).name for n in names]
        states: Dict[str, Tensor] = {}

        def recorder(name: str) -> Callable[[Tensor], None]:
            def record(activation: Tensor) -> None:
                states[name] = activation.clone()
                if stop_early and len(states) == len(wanted):
                    raise _StopForward()

            return record

        def output_recorder(name: str) -> Callable[..., None]:
            def record_output(module: nn.Module, args: Any, output: Any) -> None:
                assert module_outputs is not None
                module_outputs[name] = copied(output)

            return record_output

        with _removed_on_exit() as handles:
            for name in wanted:
                handles.append(self._register(self._sites[name], recorder(name), False))
                site = self._sites[name]
                if module_outputs is not None and site.port == "output" and site.call is None:
                    handles.append(site.module.register_forward_hook(output_recorder(name)))
            try:
                yield states
            except _StopForward:
                pass

    @contextlib.contextmanager
    def replace(self, replacements: Mapping[str, Replacement]) -> Iterator[None]:
        r"""
        Substitutes site activations during the forward passes run inside the block.

        Args:

            replacements (dict): site name to a tensor shaped like the activation
                        (B, T, H), or to a function ``activation -> tensor``.
                        Replacement hooks run before capture hooks on the same
                        module, so a capture sees the replaced value.

        Raises:
            ValueError: at forward time, when a replacement tensor's shape differs
                        from the activation's.
        """
        def replacer(name: str, value: Replacement) -> Callable[[Tensor], Tensor]:
            def substitute(activation: Tensor) -> Tensor:
                new = value(activation) if callable(value) else value
                if new.shape != activation.shape:
                    raise ValueError(
                        f"replacement for site {name} has shape {tuple(new.shape)}, "
                        f"the activation has {tuple(activation.shape)}"
                    )
                return new

            return substitute

        with _removed_on_exit() as handles:
            for name, value in replacements.items():
                site = self.site(name)
                handles.append(self._register(site, replacer(name, value), True))
            yield

    @contextlib.contextmanager
    def reuse(self, module_outputs: Mapping[str, Any]) -> Iterator[None]:
        r"""
        Output-port sites return a recorded output instead of running their module.

        For a frozen model, everything up to a masked site is the same in every
        pass, so a replaced pass need only run the blocks after it: the recorded
        outputs of the earlier sites stand in for their modules (their hooks still
        run, so a replacement on a reused site still applies).

        Args:

            module_outputs (dict): site name to the module's whole output, as
                        recorded by ``capture(..., module_outputs=...)``. Input-port
                        sites cannot be reused (ValueError). Assumes each module
                        runs once per forward pass.
        """
        # module -> the instance-level forward it had before (e.g. one that
        # accelerate installs on a device-mapped model), or _NO_FORWARD
        patched: Dict[nn.Module, Any] = {}
        try:
            for name, output in module_outputs.items():
                site = self.site(name)
                if site.port != "output" or site.call is not None:
                    raise ValueError(f"site {name} reads a module input or one run of a module that runs "
                                     "several times, and cannot be reused")
                if site.module in patched:
                    continue
                patched[site.module] = vars(site.module).get("forward", _NO_FORWARD)
                site.module.forward = _returning(output)  # an instance attribute
            yield
        finally:
            for module, previous in patched.items():
                if previous is _NO_FORWARD:
                    del module.forward  # the class's forward is back
                else:
                    module.forward = previous  # the forward someone else set is back


def _returning(output: Any) -> Callable[..., Any]:
    def forward(*args: Any, **kwargs: Any) -> Any:
        return copied(output)  # the model may edit what it gets in place

    return forward


@contextlib.contextmanager
def _removed_on_exit() -> Iterator[List[Any]]:
    r"""A list to put hook handles in: every one is removed on exit, also when
    the block raises (a forward that fails leaves no hook behind)."""
    handles: List[Any] = []
    try:
        yield handles
    finally:
        for handle in handles:
            handle.remove()


class _Handles:
    r"""Several hook handles removed together."""

    def __init__(self, handles: List[Any]) -> None:
        self.handles = handles

    def remove(self) -> None:
        for handle in self.handles:
            handle.remove()


#: Marks a module that had no instance-level forward before :meth:`SiteLocator.reuse`.
_NO_FORWARD = object()


class _StopForward(Exception):
    r"""Raised inside a capture hook to abort a forward pass early."""
