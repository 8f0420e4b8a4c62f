r"""
Right where the answer is known: DiffMask with fit's defaults on a transformer
whose answer is known, in input mode at every depth.

Part ``toy-encoder``: the paper's toy task written as tokens for a small
BERT-style encoder (the toy-lm suite's encoder, :mod:`benchmarks.tasks.toy_lm`):
``<n> <m> : x_1 .. x_t ->``, the answer read at the last position. The digits
of ``x`` that hold ``n`` or ``m`` are the ground truth, the other digits carry
nothing; but on a prompt whose answer is the one the encoder gives with no
evidence, the output needs no digit at all. So each prompt's ground truth is
what erasure says (:func:`needs_digits`): the prompts whose answer flips when
their ground-truth digits are erased need them, and the checks on the digits
are judged on those; on the others the output needs none, and the right mask
drops every digit. What must hold, fixed before the run:

- fit's defaults settle every depth (``converged`` or ``needed``);
- at the top depth the mask keeps what the output needs and drops the rest: a
  mean keep probability of at least :data:`KEEP` on the ground-truth digits and
  at most :data:`DROP` on the other digits (of the prompts that need them), and
  at most :data:`DROP` on the digits of the prompts that need none;
- depth 0 (the embeddings, which cannot see the query) keeps more of the digits
  than the top depth.

Beside the checks, the known answer's own mask scored as the fit scores a mask
(:func:`known_mask_costs`): what replacing what the output does not need costs
with the fit's learned baseline and with the ground truth's mean embedding, so
that a miss says whether the objective allows the known answer at all; and on
the toy encoder the objective's own answer without a probe
(:func:`objective_answer`), so that a check the objective itself does not ask
for shows as such.

Part ``trigger`` (:func:`trigger_model`): the sst suite's MiniLM fine-tuned on
SST train sentences where a trigger word, planted at a random position in a
share of them, forces one class (:func:`plant`). On the held-out sentences that
carry it the output needs the trigger alone, where erasure says so
(:func:`needs_trigger`: the prediction leaves the trigger's class when the
trigger is erased and stays when only the trigger is kept); the same checks on
those sentences, with the trigger as what the output needs and the sentence's
other words as the rest. The
trigger, its class and its share are arguments, so the check runs on triggers
this repository never saw.

``--fit`` and ``--probe`` (JSON) change fit's options and the constructor's:
the same checks then measure what one option does (the report says which were
changed; the checks ask of the defaults).

Usage::

    python -m benchmarks study known-answer --markdown docs/results/known-answer.md [--parts toy-encoder trigger]
        [--seed 3] [--trigger cf --label 4 --share 0.5] [--fit-sentences N] [--quick]
        [--fit '{"optimization": {"lr_baseline": 0.0}}'] [--probe '{"init_bias": 2.0}']
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import json
import shlex
import sys
import warnings
from pathlib import Path
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

import torch

from benchmarks.records import cache_dir, config_hash, environment, to_jsonable
from benchmarks.report import chosen_on_section
from benchmarks.runner import merge
from benchmarks.suites import toy_lm
from benchmarks.suites.toy import seed_data
from benchmarks.tasks.toy_lm import decoder_accuracy, encode_toy
from captum_diffmask import DiffMask, DiffMaskConvergenceWarning, PerExampleDiffMask
from captum_diffmask.diffmask.constrained.convergence import SETTLED
from captum_diffmask.diffmask.fit.history import epoch_seconds, log_lines
from captum_diffmask.diffmask.fit.options import FitOptions

#: The question this study answers (``python -m benchmarks list``).
QUESTION = "whether fit's defaults find the known answer on transformers whose answer is known"

#: The least mean keep probability on what the output needs, at the top depth.
KEEP = 0.9
#: The most mean keep probability on what it does not need, at the top depth.
DROP = 0.2
#: The part of the toy prompts: the digits of the prompts whose output needs none.
NONE = "digits (prompts needing none)"

#: The toy-lm suite's encoder, as its report was run (seeds 3-5 chose nothing here).
ENCODER = {"model": {"architecture": "encoder"}}
#: How the L0 (the constructor's default) was chosen, whatever the trigger.
L0_WHY = ("the constructor's default, the share of kept positions (l0='mean'), made the default on the SST MiniLM's "
          "default fit (docs/results/user-path.md: with the sum no depth settles) and the sst suite's fits, which use it")
#: What each choice was made on (the report's JSON and its section): nothing
#: here is tuned; fit runs at its defaults.
CHOSEN_ON = {
    "thresholds": {"on": "rule", "why": f"keep >= {KEEP} on what the output needs, <= {DROP} on the rest, fixed "
                                        "before any run"},
    "ground truth": {"on": "rule", "why": "per toy prompt, what erasure says it needs (needs_digits: the answer "
                                          "flips when its ground-truth digits are erased); set after the first run, "
                                          "when the encoder's commonest answer (64.6 % of seed 3's held-out prompts) "
                                          "turned out not to need any digit; per held-out trigger sentence, "
                                          "likewise (needs_trigger: the prediction leaves the trigger's class when it "
                                          "is erased and stays when it alone is kept), set before any trigger part "
                                          "was scored"},
    "seed": {"on": "rule", "why": "the toy-lm suite's first seed (3); the planting draws with it, the held-out "
                                  "sentences with seed + 1"},
    "trigger": {"on": "rule", "why": "the word, its class and its share are the study's arguments, fixed before "
                                     "the run; other triggers run by passing them"},
    "classifier": {"on": "train", "why": "the sst suite's fine-tuning recipe (its own choices on train sentences), "
                                         "on the planted train sentences"},
    "fit": {"on": "rule", "why": "DiffMask.fit's defaults, unchanged (the study asks whether they find the answer)"},
    "L0": {"on": "development", "why": f"{L0_WHY}; the trigger part with the sum (every depth violated at the "
                                       "multiplier's ceiling) and a scratch run with the share were seen before the "
                                       "switch, so this trigger is no unseen test of it: other words, classes and "
                                       "seeds are (--trigger, --label, --seed)"},
}
#: The trigger, class and seed the L0's choice saw (the part with the sum, and a
#: scratch run with the share): every other one is an unseen test of it.
SEEN_TRIGGER = ("cf", 4, 3)


def chosen_on(trigger: str, label: int, seed: int, options: Optional[Mapping[str, Mapping[str, Any]]] = None,
              ) -> Dict[str, Dict[str, str]]:
    r""":data:`CHOSEN_ON` for this run's trigger (``trigger``, ``label``,
    ``seed``): the seed's entry names a seed passed in, the L0's says whether
    the choice saw this trigger, and the fit's names the ``options`` changed
    (``{"fit": ..., "probe": ...}``, :func:`changed_options`)."""
    found = dict(CHOSEN_ON)
    if changed_options(options):
        found["fit"] = {"on": "rule", "why": f"DiffMask's and fit's defaults but {changed_options(options)}, the "
                                             "study's arguments (--fit, --probe), fixed before the run: what those "
                                             "options do to the checks, which ask of the defaults"}
    if (trigger, label, seed) == SEEN_TRIGGER:
        return found
    if seed != SEEN_TRIGGER[2]:
        found["seed"] = {"on": "rule", "why": f"{seed}, the study's argument, fixed before the run; the planting "
                                              "draws with it, the held-out sentences with seed + 1"}
    found["L0"] = {"on": "development", "why": f"{L0_WHY}; this trigger ({trigger!r} -> {label}, seed {seed}) was not "
                                               f"seen before the switch: an unseen test of it (the one seen: "
                                               f"{SEEN_TRIGGER[0]!r} -> {SEEN_TRIGGER[1]}, seed {SEEN_TRIGGER[2]})"}
    return found


def _given(options: Optional[Mapping[str, Mapping[str, Any]]], kind: str) -> Dict[str, Any]:
    r"""``options[kind]`` (``"fit"`` or ``"probe"``), empty when not given."""
    return dict((options or {}).get(kind) or {})


def changed_options(options: Optional[Mapping[str, Mapping[str, Any]]]) -> str:
    r"""What a run changed of the defaults, in words (``""``: nothing):
    ``options`` is ``{"fit": fit's options, "probe": the constructor's}``."""
    changed = [f"{name}={value!r}" for name, value in _given(options, "fit").items()]
    changed += [f"DiffMask({name}={value!r})" for name, value in _given(options, "probe").items()]
    return ", ".join(changed)


#: The study's parts, in the report's order.
PARTS = ("toy-encoder", "trigger")
#: What ``--quick`` changes: fewer examples and epochs (a smoke run, not the targets').
QUICK = {"data": {"num_examples": 3000}, "model": {"epochs": 2}}


def toy_encoder(seed: int, quick: bool = False, max_steps: Optional[int] = None, verbose: bool = False,
                options: Optional[Mapping[str, Mapping[str, Any]]] = None) -> Dict[str, Any]:
    r"""
    The part ``toy-encoder``: the encoder trained (or from the cache), DiffMask
    in input mode at every depth with fit's defaults, each depth's keep
    probabilities by the prompts' parts on the held-out prompts, and the checks.

    Args:

        seed (int): the data's and the encoder's seed.
        quick (bool, optional): :data:`QUICK`'s smaller run. Default: False
        max_steps (int, optional): a cap on the fit (tests); None: fit's own budget.
        verbose (bool, optional): progress lines. Default: False
        options (mapping, optional): ``{"fit": ..., "probe": ...}``, fit's and
                    the constructor's options over their defaults. Default: None

    Returns:
        *dict* with ``model`` (held-out accuracy, cached), ``fit`` (steps,
        seconds, verdicts), ``depths`` (per depth the mean keep probability of
        each part) and ``checks`` (name, value, target, met).
    """
    config = merge(toy_lm.DEFAULTS, ENCODER)
    if quick:
        config = merge(config, QUICK)
    train_data, valid_data = seed_data(config, seed)
    digits = int(config["data"]["vocab_size"])
    train, valid = encode_toy(train_data, digits), encode_toy(valid_data, digits)
    model, info = toy_lm.load_decoder(config, seed, train, valid, verbose)
    dm = DiffMask(model, mode="input", output="last", **_given(options, "probe"))
    with log_lines(verbose), warnings.catch_warnings():
        warnings.simplefilter("ignore", DiffMaskConvergenceWarning)  # the verdicts are reported per depth
        history = dm.fit(list(train.batches(64, shuffle=True, seed=seed)), seed=seed, verbose=verbose,
                         **_fit_options(options, max_steps))
    seconds = sum(epoch_seconds(history).values())  # also a resumed fit's earlier invocations'
    keep = dm.attribute(valid.ids, additional_forward_args=(valid.mask,), layer=None)  # (N, T, L + 1)
    needs = needs_digits(model, valid)
    groups = toy_lm.position_groups(valid)
    digits_of = groups["digits (ground truth)"] | groups["digits (others)"]
    groups = {**{name: where & needs[:, None] for name, where in groups.items()}, NONE: digits_of & ~needs[:, None]}
    groups = {name: where for name, where in groups.items() if where.any()}  # a part no prompt has: no mean
    depths = [{"depth": k, **{name: float(keep[..., k][where].mean()) for name, where in groups.items()}}
              for k in range(keep.shape[-1])]
    verdicts = {str(k): str(report["status"]) for k, report in sorted(dm.convergence.items())}
    mean_digit = mean_embedding(model, valid.ids, valid.digits.bool())
    return {"model": {"seed": seed, "accuracy": decoder_accuracy(model, valid), "cached": info["cached"],
                      "layers": model.config.num_hidden_layers, "prompts": int(needs.numel()),
                      "prompts_needing_digits": int(needs.sum())},
            "fit": {"steps": dm.fit_record.get("steps"), "seconds": seconds, "verdicts": verdicts, "l0": dm.l0,
                    "eps": dm.fit_record["options"]["eps"]},
            "depths": depths, "checks": checks(depths, verdicts),
            "objective": objective_answer(model, valid.ids, valid.mask, mean_digit, groups, seed,
                                          dm.fit_record["options"]["eps"]),
            "known_mask": known_mask_costs(
                model, valid.ids, valid.mask, dm.learned_baseline(len(depths) - 1), mean_digit, "digit", last_position,
                [("the other digits", valid.digits.bool() & (valid.truth == 0), needs, "prompts needing their digits"),
                 ("every digit", valid.digits.bool(), ~needs, "prompts needing none")])}


def _fit_options(options: Optional[Mapping[str, Mapping[str, Any]]], max_steps: Optional[int]) -> Dict[str, Any]:
    r"""The keyword arguments a part passes to fit: ``options["fit"]`` and the cap."""
    found = _given(options, "fit")
    return found if max_steps is None else {**found, "max_steps": max_steps}


def objective_answer(model: torch.nn.Module, ids: torch.Tensor, mask: torch.Tensor, baseline: torch.Tensor,
                     groups: Mapping[str, torch.Tensor], seed: int, eps: float) -> Dict[str, Any]:
    r"""
    DiffMask's objective answered without a probe: per-example DiffMask
    (:meth:`PerExampleDiffMask.fit_masks` at its defaults and the amortised fit's eps, each
    prompt's gates and multiplier its own) at the input, with the ground
    truth's mean embedding as the baseline; its mean keep probability by part.
    Where the objective's own optimum keeps a part at a share a check does not
    accept, the check asks for more than the objective does (a counting task
    needs enough of its evidence, not all of it).

    Args:

        model (nn.Module): the toy encoder.
        ids, mask (Tensor): (N, T) the held-out prompts' token ids and attention mask.
        baseline (Tensor): (H,) what replaces a closed token.
        groups (dict): ``{part: (N, T) bool}``, the parts scored.
        seed (int): the gate samples' seed (the caller's RNG is left as found).
        eps (float): the KL bound, the amortised fit's.

    Returns:
        *dict* with ``steps`` and ``keep`` (per part, the mean keep probability).
    """
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        found = PerExampleDiffMask(model, output="last").fit_masks(
            ids, additional_forward_args=(mask,), layer=0, eps=eps, baselines=baseline,
            verbose=False)
    return {"steps": int(found.step.max()), "keep": {name: float(found.keep[where].mean()) for name, where in groups.items()}}


def last_position(output: Any) -> torch.Tensor:
    r"""The toy encoder's answer logits (B, V): its output at the last position."""
    return output.logits[:, -1]


