"""The scaling report: the estimate's arithmetic on a shape small enough to count
by hand, the launcher's throughput record, and the report written from runs."""

import json

import pytest

from benchmarks.studies import distributed_fit
from benchmarks.studies.scaling import estimate, ModelShape, write_report


def test_estimate_counts_a_small_shape_by_hand():
    shape = ModelShape(name="small", parameters=1000.0, layers=2, hidden=8, ffn=16, bytes_per_value=2)
    result = estimate(shape, tokens_per_step=10, tokens_per_epoch=100, flops_per_second=1e3)
    # three gate networks of width 2: input mode reads 16 features, hidden mode 8
    assert result["input"]["probe_parameters"] == 3 * (16 * 2 + 2 * 2 + 1)
    assert result["hidden"]["probe_parameters"] == 3 * (8 * 2 + 2 * 2 + 1)
    memory = result["input"]["memory_gb"]
    assert memory["weights"] == pytest.approx(2000 / 1e9)
    assert memory["probe_and_adam"] == pytest.approx(3 * 37 * 16 / 1e9)
    assert memory["captured_sites"] == pytest.approx(3 * 8 * 10 * 2 / 1e9)
    assert memory["probe_activations"] == pytest.approx(3 * (16 + 4) * 4 * 10 / 1e9)
    assert memory["model_activations"] == pytest.approx(2 * (9 * 8 + 4 * 16) * 2 * 10 / 1e9)
    # hidden mode keeps half the blocks and one gate network
    hidden = result["hidden"]["memory_gb"]
    assert hidden["model_activations"] == pytest.approx(memory["model_activations"] / 2)
    assert hidden["probe_activations"] == pytest.approx((8 + 4) * 4 * 10 / 1e9)
    assert result["input"]["total_gb"] == pytest.approx(sum(memory.values()))
    assert result["input"]["seconds_per_epoch"] == pytest.approx(6 * 1000 * 100 / 1e3)
    assert result["hidden"]["seconds_per_epoch"] == pytest.approx(4 * 1000 * 100 / 1e3)


def _small_toy(batch_size):
    from captum_diffmask.evaluation.toy_task import generate_toy_data, train_toy_model, toy_sites

    train, valid = generate_toy_data(300, seed=0).split(0.2, seed=0)
    model, _ = train_toy_model(train, valid, seed=0, epochs=1)
    return model, {"sites": toy_sites(model), "padding_mask_arg": 1}, list(train.loader(batch_size, seed=0))


def test_launcher_counts_examples_and_tokens_of_the_batches_read(tmp_path, monkeypatch):
    monkeypatch.setitem(distributed_fit.TASKS, "toy", _small_toy)
    distributed_fit.main(["--task", "toy", "--mode", "hidden", "--steps", "3", "--threads", "1", "--out", str(tmp_path)])
    run = json.loads((tmp_path / "run-toy-hidden-1x1.json").read_text())
    assert run["steps"] == 3 and run["world_size"] == 1
    assert run["examples_per_second"] == pytest.approx(3 * 32 / run["seconds"])
    assert 0 < run["tokens_per_second"] <= 10 * run["examples_per_second"]  # toy rows have 1..10 real tokens
    assert run["train_examples"] == 240
    with pytest.raises(ValueError, match="steps"):
        distributed_fit.main(["--task", "toy", "--steps", "9", "--threads", "1", "--out", str(tmp_path)])


def _run(task, mode, world, threads, tokens_per_second, difference=0.0):
    return {"task": task, "mode": mode, "world_size": world, "threads_per_process": threads, "steps": 10, "seconds": 0.5,
            "examples_per_second": tokens_per_second / 5, "tokens_per_second": tokens_per_second,
            "max_probe_difference_across_ranks": difference, "train_tokens": 5000}


def test_report_gives_ratios_against_one_process_and_the_estimate(tmp_path):
    runs = tmp_path / "runs"
    runs.mkdir()
    for run in (_run("sst", "input", 1, 2, 100.0), _run("sst", "input", 1, 1, 60.0), _run("sst", "input", 2, 1, 150.0, 0.0)):
        (runs / f"run-{run['task']}-{run['mode']}-{run['world_size']}x{run['threads_per_process']}.json").write_text(json.dumps(run))
    out = tmp_path / "scaling.md"
    write_report(runs, out)
    text = out.read_text()
    assert "| sst | input | 2 x 1 | 10 | 50.0 | 30 | 150 | 1.50x | 2.50x | 0.0e+00 |" in text
    assert "| sst | input | 1 x 2 | 10 | 50.0 | 20 | 100 | 1.00x | 1.67x | - |" in text
    assert "an epoch of SST train (5000 tokens" in text
    record = json.loads(out.with_suffix(".json").read_text())
    assert record["estimate"]["tokens_per_epoch"] == 5000
    with pytest.raises(FileNotFoundError, match="runs"):
        write_report(tmp_path / "empty", out)
