"""How every method calls the analysed model: inputs, extra arguments, padding, logits.

Captum's convention is ``forward_func(inputs, *additional_forward_args)``. Hugging
Face models take keywords and return a ``ModelOutput``; :class:`ModelForward` hides
that difference, finds the padding mask among the extra arguments, and checks the
token ids, so that every method in the library talks to models the same way.
"""

from __future__ import annotations

import contextlib
import inspect
import warnings
from typing import Any, Callable, Iterator, Optional, Tuple, Union

import torch
from torch import nn, Tensor

from captum_diffmask.model.batches import Batch, hf_extras, HF_EXTRAS, ON_THE_IDS, split_batch
from captum_diffmask.model.outputs import is_causal_lm, is_seq2seq_lm, OUTPUTS, read_output, resolve_output



def model_device(model: nn.Module) -> torch.device:
    r"""Where the model computes: the execution device of accelerate's hook on a
    dispatched or offloaded model, else the device of its first parameter that
    holds data (not ``meta``), else the CPU."""
    device = getattr(getattr(model, "_hf_hook", None), "execution_device", None)
    if device is not None:
        return torch.device(device)
    for parameter in model.parameters():
        if parameter.device.type != "meta":
            return parameter.device
    return torch.device("cpu")


def is_hf_model(model: nn.Module) -> bool:
    r"""True for Hugging Face ``PreTrainedModel``s (duck-typed, no import)."""
    return hasattr(model, "config") and hasattr(model, "base_model_prefix")


def format_additional_args(additional_forward_args: Any) -> Tuple[Any, ...]:
    r"""Captum's convention: None -> (), a tuple stays, anything else -> (x,)."""
    if additional_forward_args is None:
        return ()
    if isinstance(additional_forward_args, tuple):
        return additional_forward_args
    if isinstance(additional_forward_args, list):
        return tuple(additional_forward_args)
    return (additional_forward_args,)


def padded_positions(model: nn.Module, attention_mask: Optional[Tensor]) -> dict:
    r"""
    ``{"position_ids": ...}`` counted over real tokens only, for a causal language
    model that takes them, as Hugging Face's ``generate`` does: a left-padded prompt
    then sees the positions it sees alone (absolute position embeddings, GPT-2's,
    would otherwise shift with the padding). Right padding leaves every real
    position as it was. Empty for other models or without a mask.

    Args:

        model (nn.Module): the analysed model.
        attention_mask (Tensor or None): (B, T), 1 at real tokens.

    Returns:
        *dict*: ``{"position_ids": (B, T) long}`` (padded positions at 1, as
        ``generate`` sets them), or ``{}``.
    """
    if attention_mask is None or not isinstance(attention_mask, Tensor) or not is_causal_lm(model):
        return {}
    if "position_ids" not in inspect.signature(model.forward).parameters:
        return {}
    real = attention_mask.long()
    return {"position_ids": (real.cumsum(-1) - 1).masked_fill(real == 0, 1)}


