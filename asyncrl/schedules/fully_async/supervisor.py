"""Keeping the ``fully_async`` Rollouter alive: ``StreamSupervisor`` replaces one that dies or hangs, losing no prompt.

It keeps the Rollouter's last snapshot (taken at every weight sync, while parked, and once before it starts) and every
batch consumed since; a replacement restores both (``recovery``), then the failed call is repeated (docs/faults.md).
After ``trainer.max_worker_restarts`` failures, one inside a step lets the step finish and be logged (``lost``) and the
next ``get_batch`` raises the ``WorkerLostError``; the schedule then checkpoints ``advanced()``, the snapshot the dead
Rollouter would have given. In-process (no ``respawn``) nothing is kept and a failure ends the run.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, TypeVar

from asyncrl.calls import Handle, Pending, error_text
from asyncrl.run.supervision import Supervisor, WorkerLostError, is_worker_death, ping_failure
from asyncrl.schedules.fully_async.client import RollouterClient
from asyncrl.schedules.fully_async.recovery import ConsumedBatch, RollouterSnapshot, StreamBatch, Takeover, advance
from asyncrl.schedules.fully_async.staleness import StalenessBudget
from asyncrl.weights.errors import WeightSyncError

if TYPE_CHECKING:
    from asyncrl.roles.clients import Roles
    from asyncrl.weights.weight_sync import SyncStats, WeightSync

T = TypeVar("T")
GRACE_S = 60.0  # beyond the Rollouter's own deadline for a call: only then is a silent Rollouter hung


class StreamSupervisor(Supervisor):
    def __init__(
        self,
        roles: Roles,
        sync: WeightSync,
        respawn: Callable[[int], Handle] | None,
        version: Callable[[], int],
        max_restarts: int,
        timeout_s: float,  # the longest a Rollouter call may take (its own deadlines), before the grace
        budget: StalenessBudget,
    ):
        super().__init__(roles, sync, respawn or _no_respawn, version, max_restarts, timeout_s + GRACE_S)
        self.replaceable, self.budget = respawn is not None, budget
        self.base: RollouterSnapshot | None = None  # the last snapshot (kept only when replaceable)
        self.consumed: list[ConsumedBatch] = []  # what the trainer took since ``base``
        self.lost: WorkerLostError | None = None  # the restart budget is spent: raised at the next ``get_batch``
        self.streaming = False  # started: held-out prompts are decoded while it is parked (asyncrl.run.evaluation)

    def advanced(self) -> RollouterSnapshot:
        """What the Rollouter's snapshot would be now, at the trainer's version (``recovery``)."""
        assert self.base is not None
        return advance(Takeover(self.base, self.consumed, self.version()), self.budget)

    @property
    def rollouter(self) -> RollouterClient:
        assert self.roles.rollouter is not None
        return RollouterClient(self.roles.rollouter.handle)

    def start(self, resumed: RollouterSnapshot | Takeover | None) -> None:
        """Restore a checkpoint's snapshot or a takeover (if any), keep the base, open the metrics window and start."""
        r = self.rollouter
        if resumed is not None:
            r.restore(resumed).result()
        if self.replaceable:
            self.base, self.consumed = r.snapshot().result(), []
        r.take_metrics().result()  # start the idle window now
        r.start().result()
        self.streaming = True

    def get_batch(self, n_groups: int, trainer_version: int) -> StreamBatch:
        if self.lost is not None:
            raise self.lost
        got = self.call(lambda r: r.get_batch(n_groups, trainer_version))
        if self.replaceable:
            self.consumed.append(ConsumedBatch(got.groups, trainer_version))
        return got

    def push(
        self, version: int, interrupt: bool, snapshot: bool
    ) -> tuple[float, SyncStats | None, RollouterSnapshot | None]:
        """Park the Rollouter, push ``version``, snapshot it (for a checkpoint, or as the new base), let it go on:
        (seconds to park, the push's stats, the snapshot or None). A death on the way replaces the Rollouter,
        which then already holds ``version`` (the stats are None)."""
        r = self.rollouter
        try:
            paused = r.pause(interrupt).result(timeout=self.timeout_s)
            stats = self.sync.push(version)
            packed = r.resume_generation(version, snapshot or self.replaceable).result(timeout=self.timeout_s)
            snap = packed.unpack() if packed is not None else None
        except Exception as e:  # noqa: BLE001 - a death is handled, anything else re-raised
            # lost: the step trained, it finishes, and the next get_batch raises
            return (0.0, None, self.base) if self._survive(e, r) else (0.0, None, self.advanced())
        if self.replaceable:
            self.base, self.consumed = snap, []
        return paused, stats, snap

    def parked(self, fn: Callable[[RollouterClient], T], interrupt: bool) -> T | None:
        """``fn(rollouter)`` while the Rollouter is parked (its engine holds no row then: held-out evaluation on it),
        after which it goes on with the weights it holds. A death on the way replaces it and gives None."""
        r = self.rollouter
        try:
            r.pause(interrupt).result(timeout=self.timeout_s)
            try:
                return fn(r)
            finally:
                version = r.version().result(timeout=self.timeout_s)
                r.resume_generation(version).result(timeout=self.timeout_s)
        except Exception as e:  # noqa: BLE001 - a death is handled, anything else re-raised
            self._survive(e, r)
            return None

    def _survive(self, e: BaseException, r: RollouterClient) -> bool:
        """After ``e`` from ``r``: re-raised unless ``r`` died or hung; else a replacement is started (True), or, with
        no restart left, ``lost`` is set for the next ``get_batch`` to raise (False)."""
        cause = self._failure(e, r)
        if cause is None:
            raise e
        try:
            self.replace(cause)
        except WorkerLostError as lost:
            self.lost = lost
            return False
        return True

    def metrics(self) -> dict[str, float]:
        """The Rollouter's metrics since the last call; none once it is lost (the step still gets logged)."""
        if self.lost is not None:
            return {}
        try:
            return self.call(lambda r: r.take_metrics())
        except WorkerLostError as lost:
            self.lost = lost
            return {}

    def call(self, fn: Callable[[RollouterClient], Pending[T]]) -> T:
        """``fn(rollouter)``'s result; if the Rollouter died or hung, replace it and call again (within budget)."""
        while True:
            r = self.rollouter
            pending = fn(r)
            try:
                return pending.result(timeout=self.timeout_s)
            except Exception as e:  # noqa: BLE001 - a death is handled, anything else re-raised
                hung = isinstance(e, TimeoutError) and not pending.done()
                cause = f"no answer within {self.timeout_s:g} s" if hung else self._failure(e, r)
                if cause is None:
                    raise
                if not self.replaceable:  # in-process: no process of its own to kill and start again
                    raise WorkerLostError(f"{r.name}: {cause}; an in-process Rollouter cannot be replaced") from e
                self.replace(cause)

    def _failure(self, e: BaseException, r: RollouterClient) -> str | None:
        """Why the Rollouter is to be replaced, or None when ``e`` is not its death (or it cannot be replaced)."""
        if not self.replaceable:
            return None
        if is_worker_death(e):
            return error_text(e)
        if isinstance(e, WeightSyncError):  # a receiver that died mid-sync fails the group: was it the Rollouter?
            cause = ping_failure(r.handle)
            if cause is not None:
                return f"{cause} (found at a weight sync: {str(e)[:200]})"
        return None

    def replace(self, cause: str) -> None:
        old = self.rollouter
        self.count_failure(old.name, cause)
        assert self.base is not None
        old.handle.kill()
        new = RollouterClient(self.respawn(0))
        self.roles.rollouter = new
        self.swap(old.handle, new.handle)  # the new one holds the trainer's current version
        self.start(Takeover(self.base, self.consumed, self.version()))


def _no_respawn(i: int) -> Handle:
    raise AssertionError("StreamSupervisor: nothing to respawn with (in-process)")
