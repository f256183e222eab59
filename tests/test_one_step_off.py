"""one_step_off on a real local Ray cluster: separate trainer and rollout pools, weights synced over gloo.

Staleness is read from the versions the rollout engine recorded on each sample, so "exactly 1" is measured, not
assumed by the pipeline.
"""

from __future__ import annotations

import json

import pytest

from asyncrl.checkpoint import load_driver_state
from asyncrl.config import load_config
from asyncrl.schedules import run_training
from asyncrl.telemetry.metrics import read_metrics
from asyncrl.workers.cluster import PlacementError
from tests.helpers import make_data, make_model, train_overrides

IN_PROCESS = "trainer.backend=in_process"  # checkpoint logic, not Ray, is under test there: no cluster start-up

POOLS = [
    "trainer.schedule=one_step_off",
    "trainer.cpus_per_worker=1",
    "rollout.num_workers=2",
    "rollout.cpus_per_worker=0.5",
    "weight_sync.verify=true",
    "weight_sync.timeout_s=30",
]


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("osp")
    train, test = make_data(root)
    model = make_model(root, train)
    yield root, model, train, test


@pytest.mark.ray
def test_three_one_step_off_steps_train_one_version_behind(setup):
    root, model, train, test = setup
    run_dir = root / "osp"
    cfg = load_config(None, train_overrides(model, train, test, run_dir, 3) + POOLS)
    summary = run_training(cfg)
    metrics = {m["step"]: m for m in read_metrics(run_dir / "metrics.jsonl")}
    assert sorted(metrics) == [0, 1, 2, 3]
    # batch 1 is generated with the initial weights and trained at version 0; every later batch one version behind
    assert metrics[1]["staleness/mean"] == 0.0
    for step in (2, 3):
        assert metrics[step]["staleness/mean"] == 1.0
        assert metrics[step]["staleness/max"] == 1.0
        assert metrics[step]["weight_sync/bytes_per_s"] > 0 and metrics[step]["weight_sync/seconds"] > 0
        for key in ("timing_s/sync_rollout_weights", "timing_s/update_actor", "timing_s/gen"):
            assert 0 < metrics[step][key] < metrics[step]["timing_s/step"] + metrics[step]["timing_s/gen"], key
        # the driver waited for batch t (timed, possibly ~0 when it was ready) inside the step
        assert metrics[step]["timing_s/wait_prev_gen"] < metrics[step]["timing_s/step"]
    assert summary["samples"] == 3 * 4 * 4
    trace = json.loads((run_dir / "timeline.json").read_text())
    workers = {e["args"]["name"] for e in trace["traceEvents"] if e.get("ph") == "M" and e["name"] == "process_name"}
    assert {"trainer", "rollout0", "rollout1", "driver"} <= workers


def test_resumed_one_step_off_regenerates_the_in_flight_batch(setup):
    root, model, train, test = setup
    run_dir = root / "osp_resume"
    base = train_overrides(model, train, test, run_dir, 2) + POOLS + ["trainer.val_before_train=false", IN_PROCESS]
    run_training(load_config(None, base))
    run_training(load_config(None, base + ["trainer.total_training_steps=4", "trainer.resume_mode=auto"]))
    metrics = read_metrics(run_dir / "metrics.jsonl")
    assert [m["step"] for m in metrics] == [1, 2, 3, 4]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["samples"] == 4 * 4 * 4


def test_mid_run_checkpoint_records_the_cursor_after_the_trained_batch(setup):
    """A checkpoint at step s is taken while batch s+1 is in flight: it must record the data cursor after batch s
    (s x train_batch_size prompts), so a resume draws batch s+1 again, neither skipping nor retraining any batch."""
    root, model, train, test = setup
    run_dir = root / "osp_cursor"
    over = train_overrides(model, train, test, run_dir, 3) + POOLS + [IN_PROCESS]
    run_training(load_config(None, over + ["trainer.save_freq=1", "trainer.test_freq=0"]))
    for step in (2, 3):  # the manager keeps the last two; step 2 was saved with batch 3 in flight
        state = load_driver_state(run_dir / "checkpoints" / f"step_{step}")
        assert (state["sampler"]["epoch"], state["sampler"]["position"]) == (0, step * 4), step


@pytest.mark.ray
def test_pools_larger_than_the_cluster_fail_at_start(setup):
    root, model, train, test = setup
    cfg = load_config(None, train_overrides(model, train, test, root / "big", 1) + POOLS + ["rollout.num_workers=8"])
    with pytest.raises(PlacementError, match=r"ask for 5 CPUs \(trainer=1 CPUs, rollout=4 CPUs\)"):
        run_training(cfg)