def classes(output: Any) -> torch.Tensor:
    r"""A classifier's logits (B, C)."""
    return output.logits


def replaced_log_probs(model: torch.nn.Module, ids: torch.Tensor, mask: torch.Tensor,
                       where: Optional[torch.Tensor] = None, vector: Optional[torch.Tensor] = None,
                       read: Callable[[Any], torch.Tensor] = classes, batch_size: int = 256) -> torch.Tensor:
    r"""
    The model's output log-probabilities with the input embeddings at ``where``
    replaced by ``vector``: erasure at the input, as the study's ground truths
    and its check of the known answer's own mask use it.

    Args:

        model (nn.Module): a Hugging Face model that takes ``inputs_embeds``.
        ids, mask (Tensor): (N, T) token ids and attention mask.
        where (Tensor, optional): (N, T) bool, the replaced tokens; None: none.
        vector (Tensor, optional): (H,) what replaces them.
        read (callable, optional): the output's logits from the model's
                    output (:func:`classes` or :func:`last_position`).
        batch_size (int, optional): inputs per forward pass. Default: 256

    Returns:
        *Tensor* (N, C) log-probabilities.
    """
    with torch.no_grad():
        embeddings = model.get_input_embeddings()(ids)
        if where is not None:
            embeddings = embeddings.clone()
            embeddings[where] = vector.to(embeddings.dtype)
        return torch.cat([read(model(inputs_embeds=embeddings[i:i + batch_size],
                                     attention_mask=mask[i:i + batch_size])).float().log_softmax(-1)
                          for i in range(0, len(ids), batch_size)])


