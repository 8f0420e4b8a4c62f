r"""inseq's side of the agreement check (:mod:`benchmarks.studies.peer_agreement`).

Runs in the peer environment (inseq 0.7.1 pins captum 0.7 and transformers 4.x),
imports nothing from this repository, and reads what our side saved in a folder:
a GPT-2 (``save_pretrained``), its byte-level BPE files, and ``inseq.json``
(prompts, the prompt and its next token as inseq's generated text,
the number of steps). It writes
``inseq-theirs.json``: per prompt, the token ids inseq attributed over and its
integrated gradients of the next token's logit with respect to each prompt
token's embedding, summed over H and as the L2 norm over H.

Usage: ``PEER_PYTHON benchmarks/studies/peer_inseq.py FOLDER``.
"""

from __future__ import annotations

import json
import sys
from importlib import metadata
from pathlib import Path
from typing import Any, Dict


def main(folder: Path) -> None:
    import inseq
    import torch
    from transformers import GPT2LMHeadModel, GPT2TokenizerFast

    torch.set_num_threads(1)
    inputs = json.loads((folder / "inseq.json").read_text())
    tokenizer = GPT2TokenizerFast(vocab_file=str(folder / "vocab.json"), merges_file=str(folder / "merges.txt"))
    model = GPT2LMHeadModel.from_pretrained(folder / inputs["model_dir"]).eval()
    attribution_model = inseq.load_model(model, "integrated_gradients", tokenizer=tokenizer)
    rows = []
    for prompt, generated in zip(inputs["prompts"], inputs["generated"]):
        # Captum's default quadrature (Gauss-Legendre); inseq's ``method`` names the attribution method
        out = attribution_model.attribute(prompt, generated, n_steps=inputs["n_steps"], attributed_fn="logit",
                                          show_progress=False)
        attributed = out.sequence_attributions[0]
        per_dim = attributed.target_attributions[:-1, 0]  # (T, H): the prompt's tokens, the one generated step
        rows.append({"tokens": [token.id for token in attributed.target],
                     "sum": per_dim.sum(-1).tolist(), "l2": per_dim.norm(dim=-1).tolist()})
    results: Dict[str, Any] = {"rows": rows,
                               "versions": {name: metadata.version(name) for name in ("inseq", "captum", "transformers")}}
    (folder / "inseq-theirs.json").write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