class ModelForward:
    r"""
    Calls the analysed model the way every method of the library does.

    Args:

        model (nn.Module): the analysed model.
        forward_func (Callable, optional): ``forward_func(ids, *extra) -> output``;
                    when None, the model itself (Hugging Face models are called
                    with ``input_ids``, ``attention_mask`` and ``token_type_ids``
                    from the positional extras; an encoder-decoder with
                    ``attention_mask``, ``decoder_input_ids`` and
                    ``decoder_attention_mask``: :func:`~captum_diffmask.model.batches.hf_extras`).
                    The output may be a Tensor, a ``ModelOutput`` with ``logits``,
                    or a tuple. Default: None
        padding_mask_arg (int, str or None, optional): index in
                    ``additional_forward_args`` of the (B, T) padding mask (1 or
                    True = real token); ``"auto"``: 0 for Hugging Face models (the
                    attention mask), None otherwise (no padding).
                    Default: ``"auto"``
        output (str, optional): the distributions kept (see
                    :mod:`captum_diffmask.model.outputs`): ``"classes"`` ((B, C) logits),
                    ``"last"`` (a language model's next token at each row's last
                    real position), ``"all"`` (every real position), ``"span"``
                    (a question-answering head's start and end); ``"auto"``:
                    classes for (B, C) logits, span for start/end logits, last for
                    a causal language model, an error otherwise. Default: ``"auto"``
                    An encoder-decoder language model's ``"last"`` and ``"all"``
                    are over its decoder prefix's real positions (the next token
                    after each row's prefix; every position of it).
    """

    def __init__(
        self,
        model: nn.Module,
        forward_func: Optional[Callable[..., Any]] = None,
        padding_mask_arg: Union[int, str, None] = "auto",
        output: str = "auto",
    ) -> None:
        if output not in OUTPUTS:
            raise ValueError(f"output must be one of {OUTPUTS}, got {output!r}")
        if not isinstance(model, nn.Module):
            raise TypeError(f"model must be an nn.Module, got {type(model).__name__}")
        if forward_func is not None and not callable(forward_func):
            raise TypeError("forward_func must be callable")
        #: a model not Hugging Face's with padding_mask_arg="auto": no mask is
        #: read, and a 0/1 tensor among the arguments is warned about (once)
        self._may_miss_mask = padding_mask_arg == "auto" and not is_hf_model(model)
        if padding_mask_arg == "auto":
            padding_mask_arg = 0 if is_hf_model(model) else None
        if padding_mask_arg is not None and (
            not isinstance(padding_mask_arg, int) or padding_mask_arg < 0
        ):
            raise ValueError(
                f"padding_mask_arg must be 'auto', None or an index >= 0, got "
                f"{padding_mask_arg!r}"
            )
        self.model = model
        self.forward_func = forward_func
        self.padding_mask_arg = padding_mask_arg
        self.output = output  # "auto" until the first call resolves it
        #: the names of a Hugging Face model's extras, in order (:func:`hf_extras`)
        self.extra_names = hf_extras(model) if forward_func is None and is_hf_model(model) else HF_EXTRAS

    def __call__(self, inputs: Tensor, additional_forward_args: Any = None) -> Tensor:
        r"""
        Returns:
            *Tensor* of logits of the kept distributions (:func:`read_output`):
            (B, C), (B,) for a single binary logit, or (B, K, C).
        """
        extra = format_additional_args(additional_forward_args)
        with standard_attention_path():
            output = self._forward(inputs, extra)
        if self.output == "auto":
            self.output = resolve_output("auto", output, self.model)
        return read_output(output, self.output, self._output_mask(inputs, extra))

    def _output_mask(self, inputs: Tensor, extra: Tuple[Any, ...]) -> Tensor:
        r"""(B, positions of the output) bool: the ids' padding mask, or for an
        encoder-decoder language model its decoder prefix's."""
        if not (self.forward_func is None and is_seq2seq_lm(self.model)):
            return self.padding_mask(inputs, extra)
        named = dict(zip(self.extra_names, extra))
        prefix, mask = named.get("decoder_input_ids"), named.get("decoder_attention_mask")
        return mask.bool() if isinstance(mask, Tensor) else torch.ones(prefix.shape, dtype=torch.bool,
                                                                       device=prefix.device)

    def _forward(self, inputs: Tensor, extra: Tuple[Any, ...]) -> Any:
        if self.forward_func is not None:
            output = self.forward_func(inputs, *extra)
        elif is_hf_model(self.model):
            kwargs = self.keywords(extra)
            kwargs.update(padded_positions(self.model, kwargs.get("attention_mask")))
            with cache_off(self.model):
                output = self.model(input_ids=inputs, **kwargs)
        else:
            output = self.model(inputs, *extra)
        return output

    def keywords(self, extra: Tuple[Any, ...]) -> dict:
        r"""
        A Hugging Face model's keyword arguments from the positional extras.

        Args:

            extra (tuple): ``additional_forward_args`` (:attr:`extra_names` in order).

        Returns:
            *dict* name -> value, without the extras that are None.

        Raises:
            ValueError: more extras than the model takes, or an encoder-decoder
            language model without its decoder prefix (its own error names
            neither the argument nor the fix).
        """
        names = self.extra_names
        if len(extra) > len(names):
            raise ValueError(f"additional_forward_args: a Hugging Face {type(self.model).__name__} takes at most "
                             f"({', '.join(names)}); pass forward_func for others")
        kwargs = {n: a for n, a in zip(names, extra) if a is not None}
        if is_seq2seq_lm(self.model) and "decoder_input_ids" not in kwargs:
            start = getattr(self.model.config, "decoder_start_token_id", None)
            raise ValueError(
                f"{type(self.model).__name__} is an encoder-decoder: give the decoder's prefix, whose next token "
                "is attributed to the encoder's input tokens, as additional_forward_args=(attention_mask, "
                "decoder_input_ids) or the batch's key 'decoder_input_ids' (B, D), starting with "
                f"config.decoder_start_token_id ({start}); attribute_generation builds them for generated text")
        return kwargs

    @property
    def window(self) -> Optional[int]:
        r"""The length a Hugging Face model pads its input to a multiple of before
        its embeddings (``config.attention_window``: Longformer, LED), whose
        ``hidden_states`` it then cuts back; None for other models and with a
        ``forward_func``."""
        if self.forward_func is not None or not is_hf_model(self.model):
            return None
        window = getattr(getattr(self.model, "config", None), "attention_window", None)
        if isinstance(window, (list, tuple)) and window:
            window = max(window)
        return window if isinstance(window, int) and window > 1 else None

    def padded_to_window(self, inputs: Tensor, extra: Tuple[Any, ...]) -> Tuple[Tensor, Tuple[Any, ...]]:
        r"""
        The call padded as the model would pad it itself (:attr:`window`), so that
        the sites hold as many positions as the inputs: ids with the pad token,
        the attention mask and other (B, T) arguments with 0.

        Args:

            inputs (Tensor): (B, T) token ids.
            extra (tuple): the model's other arguments.

        Returns:
            *tuple* ``(ids, extra)``: (B, T') with T' the next multiple of the
            window (the call itself when there is none or T is one).
        """
        window, length = self.window, inputs.shape[1]
        if window is None or length % window == 0:
            return inputs, extra
        pad = window - length % window
        index = self.padding_mask_arg
        if index is not None and (index >= len(extra) or extra[index] is None):
            extra = extra + (None,) * (index + 1 - len(extra))
            extra = extra[:index] + (torch.ones_like(inputs),) + extra[index + 1:]
        pad_id = getattr(self.model.config, "pad_token_id", None)
        ids = nn.functional.pad(inputs, (0, pad), value=pad_id if isinstance(pad_id, int) else 0)
        on_the_ids = [i < len(self.extra_names) and self.extra_names[i] in ON_THE_IDS for i in range(len(extra))]
        extra = tuple(nn.functional.pad(a, (0, pad), value=0) if isinstance(a, Tensor) and on and a.shape == inputs.shape
                      else a for a, on in zip(extra, on_the_ids))
        return ids, extra

    def split_batch(self, batch: Batch) -> Tuple[Tensor, Tuple[Any, ...]]:
        r"""``(ids, additional_forward_args)`` of a batch for this model, targets
        dropped (:func:`captum_diffmask.model.batches.split_batch`)."""
        if self.forward_func is not None:
            return split_batch(batch, hf_model=False, forward=self.forward_func)
        if is_hf_model(self.model):
            ids, extra = split_batch(batch, hf_model=True, names=self.extra_names)
            self._check_token_types(extra)
            return ids, extra
        return split_batch(batch, hf_model=False, forward=self.model.forward)

    def _check_token_types(self, extra: Tuple[Any, ...]) -> None:
        r"""A tensor read as token_type_ids must index the model's token types
        (a (B, T) label tensor in its place, e.g. -100, would otherwise be fed)."""
        types = getattr(getattr(self.model, "config", None), "type_vocab_size", None)
        if self.extra_names[1] != "token_type_ids" or len(extra) < 2 or not isinstance(extra[1], Tensor) or not isinstance(types, int) or extra[1].numel() == 0:
            return
        low, high = int(extra[1].min()), int(extra[1].max())
        if low < 0 or high >= types:
            raise ValueError(
                f"batch: the element read as token_type_ids holds values {low}..{high}, but the model has "
                f"{types} token types; if it holds labels, pass the batch as a dict with the key labels"
            )

    def padding_mask(self, inputs: Tensor, additional_forward_args: Any = None) -> Tensor:
        r"""
        Returns:
            *Tensor* (B, T) bool, True at real tokens.
        """
        extra = format_additional_args(additional_forward_args)
        index = self.padding_mask_arg
        if index is None and self._may_miss_mask:
            self._warn_if_a_mask_is_passed(inputs, extra)
        if index is None or index >= len(extra) or extra[index] is None:
            return torch.ones(inputs.shape, dtype=torch.bool, device=inputs.device)
        mask = extra[index]
        if not isinstance(mask, Tensor) or mask.shape != inputs.shape:
            shape = tuple(mask.shape) if isinstance(mask, Tensor) else type(mask).__name__
            raise ValueError(
                f"additional_forward_args[{index}] is the padding mask and must have "
                f"the shape of inputs {tuple(inputs.shape)}, got {shape}"
            )
        if mask.dtype != torch.bool and not bool(((mask == 0) | (mask == 1)).all()):
            values = sorted({float(v) for v in mask.unique()[:6].tolist()})
            raise ValueError(f"additional_forward_args[{index}] is the padding mask and must hold 0 (padding) and "
                             f"1 (a real token), got the values {values}")
        return mask.bool()

    def _warn_if_a_mask_is_passed(self, inputs: Tensor, extra: Tuple[Any, ...]) -> None:
        for i, value in enumerate(extra):
            if not isinstance(value, Tensor) or value.shape != inputs.shape:
                continue
            zeros_and_ones = bool(((value == 0) | (value == 1)).all())
            if zeros_and_ones and bool((value == 0).any()):
                self._may_miss_mask = False  # once
                warnings.warn(
                    f"additional_forward_args[{i}] looks like a padding mask (0/1, the shape of inputs, with zeros), "
                    f"but padding_mask_arg is not set for this {type(self.model).__name__}: every position is scored "
                    f"as a real token; pass padding_mask_arg={i} (or padding_mask_arg=None to say there is none)",
                    UserWarning, stacklevel=4,
                )
                return


