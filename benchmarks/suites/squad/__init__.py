"""The SQuAD suite (the paper's Section 6.2), being built (issue 21): so far the
question-answering model it analyses, a MiniLM fine-tuned on SQuAD v1.1 dev split
by article (:mod:`.loading`, settings in :mod:`.settings`). Not yet registered
with ``python -m benchmarks run``."""

from .loading import load_qa_model, load_squad_split
from .settings import DEFAULTS

__all__ = ["DEFAULTS", "load_qa_model", "load_squad_split"]
