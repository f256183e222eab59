"""``WeightSync``: the one owner of trainer -> rollout weight synchronisation on the driver: set-up, every sync, and
the ``weight_sync/*`` metrics, the same in every schedule and on either role backend (it only calls role handles,
through ``asyncrl.weights.clients``; the tensors go over the sync group between the workers). The version a sync
carries is the trainer's own counter, read by the schedule from the trainer's last update; nothing here counts.

Each call blocks its worker while the sync runs, so the workers must not be busy with another call (a rollout worker
must have returned from ``generate`` first) or the sync times out. After a timeout or transport error the group is
unusable: call :meth:`WeightSync.setup` again (a process may set up any number of groups in turn).
"""

from __future__ import annotations

from collections.abc import Sequence

from asyncrl.calls import Handle, gather
from asyncrl.config import WeightSyncConfig
from asyncrl.errors import raise_if_user_error
from asyncrl.weights.clients import SyncPeer, SyncReceiver, SyncSender
from asyncrl.weights.errors import WeightSyncError
from asyncrl.weights.group import rank_label
from asyncrl.weights.handshake import PlanSummary
from asyncrl.weights.stats import SyncStats, memcpy_bytes_per_s


def driver_grace_s(timeout_s: float) -> float:
    """How long past ``timeout_s`` the driver waits, so workers' own (more precise) timeout errors arrive first."""
    return 2.0 + 0.1 * timeout_s


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


class WeightSync:
    """Trainer = rank 0 of the sync group, ``receivers[i]`` = rank i + 1.

    ``backend`` must suit every worker ("gloo" always works; None lets each pick, only safe when all see the same
    devices). ``ready_timeout_s`` bounds the wait for workers still starting (importing torch/transformers takes
    seconds), which would otherwise eat the rendezvous' ``cfg.timeout_s``."""

    def __init__(
        self,
        trainer: Handle,
        receivers: Sequence[Handle],
        cfg: WeightSyncConfig,
        ready_timeout_s: float,
        backend: str | None = "gloo",
    ):
        self.trainer, self.receivers, self.cfg = trainer, list(receivers), cfg
        self.ready_timeout_s, self.backend = ready_timeout_s, backend
        self.plan: PlanSummary | None = None
        self.endpoint: str | None = None  # host:port of the group's store, once set up

    def setup(self) -> PlanSummary:
        """Create the sync group. Raises WeightSyncError (with a HandshakeError's text naming the parameter and the
        worker rank on a mismatch)."""
        timeout_s = self.cfg.timeout_s
        sender = SyncSender(self.trainer)
        workers: list[SyncPeer] = [sender, *(SyncReceiver(h) for h in self.receivers)]
        world = len(workers)
        pings = [(rank_label(rank), w.weight_sync_ping()) for rank, w in enumerate(workers)]
        _, errors, unfinished = gather(pings, self.ready_timeout_s)
        for _, pending in pings if errors else ():  # a worker that failed to start on the user's input says so
            if pending.done():
                try:
                    pending.result(timeout=0)
                except Exception as e:  # noqa: BLE001 - only a user's error is raised here; the rest below
                    raise_if_user_error(e)
        _raise_if_failed(
            "weight-sync setup: waiting for the workers to start", errors, unfinished, self.ready_timeout_s
        )
        try:
            host = self.trainer.location(timeout_s).address  # the trainer's node, never a loopback constant
            host, port = sender.weight_sync_endpoint(host).result(timeout=timeout_s)
        except TimeoutError as e:
            raise WeightSyncError(f"weight-sync setup: the trainer did not pick a port within {timeout_s:g} s") from e
        labelled = [
            (
                rank_label(rank),
                w.init_weight_sync(rank, world, host, port, self.cfg.bucket_mb, timeout_s, self.backend),
            )
            for rank, w in enumerate(workers)
        ]
        results, errors, unfinished = gather(labelled, timeout_s + driver_grace_s(timeout_s))
        _raise_if_failed(f"weight-sync setup ({world} ranks on {host}:{port})", errors, unfinished, timeout_s)
        self.plan = results[rank_label(0)]
        self.endpoint = f"{host}:{port}"
        return self.plan

    def push(self, version: int, _corrupt_bucket: int | None = None) -> SyncStats:
        """Send the trainer's weights as ``version`` to every receiver and apply them there, the send and the receives
        concurrently; returns the slowest receiver's SyncStats. Raises WeightSyncError naming the version and every
        worker that failed (with its error) or did not finish within ``weight_sync.timeout_s`` (+ a short grace for
        the workers' own errors). ``_corrupt_bucket``: the test hook that flips a byte of one bucket after its
        checksum is taken."""
        verify, timeout_s = self.cfg.verify, self.cfg.timeout_s
        labelled = [(rank_label(0), SyncSender(self.trainer).send_weights(version, verify, timeout_s, _corrupt_bucket))]
        for i, w in enumerate(self.receivers):
            labelled.append((rank_label(i + 1), SyncReceiver(w).receive_weights(verify, version, timeout_s)))
        results, errors, unfinished = gather(labelled, timeout_s + driver_grace_s(timeout_s))
        _raise_if_failed(f"weight sync step/version {version}", errors, unfinished, timeout_s)
        received = [results[label] for label, _ in labelled[1:]]
        return max(received, key=lambda s: s.total_seconds) if received else results[rank_label(0)]

    def summary(self) -> dict[str, float]:
        """What a run's summary records once: bytes per sync, and the in-process copy speed to compare with."""
        if self.plan is None:
            return {}
        return {"sync_bytes": self.plan.bytes, "memcpy_bytes_per_s": memcpy_bytes_per_s(self.plan.bytes)}

    @staticmethod
    def metrics(stats: SyncStats) -> dict[str, float]:
        """The ``weight_sync/*`` metrics of one sync, the same keys in every schedule."""
        return {
            "weight_sync/seconds": stats.seconds,
            "weight_sync/apply_seconds": stats.apply_seconds,
            "weight_sync/bytes_per_s": stats.bytes_per_s,
        }
