"""SST-5 with a fine-tuned BERT-family classifier: the data and model layer of the
``sst`` benchmark (De Cao et al. 2020, Section 6.1 and the sentiment appendix,
with all-MiniLM-L6-v2 in place of BERT-base).

- Models: :func:`load_minilm` (the 6-layer MiniLM of the ``sst`` extra with a new
  5-way head) and :func:`tiny_bert` (a config-built 2-layer BERT and a small
  WordPiece vocabulary, for tests and quick runs). Both use eager attention, so
  that ``output_attentions=True`` returns the attention weights.
- Data: :func:`encode_sst` turns :class:`~benchmarks.tasks.sst.SSTSentence`
  objects (from :func:`~benchmarks.tasks.sst.read_sst`) into an
  :class:`EncodedSST`: word-piece ids, attention mask, labels and the word each
  token belongs to (``word_index``), with length-bucketed batches that cut padding.
- Words: :func:`word_pooling` turns token scores into word scores;
  :func:`pos_tags` gives every SST word its universal part of speech (the ``pos``
  extra), :func:`character_pos_tags` every character of free text.
- Training and scoring: :func:`fine_tune` (AdamW, linear warm-up and decay, the
  last of a fixed number of epochs kept), :func:`evaluate`, :func:`macro_f1`, :func:`class_f1`.


One module per concern (``models``, ``encoding``, ``words``, ``scoring``,
``training``, ``pos``); every public name is here too. The attention baseline
of the paper's per-layer figures is a method of the library
(:class:`captum_diffmask.methods.AttentionWeights`).

Caching a fine-tuned model is left to the caller (``benchmarks.records.cached``):
:func:`fine_tune` is deterministic given its seed (on the same machine and
thread count) and the model's ``state_dict()`` plus the returned history are what
to store.
"""

from benchmarks.tasks.sst_bert.models import SST_EXTRA_HINT, load_minilm, load_minilm_as, keep_first_layers, tiny_bert
from benchmarks.tasks.sst_bert.encoding import EncodedSST, EncodedBatches, encode_sst
from benchmarks.tasks.sst_bert.words import word_pooling
from benchmarks.tasks.sst_bert.scoring import class_f1, macro_f1, evaluate, output_logits
from benchmarks.tasks.sst_bert.training import fine_tune, bert_adamw, warmup_then_decay
from benchmarks.tasks.sst_bert.pos import POS_EXTRA_HINT, spacy_pipeline, pos_tags, character_pos_tags

__all__ = [
    "SST_EXTRA_HINT",
    "load_minilm",
    "load_minilm_as",
    "keep_first_layers",
    "tiny_bert",
    "EncodedSST",
    "EncodedBatches",
    "encode_sst",
    "word_pooling",
    "class_f1",
    "macro_f1",
    "evaluate",
    "output_logits",
    "fine_tune",
    "bert_adamw",
    "warmup_then_decay",
    "POS_EXTRA_HINT",
    "spacy_pipeline",
    "pos_tags",
    "character_pos_tags",
]
