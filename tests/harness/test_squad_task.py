"""The SQuAD task: reading, the split by article, the windows and their answer
labels, the best span read back from the logits, and the official score, on
hand-checked examples."""

import json

import pytest
import torch

from benchmarks.tasks.squad import (
    best_spans, encode_squad, normalize_answer, read_squad, span_text, split_by_article, SquadExample, squad_scores,
)

from tiny_models import tiny_wordpiece

WORDS = ["who", "won", "the", "game", "in", "denver", "broncos", "beat", "panthers", "carolina", "by", "a", "score",
         "of", "24", "to", "10", ".", ",", "at", "stadium", "levi", "'", "s", "where", "was", "it", "played"]


@pytest.fixture
def tokenizer():
    return tiny_wordpiece(WORDS)


CONTEXT = "Denver Broncos beat Carolina Panthers by a score of 24 to 10, at Levi's stadium."


def _example(qid="q1", title="A", question="Who won the game?", answer="Denver Broncos"):
    return SquadExample(qid, title, CONTEXT, question, (answer,), (CONTEXT.index(answer),))


def test_read_squad_keeps_every_question_with_its_answers(tmp_path):
    data = {"data": [{"title": "A", "paragraphs": [{"context": CONTEXT, "qas": [
        {"id": "q1", "question": "Who won?", "answers": [{"text": "Denver Broncos", "answer_start": 0},
                                                         {"text": "Broncos", "answer_start": 7}]}]}]}]}
    path = tmp_path / "squad.json"
    path.write_text(json.dumps(data))
    (example,) = read_squad(path)
    assert example.answers == ("Denver Broncos", "Broncos") and example.answer_starts == (0, 7)
    assert example.context[7:14] == "Broncos"
    with pytest.raises(FileNotFoundError, match="SQuAD file not found"):
        read_squad(tmp_path / "missing.json")


def test_the_split_by_article_puts_no_passage_on_both_sides():
    examples = [_example(f"q{i}", title=f"T{i % 10}") for i in range(50)]
    train, held = split_by_article(examples, held_out=0.2, seed=0)
    assert len(train) + len(held) == 50
    assert {e.title for e in train}.isdisjoint({e.title for e in held})
    assert len({e.title for e in held}) == 2  # 20 % of 10 articles
    assert split_by_article(examples, 0.2, seed=0) == (train, held)
    with pytest.raises(ValueError, match="at least two articles"):
        split_by_article(examples[:1])


def test_an_answer_inside_the_window_is_labelled_with_its_tokens(tokenizer):
    features = encode_squad([_example()], tokenizer, max_length=32, doc_stride=8)
    assert len(features) == 1
    tokens = tokenizer.convert_ids_to_tokens(features.input_ids[0])
    start, end = int(features.start_positions[0]), int(features.end_positions[0])
    assert tokens[start:end + 1] == ["denver", "broncos"]
    assert tokens[0] == "[CLS]" and features.token_type_ids[0, start] == 1  # in the context segment
    assert features.offsets[0][1] is None  # question tokens have no context offsets


def test_an_answer_outside_a_window_is_labelled_cls_and_windows_overlap(tokenizer):
    # 13 question-free context budget per window: the context is cut into overlapping windows
    features = encode_squad([_example(answer="stadium")], tokenizer, max_length=16, doc_stride=4)
    assert len(features) > 1 and (features.example_index == 0).all()
    labels = list(zip(features.start_positions.tolist(), features.end_positions.tolist()))
    assert labels[0] == (0, 0)  # the first window ends before "stadium"
    last = len(features) - 1
    tokens = tokenizer.convert_ids_to_tokens(features.input_ids[last])
    assert labels[last] != (0, 0) and tokens[labels[last][0]] == "stadium"


def test_the_best_span_reads_the_answer_back_and_skips_the_question(tokenizer):
    example = _example(question="Where was it played?", answer="Levi's stadium")
    features = encode_squad([example], tokenizer, max_length=40, doc_stride=8)
    start, end = int(features.start_positions[0]), int(features.end_positions[0])
    starts = torch.full((1, 40), -5.0)
    ends = torch.full((1, 40), -5.0)
    starts[0, start], ends[0, end] = 3.0, 3.0
    starts[0, 1], ends[0, 1] = 9.0, 9.0  # a question token scores higher: never an answer
    starts[0, end], ends[0, start] = 2.0, 2.0  # an end before the start is never taken either
    (span,) = best_spans(features, starts, ends, 1)
    assert span_text(example, features, span) == "Levi's stadium"
    assert span_text(example, features, None) == ""


def test_the_official_normalisation_and_scores():
    assert normalize_answer("The  Denver Broncos!") == "denver broncos"
    assert normalize_answer("an Apple, a day") == "apple day"
    examples = [_example("q1", answer="Denver Broncos"), _example("q2", answer="24 to 10")]
    scores = squad_scores({"q1": "the Denver Broncos", "q2": "24"}, examples)
    # q1: exact after normalisation; q2: precision 1, recall 1/3 -> F1 0.5
    assert scores["exact_match"] == pytest.approx(50.0)
    assert scores["f1"] == pytest.approx(75.0)
    assert squad_scores({}, examples)["f1"] == 0.0


def test_question_offsets_point_into_the_question_and_subset_keeps_rows(tokenizer):
    examples = [_example(question="  Who won the game?"), _example("q2", answer="stadium")]
    features = encode_squad(examples, tokenizer, max_length=16, doc_stride=4)
    question = examples[0].question.lstrip()  # what the tokenizer read
    row = features.question_offsets[0]
    tokens = tokenizer.convert_ids_to_tokens(features.input_ids[0])
    assert [question[s:e].lower() for s, e in (o for o in row if o is not None)] == ["who", "won", "the", "game", "?"]
    assert tokens[1] == "who" and row[0] is None and features.offsets[0][1] is None
    last = len(features) - 1
    picked = features.subset([last, 0])
    assert torch.equal(picked.input_ids, features.input_ids[[last, 0]])
    assert picked.example_index.tolist() == [1, 0] and picked.offsets[0] == features.offsets[last]
    assert picked.question_offsets[1] == row


def test_the_loader_gives_every_window_once_cut_to_its_batch(tokenizer):
    features = encode_squad([_example(answer="stadium")], tokenizer, max_length=16, doc_stride=4)
    batches = features.loader(2, shuffle=True, seed=3)
    assert sum(ids.shape[0] for ids, _, _ in batches) == len(features)
    for ids, mask, types in batches:
        assert ids.shape == mask.shape == types.shape and mask[:, -1].any()
    assert [b[0].tolist() for b in batches] == [b[0].tolist() for b in features.loader(2, shuffle=True, seed=3)]
