r"""Our ERASER metrics (comprehensiveness, sufficiency, AOPC) held against
ferret's implementation of the same definitions, and our Integrated Gradients
against inseq's, on the same models, inputs and targets.

ferret-xai 0.4.2 pins captum 0.7 and transformers 4.x, below this project's, so
its side runs in a virtual environment of its own (built here on first use,
with the CPU build of torch) and reads what our side saves: a config-built tiny
BERT classifier, its vocabulary, ten-word sentences, Integrated Gradients scores
and the predicted classes (``inputs.json``). Ours: :func:`eraser_scores` with the
special tokens never removed (ERASER's and ferret's ``remove_first_last``), at
ferret's fractions 0.1, 0.2, .., 1.0.

The definitions line up where the removal does: ferret's ``remove_tokens=False``
puts [MASK]'s id in place of each removed token, ours (``removal="baseline"``
with [MASK]'s id) puts [MASK]'s word embedding at the input site: the same
input. They differ where ferret deletes the tokens (its default): the sentence
closes up and the later words move to earlier positions, while ours
(``removal="attention"``) keeps every position and hides the removed tokens
from attention. The check pins that difference: on a copy of the model whose
position embeddings are zero the two are the same computation and must agree.
On ten-word sentences ferret's count of tokens (``int(f * n)``) and ours
(``ceil(f * n)``, at least one) coincide at every fraction, and no fraction
repeats a set (which ferret would skip); both are checked, not assumed.

Command: ``python -m benchmarks study peer-agreement --markdown docs/results/peer-agreement.md``
(the first run builds the environment: a few minutes).
"""

from __future__ import annotations

import argparse
import copy
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Dict, List, Sequence, Tuple

import numpy as np
import torch
from transformers import (
    BertConfig, BertForSequenceClassification, BertTokenizerFast, GPT2Config, GPT2LMHeadModel, GPT2TokenizerFast,
)

from benchmarks.methods import AUTHORS_OPTIONS
from benchmarks.records import cache_dir
from captum_diffmask.evaluation.faithfulness import eraser_scores, TokenEraser, top_fraction
from captum_diffmask.methods import IntegratedGradients

#: The question this study answers (``python -m benchmarks list``).
QUESTION = "our ERASER metrics against ferret's and our Integrated Gradients against inseq's, on the same inputs"

#: What the peer environment installs: torch's CPU build first (else pip pulls a CUDA
#: build); pyarrow below 18, whose newer builds refuse the numpy 1.x that ferret pins.
PEER_PACKAGES = ("torch==2.13.0", "ferret-xai==0.4.2", "inseq==0.7.1", "pyarrow<18")
#: ferret's default fractions, the same floats (``np.arange(0.1, 1.1, 0.1)``).
FRACTIONS = [float(f) for f in np.arange(0.1, 1.1, 0.1)]
#: The largest difference allowed where the definitions agree: float32 forward
#: passes of two transformers versions on the same weights.
TOLERANCE = 1e-5
WORDS = ("good bad movie plot actor scene story great awful boring funny sad long short fine dull "
         "bright dark slow fast warm cold loud quiet new old true false happy angry kind cruel").split()
VOCAB = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *WORDS]


def _peer_python(venv: Path) -> Path:
    r"""The peer environment's python, built with :data:`PEER_PACKAGES` when missing."""
    python = venv / "bin" / "python"
    if not python.exists():
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        subprocess.run([str(venv / "bin" / "pip"), "install", "-q", *PEER_PACKAGES], check=True)
    return python


def build_model(seed: int) -> Tuple[BertForSequenceClassification, BertTokenizerFast]:
    r"""The config-built tiny BERT classifier (3 classes) and its word-level tokenizer."""
    torch.manual_seed(seed)
    config = BertConfig(vocab_size=len(VOCAB), hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=37, num_labels=3, max_position_embeddings=32,
                        initializer_range=0.5)  # weights large enough that the output is not flat
    model = BertForSequenceClassification(config).eval()
    tokenizer = BertTokenizerFast(vocab={w: i for i, w in enumerate(VOCAB)}, do_lower_case=True)
    return model, tokenizer


def sentences_of_ten_words(count: int, seed: int) -> List[str]:
    r"""``count`` sentences of ten words of :data:`WORDS`, drawn with ``seed``."""
    generator = torch.Generator().manual_seed(seed)
    picks = torch.randint(len(WORDS), (count, 10), generator=generator)
    return [" ".join(WORDS[i] for i in row) for row in picks.tolist()]


