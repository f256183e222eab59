"""fully_async on a real local Ray cluster, and its Rollouter as a plain object with a real model.

Every staleness figure is checked against the versions the engine recorded on each sample; the kill -9 test kills a
real `asyncrl train` process group mid-run and reads the prompt ledger the resumed run wrote.
"""

from __future__ import annotations

import json
import os
import pickle
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from asyncrl.config import load_config
from asyncrl.data.collate import collate
from asyncrl.models.loading import load_model
from asyncrl.schedules import run_training, specs_for
from asyncrl.schedules.fully_async.report import partial_metrics, processing_metrics
from asyncrl.schedules.fully_async.rollouter import Rollouter
from asyncrl.schedules.fully_async.staleness import StalenessBudget
from asyncrl.telemetry.metrics import read_metrics
from tests.helpers import length_reward, make_data, make_model, train_overrides

FULLY_ASYNC = [
    "trainer.schedule=fully_async",
    "trainer.cpus_per_worker=1",
    "rollout.cpus_per_worker=1",
    "weight_sync.verify=true",
    "weight_sync.timeout_s=30",
]


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("fa")
    train, test = make_data(root, size=10, test_size=8)
    model = make_model(root, train)
    yield root, model, train, test


def _bound(cfg) -> int:
    at = cfg.async_training
    return StalenessBudget(
        at.require_batches, cfg.actor.ppo_mini_batch_size, at.trigger_parameter_sync_step, at.staleness_threshold
    ).max_staleness


@pytest.mark.ray
def test_fully_async_run_bounds_staleness_and_reports_verl_metrics(setup):
    root, model, train, test = setup
    run_dir = root / "run"
    over = train_overrides(model, train, test, run_dir, 6) + FULLY_ASYNC
    over += ["async_training.staleness_threshold=1.0", "async_training.trigger_parameter_sync_step=2"]
    cfg = load_config(None, over)
    summary = run_training(cfg)
    bound = _bound(cfg)
    assert bound == 1
    metrics = {m["step"]: m for m in read_metrics(run_dir / "metrics.jsonl")}
    assert sorted(metrics) == [0, 1, 2, 3, 4, 5, 6]
    for step in range(1, 7):
        m = metrics[step]
        assert 0 <= m["staleness/max"] <= bound
        # version rises after every second step: steps 1-2 train at 0, 3-4 at 1, 5-6 at 2
        assert m["fully_async/trainer_version"] == (step - 1) // 2
        for key in ("trainer/idle_ratio", "rollouter/idle_ratio", "fully_async/partial/partial_ratio"):
            assert 0.0 <= m[key] <= 1.0, key
        assert m["fully_async/count/consumed_groups"] == 2 * step  # 2 groups per step
        assert m["fully_async/processing_time/tp95"] > 0
        assert ("timing_s/param_sync" in m) == (step % 2 == 0)
    assert metrics[6]["fully_async/count/consumed_groups"] == 12
    assert metrics[6]["fully_async/count/dropped_stale_samples"] == 0
    assert summary["samples"] == 6 * 2 * 4
    assert summary["ledger"]["lost"] == 0 and summary["ledger"]["duplicated"] == 0
    ledger = json.loads((run_dir / "ledger.json").read_text())
    assert ledger["epochs"]["0"]["complete"] and ledger["epochs"]["0"]["consumed_once"] == 10
    trace = json.loads((run_dir / "timeline.json").read_text())
    names = {e["name"] for e in trace["traceEvents"] if e.get("ph") == "X"}
    assert {"generate", "update_actor", "param_sync", "wait_batch"} <= names, names