@contextlib.contextmanager
def standard_attention_path() -> Iterator[None]:
    r"""
    torch's fast path for ``nn.TransformerEncoder`` and ``nn.MultiheadAttention``
    off inside the block, restored on exit: in eval mode, with a padding mask,
    it runs the encoder's layers on nested tensors, whose states cannot be read
    or replaced per position.
    """
    enabled = torch.backends.mha.get_fastpath_enabled()
    torch.backends.mha.set_fastpath_enabled(False)
    try:
        yield
    finally:
        torch.backends.mha.set_fastpath_enabled(enabled)


@contextlib.contextmanager
def evaluation_mode(model: Optional[nn.Module]) -> Iterator[Optional[nn.Module]]:
    r"""
    ``model`` in eval mode (no dropout) inside the block, its own mode (of every
    submodule) restored on exit, also after an exception; None passes through.
    """
    if model is None:
        yield model
        return
    modes = [(module, module.training) for module in model.modules()]
    model.eval()
    try:
        yield model
    finally:
        for module, mode in modes:
            module.training = mode


@contextlib.contextmanager
def frozen(model: nn.Module) -> Iterator[nn.Module]:
    r"""
    The analysed model in eval mode (no dropout) with gradients off for its own
    parameters, while gradients still flow through its activations to whatever
    replaced them; both are restored on exit, also after an exception.
    """
    flags = [p.requires_grad for p in model.parameters()]
    with evaluation_mode(model):
        model.requires_grad_(False)
        try:
            yield model
        finally:
            for p, flag in zip(model.parameters(), flags):
                p.requires_grad_(flag)


