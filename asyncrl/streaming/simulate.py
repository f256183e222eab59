"""A discrete-event model of ``fully_async`` that drives the real controller, queue, ledger and sampler.

No threads, no clock: a Rollouter with ``max_in_flight`` generation slots and random per-group durations (seconds of
simulated time, with optional long-tail groups), and a Trainer with random per-update durations, interleaved through
one event heap. It exists so that a property test can throw thousands of schedules (fast rollout vs slow trainer and
the reverse, lagging weight syncs, a kill -9 after a checkpoint) at the staleness bound and the exactly-once
accounting, and so that the order of calls a real pipeline must make is written down once, runnable.

The model is deliberately adversarial where the real system is kinder: the trainer does not wait for a weight sync
(``sync_seconds`` > 0 leaves the Rollouter generating with the old version meanwhile), and the kill throws away all
work after the checkpoint, including updates the trainer finished (their weights were never saved).
"""

from __future__ import annotations

import copy
import heapq
import json
import random
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from asyncrl.data.sampler import EpochSampler
from asyncrl.streaming.ledger import PromptLedger
from asyncrl.streaming.queue import Group, MessageQueue
from asyncrl.streaming.staleness import StalenessBudget, StalenessController


@dataclass(frozen=True)
class SimConfig:
    """One scenario. Durations are simulated seconds; ``gen_seconds``/``train_seconds`` are uniform ranges."""

    budget: StalenessBudget = field(default_factory=StalenessBudget)
    num_prompts: int = 8  # dataset rows per epoch
    epochs: int = 1  # the trainer stops after num_prompts * epochs groups (must be a whole number of updates)
    max_in_flight: int = 4  # Rollouter concurrency, in groups (a group waiting to be queued holds its slot)
    queue_capacity: int | None = None  # groups; None = the budget's M (the queue is then never full when synced)
    drop_policy: str = "block"
    gen_seconds: tuple[float, float] = (1.0, 1.0)
    tail_prob: float = 0.0  # chance a group is a long-tail one, taking tail_factor times longer
    tail_factor: float = 10.0
    train_seconds: tuple[float, float] = (1.0, 1.0)
    sync_seconds: float = 0.0  # delay before the Rollouter generates with a new version
    checkpoint_after_update: int | None = None  # save after this many updates, then kill and resume
    kill_after_seconds: float = 0.0  # work done this long after the checkpoint is lost (kill at the end at latest)
    shuffle: bool = True

    def __post_init__(self) -> None:
        b = self.budget.groups_per_update
        total = self.num_prompts * self.epochs
        if self.num_prompts < 1 or self.epochs < 1 or self.max_in_flight < 1:
            raise ValueError("SimConfig: num_prompts, epochs and max_in_flight must be >= 1")
        if total % b:
            raise ValueError(f"SimConfig: num_prompts * epochs = {total} is not a multiple of {b} groups per update")
        if self.capacity < b:
            raise ValueError(f"SimConfig: queue_capacity {self.capacity} < {b} groups per update: the trainer starves")
        if self.checkpoint_after_update is not None and not 1 <= self.checkpoint_after_update < self.total_updates:
            raise ValueError(f"SimConfig: checkpoint_after_update must be in [1, {self.total_updates})")

    @property
    def total_updates(self) -> int:
        return self.num_prompts * self.epochs // self.budget.groups_per_update

    @property
    def capacity(self) -> int:
        return self.queue_capacity if self.queue_capacity is not None else self.budget.groups_per_window_budget


@dataclass(frozen=True)
class ConsumedGroup:
    group_id: str
    epoch: int
    index: int
    start_version: int
    consume_version: int

    @property
    def staleness(self) -> int:
        return self.consume_version - self.start_version


@dataclass
class SimResult:
    """What the trained model saw, in consumption order, plus the final objects for further checks."""

    consumed: list[ConsumedGroup]
    dropped: list[str]
    abandoned: list[str]
    restored: bool
    end_seconds: float
    ledger: PromptLedger
    controller: StalenessController
    queue: MessageQueue


