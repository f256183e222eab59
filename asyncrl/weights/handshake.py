"""The plan a weight-sync group agrees on at creation, and the check each rollout worker runs on it (pure Python).

The trainer (rank 0) decides the parameter list and the bucket plan and broadcasts them once; every rollout worker
checks them against its own model. Doing this at creation, not at the first sync, means a trainer/rollout model
mismatch (another config, an untied lm_head, a renamed module) fails at start-up naming the parameter, instead of
corrupting weights or hanging mid-run. After that, syncs send only a small header and the payload.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass

from asyncrl.weights.buckets import Bucket, ParamMeta, dtype_from_name, plan_buckets
from asyncrl.weights.errors import HandshakeError

PROTOCOL = 1  # bumped when the wire format (plan JSON, header layout) changes


@dataclass(frozen=True)
class PlanSummary:
    """A sync group's plan as the driver sees it (``WeightSync.setup``'s result)."""

    params: int
    bytes: int  # parameter payload of one sync
    buckets: int
    bucket_mb: float


@dataclass(frozen=True)
class SyncPlan:
    """Parameters in send order, their buckets, and the bucket size (MiB) they were planned with."""

    metas: tuple[ParamMeta, ...]
    buckets: tuple[Bucket, ...]
    bucket_mb: float

    @classmethod
    def build(cls, metas: Sequence[ParamMeta], bucket_mb: float) -> SyncPlan:
        return cls(tuple(metas), tuple(plan_buckets(metas, bucket_mb)), float(bucket_mb))

    @property
    def nbytes(self) -> int:
        """Payload bytes of one sync."""
        return sum(b.nbytes for b in self.buckets)

    def summary(self) -> PlanSummary:
        """Parameter count, payload bytes per sync, bucket count and size: what the driver reports."""
        return PlanSummary(len(self.metas), self.nbytes, len(self.buckets), self.bucket_mb)

    def to_bytes(self) -> bytes:
        """JSON (not pickle: the payload crosses process boundaries and only describes tensors)."""
        index = {m.name: i for i, m in enumerate(self.metas)}
        doc = {
            "protocol": PROTOCOL,
            "bucket_mb": self.bucket_mb,
            "params": [[m.name, list(m.shape), str(m.dtype).removeprefix("torch.")] for m in self.metas],
            "buckets": [[index[e.name] for e in b.entries] for b in self.buckets],
        }
        return json.dumps(doc, separators=(",", ":")).encode()

    @classmethod
    def from_bytes(cls, payload: bytes) -> SyncPlan:
        doc = json.loads(payload.decode())
        if doc.get("protocol") != PROTOCOL:
            raise HandshakeError(
                f"weight-sync handshake: the trainer speaks protocol {doc.get('protocol')}, this worker {PROTOCOL} "
                "(trainer and rollout workers run different asyncrl versions)"
            )
        metas = tuple(ParamMeta(name, tuple(shape), dtype_from_name(dt)) for name, shape, dt in doc["params"])
        buckets = tuple(Bucket.of(i, [metas[j] for j in idx]) for i, idx in enumerate(doc["buckets"]))
        return cls(metas, buckets, float(doc["bucket_mb"]))


def validate_plan(plan: SyncPlan, metas: Sequence[ParamMeta], rank: int) -> None:
    """Raise HandshakeError naming the first differing parameter and ``rank`` unless names and shapes match.

    ``metas`` is what the rollout worker's model needs (``RolloutEngine.state_dict_for_sync()``): every sent
    parameter must exist there with the same shape, and every expected one must be sent (a partial sync would leave
    stale weights behind). Dtypes may differ: the copy into the rollout model casts (e.g. fp32 trainer, bf16 rollout).
    """
    want = {m.name: m for m in metas}
    sent = {m.name for m in plan.metas}
    where = f"rollout worker rank {rank}"
    for m in plan.metas:
        mine = want.get(m.name)
        if mine is None:
            raise HandshakeError(
                f"weight-sync handshake: the trainer sends parameter {m.name!r} {list(m.shape)}, which the model on "
                f"{where} does not have (trainer sends {len(plan.metas)} parameters, the worker expects {len(metas)})"
            )
        if tuple(mine.shape) != tuple(m.shape):
            raise HandshakeError(
                f"weight-sync handshake: parameter {m.name!r} has shape {list(m.shape)} on the trainer but "
                f"{list(mine.shape)} on {where} (different model configs?)"
            )
    for m in metas:
        if m.name not in sent:
            raise HandshakeError(
                f"weight-sync handshake: the model on {where} has parameter {m.name!r} {list(m.shape)}, which the "
                f"trainer does not send (it would never be updated)"
            )
