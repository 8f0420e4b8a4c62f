"""DiffMask's fit across two gloo processes on the loopback: every rank ends with
the same probe, the one a single process fits on the concatenated batches, and
only rank 0 writes the checkpoint."""

import os

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from captum_diffmask import DiffMask
from captum_diffmask.diffmask.fit.distributed import rank_and_world, sharded
from captum_diffmask.evaluation.toy_task import generate_toy_data, ToyModel, toy_sites

pytestmark = pytest.mark.filterwarnings("ignore::captum_diffmask.DiffMaskConvergenceWarning")
FIT = dict(epochs=2, seed=0, convergence={"until_converged": False}, verbose=False, eps=0.05)


def _setup():
    torch.manual_seed(0)
    model = ToyModel(embedding_dim=16, hidden_size=16).eval()
    batches = list(generate_toy_data(256, seed=0).loader(16, shuffle=False))  # 16 batches: 8 global steps
    return model, batches


def _worker(rank: int, world: int, init_file: str, out: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    try:
        assert rank_and_world() == (rank, world)
        model, batches = _setup()
        for mode in ("hidden", "input"):
            dm = DiffMask(model, mode=mode, sites=toy_sites(model), padding_mask_arg=1)
            history = dm.fit(batches, **FIT)
            dm.save(os.path.join(out, f"{mode}-rank{rank}.pt"))  # only rank 0 writes
            torch.save({"probe": dm.probe.state_dict(), "history": history},
                       os.path.join(out, f"{mode}-state{rank}.pt"))
    finally:
        dist.destroy_process_group()


def test_two_gloo_processes_fit_the_probe_of_one_process_on_the_global_batches(tmp_path):
    world = 2
    context = mp.spawn(_worker, args=(world, str(tmp_path / "init"), str(tmp_path)), nprocs=world, join=False)
    for process in context.processes:
        process.join(timeout=240)  # bounded: a hung process group fails the test
    assert all(p.exitcode == 0 for p in context.processes), [p.exitcode for p in context.processes]
    model, batches = _setup()
    global_batches = [tuple(torch.cat(parts) for parts in zip(*pair)) for pair in zip(batches[0::2], batches[1::2])]
    for mode in ("hidden", "input"):
        states = [torch.load(tmp_path / f"{mode}-state{r}.pt") for r in range(world)]
        for name, value in states[0]["probe"].items():
            assert torch.equal(value, states[1]["probe"][name]), (mode, name)  # the same probe on both ranks
        single = DiffMask(model, mode=mode, sites=toy_sites(model), padding_mask_arg=1)
        history = single.fit(global_batches, **FIT)
        # Two processes sum the batch's gradient in another order than one: the
        # same up to rounding. Adam's step is lr * m / sqrt(v), whose size does not
        # depend on the gradient's, so a parameter whose gradient is ~0 (a baseline
        # while its gates are open) moves by up to lr a step in a direction the
        # rounding picks; per machine the differences range from 0 to that bound
        # (1e-4 seen on one machine, 1e-6 on another). Bound: lr x steps; what a
        # user reads, the attributions, agree closely.
        steps = len(global_batches) * FIT["epochs"]
        for name, value in single.probe.state_dict().items():
            lr = 1e-3 if name.startswith("baseline") else 3e-3  # fit's lr_baseline and lr
            assert (value - states[0]["probe"][name]).abs().max() <= lr * steps, (mode, name)
        distributed = DiffMask.load(tmp_path / f"{mode}-rank0.pt", model, sites=toy_sites(model), padding_mask_arg=1)
        ids, query, mask = global_batches[0]
        for layer in (0, 1):
            torch.testing.assert_close(distributed.attribute(ids, additional_forward_args=(query, mask), layer=layer),
                                       single.attribute(ids, additional_forward_args=(query, mask), layer=layer),
                                       atol=1e-3, rtol=0)
        assert [row["steps"] for row in states[0]["history"]] == [row["steps"] for row in history]
        assert abs(states[0]["history"][-1]["kl"] - history[-1]["kl"]) < 1e-5
        assert (tmp_path / f"{mode}-rank0.pt").exists() and not (tmp_path / f"{mode}-rank1.pt").exists()


def test_sharding_gives_each_rank_its_batch_of_every_group_and_drops_an_incomplete_one():
    batches = list(range(7))
    assert list(sharded(batches, 0, 2)) == [0, 2, 4] and list(sharded(batches, 1, 2)) == [1, 3, 5]
    assert list(sharded(batches, 2, 3)) == [2, 5]
    assert rank_and_world() == (0, 1)  # no process group here
