"""The QA model's fine-tuning, predictions and score, on a config-built tiny BERT
and hand-written questions."""

import pytest
import torch
import transformers as hf

from benchmarks.tasks.squad import encode_squad, SquadExample
from benchmarks.tasks.squad import window_batches
from benchmarks.tasks.squad_qa import evaluate_qa, fine_tune_qa, predict, span_logits

from tiny_models import tiny_wordpiece

WORDS = ["who", "won", "the", "game", "denver", "broncos", "beat", "panthers", "carolina", "by", "a", "score", "of",
         "24", "to", "10", ".", ",", "?", "at", "stadium", "levi", "'", "s", "where", "was", "it", "played", "beaten"]
CONTEXT = "Denver Broncos beat Carolina Panthers by a score of 24 to 10, at Levi's stadium."

QUESTIONS = [("Who won the game?", "Denver Broncos"), ("Where was it played?", "Levi's stadium"),
             ("Who was beaten?", "Carolina Panthers")]


@pytest.fixture
def tokenizer():
    return tiny_wordpiece(WORDS)


def _examples():
    return [SquadExample(f"q{i}", "A", CONTEXT, q, (a,), (CONTEXT.index(a),)) for i, (q, a) in enumerate(QUESTIONS)]


def _tiny_qa(vocab_size):
    torch.manual_seed(0)
    config = hf.BertConfig(vocab_size=vocab_size, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                           intermediate_size=37, max_position_embeddings=64, hidden_dropout_prob=0.0,
                           attention_probs_dropout_prob=0.0)
    return hf.BertForQuestionAnswering(config).eval()


def test_window_batches_cut_padding_and_cover_every_window(tokenizer):
    features = encode_squad(_examples(), tokenizer, max_length=48, doc_stride=16)
    seen = []
    for rows, ids, mask, types, starts, ends in window_batches(features, 2, shuffle=True, seed=1):
        assert ids.shape == mask.shape == types.shape and mask[:, -1].any()  # no all-padding column
        seen += rows.tolist()
    assert sorted(seen) == list(range(len(features)))


def test_fine_tuning_learns_the_answers_and_the_official_score_says_so(tokenizer):
    examples = _examples()
    features = encode_squad(examples, tokenizer, max_length=48, doc_stride=16)
    model = _tiny_qa(len(tokenizer))
    before = evaluate_qa(model, examples, features)
    lines = []
    history = fine_tune_qa(model, features, epochs=100, lr=1e-2, batch_size=3, warmup=0.0, verbose=False,
                           log=lines.append)
    assert history[-1]["train_loss"] < 0.05 * history[0]["train_loss"] and len(lines) == 100
    assert not model.training
    after = evaluate_qa(model, examples, features)
    assert after["exact_match"] == 100.0 and after["f1"] == 100.0 and before["exact_match"] < 100.0
    assert predict(model, examples, features) == {"q0": "Denver Broncos", "q1": "Levi's stadium",
                                                  "q2": "Carolina Panthers"}
    starts, _ = span_logits(model, features)
    assert (starts[features.attention_mask == 0] == torch.finfo(torch.float32).min).all()


def test_max_steps_caps_the_fine_tuning(tokenizer):
    features = encode_squad(_examples(), tokenizer, max_length=48, doc_stride=16)
    history = fine_tune_qa(_tiny_qa(len(tokenizer)), features, epochs=5, batch_size=2, max_steps=3, verbose=False)
    assert history[-1]["steps"] == 3
    with pytest.raises(ValueError, match="epochs must be an int >= 1"):
        fine_tune_qa(_tiny_qa(len(tokenizer)), features, epochs=0)


def test_the_suites_model_is_fine_tuned_once_then_read_from_the_cache(tokenizer, tmp_path, monkeypatch):
    import copy
    import json

    from benchmarks.suites import squad

    monkeypatch.setenv("CAPTUM_DIFFMASK_CACHE", str(tmp_path / "cache"))
    articles = [{"title": f"T{t}", "paragraphs": [{"context": CONTEXT, "qas": [
        {"id": f"t{t}q{i}", "question": q, "answers": [{"text": a, "answer_start": CONTEXT.index(a)}]}
        for i, (q, a) in enumerate(QUESTIONS)]}]} for t in range(5)]
    path = tmp_path / "squad.json"
    path.write_text(json.dumps({"data": articles}))
    config = copy.deepcopy(squad.DEFAULTS)
    config["data"]["path"] = str(path)
    config["model"].update({"max_length": 48, "doc_stride": 16, "epochs": 30, "lr": 1e-2, "batch_size": 6,
                            "warmup": 0.0})
    train, held_out = squad.load_squad_split(config)
    assert len(train) == 12 and len(held_out) == 3  # one article of five held out
    factory = lambda: (_tiny_qa(len(tokenizer)), tokenizer)  # noqa: E731
    model, _, info = squad.load_qa_model(config, train, held_out, False, factory=factory)
    assert not info["cached"] and info["windows"] == 12 and info["held_out"]["count"] == 3
    # the same questions in another article: the held-out score is the model's own
    assert info["held_out"]["exact_match"] == 100.0
    again, _, cached_info = squad.load_qa_model(config, train, held_out, False, factory=factory)
    assert cached_info["cached"] and cached_info["held_out"] == info["held_out"]
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), again.state_dict().values()))