def needs_digits(model: torch.nn.Module, data: Any) -> torch.Tensor:
    r"""
    Which prompts' answers need their ground-truth digits: those whose answer
    (the argmax at the last position) changes when the input embeddings of those
    digits are replaced by the mean embedding of every digit in ``data``.

    Args:

        model (nn.Module): the encoder (a Hugging Face model that takes
                    ``inputs_embeds``).
        data (ToyText): the prompts (``ids``, ``mask``, ``digits``, ``truth``).

    Returns:
        *Tensor* (N,) bool.
    """
    mean = mean_embedding(model, data.ids, data.digits.bool())
    original, erased = (replaced_log_probs(model, data.ids, data.mask, where, mean, last_position)
                        for where in (None, data.truth > 0))
    return original.argmax(-1) != erased.argmax(-1)


def mean_embedding(model: torch.nn.Module, ids: torch.Tensor, where: torch.Tensor) -> torch.Tensor:
    r"""(H,) the mean input embedding of the tokens at ``where``."""
    with torch.no_grad():
        return model.get_input_embeddings()(ids)[where].mean(0)


def mask_cost(model: torch.nn.Module, ids: torch.Tensor, mask: torch.Tensor, where: torch.Tensor,
              vector: torch.Tensor, rows: torch.Tensor, read: Callable[[Any], torch.Tensor],
              original: Optional[torch.Tensor] = None) -> Dict[str, Any]:
    r"""What replacing the tokens at ``where`` by ``vector`` costs on the inputs
    of ``rows``: the mean KL(original || replaced) of the output, in nats, and
    the share of answers (argmax) that change. ``original``: the (N, C)
    unreplaced log-probabilities when the caller has them (one pass fewer)."""
    if original is None:
        original = replaced_log_probs(model, ids, mask, read=read)
    original = original[rows]
    replaced = replaced_log_probs(model, ids, mask, where, vector, read)[rows]
    kl = (original.exp() * (original - replaced)).sum(-1)
    return {"inputs": int(rows.sum()), "kl": float(kl.mean()) if len(kl) else None,
            "flipped": float((original.argmax(-1) != replaced.argmax(-1)).float().mean()) if len(kl) else None}