def test_drop_oldest_counts_every_dropped_group(setup):
    root, model, train, test = setup
    run_dir = root / "drop"
    over = train_overrides(model, train, test, run_dir, 4) + FULLY_ASYNC
    over += [
        "async_training.staleness_threshold=2.0",
        "async_training.drop_policy=oldest",
        "async_training.max_queue_size=2",
        "trainer.val_before_train=false",
        "trainer.test_freq=0",
        "trainer.backend=in_process",
    ]
    summary = run_training(load_config(None, over))
    ledger = json.loads((run_dir / "ledger.json").read_text())
    dropped_in_ledger = sum(len(e["dropped"]) for e in ledger["epochs"].values())
    c = summary["counts"]  # taken after the Rollouter stopped, like the ledger
    assert c["dropped_groups"] > 0  # a queue of 2 groups with 2 versions of run-ahead must overflow
    # every admitted group is consumed, dropped, queued or still in flight: nothing vanished uncounted
    assert c["started_groups"] == c["consumed_groups"] + c["dropped_groups"] + c["queue_size"] + c["in_flight_groups"]
    assert c["dropped_stale_samples"] == c["dropped_groups"] * 4
    assert dropped_in_ledger == summary["ledger"]["dropped"] == c["dropped_groups"]
    assert summary["ledger"]["lost"] == 0 and summary["ledger"]["duplicated"] == 0


def test_fully_async_at_staleness_0_draws_the_same_tokens_and_weights_as_sync(setup, tmp_path):
    """verl#6780's question: fully_async with no staleness budget is sync. Same data, same seed, in-process; a step
    of fully_async takes require_batches x ppo_mini_batch_size groups, so 2 x 2 matches sync's train_batch_size 4. Each
    row's sampling noise is its own (rollout.sampling.row_keys), so the Rollouter, decoding with weights synced into its
    own engine, samples what sync's engine does; the trainer's weights after every step are then the same bit for
    bit."""
    root, model, train, test = setup
    over = [
        "trainer.backend=in_process",
        "trainer.record_consumed=true",
        "trainer.save_freq=0",
        "trainer.test_freq=0",
        "trainer.logger=[jsonl]",
        "rollout.response_length=8",
        length_reward(tmp_path),  # every group has a gradient: the updates move the weights at every step
    ]
    fully_async = [
        "trainer.schedule=fully_async",
        "async_training.staleness_threshold=0",
        "async_training.trigger_parameter_sync_step=1",
        "async_training.require_batches=2",
    ]
    runs = {}
    for name, extra in (("sync", []), ("fully_async", fully_async)):
        runs[name] = tmp_path / name
        run_training(load_config(None, train_overrides(model, train, test, runs[name], 3) + over + extra))
    for step in (1, 2, 3):
        rows = {}
        for name, d in runs.items():
            samples = pickle.loads((d / "consumed" / f"step_{step}.pkl").read_bytes())
            assert all(s.start_version == step - 1 for s in samples)  # on-policy in both
            rows[name] = [(s.uid, s.row, s.response_ids) for s in samples]
        assert len(rows["sync"]) == 16 and len({tuple(r[2]) for r in rows["sync"]}) > 1
        assert rows["fully_async"] == rows["sync"], f"step {step}: other prompts or other tokens"
        prints = [json.loads((d / "consumed" / f"step_{step}.weights.json").read_text()) for d in runs.values()]
        assert prints[0] == prints[1], f"step {step}: the weights after the update differ"
    final = [load_model(str(d / "final"))[0].state_dict() for d in runs.values()]
    start = load_model(str(model))[0].state_dict()
    assert any(not torch.equal(start[k], final[0][k]) for k in start)  # the weights did move
    assert all(torch.equal(final[0][k], final[1][k]) for k in final[0])


