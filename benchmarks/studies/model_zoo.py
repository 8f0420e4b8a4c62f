r"""Every architecture in transformers' own auto-mappings, built tiny from its
config class alone, run through DiffMask with zero configuration.

For each architecture of the sequence-classification, causal-LM and
question-answering mappings, :func:`tiny_config` shrinks the config class's
defaults by one rule for every family (no hand-written list of models), and
:func:`check_architecture` fits DiffMask for a step on a padded, labelled batch
and attributes every layer. An architecture **works** when the sites equal the
model's own hidden states (compared here, apart from the library's own
self-check; an encoder-decoder's encoder states fetched as the library fetches
them, :func:`~captum_diffmask.model.site_check.own_hidden_states`), the scores are (B, T, L + 1) in [0, 1] with 0 on padding, and the
labels never reached the model; it is **refused** when DiffMask raises an error
that names the architecture and says what to pass; anything else (another
exception, or a check that fails) is a **failure**. An architecture whose tiny
config cannot be built or is still too big is **not built**: the rule's gap,
not the library's, and listed as such.

Command: ``python -m benchmarks study model-zoo --markdown docs/results/model-zoo.md``.
"""

from __future__ import annotations

import argparse
import contextlib
import inspect
import json
import multiprocessing
import signal
import threading
import time
import traceback
import warnings
from dataclasses import asdict, dataclass
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Tuple

import torch
import transformers as hf
from transformers.models.auto import modeling_auto

from captum_diffmask.model.forward import cache_off

#: The question this study answers (``python -m benchmarks list``).
QUESTION = "DiffMask on every architecture of transformers' classification, causal-LM and QA mappings, built tiny"

#: task -> the auto-mapping (model_type -> class name) it enumerates
MAPPINGS = {
    "classification": "MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES",
    "causal-lm": "MODEL_FOR_CAUSAL_LM_MAPPING_NAMES",
    "question-answering": "MODEL_FOR_QUESTION_ANSWERING_MAPPING_NAMES",
}

#: the tiny vocabulary: special tokens 0..2, real tokens 3..98
VOCAB = 99
#: constructor argument -> tiny value; every family's spelling of the same size
TINY_SIZES: Dict[str, Any] = {
    **dict.fromkeys(("hidden_size", "d_model", "n_embd", "n_embed", "dim", "embed_dim", "d_embed"), 32),
    **dict.fromkeys(("num_attention_heads", "n_head", "n_heads", "num_heads", "encoder_attention_heads",
                     "decoder_attention_heads", "num_key_value_heads", "n_kv_heads"), 2),
    **dict.fromkeys(("intermediate_size", "d_ff", "ffn_dim", "encoder_ffn_dim", "decoder_ffn_dim", "n_inner",
                     "d_inner", "hidden_dim", "moe_intermediate_size", "shared_expert_intermediate_size",
                     "ffn_hidden_size", "expert_ffn_hidden_size"), 64),
    **dict.fromkeys(("head_dim", "d_kv", "d_head", "kv_channels", "v_head_dim", "qk_nope_head_dim",
                     "q_lora_rank", "kv_lora_rank"), 16),
    "qk_rope_head_dim": 16, "qk_head_dim": 32, "hidden_size_global": 32, "moe_topk": 2,
    **dict.fromkeys(("num_experts", "num_local_experts", "n_routed_experts"), 4),
    **dict.fromkeys(("vocab_size", "n_words"), VOCAB),
    **dict.fromkeys(("entity_vocab_size", "num_latents"), 8),
    "num_experts_per_tok": 1, "n_group": 1, "n_groups": 1, "topk_group": 1, "mamba_n_heads": 2, "embedding_size": 16, "emb_dim": 32, "d_latents": 32, "entity_emb_size": 16,
    "rotary_dim": 8,
    # one state-space head of head_dim covers hidden_size * expand (Mamba 2's validator)
    "expand": 1,
    # one codebook: each row of ids is one sequence (MusicGen's decoders)
    "num_codebooks": 1,
    # no layer reads another's keys and values (Gemma 3n's sharing needs its full depth)
    "num_kv_shared_layers": 0,
}
#: the constructor arguments that count query heads (key-value heads are the others)
QUERY_HEADS = ("num_attention_heads", "n_head", "n_heads", "num_heads", "encoder_attention_heads",
               "decoder_attention_heads")
