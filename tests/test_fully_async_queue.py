"""MessageQueue: backpressure, counted drops, close, taking chosen groups, snapshot/restore. Threads use short
timeouts."""

import threading

import pytest

from asyncrl.schedules.fully_async.queue import Group, MessageQueue, QueueClosed, QueueSnapshot


def _g(i: int, version: int = 0) -> Group:
    return Group(group_id=f"0:{i}#0", epoch=0, index=i, start_version=version)


def _in_thread(fn):
    """Run ``fn`` in a thread; returns (thread, results list, errors list)."""
    results: list = []
    errors: list = []

    def target():
        try:
            results.append(fn())
        except Exception as e:  # surfaced to the test
            errors.append(e)

    t = threading.Thread(target=target, daemon=True)
    t.start()
    return t, results, errors


def test_put_blocks_while_full_and_resumes_when_the_trainer_takes_a_batch():
    q = MessageQueue(capacity=2)
    assert q.put(_g(0)) and q.put(_g(1))
    started = threading.Event()

    def blocked_put():
        started.set()
        return q.put(_g(2), timeout=5)

    t, results, errors = _in_thread(blocked_put)
    started.wait(1)
    t.join(timeout=0.1)
    assert t.is_alive() and results == []  # backpressure: still waiting for room
    assert [g.index for g in q.take(["0:0#0"])] == [0]
    t.join(timeout=5)
    assert not errors and results[0].accepted and results[0].dropped == ()
    assert q.ids() == ["0:1#0", "0:2#0"] and q.dropped_count == 0


def test_put_on_a_full_queue_returns_false_on_timeout_and_keeps_everything():
    q = MessageQueue(capacity=1)
    q.put(_g(0))
    result = q.put(_g(1), timeout=0.05)
    assert not result and result.accepted is False
    assert q.ids() == ["0:0#0"] and q.dropped_count == 0


def test_drop_oldest_evicts_counts_and_reports_every_drop():
    q = MessageQueue(capacity=2, drop_policy="oldest")
    assert q.put(_g(0)).dropped == ()
    assert q.put(_g(1)).dropped == ()
    assert q.put(_g(2)).dropped == ("0:0#0",)
    assert q.put(_g(3)).dropped == ("0:1#0",)
    assert q.dropped_count == 2 and q.ids() == ["0:2#0", "0:3#0"]


def test_take_removes_the_chosen_groups_in_the_order_asked_and_wait_wakes_on_a_put():
    q = MessageQueue(capacity=4)
    for i in range(3):
        q.put(_g(i))
    assert [g.index for g in q.take(["0:2#0", "0:0#0"])] == [2, 0]
    assert q.ids() == ["0:1#0"]
    with pytest.raises(ValueError, match=r"groups \['0:0#0'\] are not queued"):
        q.take(["0:0#0"])
    t, results, _ = _in_thread(lambda: q.wait(5))
    t.join(timeout=0.1)
    assert t.is_alive()  # nothing put yet
    q.put(_g(3))
    t.join(timeout=5)
    assert not t.is_alive()


def test_close_wakes_blocked_producers_and_waiting_consumers():
    full = MessageQueue(capacity=1)
    full.put(_g(0))
    empty = MessageQueue(capacity=2)
    producer, _, producer_errors = _in_thread(lambda: full.put(_g(1), timeout=5))
    consumer, _, _ = _in_thread(lambda: empty.wait(5))
    producer.join(timeout=0.05)
    consumer.join(timeout=0.05)
    full.close()
    empty.close()
    producer.join(timeout=1)
    consumer.join(timeout=1)
    assert not producer.is_alive() and not consumer.is_alive()
    assert isinstance(producer_errors[0], QueueClosed)
    assert full.ids() == ["0:0#0"]  # nothing vanished: the queued group is still there for the checkpoint
    assert [g.index for g in full.take(["0:0#0"])] == [0]  # and can still be taken
    with pytest.raises(QueueClosed):
        full.put(_g(9))


def test_snapshot_restore_round_trip_keeps_order_and_drop_count():
    q = MessageQueue(capacity=2, drop_policy="oldest")
    for i in range(3):
        q.put(_g(i, version=i))
    snap = q.snapshot()
    assert [g.group_id for g in snap.groups] == ["0:1#0", "0:2#0"] and snap.dropped_count == 1

    resumed = MessageQueue(capacity=2, drop_policy="oldest")
    resumed.restore(snap)
    assert resumed.ids() == q.ids() and resumed.dropped_count == 1
    assert [g.start_version for g in resumed.snapshot().groups] == [1, 2]


def test_restore_refuses_to_truncate_or_overwrite():
    snap = QueueSnapshot(groups=[_g(0), _g(1), _g(2)])
    with pytest.raises(ValueError, match="snapshot holds 3 groups but capacity is 2"):
        MessageQueue(capacity=2).restore(snap)
    busy = MessageQueue(capacity=4)
    busy.put(_g(7))
    with pytest.raises(ValueError, match="only an empty, open queue"):
        busy.restore(snap)


def test_errors_name_the_argument():
    with pytest.raises(ValueError, match=r"capacity must be an integer >= 1 group \(got 0\)"):
        MessageQueue(capacity=0)
    with pytest.raises(ValueError, match="drop_policy must be one of backpressure, oldest \\(got 'newest'\\)"):
        MessageQueue(capacity=1, drop_policy="newest")
    q = MessageQueue(capacity=2)
    q.put(_g(0))
    with pytest.raises(ValueError, match="already queued"):
        q.put(_g(0))
