"""The fully_async protocol, run as the real producer runs it: ``Producer.step`` (admission, one batched decode of
every unfinished row, queueing in start order), ``take`` (the trainer's batches), ``on_sync``, ``snapshot`` and
``restore`` (a kill -9 of the run resumed from its checkpoint; a dead Rollouter taken over mid-run) are the code the
Rollouter and the driver run. Only the engine is scripted, on a virtual clock: a decode call continues every row by
at most ``chunk`` tokens (its scripted response length decides when it ends; some rows are a long tail), so
generation and training interleave at any speeds without threads or wall time.

Whatever the speeds: every consumed group is within the staleness bound (the controller's count and the versions the
rows recorded agree), and every prompt of every epoch is trained on exactly once (with ``drop_policy=oldest``: once
or dropped, counted).
"""

from __future__ import annotations

import copy
import random
from dataclasses import dataclass, field, replace

from hypothesis import given, settings
from hypothesis import strategies as st

from asyncrl.data.sampler import EpochSampler
from asyncrl.schedules.fully_async.ledger import parse_group_id
from asyncrl.schedules.fully_async.producer import Producer
from asyncrl.schedules.fully_async.queue import MessageQueue
from asyncrl.schedules.fully_async.recovery import ConsumedBatch, RollouterSnapshot, Takeover
from asyncrl.schedules.fully_async.staleness import StalenessBudget
from asyncrl.types import Prompt, Sample

N = 2  # rows per group


@dataclass(frozen=True)
class Scenario:
    budget: StalenessBudget
    num_prompts: int
    epochs: int
    max_groups: int  # the producer's decode batch, in groups
    capacity: int  # the queue, in groups
    drop_policy: str
    chunk: int  # tokens a decode call advances each row by
    tail_prob: float  # share of rows whose response is 10x longer
    token_s: float  # virtual seconds per decoded token position
    train_s: float  # virtual seconds per update
    kill_after_update: int | None  # checkpoint at the sync after this update, kill -9 later, resume from it
    takeover_after_update: int | None  # the Rollouter dies after this update; a replacement takes over

    @property
    def total_updates(self) -> int:
        return self.num_prompts * self.epochs // self.budget.groups_per_update


@st.composite
def scenarios(draw, drop_policy: str = "backpressure"):
    budget = StalenessBudget(
        require_batches=draw(st.integers(1, 3)),
        ppo_mini_batch_size=draw(st.integers(1, 2)),
        trigger_parameter_sync_step=draw(st.integers(1, 3)),
        staleness_threshold=draw(st.sampled_from([0, 0.5, 1, 2])),
    )
    b, m = budget.groups_per_update, budget.groups_per_window_budget
    num_prompts = b * draw(st.integers(2, 4))
    epochs = draw(st.integers(1, 2))
    total = num_prompts * epochs // b
    fault = draw(st.sampled_from(["none", "kill", "takeover"]))
    after = draw(st.integers(1, total - 1))
    return Scenario(
        budget=budget,
        num_prompts=num_prompts,
        epochs=epochs,
        max_groups=draw(st.integers(1, 2 * m)),
        capacity=draw(st.integers(b, m)),  # below the window's budget the queue can fill and push back (or drop)
        drop_policy=drop_policy,
        chunk=draw(st.sampled_from([2, 8, 64])),
        tail_prob=draw(st.sampled_from([0.0, 0.3])),
        token_s=draw(st.sampled_from([0.001, 0.1, 1.0])),
        train_s=draw(st.sampled_from([0.01, 1.0, 10.0])),
        kill_after_update=after if fault == "kill" else None,
        takeover_after_update=after if fault == "takeover" else None,
    )


class ScriptedDecode:
    """The engine: every row has a scripted response length (a hash of its prompt and group); a call continues each
    row by up to ``chunk`` tokens with the current ``version`` and takes ``chunk x token_s`` virtual seconds."""

    def __init__(self, sc: Scenario, seed: int):
        self.sc, self.seed, self.version, self.spent = sc, seed, 0, 0.0

    def length(self, s: Sample, row: int) -> int:
        rng = random.Random(f"{self.seed}:{s.prompt.epoch}:{s.prompt.index}:{s.start_version}:{row}")
        n = rng.randint(1, 6)
        return n * 10 if rng.random() < self.sc.tail_prob else n

    def __call__(self, rows: list[Sample]) -> list[Sample]:
        out = []
        for k, s in enumerate(rows):
            want = self.length(s, k % N)
            new = min(self.sc.chunk, want - len(s.response_ids))
            ids = s.response_ids + [1] * new
            reason = "eos" if len(ids) >= want else "interrupted"
            out.append(replace(s, response_ids=ids, logprobs=s.logprobs + [0.0] * new,
                               versions=s.versions + [self.version] * new, stop_reason=reason))  # fmt: skip
        self.spent += self.sc.chunk * self.sc.token_s
        return out