def test_partial_rollout_keeps_tokens_from_both_versions(setup, tmp_path):
    """A sync interrupts a running decode; the rows resume with the new weights, and the trainer's batch holds the
    tokens from before and after the interruption with the version that produced each."""
    root, model, train, test = setup
    over = train_overrides(model, train, test, root / "partial", 2) + FULLY_ASYNC
    over += [
        "rollout.response_length=400",
        "async_training.staleness_threshold=1.0",
        "async_training.max_inflight_groups=1",  # one group per decode: B starts once A is done
        "actor.ppo_mini_batch_size=1",
        "async_training.get_batch_timeout_s=120",
        "async_training.pause_timeout_s=60",
        length_reward(tmp_path),
    ]
    cfg = load_config(None, over + ["data.train_batch_size=2"])
    ro = Rollouter(specs_for(cfg).rollouter, num_threads=1)
    # An untrained micro model emits eos within a few tokens; with no eos every row runs all 400 tokens, so the
    # pause below lands mid-decode.
    ro.engine.eos_token_ids = [10**9]
    ro.start()
    try:
        first = ro.get_batch(1, trainer_version=0)  # group A, all at version 0; B is decoding now
        assert first.staleness == [0]
        deadline = time.monotonic() + 60
        while not ro.engine.busy and time.monotonic() < deadline:
            time.sleep(0.005)
        time.sleep(0.05)  # a few steps into B
        ro.pause(interrupt=True)
        interrupted = [s for g in ro.books.inflight.values() for s in g.samples if s.stop_reason == "interrupted"]
        assert interrupted and all(0 < len(s.response_ids) < 400 for s in interrupted)
        before = {gid: [len(s.response_ids) for s in g.samples] for gid, g in ro.books.inflight.items()}
        new = {k: v + 0.01 for k, v in ro.engine.state_dict_for_sync().items()}
        ro.engine.update_weights(new, version=1)
        packed = ro.resume_generation(1, snapshot=True)  # the push's snapshot, taken in the same call
        got = ro.get_batch(1, trainer_version=1)
    finally:
        ro.stop()
    (group,) = got.groups
    assert group.start_version == 0 and got.staleness == [1]
    # the snapshot is the parked instant, not the live groups it was taken from (B's rows have run on since)
    snap = packed.unpack()
    assert snap.engine_version == 1
    assert {g.group_id: [len(s.response_ids) for s in g.samples] for g in snap.inflight} == before
    # scored on the Rollouter before the queue, by the configured reward function (text length / 1000 here)
    assert [s.reward for s in group.samples] == [len(s.response_text) / 1000 for s in group.samples]
    assert all(s.reward > 0 for s in group.samples)
    for i, s in enumerate(group.samples):
        assert len(s.response_ids) == len(s.logprobs) == len(s.versions) == 400
        # version 0 produced exactly the tokens it had when the sync interrupted it, version 1 the rest
        cut = before[group.group_id][i]
        assert s.versions == [0] * cut + [1] * (400 - cut)
    assert partial_metrics(group.samples)["fully_async/partial/partial_ratio"] == 1.0
    batch = collate(group.samples, ro.engine.pad_id)
    assert int(batch.response_mask_BT.sum()) == 4 * 400  # both sides of the cut are trained on
    assert torch.equal(batch.behav_logp_BT[0, :400], torch.tensor(group.samples[0].logprobs))


def test_processing_time_percentiles():
    m = processing_metrics([4.0, 1.0, 3.0, 2.0])
    assert m["fully_async/processing_time/avg"] == 2.5
    assert m["fully_async/processing_time/max"] == 4.0
    assert m["fully_async/processing_time/tp50"] in (2.0, 3.0)
    assert m["fully_async/processing_time/tp99"] == 4.0


def _train_cmd(overrides: list[str]) -> list[str]:
    config = str(Path(__file__).resolve().parents[1] / "configs" / "fully_async.yaml")
    return [sys.executable, "-m", "asyncrl.cli", "train", "--config", config, *overrides]


