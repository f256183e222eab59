"""Admission control and consumption order for ``fully_async``: every consumed group within ``max_staleness``.

Units: a *group* is the ``rollout.n`` responses to one prompt; a *version* is the trainer's weight version (one more
every ``trigger_parameter_sync_step`` updates). ``B`` groups per update, ``W`` per version, ``s`` =
``staleness_threshold``, ``M = W + floor(W * s)``, ``S = max_staleness``. A group starts only if ``N`` (groups started
and not dropped/abandoned, itself counted) ``<= v_r * W + M`` (``v_r``: the Rollouter's version); under
``staleness_rule=exact`` an update takes the ``B`` earliest deadlines (``start_version + S``) only if what it leaves
still fits before theirs (``pick``), under ``budget`` the oldest ``B``. Derivation and proof:
docs/schedules/fully_async.md, "The bound, derived".
"""

from __future__ import annotations

import functools
import math
import threading
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from fractions import Fraction
from typing import Any

from asyncrl.config.training import STALENESS_RULES

# the controller's integer state, each kept as ``_<key>`` and checkpointed under ``<key>``
_COUNTS = ("version", "started", "consumed", "dropped", "abandoned", "max_seen_staleness")


class AdmissionRefused(RuntimeError):
    """``on_start`` was called when starting a group could break the staleness bound (call ``can_start`` first)."""


class StalenessViolation(RuntimeError):
    """A consumed group is staler than ``max_staleness``: the protocol was broken (a batch not chosen by ``pick``)."""