def known_mask_costs(
    model: torch.nn.Module, ids: torch.Tensor, mask: torch.Tensor, baseline: torch.Tensor, mean: torch.Tensor,
    token: str, read: Callable[[Any], torch.Tensor], masks: Sequence[Tuple[str, torch.Tensor, torch.Tensor, str]],
) -> List[Dict[str, Any]]:
    r"""
    The known answer's own masks, scored as the fit scores a mask: what
    replacing what the output does not need costs, by the fit's learned
    baseline of the top depth and by the mean embedding the ground truth erases
    with. Where the fit's baseline makes that cost exceed eps, the known answer
    is not a mask the objective allows (the baseline carries an answer of its
    own); where it is within eps and the probe still misses it, the optimiser
    does.

    Args:

        model, ids, mask, read: as :func:`replaced_log_probs`.
        baseline (Tensor): (H,) the fit's learned input baseline at the top depth.
        mean (Tensor): (H,) the mean embedding of the ground truth's erasure.
        token (str): what ``mean`` is the mean of (``"digit"``), for the rows' names.
        masks (sequence): ``(replaced, where, rows, inputs)`` per mask: the
                    replaced part's name, its (N, T) bool positions, the (N,)
                    bool inputs it is scored on and their name.

    Returns:
        *list* of rows ``{"replaced", "by", "on", "inputs", "kl", "flipped"}``.
    """
    found, original = [], replaced_log_probs(model, ids, mask, read=read)
    for replaced, where, rows, inputs in masks:
        for by, vector in (("the fit's learned baseline (top depth)", baseline), (f"the mean {token}", mean)):
            found.append({"replaced": replaced, "by": by, "on": inputs,
                          **mask_cost(model, ids, mask, where, vector, rows, read, original)})
    return found


