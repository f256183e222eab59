"""The bounded, thread-safe FIFO of ``Group``s between the Rollouter and the trainer in ``fully_async``.

The unit is a ``Group`` (the ``rollout.n`` responses to one prompt): GRPO normalises rewards within a group. The queue
keeps arrival order; which groups an update takes is the consumer's choice (``StalenessController.pick``). Nothing
disappears uncounted: a full queue blocks the producer (``drop_policy="backpressure"``) or evicts its oldest group,
counted and returned from ``put`` for the controller and the ledger (``"oldest"``).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

from asyncrl.config.training import DROP_POLICIES
from asyncrl.types import Sample


class QueueClosed(RuntimeError):
    """The queue was closed: a ``put`` will never be accepted, and a consumer waiting for groups stops waiting."""


@dataclass
class Group:
    """The responses to one prompt, generated together: the unit of queueing, admission and accounting.
    ``group_id`` is ``PromptLedger.issue``'s; ``start_version`` is every sample's: the weight version it began with."""

    group_id: str
    epoch: int
    index: int
    start_version: int
    samples: list[Sample] = field(default_factory=list)


@dataclass(frozen=True)
class PutResult:
    """``accepted`` is False only on timeout; ``dropped`` lists the ids evicted to make room (``oldest`` policy)."""

    accepted: bool
    dropped: tuple[str, ...] = ()

    def __bool__(self) -> bool:
        return self.accepted


@dataclass
class QueueSnapshot:
    """The queued groups in consumption order and the drop count, for a checkpoint."""

    groups: list[Group]
    dropped_count: int = 0


class MessageQueue:
    """Bounded FIFO of ``Group``s with ``capacity`` in groups.

    ``put`` with ``drop_policy="backpressure"`` waits while full (``timeout`` seconds, None = forever) and returns a
    false ``PutResult`` on timeout; with ``"oldest"`` it never waits. ``take(ids)`` removes the groups the consumer
    chose (``Producer.take``, which waits with ``wait``). ``close`` wakes every waiter: a blocked or later ``put``
    raises ``QueueClosed``; queued groups stay, and can still be taken.
    """

    def __init__(self, capacity: int, drop_policy: str = "backpressure"):
        if not isinstance(capacity, int) or capacity < 1:
            raise ValueError(f"MessageQueue: capacity must be an integer >= 1 group (got {capacity!r})")
        if drop_policy not in DROP_POLICIES:
            choices = ", ".join(DROP_POLICIES)
            raise ValueError(f"MessageQueue: drop_policy must be one of {choices} (got {drop_policy!r})")
        self.capacity = capacity
        self.drop_policy = drop_policy
        self._lock = threading.Lock()
        self._not_full = threading.Condition(self._lock)
        self._not_empty = threading.Condition(self._lock)
        self._groups: dict[str, Group] = {}  # group id -> group, oldest first
        self._dropped_count = 0
        self._closed = False

    def __len__(self) -> int:
        with self._lock:
            return len(self._groups)

    @property
    def dropped_count(self) -> int:
        """Groups evicted by ``drop_policy="oldest"`` since the run began (restored from snapshots)."""
        with self._lock:
            return self._dropped_count

    @property
    def closed(self) -> bool:
        return self._closed

    def ids(self) -> list[str]:
        """Queued group ids, oldest first."""
        with self._lock:
            return list(self._groups)

    def put(self, group: Group, timeout: float | None = None) -> PutResult:
        """Append ``group``; see the class docstring for full-queue behaviour. Raises ``QueueClosed`` after close."""
        with self._lock:
            if group.group_id in self._groups:
                raise ValueError(f"MessageQueue.put: group {group.group_id!r} is already queued")
            if self.drop_policy == "backpressure":
                if not self._not_full.wait_for(lambda: self._closed or len(self._groups) < self.capacity, timeout):
                    return PutResult(accepted=False)
            if self._closed:
                raise QueueClosed(f"MessageQueue.put: the queue is closed ({len(self._groups)} groups still queued)")
            dropped: list[str] = []
            while len(self._groups) >= self.capacity:  # "oldest" only: backpressure waited for room
                dropped.append(next(iter(self._groups)))
                del self._groups[dropped[-1]]
            self._dropped_count += len(dropped)
            self._groups[group.group_id] = group
            self._not_empty.notify_all()
            return PutResult(accepted=True, dropped=tuple(dropped))

    def take(self, group_ids: list[str]) -> list[Group]:
        """Remove the queued groups ``group_ids`` (chosen by the consumer, ``StalenessController.pick``) and return
        them in that order; never waits."""
        with self._lock:
            missing = [g for g in group_ids if g not in self._groups]
            if missing:
                raise ValueError(f"MessageQueue.take: groups {missing} are not queued")
            got = [self._groups[g] for g in group_ids]
            for g in group_ids:
                self._groups.pop(g, None)
            self._not_full.notify_all()
            return got

    def wait(self, timeout: float) -> None:
        """Sleep until a group is put or the queue closes, at most ``timeout`` seconds."""
        with self._lock:
            if not self._closed:
                self._not_empty.wait(timeout)

    def close(self) -> None:
        """Wake every waiter; queued groups stay (they are still counted, and ``snapshot`` still sees them)."""
        with self._lock:
            self._closed = True
            self._not_full.notify_all()
            self._not_empty.notify_all()

    def snapshot(self) -> QueueSnapshot:
        """A copy of the queued groups (oldest first) and the drop count; take it while producers are paused."""
        with self._lock:
            return QueueSnapshot(groups=list(self._groups.values()), dropped_count=self._dropped_count)

    def restore(self, snapshot: QueueSnapshot) -> None:
        """Refill an empty, open queue from ``snapshot`` in the same order (never silently truncates)."""
        with self._lock:
            if self._groups or self._closed:
                raise ValueError("MessageQueue.restore: only an empty, open queue can be restored")
            if len(snapshot.groups) > self.capacity:
                raise ValueError(
                    f"MessageQueue.restore: snapshot holds {len(snapshot.groups)} groups but capacity is "
                    f"{self.capacity}; restoring would drop some"
                )
            groups = {g.group_id: g for g in snapshot.groups}
            if len(groups) != len(snapshot.groups):
                raise ValueError("MessageQueue.restore: snapshot holds a group id twice")
            self._groups = groups
            self._dropped_count = snapshot.dropped_count
            self._not_empty.notify_all()