#: the constructor arguments that set a depth
DEPTHS = frozenset(("num_hidden_layers", "num_layers", "n_layer", "n_layers", "encoder_layers", "decoder_layers",
                    "num_decoder_layers"))
#: the rungs :func:`build_tiny` tries in order: the depth (None: the default),
#: whether the widths shrink, and how many query heads share a key-value head.
#: Four layers give a hybrid stack one attention layer; the default depth
#: passes validators of per-layer lists (GPT-Neo's); default widths pass those
#: that tie a width to a default (SqueezeBERT's); grouped heads suit families
#: that double the key-value heads on some layers (MiMo's sliding windows).
RUNGS: Dict[str, Tuple[Optional[int], bool, int]] = {
    "tiny": (2, True, 1), "4 layers": (4, True, 1), "default depth": (None, True, 1), "default width": (2, False, 1),
    "grouped heads": (2, True, 2)}
#: special token ids inside the tiny vocabulary; real tokens are drawn from 3..98
TOKEN_IDS = {"pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2, "decoder_start_token_id": 0,
             "cls_token_id": 1, "sep_token_id": 2}
#: a tiny model with more parameters than this is "not built" (a memory guard)
MAX_PARAMETERS = 40_000_000
#: a tiny model whose plain forward pass (the second) takes longer is "not
#: built": a time guard against reference implementations of fused kernels
#: (a tiny model's pass takes milliseconds)
MAX_FORWARD_SECONDS = 3.0
#: once built, the library's check may take this many of the model's own
#: forward passes (measured in :func:`_built`) when that is longer than the
#: timeout: a check runs about ten, so a slow reference kernel or a loaded
#: machine slows the budget with the work instead of failing the architecture
LIBRARY_PASSES = 40
#: a tiny model with more layers is "not built" (Zamba's default depth is 76)
MAX_DEPTH = 32
#: a rung whose build and two passes take longer is abandoned
MAX_BUILD_SECONDS = 8.0
#: three rows of these lengths, right-padded
LENGTHS = (8, 6, 5)


def architectures(task: str) -> List[Tuple[str, str]]:
    r"""``(model_type, class name)`` for each architecture of ``task``'s mapping,
    sorted; a mapping entry naming several classes gives one row each."""
    names = getattr(modeling_auto, MAPPINGS[task])
    rows = []
    for model_type, classes in names.items():
        for name in (classes,) if isinstance(classes, str) else classes:
            rows.append((model_type, name))
    return sorted(rows)


def tiny_config(config_class: type, num_labels: int = 3, rung: str = "tiny") -> Any:
    r"""
    ``config_class`` with every size its constructor takes set to a tiny value
    (:data:`TINY_SIZES`), special token ids inside the tiny vocabulary, and each
    nested config (a vision tower, a text config) shrunk by the same rule.

    Args:

        config_class (type): a ``PretrainedConfig`` subclass.
        num_labels (int, optional): classes of a classification head. Default: 3
        rung (str, optional): which sizes to shrink (:data:`RUNGS`). Default: "tiny"

    Returns:
        *PretrainedConfig*, tiny.
    """
    parameters = inspect.signature(config_class.__init__).parameters
    depth, widths, group = RUNGS[rung]
    vocabularies = {"vocab_size": VOCAB, "n_words": VOCAB}
    sizes = {**(TINY_SIZES if widths else vocabularies), **dict.fromkeys(DEPTHS, depth)}
    if widths and group > 1:
        sizes.update((name, TINY_SIZES[name] * group) for name in QUERY_HEADS)
    kwargs: Dict[str, Any] = {name: value for name, value in sizes.items() if name in parameters and value is not None}
    # every other vocabulary (entities, per-layer inputs, pronunciations) the same size
    kwargs.update((name, VOCAB) for name in parameters if widths and _is_vocabulary(name) and name not in kwargs)
    kwargs.update((name, value) for name, value in TOKEN_IDS.items() if name in parameters)
    default = config_class()
    default_depth = next((getattr(default, name) for name in DEPTHS
                          if isinstance(getattr(default, name, None), int)), None)
    for name in parameters:
        try:
            nested = getattr(default, name, None)
        except Exception:  # a per-layer attribute with no one value (Gemma 4)
            continue
        if isinstance(nested, hf.PretrainedConfig):
            kwargs[name] = tiny_config(type(nested), num_labels, rung)
        elif depth is not None and isinstance(nested, (list, tuple)) and default_depth and len(nested) == default_depth:
            # one entry per layer (Zamba's block types): as many as the tiny model's layers
            kwargs[name] = list(nested[:depth])
    config = config_class(**kwargs, num_labels=num_labels)
    if getattr(config, "is_encoder_decoder", False) and getattr(config, "decoder_start_token_id", None) is None:
        config.decoder_start_token_id = 0  # as an encoder-decoder's hub config names it
    return config