def our_side(model: BertForSequenceClassification, tokenizer: BertTokenizerFast, texts: Sequence[str]) -> Dict[str, Any]:
    r"""Scores, targets and our metrics, both removals, per sentence and fraction."""
    batch = tokenizer(list(texts), return_tensors="pt")
    ids, mask = batch["input_ids"], batch["attention_mask"]
    extra = (mask, batch["token_type_ids"])
    ig = IntegratedGradients(model, **AUTHORS_OPTIONS["IntegratedGradients"])
    scores = ig.attribute(ids, additional_forward_args=extra, layer=0, n_steps=20)
    with torch.no_grad():
        targets = model(input_ids=ids, attention_mask=mask, token_type_ids=batch["token_type_ids"]).logits.argmax(-1)
    words = mask.bool() & (ids != tokenizer.cls_token_id) & (ids != tokenizer.sep_token_id)
    counts = [int(top_fraction(scores, words, f)[0].sum()) for f in FRACTIONS]
    ours = {"counts": counts}
    for removal, eraser in (("mask", TokenEraser(model, "baseline", baseline=tokenizer.mask_token_id)),
                            ("delete", TokenEraser(model, "attention"))):
        result = eraser_scores(eraser, ids, scores, extra, fractions=FRACTIONS, target=targets, candidates=words)
        ours[removal] = {key: result[key].tolist() for key in
                         ("comprehensiveness", "sufficiency", "aopc_comprehensiveness", "aopc_sufficiency")}
    return {"texts": list(texts), "tokens": [tokenizer.convert_ids_to_tokens(row) for row in ids.tolist()],
            "scores": scores.tolist(), "targets": targets.tolist(), "ours": ours}


def without_positions(model: BertForSequenceClassification) -> BertForSequenceClassification:
    r"""A copy whose position embeddings are zero: deleting a token and hiding it
    from attention are then the same computation."""
    copied = copy.deepcopy(model)
    with torch.no_grad():
        copied.bert.embeddings.position_embeddings.weight.zero_()
    return copied


def _largest(ours: Dict[str, Any], theirs: List[Dict[str, Any]], removal: str, metric: str) -> Tuple[float, float]:
    r"""The largest per-fraction and AOPC differences of one metric."""
    per_fraction = max(abs(a - b) for row, peer in zip(ours[removal][metric], theirs)
                       for a, b in zip(row, peer[f"{metric}_{removal}"]["per_fraction"]))
    aopc = max(abs(a - peer[f"{metric}_{removal}"]["aopc"])
               for a, peer in zip(ours[removal][f"aopc_{metric}"], theirs))
    return per_fraction, aopc


#: Integrated Gradients steps of the inseq check (Captum's Gauss-Legendre rule on both sides).
IG_STEPS = 20


def build_language_model(folder: Path, seed: int) -> Tuple[GPT2LMHeadModel, GPT2TokenizerFast]:
    r"""A config-built tiny GPT-2 and a byte-level BPE tokenizer trained on
    :data:`WORDS`, its files written to ``folder`` (inseq's side reads them)."""
    from tokenizers import ByteLevelBPETokenizer

    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator([" ".join(WORDS)] * 5 + [" " + w for w in WORDS] * 5, vocab_size=300, min_frequency=1,
                            special_tokens=["<|endoftext|>"], show_progress=False)
    bpe.save_model(str(folder))
    vocab = json.loads((folder / "vocab.json").read_text())
    merges = [tuple(line.split()) for line in (folder / "merges.txt").read_text().splitlines()[1:] if line.strip()]
    tokenizer = GPT2TokenizerFast(vocab=vocab, merges=merges)  # transformers 5 takes them, not their files
    torch.manual_seed(seed)
    config = GPT2Config(vocab_size=len(tokenizer), n_embd=32, n_layer=2, n_head=2, n_positions=32,
                        initializer_range=0.5)
    return GPT2LMHeadModel(config).eval(), tokenizer


def _next_tokens(model: GPT2LMHeadModel, tokenizer: GPT2TokenizerFast, prompts: Sequence[str]) -> List[int]:
    r"""Per prompt the most likely next token whose text appended to the prompt
    tokenises back to the prompt's ids and that token (inseq re-tokenises)."""
    chosen = []
    for prompt in prompts:
        ids = tokenizer(prompt, return_tensors="pt")["input_ids"]
        with torch.no_grad():
            ranked = model(ids).logits[0, -1].argsort(descending=True).tolist()
        chosen.append(next(t for t in ranked
                           if tokenizer(prompt + tokenizer.decode([t]))["input_ids"] == ids[0].tolist() + [t]))
    return chosen


