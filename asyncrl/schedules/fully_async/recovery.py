"""What a ``fully_async`` Rollouter hands the driver, and how a replacement Rollouter takes over from a dead one.

A replacement restores the dead one's last ``RollouterSnapshot`` and replays every ``ConsumedBatch`` since
(``advance``): a consumed group is consumed once and never generated again (one issued after the snapshot is recorded
under its own group id, and the prompt cursor passes over its prompt: ``RollouterSnapshot.skip``); what the dead one
issued after the snapshot and had not handed out is not in the books, so its prompts are drawn again from the restored
cursor; the controller replays each consumption at its version, so the staleness bound holds (docs/faults.md).
"""

from __future__ import annotations

import pickle
from collections import Counter
from dataclasses import dataclass, field, replace
from typing import Any

from asyncrl.schedules.fully_async.ledger import PromptLedger, parse_group_id
from asyncrl.schedules.fully_async.queue import Group, QueueSnapshot
from asyncrl.schedules.fully_async.staleness import StalenessBudget, StalenessController
from asyncrl.types import Sample

ROLLOUTER_STATE = "rollouter_state.pt"  # a checkpoint's file of the Rollouter's snapshot


@dataclass
class StreamBatch:
    """One trainer step's groups (in the order ``StalenessController.pick`` chose them), the staleness of each as
    the controller counted it, and the seconds each spent from admission to the queue."""

    groups: list[Group]
    staleness: list[int]
    processing_s: list[float]

    @property
    def samples(self) -> list[Sample]:
        return [s for g in self.groups for s in g.samples]


@dataclass
class InFlightGroup:
    """A group being generated: its rows are blank (not started), interrupted (partial), ended and completing (in a
    snapshot: ``completing``; they go to their completion again on restore) or finished."""

    group_id: str
    epoch: int
    index: int
    start_version: int
    started_at: float  # Unix seconds (comparable across a restart on the same machine)
    samples: list[Sample]
    completing: tuple[int, ...] = ()  # rows that ended and waited for their completion (a reward, a tool call)

    @property
    def finished(self) -> bool:
        return all(s.stop_reason != "interrupted" for s in self.samples)


@dataclass
class RollouterSnapshot:
    """Everything a resumed run needs, taken in one instant while parked: queue, in-flight rows (partial ones keep
    their tokens, log-probs and versions), controller, ledger, prompt cursor and counters."""

    queue: QueueSnapshot
    inflight: list[InFlightGroup]
    controller: dict[str, Any]
    ledger: dict[str, Any]
    sampler: dict[str, Any]
    processing_s: dict[str, float]
    counts: dict[str, int]
    engine_version: int
    skip: tuple[tuple[int, int], ...] = ()  # prompts the cursor passes over (``advance``; a tuple: old pickles)


@dataclass(frozen=True)
class PackedSnapshot:
    """A ``RollouterSnapshot`` pickled while the Rollouter was parked. Its in-flight groups and samples are the live
    ones, which the generation thread changes once it goes on; packed first, the snapshot is the instant it was
    taken in, whichever backend carries it and whenever it is sent."""

    data: bytes

    @classmethod
    def pack(cls, snapshot: RollouterSnapshot) -> PackedSnapshot:
        return cls(pickle.dumps(snapshot, protocol=pickle.HIGHEST_PROTOCOL))

    def unpack(self) -> RollouterSnapshot:
        return pickle.loads(self.data)


@dataclass
class ConsumedBatch:
    """The groups of one trainer update, as ``get_batch`` handed them out, and the version the update ran at."""

    groups: list[Group]
    trainer_version: int


@dataclass
class Takeover:
    """A replacement Rollouter's start: the dead one's last snapshot, what the trainer consumed since, and the
    weights version the replacement holds (the trainer's now, never older than the snapshot's)."""

    snapshot: RollouterSnapshot
    consumed: list[ConsumedBatch] = field(default_factory=list)
    version: int = 0


def advance(take: Takeover, budget: StalenessBudget) -> RollouterSnapshot:
    """The snapshot the dead Rollouter would give now, at ``take.version``: its last one with the consumption since
    replayed in order (the module docstring). A replacement restores it; the driver checkpoints it when no replacement
    may be started, so a resume loses nothing either. Raises if a batch does not fit the books (a group consumed
    twice, a version out of step)."""
    snap = take.snapshot
    if take.version < snap.engine_version:
        raise ValueError(f"advance: version {take.version} is older than the snapshot's {snap.engine_version}")
    controller, ledger = StalenessController(budget), PromptLedger()
    controller.load_state_dict(snap.controller)
    controller.on_sync(take.version)
    ledger.load_state_dict(snap.ledger)
    queued_at = {g.group_id for g in snap.queue.groups}
    inflight = {g.group_id: g for g in snap.inflight}
    counts: Counter[str] = Counter(snap.counts)
    processing = dict(snap.processing_s)
    skip = set(snap.skip)
    gone: set[str] = set()
    for batch in take.consumed:
        ids = [g.group_id for g in batch.groups]
        for g in batch.groups:
            stage = ledger.open_groups().get(g.group_id)
            if g.group_id in queued_at:
                pass  # queued at the snapshot: only its consumption is new
            elif g.group_id in inflight:  # in flight at the snapshot, finished and queued since
                del inflight[g.group_id]
                _queue_in_books(g.group_id, stage, controller, ledger, counts)
            else:  # issued after the snapshot
                epoch, index, _ = parse_group_id(g.group_id)
                if (epoch, index) not in ledger.to_reissue():
                    skip.add((epoch, index))  # drawn from the cursor after the snapshot: the cursor passes over it
                ledger.replay_issue(g.group_id)
                controller.replay_start(g.group_id, g.start_version)
                counts["started_groups"] += 1
                _queue_in_books(g.group_id, "issued", controller, ledger, counts)
            processing.pop(g.group_id, None)
            gone.add(g.group_id)
        controller.on_consumed(ids, batch.trainer_version)
        ledger.consumed(ids)
        counts["consumed_groups"] += len(ids)
    queue = replace(snap.queue, groups=[g for g in snap.queue.groups if g.group_id not in gone])
    return replace(
        snap,
        queue=queue,
        inflight=list(inflight.values()),
        processing_s=processing,
        counts=dict(counts),
        skip=tuple(sorted(skip)),
        controller=controller.state_dict(),
        ledger=ledger.state_dict(),
        engine_version=take.version,
    )


def _queue_in_books(
    group_id: str, stage: str | None, controller: StalenessController, ledger: PromptLedger, counts: Counter[str]
) -> None:
    """A group finished and was queued after the snapshot: its generation (unless recorded) and its queueing."""
    if stage == "issued":
        ledger.generated(group_id)
    ledger.queued(group_id)
    controller.on_queued(group_id)
    counts["queued_groups"] += 1