def _is_vocabulary(name: str) -> bool:
    return name.endswith(("_vocab_size", "_vocab")) or name.startswith("vocab_size_")


@dataclass
class ZooResult:
    r"""One architecture's outcome: ``status`` is ``works``, ``refused``,
    ``failed`` or ``not built``; ``detail`` says why for all but ``works``."""

    task: str
    model_type: str
    architecture: str
    status: str
    detail: str = ""
    seconds: float = 0.0
    layers: int = 0
    rung: str = ""


def build_tiny(model_type: str, architecture: str, task: str) -> torch.nn.Module:
    r"""The architecture built from :func:`tiny_config` with seed 0, in eval mode:
    the first rung of :data:`RUNGS` whose model has at most
    :data:`MAX_PARAMETERS` parameters and runs a plain forward pass on
    :func:`labelled_batch`'s inputs.

    Raises:
        _NotBuilt: when no rung gives such a model (the first rung's reason).
    """
    reasons = []
    for rung in RUNGS:
        try:
            with _time_limit(MAX_BUILD_SECONDS):
                return _built(model_type, architecture, task, rung)
        except Exception as error:  # the shrinking rule's gap, reported as such
            reasons.append(f"{rung}: {type(error).__name__}: {_first_line(error)}")
    raise _NotBuilt(reasons[0] + _default_config_verdict(model_type, architecture))


def _config_class(model_type: str, architecture: str) -> type:
    config_class = getattr(getattr(hf, architecture), "config_class", None)
    if config_class is None or config_class is hf.PretrainedConfig:
        config_class = hf.CONFIG_MAPPING[model_type]
    return config_class


def _default_config_verdict(model_type: str, architecture: str) -> str:
    r"""Whether transformers itself builds the architecture from its default
    config (on the meta device: no memory), said for a "not built" row: where
    it does not, no tiny rule could, and the gap is transformers'."""
    try:
        with torch.device("meta"):
            getattr(hf, architecture)(_config_class(model_type, architecture)())
    except ImportError:
        return ""  # a library this machine lacks: the reason says which
    except Exception as error:  # noqa: BLE001 - the verdict, not a crash
        return f" (transformers' own default config does not build either: {type(error).__name__})"
    return ""


def _built(model_type: str, architecture: str, task: str, rung: str) -> torch.nn.Module:
    model_class = getattr(hf, architecture)
    config = tiny_config(_config_class(model_type, architecture), 2 if task == "question-answering" else 3, rung)
    if task == "causal-lm" and getattr(config, "is_decoder", None) is False:
        config.is_decoder = True  # a causal LM's hub config says so (Reformer's head insists)
    with torch.device("meta"):
        size = sum(p.numel() for p in model_class(config).parameters())
    if size > MAX_PARAMETERS:
        raise ValueError(f"{size / 1e6:.1f}M parameters")
    depth = max((getattr(config, name, 0) or 0 for name in DEPTHS if isinstance(getattr(config, name, 0), int)),
                default=0)
    if depth > MAX_DEPTH:  # a fit step re-runs the model once per layer
        raise ValueError(f"{depth} layers")
    torch.manual_seed(0)
    model = model_class(config).eval()
    languages = getattr(config, "languages", None)
    if callable(getattr(model, "set_default_language", None)) and languages:
        model.set_default_language(languages[0])  # what X-MOD's error asks a user to do
    batch = labelled_batch(config, task)
    inputs = {"input_ids": batch["input_ids"], "attention_mask": batch["attention_mask"]}
    # a plain forward, as the library runs it (forward.cache_off): a hybrid
    # stack's cache of linear-attention layers cannot even be started here
    with torch.no_grad(), cache_off(model):
        model(**inputs)  # the first pass may set up lazily
        start = time.perf_counter()
        model(**inputs)
    seconds = time.perf_counter() - start
    if seconds > MAX_FORWARD_SECONDS:
        raise TimeoutError(f"a forward pass of a 3 x 8 batch took {seconds:.1f} s")
    model.zoo_rung, model.zoo_forward_seconds = rung, seconds
    return model


