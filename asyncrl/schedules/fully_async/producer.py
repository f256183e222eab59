"""The ``fully_async`` producer: streams prompt groups into the bounded queue.

``Producer`` is its books and its loop in plain Python: the prompt stream (an ``EpochSampler`` plus prompts to
re-issue), the ``StalenessController`` that admits new groups, the ``MessageQueue`` the trainer pulls from, the
``PromptLedger`` that proves every prompt is trained on exactly once, and the groups in flight. Its loop, top to
bottom (``Producer.step``):

    admit new groups while the controller allows (up to max_inflight_groups)
    decode every unfinished row of every in-flight group in one batch:
        new groups start from the prompt, interrupted rows continue from where they stopped
    score the groups that finished (rule rewards)
    put finished groups into the queue, oldest first (blocking or dropping per drop_policy)

``rollouter.Rollouter`` is the worker that runs that loop on a generation thread with its engine; the protocol tests
(tests/test_fully_async_protocol.py) run the same ``Producer`` in the performance model's simulator
(``asyncrl.schedules.perf.simulate``), its engine priced on a virtual clock.

At a weight sync the driver calls ``pause``: with ``partial_rollout`` the running decode is interrupted at its next
step (the rows keep their tokens, log-probs and per-token versions and continue after the sync with the new weights);
without it the decode runs to the end first, so every response comes from one version. ``snapshot`` (only while
parked) captures the queue, the in-flight rows, the controller, the ledger and the prompt cursor together: restoring
it loses and repeats nothing.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable, Hashable
from dataclasses import replace
from typing import Any, TypeVar

from asyncrl.config import AsyncTrainingConfig
from asyncrl.data.sampler import EpochSampler
from asyncrl.schedules.fully_async.ledger import PromptLedger
from asyncrl.schedules.fully_async.queue import Group, MessageQueue
from asyncrl.schedules.fully_async.recovery import InFlightGroup, RollouterSnapshot, StreamBatch, Takeover, advance
from asyncrl.schedules.fully_async.staleness import StalenessBudget, StalenessController
from asyncrl.types import Prompt, Sample

T = TypeVar("T")
POLL_S = 0.02  # how often an idle generation thread re-checks admission and the queue, seconds
# fully_async/count/<key>: every group admitted ends up consumed, dropped, queued or in flight; each is counted
COUNT_KEYS = (
    "started_groups",
    "queued_groups",
    "consumed_groups",
    "dropped_groups",
    "dropped_stale_samples",
    "interrupted_rows",
    "refills",
)


def budget_of(at: AsyncTrainingConfig, ppo_mini_batch_size: int) -> StalenessBudget:
    return StalenessBudget(
        require_batches=at.require_batches,
        ppo_mini_batch_size=ppo_mini_batch_size,
        trigger_parameter_sync_step=at.trigger_parameter_sync_step,
        staleness_threshold=at.staleness_threshold,
    )


def queue_for(at: AsyncTrainingConfig, budget: StalenessBudget) -> MessageQueue:
    """The bounded queue: ``max_queue_size`` (default the budget's window) and the full-queue policy."""
    return MessageQueue(at.max_queue_size or budget.groups_per_window_budget, at.drop_policy)


class Producer:
    """The producer's books and its one loop, in plain Python: no thread, no engine, no clock of its own.

    ``step`` is one turn of the generation loop (the module docstring): admit, decode (``decode`` is handed every
    unfinished row and returns them continued), queue what finished. The Rollouter runs it on its generation
    thread with its engine; the performance model's simulator runs the same code on a virtual clock. The
    driver's side is ``take`` (a trainer step's groups), ``on_sync``, ``snapshot`` and ``restore``.
    """

    def __init__(
        self,
        budget: StalenessBudget,
        queue: MessageQueue,
        sampler: EpochSampler,
        prompt_of: Callable[[int, int], Prompt],
        n: int,
        max_groups: int,
        clock: Callable[[], float] = time.time,
    ):
        self.budget, self.queue, self.sampler, self.prompt_of = budget, queue, sampler, prompt_of
        self.n, self.max_groups, self.clock = n, max_groups, clock
        self.controller = StalenessController(budget)
        self.ledger = PromptLedger()
        self.inflight: dict[str, InFlightGroup] = {}  # insertion order = start order
        self.processing_s: dict[str, float] = {}  # queued group -> seconds from admission to the queue
        self.counts: Counter[str] = Counter(dict.fromkeys(COUNT_KEYS, 0))
        self.skip: set[tuple[int, int]] = set()  # prompts a dead predecessor issued and the trainer consumed
        self.lock = threading.Lock()  # the books, shared by the generation thread and the driver's calls

    # ---- the loop --------------------------------------------------------------------------------------------------
    def step(
        self,
        decode: Callable[[list[Sample]], list[Sample]],
        score: Callable[[list[Sample]], Any] = lambda samples: None,
        put_timeout_s: float = 0.0,
        stop: Callable[[], bool] = lambda: True,
    ) -> bool:
        """One turn of the loop: admit new groups; decode every unfinished row of every in-flight group in one call
        (new groups from the prompt, interrupted rows from where they stopped); score the groups that finished;
        queue finished groups in start order (``put_finished``). Returns whether anything happened (False: nothing
        to decode and nothing could be queued, so the caller may wait for admission)."""
        groups, rows = self.to_decode()
        if groups:
            self.finish_decode(groups, decode(rows), score)
        return self.put_finished(put_timeout_s, stop) or bool(groups)

    def to_decode(self) -> tuple[list[InFlightGroup], list[Sample]]:
        """The first half of a turn: admit new groups, then every unfinished group with its rows, in start order
        (the performance model's simulator runs the turn in these halves, its decode on a virtual clock between)."""
        self.admit()
        groups = [g for g in self.inflight.values() if not g.finished]
        return groups, [s for g in groups for s in g.samples]

    def finish_decode(
        self, groups: list[InFlightGroup], out: list[Sample], score: Callable[[list[Sample]], Any]
    ) -> list[InFlightGroup]:
        """The second half: take the decoded rows, score the groups that finished (rule rewards, before the queue)
        and record them generated; returns those groups."""
        finished = self.decoded(groups, out)
        score([s for g in finished for s in g.samples])
        with self.lock:
            for g in finished:
                self.ledger.generated(g.group_id)
        return finished

    def admit(self) -> None:
        """Start new groups while the staleness controller admits them and the decode batch has room."""
        with self.lock:
            while len(self.inflight) < self.max_groups and self.controller.can_start():
                reissue = self.ledger.to_reissue()
                epoch, index = reissue[0] if reissue else self._next_prompt()
                gid = self.ledger.issue(epoch, index)
                version = self.controller.on_start(gid)
                prompt = replace(self.prompt_of(epoch, index), epoch=epoch)
                blank = [_blank(prompt, version, j) for j in range(self.n)]
                self.inflight[gid] = InFlightGroup(gid, epoch, index, version, self.clock(), blank)
                self.counts["started_groups"] += 1

    def _next_prompt(self) -> tuple[int, int]:
        while True:
            epoch, index = self.sampler.next_batch()[0]
            if (epoch, index) not in self.skip:
                return epoch, index
            self.skip.discard((epoch, index))

    def decoded(self, groups: list[InFlightGroup], out: list[Sample]) -> list[InFlightGroup]:
        """The rows of ``groups`` (in order) as the engine continued them; returns the groups now finished."""
        with self.lock:
            i = 0
            for g in groups:
                g.samples = out[i : i + len(g.samples)]
                i += len(g.samples)
            self.counts["interrupted_rows"] += sum(s.stop_reason == "interrupted" for s in out)
        return [g for g in groups if g.finished]

    def should_refill(self, n_active: int, n_rows: int) -> bool:
        """Cut a decode short when its long tail left at most half the rows running and a new group could start:
        the rows continue in the next call, batched with the new ones (same weights, so no version is mixed)."""
        if n_active > n_rows // 2 or len(self.inflight) >= self.max_groups or not self.controller.can_start():
            return False
        with self.lock:
            self.counts["refills"] += 1
        return True

    def put_finished(self, timeout_s: float, stop: Callable[[], bool] = lambda: True) -> bool:
        """Queue finished groups in start order, each waiting up to ``timeout_s`` at a time for room until ``stop()``
        says to leave it (still in flight, finished). Returns whether any was queued."""
        moved = False
        for gid in [g.group_id for g in self.inflight.values() if g.finished]:
            group = self.inflight[gid]
            while True:
                with self.lock:  # the put and its bookkeeping are one step for the driver's calls
                    res = self.queue.put(
                        Group(gid, group.epoch, group.index, group.start_version, group.samples), timeout=timeout_s
                    )
                    if res.accepted:
                        self._queued(group, res.dropped)
                        break
                if stop():
                    return moved
            moved = True
        return moved

    def _queued(self, group: InFlightGroup, dropped: tuple[str, ...]) -> None:
        gid = group.group_id
        self.controller.on_queued(gid)
        del self.inflight[gid]
        self.ledger.queued(gid)
        self.processing_s[gid] = self.clock() - group.started_at
        self.counts["queued_groups"] += 1
        if dropped:
            self.controller.on_dropped(dropped)
            self.ledger.dropped(dropped)
            self.counts["dropped_groups"] += len(dropped)
            self.counts["dropped_stale_samples"] += len(dropped) * self.n
            for d in dropped:
                self.processing_s.pop(d, None)

    # ---- the driver's side -----------------------------------------------------------------------------------------
    def take(self, n_groups: int, trainer_version: int, timeout_s: float) -> StreamBatch | None:
        """The oldest ``n_groups`` queued groups for one trainer step at ``trainer_version``, with their staleness;
        None if they are not there within ``timeout_s``."""
        groups = self.queue.get_batch(n_groups, timeout=timeout_s)
        if groups is None:
            return None
        ids = [g.group_id for g in groups]
        staleness = self.controller.on_consumed(ids, trainer_version)
        with self.lock:
            self.ledger.consumed(ids)
            proc = [self.processing_s.pop(g, 0.0) for g in ids]
            self.counts["consumed_groups"] += len(ids)
        return StreamBatch(groups, staleness, proc)

    def snapshot(self, engine_version: int) -> RollouterSnapshot:
        with self.lock:
            return RollouterSnapshot(
                queue=self.queue.snapshot(),
                inflight=list(self.inflight.values()),
                controller=self.controller.state_dict(),
                ledger=self.ledger.state_dict(),
                sampler=self.sampler.state_dict(),
                processing_s=dict(self.processing_s),
                counts=dict(self.counts),
                engine_version=engine_version,
                skip=tuple(sorted(self.skip)),
            )

    def restore(self, take: Takeover) -> None:
        """Load a snapshot, with a takeover's consumption replayed on top (``recovery``), continuing at the
        takeover's version."""
        state = advance(take, self.budget) if take.consumed else take.snapshot
        self.controller.load_state_dict(state.controller)
        self.controller.on_sync(take.version)
        self.ledger.load_state_dict(state.ledger)
        self.skip = set(state.skip)
        self.queue.restore(state.queue)
        self.sampler.load_state_dict(state.sampler)
        self.inflight = {g.group_id: g for g in state.inflight}
        self.processing_s = dict(state.processing_s)
        self.counts = Counter(state.counts)

    def count_metrics(self) -> dict[str, float]:
        with self.lock:
            out = {f"fully_async/count/{k}": float(v) for k, v in sorted(self.counts.items())}
            out["fully_async/count/queue_size"] = float(len(self.queue))
            out["fully_async/count/in_flight_groups"] = float(len(self.inflight))
        out.update(self.controller.metrics())
        return out


def _blank(prompt: Prompt, version: int, row: int) -> Sample:
    """Row ``row`` of a group, not started yet: the engine's ``resume`` continues it from the prompt."""
    return Sample(prompt, [], [], [], stop_reason="interrupted", start_version=version, row=row)


def split_by_group(
    rows: list[T], shares: int, key: Callable[[T], Hashable] = lambda s: s.prompt.uid
) -> list[list[int]]:
    """Row indices for ``shares`` ranks: whole groups (rows of one ``key``, by default one prompt, stay together and
    share its prefill), cut into contiguous shares of about equal rows; share 0 is the Rollouter's own. Some may be
    empty. The Rollouter splits its decode calls with it, the performance model its simulated ones."""
    if shares <= 1:
        return [list(range(len(rows)))]
    groups: dict[Hashable, list[int]] = {}
    for i, s in enumerate(rows):
        groups.setdefault(key(s), []).append(i)
    out: list[list[int]] = [[] for _ in range(shares)]
    target = len(rows) / shares
    k = 0
    for members in groups.values():
        if k < shares - 1 and out[k] and len(out[k]) + len(members) / 2 > target:
            k += 1
        out[k].extend(members)
    return out