_HOOK_DICTS = ("_forward_hooks", "_forward_hooks_with_kwargs", "_forward_hooks_always_called", "_forward_pre_hooks",
               "_forward_pre_hooks_with_kwargs")


@contextlib.contextmanager
def hooks_and_attributes_restored(model: nn.Module) -> Iterator[nn.Module]:
    r"""
    Removes, on exit, every hook and instance attribute that the block added to
    ``model`` or its modules: a call such as ``output_hidden_states=True`` may make
    the model's library install hooks of its own, which the user never asked for.
    """
    before = [(m, set(vars(m)), {name: set(getattr(m, name, {})) for name in _HOOK_DICTS}) for m in model.modules()]
    try:
        yield model
    finally:
        for module, attributes, hooks in before:
            for name, keys in hooks.items():
                table = getattr(module, name, None)
                for key in [k for k in (table or {}) if k not in keys]:
                    del table[key]
            for name in [a for a in vars(module) if a not in attributes]:
                delattr(module, name)


@contextlib.contextmanager
def cache_off(model: nn.Module) -> Iterator[None]:
    r"""
    ``model.config.use_cache`` set to False inside the block, as it was after.

    One pass needs no key/value cache, and some caches break a pass that
    replaces a site: RWKV updates its state in place (the backward pass into the
    replacement fails), Reformer's expects every layer to run (a re-run that
    reuses the first layers' outputs skips them).
    """
    config = getattr(model, "config", None)
    if config is None or not hasattr(config, "use_cache"):
        yield
        return
    before = config.use_cache
    config.use_cache = False
    try:
        yield
    finally:
        config.use_cache = before