class _Sim:
    def __init__(self, config: SimConfig, seed: int):
        self.cfg = config
        self.b = config.budget
        self.rng = random.Random(seed)
        self.seed = seed
        self.t = 0.0
        self._seq = 0
        self.consumed: list[ConsumedGroup] = []
        self.dropped: list[str] = []
        self.abandoned: list[str] = []
        self.saved: dict[str, Any] | None = None
        self.kill_pending = False
        self.restored = False
        self._fresh_process()

    def _fresh_process(self) -> None:
        """Everything a kill -9 destroys."""
        c = self.cfg
        self.controller = StalenessController(self.b)
        self.queue = MessageQueue(c.capacity, c.drop_policy)
        self.ledger = PromptLedger()
        self.sampler = EpochSampler(c.num_prompts, batch_size=1, seed=self.seed, shuffle=c.shuffle)
        self.events: list[tuple[float, int, str, Any]] = []
        self.generating = 0
        self.pending_put: deque[Group] = deque()  # generated, waiting for room in the queue (holds a slot)
        self.trainer_busy = False
        self.updates = 0

    def _at(self, delay: float, kind: str, payload: Any = None) -> None:
        self._seq += 1
        heapq.heappush(self.events, (self.t + delay, self._seq, kind, payload))

    # ---- Rollouter -----------------------------------------------------------------------------------------
    def _next_prompt(self) -> tuple[int, int] | None:
        reissue = self.ledger.to_reissue()
        if reissue:
            return reissue[0]
        drawn = self.sampler.epoch * self.cfg.num_prompts + self.sampler.position
        if self.cfg.drop_policy == "block" and drawn >= self.cfg.num_prompts * self.cfg.epochs:
            return None
        return self.sampler.next_batch()[0]

    def _fill(self) -> None:
        c = self.cfg
        while self.generating + len(self.pending_put) < c.max_in_flight and self.controller.can_start():
            key = self._next_prompt()  # drawn only once admitted: a drawn prompt is always issued
            if key is None:
                return
            gid = self.ledger.issue(*key)
            version = self.controller.on_start(gid)
            seconds = self.rng.uniform(*c.gen_seconds)
            if self.rng.random() < c.tail_prob:
                seconds *= c.tail_factor
            self.generating += 1
            self._at(seconds, "generated", Group(gid, key[0], key[1], version))

    def _put_pending(self) -> None:
        while self.pending_put:
            group = self.pending_put[0]
            result = self.queue.put(group, timeout=0)
            if not result:
                return
            self.pending_put.popleft()
            if result.dropped:
                self.controller.on_dropped(result.dropped)
                self.ledger.dropped(result.dropped)
                self.dropped.extend(result.dropped)
            self.controller.on_queued(group.group_id)  # only now: its queue position is fixed
            self.ledger.queued(group.group_id)

    # ---- Trainer -------------------------------------------------------------------------------------------
    def _train(self) -> None:
        if self.trainer_busy or self.updates >= self.cfg.total_updates:
            return
        batch = self.queue.get_batch(self.b.groups_per_update, timeout=0)
        if batch is not None:
            self.trainer_busy = True
            self._at(self.rng.uniform(*self.cfg.train_seconds), "updated", batch)

    def _updated(self, batch: list[Group]) -> None:
        version = self.updates // self.b.trigger_parameter_sync_step
        ids = [g.group_id for g in batch]
        self.controller.on_consumed(ids, version)  # raises StalenessViolation if the bound broke
        self.ledger.consumed(ids)
        self.consumed.extend(ConsumedGroup(g.group_id, g.epoch, g.index, g.start_version, version) for g in batch)
        self.updates += 1
        self.trainer_busy = False
        if self.updates % self.b.trigger_parameter_sync_step == 0:
            self._at(self.cfg.sync_seconds, "synced", self.updates // self.b.trigger_parameter_sync_step)
        if self.updates == self.cfg.checkpoint_after_update and self.saved is None:
            self._checkpoint()
            self.kill_pending = True
            self._at(self.cfg.kill_after_seconds, "killed")

    # ---- checkpoint / kill -9 ------------------------------------------------------------------------------
    def _checkpoint(self) -> None:
        def roundtrip(state: dict[str, Any]) -> dict[str, Any]:
            return json.loads(json.dumps(state))  # proves the states survive a JSON checkpoint file

        self.saved = {
            "controller": roundtrip(self.controller.state_dict()),
            "ledger": roundtrip(self.ledger.state_dict()),
            "sampler": roundtrip(self.sampler.state_dict()),
            "queue": copy.deepcopy(self.queue.snapshot()),
            "updates": self.updates,
            "logs": (len(self.consumed), len(self.dropped)),
        }

    def _kill_and_resume(self) -> None:
        assert self.saved is not None
        s = self.saved
        self._fresh_process()
        self.controller.load_state_dict(s["controller"])
        self.ledger.load_state_dict(s["ledger"])
        self.sampler.load_state_dict(s["sampler"])
        self.queue.restore(copy.deepcopy(s["queue"]))
        self.updates = s["updates"]
        n_consumed, n_dropped = s["logs"]
        del self.consumed[n_consumed:], self.dropped[n_dropped:]
        if set(self.queue.ids()) != set(self.controller.queued()):
            raise RuntimeError("checkpoint is inconsistent: queue snapshot and controller disagree on queued groups")
        lost = self.controller.abandon_in_flight()
        open_unqueued = {g for g, stage in self.ledger.open_groups().items() if stage != "queued"}
        if set(lost) != open_unqueued:
            raise RuntimeError("checkpoint is inconsistent: ledger and controller disagree on in-flight groups")
        self.ledger.abandoned(lost)
        self.abandoned.extend(lost)
        resumed_version = self.updates // self.b.trigger_parameter_sync_step  # the weights the trainer reloads
        if resumed_version > self.controller.version:
            self.controller.on_sync(resumed_version)
        self.kill_pending = False
        self.restored = True

    # ---- loop ----------------------------------------------------------------------------------------------
    def run(self) -> SimResult:
        self._fill()
        while True:
            if self.kill_pending and self.updates >= self.cfg.total_updates:
                self._kill_and_resume()  # the run dies just before it would have finished
            elif self.updates >= self.cfg.total_updates:
                break
            elif not self.events:
                raise RuntimeError(
                    f"simulation stalled at t={self.t:.3f}s after {self.updates} updates: "
                    f"{len(self.queue)} queued, {self.generating} generating, {len(self.pending_put)} waiting to "
                    f"queue, controller {self.controller.metrics()}"
                )
            else:
                self.t, _, kind, payload = heapq.heappop(self.events)
                if kind == "generated":
                    self.generating -= 1
                    self.ledger.generated(payload.group_id)
                    self.pending_put.append(payload)
                elif kind == "updated":
                    self._updated(payload)
                elif kind == "synced":
                    self.controller.on_sync(max(payload, self.controller.version))
                elif kind == "killed":
                    self._kill_and_resume()
            self._put_pending()
            self._train()
            self._fill()
        return SimResult(
            consumed=self.consumed,
            dropped=self.dropped,
            abandoned=self.abandoned,
            restored=self.restored,
            end_seconds=self.t,
            ledger=self.ledger,
            controller=self.controller,
            queue=self.queue,
        )


def simulate(config: SimConfig, seed: int = 0) -> SimResult:
    """Run ``config`` to the end (``total_updates`` updates) with all randomness from ``seed``."""
    return _Sim(config, seed).run()
