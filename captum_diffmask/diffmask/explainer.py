"""DiffMask as a Captum attribution: fit an amortised probe once, attribute in one pass."""

from __future__ import annotations

import os
from typing import Any, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple, Union

import torch
from torch import nn, Tensor

from captum_diffmask.diffmask.fit.distributed import is_main_process
from captum_diffmask.diffmask.fit.loop import run_fit
from captum_diffmask.diffmask.fit.options import fit_options, FitOptions, grouped_options, signed_with_options
from captum_diffmask.diffmask.gated_model import GatedModel
from captum_diffmask.diffmask.gates import layer_sites
from captum_diffmask.diffmask.pretrained import SharedProbe
from captum_diffmask.diffmask.saved_probe import checkpoint_contents, explainer_from, read_checkpoint, save_checkpoint
from captum_diffmask.diffmask.stacking import masked_logits
from captum_diffmask.model.arguments import (
    check_layer, ForwardFunc, InputType, PaddingMaskArg, PreparedCall, reject_target,
)
from captum_diffmask.model.attribution import attribution_call, SitesType
from captum_diffmask.model.components import ComponentSpec
from captum_diffmask.model.divergences import example_kl, log_probs, same_prediction
from captum_diffmask.model.forward import Batch, frozen
from captum_diffmask.model.texts import text_batches


