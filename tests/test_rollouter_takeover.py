"""A replacement Rollouter takes over from a dead one (``asyncrl.schedules.fully_async.recovery``): real Rollouters
with a real model, driven as the fully_async driver drives them, the first one dropped mid-stream as if its process
died.

The evidence is the driver's own record of what it consumed (each prompt of the epoch exactly once, every group
within the staleness bound) and the replacement's ledger, which must agree with it.
"""

from __future__ import annotations

import random
from collections import Counter

import pytest

from asyncrl.config import load_config
from asyncrl.schedules import specs_for
from asyncrl.schedules.fully_async.ledger import parse_group_id
from asyncrl.schedules.fully_async.recovery import ConsumedBatch, Takeover, advance
from asyncrl.schedules.fully_async.rollouter import Rollouter
from asyncrl.schedules.fully_async.slots import budget_of
from tests.helpers import make_data, make_model, train_overrides

PROMPTS = 10


@pytest.fixture(scope="module")
def cfg(tmp_path_factory):
    root = tmp_path_factory.mktemp("takeover")
    train, test = make_data(root, size=PROMPTS, test_size=4)
    over = train_overrides(make_model(root, train), train, test, root / "run", 1)
    over += [
        "trainer.schedule=fully_async",
        "actor.ppo_mini_batch_size=1",  # one group per update, one update per version
        "async_training.staleness_threshold=1.0",  # max staleness 1: groups run ahead of the trainer
        "async_training.max_inflight_groups=2",
        "async_training.partial_rollout=true",
        "rollout.response_length=12",
        "data.shuffle=true",
    ]
    return load_config(None, over)


class Driver:
    """What ``run_fully_async`` does with a Rollouter, minus the training: take a batch, sync a new version
    (interrupting the decode), snapshot at chosen syncs, and keep what was consumed since the last snapshot."""

    def __init__(self, cfg):
        self.cfg, self.version = cfg, 0
        self.taken: list[tuple[str, int, int]] = []  # (group id, start version, trainer version), every batch
        self.base = None
        self.since: list[ConsumedBatch] = []
        self.weights = None

    def start(self, takeover: Takeover | None = None) -> Rollouter:
        ro = Rollouter(specs_for(self.cfg).rollouter, num_threads=1)
        if self.weights is None:
            self.weights = ro.engine.state_dict_for_sync()
        ro.engine.update_weights(self.weights, version=self.version)
        if takeover is not None:
            ro.restore(takeover)
        self.base, self.since = ro.snapshot(), []
        ro.start()
        return ro

    def step(self, ro: Rollouter, snapshot: bool) -> None:
        got = ro.get_batch(1, self.version)
        self.taken += [(g.group_id, g.start_version, self.version) for g in got.groups]
        self.since.append(ConsumedBatch(got.groups, self.version))
        self.version += 1
        ro.pause(interrupt=True)
        ro.engine.update_weights(self.weights, version=self.version)
        if snapshot:
            self.base, self.since = ro.snapshot(), []
        ro.resume_generation(self.version)

    def finish_epoch(self, ro: Rollouter):  # noqa: ANN201 - an EpochReport
        """Consume the rest of the epoch from ``ro``, stop it, and return its ledger's report of the epoch."""
        try:
            while len(self.taken) < PROMPTS:
                self.step(ro, snapshot=False)
            return ro.books.ledger.verify_epoch(0, PROMPTS)
        finally:
            ro.stop()

    def takeover(self, dead: Rollouter) -> Rollouter:
        dead.stop()  # its books die with it: nothing of it is read below
        return self.start(Takeover(self.base, self.since, self.version))


@pytest.mark.parametrize("seed", range(3))
def test_a_replacement_rollouter_loses_and_repeats_no_prompt(cfg, seed):
    rng = random.Random(seed)
    d = Driver(cfg)
    ro = d.start()
    deaths = sorted(rng.sample(range(1, PROMPTS - 1), 2))  # two takeovers: the second replays the first's skips
    try:
        for i in range(PROMPTS):
            if i in deaths:
                ro = d.takeover(ro)
            d.step(ro, snapshot=rng.random() < 0.4)
        ledger = ro.ledger_state()
        report = ro.books.ledger.verify_epoch(0, PROMPTS)
    finally:
        ro.stop()
    prompts = Counter(parse_group_id(g)[:2] for g, _, _ in d.taken)
    assert sorted(prompts) == [(0, i) for i in range(PROMPTS)] and set(prompts.values()) == {1}
    assert all(trained - start <= 1 for _, start, trained in d.taken)  # max_staleness = ceil(1.0) = 1
    assert report.exactly_once, report.summary()
    # a record row: [epoch, index, issued, generated, queued, consumed, ...]
    consumed = {(row[0], row[1]): row[5] for row in ledger["records"]}
    assert all(consumed[(0, i)] == 1 for i in range(PROMPTS))


def test_a_takeover_right_after_a_snapshot_and_one_with_nothing_consumed_since(cfg):
    d = Driver(cfg)
    ro = d.start()
    try:
        d.step(ro, snapshot=True)
        ro = d.takeover(ro)  # nothing consumed since the base
        d.step(ro, snapshot=False)
        d.step(ro, snapshot=False)
        ro = d.takeover(ro)  # two batches to replay, the prompts issued after the base included
    except BaseException:
        ro.stop()
        raise
    report = d.finish_epoch(ro)
    assert report.exactly_once, report.summary()
    assert len({g for g, _, _ in d.taken}) == PROMPTS


def test_the_advanced_snapshot_resumes_like_a_checkpoint_of_the_dead_rollouter(cfg):
    """Past the restart budget no replacement starts: the driver checkpoints ``advance(...)`` instead, and a resumed
    run restores it as a plain snapshot (at the checkpoint's version) and loses and repeats nothing."""
    d = Driver(cfg)
    ro = d.start()
    try:
        d.step(ro, snapshot=True)
        for _ in range(3):
            d.step(ro, snapshot=False)  # consumed since the base: queued, in flight and issued after it
    finally:
        ro.stop()  # dead; the restart budget is spent
    budget = budget_of(cfg.async_training, cfg.actor.ppo_mini_batch_size)
    checkpoint = advance(Takeover(d.base, d.since, d.version), budget)
    assert checkpoint.engine_version == d.version and checkpoint.skip  # prompts issued after the base, consumed
    d.base, d.since = None, []
    resumed = Rollouter(specs_for(cfg).rollouter, num_threads=1)
    resumed.engine.update_weights(d.weights, version=d.version)
    resumed.restore(checkpoint)
    resumed.start()
    report = d.finish_epoch(resumed)
    assert report.exactly_once, report.summary()
    prompts = Counter(parse_group_id(g)[:2] for g, _, _ in d.taken)
    assert set(prompts.values()) == {1} and len(prompts) == PROMPTS


def test_a_takeover_that_does_not_fit_the_books_is_refused(cfg):
    d = Driver(cfg)
    ro = d.start()
    try:
        d.step(ro, snapshot=False)
        twice = d.since + d.since  # the same batch consumed twice
        ro.stop()
        new = Rollouter(specs_for(cfg).rollouter, num_threads=1)
        new.engine.update_weights(d.weights, version=d.version + 1)
        with pytest.raises(ValueError, match="not live|version"):
            new.restore(Takeover(d.base, twice, d.version + 1))
        older = Rollouter(specs_for(cfg).rollouter, num_threads=1)
        older.engine.update_weights(d.weights, version=d.version)
        with pytest.raises(Exception, match="engine holds"):
            older.restore(Takeover(d.base, d.since, d.version + 1))
    finally:
        ro.stop()