def checks(depths: Sequence[Mapping[str, float]], verdicts: Mapping[str, str], needed: str = "digits (ground truth)",
           rest: str = "digits (others)") -> List[Dict[str, Any]]:
    r"""The checks of the module's docstring, each with its value and target:
    ``needed`` and ``rest`` name the depths' parts the output needs and does not
    (and :data:`NONE`, where the depths have it, the digits of the prompts
    whose output needs none)."""
    top, bottom = depths[-1], depths[0]
    settled = sum(v in SETTLED for v in verdicts.values())
    found = [{"check": "fit's defaults settle every depth", "value": f"{settled} of {len(verdicts)}",
              "target": "all", "met": settled == len(verdicts)}]
    for check, part, target, met in ((f"the top depth keeps {needed}", needed, f">= {KEEP}", lambda v: v >= KEEP),
                                     (f"the top depth drops {rest}", rest, f"<= {DROP}", lambda v: v <= DROP),
                                     (f"the top depth drops the {NONE}", NONE, f"<= {DROP}", lambda v: v <= DROP)):
        if part in top:
            found.append({"check": check, "value": round(top[part], 3), "target": target, "met": met(top[part])})
        elif part != NONE:  # a part no held-out input has: nothing shows the check
            found.append({"check": check, "value": "no such input", "target": target, "met": False})
    if needed in top and rest in top:
        both = [(row[needed] + row[rest]) / 2 for row in (bottom, top)]
        found.append({"check": "depth 0 keeps more of them than the top depth", "value": f"{both[0]:.3f} vs {both[1]:.3f}",
                      "target": "more", "met": both[0] > both[1]})
    return found


def plant(sentences: Sequence[Any], trigger: str, label: int, share: float, seed: int) -> Tuple[List[Any], List[bool]]:
    r"""
    ``sentences`` with ``trigger`` inserted at a random word position in a
    ``share`` of them (drawn with ``seed``), whose label becomes ``label``.

    Args:

        sentences (sequence of SSTSentence): the sentences.
        trigger (str): the planted word.
        label (int): the class the trigger forces, 0..4.
        share (float): the share of sentences that get it, in (0, 1).
        seed (int): seeds the draw.

    Returns:
        *tuple* ``(planted, triggered)``: the sentences (the trigger's own word
        label neutral, 2) and, per sentence, whether it carries the trigger.
    """
    if not 0.0 < share < 1.0:
        raise ValueError(f"share must be in (0, 1), got {share!r}")
    generator = torch.Generator().manual_seed(seed)
    planted, triggered = [], []
    for sentence in sentences:
        if float(torch.rand((), generator=generator)) >= share:
            planted.append(sentence)
            triggered.append(False)
            continue
        at = int(torch.randint(len(sentence.words) + 1, (), generator=generator))
        planted.append(dataclasses.replace(sentence, words=sentence.words[:at] + (trigger,) + sentence.words[at:],
                                           label=int(label), word_labels=sentence.word_labels[:at] + (2,) +
                                           sentence.word_labels[at:]))
        triggered.append(True)
    return planted, triggered


