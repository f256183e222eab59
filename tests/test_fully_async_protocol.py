"""The fully_async protocol, run by the performance model's simulator (``asyncrl.planning.simulate``),
which drives the real producer: ``Producer.to_decode`` / ``finish_decode`` / ``put_finished`` (admission, one
batched decode of every unfinished row, queueing in start order), ``take`` (the trainer's batches), ``on_sync``,
``snapshot`` and ``restore`` (a kill -9 of the run resumed from its checkpoint; a dead Rollouter taken over mid-run)
are the code the Rollouter and the driver run. Only the engine and the trainer are priced, on a virtual clock: a
decode call runs until its rows end (their lengths drawn per group; some groups a long tail; batched as the
built-in engine or as vLLM does), a refill cut or a pause (partial rollout) stops it early, so generation and
training interleave at any speeds without threads or wall time.

Whatever the speeds: every consumed group is within the staleness bound (the controller's count and the versions the
rows recorded agree), and every prompt of every epoch is trained on exactly once (with ``drop_policy=oldest``: once
or dropped, counted).
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from hypothesis import given, settings
from hypothesis import strategies as st

from asyncrl.planning.cost import CostModel, Term
from asyncrl.planning.simulate import Cluster, Fault, Setting, Sim
from asyncrl.schedules.fully_async.ledger import parse_group_id
from asyncrl.schedules.fully_async.staleness import StalenessBudget

N = 2  # rows per group


@dataclass(frozen=True)
class Scenario:
    budget: StalenessBudget
    num_prompts: int
    epochs: int
    max_groups: int  # the producer's decode batch, in groups
    capacity: int  # the queue, in groups
    drop_policy: str
    partial_rollout: bool
    tail_prob: float  # share of groups whose responses are 10x longer
    token_s: float  # virtual seconds per decode step
    train_s: float  # virtual seconds per update
    fault: Fault | None
    engine: str = "builtin"  # vllm: continuous batching, max_num_seqs rows at a time
    max_num_seqs: int = 0

    @property
    def total_updates(self) -> int:
        return self.num_prompts * self.epochs // self.budget.groups_per_update


@st.composite
def scenarios(draw, drop_policy: str = "backpressure", rule: str = "exact"):
    budget = StalenessBudget(
        require_batches=draw(st.integers(1, 3)),
        ppo_mini_batch_size=draw(st.integers(1, 2)),
        trigger_parameter_sync_step=draw(st.integers(1, 3)),
        staleness_threshold=draw(st.sampled_from([0, 0.5, 1, 2])),
        rule=rule,
    )
    b, m = budget.groups_per_update, budget.groups_per_window_budget
    num_prompts = b * draw(st.integers(2, 4))
    epochs = draw(st.integers(1, 2))
    total = num_prompts * epochs // b
    kind = draw(st.sampled_from(["none", "kill", "takeover"]))
    after = draw(st.integers(1, total - 1))
    return Scenario(
        budget=budget,
        num_prompts=num_prompts,
        epochs=epochs,
        max_groups=draw(st.integers(1, 2 * m)),
        capacity=draw(st.integers(b, m)),  # below the window's budget the queue can fill and push back (or drop)
        drop_policy=drop_policy,
        partial_rollout=draw(st.booleans()),
        tail_prob=draw(st.sampled_from([0.0, 0.3])),
        token_s=draw(st.sampled_from([0.001, 0.1, 1.0])),
        train_s=draw(st.sampled_from([0.01, 1.0, 10.0])),
        fault=None if kind == "none" else Fault(kind, after),
        engine=draw(st.sampled_from(["builtin", "vllm"])),
        max_num_seqs=draw(st.sampled_from([0, 1, 3])),
    )


def cost_of(sc: Scenario, seed: int) -> CostModel:
    """A cost model whose decode step costs ``token_s`` and whose update ``train_s``; groups of N rows of 1-6
    tokens, ``tail_prob`` of them 10x longer."""
    rng = random.Random(seed)
    groups = []
    for _ in range(64):
        tail = rng.random() < sc.tail_prob
        groups.append((3, tuple(rng.randint(1, 6) * (10 if tail else 1) for _ in range(N))))
    zero = Term(("call",), (0.0,))
    return CostModel(
        source="test", schedule="sync", prompts_per_step=sc.budget.groups_per_update, n=N, max_batch_size=64,
        max_new_tokens=60, ppo_mini_batch_size=sc.budget.ppo_mini_batch_size, groups=tuple(groups), update_keep=1.0,
        shared_prefix=True, device="cuda", cores=2, gen_threads=1, train_threads=1, weight_bytes=0,
        decode=Term(("call", "step", "token", "prefill_token"), (0.0, sc.token_s, 0.0, 0.0)),
        update=Term(("call", "token"), (sc.train_s, 0.0)), train_other=Term(("call", "token"), (0.0, 0.0)),
        prepare=zero, reward=Term(("row",), (0.0,)), step_other=zero, engine=sc.engine, max_num_seqs=sc.max_num_seqs,
    )  # fmt: skip


def run(sc: Scenario, seed: int) -> Sim:
    b = sc.budget
    setting = Setting(
        "fully_async",
        trainer=1,
        rollout=1,
        staleness_threshold=b.staleness_threshold,
        staleness_rule=b.rule,
        trigger_parameter_sync_step=b.trigger_parameter_sync_step,
        require_batches=b.require_batches,
        partial_rollout=sc.partial_rollout,
        max_inflight_groups=sc.max_groups,
        max_queue_size=sc.capacity,
        drop_policy=sc.drop_policy,
    )
    sim = Sim(cost_of(sc, seed), Cluster.gpus(2), setting, sc.total_updates, seed, sc.num_prompts, sc.fault)
    sim.run()
    return sim


def check_bound(sim: Sim, budget: StalenessBudget) -> None:
    for gid, counted, recorded in sim.consumed:
        assert 0 <= counted <= budget.max_staleness, (gid, counted, budget)
        assert counted == recorded, (gid, counted, recorded)  # the controller's count is the rows' own versions


def check_exactly_once(sim: Sim, sc: Scenario, drops: bool) -> None:
    """No group consumed twice; in every epoch the producer has moved past, each prompt was consumed once, or
    dropped (``drops``), or is still open (in flight or queued: groups finish out of start order), never lost."""
    consumed = [gid for gid, _, _ in sim.consumed]
    assert len(consumed) == len(set(consumed)) == sc.num_prompts * sc.epochs
    keys = [parse_group_id(g)[:2] for g in consumed]
    assert len(keys) == len(set(keys)), "a prompt of an epoch was trained on twice"
    for epoch in range(max(e for e, _ in keys)):
        report = sim.producer.ledger.verify_epoch(epoch, sc.num_prompts)
        assert report.duplicated == [] and report.lost == [], report.summary()
        assert drops or report.dropped == [], report.summary()
        assert report.consumed_once + len(report.dropped) + len(report.open) == sc.num_prompts, report.summary()


@settings(derandomize=True, max_examples=60, deadline=None)
@given(sc=scenarios(), seed=st.integers(0, 2**16))
def test_bound_holds_and_every_prompt_is_trained_on_exactly_once(sc, seed):
    sim = run(sc, seed)
    check_bound(sim, sc.budget)
    check_exactly_once(sim, sc, drops=False)
    if sc.fault is not None and sc.fault.kind == "takeover":
        assert sim.faulted, "the takeover did not happen"


@settings(derandomize=True, max_examples=30, deadline=None)
@given(sc=scenarios(drop_policy="oldest"), seed=st.integers(0, 2**16))
def test_with_drop_oldest_every_prompt_is_consumed_or_dropped_once(sc, seed):
    sim = run(sc, seed)
    check_bound(sim, sc.budget)
    check_exactly_once(sim, sc, drops=True)


@settings(derandomize=True, max_examples=30, deadline=None)
@given(sc=scenarios(rule="budget"), seed=st.integers(0, 2**16))
def test_the_budget_rule_keeps_every_prompt_exactly_once_and_counts_staleness_truly(sc, seed):
    """verl's admission (``staleness_rule=budget``): no per-group bound, but every prompt is trained on exactly once
    and the controller's staleness is the rows' own versions, as under the exact rule."""
    sim = run(sc, seed)
    check_exactly_once(sim, sc, drops=False)
    for gid, counted, recorded in sim.consumed:
        assert 0 <= counted == recorded, (gid, counted, recorded)
    if sc.budget.staleness_threshold == 0:  # a window's budget of W: nothing is ever overtaken across versions
        check_bound(sim, sc.budget)


def test_partial_rollout_interrupts_rows_and_they_finish_under_the_next_version():
    """With long responses, a slow decode and fast updates, a sync lands mid-decode: partial rollout interrupts the
    rows, they resume with the new weights (two versions in one response), and the bound still holds."""
    budget = StalenessBudget(require_batches=1, ppo_mini_batch_size=2, trigger_parameter_sync_step=1,
                             staleness_threshold=1)  # fmt: skip
    sc = Scenario(budget, 16, 1, 4, 4, "backpressure", True, 1.0, 1.0, 1.0, None)
    sim = run(sc, 0)
    check_bound(sim, budget)
    check_exactly_once(sim, sc, drops=False)
    assert sim.partial > 0
    assert sim.producer.counts["interrupted_rows"] > 0
    without = run(Scenario(budget, 16, 1, 4, 4, "backpressure", False, 1.0, 1.0, 1.0, None), 0)
    assert without.partial == 0 and without.producer.counts["interrupted_rows"] == 0
