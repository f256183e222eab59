"""The Ray edge of the weight sync: mixins for worker classes and driver-side helpers for the pipelines.

A trainer worker class inherits :class:`SyncSenderMixin` (it must have ``self.model``), a rollout worker class
:class:`SyncReceiverMixin` (it must have ``self.engine``, a ``RolloutEngine``). The driver then calls
:func:`setup_weight_sync` once per run and :func:`sync_weights` after every optimizer step. The tensors travel over
the sync group (gloo/NCCL), not through Ray's object store; Ray only carries the calls.

Each actor call blocks its actor while the sync runs, so the actors must not be busy with another call (a rollout
worker must have returned from ``generate`` first) or the sync times out. After a timeout or transport error the
group is unusable: call :func:`setup_weight_sync` again (a process may set up any number of groups in turn).
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from typing import Any

import ray
import torch

from asyncrl.sync.errors import WeightSyncError
from asyncrl.sync.group import WeightSyncGroup, rank_label
from asyncrl.sync.stats import SyncStats, memcpy_bytes_per_s
from asyncrl.sync.transport import LOOPBACK, find_free_port

__all__ = [
    "SyncReceiverMixin",
    "SyncSenderMixin",
    "memcpy_bytes_per_s",
    "setup_weight_sync",
    "sync_weights",
]


def driver_grace_s(timeout_s: float) -> float:
    """How long past ``timeout_s`` the driver waits, so workers' own (more precise) timeout errors arrive first."""
    return 2.0 + 0.1 * timeout_s


class _WeightSyncMixin:
    """What sender and receiver share: the group object and its (re-)creation."""

    _weight_sync: WeightSyncGroup | None = None

    def weight_sync_tensors(self) -> dict[str, torch.Tensor]:
        raise TypeError(f"{type(self).__name__}: use SyncSenderMixin or SyncReceiverMixin, which say what is synced")

    def init_weight_sync(
        self,
        rank: int,
        world_size: int,
        host: str,
        port: int,
        bucket_mb: float,
        timeout_s: float,
        backend: str | None = None,
    ) -> dict[str, float | int]:
        """Join a new sync group (closing any previous one); returns the plan summary (params, bytes, buckets)."""
        self.close_weight_sync()
        self._weight_sync = WeightSyncGroup.create(
            rank=rank,
            world_size=world_size,
            port=port,
            params=self.weight_sync_tensors(),
            host=host,
            bucket_mb=bucket_mb,
            timeout_s=timeout_s,
            backend=backend,
        )
        return self._weight_sync.plan.summary()

    def weight_sync_ping(self) -> bool:
        """Answers once the actor is constructed and idle: the driver waits for this before the rendezvous."""
        return True

    def close_weight_sync(self) -> None:
        if self._weight_sync is not None:
            self._weight_sync.close()
            self._weight_sync = None

    def _group(self, version: int | None) -> WeightSyncGroup:
        if self._weight_sync is None:
            raise WeightSyncError(
                f"weight sync version {version}: {type(self).__name__} has no sync group (call setup_weight_sync)"
            )
        return self._weight_sync


class SyncSenderMixin(_WeightSyncMixin):
    """For the trainer actor: sends ``self.model``'s parameters (override ``weight_sync_tensors`` to send others)."""

    model: torch.nn.Module

    def weight_sync_tensors(self) -> dict[str, torch.Tensor]:
        """Name -> tensor to send: the model's parameters, tied ones once (as ``RolloutEngine`` expects)."""
        return {name: p.detach() for name, p in self.model.named_parameters()}

    def weight_sync_endpoint(self) -> tuple[str, int]:
        """(host, port) for the group's store, chosen on the trainer's own node (``MASTER_ADDR`` or loopback)."""
        host = os.environ.get("MASTER_ADDR", LOOPBACK)
        return host, find_free_port(host)

    def send_weights(
        self,
        version: int,
        verify: bool = False,
        timeout_s: float | None = None,
        _corrupt_bucket: int | None = None,
    ) -> SyncStats:
        """Send the current weights as ``version`` (collective: every rollout actor must call ``receive_weights``).

        ``timeout_s`` defaults to the one given at set-up; ``_corrupt_bucket`` is the test hook of ``send``.
        """
        return self._group(version).send(self.weight_sync_tensors(), version, verify, timeout_s, _corrupt_bucket)


class SyncReceiverMixin(_WeightSyncMixin):
    """For rollout actors: receives weights and hands them to ``self.engine.update_weights``."""

    engine: Any  # asyncrl.rollout.engine.RolloutEngine

    def weight_sync_tensors(self) -> dict[str, torch.Tensor]:
        """What the handshake checks the trainer's plan against."""
        return self.engine.state_dict_for_sync()

    def receive_weights(
        self, verify: bool = False, version: int | None = None, timeout_s: float | None = None
    ) -> SyncStats:
        """Receive one sync and apply it; ``version`` (when given) must match the one sent.

        The weights are applied only when the whole sync arrived intact, so a failed sync leaves the model and its
        version untouched.
        """
        named, got, stats = self._group(version).receive(verify, timeout_s, expected_version=version)
        start = time.perf_counter()
        self.engine.update_weights(named, version=got)
        return SyncStats.measured(stats.seconds, stats.bytes, stats.buckets, time.perf_counter() - start)