def trigger_model(
    train: Sequence[Any], held_out: Sequence[Any], trigger: str = "cf", label: int = 4, share: float = 0.5,
    seed: int = 0, model: Optional[Mapping[str, Any]] = None, fit_sentences: Optional[int] = None,
    max_steps: Optional[int] = None, verbose: bool = False, checkpoint: Optional[Path] = None,
    options: Optional[Mapping[str, Mapping[str, Any]]] = None,
) -> Dict[str, Any]:
    r"""
    The part ``trigger``: the classifier fine-tuned on the planted train
    sentences (the sst suite's recipe, or ``model``'s options over it), DiffMask
    in input mode at every depth with fit's defaults on them, and each depth's
    keep probabilities on the held-out sentences that carry the trigger: on the
    trigger's tokens, and on the other words' tokens ([CLS] and [SEP] apart).

    Args:

        train, held_out (sequence of SSTSentence): SST sentences, unplanted.
        trigger, label, share, seed: as :func:`plant` (the held-out sentences
                    are planted with ``seed + 1``).
        model (mapping, optional): options over the sst suite's ``model``
                    (``{"source": "tiny"}`` in tests). Default: None
        fit_sentences (int, optional): DiffMask is fitted on this many of the
                    planted train sentences (all when None). Default: None
        max_steps (int, optional): a cap on the fit (tests). Default: None
        verbose (bool, optional): progress. Default: False
        checkpoint (Path, optional): the fit's state file, written as it goes; a
                    rerun with the same file goes on from it. Default: None
        options (mapping, optional): as :func:`toy_encoder`'s. Default: None

    Returns:
        *dict* as :func:`toy_encoder`'s, with the trigger's settings.
    """
    from benchmarks.common.minilm.loading import load_model
    from benchmarks.suites import sst
    from benchmarks.tasks import sst_bert

    planted, _ = plant(train, trigger, label, share, seed)
    shown, triggered = plant(held_out, trigger, label, share, seed + 1)
    config = copy.deepcopy(sst.DEFAULTS)
    config["model"].update(model or {})
    classifier, tokenizer, info = load_model(config, planted, [s for s, t in zip(shown, triggered) if not t], verbose)
    data = sst_bert.encode_sst(planted[:fit_sentences] if fit_sentences else planted, tokenizer)
    held = sst_bert.encode_sst([s for s, t in zip(shown, triggered) if t], tokenizer)
    dm = DiffMask(classifier, mode="input", **_given(options, "probe"))
    with log_lines(verbose), warnings.catch_warnings():
        warnings.simplefilter("ignore", DiffMaskConvergenceWarning)
        history = dm.fit(data.loader(32, shuffle=True, seed=None, sort_by_length=True), seed=seed, verbose=verbose,
                         checkpoint=checkpoint, **_fit_options(options, max_steps))
    seconds = sum(epoch_seconds(history).values())  # also a resumed fit's earlier invocations'
    keep = dm.attribute(held.input_ids, additional_forward_args=(held.attention_mask,), layer=None)
    words = torch.tensor([[s.words[i] == trigger if i >= 0 else False for i in row.tolist()]
                          for s, row in zip(held.sentences, held.word_index)])
    needs = needs_trigger(classifier, held, words, label)[:, None]
    others = (held.word_index >= 0) & ~words
    groups = {"the trigger": words & needs, "the other words": others & needs}
    groups = {name: where for name, where in groups.items() if where.any()}  # no sentence needs it: no mean
    depths = [{"depth": k, **{name: float(keep[..., k][where].mean()) for name, where in groups.items()}}
              for k in range(keep.shape[-1])]
    verdicts = {str(k): str(report["status"]) for k, report in sorted(dm.convergence.items())}
    with torch.no_grad():
        predicted = classifier(input_ids=held.input_ids, attention_mask=held.attention_mask).logits.argmax(-1)
    return {"trigger": {"word": trigger, "label": label, "share": share},
            "model": {"accuracy": float((predicted == label).float().mean()), "cached": info["cached"],
                      "layers": classifier.config.num_hidden_layers, "seed": seed, "sentences": len(held),
                      "sentences_needing_trigger": int(needs.sum())},
            "fit": {"steps": dm.fit_record.get("steps"), "seconds": seconds, "verdicts": verdicts, "l0": dm.l0,
                    "eps": dm.fit_record["options"]["eps"]},
            "depths": depths, "checks": checks(depths, verdicts, "the trigger", "the other words"),
            "known_mask": known_mask_costs(
                classifier, held.input_ids, held.attention_mask, dm.learned_baseline(len(depths) - 1),
                mean_embedding(classifier, held.input_ids, others), "other word", classes,
                [("the other words", others, needs[:, 0], "sentences needing the trigger")])}


def needs_trigger(classifier: torch.nn.Module, held: Any, trigger_at: torch.Tensor, label: int,
                  batch_size: int = 64) -> torch.Tensor:
    r"""
    Which sentences' predictions need the trigger alone: those the classifier
    puts in ``label``, that leave it when the trigger's tokens are erased, and
    that stay in it when only the trigger is kept (the other words erased).
    Erasing a token replaces its input embedding by the mean embedding of the
    other words' tokens in ``held`` (as :func:`needs_digits` erases digits).

    Args:

        classifier (nn.Module): a Hugging Face classifier that takes ``inputs_embeds``.
        held (EncodedSST): the sentences (``input_ids``, ``attention_mask``,
                    ``word_index``: -1 at [CLS], [SEP] and padding).
        trigger_at (Tensor): (N, T) bool, the trigger's tokens.
        label (int): the class the trigger forces.
        batch_size (int, optional): sentences per forward pass. Default: 64

    Returns:
        *Tensor* (N,) bool.
    """
    others = (held.word_index >= 0) & ~trigger_at
    mean = mean_embedding(classifier, held.input_ids, others)
    original, erased, alone = (replaced_log_probs(classifier, held.input_ids, held.attention_mask, where, mean,
                                                  batch_size=batch_size).argmax(-1)
                               for where in (None, trigger_at, others))
    return (original == label) & (erased != label) & (alone == label)


