"""What the fully_async stream holds, one rule each for the Rollouter and the performance model: its ranks
(``RankStream``), rows and groups in flight (``stream_concurrency``), the staleness budget and queue (``budget_of``,
``queue_for``); and the slots' occupancy over time (``Occupancy``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from asyncrl.schedules.fully_async.queue import MessageQueue
from asyncrl.schedules.fully_async.staleness import StalenessBudget
from asyncrl.types import Sample


class StreamKnobs(Protocol):
    """What sets the staleness budget and sizes the queue: ``async_training``'s keys (the performance model's
    ``Setting`` has them too)."""

    require_batches: int
    trigger_parameter_sync_step: int
    staleness_threshold: float
    staleness_rule: str
    max_queue_size: int | None
    drop_policy: str


def budget_of(at: StreamKnobs, ppo_mini_batch_size: int) -> StalenessBudget:
    return StalenessBudget(
        require_batches=at.require_batches,
        ppo_mini_batch_size=ppo_mini_batch_size,
        trigger_parameter_sync_step=at.trigger_parameter_sync_step,
        staleness_threshold=at.staleness_threshold,
        rule=at.staleness_rule,
    )


def queue_for(knobs: StreamKnobs, budget: StalenessBudget) -> MessageQueue:
    """The bounded queue: ``max_queue_size`` (unset: the budget's window, which never fills while synced) and the
    full-queue policy."""
    return MessageQueue(knobs.max_queue_size or budget.groups_per_window_budget, knobs.drop_policy)


class RankStream(Protocol):
    """One rollout rank's engine as the producer's loop drives it (``asyncrl.rollout.streaming``): ``submit`` rows
    (they enter at its next step), ``advance`` (the rows that ended since the last call; an in-process engine
    decodes one step here), ``request_interrupt`` then ``interrupt`` (every row it holds, partial: every rank is
    asked before any answer is awaited)."""

    def submit(self, rows: list[Sample]) -> None: ...

    def advance(self) -> list[Sample]: ...

    def holds_live_rows(self) -> bool: ...

    def request_interrupt(self) -> None: ...

    def interrupt(self) -> list[Sample]: ...


def stream_concurrency(engine_rows: int, n: int, ranks: int, max_inflight_groups: int | None) -> tuple[list[int], int]:
    """(rows each rank decodes at once, groups in flight in all): every engine kept at its own capacity
    (``engine_rows``: the built-in engine's ``rollout.max_batch_size``, vLLM's ``max_num_seqs``); groups capped by
    ``async_training.max_inflight_groups``, by default one per slot: a group on an engine holds at least one slot,
    so the slots bind first (on a long tail most groups in flight are down to a row or two, and a cap of slots / n
    groups would leave most slots idle). The Rollouter and the performance model both size the stream with this."""
    per_rank = max(1, engine_rows)
    groups = max_inflight_groups or max(1, ranks * per_rank)
    return [per_rank] * max(1, ranks), groups


class Occupancy:
    """Rows on each rank's engine over its slots, averaged over time (seconds of ``clock``) since ``take``."""

    def __init__(self, capacities: list[int], clock: Callable[[], float]):
        self.capacities, self.clock = capacities, clock
        self.since = self.last = clock()
        self.area = [0.0] * len(capacities)
        self.load = [0] * len(capacities)

    def update(self, load: list[int]) -> None:
        now = self.clock()
        dt = now - self.last
        for r, (held, cap) in enumerate(zip(self.load, self.capacities)):
            self.area[r] += dt * min(held, cap) / cap
        self.last, self.load = now, list(load)

    def take(self, load: list[int]) -> list[float]:
        """Each rank's occupancy since the last ``take`` (the current load if no time passed)."""
        self.update(load)
        span = self.last - self.since
        out = [a / span if span > 0 else min(h, c) / c for a, h, c in zip(self.area, load, self.capacities)]
        self.area, self.since = [0.0] * len(self.capacities), self.last
        return out
