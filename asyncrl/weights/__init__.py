"""Weight synchronization from the trainer to the rollout workers (docs/performance.md, "Weight sync"): the worker
side in ``endpoints``, the driver side in ``weight_sync``, over a process group of ``asyncrl.comm``'s."""

from asyncrl.comm.groups import find_free_port
from asyncrl.weights.buckets import Bucket, BucketEntry, ParamMeta, checksum, pack, plan_buckets, unpack
from asyncrl.weights.errors import HandshakeError, SyncTimeoutError, WeightSyncError
from asyncrl.weights.group import WeightSyncGroup
from asyncrl.weights.handshake import SyncPlan, validate_plan
from asyncrl.weights.stats import SyncStats, memcpy_bytes_per_s

__all__ = [
    "Bucket",
    "BucketEntry",
    "HandshakeError",
    "ParamMeta",
    "SyncPlan",
    "SyncStats",
    "SyncTimeoutError",
    "WeightSyncError",
    "WeightSyncGroup",
    "checksum",
    "find_free_port",
    "memcpy_bytes_per_s",
    "pack",
    "plan_buckets",
    "unpack",
    "validate_plan",
]
