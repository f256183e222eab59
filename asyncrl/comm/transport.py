"""The one transport decision: how a group of started workers moves tensors between them, from where each runs.

``local`` when they are all threads of one process (the in-process backend: a copy on the device they share, no
process group), ``nccl`` when every one is a process on CUDA with a GPU of its own (NCCL refuses two ranks on one
device), else ``gloo`` through host memory. The weight sync takes it as it is; a trainer's data-parallel ranks, which
need a real process group, take ``gloo`` where the sync would be ``local``.
"""

from __future__ import annotations

from dataclasses import dataclass

LOCAL, GLOO, NCCL = "local", "gloo", "nccl"


@dataclass(frozen=True)
class WorkerLocation:
    """Where a started worker runs, as its backend reports it (the run's summary lists every worker's)."""

    name: str
    address: str  # its node's IP address (Ray's); 127.0.0.1 in-process
    node_id: str  # Ray's node id ("local" in-process)
    gpu_ids: tuple[str, ...]  # the GPUs Ray gave it (none in-process: it uses the process's)
    cuda_visible_devices: str | None
    device: str  # the torch device its models live on
    pid: int


def transport_of(workers: list[WorkerLocation]) -> str:
    """``local``, ``nccl`` or ``gloo`` for a group of these workers (the module docstring says when)."""
    if workers and len({(w.node_id, w.pid) for w in workers}) == 1:
        return LOCAL
    gpus = [(w.node_id, g) for w in workers for g in w.gpu_ids]
    own_gpu = all(w.device.startswith("cuda") and len(w.gpu_ids) == 1 for w in workers)
    return NCCL if workers and own_gpu and len(set(gpus)) == len(gpus) else GLOO


def process_group_transport(workers: list[WorkerLocation]) -> str:
    """The transport where the group must be a real process group (data-parallel ranks): ``nccl`` where
    ``transport_of`` says so, else ``gloo`` (ranks in one process share one device: through the host)."""
    return NCCL if transport_of(workers) == NCCL else GLOO
