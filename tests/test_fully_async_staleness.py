"""StalenessController: the admission rule and the consumption pick by hand, a long-tail group taken by its deadline,
and exact resume."""

import json
import threading

import pytest

from asyncrl.schedules.fully_async.staleness import (
    AdmissionRefused,
    StalenessBudget,
    StalenessController,
    StalenessViolation,
)


def _start(ctl: StalenessController, *ids: str) -> list[int]:
    return [ctl.on_start(g) for g in ids]


def _queue(ctl: StalenessController, *ids: str) -> None:
    for g in ids:
        ctl.on_queued(g)


@pytest.mark.parametrize(
    ("require_batches", "mini", "k", "s", "w", "m", "max_staleness"),
    [
        (1, 2, 2, 0.0, 4, 4, 0),
        (1, 2, 2, 0.25, 4, 5, 1),
        (1, 2, 2, 0.5, 4, 6, 1),
        (1, 2, 2, 1.0, 4, 8, 1),
        (1, 2, 2, 2.0, 4, 12, 2),
        (1, 1, 2, 0.25, 2, 2, 0),  # floor(2 * 0.25) = 0 extra groups: on-policy
        (3, 1, 1, 0.5, 3, 4, 1),
        (1, 100, 1, 0.29, 100, 129, 1),  # 0.29 read as a decimal: floor(100 * 0.29) = 29, not 28
    ],
)
def test_budget_derives_window_size_and_max_staleness(require_batches, mini, k, s, w, m, max_staleness):
    b = StalenessBudget(require_batches, mini, k, s)
    assert (b.groups_per_version, b.groups_per_window_budget, b.max_staleness) == (w, m, max_staleness)


def test_budget_errors_name_the_knob():
    with pytest.raises(ValueError, match=r"staleness_threshold must be >= 0 \(got -1\)"):
        StalenessBudget(staleness_threshold=-1)
    with pytest.raises(ValueError, match=r"trigger_parameter_sync_step must be an integer >= 1 \(got 0\)"):
        StalenessBudget(trigger_parameter_sync_step=0)
    with pytest.raises(ValueError, match="staleness_threshold"):
        StalenessBudget(staleness_threshold=float("inf"))


def test_threshold_zero_is_on_policy_within_a_window():
    # B = 1 group per update, K = 2 updates per version: W = M = 2, max_staleness = 0.
    ctl = StalenessController(StalenessBudget(1, 1, 2, 0.0))
    assert _start(ctl, "a", "b") == [0, 0]
    assert not ctl.can_start()  # a third group could only be consumed at version 1
    _queue(ctl, "a", "b")
    assert ctl.on_consumed(["a"], trainer_version=0) == [0]
    assert not ctl.can_start()  # one group consumed, but the window is not over: still no new version
    assert ctl.on_consumed(["b"], trainer_version=0) == [0]
    assert ctl.trainer_version == 1 and not ctl.can_start()  # weights not pushed yet
    ctl.on_sync(1)
    assert _start(ctl, "c", "d") == [1, 1]
    assert not ctl.can_start()
    with pytest.raises(AdmissionRefused, match="cannot start group 'e'"):
        ctl.on_start("e")


def test_threshold_one_lets_the_rollouter_run_one_window_ahead():
    # B = 2, K = 1: W = 2, M = 2 + 2 = 4, max_staleness = 1.
    ctl = StalenessController(StalenessBudget(1, 2, 1, 1.0))
    assert _start(ctl, "a", "b", "c", "d") == [0, 0, 0, 0]
    assert ctl.admission_limit() == 4 and not ctl.can_start()
    _queue(ctl, "a", "b", "c", "d")
    assert ctl.on_consumed(["a", "b"], trainer_version=0) == [0, 0]
    ctl.on_sync(1)
    assert ctl.admission_limit() == 6  # budget (a): 1 * 2 + 4; (b) allows (1 + 1 + 1) * 2 = 6 too
    assert _start(ctl, "e", "f") == [1, 1]
    assert not ctl.can_start()
    _queue(ctl, "e", "f")
    assert ctl.on_consumed(["c", "d"], trainer_version=1) == [1, 1]  # one version stale: allowed
    assert ctl.trainer_version == 2
    assert ctl.on_consumed(["e", "f"], trainer_version=2) == [1, 1]


