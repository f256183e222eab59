"""The staleness bound and exactly-once accounting hold for any speeds, with and without a kill -9 and resume."""

from collections import Counter

from hypothesis import given, settings
from hypothesis import strategies as st

from asyncrl.streaming import SimConfig, StalenessBudget, simulate

DURATIONS = [(0.01, 0.02), (0.5, 1.5), (5.0, 10.0)]  # seconds: very fast, comparable, very slow


@st.composite
def scenarios(draw, drop_policy: str = "block"):
    budget = StalenessBudget(
        require_batches=draw(st.integers(1, 3)),
        ppo_mini_batch_size=draw(st.integers(1, 2)),
        trigger_parameter_sync_step=draw(st.integers(1, 4)),
        staleness_threshold=draw(st.sampled_from([0, 0.25, 0.5, 1, 2])),
    )
    b, m = budget.groups_per_update, budget.groups_per_window_budget
    num_prompts = b * draw(st.integers(2, 6))
    epochs = draw(st.integers(1, 3))
    total_updates = num_prompts * epochs // b
    return SimConfig(
        budget=budget,
        num_prompts=num_prompts,
        epochs=epochs,
        max_in_flight=draw(st.integers(1, 3 * m)),
        queue_capacity=draw(st.integers(b, m)),  # below M the queue can fill up and push back (or drop)
        drop_policy=drop_policy,
        gen_seconds=draw(st.sampled_from(DURATIONS)),
        tail_prob=draw(st.sampled_from([0.0, 0.2])),
        tail_factor=draw(st.sampled_from([5.0, 50.0])),
        train_seconds=draw(st.sampled_from(DURATIONS)),
        sync_seconds=draw(st.sampled_from([0.0, 0.3, 3.0])),
        checkpoint_after_update=draw(st.none() | st.integers(1, total_updates - 1)),
        kill_after_seconds=draw(st.floats(0.0, 20.0)),
    )


def _check_staleness(result, budget: StalenessBudget) -> None:
    w = budget.groups_per_version
    for position, c in enumerate(result.consumed):
        assert c.consume_version == position // w  # version = updates // K, B groups per update
        assert 0 <= c.staleness <= budget.max_staleness, (position, c)


@settings(derandomize=True, max_examples=80, deadline=None)
@given(config=scenarios(), seed=st.integers(0, 2**16))
def test_bound_holds_and_every_prompt_is_trained_on_exactly_once(config, seed):
    result = simulate(config, seed)

    _check_staleness(result, config.budget)
    assert len(result.consumed) == config.num_prompts * config.epochs and result.dropped == []
    assert Counter((c.epoch, c.index) for c in result.consumed) == Counter(
        {(e, i): 1 for e in range(config.epochs) for i in range(config.num_prompts)}
    )
    for epoch in range(config.epochs):
        report = result.ledger.verify_epoch(epoch, config.num_prompts)
        assert report.exactly_once, report.summary()
    assert result.restored == (config.checkpoint_after_update is not None)
    assert result.ledger.open_groups() == {} and len(result.queue) == 0


@settings(derandomize=True, max_examples=40, deadline=None)
@given(config=scenarios(drop_policy="oldest"), seed=st.integers(0, 2**16))
def test_with_drop_oldest_every_issued_prompt_is_consumed_dropped_or_still_open(config, seed):
    result = simulate(config, seed)

    _check_staleness(result, config.budget)
    consumed = Counter(c.group_id for c in result.consumed)
    assert max(consumed.values()) == 1 and not set(consumed) & set(result.dropped)
    assert result.queue.dropped_count == len(result.dropped)
    open_groups = result.ledger.open_groups()
    last_epoch = max(int(g.split(":")[0]) for g in [*consumed, *result.dropped, *open_groups])
    for epoch in range(last_epoch + 1):
        report = result.ledger.verify_epoch(epoch, config.num_prompts)
        assert report.duplicated == [] and report.lost == [], report.summary()
        assert sorted(report.dropped) == sorted(
            int(g.split(":")[1].split("#")[0]) for g in result.dropped if g.startswith(f"{epoch}:")
        )


def test_fast_rollout_and_slow_trainer_reach_but_never_exceed_the_bound():
    budget = StalenessBudget(1, 2, 2, 1.0)  # W = 4, M = 8, max_staleness 1
    config = SimConfig(
        budget=budget, num_prompts=16, epochs=2, max_in_flight=16, gen_seconds=(0.01, 0.02), train_seconds=(5, 10)
    )
    result = simulate(config, seed=3)
    assert max(c.staleness for c in result.consumed) == budget.max_staleness


def test_threshold_zero_trains_strictly_on_policy_whatever_the_speeds():
    for gen, train in [((0.01, 0.02), (5, 10)), ((5, 10), (0.01, 0.02))]:
        config = SimConfig(
            budget=StalenessBudget(2, 1, 3, 0.0), num_prompts=12, epochs=2, gen_seconds=gen, train_seconds=train
        )
        assert {c.staleness for c in simulate(config, seed=1).consumed} == {0}


def test_a_kill_after_a_checkpoint_reissues_in_flight_prompts_and_loses_nothing():
    config = SimConfig(
        budget=StalenessBudget(1, 2, 1, 1.0),
        num_prompts=12,
        epochs=1,
        max_in_flight=8,
        gen_seconds=(0.5, 3.0),
        train_seconds=(0.1, 0.2),
        checkpoint_after_update=2,
        kill_after_seconds=1.0,
    )
    result = simulate(config, seed=7)
    assert result.restored and result.abandoned  # something was in flight at the checkpoint
    for gid in result.abandoned:
        epoch, index = map(int, gid.split("#")[0].split(":"))
        assert result.ledger.record(epoch, index).consumed == 1
    assert result.ledger.verify_epoch(0, 12).exactly_once


def test_same_seed_same_schedule():
    config = SimConfig(budget=StalenessBudget(1, 2, 2, 0.5), num_prompts=8, gen_seconds=(0.1, 3), tail_prob=0.3)
    assert simulate(config, seed=5).consumed == simulate(config, seed=5).consumed
