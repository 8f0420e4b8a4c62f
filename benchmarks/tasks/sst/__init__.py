"""The Stanford Sentiment Treebank (Socher et al., EMNLP 2013) and the GRU
sentiment classifier of De Cao et al. (2020), Section 5 (erasure comparison).

- Reading: :func:`parse_tree` turns one line of the PTB-tree files
  (``train.txt``, ``dev.txt``, ``test.txt`` of Stanford's
  ``trainDevTestTrees_PTB.zip``) into an :class:`SSTSentence`: the words, the
  sentence (root) label in 0..4 and each word's own (leaf) label.
  :func:`read_sst` reads a split from the data directory
  (:func:`resolve_data_dir`).
- Words are tokens: a :class:`Vocabulary` built from the training sentences maps
  them to ids, and an embedding table gives each word a vector. The vectors come
  from a pluggable *word-vector source*, a function ``words -> (len(words), H)``
  tensor: :func:`minilm_word_vectors` (the MiniLM word-piece embeddings, one word
  = the **mean of its word pieces**; needs the ``sst`` extra) or
  :func:`random_word_vectors` (deterministic random vectors, for tests).
- The model: :class:`SSTClassifier`, a single-layer GRU over the frozen word
  embeddings, classifying the sentence into 5 classes from its last state;
  :func:`train_sst_classifier` trains it on train and keeps the epoch that scores
  best on dev. :func:`sst_sites` gives the sites the library attributes to.

One module per concern (``reading``, ``vocabulary``, ``word_vectors``,
``encoding``, ``classifier``); every public name is here too.
"""

from benchmarks.tasks.sst.reading import (
    SST_URL, SPLITS, LABEL_NAMES, DATA_ENV, SSTSentence, SSTDataError, parse_tree, parse_phrases, default_data_dir,
    resolve_data_dir, read_sst,
)
from benchmarks.tasks.sst.vocabulary import Vocabulary
from benchmarks.tasks.sst.word_vectors import (
    WordVectors, unescape_ptb, MINILM_EXTRA_HINT, minilm_tables, minilm_word_vectors, random_word_vectors,
    word_vector_source,
)
from benchmarks.tasks.sst.encoding import batch_order, SSTData, encode
from benchmarks.tasks.sst.classifier import (
    SSTClassifier, sst_sites, predict, peakedness, accuracy, mean_word_vector, train_sst_classifier,
)

__all__ = [
    "SST_URL",
    "SPLITS",
    "LABEL_NAMES",
    "DATA_ENV",
    "SSTSentence",
    "SSTDataError",
    "parse_tree",
    "parse_phrases",
    "default_data_dir",
    "resolve_data_dir",
    "read_sst",
    "Vocabulary",
    "WordVectors",
    "unescape_ptb",
    "MINILM_EXTRA_HINT",
    "minilm_tables",
    "minilm_word_vectors",
    "random_word_vectors",
    "word_vector_source",
    "batch_order",
    "SSTData",
    "encode",
    "SSTClassifier",
    "sst_sites",
    "peakedness",
    "predict",
    "accuracy",
    "mean_word_vector",
    "train_sst_classifier",
]
