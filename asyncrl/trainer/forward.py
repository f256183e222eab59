"""The trainer's forward passes: a ``TrainBatch`` (padded or packed) through a transformers model, the outputs at the
positions that predict each response token, and the responses' log-probs without gradients (reference, old policy).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch.distributed.fsdp import FSDPModule
from torch.distributed.tensor import DTensor

from asyncrl import losses
from asyncrl.config import ActorConfig, CriticConfig
from asyncrl.data.collate import Batching, TrainBatch, micro_batches
from asyncrl.models.device import to_device


def model_inputs(mb: TrainBatch, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """The keyword arguments of a transformers forward over ``mb``: its padded rows, or its packed rows with their
    4D attention mask in the model's ``dtype``."""
    if mb.packed is not None:
        p = mb.packed
        return dict(input_ids=p.input_ids_RW, attention_mask=p.attention_mask(dtype), position_ids=p.position_ids_RW)
    return dict(input_ids=mb.input_ids_BL, attention_mask=mb.attention_mask_BL, position_ids=mb.position_ids_BL)


def at_responses(out_RLH: torch.Tensor, mb: TrainBatch) -> torch.Tensor:
    """The outputs (logits, hidden states) at the positions predicting each response token: [B, T, H]."""
    if mb.packed is not None:
        return out_RLH.reshape(-1, out_RLH.shape[-1])[mb.packed.src_BT]
    T = mb.response_ids_BT.shape[1]
    return out_RLH[:, mb.prompt_width - 1 : mb.prompt_width - 1 + T]


def forward_logits(model: torch.nn.Module, mb: TrainBatch, temperature: float) -> torch.Tensor:
    """Logits predicting each response token, scaled by the sampling temperature: float [B, T, V]."""
    out = model(**model_inputs(mb, next(model.parameters()).dtype))
    logits = at_responses(out.logits, mb).float()
    return logits / temperature if temperature > 0 else logits


def use_checkpointing(setting: bool | None, device: torch.device) -> bool:
    """``actor.gradient_checkpointing``: as set, or (null) on where the trainer computes on a GPU, whose memory the
    activations fill, and off on the CPU, where recomputing costs time and memory is plenty."""
    return setting if setting is not None else device.type == "cuda"


def enable_checkpointing(model: torch.nn.Module) -> None:
    """Recompute each decoder layer's activations in the backward instead of keeping them (transformers' per-layer
    ``torch.utils.checkpoint``, non-reentrant: it works under FSDP2 and with frozen embeddings, as under LoRA).
    Only a model in training mode recomputes: the log-prob passes and the engines' decoding run in eval mode."""
    kwargs = {"use_reentrant": False}
    if hasattr(model, "activation_checkpointing_enable"):  # transformers >= 5.x's name
        model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)


def batching(cfg: ActorConfig | CriticConfig, role: str = "actor") -> Batching:
    """The role's micro-batching: ``ppo_micro_batch_size`` samples, or ``ppo_max_token_len_per_gpu`` tokens with
    ``use_dynamic_bsz``; ``shared_prefix`` packs a group's responses behind one copy of its prompt."""
    return Batching(
        cfg.ppo_micro_batch_size,
        share_prefix=cfg.shared_prefix,
        max_tokens=cfg.ppo_max_token_len_per_gpu if cfg.use_dynamic_bsz else None,
        knob=f"{role}.ppo_max_token_len_per_gpu",
    )


def model_device(model: torch.nn.Module) -> torch.device:
    """Where ``model`` computes, so where its inputs go: its parameters' device, or a sharded model's mesh device
    (its shards may be offloaded to the host between passes)."""
    p = next(model.parameters())
    if isinstance(p, DTensor) and p.device_mesh.device_type == "cuda":
        return torch.device("cuda", torch.cuda.current_device())
    return p.device


def response_logprobs(
    model: torch.nn.Module,
    batch: TrainBatch,
    temperature: float,
    how: Batching | int,
    rounds: Callable[[int], int] | None = None,
) -> torch.Tensor:
    """Per-token log-probs of the batch's responses under ``model`` (no grad), in micro-batches: [B, T].

    ``rounds`` (a sharded model, whose forwards are collectives): given this rank's number of micro-batches, the
    number every rank runs; the difference is made up with one-token forwards."""
    was_training = model.training
    model.eval()
    out = torch.zeros_like(batch.response_mask_BT)
    device = model_device(model)
    with torch.no_grad() if rounds is not None else torch.inference_mode():
        mbs = micro_batches(batch, how)
        for idx, mb in mbs:
            mb = to_device(mb, device)
            logits = forward_logits(model, mb, temperature)
            logp = losses.logprobs_from_logits(logits, mb.response_ids_BT) * mb.response_mask_BT
            out[idx, : mb.response_mask_BT.shape[1]] = logp.to(out.device)
        for _ in range((rounds(len(mbs)) - len(mbs)) if rounds is not None else 0):
            model(input_ids=torch.zeros((1, 1), dtype=torch.long, device=device))
    for m in model.modules() if rounds is not None else ():
        if isinstance(m, FSDPModule):  # FSDP2 keeps the root unsharded after a forward, for a backward that this
            m.reshard()  # pass does not run: the next training forward must start from the shards
    model.train(was_training)
    return out
