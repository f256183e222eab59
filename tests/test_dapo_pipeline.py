"""DAPO end to end on the batch schedules (in-process roles, micro model, 3 steps each): with
``algorithm.filter_groups`` every trained group has a reward spread, every batch holds ``data.train_batch_size``
groups, the counts add up, each checkpoint's data cursor sits right after the last prompt drawn for the batch it
trained, and a resumed run draws and trains what the unbroken run did. The overlong penalty is on, logged.

The reward gives every response to a prompt with an even answer the same accuracy (such groups are always filtered)
and an accuracy that depends on the response text otherwise, so filtering happens whatever the model samples.
"""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import pytest

from asyncrl.checkpoint import load_driver_state
from asyncrl.config import load_config
from asyncrl.rewards.filtering import group_by_prompt, keep_group
from asyncrl.schedules import run_training
from asyncrl.schedules.fully_async.ledger import parse_group_id
from asyncrl.telemetry.metrics import read_metrics
from tests.helpers import make_data, make_model, train_overrides
from tests.test_schedule_matrix import undocumented_metrics

DATA_SIZE = 64
REWARD = """
def half_flat(data_source, solution_str, ground_truth, extra_info):
    if int(ground_truth) % 2 == 0:
        return {"score": 0.5, "acc": 0.5}
    acc = (sum(map(ord, solution_str)) % 97) / 97
    return {"score": acc, "acc": acc}
"""
SCHEDULES = {  # the keys of each schedule, and the staleness it promises at steps 1..3
    "sync": ([], [0, 0, 0]),
    "one_step_off": (["rollout.num_workers=1", "rollout.cpus_per_worker=1"], [0, 1, 1]),
    "two_step_off": (["rollout.num_workers=2", "rollout.cpus_per_worker=1", "data.gen_batch_size=6"], [0, 1, 2]),
}


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("dapo")
    train, test = make_data(root, size=DATA_SIZE, test_size=8)
    model = make_model(root, train)
    (root / "half_flat.py").write_text(REWARD)
    return root, model, train, test


def dapo_overrides(setup, run_dir: Path, steps: int, *extra: str) -> list[str]:
    root, model, train, test = setup
    return train_overrides(model, train, test, run_dir, steps) + [
        "trainer.backend=in_process",
        "trainer.save_freq=1",
        "trainer.test_freq=0",
        "trainer.val_before_train=false",
        "trainer.record_consumed=true",  # what each step trained, for the checks below
        f"reward.custom_function={root / 'half_flat.py'}:half_flat",
        "algorithm.filter_groups.enable=true",
        "algorithm.filter_groups.max_num_gen_batches=8",
        "reward_model.reward_manager=dapo",
        "+reward_model.reward_kwargs.overlong_buffer_cfg.enable=True",
        "+reward_model.reward_kwargs.overlong_buffer_cfg.len=2",
        "+reward_model.reward_kwargs.overlong_buffer_cfg.penalty_factor=0.1",
        "+reward_model.reward_kwargs.overlong_buffer_cfg.log=True",
        *extra,
    ]


def consumed(run_dir: Path, step: int) -> list:
    return pickle.loads((run_dir / "consumed" / f"step_{step}.pkl").read_bytes())


@pytest.fixture(scope="module")
def sync_run(setup):
    run_dir = setup[0] / "sync"
    run_training(load_config(None, dapo_overrides(setup, run_dir, 3)))
    return run_dir


@pytest.mark.parametrize("schedule", list(SCHEDULES))
def test_every_trained_batch_is_full_of_groups_with_a_spread_and_the_counts_add_up(setup, sync_run, schedule):
    keys, staleness = SCHEDULES[schedule]
    run_dir = sync_run
    if schedule != "sync":
        run_dir = setup[0] / schedule
        run_training(load_config(None, dapo_overrides(setup, run_dir, 3, f"trainer.schedule={schedule}", *keys)))
    cfg = load_config(str(run_dir / "config.yaml"))
    groups, n = cfg.data.train_batch_size, cfg.rollout.n
    gen_batch = cfg.data.gen_batch_size or groups
    metrics = {m["step"]: m for m in read_metrics(run_dir / "metrics.jsonl")}
    assert sorted(metrics) == [1, 2, 3]

    drawn, trained_uids, filtered = 0, set(), 0
    for step in (1, 2, 3):
        m = metrics[step]
        batch = group_by_prompt(consumed(run_dir, step))
        assert len(batch) == groups and all(len(g) == n for g in batch), step  # full, whole groups
        assert all(keep_group(g, "acc") for g in batch), step
        assert all(len({s.reward for s in g}) > 1 for g in batch), step  # a reward spread in every trained group
        assert m["reward/group_spread_frac"] == 1.0
        uids = {g[0].uid for g in batch}
        assert not uids & trained_uids, step  # no prompt trained twice
        trained_uids |= uids

        ds = {k.removeprefix("dynamic_sampling/"): v for k, v in m.items() if k.startswith("dynamic_sampling/")}
        batches = m["train/num_gen_batches"]
        assert ds["groups_generated"] == batches * gen_batch
        assert ds["groups_generated"] == ds["groups_kept"] + ds["groups_filtered"]
        assert ds["groups_kept"] == ds["groups_trained"] + ds["groups_discarded"] and ds["groups_trained"] == groups
        assert ds["groups_discarded"] < gen_batch  # only the last generation batch's surplus
        filtered += ds["groups_filtered"]

        drawn += batches * gen_batch
        state = load_driver_state(run_dir / "checkpoints" / f"step_{step}")["sampler"] if step >= 2 else None
        if state is not None:  # the two latest are kept: the cursor right after the last prompt drawn for `step`
            assert state["epoch"] * DATA_SIZE + state["position"] == drawn, step
        assert m["staleness/max"] == staleness[step - 1], step
        assert m["reward/overlong_reward_mean"] <= 0 and 0 <= m["reward/overlong_frac"] <= 1
    assert filtered > 0  # the even-answer prompts were dropped
    logged = {k for m in metrics.values() for k in m}
    assert not undocumented_metrics(logged), f"metrics missing from docs/metrics.md: {undocumented_metrics(logged)}"


