"""Weight synchronization from the trainer to the rollout workers over torch.distributed (gloo on CPU, NCCL on GPU).

- ``buckets``: pure packing of parameters into flat per-dtype buckets, and their CRC32.
- ``handshake``: the parameter list/bucket plan agreed at group creation and its check against a rollout model.
- the process group under it is ``asyncrl.comm``'s (a group of its own, never the default one; or ``local``).
- ``group``: ``WeightSyncGroup``, one rank's view of the group: ``send`` (rank 0) / ``receive_stream`` (ranks 1..N).
- ``incoming``: one sync as a receiver takes it, bucket by bucket (at most two buckets held), each checked first.
- ``endpoints``: the worker side (sender/receiver mixins); ``weight_sync``: ``WeightSync``, the driver side that
  sets a group up and syncs over it, through role handles (Ray actors or in-process workers alike) and the typed
  clients of ``clients``.
"""

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
