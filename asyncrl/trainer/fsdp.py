"""FSDP2 for the data-parallel trainer (``trainer.strategy: fsdp2``): ``fully_shard`` per decoder layer and one unit
for the rest; the fp32 shards are the master weights. What is sharded, offloaded, kept whole and checkpointed:
docs/data_parallel.md.

The gradients are summed over the ranks, not averaged (as under DDP), and a sharded module collects in every forward
and backward, so the ranks run the same number of passes (``DataParallel.idle_pass``). FSDP2 needs the process's
default process group (``DeviceMesh`` does not take a bare ``ProcessGroupGloo``), so ranks must be processes (the Ray
backend), not threads of one process.
"""

from __future__ import annotations

import os
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import CPUOffloadPolicy, FSDPModule, MixedPrecisionPolicy, OffloadPolicy, fully_shard
from torch.distributed.tensor import DTensor, distribute_tensor

from asyncrl.models.loading import decoder_layers


def init_mesh(store: dist.Store, rank: int, world_size: int, timeout_s: float, backend: str, host: str) -> DeviceMesh:
    """The default process group of this rank's process (rendezvous through ``store``) and a 1-D mesh over it."""
    if dist.is_initialized():
        raise RuntimeError(
            "trainer.strategy=fsdp2: this process already has a default process group; FSDP2 ranks must be "
            "processes of their own (trainer.backend=ray)"
        )
    if backend == "gloo" and (host.startswith("127.") or host == "localhost"):
        os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")  # one machine: keep gloo on loopback
    dist.init_process_group(
        backend,
        store=dist.PrefixStore("asyncrl/fsdp2/", store),
        rank=rank,
        world_size=world_size,
        timeout=timedelta(seconds=timeout_s),
    )
    return init_device_mesh("cuda" if backend == "nccl" else "cpu", (world_size,))


def close_mesh() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()


def shard(
    model: torch.nn.Module, mesh: DeviceMesh, compute_dtype: torch.dtype | None = None, offload: bool = False
) -> None:
    """``fully_shard`` each decoder layer, then the root, in place; the gradients are summed across ranks.

    ``compute_dtype`` (bf16/fp16 over fp32 parameters): the parameters are all-gathered in it for the passes and the
    gradients reduced in fp32 (``MixedPrecisionPolicy``); None or the parameters' dtype: no casting. ``offload``: the
    shards live on the host between passes (``CPUOffloadPolicy``; pinned where the mesh is on GPUs)."""
    params_dtype = next(model.parameters()).dtype
    if compute_dtype is None or compute_dtype == params_dtype:
        mp = MixedPrecisionPolicy()
    else:
        mp = MixedPrecisionPolicy(param_dtype=compute_dtype, reduce_dtype=torch.float32)
    off = CPUOffloadPolicy(pin_memory=mesh.device_type == "cuda") if offload else OffloadPolicy()
    for unit in decoder_layers(model):  # a unit each; the root takes the rest (embeddings, final norm, head)
        fully_shard(unit, mesh=mesh, mp_policy=mp, offload_policy=off)
    fully_shard(model, mesh=mesh, mp_policy=mp, offload_policy=off)
    for m in model.modules():
        if isinstance(m, FSDPModule):
            m.set_gradient_divide_factor(1.0)
            m.set_force_sum_reduction_for_comms(True)  # gloo has no PREMUL_SUM: a plain SUM (factor 1 anyway)


def whole(p: torch.Tensor) -> torch.Tensor:
    """A parameter gathered whole from its shards (a collective for a DTensor: every rank calls it), or as it is."""
    return p.full_tensor() if isinstance(p, DTensor) else p.detach()


def gather_into(model: torch.nn.Module, targets: list[torch.nn.Module]) -> None:
    """Copy the sharded ``model``'s full weights into each unsharded module of ``targets`` (same parameter names).
    A collective: every rank calls it, with its own targets (possibly none)."""
    dests = [dict(t.named_parameters()) for t in targets]
    with torch.no_grad():
        for name, p in model.named_parameters():
            full = whole(p)
            for d in dests:
                d[name].copy_(full)


def copy_shards(model: torch.nn.Module, targets: list[torch.nn.Module]) -> None:
    """Copy the sharded ``model``'s weights into each of ``targets``, sharded the same way over the same mesh (the
    reference and proximal models): each rank its own shards, cast to the target's dtype, with no communication."""
    with torch.no_grad():
        for t in targets:
            dest = dict(t.named_parameters())
            for name, p in model.named_parameters():
                dest[name].to_local().copy_(p.to_local())