def test_a_resumed_run_draws_and_trains_what_the_unbroken_run_did(setup, sync_run):
    run_dir = setup[0] / "sync_resumed"
    run_training(load_config(None, dapo_overrides(setup, run_dir, 2)))
    run_training(load_config(None, dapo_overrides(setup, run_dir, 3, "trainer.resume_mode=auto")))
    assert [m["step"] for m in read_metrics(run_dir / "metrics.jsonl")] == [1, 2, 3]
    for step in (1, 2, 3):
        ours = [(s.uid, s.row, s.reward) for s in consumed(run_dir, step)]
        assert ours == [(s.uid, s.row, s.reward) for s in consumed(sync_run, step)], step


def test_rollout_skip_replays_every_generation_batch_of_a_step(setup):
    """``rollout.skip.action=cache`` dumps each generation batch of a step; a second run replays them all, drawing
    the same prompts and training the same groups."""
    dump = setup[0] / "dump"
    skip = ["rollout.skip.enable=true", f"rollout.skip.dump_dir={dump}", "trainer.save_freq=0"]
    first, second = setup[0] / "skip_first", setup[0] / "skip_second"
    run_training(load_config(None, dapo_overrides(setup, first, 2, *skip)))
    batches = [m["train/num_gen_batches"] for m in read_metrics(first / "metrics.jsonl")]
    assert sorted(p.name for p in dump.glob("step_*.pkl")) == sorted(
        f"step_{s}.pkl" if g == 1 else f"step_{s}_gen{g}.pkl"
        for s, b in ((1, batches[0]), (2, batches[1]))
        for g in range(1, int(b) + 1)
    )
    run_training(load_config(None, dapo_overrides(setup, second, 2, *skip)))
    for m in read_metrics(second / "metrics.jsonl"):
        assert m["rollout/skipped"] == 1.0
    for step in (1, 2):
        ours = [(s.uid, s.row, s.reward) for s in consumed(second, step)]
        assert ours == [(s.uid, s.row, s.reward) for s in consumed(first, step)], step


def test_fully_async_drops_each_group_without_a_spread_as_it_finishes_and_the_ledger_accounts_for_it(setup):
    """fully_async filters group by group: a finished group without a reward spread leaves the Rollouter at once (its
    slots already free) and is recorded as filtered; every trained step is full of groups with a spread; every
    prompt issued is trained, filtered or still open (queued or in flight), none lost or trained twice."""
    run_dir = setup[0] / "fully_async"
    over = dapo_overrides(
        setup,
        run_dir,
        3,
        "trainer.schedule=fully_async",
        "algorithm.filter_groups.max_num_gen_batches=0",
        "async_training.staleness_threshold=1.0",
        "async_training.require_batches=2",  # 2 x ppo_mini_batch_size 2 = data.train_batch_size groups a step
        "trainer.save_freq=0",
    )
    summary = run_training(load_config(None, over))
    cfg = load_config(str(run_dir / "config.yaml"))
    groups = cfg.data.train_batch_size
    trained = set()
    for step in (1, 2, 3):
        batch = group_by_prompt(consumed(run_dir, step))
        assert len(batch) == groups and all(len(g) == cfg.rollout.n for g in batch), step
        assert all(keep_group(g, "acc") and len({s.reward for s in g}) > 1 for g in batch), step
        uids = {g[0].uid for g in batch}
        assert not uids & trained, step
        trained |= uids
    counts, ledger = summary["counts"], summary["ledger"]
    assert counts["filtered_groups"] > 0  # the even-answer prompts
    assert counts["consumed_groups"] == 3 * groups
    assert ledger["lost"] == 0 and ledger["duplicated"] == 0 and ledger["filtered"] == counts["filtered_groups"]
    state = json.loads((run_dir / "ledger.json").read_text())["ledger"]
    issued = sum(row[2] for row in state["records"])
    closed = sum(row[5] + row[8] for row in state["records"])  # consumed + filtered
    assert issued == closed + len(state["open"])  # every issued group: trained, filtered, or still open
    assert {parse_group_id(g)[:2] for g in state["open"]}.isdisjoint(
        {(int(u.split(":")[0]), int(u.split(":")[1])) for u in trained}
    )