def test_a_long_tail_group_due_now_makes_the_trainer_wait_for_it_and_is_taken_first():
    # Same budget as above (W = 2, M = 4, S = 1). "slow" starts at version 0 and is still generating at version 1,
    # its deadline: the admission no longer waits for it (verl's budget, limit 6), the consumption does.
    ctl = StalenessController(StalenessBudget(1, 2, 1, 1.0))
    _start(ctl, "slow", "b", "c", "d")
    _queue(ctl, "b", "c", "d")
    fifo = [("b", 0), ("c", 0), ("d", 0)]
    assert ctl.pick(fifo, trainer_version=0) == [0, 1]  # leaves slow and d, both due at 1: 2 positions left there
    ctl.on_consumed(["b", "c"], trainer_version=0)
    ctl.on_sync(1)
    assert ctl.admission_limit() == 6 and ctl.can_start()
    assert _start(ctl, "e", "f") == [1, 1]
    _queue(ctl, "e", "f")
    # d and e would leave slow behind past its deadline (version 1 has no position left after them): wait
    assert ctl.pick([("d", 0), ("e", 1), ("f", 1)], trainer_version=1) is None
    ctl.on_queued("slow")
    got = ctl.pick([("d", 0), ("e", 1), ("f", 1), ("slow", 0)], trainer_version=1)
    assert got == [0, 3]  # the earliest deadlines, in queue order
    assert ctl.on_consumed(["d", "slow"], trainer_version=1) == [1, 1]
    assert ctl.on_consumed(["e", "f"], trainer_version=2) == [1, 1]
    assert ctl.metrics()["fully_async/max_seen_staleness"] == 1.0


def test_pick_refuses_a_batch_a_version_out_of_step():
    ctl = StalenessController(StalenessBudget(1, 1, 1, 1.0))
    _start(ctl, "a")
    with pytest.raises(ValueError, match="trainer reports version 1, its consumption says 0"):
        ctl.pick([("a", 0)], trainer_version=1)
    assert ctl.pick([], trainer_version=0) is None  # fewer candidates than an update takes


def test_the_budget_rule_admits_past_a_long_tail_group_and_reports_how_stale_it_ends():
    # The scene above under staleness_rule=budget (verl's): the trainer takes the queue FIFO, so the 2 younger groups
    # finish first and push "slow" to version 2: staleness 2 > max_staleness 1, recorded instead of refused.
    ctl = StalenessController(StalenessBudget(1, 2, 1, 1.0, rule="budget"))
    _start(ctl, "slow", "b", "c", "d")
    _queue(ctl, "b", "c", "d")
    ctl.on_consumed(["b", "c"], trainer_version=0)
    ctl.on_sync(1)
    assert ctl.admission_limit() == 6
    _start(ctl, "e", "f")
    assert not ctl.can_start()  # the window's budget still binds
    _queue(ctl, "e", "f")
    assert ctl.pick([("d", 0), ("e", 1), ("f", 1)], trainer_version=1) == [0, 1]  # FIFO, whatever is generating
    assert ctl.on_consumed(["d", "e"], trainer_version=1) == [1, 0]
    ctl.on_sync(2)
    ctl.on_queued("slow")
    assert ctl.on_consumed(["f", "slow"], trainer_version=2) == [1, 2]
    assert ctl.metrics()["fully_async/max_seen_staleness"] == 2.0
    with pytest.raises(ValueError, match=r"staleness rule must be one of exact, budget \(got 'verl'\)"):
        StalenessBudget(rule="verl")


def test_wait_for_admission_wakes_when_a_sync_frees_budget():
    ctl = StalenessController(StalenessBudget(1, 1, 1, 0.0))
    ctl.on_start("a")
    ctl.on_queued("a")
    assert ctl.wait_for_admission(timeout=0.01) is False
    ctl.on_consumed(["a"], trainer_version=0)
    waiter_saw: list[bool] = []
    waiter = threading.Thread(target=lambda: waiter_saw.append(ctl.wait_for_admission(timeout=5)))
    waiter.start()
    ctl.on_sync(1)
    waiter.join(timeout=5)
    assert waiter_saw == [True] and ctl.can_start() and ctl.on_start("b") == 1


