"""Every data-parallel collective runs on the group's device: a CPU stand-in for NCCL, which takes CUDA tensors only.

``DeviceGuardGroup`` is a real gloo group that refuses any tensor not on the device it was declared with, as NCCL
refuses host tensors. The declared device is torch's ``lazy`` device (its TorchScript backend ships in the CPU build):
unlike ``meta`` it holds data, so the collectives' results can be checked, not only their placement. The guard copies
the (checked) tensors to the host for gloo and the results back into the caller's device tensors.

The ranks are spawned processes, as NCCL ranks are (torch's lazy backend is not for threads sharing it).
"""

from __future__ import annotations

import copy
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.multiprocessing as mp

from asyncrl.comm import groups
from asyncrl.comm.groups import LOOPBACK, find_free_port
from asyncrl.models.presets import build_model
from asyncrl.models.tokenizer import build_char_tokenizer
from asyncrl.trainer.data_parallel import DataParallel
from tests.test_fsdp import _store_port
from tests.test_policy_update import CHARS


@pytest.fixture(scope="module")
def lazy() -> torch.device:
    import torch._lazy.ts_backend

    torch._lazy.ts_backend.init()
    return torch.device("lazy")


class DeviceGuardGroup:
    """A gloo process group that takes tensors on ``device`` only (``RuntimeError`` naming the op otherwise)."""

    def __init__(self, pg: Any, device: torch.device):
        self.pg, self.device = pg, device

    def _check(self, op: str, tensors: list[torch.Tensor]) -> None:
        for t in tensors:
            if t.device.type != self.device.type:
                raise RuntimeError(f"{op}: tensor on {t.device}, this group takes {self.device.type} tensors only")

    def allgather(self, outs: list[list[torch.Tensor]], ins: list[torch.Tensor], opts: Any) -> Any:
        self._check("allgather", [*ins, *outs[0]])
        host_out = [[o.cpu() for o in outs[0]]]
        work = self.pg.allgather(host_out, [t.cpu() for t in ins], opts)
        work.wait(opts.timeout)
        for o, h in zip(outs[0], host_out[0]):
            o.copy_(h)
        return work

    def allreduce(self, tensors: list[torch.Tensor], opts: Any) -> Any:
        self._check("allreduce", tensors)
        host = [t.cpu() for t in tensors]
        work = self.pg.allreduce(host, opts)
        work.wait(opts.timeout)
        for t, h in zip(tensors, host):
            t.copy_(h)
        return work

    def shutdown(self) -> None:
        self.pg.shutdown()

    def abort(self) -> None:
        self.pg.abort()


def guarded(rank: int, world: int, port: int, device: torch.device) -> DataParallel:
    """This rank's ``DataParallel`` over a real gloo group guarded to take ``device`` tensors only."""
    pg, store = groups.create_process_group("gloo", LOOPBACK, port, rank, world, 60, "trainer_dp")
    return DataParallel(DeviceGuardGroup(pg, device), store, rank, world, 60, "gloo", LOOPBACK, device=device)


def _collectives(dp: DataParallel, start: torch.nn.Module) -> tuple:
    rounds = dp.rounds(3 + 4 * dp.rank)
    objs = dp.all_gather_object({"rank": dp.rank, "x": [dp.rank] * (dp.rank + 1)})
    rows = torch.tensor([[4, 0, 2], [1, 3]][dp.rank])
    gathered = dp.gather_rows(rows.float()[:, None] * torch.ones(1, 3), rows)
    model = copy.deepcopy(start)
    dp.check_replicas(model, "start")
    params = list(model.parameters())
    for p in params:
        p.grad = torch.full_like(p, float(dp.rank + 1))
    dp.all_reduce_grads(params)
    return rounds, objs, gathered, [p.grad for p in params]


def _rank_main(rank: int, out: str) -> None:
    """One spawned rank (a process each, as NCCL ranks are; the lazy device is not for threads sharing it)."""
    import torch._lazy.ts_backend

    torch.set_num_threads(1)
    torch._lazy.ts_backend.init()
    start = build_model("micro", build_char_tokenizer([CHARS]), seed=0)
    dp = guarded(rank, 2, _store_port(rank, Path(out)), torch.device("lazy"))
    try:
        result = _collectives(dp, start)
    finally:
        dp.close()
    torch.save(result, Path(out) / f"rank{rank}.pt")


def test_the_guard_refuses_host_tensors(lazy):
    dp = guarded(0, 1, find_free_port(), lazy)
    try:
        with pytest.raises(RuntimeError, match="allreduce: tensor on cpu, this group takes lazy tensors only"):
            dp.pg.allreduce([torch.ones(2)], _opts())
        dp.pg.allreduce([torch.ones(2, device=lazy)], _opts())  # a tensor on its device passes
    finally:
        dp.close()


def _opts() -> Any:
    import torch.distributed as dist

    opts = dist.AllreduceOptions()
    opts.reduceOp = dist.ReduceOp.SUM
    opts.timeout = timedelta(seconds=30)
    return opts


def test_every_collective_runs_on_the_group_device(tmp_path):
    """rounds, all_gather_object, gather_rows, check_replicas and the gradient all-reduce on two ranks whose group
    takes only ``lazy`` tensors: each gives the host-side answer its caller expects."""
    mp.start_processes(_rank_main, args=(str(tmp_path),), nprocs=2, start_method="spawn")
    for r in range(2):
        rounds, objs, gathered, grads = torch.load(tmp_path / f"rank{r}.pt", weights_only=False)
        assert rounds == 7
        assert objs == [{"rank": 0, "x": [0]}, {"rank": 1, "x": [1, 1]}]
        assert gathered.device.type == "cpu"  # back where the caller's part was
        assert torch.equal(gathered, torch.arange(5).float()[:, None] * torch.ones(1, 3))
        assert all(g.device.type == "cpu" and torch.equal(g, torch.full_like(g, 3.0)) for g in grads)