def inseq_side_inputs(folder: Path, seed: int, prompts: int) -> Dict[str, Any]:
    r"""Saves the GPT-2 and the prompts for inseq's side; returns our
    integrated gradients (sum and L2 over H) of each next token's logit."""
    model, tokenizer = build_language_model(folder, seed)
    model.save_pretrained(folder / "gpt2")
    texts = [" ".join(s.split()[:6]) for s in sentences_of_ten_words(prompts, seed + 1)]
    nexts = _next_tokens(model, tokenizer, texts)
    baseline = model.transformer.wte.weight[tokenizer.unk_token_id].detach()  # inseq's baseline: the unknown token
    ours: Dict[str, List[List[float]]] = {"sum": [], "l2": []}
    tokens = []
    for text, target in zip(texts, nexts):
        ids = tokenizer(text, return_tensors="pt")["input_ids"]
        tokens.append(ids[0].tolist() + [target])
        for reduction in ours:
            ig = IntegratedGradients(model, output="last", reduction=reduction, n_steps=IG_STEPS, method="gausslegendre")
            scores = ig.attribute(ids, target=target, additional_forward_args=(torch.ones_like(ids),), layer=0,
                                  baselines=baseline)
            ours[reduction].append(scores[0].tolist())
    generated = [text + tokenizer.decode([t]) for text, t in zip(texts, nexts)]
    (folder / "inseq.json").write_text(json.dumps({"model_dir": "gpt2", "prompts": texts, "generated": generated,
                                                   "n_steps": IG_STEPS}))
    return {"ours": ours, "tokens": tokens}


def _inseq_rows(ours: Dict[str, Any], theirs: Dict[str, Any]) -> List[Dict[str, Any]]:
    rows = []
    for reduction in ("sum", "l2"):
        mine, peer = ours["ours"][reduction], [row[reduction] for row in theirs["rows"]]
        rows.append({"reduction": reduction,
                     "same_tokens": ours["tokens"] == [row["tokens"] for row in theirs["rows"]],
                     "difference": max(abs(a - b) for x, y in zip(mine, peer) for a, b in zip(x, y)),
                     "largest_value": max(abs(a) for x in mine for a in x)})
    return rows


def run(venv: Path, sentences: int = 8, seed: int = 0) -> Dict[str, Any]:
    r"""Both sides on the same saved model and inputs; the differences per check."""
    python = _peer_python(venv)
    model, tokenizer = build_model(seed)
    cases = {"bert": model, "bert, position embeddings zero": without_positions(model)}
    texts = sentences_of_ten_words(sentences, seed)
    started = time.time()
    with tempfile.TemporaryDirectory() as folder:
        root = Path(folder)
        (root / "vocab.txt").write_text("\n".join(VOCAB) + "\n")
        saved = {}
        for index, (name, case) in enumerate(cases.items()):
            case.save_pretrained(root / f"model-{index}")
            saved[name] = {"model_dir": f"model-{index}", **our_side(case, tokenizer, texts)}
        (root / "inputs.json").write_text(json.dumps({"fractions": FRACTIONS, "cases": saved}))
        language = inseq_side_inputs(root, seed, prompts=4)
        for side in ("peer_ferret.py", "peer_inseq.py"):
            subprocess.run([str(python), str(Path(__file__).with_name(side)), str(root)], check=True)
        theirs = json.loads((root / "theirs.json").read_text())
        inseq_theirs = json.loads((root / "inseq-theirs.json").read_text())
    rows = []
    for name, case in saved.items():
        peer = theirs["cases"][name]
        for removal in ("mask", "delete"):
            for metric in ("comprehensiveness", "sufficiency"):
                per_fraction, aopc = _largest(case["ours"], peer, removal, metric)
                size = max(abs(v) for row in case["ours"][removal][metric] for v in row)
                rows.append({"model": name, "removal": removal, "metric": metric,
                             "per_fraction": per_fraction, "aopc": aopc, "largest_value": size})
    counts = saved["bert"]["ours"]["counts"]
    return {"rows": rows, "versions": theirs["versions"], "inseq_rows": _inseq_rows(language, inseq_theirs),
            "inseq_versions": inseq_theirs["versions"], "counts": counts, "ferret_counts":
            [int(f * 10) for f in FRACTIONS], "sentences": sentences, "seconds": time.time() - started,
            "tolerance": TOLERANCE}