@dataclass(frozen=True)
class StalenessBudget:
    """The four config knobs and what they imply, in groups and versions."""

    require_batches: int = 1
    ppo_mini_batch_size: int = 1
    trigger_parameter_sync_step: int = 1
    staleness_threshold: float = 0.0
    rule: str = "exact"  # exact: every group within max_staleness (consumed by deadline) | budget: FIFO, as verl

    def __post_init__(self) -> None:
        if self.rule not in STALENESS_RULES:
            raise ValueError(f"staleness rule must be one of {', '.join(STALENESS_RULES)} (got {self.rule!r})")
        for name in ("require_batches", "ppo_mini_batch_size", "trigger_parameter_sync_step"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an integer >= 1 (got {value!r})")
        s = self.staleness_threshold
        if not isinstance(s, int | float) or not math.isfinite(s) or s < 0:
            raise ValueError(f"staleness_threshold must be >= 0 (got {s!r})")

    @property
    def groups_per_update(self) -> int:
        """B: groups the trainer consumes per optimizer update."""
        return self.require_batches * self.ppo_mini_batch_size

    @property
    def groups_per_version(self) -> int:
        """W: groups consumed in one sync window, i.e. per weight version."""
        return self.groups_per_update * self.trigger_parameter_sync_step

    @functools.cached_property  # asked at every admission check: computed once (the budget is frozen)
    def extra_groups(self) -> int:
        """floor(W * s): groups the Rollouter may run ahead of the trainer's window."""
        return math.floor(self.groups_per_version * Fraction(str(self.staleness_threshold)))

    @property
    def groups_per_window_budget(self) -> int:
        """M = W + floor(W * s): verl's cap on groups produced while at one version (also a good queue capacity)."""
        return self.groups_per_version + self.extra_groups

    @property
    def max_staleness(self) -> int:
        """S = ceil(floor(W * s) / W), in versions: the bound every consumed group satisfies."""
        w = self.groups_per_version
        return (self.extra_groups + w - 1) // w


class StalenessController:
    """Tracks every live group (in flight, queued) and decides whether the Rollouter may start one more.

    Thread-safe: the Rollouter's threads call ``can_start``/``on_start``/``on_queued``/``on_dropped``, the trainer
    side calls ``pick``/``on_consumed``/``on_sync``. Call ``on_queued`` only *after* the group is in the queue.
    ``on_consumed`` arriving before ``on_queued`` for the same group is accounted for (``Producer`` itself never
    does that: it puts and calls ``on_queued`` under the lock its ``take`` holds).
    """

    def __init__(self, budget: StalenessBudget, version: int = 0):
        if version < 0:
            raise ValueError(f"StalenessController: version must be >= 0 (got {version})")
        self.budget = budget
        self._cond = threading.Condition()
        self._version = version  # the Rollouter's weight version (last synced)
        self._in_flight: dict[str, int] = {}  # group id -> start version; started, not yet in the queue
        self._queued: dict[str, int] = {}  # group id -> start version; in the queue, not yet consumed
        self._consumed_unqueued: set[str] = set()  # consumed before its on_queued arrived
        self._started = self._consumed = self._dropped = self._abandoned = 0
        self._max_seen_staleness = 0

    # ---- views ---------------------------------------------------------------------------------------------
    @property
    def version(self) -> int:
        """The Rollouter's version: new groups start with it."""
        return self._version

    @property
    def consumed(self) -> int:
        """Groups consumed by the trainer so far (a multiple of ``groups_per_update``)."""
        return self._consumed

    @property
    def trainer_version(self) -> int:
        """The trainer's version implied by what it consumed: ``consumed // W``."""
        return self._consumed // self.budget.groups_per_version

    def in_flight(self) -> dict[str, int]:
        with self._cond:
            return dict(self._in_flight)

    def queued(self) -> dict[str, int]:
        with self._cond:
            return dict(self._queued)

    def live_groups(self) -> int:
        """N without a candidate: consumed + queued + in flight (started minus dropped/abandoned)."""
        with self._cond:
            return self._live()

    def admission_limit(self) -> int:
        """The largest N (counting a candidate) admission allows right now."""
        with self._cond:
            return self._limit()

    # ---- admission -----------------------------------------------------------------------------------------
    def _live(self) -> int:
        return self._consumed + len(self._queued) + len(self._in_flight)

    def _limit(self) -> int:
        b = self.budget
        return self._version * b.groups_per_version + b.groups_per_window_budget

    def can_start(self) -> bool:
        with self._cond:
            return self._live() + 1 <= self._limit()

    def on_start(self, group_id: str) -> int:
        """Record that generation of ``group_id`` starts now; returns its start version. Raises if not admissible."""
        with self._cond:
            if group_id in self._in_flight or group_id in self._queued:
                raise ValueError(f"StalenessController.on_start: group {group_id!r} is already live")
            n, limit = self._live() + 1, self._limit()
            if n > limit:
                raise AdmissionRefused(
                    f"cannot start group {group_id!r}: {n} live groups would exceed the admission limit {limit} "
                    f"(version {self._version}, max_staleness {self.budget.max_staleness})"
                )
            self._in_flight[group_id] = self._version
            self._started += 1
            return self._version

    def replay_start(self, group_id: str, start_version: int) -> None:
        """Record a start another controller admitted (a dead Rollouter's, replayed by its replacement before it
        starts: ``asyncrl.schedules.fully_async.recovery``); no admission check, since the group already exists."""
        with self._cond:
            if group_id in self._in_flight or group_id in self._queued:
                raise ValueError(f"StalenessController.replay_start: group {group_id!r} is already live")
            if start_version > self._version:
                raise ValueError(
                    f"StalenessController.replay_start: group {group_id!r} started at version {start_version}, "
                    f"after this controller's version {self._version}"
                )
            self._in_flight[group_id] = start_version
            self._started += 1

    def wait_for_admission(self, timeout: float | None = None) -> bool:
        """Block until a start is admissible (True) or ``timeout`` seconds pass (False)."""
        with self._cond:
            return self._cond.wait_for(lambda: self._live() + 1 <= self._limit(), timeout)

    # ---- consumption ---------------------------------------------------------------------------------------------
    def pick(self, candidates: list[tuple[str, int]], trainer_version: int) -> list[int] | None:
        """Which of ``candidates`` (``(group id, start version)`` of the queued and finished groups, in the order
        they would be taken FIFO) the next update takes: positions into ``candidates``, in that order; None to wait.

        ``budget``: the first ``B``. ``exact``: the ``B`` with the earliest deadlines, and only if the groups left
        unconsumed still fit the positions left before their deadlines; else None, so the trainer waits for the due
        group still generating."""
        b = self.budget
        n = b.groups_per_update
        if len(candidates) < n:
            return None
        if b.rule == "budget":
            return list(range(n))
        order = sorted(range(len(candidates)), key=lambda k: candidates[k][1])  # stable: FIFO among equals
        chosen = set(order[:n])
        taken = {candidates[k][0] for k in chosen}
        with self._cond:
            if trainer_version != self.trainer_version:
                raise ValueError(
                    f"StalenessController.pick: trainer reports version {trainer_version}, its consumption says "
                    f"{self.trainer_version}"
                )
            due: dict[int, int] = {}  # deadline -> unconsumed groups left behind with it
            for gid, start in [*self._queued.items(), *self._in_flight.items()]:
                if gid not in taken:
                    deadline = start + b.max_staleness
                    due[deadline] = due.get(deadline, 0) + 1
            after = self._consumed + n
            left = sum(k for d, k in due.items() if d < trainer_version)  # overdue: none while the rule is kept
            for u in range(trainer_version, max(due, default=trainer_version) + 1):
                left += due.get(u, 0)
                if left > (u + 1) * b.groups_per_version - after:
                    return None
        return sorted(chosen)

    # ---- lifecycle -----------------------------------------------------------------------------------------
    def on_queued(self, group_id: str) -> None:
        """``group_id`` is now in the queue (a consumer may take it)."""
        with self._cond:
            if group_id in self._consumed_unqueued:
                self._consumed_unqueued.discard(group_id)
                return
            if group_id not in self._in_flight:
                raise ValueError(f"StalenessController.on_queued: group {group_id!r} is not in flight")
            self._queued[group_id] = self._in_flight.pop(group_id)
            self._cond.notify_all()

    def on_dropped(self, group_ids: Iterable[str]) -> None:
        """Groups that will never be consumed (dropped from the queue, or generation failed): they free budget."""
        ids = list(group_ids)
        with self._cond:
            unknown = [g for g in ids if g not in self._queued and g not in self._in_flight]
            if unknown or len(set(ids)) != len(ids):
                raise ValueError(
                    f"StalenessController.on_dropped: groups {unknown or ids} are not each queued or in flight once"
                )
            for gid in ids:
                self._queued.pop(gid, None)
                self._in_flight.pop(gid, None)
            self._dropped += len(ids)
            self._cond.notify_all()

    def on_consumed(self, group_ids: list[str], trainer_version: int) -> list[int]:
        """One optimizer update at ``trainer_version`` consumed ``group_ids``; returns their staleness (versions).

        The update must consume exactly ``groups_per_update`` groups and run at ``consumed // W``: the position ->
        version mapping the bound rests on. Under the exact rule a group staler than ``max_staleness`` raises
        ``StalenessViolation``; under ``budget`` its staleness is only recorded.
        """
        with self._cond:
            b = self.budget
            if len(group_ids) != b.groups_per_update:
                raise ValueError(
                    f"StalenessController.on_consumed: an update consumes require_batches * ppo_mini_batch_size = "
                    f"{b.groups_per_update} groups (got {len(group_ids)})"
                )
            if trainer_version != self.trainer_version:
                raise ValueError(
                    f"StalenessController.on_consumed: trainer reports version {trainer_version} but has consumed "
                    f"{self._consumed} groups, i.e. version {self.trainer_version} at {b.groups_per_version} groups "
                    f"per version"
                )
            if len(set(group_ids)) != len(group_ids):
                raise ValueError(f"StalenessController.on_consumed: duplicate group ids in one update {group_ids}")
            unknown = [g for g in group_ids if g not in self._queued and g not in self._in_flight]
            if unknown:
                raise ValueError(
                    f"StalenessController.on_consumed: groups {unknown} are not live (consumed twice, dropped, or "
                    f"never started)"
                )
            stale: list[int] = []
            for gid in group_ids:
                if gid in self._queued:
                    start = self._queued.pop(gid)
                else:  # the consumer took it from the queue before on_queued reached us
                    start = self._in_flight.pop(gid)
                    self._consumed_unqueued.add(gid)
                stale.append(trainer_version - start)
            self._consumed += len(group_ids)
            self._max_seen_staleness = max([self._max_seen_staleness, *stale])
            self._cond.notify_all()
            worst = max(stale)
            if worst > b.max_staleness and b.rule == "exact":
                raise StalenessViolation(
                    f"a group consumed at version {trainer_version} has staleness {worst} > max_staleness "
                    f"{b.max_staleness}; was the queue reordered?"
                )
            return stale

    def on_sync(self, new_version: int) -> None:
        """The Rollouter now generates with ``new_version`` (in-flight groups keep their start version)."""
        with self._cond:
            if new_version < self._version:
                raise ValueError(
                    f"StalenessController.on_sync: version can only grow (at {self._version}, got {new_version})"
                )
            self._version = new_version
            self._cond.notify_all()

    # ---- checkpoint / metrics ------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """JSON-friendly; carries in-flight and queued groups so the bound holds across a resume."""
        with self._cond:
            return {
                "budget": asdict(self.budget),
                "in_flight": dict(self._in_flight),
                "queued": dict(self._queued),
                "consumed_unqueued": sorted(self._consumed_unqueued),
                **{k: getattr(self, f"_{k}") for k in _COUNTS},
            }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore exactly. A different budget is refused: groups already admitted were admitted under the old one."""
        saved = StalenessBudget(**state["budget"])
        if saved != self.budget:
            now = asdict(self.budget)
            diff = [f"{k}={v!r} (now {now[k]!r})" for k, v in asdict(saved).items() if v != now[k]]
            raise ValueError(f"StalenessController.load_state_dict: the checkpoint was written with {', '.join(diff)}")
        with self._cond:
            self._in_flight = {str(k): int(v) for k, v in state["in_flight"].items()}
            self._queued = {str(k): int(v) for k, v in state["queued"].items()}
            self._consumed_unqueued = set(state["consumed_unqueued"])
            for k in _COUNTS:
                setattr(self, f"_{k}", int(state[k]))
            self._cond.notify_all()

    def metrics(self) -> dict[str, float]:
        """Gauges for telemetry (groups and versions)."""
        with self._cond:
            return {
                "fully_async/rollout_version": float(self._version),
                "fully_async/in_flight_groups": float(len(self._in_flight)),
                "fully_async/queued_groups": float(len(self._queued)),
                "fully_async/admission_headroom": float(self._limit() - self._live()),
                "fully_async/dropped_groups": float(self._dropped),
                "fully_async/max_seen_staleness": float(self._max_seen_staleness),
            }
