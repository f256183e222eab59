"""PromptLedger: proves (or disproves) that every prompt of an epoch was trained on exactly once."""

import json

import pytest

from asyncrl.schedules.fully_async.ledger import PromptLedger, parse_group_id


def _through(ledger: PromptLedger, epoch: int, index: int, end: str = "consumed") -> str:
    gid = ledger.issue(epoch, index)
    ledger.generated(gid)
    ledger.queued(gid)
    getattr(ledger, end)([gid])
    return gid


def test_a_clean_epoch_verifies_exactly_once():
    ledger = PromptLedger()
    for i in (2, 0, 1):
        _through(ledger, 0, i)
    report = ledger.verify_epoch(0, num_prompts=3)
    assert report.ok and report.exactly_once and report.consumed_once == 3
    assert report.summary() == "epoch 0: 3/3 prompts consumed once"


def test_detects_a_lost_and_a_duplicated_prompt():
    ledger = PromptLedger()
    _through(ledger, 0, 0)
    _through(ledger, 0, 1)
    _through(ledger, 0, 1)  # e.g. the sampler was rewound but the ledger was not: prompt 1 trained on twice
    gid = ledger.issue(0, 2)
    ledger.generated(gid)
    ledger.abandoned([gid])  # killed in flight and never re-issued: lost
    report = ledger.verify_epoch(0, num_prompts=4)
    assert report.duplicated == [1] and report.lost == [2] and report.never_issued == [3]
    assert not report.ok and report.consumed_once == 1
    assert "duplicated 1" in report.summary() and "lost 1" in report.summary()


def test_a_second_consume_of_the_same_group_is_counted_not_refused():
    ledger = PromptLedger()
    gid = _through(ledger, 1, 0)
    ledger.consumed([gid])  # replayed from an inconsistent checkpoint
    assert ledger.verify_epoch(1, num_prompts=1).duplicated == [0]


def test_an_abandoned_prompt_is_reissued_then_counts_once():
    ledger = PromptLedger()
    first = ledger.issue(0, 5)
    ledger.abandoned([first])
    assert ledger.to_reissue() == [(0, 5)]
    second = _through(ledger, 0, 5)
    assert (first, second) == ("0:5#0", "0:5#1") and ledger.to_reissue() == []
    rec = ledger.record(0, 5)
    assert (rec.issued, rec.abandoned, rec.consumed) == (2, 1, 1)
    assert ledger.verify_epoch(0, num_prompts=6).duplicated == []


def test_dropped_prompts_are_reported_as_dropped_not_lost():
    ledger = PromptLedger()
    _through(ledger, 0, 0, end="dropped")
    _through(ledger, 0, 1)
    report = ledger.verify_epoch(0, num_prompts=2)
    assert report.ok and not report.exactly_once and report.dropped == [0] and report.lost == []


def test_groups_still_in_flight_are_open_not_lost():
    ledger = PromptLedger()
    gid = ledger.issue(0, 0)
    assert ledger.verify_epoch(0, num_prompts=1).open == [0]
    ledger.queued(gid)
    assert ledger.open_groups() == {gid: "queued"}


def test_state_dict_round_trip_through_json():
    ledger = PromptLedger()
    _through(ledger, 0, 0)
    ledger.abandoned([ledger.issue(0, 1)])
    ledger.generated(ledger.issue(1, 3))
    state = json.loads(json.dumps(ledger.state_dict()))
    resumed = PromptLedger()
    resumed.load_state_dict(state)
    assert resumed.state_dict() == ledger.state_dict()
    assert resumed.to_reissue() == [(0, 1)] and resumed.open_groups() == {"1:3#0": "generated"}
    assert resumed.issue(0, 1) == "0:1#1"  # attempt numbers continue after a resume


def test_verify_rejects_indices_beyond_the_dataset_and_bad_ids():
    ledger = PromptLedger()
    _through(ledger, 0, 7)
    with pytest.raises(ValueError, match="prompt indices \\[7\\] >= num_prompts=5"):
        ledger.verify_epoch(0, num_prompts=5)
    with pytest.raises(ValueError, match="not of the form"):
        parse_group_id("0-7")
    with pytest.raises(ValueError, match="never issued"):
        ledger.consumed(["3:3#0"])


def test_forget_epoch_only_when_nothing_is_pending():
    ledger = PromptLedger()
    _through(ledger, 0, 0)
    ledger.issue(1, 0)
    ledger.forget_epoch(0)
    assert ledger.record(0, 0) is None
    with pytest.raises(ValueError, match="epoch 1 still has open"):
        ledger.forget_epoch(1)
