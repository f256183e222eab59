"""Errors of the weight sync, so callers can tell a sync failure from any other RuntimeError."""

from __future__ import annotations


class WeightSyncError(RuntimeError):
    """A weight sync (or the set-up of its group) failed; the message names the version and the worker's rank."""


class HandshakeError(WeightSyncError):
    """At group creation the trainer's parameter list did not match a rollout worker's model."""


class SyncTimeoutError(WeightSyncError, TimeoutError):
    """A sync did not finish within its timeout (a peer never took part, or the link stalled). The group is unusable
    afterwards (its ranks are out of step): create a new one."""


def rank_label(rank: int) -> str:
    """How an error names a member of the sync group."""
    return "trainer (rank 0)" if rank == 0 else f"rollout worker rank {rank}"