@pytest.mark.ray
@pytest.mark.faults  # two CLI runs on Ray (~55 s): in make test-faults; make test resumes fully_async in-process
def test_kill_9_and_resume_loses_and_repeats_no_prompt(setup, tmp_path):
    root, model, train, test = setup
    run_dir = tmp_path / "killed"
    over = train_overrides(model, train, test, run_dir, 12) + FULLY_ASYNC
    over = [o for o in over if not o.startswith("trainer.save_freq")]
    over += [
        "trainer.save_freq=2",
        "trainer.test_freq=0",
        "trainer.val_before_train=false",
        "async_training.staleness_threshold=1.0",
        "async_training.partial_rollout=true",
        "rollout.response_length=24",
    ]
    env = dict(os.environ, HF_HUB_OFFLINE="1", PYTHONPATH=str(Path(__file__).resolve().parents[1]))
    proc = subprocess.Popen(
        _train_cmd(over), env=env, start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )
    ckpt = run_dir / "checkpoints" / "step_4"
    deadline = time.monotonic() + 240
    try:
        while not (ckpt / "rollouter_state.pt").exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        assert proc.poll() is None, proc.stderr.read().decode()[-3000:]
        assert ckpt.exists(), "no checkpoint at step 4 in time"
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)  # the driver and every Ray process it started
        proc.wait()
    assert not (run_dir / "summary.json").exists()  # it really died mid-run
    done = subprocess.run(_train_cmd(over), env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]

    steps = [m["step"] for m in read_metrics(run_dir / "metrics.jsonl")]
    assert steps == list(range(1, 13))  # each step logged exactly once across the two processes
    for m in read_metrics(run_dir / "metrics.jsonl"):
        assert m["staleness/max"] <= 1
    ledger = json.loads((run_dir / "ledger.json").read_text())
    epochs = ledger["epochs"]
    assert epochs["0"]["complete"] and epochs["1"]["complete"]  # 12 steps x 2 groups = 2.4 epochs of 10
    for e in ("0", "1"):
        assert epochs[e]["consumed_once"] == 10
        assert epochs[e]["lost"] == [] and epochs[e]["duplicated"] == [] and epochs[e]["dropped"] == []
    assert epochs["2"]["duplicated"] == [] and epochs["2"]["lost"] == []
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["samples"] == 12 * 2 * 4


def test_decoupled_ppo_anchors_at_the_sync_window_start(setup):
    """compute_prox_log_prob: the old policy is the trainer's weights at the start of the sync window. Before the first
    sync every sample was generated with exactly those weights, so behaviour and proximal log-probs agree (KL ~ 0) at
    both steps of the window; recomputing with the current weights instead sees the first update at step 2. The KL is
    the k3 estimate (>= 0 per token, so it cannot cancel), compared between the two runs on this machine."""
    root, model, train, test = setup
    kl = {}
    for prox in (True, False):
        run_dir = root / f"prox_{prox}"
        over = train_overrides(model, train, test, run_dir, 2) + FULLY_ASYNC
        over += [
            "async_training.trigger_parameter_sync_step=2",
            f"async_training.compute_prox_log_prob={str(prox).lower()}",
            "actor.use_rollout_log_probs=false",
            "algorithm.rollout_correction.rollout_is=token",
            "actor.entropy_coeff=0.01",  # the update moves the weights even when every reward is 0
            "trainer.val_before_train=false",
            "trainer.test_freq=0",
            "trainer.backend=in_process",
        ]
        run_training(load_config(None, over))
        metrics = {m["step"]: m for m in read_metrics(run_dir / "metrics.jsonl")}
        for step in (1, 2):
            assert metrics[step]["staleness/max"] == 0
            assert metrics[step]["rollout_corr/is_mean"] > 0 and metrics[step]["timing_s/old_log_prob"] > 0
        kl[prox] = [metrics[s]["rollout_corr/k3_kl"] for s in (1, 2)]
    assert max(kl[True]) < 1e-6 and kl[False][0] < 1e-6  # the engine's float gap only
    assert kl[False][1] > 100 * max(max(kl[True]), 1e-9)  # the first update, seen by the current weights


