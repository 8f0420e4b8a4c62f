"""The sst-depth-page study: the sentences it draws, and its page and report from a
probe saved with save_pretrained and loaded back, on a tiny BERT."""

import torch
from tiny_models import tiny_bert, tiny_wordpiece

from benchmarks.studies import sst_depth_page
from benchmarks.tasks.sst import SSTSentence
from captum_diffmask import DiffMask

WORDS = ["a", "film", "with", "lovely", "performances", "dull", "plot"]


def _sentence(words, label):
    return SSTSentence(tuple(words.split()), label, tuple(2 for _ in words.split()))


def test_it_draws_the_first_short_sentence_of_each_class():
    sentences = [_sentence("a very long dull film with a plot", 0), _sentence("dull plot", 0),
                 _sentence("a film", 4), _sentence("lovely film", 4), _sentence("a plot", 1)]
    picked = sst_depth_page.pick_sentences(sentences, max_words=3)
    assert [" ".join(s.words) for s in picked] == ["dull plot", "a film"]  # no neutral sentence: left out


def test_the_page_and_the_report_come_from_a_reloaded_probe(tmp_path):
    model, tokenizer = tiny_bert(), tiny_wordpiece(WORDS)
    texts = ["a film with lovely performances", "dull plot"]
    dm = DiffMask(model, mode="input")
    dm.fit(texts * 4, tokenizer=tokenizer, max_steps=3, verbose=False)
    dm.save_pretrained(tmp_path / "probe")
    loaded = DiffMask.from_pretrained(tmp_path / "probe", model)
    data = sst_depth_page.depth_page(loaded, model, tokenizer, texts, ig_steps=4)
    layers = model.config.num_hidden_layers
    assert data["columns"] == [f"layer {k}" for k in range(layers + 1)] and len(data["verdicts"]) == layers + 1
    assert data["words"] == [t.split() for t in texts]
    keep = torch.tensor(data["keep"][0])
    assert keep.shape == (5, layers + 1) and bool(((keep >= 0) & (keep <= 1)).all())
    assert "type='range'" in data["html"] and "IntegratedGradients" in data["html"]
    counts = {str(k): k != 1 for k in range(layers + 1)}
    data.update({"probe": "probe", "fit": {"steps": 3, "epochs": 1, "examples_per_epoch": 8}, "setup": "THE SETUP.",
                 "counts": counts,
                 "sentences": [{"text": t, "label": label} for t, label in zip(texts, (4, 0))]})
    text = sst_depth_page.markdown(data, "the command", "sst-depth.html")
    means = keep.mean(0)
    row = "| a film with lovely performances | 4 | " + " | ".join(f"{m:.2f}" for m in means) + " |"
    assert row in text and "[sst-depth.html](sst-depth.html)" in text and "3 steps over 1 epochs" in text
    assert "THE SETUP." in text and f"**{layers} of {layers + 1} depths count under the sst suite's rule" in text
    assert f"layer 0 {data['verdicts'][0]} (counts), layer 1 {data['verdicts'][1]} (does not count)" in text
    unknown = sst_depth_page.markdown({**data, "counts": None, "fit": {"steps": 3, "epochs": 1,
                                                                         "examples_per_epoch": None}}, "c", "p.html")
    assert "(counts)" not in unknown and "3 steps over 1 epochs;" in unknown
