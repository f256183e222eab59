"""Data-parallel trainer ranks (``trainer.num_workers``): a share of every mini-batch each, and the gradients summed
across ranks before each optimizer step. The row split, the two strategies and why torch's ``DistributedDataParallel``
wrapper is not used: docs/data_parallel.md.

Every rank receives the whole batch and draws the same mini-batch permutation; its share is weighted by the whole
mini-batch's token (or sequence) count, so the gradients summed over the ranks are exactly one rank's over the whole
mini-batch. Under ``ddp`` every rank clips by the same norm and takes the same step, so the replicas stay equal, bit
for bit, without broadcasting weights. The group is its own (``asyncrl.comm.groups``), not the default group, so
``ddp`` ranks may be threads of one process.

Every collective runs on the group's device (``DataParallel.device``: the rank's GPU under NCCL, which takes CUDA
tensors only; the host under gloo): what a collective sends is moved there first, and a result comes back to the host
only where the caller needs a Python value (a count, a pickled object); ``gather_rows`` hands its rows back on the
device its caller's part lives on.
"""

from __future__ import annotations

import pickle
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

import torch
from torch._C._distributed_c10d import AllgatherOptions  # not re-exported by torch.distributed

from asyncrl.comm import groups
from asyncrl.data.collate import TrainBatch
from asyncrl.trainer.forward import model_device

if TYPE_CHECKING:
    from torch.distributed.device_mesh import DeviceMesh

V = TypeVar("V")

GRAD_BUCKET_BYTES = 32 * 2**20  # gradients are summed in flat buckets of about this size


def rank_name(name: str, rank: int) -> str:
    """A rank's worker name: rank 0 keeps the role's (``trainer``), the others ``trainer.rank1``, ..."""
    return name if rank == 0 else f"{name}.rank{rank}"


def group_shares(group_B: torch.Tensor, cost_B: torch.Tensor, world: int) -> list[torch.Tensor]:
    """Split rows into ``world`` shares of whole groups: rows in group order, cut at the group boundaries nearest to
    equal cumulative cost. Every row lands in exactly one share; a share may be empty (fewer groups than ranks)."""
    n = len(group_B)
    order = torch.argsort(group_B, stable=True)
    cum = torch.cat([torch.zeros(1, dtype=torch.float64), cost_B[order].double().cumsum(0)])
    g = group_B[order]
    bounds = [0] + [i for i in range(1, n) if g[i] != g[i - 1]] + [n]
    cuts = [0]
    for k in range(1, world):
        target = float(cum[-1]) * k / world
        allowed = [b for b in bounds if b >= cuts[-1]]
        cuts.append(min(allowed, key=lambda b: abs(float(cum[b]) - target)))
    cuts.append(n)
    return [order[cuts[r] : cuts[r + 1]] for r in range(world)]


class DataParallelError(RuntimeError):
    """The data-parallel ranks disagree (weights not replicated) or their group failed."""