def labelled_batch(config: Any, task: str) -> Dict[str, torch.Tensor]:
    r"""Three right-padded rows (lengths 8, 6, 5) of ids in 3..98, each row's
    last real token the end-of-sequence id (heads that pool on it need one),
    a question-answering row's third and fourth the separator id,
    with labels of the task's kind: (B,) classes, (B, T) next tokens, or
    start and end positions."""
    generator = torch.Generator().manual_seed(0)
    width = max(LENGTHS)
    ids = torch.randint(3, VOCAB, (len(LENGTHS), width), generator=generator)
    mask = (torch.arange(width) < torch.tensor(LENGTHS)[:, None]).long()
    eos = getattr(config, "eos_token_id", None)
    if isinstance(eos, int) and eos < VOCAB:
        ids[torch.arange(len(LENGTHS)), torch.tensor(LENGTHS) - 1] = eos
    sep = getattr(config, "sep_token_id", None)
    if task == "question-answering" and isinstance(sep, int) and sep < VOCAB:
        # a question-context pair as RoBERTa's tokenizer writes it, "q </s></s> c </s>"
        # (Longformer finds the question by its separators)
        ids[:, 2:4] = sep
    pad = getattr(config, "pad_token_id", None)
    ids[mask == 0] = pad if isinstance(pad, int) and pad < VOCAB else 0
    batch = {"input_ids": ids, "attention_mask": mask}
    if task == "classification":
        batch["labels"] = torch.tensor([0, 1, 2])
    elif task == "causal-lm":
        batch["labels"] = ids.clone()
    else:
        batch["start_positions"], batch["end_positions"] = torch.tensor([1, 2, 1]), torch.tensor([3, 4, 2])
    return batch


@contextlib.contextmanager
def _time_limit(seconds: float) -> Iterator[None]:
    r"""TimeoutError when the block runs longer than ``seconds`` (SIGALRM; no
    limit outside the main thread or where the signal does not exist)."""
    if not hasattr(signal, "setitimer") or threading.current_thread() is not threading.main_thread():
        yield
        return

    def expire(signum: int, frame: Any) -> None:
        raise TimeoutError(f"building the model and two forward passes took over {seconds:.0f} s")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


class _NotBuilt(Exception):
    r"""The tiny model could not be built (the shrinking rule's gap)."""


