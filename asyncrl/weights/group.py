"""WeightSyncGroup: broadcast the trainer's weights to the rollout workers, bucket by bucket, with a deadline.

Rank 0 is the trainer (the only sender), ranks 1..N are rollout workers. Creating the group is collective: every
rank calls ``WeightSyncGroup.create`` at about the same time; rank 0 plans the buckets and the receivers check the
plan against their model (``asyncrl.weights.handshake``). Each sync is then, per bucket, a 5-int64 header
``(version, bucket index, crc32, has_crc, nbytes)`` and the bucket's bytes, both broadcast from rank 0, which a
receiver takes as ``asyncrl.weights.incoming`` says. A transport failure or timeout (a peer absent or dead) leaves the
ranks out of step, so the group is marked broken and every later call raises until a new group is created.

One group object is used from one thread at a time. Several groups may coexist in one process (no default
process group is involved, see ``asyncrl.comm.groups``).
"""

from __future__ import annotations

import atexit
import time
import weakref
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import torch

from asyncrl.comm import groups
from asyncrl.config import WeightSyncConfig
from asyncrl.weights.buckets import ParamMeta, as_bytes, checksum, metas_of, pack
from asyncrl.weights.errors import HandshakeError, SyncTimeoutError, WeightSyncError, rank_label
from asyncrl.weights.handshake import SyncPlan, validate_plan
from asyncrl.weights.incoming import Incoming
from asyncrl.weights.stats import SyncStats

# Groups still open in this process. A ProcessGroupGloo destroyed during interpreter shutdown aborts the process
# ("terminate called without an active exception"), so every open group is closed explicitly at exit.
_OPEN_GROUPS: weakref.WeakSet[WeightSyncGroup] = weakref.WeakSet()


@atexit.register
def _close_open_groups() -> None:
    for group in list(_OPEN_GROUPS):
        group.close()


