"""One sync as a rollout worker receives it: bucket by bucket, each checked, handed over to be applied, then let go,
so that a receiver never holds a second full copy of the weights (docs/performance.md, "Weight sync").

:class:`Incoming` holds at most two buckets: the one handed over (being applied) and the next one, whose broadcast is
posted before the first is handed over, so that receiving the next bucket overlaps applying this one. They go in two
buffers used in turn, each the size of the largest bucket it takes (``weight_sync.bucket_mb``, or one parameter
larger than that); a buffer is reused once the tensors of its last bucket are let go (the engine copies them into its
parameters, ``asyncrl.rollout.bucket_update``), before the bucket after next is posted.

Checks: each bucket's header (version, index, size) and, with ``verify``, its CRC32 are checked before the bucket is
handed over, so a bucket that fails is never applied. After the first failure no bucket is handed over, but every
remaining one is still received (and dropped): all ranks stay in step and the group stays usable. ``finish`` then
raises WeightSyncError naming the first problem. The buckets handed over before it may have been applied: the caller
says what that did (the rollout engines refuse to generate until the next complete sync). A transport failure or
timeout breaks the group, as in ``asyncrl.weights.group``.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any, Protocol

import torch

from asyncrl.comm import groups
from asyncrl.weights.buckets import Bucket, checksum, unpack
from asyncrl.weights.errors import WeightSyncError, rank_label
from asyncrl.weights.handshake import SyncPlan
from asyncrl.weights.stats import SyncStats

HEADER_FIELDS = 5  # version, bucket index, crc32, has_crc (0/1), bucket nbytes


class ReceivingGroup(Protocol):
    """What :class:`Incoming` uses of its ``WeightSyncGroup`` (which imports this module)."""

    plan: SyncPlan
    rank: int
    device: torch.device
    _pg: Any

    def _transport_failure(
        self, e: RuntimeError, version: int | str | None, i: int, n: int, deadline: groups.Deadline, doing: str
    ) -> WeightSyncError: ...


class Incoming:
    """One sync being received by one rank (``WeightSyncGroup.receive_stream``). Bucket 0 has arrived and been
    checked once this exists, so ``version`` is the sync's (None only for an empty plan).

    Iterate it for each intact bucket's (name, tensor) pairs, in order; then call :meth:`finish`, always, even when
    the iteration was left early: it receives what is left so the ranks stay in step.
    """

    def __init__(self, group: ReceivingGroup, verify: bool, deadline: groups.Deadline, expected: int | None) -> None:
        self.group, self.verify, self.deadline, self.expected = group, verify, deadline, expected
        self.buckets = group.plan.buckets
        self.version: int | None = None
        self.problems: list[str] = []
        self.handed = 0  # buckets handed over by the iteration
        self._next = 0  # index of the next bucket to post
        self._posted: tuple[Bucket, torch.Tensor, torch.Tensor, tuple[torch.distributed.Work, ...]] | None = None
        self._failure: WeightSyncError | None = None
        self._transport_s = 0.0
        self._start = time.perf_counter()
        self._ready: tuple[Bucket, torch.Tensor] | None = None
        self._pool: list[tuple[torch.Tensor, int | None]] = []  # two buffers used in turn, with their idle use counts
        if self.buckets:
            self._ready = self._take()

    @property
    def intact(self) -> bool:
        """No bucket so far failed its checks."""
        return not self.problems and self._failure is None

    def __iter__(self) -> Iterator[list[tuple[str, torch.Tensor]]]:
        """Each intact bucket's (name, tensor) pairs: views into the bucket's buffer, with the parameters' shapes and
        the sender's dtypes. Let them go before asking for the next bucket (they are what keeps the buffer alive).
        Raises WeightSyncError (the first problem) in place of a bucket that failed its checks."""
        while self._ready is not None:
            bucket, payload = self._ready
            self._ready = None
            items = unpack(bucket, payload.view(bucket.dtype))
            del payload
            self.handed += 1
            yield items
            del items
            if self._posted is not None:
                self._ready = self._take()
        if self.problems:  # the sync is cut short here: the consumer must not take it for complete
            raise WeightSyncError(f"weight sync step/version {self.version}: {self.problems[0]}")

    def finish(self) -> SyncStats:
        """Receive (and drop) every bucket not yet received; raise WeightSyncError if any bucket failed its checks
        (or the transport failed), else return this rank's SyncStats: ``seconds`` spent receiving and checking,
        ``apply_seconds`` the rest of the sync's wall time (the caller applying the buckets handed over)."""
        if self._failure is not None:
            raise self._failure
        self._ready = None
        while self._posted is not None:
            self._take()
        self._pool = []
        if self.problems:
            more = f" (and {len(self.problems) - 1} more: {'; '.join(self.problems[1:3])})" if self.problems[1:] else ""
            raise WeightSyncError(f"weight sync step/version {self.version}: {self.problems[0]}{more}")
        wall = time.perf_counter() - self._start
        nbytes = self.group.plan.nbytes
        return SyncStats.measured(self._transport_s, nbytes, len(self.buckets), max(0.0, wall - self._transport_s))

    # ------------------------------------------------------------------------------------------------- internals

    def _post(self) -> None:
        """Start receiving the next bucket: its header, and its payload into its slot's buffer."""
        bucket = self.buckets[self._next]
        device, pg = self.group.device, self.group._pg
        header = torch.zeros(HEADER_FIELDS, dtype=torch.int64, device=device)
        payload = self._buffer(self._next % 2)[: bucket.nbytes]
        works = (
            groups.start_broadcast(pg, header, self.deadline),
            groups.start_broadcast(pg, payload, self.deadline),
        )
        self._posted = (bucket, header, payload, works)
        self._next += 1

    def _buffer(self, slot: int) -> torch.Tensor:
        """Buffer ``slot`` of the two used in turn (even buckets, odd buckets), allocated once per sync, so the memory
        held does not depend on how the allocator reuses freed blocks. While tensors of the bucket it held are still
        referenced (a caller keeping them past the next bucket, e.g. an fp8 weight waiting for its scales, or
        ``receive`` keeping them all), it is left to them and a fresh buffer takes its place."""
        if slot < len(self._pool):
            buffer, idle = self._pool[slot]
            if idle is not None and _use_count(buffer) == idle:
                return buffer
        largest = max(b.nbytes for b in self.buckets[slot::2])
        buffer = torch.empty(largest, dtype=torch.uint8, device=self.group.device)
        self._pool[slot : slot + 1] = [(buffer, _use_count(buffer))]
        return buffer

    def _take(self) -> tuple[Bucket, torch.Tensor] | None:
        """Wait for the posted bucket (bucket 0: post it first), post the next one, and check this one: (bucket,
        payload) when it may be applied, None when it (or an earlier one) failed its checks (in ``problems``)."""
        start = time.perf_counter()
        at = self._next  # the bucket a transport error names
        try:
            if self._posted is None:
                self._post()
            bucket, header, payload, works = self._posted  # type: ignore[misc]
            at, self._posted = bucket.index, None
            for w in works:
                groups.wait(w, self.deadline)
            at = self._next
            if self._next < len(self.buckets):
                self._post()  # arrives while this one is applied
        except RuntimeError as e:
            shown = self.version if self.version is not None else self.expected
            self._failure = self.group._transport_failure(e, shown, at, len(self.buckets), self.deadline, "receiving")
            raise self._failure from e
        self.problems += self._check(bucket, header.tolist(), payload)
        self._transport_s += time.perf_counter() - start
        return (bucket, payload) if not self.problems else None

    def _check(self, bucket: Bucket, header: list[int], payload: torch.Tensor) -> list[str]:
        """What is wrong with a received bucket: its header (index, size, version), then (``verify``) its CRC32."""
        v, idx, crc, has_crc, nbytes = header
        self.version = v if self.version is None else self.version
        i, where = bucket.index, rank_label(self.group.rank)
        if idx != i or nbytes != bucket.nbytes:
            return [f"bucket {i} on {where}: header says bucket {idx} of {nbytes} bytes (sender and plan disagree)"]
        if v != self.version:
            return [f"bucket {i} on {where}: header says version {v}, bucket 0 said {self.version}"]
        if self.expected is not None and v != self.expected:
            return [f"bucket {i} on {where}: received version {v}, expected {self.expected}"]
        if not self.verify:
            return []
        if not has_crc:
            return [f"bucket {i} on {where}: verify=True but the trainer sent no checksum (send(verify=False))"]
        got = checksum(payload)
        if got == crc:
            return []
        names = bucket.names
        shown = ", ".join(names[:3]) + (f", ... ({len(names)} parameters)" if len(names) > 3 else "")
        return [
            f"bucket {i} checksum mismatch on {where} (sent crc32 {crc:#010x}, received {got:#010x}; "
            f"parameters {shown})"
        ]


def _use_count(buffer: torch.Tensor) -> int | None:
    """How many tensors share ``buffer``'s memory (its storage's reference count); None where torch does not say,
    which makes every buffer count as still in use (a fresh one per bucket: correct, only more allocations)."""
    count = getattr(torch._C, "_storage_Use_Count", None)
    return count(buffer.untyped_storage()._cdata) if count is not None else None