@dataclass(eq=False)
class DataParallel:
    """One rank's view of the trainer's data-parallel group; build it with :meth:`create` on every rank at once."""

    pg: Any  # a torch ProcessGroup, or the in-process LocalGroup (asyncrl.comm.local); None once closed
    store: torch.distributed.Store
    rank: int
    world_size: int
    timeout_s: float
    backend: str
    host: str
    device: torch.device | None = None  # where the group takes its tensors (None: the backend's, set at init)
    mesh: DeviceMesh | None = field(default=None, init=False)  # FSDP2's, once ``shard_with_fsdp2`` ran

    def __post_init__(self) -> None:
        self.device = self.device if self.device is not None else groups.backend_device(self.backend)

    @property
    def sharded(self) -> bool:
        """FSDP2: parameters, gradients and optimizer state sharded; the gradients reduced inside ``backward``, so
        every rank must run as many forwards and backwards as the others (``rounds``, ``idle_pass``)."""
        return self.mesh is not None

    def shard_with_fsdp2(
        self, model: torch.nn.Module, compute_dtype: torch.dtype | None = None, offload: bool = False
    ) -> None:
        """Shard ``model`` over the ranks (the process's default group: ranks must be processes); ``compute_dtype``
        and ``offload`` as ``asyncrl.trainer.fsdp.shard``."""
        from asyncrl.trainer import fsdp

        if self.mesh is None:
            self.mesh = fsdp.init_mesh(self.store, self.rank, self.world_size, self.timeout_s, self.backend, self.host)
        fsdp.shard(model, self.mesh, compute_dtype, offload)

    @classmethod
    def create(
        cls, rank: int, world_size: int, host: str, port: int, timeout_s: float, backend: str | None = None
    ) -> DataParallel:
        """``backend``: nccl for ranks on GPUs of their own, gloo for CPU ranks (None: nccl where CUDA is seen)."""
        backend = backend or groups.default_backend()
        pg, store = groups.create_process_group(backend, host, port, rank, world_size, timeout_s, "trainer_dp")
        return cls(pg, store, rank, world_size, timeout_s, backend, host)

    def close(self) -> None:
        if self.mesh is not None:
            from asyncrl.trainer import fsdp

            fsdp.close_mesh()
            self.mesh = None
        groups.close_process_group(self.pg, abort=False)
        self.pg = None

    # ---- splitting -----------------------------------------------------------------------------------------------
    def rows(self, n: int) -> torch.Tensor:
        """This rank's rows of ``n``: a contiguous share, the first ``n % world`` ranks one row more."""
        return torch.arange(n).tensor_split(self.world_size)[self.rank]

    def share(self, batch: TrainBatch) -> torch.Tensor:
        """This rank's rows of ``batch``: whole prompt groups (rows with the same padded prompt ids; so a shared prompt
        is packed and prefilled once per rank, not once on every rank), balanced by tokens (a row's response tokens
        plus its share of its group's prompt); see ``group_shares``."""
        if batch.size == 0:
            return torch.zeros(0, dtype=torch.long)
        group_B = torch.unique(batch.input_ids_BL[:, : batch.prompt_width], dim=0, return_inverse=True)[1]
        prompt_B = batch.attention_mask_BL[:, : batch.prompt_width].sum(dim=1).double()
        cost_B = batch.response_lengths().double() + prompt_B / torch.bincount(group_B)[group_B].double()
        return group_shares(group_B, cost_B, self.world_size)[self.rank]

    # ---- lockstep (FSDP2) ----------------------------------------------------------------------------------------
    def rounds(self, n: int) -> int:
        """The most micro-batches any rank has (``n``: this rank's): every rank runs that many passes."""
        return max(self.all_gather_int(n))

    @staticmethod
    def idle_pass(model: torch.nn.Module) -> None:
        """A forward and backward that change no gradient (one token, loss times zero): it takes part in the sharded
        module's all-gathers and reduce-scatters for a rank that has no micro-batch left. The token is put where the
        model's embedding lives (a GPU's, under FSDP2 on GPUs)."""
        logits = model(input_ids=torch.zeros((1, 1), dtype=torch.long, device=model_device(model))).logits
        (logits.sum() * 0.0).backward()

    # ---- collectives ---------------------------------------------------------------------------------------------
    def _all_gather(self, t: torch.Tensor) -> list[torch.Tensor]:
        """``t`` (same shape on every rank) from every rank, in rank order, on the group's device (``t`` is moved
        there first)."""
        d = groups.Deadline(self.timeout_s)
        t = t.to(self.device)
        out = [torch.empty_like(t) for _ in range(self.world_size)]
        opts = AllgatherOptions()
        opts.timeout = d.remaining()
        groups.wait(self.pg.allgather([out], [t], opts), d)
        return out

    def all_gather_int(self, n: int) -> list[int]:
        """An integer from every rank, in rank order (one copy back to the host)."""
        return torch.stack(self._all_gather(torch.tensor([n], dtype=torch.int64))).flatten().tolist()

    def all_gather_object(self, obj: V) -> list[V]:
        """A small picklable value from every rank, in rank order (metrics, flags)."""
        payload = torch.frombuffer(bytearray(pickle.dumps(obj)), dtype=torch.uint8)
        sizes = self.all_gather_int(payload.numel())
        width = max(sizes)
        padded = torch.zeros(width, dtype=torch.uint8)
        padded[: payload.numel()] = payload
        parts = torch.stack(self._all_gather(padded)).cpu()  # pickle reads host bytes: one copy back
        return [pickle.loads(p[:s].numpy().tobytes()) for p, s in zip(parts, sizes)]

    def gather_rows(self, part: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
        """The whole [n, ...] tensor from every rank's ``part`` (this rank's: ``part[i]`` is row ``rows[i]``); the
        ranks' rows cover 0..n-1 once. Assembled on the group's device; returned on ``part``'s."""
        sizes = self.all_gather_int(len(rows))
        width = max(sizes)
        idx = torch.full((width,), -1, dtype=torch.int64, device=self.device)
        idx[: len(rows)] = rows.to(self.device)
        padded = torch.zeros((width, *part.shape[1:]), dtype=part.dtype, device=self.device)
        padded[: part.shape[0]] = part.to(self.device)
        all_idx, pieces = self._all_gather(idx), self._all_gather(padded)
        out = torch.zeros((sum(sizes), *part.shape[1:]), dtype=part.dtype, device=self.device)
        for i, p, k in zip(all_idx, pieces, sizes):
            out[i[:k]] = p[:k]
        return out.to(part.device)

    def all_reduce_grads(self, params: list[torch.nn.Parameter]) -> None:
        """Sum the gradients of ``params`` over the ranks, in place (a missing gradient counts as zero)."""
        bucket: list[torch.nn.Parameter] = []
        size = 0
        for p in params:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
            bucket.append(p)
            size += p.grad.numel() * p.grad.element_size()
            if size >= GRAD_BUCKET_BYTES:
                self._reduce_bucket(bucket)
                bucket, size = [], 0
        if bucket:
            self._reduce_bucket(bucket)

    def _reduce_bucket(self, bucket: list[torch.nn.Parameter]) -> None:
        """One all-reduce per bucket on the group's device, summed in fp32 whatever the gradients' dtype (copied back
        in theirs, on theirs)."""
        flat = torch.cat([p.grad.reshape(-1).to(self.device, torch.float32) for p in bucket])
        groups.allreduce_sum(self.pg, flat, groups.Deadline(self.timeout_s))
        flat = flat.to(bucket[0].grad.device)  # one copy back, where the gradients live (a no-op on a GPU rank)
        offset = 0
        for p in bucket:
            k = p.grad.numel()
            p.grad.copy_(flat[offset : offset + k].view_as(p.grad))
            offset += k

    def check_replicas(self, model: torch.nn.Module, what: str) -> None:
        """Raise unless every rank holds the same trainable weights (a float64 checksum per tensor, compared
        exactly): ranks that silently drift apart would train different models and sync rank 0's."""
        sums = torch.stack([p.detach().double().sum().to(self.device) for p in model.parameters() if p.requires_grad])
        every = [s.cpu() for s in self._all_gather(sums)]  # compared on the host: one copy back
        names = [n for n, p in model.named_parameters() if p.requires_grad]
        for r, other in enumerate(every):
            diff = (other != every[0]).nonzero().flatten()
            if len(diff):
                raise DataParallelError(
                    f"{what}: trainer rank {r}'s weights differ from rank 0's "
                    f"({len(diff)} tensors, first {names[int(diff[0])]!r})"
                )
