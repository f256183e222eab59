"""Held-out evaluation on the engine that generates (``Run.evaluate``): the rollout pool's where the schedule has
one, the trainer's in sync; ``val/version`` says which weights the accuracy is of. In-process roles, micro models."""

from __future__ import annotations

import pytest

from asyncrl.config import load_config
from asyncrl.schedules import run_training
from asyncrl.telemetry.metrics import read_metrics
from asyncrl.telemetry.timeline import get_timeline, read_chrome_trace
from tests.helpers import make_data, make_model, train_overrides

VAL = ["data.val_max_samples=6", "trainer.backend=in_process", "trainer.test_freq=2"]


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("val")
    train, test = make_data(root)
    return root, make_model(root, train), train, test


def _generators(run_dir) -> dict[int, set[str]]:
    """step -> the workers that ran a ``generate`` span at that step."""
    out: dict[int, set[str]] = {}
    for e in read_chrome_trace(run_dir / "timeline.json"):
        if e["name"] == "generate":
            out.setdefault(e["step"], set()).add(e["worker"])
    return out


def test_one_step_off_evaluates_on_the_rollout_pool_at_the_version_it_holds(setup):
    root, model, train, test = setup
    run_dir = root / "osp"
    over = train_overrides(model, train, test, run_dir, 3) + VAL
    over += ["trainer.schedule=one_step_off", "rollout.num_workers=2", "rollout.cpus_per_worker=0.5"]
    over += ["rollout.val_kwargs.do_sample=true", "rollout.val_kwargs.temperature=1.0", "rollout.val_kwargs.n=3"]
    summary = run_training(load_config(None, over))
    metrics = {m["step"]: m for m in read_metrics(run_dir / "metrics.jsonl")}
    # before training: the initial weights; at step 2 the pool holds v1 (it generates batch 3 with them); at the
    # last step it is synced to the final weights first
    assert [metrics[s]["val/version"] for s in (0, 2, 3)] == [0.0, 1.0, 3.0]
    assert all(metrics[s]["val/n"] == 6 * 3 for s in (0, 2, 3))  # val_kwargs.n responses per held-out prompt
    assert summary["accuracy_after"] == metrics[3]["val/accuracy"]
    workers = set().union(*_generators(run_dir).values())
    assert workers == {"rollout0", "rollout1"}  # the trainer's engine never generated, not even to evaluate


def test_sync_evaluates_on_the_trainers_engine_at_its_current_version(setup):
    root, model, train, test = setup
    run_dir = root / "sync"
    with get_timeline().span("generate", step=1, worker="left_by_a_run_that_raised"):
        pass  # a span a run in this process left behind is not this run's
    run_training(load_config(None, train_overrides(model, train, test, run_dir, 2) + VAL))
    metrics = {m["step"]: m for m in read_metrics(run_dir / "metrics.jsonl")}
    assert [metrics[s]["val/version"] for s in (0, 2)] == [0.0, 2.0]
    assert metrics[2]["val/n"] == 6  # greedy, one response per prompt (val_kwargs.n=1)
    assert {w for ws in _generators(run_dir).values() for w in ws} == {"trainer"}


@pytest.mark.parametrize("partial", [True, False])
def test_fully_async_evaluates_on_the_parked_rollouter_and_its_stream_goes_on(setup, partial):
    root, model, train, test = setup
    run_dir = root / f"fa_{partial}"
    over = train_overrides(model, train, test, run_dir, 4) + VAL
    over += ["trainer.schedule=fully_async", "async_training.staleness_threshold=1"]
    over += ["async_training.trigger_parameter_sync_step=2", f"async_training.partial_rollout={partial}"]
    run_training(load_config(None, over))
    metrics = {m["step"]: m for m in read_metrics(run_dir / "metrics.jsonl")}
    assert sorted(metrics) == [0, 1, 2, 3, 4]  # every step once: the stream went on after each evaluation
    # before training the initial weights; at steps 2 and 4 the Rollouter holds the version pushed at that step's end
    # (the push comes before the evaluation), which is the trainer's
    assert [metrics[s]["val/version"] for s in (0, 2, 4)] == [0.0, 1.0, 2.0]
    assert all(metrics[s]["val/n"] == 6 for s in (0, 2, 4))
    generators = _generators(run_dir)
    assert {w for ws in generators.values() for w in ws} == {"rollouter"}  # never the trainer's engine
    assert {s for s in generators if s is not None} == {0, 2, 4}  # the stream's own decode spans carry no step
