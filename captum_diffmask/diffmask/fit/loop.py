"""The fit's loop: epochs of training steps until every trained layer has its
verdict or a cap is reached, with its one state (:class:`~captum_diffmask.diffmask.fit.fit_state.FitState`)
written as it goes and resumed from.

Each batch: a capture pass without gradients (every site and the original
logits), the layers trained on it (every active one, or one drawn,
``layers_per_batch``), one training step (:mod:`~captum_diffmask.diffmask.fit.step`),
and the step recorded at each layer's convergence monitor. A layer whose probe
is its own is frozen once it settles; the loop ends when every layer has settled
(``converged``; with a cool-down, once every layer has trained at least that
many further steps at the lower rates and settled again on them), or at
``max_steps`` (the criterion's budget when no cap is given), or when the
epochs run out.
"""

from __future__ import annotations

import collections.abc
import contextlib
import dataclasses
import itertools
import logging
import math
import random
import time
import warnings
from typing import Any, Dict, Iterable, List, Mapping, Optional, Tuple

import torch
from tqdm.auto import tqdm

from captum_diffmask.diffmask.constrained.convergence import LayerMonitor, SETTLED, warn_unconverged
from captum_diffmask.diffmask.constrained.multiplier_rules import MultiplierRule
from captum_diffmask.diffmask.fit.distributed import (
    all_sum, is_distributed, rank_and_world, reads_its_own_shard, sharded, shared_seed,
)
from captum_diffmask.diffmask.fit.fit_state import FitCheckpoint, FitState, rng_states, set_rng_states
from captum_diffmask.diffmask.fit.fittable import Fittable
from captum_diffmask.diffmask.fit.history import epoch_rows, EpochLog
from captum_diffmask.diffmask.fit.options import FitOptions
from captum_diffmask.diffmask.fit.record import data_size, fit_record
from captum_diffmask.diffmask.fit.selection import CheckpointSelection
from captum_diffmask.diffmask.fit.start import build_optimizers, pin_baselines
from captum_diffmask.diffmask.fit.step import model_precision, StepPlan, training_step
from captum_diffmask.diffmask.gates import COMPONENT_MODES
from captum_diffmask.model.fingerprint import weights_fingerprint
from captum_diffmask.model.forward import Batch, frozen
from captum_diffmask.model.rng import preserved_rng

#: Where the fit reports its progress: one line per trained layer and epoch, at
#: INFO, when ``verbose`` (attach a handler, or ``logging.basicConfig(level=logging.INFO)``).
LOGGER = logging.getLogger("captum_diffmask")


def run_fit(explainer: Fittable, dataloader: Iterable[Batch], options: FitOptions) -> List[Dict[str, Any]]:
    r"""Trains ``explainer``'s probe as :meth:`DiffMask.fit` documents; returns
    the history and sets ``explainer.convergence``."""
    layers = options.check(explainer.num_layers, explainer.gated_layers)
    _check_reiterable(dataloader, options.epochs)
    explainer.follow_model()
    options = dataclasses.replace(options, seed=shared_seed(options.seed))
    loop = FitLoop(explainer, options, layers)
    loop.data = data_size(dataloader)
    explainer.fitted_layers = sorted(set(explainer.fitted_layers) | set(loop.trained))
    seeded = preserved_rng(options.seed) if options.seed is not None else contextlib.nullcontext()
    with frozen(explainer.model), seeded:
        if loop.saver is not None and loop.saver.exists():
            loop.resume(loop.saver.read(explainer.config(), layers, weights_fingerprint(explainer.model)))
            loop.reopen()
        if not loop.state.finished:
            loop.train(dataloader)
            loop.finish()
    if rank_and_world()[0] == 0:
        warn_unconverged(loop.monitors, loop.stopped_by(), stacklevel=4)
    return loop.state.history