@dataclass
class Run:
    """The driver's side: the trainer's version and what it consumed, in order, with the staleness it saw."""

    sc: Scenario
    seed: int
    version: int = 0
    updates: int = 0
    consumed: list[tuple[str, int, int]] = field(default_factory=list)  # (group id, staleness, recorded staleness)
    since_base: list[ConsumedBatch] = field(default_factory=list)
    base: RollouterSnapshot | None = None
    checkpoint: tuple | None = None

    def producer(self) -> Producer:
        sc = self.sc
        sampler = EpochSampler(sc.num_prompts, 1, seed=self.seed, shuffle=True)
        queue = MessageQueue(sc.capacity, sc.drop_policy)
        prompt = lambda epoch, index: Prompt(index, [5, 6, index], "task", "0")  # noqa: E731
        return Producer(sc.budget, queue, sampler, prompt, N, sc.max_groups, clock=lambda: 0.0)


def run(sc: Scenario, seed: int) -> tuple[Run, Producer]:
    r = Run(sc, seed)
    producer, engine = r.producer(), ScriptedDecode(sc, seed)
    r.base = producer.snapshot(0, 0)
    t_gen = t_train = 0.0  # when the producer's next turn and the trainer's next update may start
    killed = taken_over = False
    for _ in range(100_000):
        if r.updates >= sc.total_updates:
            break
        if t_gen <= t_train:
            engine.spent = 0.0
            busy = producer.step(engine)
            t_gen += engine.spent if busy else max(t_train - t_gen, sc.token_s)
            continue
        got = producer.take(sc.budget.groups_per_update, r.version, timeout_s=0)
        if got is None:  # the trainer waits for the producer
            t_train = t_gen + 1e-9
            continue
        for g, st_ in zip(got.groups, got.staleness):
            recorded = max(r.version - s.start_version for s in g.samples)
            r.consumed.append((g.group_id, st_, recorded))
        r.since_base.append(ConsumedBatch(got.groups, r.version))
        r.updates += 1
        t_train += sc.train_s
        if r.updates % sc.budget.trigger_parameter_sync_step == 0:  # a sync: the producer parks, takes v + 1
            r.version = engine.version = r.version + 1
            producer.controller.on_sync(r.version)
            r.base, r.since_base = producer.snapshot(0, r.version), []
            if sc.kill_after_update is not None and r.updates >= sc.kill_after_update and r.checkpoint is None:
                r.checkpoint = (copy.deepcopy(r.base), r.updates, r.version, len(r.consumed))
        if sc.kill_after_update is not None and not killed and r.checkpoint and r.updates >= sc.total_updates - 1:
            killed = True  # kill -9 late in the run: everything after the checkpoint is lost, the run resumes
            snap, r.updates, r.version, n = r.checkpoint
            del r.consumed[n:]
            producer, engine = r.producer(), ScriptedDecode(sc, seed)
            engine.version = r.version
            producer.restore(Takeover(copy.deepcopy(snap), [], r.version))
            r.base, r.since_base = copy.deepcopy(snap), []
        if sc.takeover_after_update == r.updates and not taken_over:
            taken_over = True  # the Rollouter dies; a new one restores the last snapshot + what was consumed since
            producer, engine = r.producer(), ScriptedDecode(sc, seed)
            engine.version = r.version
            assert r.base is not None
            producer.restore(Takeover(r.base, r.since_base, r.version))
    else:
        raise AssertionError(f"stalled after {r.updates} updates: {producer.controller.metrics()}")
    return r, producer


def check_bound(r: Run, budget: StalenessBudget) -> None:
    for gid, counted, recorded in r.consumed:
        assert 0 <= counted <= budget.max_staleness, (gid, counted, budget)
        assert counted == recorded, (gid, counted, recorded)  # the controller's count is the rows' own versions


def check_exactly_once(r: Run, producer: Producer, drops: bool) -> None:
    """No group consumed twice; in every epoch the producer has moved past, each prompt was consumed once, or
    dropped (``drops``), or is still open (in flight or queued: groups finish out of start order), never lost."""
    consumed = [gid for gid, _, _ in r.consumed]
    assert len(consumed) == len(set(consumed)) == r.sc.num_prompts * r.sc.epochs
    keys = [parse_group_id(g)[:2] for g in consumed]
    assert len(keys) == len(set(keys)), "a prompt of an epoch was trained on twice"
    for epoch in range(max(e for e, _ in keys)):
        report = producer.ledger.verify_epoch(epoch, r.sc.num_prompts)
        assert report.duplicated == [] and report.lost == [], report.summary()
        assert drops or report.dropped == [], report.summary()
        assert report.consumed_once + len(report.dropped) + len(report.open) == r.sc.num_prompts, report.summary()


@settings(derandomize=True, max_examples=60, deadline=None)
@given(sc=scenarios(), seed=st.integers(0, 2**16))
def test_bound_holds_and_every_prompt_is_trained_on_exactly_once(sc, seed):
    r, producer = run(sc, seed)
    check_bound(r, sc.budget)
    check_exactly_once(r, producer, drops=False)


@settings(derandomize=True, max_examples=30, deadline=None)
@given(sc=scenarios(drop_policy="oldest"), seed=st.integers(0, 2**16))
def test_with_drop_oldest_every_prompt_is_consumed_or_dropped_once(sc, seed):
    r, producer = run(sc, seed)
    check_bound(r, sc.budget)
    check_exactly_once(r, producer, drops=True)