def test_dropped_groups_free_budget():
    ctl = StalenessController(StalenessBudget(1, 2, 1, 0.0))
    _start(ctl, "a", "b")
    ctl.on_queued("a")
    assert not ctl.can_start()
    ctl.on_dropped(["a", "b"])  # one from the queue, one whose generation failed
    assert ctl.live_groups() == 0 and ctl.can_start() and ctl.on_start("c") == 0
    with pytest.raises(ValueError, match="not each queued or in flight"):
        ctl.on_dropped(["a"])


def test_on_consumed_checks_batch_size_version_and_liveness():
    ctl = StalenessController(StalenessBudget(1, 2, 1, 1.0))
    _start(ctl, "a", "b", "c")
    _queue(ctl, "a", "b", "c")
    with pytest.raises(ValueError, match="consumes require_batches \\* ppo_mini_batch_size = 2 groups"):
        ctl.on_consumed(["a"], trainer_version=0)
    with pytest.raises(ValueError, match="trainer reports version 1 but has consumed 0 groups"):
        ctl.on_consumed(["a", "b"], trainer_version=1)
    with pytest.raises(ValueError, match="not live"):
        ctl.on_consumed(["a", "zzz"], trainer_version=0)
    assert ctl.queued() == {"a": 0, "b": 0, "c": 0}  # a refused call changes nothing


def test_consumption_reported_before_on_queued_is_accounted_once():
    ctl = StalenessController(StalenessBudget(1, 1, 1, 0.0))
    ctl.on_start("a")
    assert ctl.on_consumed(["a"], trainer_version=0) == [0]  # the trainer's report overtook the rollouter's
    ctl.on_queued("a")
    assert ctl.live_groups() == 1 and ctl.consumed == 1 and ctl.in_flight() == {} and ctl.queued() == {}


def test_a_reordering_consumer_is_caught_before_training():
    # W = 1, max_staleness = 1. Consuming "c" before "b" (a LIFO queue) pushes "b" to version 2.
    ctl = StalenessController(StalenessBudget(1, 1, 1, 1.0))
    _start(ctl, "a", "b")
    _queue(ctl, "a", "b")
    ctl.on_consumed(["a"], trainer_version=0)
    ctl.on_sync(1)
    _start(ctl, "c")
    _queue(ctl, "c")
    ctl.on_consumed(["c"], trainer_version=1)
    with pytest.raises(StalenessViolation, match="staleness 2 > max_staleness 1"):
        ctl.on_consumed(["b"], trainer_version=2)


def test_state_dict_round_trip_keeps_in_flight_and_queued_groups():
    budget = StalenessBudget(1, 2, 1, 1.0)
    ctl = StalenessController(budget)
    _start(ctl, "slow", "b", "c", "d")
    _queue(ctl, "b", "c", "d")
    ctl.on_consumed(["b", "c"], trainer_version=0)
    ctl.on_sync(1)
    state = json.loads(json.dumps(ctl.state_dict()))

    resumed = StalenessController(budget)
    resumed.load_state_dict(state)
    assert resumed.state_dict() == ctl.state_dict()
    assert resumed.in_flight() == {"slow": 0}  # the resumed Rollouter continues its rows (they are in its snapshot)
    _start(resumed, "e")
    resumed.on_queued("e")
    assert resumed.pick([("d", 0), ("e", 1)], trainer_version=1) is None  # the deadline guard survives the resume
    resumed.on_queued("slow")
    assert resumed.pick([("d", 0), ("e", 1), ("slow", 0)], trainer_version=1) == [0, 2]


def test_load_state_dict_refuses_a_different_budget():
    state = StalenessController(StalenessBudget(1, 2, 1, 1.0)).state_dict()
    with pytest.raises(ValueError, match=r"staleness_threshold=1.0 \(now 0.5\)"):
        StalenessController(StalenessBudget(1, 2, 1, 0.5)).load_state_dict(state)


def test_sync_cannot_go_backwards():
    ctl = StalenessController(StalenessBudget(), version=3)
    with pytest.raises(ValueError, match="version can only grow"):
        ctl.on_sync(2)