class DiffMask(GatedModel, SharedProbe):
    r"""
    Differentiable Masking (De Cao, Schlichtkrull, Aziz and Titov, EMNLP 2020).

    A probe reads the model's hidden states up to layer k and predicts, per token,
    a Hard Concrete gate; gated-off positions are replaced by a learned baseline.
    :meth:`fit` trains the probe to close as many gates as possible while the
    masked model's output stays within ``KL(original || masked) <= eps``
    (a Lagrangian with one multiplier per layer). :meth:`attribute` then returns
    the probability that each gate stays open: one capture pass, no sampling.

    - ``mode="input"``: gates on the input token embeddings; at layer k the token
      is kept only if every vote read from ``hidden.0 .. hidden.k`` is non-zero.
      The attribution at layer k says which input tokens the model, as far as it
      has read them at depth k, still needs.
    - ``mode="hidden"``: gates on the states of ``hidden.k``, read from
      ``hidden.k``; it says which states at depth k store what the prediction needs.
    - ``mode="heads"`` / ``mode="units"``: one gate per attention head (or MLP
      unit) of block k and per input, read from the block's input ``hidden.{k-1}``
      pooled over the real positions; layers are the blocks 1..L, and
      :meth:`attribute` returns (B, count) per block (``docs/guide/components.md``).

    Args:

        model (nn.Module): the analysed model; frozen and in eval mode while fitted.
        mode (str, optional): ``"input"``, ``"hidden"``, ``"heads"`` or
                    ``"units"``. Default: ``"input"``
        sites (SiteLocator or dict, optional): where ``input`` and
                    ``hidden.0 .. hidden.L`` live; located automatically for
                    Hugging Face models (see :meth:`SiteLocator.locate`).
                    Default: None
        forward_func (Callable, optional): ``forward_func(ids, *extra)`` returning
                    logits; the model itself when None. Default: None
        padding_mask_arg (int, str or None, optional): index of the padding mask in
                    ``additional_forward_args``; ``"auto"`` = 0 for Hugging Face
                    models, none otherwise. Default: ``"auto"``
        temperature (float, optional): Hard Concrete temperature. Default: 0.2
        stretch (tuple[float, float], optional): Hard Concrete ``(l, r)``.
                    Default: ``(-0.2, 1.0)``
        probe_hidden_size (int, optional): hidden size of each gate network;
                    ``max(H // 4, 32)`` with H the largest site size when None.
                    Default: None
        l0 (str, optional): the sparsity term: ``"mean"`` (the expected share of
                    real tokens kept: the same scale for every length, so one
                    multiplier within ``lambda_max`` holds short and long inputs),
                    ``"expected"`` (the paper: the sum of ``P(z != 0)`` over real
                    tokens, which outgrows the multiplier on long inputs) or
                    ``"log"`` (the authors' code: mean of ``log P(z != 0)``).
                    Default: ``"mean"``
        probe_reads_input (bool, optional): input mode: vote j reads
                    ``[input; hidden.j]`` (the paper) or ``hidden.j`` alone.
                    Default: True
        rerun (str, optional): hidden mode, while fitting: ``"partial"`` re-runs only
                    what comes after the masked site (the earlier sites' outputs
                    from the capture pass stand in for their modules; the model is
                    frozen, so they are the same); ``"full"`` re-runs the whole
                    model. Partial assumes each site module runs once per forward.
                    Default: ``"partial"``
        output (str, optional): the distributions the masked model must keep:
                    ``"classes"``, ``"last"`` (a language model's next token),
                    ``"all"`` (every real position; the KL summed over them) or
                    ``"span"`` (a question-answering head's start and end; the KL
                    summed over the two); ``"auto"`` reads them from the output's
                    form (:mod:`captum_diffmask.model.outputs`). Default: ``"auto"``
        init_bias (float, optional): the gate networks' initial bias; 5 (the
                    authors') starts every gate open, ``P(z != 0) ~ 0.995``, and
                    a gate then needs many steps to close. Default: 5.0
        votes (str, optional): input mode: ``"per_depth"`` gives each depth k its
                    own votes 0..k and baseline (the probe of each depth as if
                    fitted alone; its layers then train, and freeze, apart) or
                    ``"tied"`` (the authors' code: vote j serves every depth
                    k >= j, one baseline). Tied votes couple the depths: on a
                    fine-tuned MiniLM every depth masks about the same tokens
                    (see :class:`InputGateProbe`). Default: ``"per_depth"``
        per_task (bool, optional): component modes: one mask for every input
                    (the gates' biases alone, fitted on the whole data set:
                    Subnetwork Probing), instead of a probe that reads each
                    input. Default: False
        components (mapping, optional): component modes: block k (1..L, every
                    one) -> where its components are, for a model whose blocks
                    the locating rule does not read: the module whose input holds
                    them side by side, alone (a linear map's input features as
                    units), ``(module, count)`` or ``(module, count, width)``
                    (:func:`~captum_diffmask.model.components.named_components`); None
                    locates them (``docs/guide/components.md``). Default: None
        joint (bool, optional): component modes: fit every block's gates at
                    once, against one constraint on the model with all of them
                    applied (one multiplier, one verdict: layer 0), instead of
                    each block with the others intact; ``attribute`` reads the
                    same blocks. Default: False

    Examples::

        >>> dm = DiffMask(model, mode="hidden")
        >>> history = dm.fit(train_loader, epochs=10, eps=0.1)
        >>> attributions = dm.attribute(input_ids, additional_forward_args=(mask,), layer=3)
    """

    uses_target = False
    scores_are_probabilities = True
    summary = "amortised DiffMask: a probe predicts the gates; one pass to attribute"
    needs_data = True
    data_step = "fit"

    # -------------------------------------------------------------------- fit
    @signed_with_options
    def fit(
        self,
        dataloader: Iterable[Batch],
        options: Union[None, FitOptions, Mapping[str, Any]] = None,
        *,
        tokenizer: Any = None,
        **overrides: Any,
    ) -> List[Dict[str, Any]]:
        r"""
        Trains the probe and the baselines (the model stays frozen) until every
        trained layer has converged, or a cap is reached.

        Each step trains every layer k of ``layers`` on the batch (or one drawn
        layer, ``compute={"layers_per_batch": "one"}``): it samples the gates, replaces the
        site by ``z * h + (1 - z) * b`` and descends the Lagrangian
        ``L0 + lambda_k * (mean KL - eps)`` (``docs/guide/diffmask.md``). The fit stops
        once every trained layer has converged (:class:`~captum_diffmask.diffmask.constrained.convergence.Convergence`); ``epochs``
        and ``max_steps`` are caps. A layer left unconverged (the cap reached, the
        constraint violated, every gate open with the constraint slack, or every
        gate closed) is named in a :class:`DiffMaskConvergenceWarning` with its
        figures and what to try; :attr:`convergence` holds the per-layer report.

        Args:

            dataloader (iterable): batches as ``attribute`` takes them: token ids
                        (B, T), ``(ids, *additional_forward_args)``, or a mapping
                        with ``input_ids``/``attention_mask``; iterated once per epoch.
                        With ``tokenizer``: texts instead, one string, a list of
                        strings or a ``pathlib.Path`` of a file of them
                        (:func:`~captum_diffmask.model.texts.text_batches`, 16 a batch,
                        texts of about the same length together, so that little
                        padding is computed; pass a DataLoader of tokenised
                        batches for other sizes).
            options (FitOptions or dict, optional): the options of the fit,
                        twelve, each documented once, in
                        :class:`~captum_diffmask.diffmask.fit.options.FitOptions`:
                        ``eps`` (0.1), ``layers``, ``max_steps``, ``epochs``, ``lr``
                        (3e-3), ``seed``, ``verbose``, ``validation``,
                        ``checkpoint`` (a file to resume from), and the groups
                        ``convergence``, ``compute`` and ``optimization``
                        (defaults: Adam, the PI multiplier on the deployed
                        read-out's constraint, every layer on every batch, each
                        layer whose probe is its own frozen once converged, run to
                        convergence within the criterion's budget).
                        Default: None (the defaults)
            tokenizer (optional): tokenises ``dataloader`` when it holds texts.
                        Default: None
            **overrides: any option of :class:`~captum_diffmask.diffmask.fit.options.FitOptions`
                        by name (``eps=0.05, max_steps=500``, a group as an object
                        or a dict: ``compute={"precision": "bfloat16"}``), over
                        ``options``; an unknown name is an error that names it.
                        Release 0.1's flat names of grouped options
                        (``precision=...``) still work, with a ``DeprecationWarning``.

        Returns:
            *list* of dicts, one per (epoch, layer) trained in it: the means of
            ``kl`` (nats), ``l0`` (share of real tokens whose gate is open) and
            ``agreement`` (masked argmax == original argmax), the final
            ``lambda``, ``steps``, the epoch's ``seconds``, the layer's
            convergence ``status`` (one of
            :data:`~captum_diffmask.diffmask.constrained.convergence.STATUSES`) and ``converged``; with ``validation`` also
            ``valid_kl``, ``valid_l0``, ``valid_agreement``, ``valid_seconds``
            and ``selected`` (True on the rows of the restored epoch).
        """
        chosen = fit_options(options, overrides)
        if tokenizer is not None:
            dataloader = text_batches(dataloader, tokenizer, by_length=True)
        return run_fit(self, dataloader, chosen)

    def is_prepared(self, layer: Optional[int]) -> bool:
        r"""Whether the probe is fitted (a fitted probe attributes its fitted
        layers; :meth:`attribute` names the others)."""
        return self.is_fitted

    def prepare_on_data(
        self, train_data: Iterable[Batch], layer: Optional[int], options: Mapping[str, Any], seed: int = 0,
        verbose: bool = False, max_steps: Optional[int] = None,
    ) -> Dict[str, Any]:
        r"""
        Fits the probe at ``layer`` (every layer when None) for ``compare``.

        Args:

            train_data, layer, seed, verbose: as
                        :meth:`SiteAttribution.prepare_on_data`.
            options (dict): :meth:`fit`'s options, over ``layers``, ``seed`` and
                        ``verbose``.
            max_steps (int, optional): the fit's ``max_steps`` unless ``options``
                        set one. Default: None

        Returns:
            *dict*: ``fit_steps`` (steps in all), ``fit_last`` (the history's last
            row), ``convergence`` (per layer) and ``fit_options`` (the JSON-ready ones).
        """
        chosen = {"layers": None if layer is None else [layer], "seed": seed, "verbose": verbose, **options}
        if max_steps is not None:
            chosen.setdefault("max_steps", max_steps)
        history = self.fit(train_data, **grouped_options(chosen))  # compare's flat dict: no warning
        return {"fit_steps": int(sum(row["steps"] for row in history)), "fit_last": history[-1],
                "convergence": dict(self.convergence),
                "fit_options": {k: v for k, v in chosen.items()
                                if isinstance(v, (int, float, str, bool, list, type(None)))}}

    def attributes_every_layer(self) -> bool:
        r"""True once every layer is fitted: ``attribute(layer=None)`` then gives
        (B, T, L + 1) ((B, L, count) in the component modes)."""
        return self.is_fitted and set(self.gated_layers) <= set(self.fitted_layers)

    # -------------------------------------------------------------- attribute
    @attribution_call
    def attribute(
        self, inputs: InputType, target: Any = None, additional_forward_args: Any = None,
        layer: Optional[int] = 0,
    ) -> Union[Tensor, Tuple[Tensor]]:
        r"""
        The probability that each token (input mode), state (hidden mode), head
        (``"heads"``) or MLP unit (``"units"``) is kept.

        One capture pass (stopped as soon as the needed sites are read), the probe,
        and ``P(z != 0)`` in closed form; no sampling.

        Args:

            inputs, additional_forward_args: as for every method
                        (:class:`~captum_diffmask.model.attribution.SiteAttribution`).
            target: must be None: DiffMask keeps the whole output distribution,
                        not one class (a target is an error, not ignored).
                        Default: None
            layer (int, optional): input mode: the depth k the probe reads (the
                        votes from ``hidden.0 .. hidden.k``); hidden mode: the
                        states of ``hidden.k``; 0..L, or None for every layer;
                        component modes: block k (1..L, whose output is
                        ``hidden.k``), or None for every block (with
                        ``joint``, 0: every block's gates concatenated).
                        Default: 0 (component modes: give it)

        Returns:
            *Tensor* (or a 1-tuple, when ``inputs`` is a tuple) of **attributions**
            in [0, 1]: (B, T) for a layer, (B, T, L + 1) for ``layer=None``; 0 at
            padded positions. Component modes, one per input: (B, count) for a
            block, (B, L, count) for ``layer=None``.
        """
        self._check_fitted()
        reject_target(target, "DiffMask", "the whole output distribution (KL(original || masked) <= eps)")
        call = self._prepare(inputs, additional_forward_args, layer)
        self._check_layers_fitted(self._fitted_as(self.gated_layers if layer is None else [layer]))
        states, _ = self.capture(call, layer_sites(self.mode, layer, self.num_layers), stop_early=True)
        for name, state in states.items():
            # one reduction, not a mask of the state; a sum that overflows is checked element by element
            if not bool(torch.isfinite(state.sum())) and not bool(torch.isfinite(state).all()):
                raise FloatingPointError(f"DiffMask.attribute: the model's {name} states are not finite (NaN or inf)")
        with torch.no_grad():
            gates = self.gates
            keep = (gates.keep_probabilities_every_layer(states, self.num_layers, call.mask) if layer is None
                    else gates.keep_probabilities(states, layer, call.mask))
        return self._finish_per_input(keep, call) if self.components else self._finish(keep, call)

    # ------------------------------------------------------------- evaluation
    @torch.no_grad()
    def masked_forward(
        self,
        inputs: Union[Tensor, Tuple[Tensor]],
        additional_forward_args: Any = None,
        layer: Optional[int] = None,
        rule: str = "threshold",
    ) -> Tuple[Tensor, Tensor, Tensor]:
        r"""
        The model's output with the probe's gates applied without noise: actual
        erasure, for faithfulness checks.

        Args:

            inputs, additional_forward_args: as for every method
                        (:class:`~captum_diffmask.model.attribution.SiteAttribution`).
            layer (int): the depth k the probe reads, 0..L (required).
            rule (str, optional): ``"threshold"`` (binary: kept where the
                        attribution exceeds 0.5) or ``"louizos"`` (the clamped
                        test-time Hard Concrete gate, values in [0, 1]).
                        Default: ``"threshold"``

        Returns:
            *tuple* ``(gates, masked_logits, original_logits)``: gates (B, T) in
            [0, 1] (0 at padding; 1 = kept), the logits (B, C) of the model with
            the site mixed as ``z * h + (1 - z) * b``, and its logits unmasked.
        """
        if layer is None:
            raise ValueError(f"layer must be given: an int in 0..{self.num_layers}")
        return self.masked_forward_layers(inputs, additional_forward_args, [layer], rule)[layer]

    def masked_forward_layers(
        self,
        inputs: Union[Tensor, Tuple[Tensor]],
        additional_forward_args: Any = None,
        layers: Optional[Sequence[int]] = None,
        rule: str = "threshold",
    ) -> Dict[int, Tuple[Tensor, Tensor, Tensor]]:
        r"""
        :meth:`masked_forward` at several layers, sharing one capture pass.

        Args:

            inputs, additional_forward_args, rule: as :meth:`masked_forward`.
            layers (sequence of int, optional): the depths 0..L; all when None.
                        Default: None

        Returns:
            *dict* ``layer -> (gates, masked_logits, original_logits)``, each as
            :meth:`masked_forward` returns it.
        """
        self._check_fitted()
        chosen = self.gated_layers if layers is None else list(layers)
        if not chosen:
            raise ValueError("layers must name at least one layer")
        for k in chosen:
            self._site(k)  # the same check, and error, as masked_forward's layer
        self._check_layers_fitted(chosen)
        call = self._prepare(inputs, additional_forward_args, chosen[-1])
        with frozen(self.model):
            masked = self._masked_batch(call, chosen, rule)
        if self.components:
            return masked
        return {k: (call.trimmed(gates * call.mask.to(gates.dtype)), logits, original)
                for k, (gates, logits, original) in masked.items()}

    def _masked_batch(
        self, call: PreparedCall, layers: Sequence[int], rule: str
    ) -> Dict[int, Tuple[Tensor, Tensor, Tensor]]:
        r"""One capture pass, then for each layer its deterministic gates and the
        masked logits (only the part after the site re-run where possible)."""
        states, original = self.capture(call, self.locator.names)
        assert original is not None
        results, read_out = {}, self.gates
        for group in read_out.pass_groups(layers):
            gates = {k: read_out.deterministic(states, k, rule, call.mask) for k in group}
            masked = masked_logits(read_out, self.replaced_logits, call, states, gates)
            results.update({k: (gates[k], masked[k], original) for k in group})
        return results

    @torch.no_grad()
    def evaluate(
        self,
        dataloader: Iterable[Batch],
        layers: Optional[Sequence[int]] = None,
        rule: str = "threshold",
    ) -> Dict[int, Dict[str, float]]:
        r"""
        Scores the fitted probe on held-out batches with deterministic gates.

        Args:

            dataloader (iterable): batches as :meth:`fit` takes them.
            layers (sequence of int, optional): the layers to score; the fitted
                        ones when None. Default: None
            rule (str, optional): see :meth:`masked_forward`. Default: ``"threshold"``

        Returns:
            *dict* ``layer -> {"kl", "agreement", "l0"}``: the mean
            KL(original || masked) in nats and the share of examples whose argmax
            is unchanged, over examples; the share of real positions kept
            (gate > 0), over positions (component modes: of components kept).
        """
        self._check_fitted()
        chosen = list(self.fitted_layers) if layers is None else [check_layer(k, self.num_layers) for k in layers]
        for k in chosen:
            self._site(k)
        self._check_layers_fitted(chosen)
        if not chosen:
            raise ValueError("layers must name at least one layer")
        with frozen(self.model):
            return self._evaluate(dataloader, chosen, rule)

    def _evaluate(self, dataloader: Iterable[Batch], layers: Sequence[int], rule: str) -> Dict[int, Dict[str, float]]:
        sums = {k: {"kl": 0.0, "agreement": 0.0, "kept": 0.0, "positions": 0.0} for k in layers}
        examples, read_out = 0, self.gates
        for batch in dataloader:
            call = self.prepare_batch(batch, None, "validation batch")
            with torch.no_grad():
                for k, (gates, masked, original) in self._masked_batch(call, layers, rule).items():
                    log_p, log_q = log_probs(original), log_probs(masked)
                    real = read_out.positions(call.mask, k).float()
                    sums[k]["kl"] += float(example_kl(log_p, log_q).sum())
                    sums[k]["agreement"] += float(same_prediction(log_p, log_q).float().sum())
                    sums[k]["kept"] += float(((gates > 0).float() * real).sum())
                    sums[k]["positions"] += float(real.sum())
            examples += call.ids.shape[0]
        if examples == 0:
            raise ValueError("validation: no batches")
        return {
            k: {"kl": v["kl"] / examples, "agreement": v["agreement"] / examples,
                "l0": v["kept"] / max(v["positions"], 1.0)}
            for k, v in sums.items()
        }

    # ------------------------------------------------------------ checkpoints
    # ------------------------------------------------------------ checkpoints
    def save(self, path: Union[str, os.PathLike]) -> None:
        r"""
        Saves the fitted probe, baselines and multipliers with what identifies the
        model they belong to (its sites, parameter shapes and a fingerprint of its
        weights) and each layer's convergence report
        (:mod:`captum_diffmask.diffmask.saved_probe`).

        Args:

            path (str or PathLike): the file to write; under ``torch.distributed``
                        only rank 0 writes it.
        """
        if not self.is_fitted:
            raise ValueError("DiffMask is not fitted: nothing to save")
        if is_main_process():  # under torch.distributed every rank holds the same probe
            assert self.probe is not None and self.lambdas is not None
            save_checkpoint(path, checkpoint_contents(self))

    @classmethod
    def load(
        cls,
        path: Union[str, os.PathLike],
        model: nn.Module,
        sites: SitesType = None,
        forward_func: ForwardFunc = None,
        padding_mask_arg: PaddingMaskArg = "auto",
        check_weights: bool = True,
        components: Optional[Mapping[int, ComponentSpec]] = None,
    ) -> "DiffMask":
        r"""
        Loads a checkpoint written by :meth:`save` for ``model``.

        Args:

            path (str or PathLike): the checkpoint.
            model (nn.Module): the analysed model; must be the one it was fitted on.
            sites, forward_func, padding_mask_arg: as in the constructor.
            check_weights (bool, optional): refuse a model whose parameter values
                        differ from those the probe was fitted on (same
                        architecture, other weights). Default: True
            components (mapping, optional): as in the constructor, for a probe
                        fitted with named components. Default: None

        Returns:
            *DiffMask*, fitted.

        Raises:
            ValueError naming ``path`` (missing, truncated, corrupted, not a
            DiffMask checkpoint) or ``model`` (other sites, parameter shapes or,
            with ``check_weights``, weights).
        """
        return explainer_from(cls, read_checkpoint(path), model, check_weights, sites=sites, forward_func=forward_func,
                              padding_mask_arg=padding_mask_arg, components=components)