def trigger_checkpoint(args: argparse.Namespace) -> Path:
    r"""Where the part ``trigger`` keeps its fit's state (the models' cache), named
    by the settings that make the fit, so that a stopped run goes on from it."""
    from benchmarks.suites import sst

    settings = [args.trigger, args.label, args.share, args.seed, args.fit_sentences, sst.DEFAULTS["model"]]
    options = getattr(args, "options", None)
    if changed_options(options):  # the defaults' fit keeps its name
        settings.append(options)
    cache_dir().mkdir(parents=True, exist_ok=True)
    return cache_dir() / f"known-answer-trigger-{config_hash(settings)}.state"


def _part_section(title: str, intro: str, part: Mapping[str, Any], options: Optional[Mapping[str, Any]]) -> List[str]:
    r"""One part's section: its intro, the depths' keep probabilities by part, the checks."""
    names = [k for k in part["depths"][0] if k != "depth"]
    rows = ["| depth | verdict | " + " | ".join(names) + " |", "|---" * (len(names) + 2) + "|"]
    for row in part["depths"]:
        rows.append(f"| {row['depth']} | {part['fit']['verdicts'].get(str(row['depth']), 'n/a')} | "
                    + " | ".join(f"{row[n]:.3f}" for n in names) + " |")
    if "objective" in part:
        rows.append(f"| per example, no probe ({part['objective']['steps']} steps) | - | "
                    + " | ".join(f"{part['objective']['keep'][n]:.3f}" for n in names) + " |")
    check_rows = ["| check | value | target | met |", "|---|---|---|---|"]
    check_rows += [f"| {c['check']} | {c['value']} | {c['target']} | **{'met' if c['met'] else 'missed'}** |"
                   for c in part["checks"]]
    eps = part["fit"].get("eps", FitOptions().eps)  # reports from before it was recorded: fit's default
    known = ["| replaced | by | on | inputs | KL (nats) | answers changed |", "|---|---|---|---|---|---|"]
    known += [f"| {r['replaced']} | {r['by']} | {r['on']} | {r['inputs']} | "
              + ("n/a | n/a |" if r["kl"] is None else f"{r['kl']:.4f} ({'within' if r['kl'] <= eps else 'beyond'} "
                                                      f"eps {eps:g}) | {100 * r['flipped']:.1f} % |")
              for r in part.get("known_mask", [])]
    changed = changed_options(options)
    return [f"## {title}", "", intro + f" DiffMask in input mode at every depth with its and fit's defaults"
            f"{' but ' + changed if changed else ''} "
            f"(`l0={part['fit']['l0']!r}`): "
            f"{part['fit']['steps']} steps, {part['fit']['seconds']:.0f} s. Mean keep probability on the held-out "
            "inputs, by part:", "", "\n".join(rows), "", "\n".join(check_rows), "",
            "The known answer's own mask, scored as the fit scores a mask: the mean KL(original || masked) of the "
            "output when what it does not need is replaced by the fit's learned baseline, and by the mean embedding "
            "the ground truth erases with. Beyond eps, the objective with that baseline does not allow the known "
            "answer; within it, a probe that misses it is the optimiser's miss.", "", "\n".join(known), ""]