class FitLoop:
    r"""
    One call of the fit: the layers it trains and their monitors, the optimisers
    (built on the first batch), its :class:`FitState`, and the writes of that
    state to ``options.checkpoint`` (with the resumption from it).

    Args:

        explainer (Fittable): the explainer whose probe is trained.
        options (FitOptions): the fit's options, checked.
        layers (list of int): the trained layers.
    """

    def __init__(self, explainer: Fittable, options: FitOptions, layers: List[int]) -> None:
        self.explainer, self.options, self.layers = explainer, options, layers
        self.constraint = options.kl_constraint()
        self.layer_draw = random.Random(options.seed)
        criterion = options.convergence
        self.trained = sorted(set(layers))
        self.freezes = criterion.freeze_converged and criterion.until_converged and explainer.independent_layers
        self.monitors = {k: LayerMonitor(k, self.constraint, criterion, options.optimization.lambda_max)
                         for k in self.trained}
        self.open_share = criterion.open_share
        # the criterion's budget and the cool-down count steps at each layer; a
        # layer drawn one batch in len(trained) gets that share of the fit's steps
        per_layer = 1 if options.compute.layers_per_batch == "all" else len(self.trained)
        self.max_steps = options.max_steps
        self.cooldown_steps = criterion.cooldown * per_layer
        # with a cool-down, it begins at the criterion's budget at the latest:
        # a layer still swinging there (a multiplier in a cycle at the fit's
        # rates) gets the cooled rates too, rather than a cap's unsettled end
        self.cooldown_by = criterion.budget * per_layer if criterion.cooldown else None
        if options.max_steps is None and options.epochs is None:
            self.max_steps = criterion.budget * per_layer + self.cooldown_steps
        self.optimizers: Optional[Tuple[torch.optim.Optimizer, MultiplierRule]] = None
        validation = options.validation
        self.selection = None if validation is None else CheckpointSelection(
            validation.batches, layers, self.constraint.eps if validation.eps is None else float(validation.eps),
            validation.agreement)
        self.saver = (None if options.checkpoint is None
                      else FitCheckpoint(options.checkpoint, options.compute.checkpoint_every))
        self.state = FitState(active=list(self.trained))
        self.data: Dict[str, Any] = {}  # the data's size, for the fit's record
        self.began = time.perf_counter()  # the current epoch's start, less a resumed epoch's earlier part
        self.log = EpochLog()

    # ------------------------------------------------------------- the epochs
    def train(self, dataloader: Iterable[Batch]) -> None:
        r"""Trains epoch after epoch until the loop ends."""
        options, state = self.options, self.state
        rank, world = rank_and_world()
        shard = world > 1 and not reads_its_own_shard(dataloader)
        start = state.epoch
        for epoch in itertools.count(start) if options.epochs is None else range(start, options.epochs + 1):
            bar = self._epoch_batches(sharded(dataloader, rank, world) if shard else dataloader, epoch)
            # an epoch resumed part-way counts the seconds its earlier part took
            self.began, before, resumed = time.perf_counter() - state.seconds, state.step, state.batches
            self._train_epoch(bar)
            if state.step == before and not resumed:
                raise ValueError(f"dataloader: no batches in epoch {epoch}" if epoch > 1 else "dataloader: no batches")
            state.seconds = time.perf_counter() - self.began
            rows = epoch_rows(self.explainer, epoch, state.sums, state.seconds, self.monitors)
            if self.selection is not None:
                self.selection.after_epoch(self.explainer, epoch, rows)
            state.history.extend(rows)
            if options.verbose and rank == 0:
                self.log.epoch(epoch, options.epochs, rows, last=state.ended is not None or epoch == options.epochs)
            if state.ended is not None:
                return  # the sums stay: a fit reopened with a larger cap goes on in this epoch
            state.sums = {}
        state.ended = "epochs"

    def _epoch_batches(self, batches: Iterable[Batch], epoch: int) -> Iterable[Batch]:
        r"""The epoch's batches behind a progress bar; for the epoch a resumed fit
        stopped in, drawn again from its starting RNG, the trained ones skipped,
        then the RNG set to where the fit stood."""
        options, state, rank = self.options, self.state, rank_and_world()[0]
        resuming = state.rng_to_restore is not None and epoch == state.epoch
        if resuming:
            assert state.epoch_rng is not None
            set_rng_states(state.epoch_rng)
        else:
            state.epoch, state.batches, state.seconds, state.epoch_rng = epoch, 0, 0.0, rng_states()
        # tqdm.auto iterates `batches` once when it is made (and drops that
        # iterator): a loader that draws from an RNG or counts its passes draws
        # twice an epoch, and every committed report's fit drew so; a resumed
        # epoch is drawn through the same bar
        bar = tqdm(batches, desc=f"DiffMask fit {epoch}/{options.epochs or '-'}",
                   disable=None if options.verbose and rank == 0 else True, leave=False)
        if not resuming:
            return bar
        assert state.rng_to_restore is not None
        iterator = iter(bar)
        for _ in range(state.batches):
            next(iterator, None)
        set_rng_states(state.rng_to_restore)
        state.rng_to_restore = None
        return iterator

    def _train_epoch(self, batches: Iterable[Batch]) -> None:
        r"""One pass over ``batches`` (or fewer steps, when the loop ends), each
        step's records added to the epoch's sums."""
        explainer, state = self.explainer, self.state
        for batch in batches:
            if state.ended is not None:  # a fit resumed from the step that ended it
                break
            call = explainer.prepare_batch(batch, None, "dataloader batch")
            layers = self._draw()
            with model_precision(self.options.compute.precision, call.ids.device):
                states, original = explainer.capture(call, self._sites_to_keep(max(layers)))
            assert original is not None
            if self.optimizers is None:
                if explainer.probe is None:
                    explainer.build_probe(states, call.mask, all_sum if is_distributed() else None, call)
                pin_baselines(explainer, self.options.optimization.init_baseline)
                self.optimizers = build_optimizers(explainer, self.options, self.constraint)
            # the deterministic gates' KL measured every `deployed_every` steps, held in between
            held = None if state.step % self.options.compute.deployed_every == 0 else state.deployed
            plan = StepPlan(self.options, self.constraint, *self.optimizers, state.step + 1, self.open_share,
                            {k for k in layers if self.monitors[k].measures_closure()}, held)
            records = training_step(explainer, call, states, original, layers, plan)
            state.deployed.update({k: r["kl_deployed"] for k, r in records.items() if "kl_deployed" in r})
            for k, record in records.items():
                acc = state.sums.setdefault(k, {"steps": 0})
                for key in ("kl", "l0", "agreement", "kl_deployed"):
                    if key in record:
                        acc[key] = acc.get(key, 0.0) + record[key]
                acc["steps"] += 1
            assert explainer.lambdas is not None
            closed = self._after_step(records, {k: float(explainer.lambdas(k).detach()) for k in records})
            if closed and hasattr(batches, "set_postfix"):
                k = closed[-1]
                window = self.monitors[k].windows[-1]
                batches.set_postfix(layer=k, kept=f"{window.kept:.3f}", kl=f"{window.kl:.4f}",
                                    lam=f"{window.lam:.3g}", status=self.monitors[k].status())
            state.batches += 1
            if self.saver is not None and self.saver.due(state.step):
                state.seconds = time.perf_counter() - self.began
                self.save()
            if state.ended is not None:
                break

    def _draw(self) -> List[int]:
        r"""The layers trained on the next batch: one drawn uniformly, or all."""
        if self.options.compute.layers_per_batch == "all":
            return self.state.active
        return [self.layer_draw.choice([k for k in self.layers if k in self.state.active])]

    def _sites_to_keep(self, layer: int) -> List[str]:
        r"""The sites whose activations a step keeps: every site (``activations="all"``,
        and the first batch, which builds the probe), or those up to ``hidden.k``, the
        ones a step whose deepest layer is k reads or re-uses (``"needed"``)."""
        names = self.explainer.site_names
        if self.options.compute.activations == "all" or self.explainer.probe is None or self.optimizers is None:
            return names
        if layer == 0 and self.explainer.mode in COMPONENT_MODES:  # the joint mask reads every block's input
            return names
        return names[: names.index(f"hidden.{layer}") + 1]

    def _after_step(self, records: Mapping[int, Mapping[str, float]], lams: Mapping[int, float]) -> List[int]:
        r"""Counts the step and records it at each of its layers; the layers of
        which it closed a window. Ends the loop at its step cap, or once every
        layer has settled."""
        state = self.state
        state.step += 1
        closed = [k for k, record in records.items()
                  if self.monitors[k].record(record["constraint"], record["l0"], lams[k], record.get("closure"))]
        criterion = self.options.convergence
        if self.freezes and state.cooling_from is None:
            self._freeze_settled(closed)
        cooling = state.cooling_from is not None
        # a cool-down runs at least its steps, then on until every layer's
        # verdict holds on its own windows (or a cap ends it): a verdict judged
        # once at a fixed step calls a layer still moving at the cooled rates
        # unsettled, a probe no longer trained leaves
        if (cooling and state.step - state.cooling_from >= self.cooldown_steps
                and closed and self._all_settled()):
            state.ended = "cooldown"
        elif self.max_steps is not None and state.step >= self.max_steps:
            state.ended = "max_steps"
        elif not cooling and criterion.until_converged:
            if closed and self._all_settled():
                if criterion.cooldown:
                    self._start_cooldown("every layer settled")
                else:
                    state.ended = "converged"
            elif self.cooldown_by is not None and state.step >= self.cooldown_by:
                self._start_cooldown("the criterion's budget spent with layers unsettled")
        return closed

    def _all_settled(self) -> bool:
        r"""Whether every trained layer has its verdict."""
        return all(m.status() in SETTLED for m in self.monitors.values())

    def _start_cooldown(self, why: str) -> None:
        r"""Every layer trained again, at the cool-down's rates (the optimisers'
        states carry them, so a fit resumed in its cool-down keeps them);
        ``why`` it begins, for the log."""
        assert self.optimizers is not None
        criterion, state = self.options.convergence, self.state
        state.cooling_from, state.active = state.step, list(self.trained)
        for optimizer in (self.optimizers[0], self.optimizers[1].optimizer):
            for group in optimizer.param_groups:
                group["lr"] *= criterion.cooldown_factor
        LOGGER.info("DiffMask fit: %s at step %d; cool-down of at least %d steps at %g x the rates",
                    why, state.step, criterion.cooldown, criterion.cooldown_factor)

    def _freeze_settled(self, closed: List[int]) -> None:
        r"""Stops training the layers of ``closed`` that are settled, while
        another layer still trains (the last one ends the fit as it is)."""
        active = self.state.active
        for k in closed:
            if self.monitors[k].status() in SETTLED and len(active) > 1:
                active.remove(k)
                LOGGER.info("DiffMask fit: layer %d %s after %d of its steps; frozen, %d layers still train",
                            k, self.monitors[k].status(), self.monitors[k].steps, len(active))

    # --------------------------------------------------------- its end
    def finish(self) -> None:
        r"""Wraps the call up once its loop has ended: the checkpoint selection's
        probe restored, the verdicts set, the finished state written."""
        if self.selection is not None:
            self.selection.restore(self.explainer, self.state.history)
        self.explainer.convergence = {k: m.report() for k, m in self.monitors.items()}
        self.explainer.fit_record = fit_record(self.options, self.state, self.data)
        self.state.finished = True
        self.save()

    def stopped_by(self) -> str:
        r"""What ended the run, for the warning: the cap it reached, or
        ``until_converged=False``."""
        options, state = self.options, self.state
        if self.max_steps is not None and state.step >= self.max_steps and state.ended != "converged":
            if options.max_steps is None:
                return f"the criterion's budget of {self.max_steps} steps (convergence.max_windows)"
            return f"the cap max_steps={options.max_steps}"
        if not options.convergence.until_converged:
            return f"epochs={options.epochs} with until_converged=False"
        return f"the cap epochs={options.epochs} ({state.step} steps)"

    # ------------------------------------------------- its state on disk
    def save(self) -> None:
        r"""Writes the fit's state (only the first process of a distributed fit)."""
        if self.saver is None or rank_and_world()[0] != 0 or self.optimizers is None:
            return
        explainer, (probe_opt, multipliers) = self.explainer, self.optimizers
        assert explainer.probe is not None and explainer.lambdas is not None
        self.saver.write({
            "config": explainer.config(), "layers": self.layers, "site_sizes": explainer.site_sizes,
            "model": weights_fingerprint(explainer.model),
            "probe": explainer.probe.state_dict(), "lambdas": explainer.lambdas.state_dict(),
            "probe_optimizer": probe_opt.state_dict(), "multipliers": multipliers.state_dict(),
            "state": self.state.state_dict(), "layer_draw": self.layer_draw.getstate(),
            "monitors": {k: m.state_dict() for k, m in self.monitors.items()},
            "selection": None if self.selection is None else self.selection.best,
            "convergence": explainer.convergence, "rng": rng_states(),
        })

    def resume(self, saved: Mapping[str, Any]) -> None:
        r"""Restores a state :meth:`save` wrote."""
        explainer = self.explainer
        explainer.restore_probe(saved["site_sizes"], saved["probe"], saved["lambdas"])
        self.optimizers = build_optimizers(explainer, self.options, self.constraint)
        asked = [group["lr"] for group in self.optimizers[0].param_groups]
        self.optimizers[0].load_state_dict(saved["probe_optimizer"])
        self.optimizers[1].load_state_dict(saved["multipliers"])
        self.state = FitState.from_state_dict(saved["state"], rng=saved["rng"])
        self._warn_rates_ignored(asked)
        self.layer_draw.setstate(saved["layer_draw"])
        for k, monitor in saved["monitors"].items():
            self.monitors[k].load_state_dict(monitor)
        if self.selection is not None:
            self.selection.best = saved["selection"]
        explainer.convergence = dict(saved["convergence"])
        if self.state.finished:  # restored, not trained again: its record as the fit that wrote it left it
            explainer.fit_record = fit_record(self.options, self.state, self.data)
        LOGGER.info("DiffMask fit: resumed from %s at step %d (epoch %d)%s", self.saver.path if self.saver else "",
                    self.state.step, self.state.epoch, ", finished" if self.state.finished else "")

    def _warn_rates_ignored(self, asked: List[float]) -> None:
        r"""Warns when this call's ``lr`` or ``lr_baseline`` (``asked``, one per
        parameter group) differ from the rates the resumed state goes on at:
        the optimiser's state carries its rates (so that a fit resumed in its
        cool-down keeps the cooled ones), and a resumed fit ends as the fit
        that wrote it would have."""
        assert self.optimizers is not None
        factor = 1.0 if self.state.cooling_from is None else self.options.convergence.cooldown_factor
        held = [group["lr"] for group in self.optimizers[0].param_groups]
        if all(math.isclose(a * factor, h, rel_tol=1e-9, abs_tol=0.0) for a, h in zip(asked, held)):
            return
        names = ("lr", "lr_baseline")
        warnings.warn(
            f"checkpoint: {self.saver.path if self.saver else 'the state'} goes on at the rates it was written with "
            f"({', '.join(f'{n}={h / factor:g}' for n, h in zip(names, held))}); this call's "
            f"{', '.join(f'{n}={a:g}' for n, a in zip(names, asked))} have no effect on a resumed fit. "
            "To train at other rates, start a fit with another checkpoint file", UserWarning, stacklevel=4)

    def reopen(self) -> None:
        r"""
        Reopens a resumed fit that ended at its cap (``max_steps`` or ``epochs``)
        when this call's caps allow more: it goes on in the epoch it stopped in
        (that epoch's history rows are dropped; the state's running sums of the
        epoch give them again at its end), so that it ends with the probe of
        one call with the larger cap. A fit that converged stays finished, and
        so does one whose probe the checkpoint selection restored (its last
        probe is gone).
        """
        options, state = self.options, self.state
        epoch = state.epoch
        if not state.finished or not state.stopped_by_cap or self.selection is not None:
            return
        if self.max_steps is not None and state.step >= self.max_steps:
            return
        if state.ended == "max_steps":  # the step cap stopped it inside an epoch: on in that epoch
            # (a state written before the epoch's sums were kept has none to go on with)
            if (options.epochs is not None and epoch > options.epochs) or not state.sums:
                return
            state.history = [row for row in state.history if row["epoch"] != epoch]
        else:  # its epochs ran out: on with the next one, from the RNG as it ended
            if options.epochs is not None and epoch >= options.epochs:
                return
            assert state.rng_to_restore is not None
            set_rng_states(state.rng_to_restore)
            state.rng_to_restore, state.sums = None, {}
            state.epoch, state.batches, state.seconds, state.epoch_rng = epoch + 1, 0, 0.0, None
        state.ended, state.finished = None, False
        LOGGER.info("DiffMask fit: reopened at step %d (epoch %d): its cap was reached, this call's is %s",
                    state.step, epoch, self.max_steps if self.max_steps is not None else f"epochs={options.epochs}")


def _check_reiterable(dataloader: Iterable[Batch], epochs: Optional[int]) -> None:
    r"""A one-shot iterator (a generator, ``iter(loader)``) yields one epoch only:
    with a cap of several epochs (or none) it would end the fit early, silently."""
    # an Iterator has __next__; a DataLoader or a list does not (and calling iter()
    # on a DataLoader would draw from its generator, changing the first epoch)
    if (epochs is None or epochs > 1) and isinstance(dataloader, collections.abc.Iterator):
        raise ValueError(
            f"dataloader is a one-shot iterator (it can be read once), but epochs={epochs}: pass a list or a "
            "DataLoader, which can be read again every epoch, or epochs=1"
        )
