"""The SQuAD suite's data and model: the split by article, and the QA MiniLM
fine-tuned on the training articles (cached like the SST model)."""

from __future__ import annotations

import time
from typing import Any, Callable, Dict, List, Mapping, Optional, Tuple

from torch import nn

from ...progress import log
from ...runner import cached
from ...tasks.sst import default_data_dir
from ...tasks.squad import encode_squad, read_squad, split_by_article, SquadExample
from ...tasks.squad_qa import evaluate_qa, fine_tune_qa, load_minilm_qa

#: Where SQuAD v1.1 dev is looked for when ``data.path`` is None: ``../shared/data`` beside the checkout.
DEFAULT_PATH = default_data_dir() / "squad" / "dev-v1.1.json"


def load_squad_split(config: Mapping[str, Any]) -> Tuple[List[SquadExample], List[SquadExample]]:
    r"""(fine-tuning, held-out) questions of ``config["data"]``: SQuAD v1.1 dev
    split by article."""
    data = config["data"]
    examples = read_squad(data.get("path") or DEFAULT_PATH)
    return split_by_article(examples, float(data["held_out"]), int(data["split_seed"]))


def load_qa_model(
    config: Mapping[str, Any], train: List[SquadExample], held_out: List[SquadExample], verbose: bool,
    factory: Optional[Callable[[], Tuple[nn.Module, Any]]] = None,
) -> Tuple[nn.Module, Any, Dict[str, Any]]:
    r"""
    The QA model: from the cache when this configuration and these questions
    were fine-tuned before, else fine-tuned on ``train`` (:func:`fine_tune_qa`)
    and scored on ``held_out`` (official EM / F1).

    Args:

        config (dict): :data:`DEFAULTS`-shaped; ``model`` holds the windows and
                    the fine-tuning options.
        train, held_out (list of SquadExample): the two sides of the split.
        verbose (bool): progress bars and one line per epoch.
        factory (callable, optional): ``() -> (model, fast tokenizer)`` with an
                    untrained span head; MiniLM (:func:`load_minilm_qa`) when None.

    Returns:
        *tuple* ``(model, tokenizer, info)``; ``info`` has ``cached``,
        ``history``, ``fine_tune_seconds``, ``windows`` (training windows) and
        ``held_out`` (``exact_match``, ``f1``, ``count``).
    """
    options = dict(config["model"])
    model, tokenizer = (factory or (lambda: load_minilm_qa(int(options["seed"]))))()
    key = {"options": options, "train": [e.id for e in train], "held_out": [e.id for e in held_out],
           "signature": sum(p.numel() for p in model.parameters())}
    length, stride = int(options["max_length"]), int(options["doc_stride"])

    def build() -> Dict[str, Any]:
        windows = encode_squad(train, tokenizer, length, stride)
        start = time.perf_counter()
        history = fine_tune_qa(model, windows, epochs=int(options["epochs"]), lr=float(options["lr"]),
                               batch_size=int(options["batch_size"]), warmup=float(options["warmup"]),
                               seed=int(options["seed"]), max_steps=options.get("max_steps"), verbose=verbose,
                               log=lambda line: log(verbose, f"[squad] {line}"))
        seconds = time.perf_counter() - start
        scores = evaluate_qa(model, held_out, encode_squad(held_out, tokenizer, length, stride))
        return {"state_dict": model.state_dict(), "history": history, "seconds": seconds, "windows": len(windows),
                "held_out": scores}

    payload, hit = cached("squad-qa", key, build, use_cache=bool(config.get("cache", True)))
    if hit:
        model.load_state_dict(payload["state_dict"])
    model.eval()
    info = {"cached": hit, "history": payload["history"], "fine_tune_seconds": payload["seconds"],
            "windows": payload["windows"], "held_out": payload["held_out"]}
    how = "cached" if hit else f"fine-tuned in {info['fine_tune_seconds']:.0f} s"
    log(verbose, f"[squad] held-out EM {info['held_out']['exact_match']:.2f}, F1 {info['held_out']['f1']:.2f} ({how})")
    return model, tokenizer, info