def verdict(row: Dict[str, Any], tolerance: float) -> str:
    r"""Agrees within ``tolerance``; the documented difference named as such."""
    within = max(row["per_fraction"], row["aopc"]) <= tolerance
    if row["removal"] == "delete" and row["model"] == "bert":
        # the documented difference: deletion moves the later words' positions
        return "differs, as documented" if not within else "**agrees, though documented to differ**"
    return "agrees" if within else "**disagrees**"


def markdown(result: Dict[str, Any], command: str) -> str:
    r"""The report: one row per model, removal and metric."""
    versions = ", ".join(f"{k} {v}" for k, v in result["versions"].items())
    lines = [
        "# Our metrics and Integrated Gradients against ferret's and inseq's", "",
        "## ERASER's metrics against ferret's", "",
        f"Command: `{command}` ({result['seconds']:.0f} s, the peer environment already built). "
        f"ferret's side: {versions}, in its own virtual environment; ours: this repository. "
        f"{result['sentences']} ten-word sentences on a config-built tiny BERT classifier (3 classes), "
        "Integrated Gradients scores (20 steps, |sum over H|), the predicted class as the target, "
        "ferret's fractions 0.1 .. 1.0; [CLS] and [SEP] never removed.", "",
        f"Tokens removed per fraction: ours {result['counts']}, ferret's {result['ferret_counts']}.", "",
        "| model | removal (ours / ferret's) | metric | largest value (ours) | largest difference per fraction "
        f"| largest AOPC difference | verdict (tolerance {result['tolerance']:g}) |",
        "|---|---|---|---|---|---|---|",
    ]
    names = {"mask": "[MASK]'s embedding / [MASK]'s id (`remove_tokens=False`)",
             "delete": "hidden from attention / deleted (`remove_tokens=True`, ferret's default)"}
    for row in result["rows"]:
        lines.append(f"| {row['model']} | {names[row['removal']]} | {row['metric']} | {row['largest_value']:.3f} "
                     f"| {row['per_fraction']:.2e} "
                     f"| {row['aopc']:.2e} | {verdict(row, result['tolerance'])} |")
    lines += ["", "## Integrated Gradients against inseq's", "",
              "inseq's side: " + ", ".join(f"{k} {v}" for k, v in result["inseq_versions"].items()) + ". "
              "A config-built tiny GPT-2 with a byte-level BPE tokenizer, four six-word prompts, the logit of "
              "each prompt's most likely next token (inseq's `attributed_fn=\"logit\"`), attributed to the prompt "
              f"tokens' embeddings: {IG_STEPS} points of Captum's Gauss-Legendre rule, inseq's baseline (the "
              "unknown token's embedding at every position) given to ours as `baselines`.", "",
              f"| per-token reduction over H | same tokens | largest value (ours) | largest difference "
              f"| verdict (relative tolerance {result['tolerance']:g}) |", "|---|---|---|---|---|"]
    for row in result["inseq_rows"]:
        agrees = row["same_tokens"] and row["difference"] <= result["tolerance"] * max(row["largest_value"], 1.0)
        lines.append(f"| {row['reduction']} | {'yes' if row['same_tokens'] else '**no**'} | {row['largest_value']:.3f} "
                     f"| {row['difference']:.2e} | {'agrees' if agrees else '**disagrees**'} |")
    lines += ["", "## Deletion", "", "Deleting a token closes the sentence up: every later word moves one position earlier, "
              "so a model with position embeddings reads other inputs than ours, which hides the token "
              "from attention and keeps every position. With the position embeddings zeroed the two "
              "removals are one computation, and the numbers agree.", ""]
    return "\n".join(lines)


def main(argv: Sequence[str] = ()) -> Dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--venv", type=Path, default=cache_dir() / "peer-ferret-venv",
                        help="the peer environment (built when missing)")
    parser.add_argument("--sentences", type=int, default=8)
    parser.add_argument("--markdown", type=Path, default=None, help="write the report here")
    args = parser.parse_args(list(argv))
    result = run(args.venv, args.sentences)
    command = "python -m benchmarks study peer-agreement" + (f" --markdown {args.markdown}" if args.markdown else "")
    text = markdown(result, command)
    if args.markdown:
        args.markdown.write_text(text)
    print(text)
    return result


if __name__ == "__main__":
    main(sys.argv[1:])