def gather_to_host(model: torch.nn.Module, keep: bool) -> dict[str, torch.Tensor]:
    """The sharded ``model``'s parameters gathered whole one at a time (a collective: every rank calls it), each
    copied to the host where ``keep`` (rank 0), else dropped: the device never holds more than one whole."""
    out = {}
    for n, p in model.named_parameters():
        full = whole(p)
        if keep:
            out[n] = full.to("cpu", copy=True)
    return out


def save_sharded(
    directory: Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer, frozen: dict[str, torch.nn.Module]
) -> None:
    """Every rank writes its own shards of ``model``, of ``optimizer``'s state and of the ``frozen`` sharded models
    into ``directory`` (``torch.distributed.checkpoint``, one file per rank; a collective): nothing is gathered.
    The ranks must see one filesystem (one node, or a shared one)."""
    dcp.save(_dcp_state(model, optimizer, frozen), checkpoint_id=str(directory))


def load_sharded(
    directory: Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer, frozen: dict[str, torch.nn.Module]
) -> None:
    """``save_sharded``'s shards back into this rank's (a collective); another number of ranks reads the same
    checkpoint resharded."""
    state = _dcp_state(model, optimizer, frozen)
    dcp.load(state, checkpoint_id=str(directory))
    set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])
    for key, m in frozen.items():
        m.load_state_dict(state[key])


def _dcp_state(model: torch.nn.Module, optimizer: torch.optim.Optimizer, frozen: dict[str, torch.nn.Module]) -> dict:
    msd, osd = get_state_dict(model, optimizer)
    return {"model": msd, "optim": osd, **{key: m.state_dict() for key, m in frozen.items()}}


def is_sharded(model: torch.nn.Module) -> bool:
    return isinstance(model, FSDPModule)


def load_full(model: torch.nn.Module, tensors: dict[str, torch.Tensor], where: str) -> None:
    """Load full tensors (a checkpoint's, any number of ranks wrote it) into the sharded ``model``: each rank copies
    its own slice, with no communication. Tied weights may be missing (they are one parameter)."""
    params = dict(model.named_parameters())
    unexpected = sorted(set(tensors) - set(params) - {n for n, _ in model.named_buffers()})
    missing = sorted(set(params) - set(tensors))
    if missing or unexpected:
        raise RuntimeError(f"checkpoint {where}: missing weights {missing[:5]}, unexpected {unexpected[:5]}")
    with torch.no_grad():
        for name, p in params.items():
            p.copy_(_local_slice(tensors[name].to(p.dtype), p))


def full_optimizer_state(optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """``optimizer.state_dict()`` with every sharded state tensor gathered whole: the layout one rank saves. A
    collective: every rank calls it (in the same parameter order), only rank 0 need keep the result."""
    sd = optimizer.state_dict()
    state = {
        idx: {k: _whole(v) for k, v in sorted(per_param.items())} for idx, per_param in sorted(sd["state"].items())
    }
    return {"state": state, "param_groups": sd["param_groups"]}


def _whole(v: object) -> object:
    """A state value gathered whole (a sharded tensor) or copied (a step count): never the optimizer's own tensor,
    which its next step changes in place."""
    if isinstance(v, DTensor):
        return v.full_tensor()
    return v.clone() if isinstance(v, torch.Tensor) else v


def sharded_optimizer_state(full: dict[str, Any], optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """A full (single-rank layout) optimizer state cut to this rank's slices of ``optimizer``'s sharded
    parameters, for ``optimizer.load_state_dict``."""
    params = [p for g in optimizer.param_groups for p in g["params"]]
    state = {}
    for idx, per_param in full["state"].items():
        p = params[int(idx)]
        state[idx] = {
            k: _local_slice(v, p)
            if isinstance(v, torch.Tensor) and isinstance(p, DTensor) and v.shape == p.shape
            else _whole(v)
            for k, v in per_param.items()
        }
    return {"state": state, "param_groups": full["param_groups"]}


def _local_slice(full: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """``full`` as ``like`` holds it: the same DTensor layout (this rank's slice, cut locally), or as is."""
    if not isinstance(like, DTensor):
        return full
    return distribute_tensor(full.to(like.device), like.device_mesh, like.placements, src_data_rank=None)