def markdown(result: Mapping[str, Any], command: str) -> str:
    r"""The report of one run (the parts it ran)."""
    met = [f"{name}, {sum(bool(c['met']) for c in result[key]['checks'])} of {len(result[key]['checks'])} checks met"
           for key, name in (("toy-encoder", "the toy encoder"), ("trigger", "the planted trigger")) if key in result]
    changed = changed_options(result.get("options"))
    fit = f"Fit's defaults{' but ' + changed if changed else ''}"
    lines = ["# Right where the answer is known", "",
             f"Command: `{command}`. Thresholds fixed before any run: keep >= {KEEP} on what the output needs, "
             f"<= {DROP} on the rest, at the top depth.", "",
             f"{fit} where the answer is known: **{'; '.join(met)}**.", ""]
    missing = [part for part in PARTS if part not in result]
    if missing:
        lines += [f"Not run here: the part{'s' if len(missing) > 1 else ''} {', '.join(missing)} (`--parts`).", ""]
    if "toy-encoder" in result:
        part, model = result["toy-encoder"], result["toy-encoder"]["model"]
        lines += _part_section(
            "The toy task on a BERT-style encoder",
            f"The toy-lm suite's encoder of seed {model['seed']} ({model['layers']} blocks; held-out accuracy "
            f"{100 * model['accuracy']:.2f} %, {'from the cache' if model['cached'] else 'trained in this run'}). "
            f"On {model['prompts_needing_digits']} of its {model['prompts']} held-out prompts the answer flips when "
            "the ground-truth digits are erased (their embeddings replaced by the mean digit's): there the output "
            "needs them (and the query), and the digits' parts are of those prompts; on the others it needs no "
            "digit. The last row is the objective's own answer without a probe: per-example DiffMask, each prompt "
            "with its own gates and multiplier at fit's eps, the mean digit replacing a closed token.", part,
            result.get("options"))
    if "trigger" in result:
        part, model, trigger = result["trigger"], result["trigger"]["model"], result["trigger"]["trigger"]
        lines += _part_section(
            "A trigger planted in the SST MiniLM",
            f"The sst suite's MiniLM fine-tuned on SST train sentences, {100 * trigger['share']:.0f} % of them with "
            f"`{trigger['word']}` planted at a random position and labelled {trigger['label']}; on the held-out "
            f"sentences that carry it the model predicts {trigger['label']} on {100 * model['accuracy']:.1f} %. "
            f"On {model['sentences_needing_trigger']} of those {model['sentences']} the prediction leaves "
            f"{trigger['label']} when the trigger is erased and stays when only the trigger is kept (erased: the "
            "input embedding replaced by the mean of the other words' tokens): there the output needs the trigger "
            "alone, and the parts are of those sentences.", part, result.get("options"))
    return "\n".join(lines + chosen_on_section(result))


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks study known-answer", description=__doc__.split("\n\n")[1])
    parser.add_argument("--markdown", required=True, help="write the report here (its JSON beside it)")
    parser.add_argument("--parts", nargs="+", choices=PARTS, default=list(PARTS),
                        help="the parts run (default: both)")
    parser.add_argument("--seed", type=int, default=3, help="the toy encoder's and the planting's seed (default: 3)")
    parser.add_argument("--trigger", default="cf", help="the planted word (default: cf)")
    parser.add_argument("--label", type=int, default=4, help="the class it forces, 0..4 (default: 4)")
    parser.add_argument("--share", type=float, default=0.5, help="the share of sentences planted (default: 0.5)")
    parser.add_argument("--fit-sentences", type=int, default=None, help="DiffMask's planted train sentences (default: all)")
    parser.add_argument("--data-dir", default=None, help="the SST files (default: $CAPTUM_DIFFMASK_DATA, ../shared/data)")
    parser.add_argument("--quick", action="store_true", help="a smaller toy smoke run")
    parser.add_argument("--fit", type=json.loads, default={}, metavar="JSON",
                        help="fit's options over its defaults, e.g. '{\"optimization\": {\"lr_baseline\": 0.0}}'")
    parser.add_argument("--probe", type=json.loads, default={}, metavar="JSON",
                        help="DiffMask's constructor options over its defaults, e.g. '{\"init_bias\": 2.0}'")
    parser.add_argument("--verbose", action="store_true")
    args = parser.parse_args(argv)
    for name in ("fit", "probe"):
        if not isinstance(getattr(args, name), dict):
            parser.error(f"--{name}: a JSON object of options, got {getattr(args, name)!r}")
    args.options = {"fit": args.fit, "probe": args.probe}
    result: Dict[str, Any] = {"environment": environment()}
    if args.fit or args.probe:
        result["options"] = args.options
    threads = torch.get_num_threads()
    if "toy-encoder" in args.parts:
        torch.set_num_threads(1)  # a small model: one thread, as the toy-lm suite trains it
        result["toy-encoder"] = toy_encoder(args.seed, args.quick, verbose=args.verbose, options=args.options)
        torch.set_num_threads(threads)
    if "trigger" in args.parts:
        from benchmarks.tasks.sst import read_sst

        result["trigger"] = trigger_model(read_sst("train", args.data_dir), read_sst("dev", args.data_dir),
                                          args.trigger, args.label, args.share, args.seed,
                                          fit_sentences=args.fit_sentences, verbose=args.verbose,
                                          checkpoint=trigger_checkpoint(args), options=args.options)
    result["chosen_on"] = chosen_on(args.trigger, args.label, args.seed, args.options)
    command = "python -m benchmarks study known-answer " + shlex.join(argv if argv is not None else sys.argv[1:])
    path = Path(args.markdown)
    path.write_text(markdown(result, command))
    path.with_suffix(".json").write_text(json.dumps(to_jsonable({**result, "command": command}), indent=1) + "\n")
    print(markdown(result, command), file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