def _first_line(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return text[0] if text else ""


def check_architecture(task: str, model_type: str, architecture: str,
                       on_built: Optional[Callable[[float], None]] = None) -> ZooResult:
    r"""Builds one tiny architecture, fits DiffMask (hidden mode) for one step
    on a labelled batch and attributes every layer; see the module docstring
    for what ``works``, ``refused``, ``failed`` and ``not built`` mean.
    ``on_built`` is called with the seconds of one forward pass once the model
    is built, before the library runs."""
    from captum_diffmask import DiffMask

    start = time.perf_counter()
    result = ZooResult(task, model_type, architecture, "works")
    try:
        model = build_tiny(model_type, architecture, task)
        if on_built is not None:
            on_built(model.zoo_forward_seconds)
        batch = labelled_batch(model.config, task)
        explainer = DiffMask(model, mode="hidden")
        with warnings.catch_warnings(), _labels_seen(model) as seen:
            warnings.simplefilter("ignore")
            explainer.fit([batch], max_steps=1, seed=0, convergence={"until_converged": False}, verbose=False)
            scores = explainer.attribute(batch["input_ids"], additional_forward_args=(batch["attention_mask"],),
                                         layer=None)
        result.layers, result.rung = explainer.num_layers, model.zoo_rung
        problem = _labels_problem(seen) or _scores_problem(scores, batch, explainer.num_layers) \
            or _sites_problem(explainer, model, batch)
        if problem:
            result.status, result.detail = "failed", problem
    except _NotBuilt as error:
        result.status, result.detail = "not built", str(error)
    except Exception as error:
        message = f"{type(error).__name__}: {_first_line(error)}"
        named = architecture in str(error) and ("sites=" in str(error) or "forward_func" in str(error))
        result.status, result.detail = ("refused" if named else "failed"), message
        if not named:
            result.detail += " | " + traceback.format_exc(limit=-2).strip().splitlines()[-3].strip()
    result.seconds = time.perf_counter() - start
    return result


@contextlib.contextmanager
def _labels_seen(model: torch.nn.Module) -> Iterator[List[str]]:
    r"""Records the label keyword arguments of every call of ``model``."""
    from captum_diffmask.model.batches import LABEL_KEYS

    seen: List[str] = []

    def record(module: Any, args: Any, kwargs: Dict[str, Any]) -> None:
        seen.extend(key for key in kwargs if key in LABEL_KEYS and kwargs[key] is not None)

    handle = model.register_forward_pre_hook(record, with_kwargs=True)
    try:
        yield seen
    finally:
        handle.remove()


def _labels_problem(seen: Sequence[str]) -> str:
    return f"the model received {sorted(set(seen))}" if seen else ""


def _scores_problem(scores: torch.Tensor, batch: Dict[str, torch.Tensor], layers: int) -> str:
    ids, mask = batch["input_ids"], batch["attention_mask"]
    if scores.shape != (*ids.shape, layers + 1):
        return f"scores of shape {tuple(scores.shape)}, expected {(*ids.shape, layers + 1)}"
    if not bool(((scores >= 0) & (scores <= 1)).all()):
        return "scores outside [0, 1]"
    if not bool((scores[mask == 0] == 0).all()):
        return "padding scored above 0"
    return ""


def _sites_problem(explainer: Any, model: torch.nn.Module, batch: Dict[str, torch.Tensor]) -> str:
    r"""The sites against the model's own outputs, read here: ``input`` is the
    input embeddings' lookup of the ids, ``hidden.k`` the model's
    ``hidden_states[k]`` (an encoder-decoder's encoder states) for k < L, or
    ``hidden.{k + 1}`` is, for every k < L (models whose states start after
    the first block); the last state may be normalised."""
    from captum_diffmask.model.activations import first_tensor
    from captum_diffmask.model.site_check import own_hidden_states

    locator = explainer.locator
    # padded as the library pads for a model that pads to its window itself
    # (Longformer, LED: their own padding would run the embeddings twice)
    ids, (mask,) = explainer.model_forward.padded_to_window(batch["input_ids"], (batch["attention_mask"],))
    with torch.no_grad(), cache_off(model), locator.capture() as states:
        output = model(input_ids=ids, attention_mask=mask, output_hidden_states=True)
    own = own_hidden_states(model, output, ids, {"attention_mask": mask})
    if own is None:
        return "the model returns no hidden_states to check the sites against"
    if len(own) != locator.num_layers + 1:
        return f"{locator.num_layers + 1} hidden sites, the model returns {len(own)} hidden_states"
    with torch.no_grad():
        tables = model.get_input_embeddings()
        # one table per codebook, summed (MusicGen): the zoo builds one codebook
        table = tables[0] if isinstance(tables, torch.nn.ModuleList) and len(tables) == 1 else tables
        lookup = first_tensor(table(ids))
    if states["input"].shape != lookup.shape or not torch.allclose(states["input"].float(), lookup.float(), atol=1e-5):
        return "the input site is not the input embeddings' lookup of the ids"
    real = mask.bool()
    problems = [_hidden_problem(states, own, real, offset) for offset in (0, 1)]
    return "" if "" in problems else problems[0]


def _hidden_problem(states: Dict[str, torch.Tensor], own: Sequence[torch.Tensor], real: torch.Tensor,
                    offset: int) -> str:
    r"""Where ``hidden.{k + offset}`` differs from ``hidden_states[k]`` (offset 1:
    models whose hidden_states start after the first block, as Mamba's), k < L."""
    for k, reference in enumerate(own[:-1]):
        state, reference = states[f"hidden.{k + offset}"], _streams_side_by_side(reference, tuple(real.shape))
        if state.shape != reference.shape:
            return f"hidden.{k + offset} has shape {tuple(state.shape)}, hidden_states[{k}] {tuple(reference.shape)}"
        if not torch.allclose(state[real].float(), reference[real].float(), atol=1e-4, rtol=1e-3):
            return f"hidden.{k + offset} is not hidden_states[{k}]"
    return ""


def _streams_side_by_side(state: torch.Tensor, batch_tokens: Tuple[int, int]) -> torch.Tensor:
    r"""A state of several residual streams, (B, T, S, H) or (S, B, T, H), as
    the library shows it: (B, T, S * H); any other state as it is."""
    if state.dim() == 4 and tuple(state.shape[:2]) == batch_tokens:
        return state.flatten(2)
    if state.dim() == 4 and tuple(state.shape[1:3]) == batch_tokens:
        return state.permute(1, 2, 0, 3).flatten(2)
    return state


def run_zoo(tasks: Sequence[str] = tuple(MAPPINGS), processes: int = 2, timeout: float = 30.0,
            verbose: bool = True) -> List[ZooResult]:
    r"""
    Every architecture of ``tasks``, checked in ``processes`` spawned worker
    processes (one torch thread each), in the mappings' order.

    Args:

        tasks (sequence of str, optional): keys of :data:`MAPPINGS`. Default: all
        processes (int, optional): worker processes. Default: 2
        timeout (float, optional): seconds building one architecture may take
                    (then ``not built``), and again the library's check once it
                    is built, or :data:`LIBRARY_PASSES` of its forward passes
                    when longer (then ``failed``); its worker is then stopped.
                    Default: 30
        verbose (bool, optional): a line per architecture. Default: True

    Returns:
        *list* of :class:`ZooResult`, one per architecture.
    """
    jobs = [(task, model_type, name) for task in tasks for model_type, name in architectures(task)]
    results: Dict[int, ZooResult] = {}
    pending = list(enumerate(jobs))[::-1]
    workers = [_Worker() for _ in range(max(1, processes))]
    try:
        while pending or any(w.job is not None for w in workers):
            for worker in workers:
                if worker.job is None and pending:
                    worker.start(*pending.pop())
            for worker in workers:
                done = worker.poll(timeout)
                if done is not None:
                    results[done[0]] = done[1]
                    if verbose:
                        _print(done[1])
    finally:
        for worker in workers:
            worker.close()
    return [results[i] for i in range(len(jobs))]


def _print(result: ZooResult) -> None:
    print(f"{result.task:18} {result.architecture:48} {result.status:9} {result.rung:13} {result.seconds:5.1f}s "
          f"{result.detail}", flush=True)


class _Worker:
    r"""A spawned process that checks one architecture at a time; stopped and
    replaced when one takes longer than the timeout."""

    def __init__(self) -> None:
        context = multiprocessing.get_context("spawn")  # fork can deadlock in OpenMP
        self._connection, child = context.Pipe()
        self._process = context.Process(target=_serve, args=(child,), daemon=True)
        self._process.start()
        self.job: Optional[Tuple[int, Tuple[str, str, str]]] = None
        self._since, self._built, self._budget = 0.0, False, 0.0

    def start(self, index: int, job: Tuple[str, str, str]) -> None:
        self.job, self._since, self._built, self._budget = (index, job), time.perf_counter(), False, 0.0
        self._connection.send(job)

    def poll(self, timeout: float) -> Optional[Tuple[int, ZooResult]]:
        r"""The finished job's index and result, a ``failed`` result when it ran
        out of time or its process died, or None while it runs."""
        if self.job is None:
            return None
        index, job = self.job
        while self._connection.poll(0.05):
            try:
                message = self._connection.recv()
            except EOFError:
                message = ZooResult(*job, "failed", f"the worker process died (exit code {self._process.exitcode})")
                self._restart()
            if isinstance(message, tuple) and message[0] == _BUILT:
                self._built, self._since = True, time.perf_counter()
                self._budget = max(timeout, LIBRARY_PASSES * message[1])
                continue
            self.job = None
            return index, message
        budget = self._budget if self._built else timeout
        if time.perf_counter() - self._since > budget or not self._process.is_alive():
            # a model that takes this long to build is the rule's gap; once
            # built, the time is the library's
            status, where = ("failed", "DiffMask gave") if self._built else ("not built", "building gave")
            self._restart()
            self.job = None
            return index, ZooResult(*job, status, f"{where} no result within {budget:.0f} s", seconds=budget)
        return None

    def _restart(self) -> None:
        self.close()
        self.__init__()  # type: ignore[misc]

    def close(self) -> None:
        if self._process.is_alive():
            self._process.kill()
        self._process.join()


def _serve(connection: Any) -> None:
    torch.set_num_threads(1)
    while True:
        try:
            job = connection.recv()
        except EOFError:
            return
        connection.send(check_architecture(*job, on_built=lambda seconds: connection.send((_BUILT, seconds))))


#: what a worker sends, with a forward pass's seconds, once the model is built
_BUILT = "built"


STATUSES = ("works", "refused", "failed", "not built")


def counts(results: Sequence[ZooResult]) -> Dict[str, int]:
    r"""How many results have each status of :data:`STATUSES`."""
    return {status: sum(r.status == status for r in results) for status in STATUSES}


def summary(results: Sequence[ZooResult]) -> str:
    r"""One line per task and one for all: the counts and the share that works,
    of all architectures and of those built."""
    lines = []
    for task in list(MAPPINGS) + ["all"]:
        rows = [r for r in results if task in (r.task, "all")]
        if not rows:
            continue
        n = counts(rows)
        built = len(rows) - n["not built"]
        lines.append(f"| {task} | {len(rows)} | {n['works']} | {n['refused']} | {n['failed']} | {n['not built']} | "
                     f"{100 * n['works'] / len(rows):.1f} % | {100 * n['works'] / max(built, 1):.1f} % |")
    return "\n".join(["| task | architectures | works | refused | failed | not built | works, of all | works, of built |",
                      "|---|---|---|---|---|---|---|---|"] + lines)


def coverage_report(results: Sequence[ZooResult]) -> str:
    r"""The markdown page: the summary, every architecture that does not work
    with its reason, the rungs used, and the list of those that work."""
    rest = [r for r in results if r.status != "works"]
    rungs = {rung: sum(r.rung == rung for r in results if r.status == "works") for rung in RUNGS}
    works = sorted({r.architecture for r in results if r.status == "works"})
    return "\n".join([
        "# DiffMask on every architecture of transformers' auto-mappings",
        "",
        "Command: `python -m benchmarks study model-zoo --markdown docs/results/model-zoo.md`; the same run is the test "
        "`tests/harness/test_every_architecture.py`. transformers " + hf.__version__ + ", torch " + torch.__version__ + ".",
        "",
        "Each architecture of the sequence-classification, causal-LM and question-answering mappings is built from its "
        "config class with one shrinking rule for every family (`benchmarks/studies/model_zoo.py`: no list of models), then "
        "DiffMask (hidden mode, no `sites=`, no `forward_func`) fits one step on a padded, labelled batch and "
        "attributes every layer. **works**: the sites equal the model's own hidden states (checked by the zoo, apart "
        "from the library's self-check), the scores are (B, T, L + 1) in [0, 1] with 0 on padding, the labels never "
        "reached the model. **refused**: an error that names the architecture and says what to pass. **failed**: "
        "anything else. **not built**: the shrinking rule gives no tiny model that runs a plain forward pass (the "
        "rule's gap, a dependency this machine lacks, inputs besides token ids, or a default config that transformers "
        "itself cannot build, which the row then says), so the library is not tried.",
        "",
        summary(results),
        "",
        "Rungs of the shrinking rule the working architectures needed: "
        + ", ".join(f"{rung} {n}" for rung, n in rungs.items()) + ".",
        "",
        "## Every architecture that does not work",
        "",
        "| task | architecture | status | reason |",
        "|---|---|---|---|",
    ] + [f"| {r.task} | {r.architecture} | {r.status} | {r.detail.replace('|', '/')[:300]} |" for r in rest] + [
        "",
        f"## The {len(works)} architectures that work",
        "",
        ", ".join(works),
        "",
    ])


def main(argv: Optional[Sequence[str]] = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", nargs="+", default=list(MAPPINGS), choices=list(MAPPINGS))
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--json", help="write every result as JSON here")
    parser.add_argument("--markdown", help="write the coverage report here")
    args = parser.parse_args(argv)
    results = run_zoo(args.tasks, args.processes)
    if args.json:
        with open(args.json, "w") as handle:
            json.dump([asdict(r) for r in results], handle, indent=1)
    if args.markdown:
        with open(args.markdown, "w") as handle:
            handle.write(coverage_report(results))
    print(summary(results))


if __name__ == "__main__":
    main()
