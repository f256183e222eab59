"""Keeping a rollout pool alive: a rollout worker that dies (or hangs) mid-generation is replaced, not fatal.

``RolloutPool`` watches the pool of ``one_step_off`` and ``two_step_off`` on Ray: a worker whose process died or that
does not answer within ``rollout.generate_timeout_s`` is killed and replaced on its bundle, the weight-sync group is
rebuilt (a gloo group cannot take a new member) with the trainer's current weights, and its share is generated again,
same prompts and seed. What the run survives and how it stops (``trainer.max_worker_restarts``): docs/faults.md.
An error raised by the worker's own code (a bad prompt, a reward service that is down) is not a death: it is raised
as it is, since a new worker would fail the same way.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, TypeVar

from asyncrl.calls import Handle, Pending, error_text
from asyncrl.weights.clients import SyncPeer

if TYPE_CHECKING:
    from asyncrl.roles.clients import Roles, RolloutClient
    from asyncrl.weights.stats import SyncStats
    from asyncrl.weights.weight_sync import WeightSync

T = TypeVar("T")

logger = logging.getLogger(__name__)

PING_TIMEOUT_S = 10.0  # a live worker answers a ping at once (between its calls, as after a failed sync)
# what Ray raises when the actor's process is gone (by class name: this module must not import Ray)
DEATH_ERRORS = ("ActorDiedError", "RayActorError", "ActorUnavailableError", "WorkerCrashedError", "OwnerDiedError")


class WorkerLostError(RuntimeError):
    """A worker died or hung more often than ``trainer.max_worker_restarts`` allows; names it and the cause."""


def is_worker_death(e: BaseException) -> bool:
    """The worker's process is gone (Ray's errors for a dead actor), as opposed to an error its code raised."""
    return type(e).__name__ in DEATH_ERRORS


def ping_failure(handle: Handle, timeout_s: float = PING_TIMEOUT_S) -> str | None:
    """Why ``handle``'s worker is dead or hung (after a failed weight sync), or None when it answers a ping."""
    ping = SyncPeer(handle).weight_sync_ping()
    try:
        ping.result(timeout=timeout_s)
    except Exception as e:  # noqa: BLE001 - a death or no answer counts; an error of its code does not
        if is_worker_death(e):
            return error_text(e)
        if isinstance(e, TimeoutError) and not ping.done():
            return f"no answer to a ping within {timeout_s:g} s"
    return None


class Supervisor:
    """What every supervisor of rollout workers shares: the restart budget, and joining a replacement to the
    weight-sync group with the trainer's current weights."""

    def __init__(
        self,
        roles: Roles,
        sync: WeightSync,
        respawn: Callable[[int], Handle],
        version: Callable[[], int],
        max_restarts: int,
        timeout_s: float,
    ):
        self.roles, self.sync, self.respawn, self.version = roles, sync, respawn, version
        self.max_restarts, self.timeout_s = max_restarts, timeout_s
        self.restarts: list[tuple[str, str]] = []  # (worker, cause) of every replacement so far

    def count_failure(self, name: str, cause: str) -> None:
        """Record a failure of worker ``name``; past the budget, the run stops with ``WorkerLostError``."""
        self.restarts.append((name, cause))
        if len(self.restarts) > self.max_restarts:
            raise WorkerLostError(
                f"rollout worker {name} failed: {cause}; that is {len(self.restarts)} worker failures, more than "
                f"trainer.max_worker_restarts={self.max_restarts} (earlier: {self.restarts[:-1]})"
            )
        logger.warning(
            "rollout worker %s failed (%s): replacing it (%d of %d)", name, cause, len(self.restarts), self.max_restarts
        )

    def swap(self, old: Handle, new: Handle) -> None:
        """``new`` takes ``old``'s place (killed already: its bundle of CPUs is the one ``new`` gets) among the run's
        workers and in a new sync group, which then gets the trainer's current weights."""
        self.roles.handles = [h for h in self.roles.handles if h is not old]
        self.roles.handles.append(new)
        self.sync.receivers = self.roles.receivers
        self.sync.setup()  # a new group: the old one lost a member
        self.sync.push(self.version())


class RolloutPool(Supervisor):
    """The rollout pool of ``one_step_off`` / ``two_step_off`` (the module docstring)."""

    def wait(self, i: int, call: Pending[T], again: Callable[[RolloutClient], Pending[T]]) -> T:
        """``call``'s result from worker ``i``; if the worker died or hung, replace it and run ``again`` on the new
        one, as often as the restart budget allows."""
        while True:
            try:
                return call.result(timeout=self.timeout_s)
            except Exception as e:  # noqa: BLE001 - sorted below: a death is handled, anything else re-raised
                hung = isinstance(e, TimeoutError) and not call.done()
                if not hung and not is_worker_death(e):
                    raise
                cause = f"no answer within rollout.generate_timeout_s={self.timeout_s:g} s" if hung else error_text(e)
                call = again(self.replace(i, cause))

    def push(self, version: int) -> SyncStats:
        """``WeightSync.push``; a receiver that died before or during it is replaced (which syncs the new group), and
        the push is repeated. Any other sync failure is raised as it is."""
        from asyncrl.weights.errors import WeightSyncError

        while True:
            try:
                return self.sync.push(version)
            except WeightSyncError as e:
                # the dead or hung: a ping answered by Ray's error for a dead actor, or not answered at once
                found = [(i, ping_failure(r.handle)) for i, r in enumerate(self.roles.rollouts)]
                dead = [(i, cause) for i, cause in found if cause is not None]
                if not dead:
                    raise
                for i, cause in dead:
                    self.replace(i, f"{cause} (found at the weight sync of version {version}: {str(e)[:200]})")

    def replace(self, i: int, cause: str) -> RolloutClient:
        from asyncrl.roles.clients import RolloutClient

        old = self.roles.rollouts[i]
        self.count_failure(old.name, cause)
        old.handle.kill()
        new = RolloutClient(self.respawn(i))
        self.roles.rollouts[i] = new
        self.swap(old.handle, new.handle)
        return new