@dataclass(eq=False, repr=False)
class WeightSyncGroup:
    """One sync group seen from one rank; build it with :meth:`create` on every rank."""

    _pg: torch.distributed.ProcessGroup | None
    _store: torch.distributed.Store | None
    rank: int
    world_size: int
    plan: SyncPlan
    backend: str
    timeout_s: float
    broken: str | None = field(default=None, init=False)  # why the group is unusable, once it is

    def __post_init__(self) -> None:
        self.device = groups.backend_device(self.backend)
        _OPEN_GROUPS.add(self)

    # ----------------------------------------------------------------------------------------------------- set-up

    @classmethod
    def create(
        cls,
        *,
        rank: int,
        world_size: int,
        port: int,
        params: Mapping[str, torch.Tensor] | Sequence[ParamMeta],
        host: str = groups.LOOPBACK,
        bucket_mb: float = WeightSyncConfig.bucket_mb,
        timeout_s: float = WeightSyncConfig.timeout_s,
        backend: str | None = None,
        group_name: str = "weights",
    ) -> WeightSyncGroup:
        """Join the group at ``host:port`` (rank 0 hosts it) and run the handshake; collective over all ranks.

        ``params``: on rank 0 the tensors (or metas) it will send, in send order, planned into buckets of
        ``bucket_mb`` MiB; on a receiver what its model expects (``engine.state_dict_for_sync()``), checked against
        the trainer's plan (``bucket_mb`` is ignored there). ``timeout_s`` bounds the rendezvous, the handshake and,
        by default, each sync. Every rank must pass the same ``backend`` (default: ``groups.default_backend()``).
        Raises HandshakeError on a model mismatch (on every rank, naming the worker), WeightSyncError otherwise.
        """
        if not 0 <= rank < world_size:
            raise ValueError(f"WeightSyncGroup.create: rank {rank} is outside world_size {world_size}")
        who = rank_label(rank)
        backend = backend or groups.default_backend()
        try:
            pg, store = groups.create_process_group(backend, host, port, rank, world_size, timeout_s, group_name)
        except RuntimeError as e:
            raise WeightSyncError(
                f"weight-sync group creation: {who} could not join {host}:{port} (world size {world_size}) "
                f"within {timeout_s:g} s: {e}"
            ) from e
        metas = metas_of(params) if isinstance(params, Mapping) else list(params)
        plan = SyncPlan.build(metas, bucket_mb) if rank == 0 else None
        group = cls(pg, store, rank, world_size, plan, backend, timeout_s)  # type: ignore[arg-type]
        try:
            group._handshake(metas)
        except BaseException:
            group.close()
            raise
        return group

    def _handshake(self, metas: list[ParamMeta]) -> None:
        """Rank 0 broadcasts the plan; each receiver validates it; all learn who failed (one all-reduce)."""
        deadline = groups.Deadline(self.timeout_s)
        own_error: HandshakeError | None = None
        try:
            payload = groups.broadcast_bytes(
                self._pg, self.plan.to_bytes() if self.rank == 0 else None, self.device, deadline
            )
            if self.rank != 0:
                try:
                    self.plan = SyncPlan.from_bytes(payload)
                    validate_plan(self.plan, metas, self.rank)
                except HandshakeError as e:
                    own_error = e
            failed = torch.zeros(self.world_size, dtype=torch.int64, device=self.device)
            failed[self.rank] = int(own_error is not None)
            groups.allreduce_sum(self._pg, failed, deadline)
        except RuntimeError as e:
            self.broken = f"handshake failed: {e}"
            raise WeightSyncError(
                f"weight-sync handshake: {rank_label(self.rank)} did not complete it within {self.timeout_s:g} s: {e}"
            ) from e
        if own_error is not None:
            raise own_error
        bad = [r for r, f in enumerate(failed.tolist()) if f]
        if bad:
            raise HandshakeError(
                f"weight-sync handshake: rollout worker rank(s) {bad} rejected the trainer's parameter list "
                "(their own errors name the parameter)"
            )

    def close(self) -> None:
        """Drop the connections (abort if broken). The object is unusable afterwards."""
        _OPEN_GROUPS.discard(self)
        groups.close_process_group(self._pg, abort=self.broken is not None)
        self._pg = self._store = None
        self.broken = self.broken or "closed"

    # --------------------------------------------------------------------------------------------------- syncing

    def send(
        self,
        named_tensors: Mapping[str, torch.Tensor],
        version: int,
        verify: bool = False,
        timeout_s: float | None = None,
        _corrupt_bucket: int | None = None,
    ) -> SyncStats:
        """Broadcast ``named_tensors`` (rank 0 only) as weight version ``version``; returns this rank's SyncStats.

        Every parameter of the plan must be present with its planned shape and dtype; this is checked before
        anything is sent, so a bad call leaves the group usable. ``verify`` sends a CRC32 per bucket for the
        receivers to check. ``_corrupt_bucket`` (tests only) flips one byte of that bucket after its checksum.
        """
        self._check_usable("send", version)
        if self.rank != 0:
            raise WeightSyncError(f"weight sync version {version}: send() called on {rank_label(self.rank)}")
        self._check_complete(named_tensors, version)
        deadline = groups.Deadline(timeout_s if timeout_s is not None else self.timeout_s)
        start = time.perf_counter()
        pending: tuple[torch.distributed.Work, ...] = ()
        keep: tuple[torch.Tensor, ...] = ()  # buffers of the in-flight bucket must outlive its ops
        n = len(self.plan.buckets)
        flying = 0  # the bucket whose broadcast is in flight (named by a transport error)
        try:
            for i, bucket in enumerate(self.plan.buckets):
                payload = as_bytes(pack(bucket, named_tensors).to(self.device))  # packs bucket i while i-1 flies
                crc = checksum(payload) if verify else 0
                if _corrupt_bucket == i:
                    payload = payload.clone()  # never modify the trainer's own parameter (pack may alias it)
                    payload[0] ^= 0xFF
                header = torch.tensor([version, i, crc, int(verify), bucket.nbytes], dtype=torch.int64)
                for w in pending:
                    groups.wait(w, deadline)
                header = header.to(self.device)
                pending = (
                    groups.start_broadcast(self._pg, header, deadline),
                    groups.start_broadcast(self._pg, payload, deadline),
                )
                keep, flying = (header, payload), i
            for w in pending:
                groups.wait(w, deadline)
        except RuntimeError as e:
            raise self._transport_failure(e, version, flying, n, deadline, "sending") from e
        del keep
        return SyncStats.measured(time.perf_counter() - start, self.plan.nbytes, n)

    def receive_stream(
        self, verify: bool = False, timeout_s: float | None = None, expected_version: int | None = None
    ) -> Incoming:
        """Take part in one sync as a receiver: the ``Incoming`` to iterate bucket by bucket, then ``finish`` (always;
        ``asyncrl.weights.incoming``), which also raises on a version other than ``expected_version`` (when given)."""
        self._check_usable("receive", expected_version)
        if self.rank == 0:
            raise WeightSyncError("weight sync: receive() called on the trainer (rank 0), which only sends")
        deadline = groups.Deadline(timeout_s if timeout_s is not None else self.timeout_s)
        return Incoming(self, verify, deadline, expected_version)

    def receive(
        self, verify: bool = False, timeout_s: float | None = None, expected_version: int | None = None
    ) -> tuple[list[tuple[str, torch.Tensor]], int, SyncStats]:
        """One whole sync as a receiver: (name, tensor) for every parameter, the version, and SyncStats.

        The tensors are views into per-bucket buffers: one extra copy of the weights until the caller drops them
        (for tests and small models; a rollout worker applies the buckets as they arrive, ``receive_stream``).
        Raises as ``receive_stream``'s ``finish``, after all buckets were received.
        """
        incoming = self.receive_stream(verify, timeout_s, expected_version)
        try:
            out = [pair for items in incoming for pair in items]
        finally:
            stats = incoming.finish()  # every bucket received, whatever failed: the ranks stay in step
        return out, int(incoming.version if incoming.version is not None else -1), stats

    # --------------------------------------------------------------------------------------------------- checks

    def _check_usable(self, what: str, version: int | None) -> None:
        if self._pg is None or self.broken is not None:
            raise WeightSyncError(
                f"weight sync version {version}: {what}() on {rank_label(self.rank)} but its group is unusable "
                f"({self.broken}); create a new group (setup_weight_sync)"
            )

    def _check_complete(self, named_tensors: Mapping[str, torch.Tensor], version: int) -> None:
        for m in self.plan.metas:
            t = named_tensors.get(m.name)
            if t is None or tuple(t.shape) != m.shape or t.dtype != m.dtype:
                got = "missing" if t is None else f"{list(t.shape)} {t.dtype}"
                raise WeightSyncError(
                    f"weight sync version {version}: the trainer's parameter {m.name!r} is {got}, "
                    f"the group was set up with {list(m.shape)} {m.dtype}; nothing was sent"
                )

    def _transport_failure(
        self, e: RuntimeError, version: int | str | None, i: int, n: int, deadline: groups.Deadline, doing: str
    ) -> WeightSyncError:
        """Mark the group broken and turn a c10d error into one naming the version, the bucket and this rank."""
        where = rank_label(self.rank)
        version = "?" if version is None else version  # a receiver learns the version from bucket 0's header
        text = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        timed_out = deadline.expired() or "timed out" in text.lower() or "timeout" in text.lower()
        self.broken = f"{'timeout' if timed_out else 'transport error'} at version {version}, bucket {i}"
        if timed_out:
            return SyncTimeoutError(
                f"weight sync step/version {version}: {where} timed out after {deadline.seconds:g} s {doing} "
                f"bucket {i} of {n} (a peer did not take part in the sync): {text}"
            )
        return WeightSyncError(f"weight sync step/version {version}: {where} failed {doing} bucket {i} of {n}: {text}")