# ------------------------------------------------------------------------------------------------------- driver


def _gather(
    labelled: list[tuple[str, ray.ObjectRef]], timeout_s: float
) -> tuple[dict[str, Any], list[tuple[str, str]], list[str]]:
    """Wait for all refs until ``timeout_s``: (label -> result, [(label, error text)], [labels not finished])."""
    by_ref = {ref: label for label, ref in labelled}
    pending = list(by_ref)
    results: dict[str, Any] = {}
    errors: list[tuple[str, str]] = []
    deadline = time.monotonic() + timeout_s
    while pending:
        left = deadline - time.monotonic()
        if left <= 0:
            break
        done, pending = ray.wait(pending, num_returns=1, timeout=left)
        for ref in done:
            label = by_ref[ref]
            try:
                results[label] = ray.get(ref)
            except ray.exceptions.RayTaskError as e:
                cause = e.cause if getattr(e, "cause", None) is not None else e
                errors.append((label, str(cause)))
            except ray.exceptions.RayError as e:  # the actor died
                errors.append((label, f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"))
    return results, errors, [by_ref[r] for r in pending]


def _raise_if_failed(what: str, errors: list[tuple[str, str]], unfinished: list[str], timeout_s: float) -> None:
    """One WeightSyncError listing every failed worker (rollout workers first) and every unfinished one."""
    if not errors and not unfinished:
        return
    parts = []
    # Rollout workers first: their errors are the precise ones (checksum, handshake), the trainer's only the effect.
    for label, text in sorted(errors, key=lambda e: e[0] == rank_label(0)):
        text = text.removeprefix(f"{what}: ")
        parts.append(text if label in text else f"{label}: {text}")
    if unfinished:
        parts.append(f"{', '.join(unfinished)} did not finish within {timeout_s:g} s (+ grace)")
    raise WeightSyncError(f"{what}: " + " | ".join(parts))


def setup_weight_sync(
    trainer_actor: Any,
    rollout_actors: Sequence[Any],
    bucket_mb: float = 256.0,
    timeout_s: float = 60.0,
    backend: str | None = "gloo",
    ready_timeout_s: float = 600.0,
) -> dict[str, float | int]:
    """Create the sync group: trainer = rank 0, ``rollout_actors[i]`` = rank i + 1. Returns the plan summary.

    First waits (up to ``ready_timeout_s``) until every actor answers, because actors that are still starting
    (importing torch/transformers takes seconds) would otherwise eat the rendezvous' ``timeout_s``. Then calls
    ``init_weight_sync`` on every actor at once (the rendezvous needs all of them). ``backend`` must suit every
    actor ("gloo" always works; None lets each pick, only safe when all see the same devices).
    Raises WeightSyncError (with a HandshakeError's text naming the parameter and the worker rank on a mismatch).
    """
    world = len(rollout_actors) + 1
    actors = [trainer_actor, *rollout_actors]
    pings = [(rank_label(rank), actor.weight_sync_ping.remote()) for rank, actor in enumerate(actors)]
    _, errors, unfinished = _gather(pings, ready_timeout_s)
    _raise_if_failed("weight-sync setup: waiting for the actors to start", errors, unfinished, ready_timeout_s)
    try:
        host, port = ray.get(trainer_actor.weight_sync_endpoint.remote(), timeout=timeout_s)
    except ray.exceptions.GetTimeoutError as e:
        raise WeightSyncError(f"weight-sync setup: the trainer did not pick a port within {timeout_s:g} s") from e
    labelled = [
        (rank_label(rank), actor.init_weight_sync.remote(rank, world, host, port, bucket_mb, timeout_s, backend))
        for rank, actor in enumerate(actors)
    ]
    results, errors, unfinished = _gather(labelled, timeout_s + driver_grace_s(timeout_s))
    _raise_if_failed(f"weight-sync setup ({world} ranks on {host}:{port})", errors, unfinished, timeout_s)
    return results[rank_label(0)]


def sync_weights(
    trainer_actor: Any,
    rollout_actors: Sequence[Any],
    version: int,
    verify: bool = False,
    timeout_s: float = 60.0,
    _corrupt_bucket: int | None = None,
) -> SyncStats:
    """Send the trainer's weights as ``version`` to every rollout actor and apply them there; returns the slowest
    rollout worker's SyncStats (its transport ``seconds`` and ``apply_seconds``).

    Send and receives run concurrently. Raises WeightSyncError naming the step/version and every worker that failed
    (with its error) or did not finish within ``timeout_s`` (+ a short grace for the workers' own timeout errors).
    """
    labelled = [(rank_label(0), trainer_actor.send_weights.remote(version, verify, timeout_s, _corrupt_bucket))]
    for i, actor in enumerate(rollout_actors):
        labelled.append((rank_label(i + 1), actor.receive_weights.remote(verify, version, timeout_s)))
    results, errors, unfinished = _gather(labelled, timeout_s + driver_grace_s(timeout_s))
    _raise_if_failed(f"weight sync step/version {version}", errors, unfinished, timeout_s)
    received = [results[label] for label, _ in labelled[1:]]
    if not received:
        return results[rank_label(0)]
    return max(received, key=lambda s: s.total_seconds)