@pytest.mark.parametrize("partial", [False, True], ids=["finish", "interrupt"])
def test_one_rollouter_drives_two_rollout_ranks_with_one_set_of_books(setup, tmp_path, partial):
    """rollout.num_workers=2: the Rollouter decodes a share of each call's groups on the other rank (whose spans are
    in the timeline), every rank gets each weight sync, and staleness, consumption and the ledger are one
    Rollouter's. With partial_rollout a pause interrupts the other rank's decode too."""
    root, model, train, test = setup
    run_dir = tmp_path / "ranks"
    over = train_overrides(model, train, test, run_dir, 6) + FULLY_ASYNC
    over += [
        "trainer.backend=in_process",
        "rollout.num_workers=2",
        "async_training.staleness_threshold=1.0",
        "async_training.trigger_parameter_sync_step=2",
        f"async_training.partial_rollout={str(partial).lower()}",
        "rollout.response_length=12",
    ]
    cfg = load_config(None, over)
    summary = run_training(cfg)
    metrics = {m["step"]: m for m in read_metrics(run_dir / "metrics.jsonl")}
    assert [m["staleness/max"] <= _bound(cfg) for m in metrics.values() if m["step"] > 0] == [True] * 6
    assert metrics[6]["fully_async/count/consumed_groups"] == 12
    assert summary["ledger"]["lost"] == 0 and summary["ledger"]["duplicated"] == 0
    trace = json.loads((run_dir / "timeline.json").read_text())
    names = {e["pid"]: e["args"]["name"] for e in trace["traceEvents"] if e.get("name") == "process_name"}
    decoded = {names.get(e["pid"]) for e in trace["traceEvents"] if e.get("name") == "generate" and e.get("ph") == "X"}
    assert {"rollouter", "rollout1"} <= decoded, decoded
    workers = {w["name"] for w in summary["placement"]["workers"]}
    assert {"rollouter", "rollout1"} <= workers


def test_a_decode_splits_whole_groups_over_the_ranks():
    from asyncrl.planning.decode import split_by_group
    from asyncrl.types import Prompt, Sample

    def row(index: int) -> Sample:
        prompt = Prompt(index=index, prompt_ids=[1, 2], data_source="t", ground_truth="")
        return Sample.blank(prompt, 0, 0)

    rows = [row(g) for g in (0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3, 4, 4)]
    for n in (1, 2, 3, 5, 8):
        shares = split_by_group(rows, n)
        assert len(shares) == n and sorted(i for s in shares for i in s) == list(range(len(rows)))
        for share in shares:  # a group never straddles two ranks
            groups = {rows[i].prompt.uid for i in share}
            assert all(
                sum(rows[i].prompt.uid == g for i in share) == sum(r.prompt.uid == g for r in rows) for g in groups
            )
        assert shares[0], "the first share is never empty"
    assert [len(s) for s in split_by_group(rows, 2)] == [8, 10] or [len(s) for s in split_by_group(rows, 2)] == [10, 8]


def test_an_engine_that_decodes_with_stale_weights_fails_the_token_version_check(setup, tmp_path, monkeypatch):
    """The staleness bound is asserted from the versions the engine recorded per token, not from the books: an engine
    that goes on decoding with the weights before a sync (it stamps the version it really used) fails the step that
    trains such a row, naming it."""
    from asyncrl.rollout.engine import RolloutEngine
    from asyncrl.run.step_log import TokenVersionError

    real = RolloutEngine._continued

    def stale(self, row, reason):
        sample = real(self, row, reason)
        fresh = len(row.tokens)
        if fresh and self.version > 0:  # these tokens came from the weights before the last sync
            sample.versions[-fresh:] = [self.version - 1] * fresh
        return sample

    monkeypatch.setattr(RolloutEngine, "_continued", stale)
    root, model, train, test = setup
    over = train_overrides(model, train, test, tmp_path / "stale", 4) + FULLY_ASYNC
    over += ["trainer.backend=in_process", "trainer.val_before_train=false", "trainer.test_freq=0"]
    with pytest.raises(TokenVersionError, match="before its start version"):
        run_training(load_config(None, over))


def test_token_versions_bound_the_staleness_whatever_the_books_say():
    from asyncrl.run.step_log import TokenVersionError, staleness_metrics
    from asyncrl.types import Prompt, Sample

    def row(start: int, versions: list[int]) -> Sample:
        return Sample(Prompt(0, [1], "t", ""), [5] * len(versions), [0.0] * len(versions), versions, "eos", start)

    ok = staleness_metrics([row(1, [1, 2, 2]), row(2, [2])], trainer_version=3, bound=2)
    assert ok == {"staleness/mean": 1.5, "staleness/max": 2.0, "staleness/token_max": 2.0}
    with pytest.raises(TokenVersionError, match="version 0, before its start version 1"):
        staleness_metrics([row(1, [1, 0])], trainer_version=1)
    with pytest.raises(TokenVersionError, match="staleness 3 > the bound 2"):
        staleness_metrics([row(0, [0, 1])], trainer_version=3, bound=2)
