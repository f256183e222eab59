"""The trainer's state on disk: checkpoints (resume), exports (a plain HF directory) and the weights as a dict.

What a checkpoint holds (DDP or one rank: rank 0 writes it all, in the single-rank layout; FSDP2: every rank its own
shards in ``sharded/``, and rank 0 ``model/``) and where it resumes: docs/data_parallel.md.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from asyncrl.checkpoint import load_tensors, rng_state, set_rng_state
from asyncrl.models.lora import load_adapter_state, merged_copy, save_adapter
from asyncrl.trainer import fsdp, gathered

SHARDED = "sharded"  # a checkpoint's torch.distributed.checkpoint directory (FSDP2)


class ActorStateMixin:
    """Checkpoint, resume and export for ``TrainerWorker`` (whose attributes it reads)."""

    def _full_on_host(self, masters: dict[str, torch.Tensor] | None) -> torch.nn.Module:
        """Rank 0's full weights in ``model.dtype`` on the host: the copy it serves from, or built from the gathered
        masters, or gathered now (the other ranks follow)."""
        if self.serving is not None:
            return self.serving
        if masters is not None:
            return gathered.fill(self.frame, lambda n, dtype: masters[n].to(dtype), self.model, torch.device("cpu"))
        with self.gathering() as session:
            return gathered.full_model(session, self.model, self.frame, torch.device("cpu"))

    def save_checkpoint(self, directory: str) -> None:
        """Writes model (safetensors) + tokenizer, optimizer, scheduler and RNG states into ``directory``; under FSDP2
        every rank is called, and writes its shards into ``sharded/``."""
        d = Path(directory)
        if self.sharded:
            frozen = {"ref": self.ref_model} if self.ref_model is not None else {}
            fsdp.save_sharded(d / SHARDED, self.model, self.optimizer, frozen)
            masters = fsdp.gather_to_host(self.model, keep=self.rank == 0) if self.serving is None else None
        if self.rank != 0:
            return
        d.mkdir(parents=True, exist_ok=True)
        if self.lora is not None:  # the adapter alone: the base is model.path, never changed
            save_adapter(self.model, d / "adapter")
        else:
            full = self._full_on_host(masters) if self.sharded else self.serving
            full.save_pretrained(d / "model", safe_serialization=True)
            self.tokenizer.save_pretrained(d / "model")
        state = {
            "scheduler": self.scheduler.state_dict(),
            "updates": self.updates,
            "version": self.version,
            "rng": rng_state(),
        }
        if self.sharded:
            state["sharded_ranks"] = self.world_size
        else:
            state["optimizer"] = self.optimizer.state_dict()
        torch.save(state, d / self.state_file)
        if self.ref_model is not None and not self.sharded:
            torch.save(self.ref_model.state_dict(), d / "ref_model.pt")

    def load_checkpoint(self, directory: str) -> int:
        d = Path(directory)
        state = torch.load(d / self.state_file, weights_only=False, map_location="cpu")
        if "sharded_ranks" in state and not self.sharded:
            raise RuntimeError(
                f"checkpoint {d} was written by {state['sharded_ranks']} FSDP2 ranks, each its shards "
                "(torch.distributed.checkpoint): resume it with trainer.strategy=fsdp2 and trainer.num_workers > 1 "
                f"(this trainer: {self.world_size} rank(s), not sharded); its model/ is a plain HF directory to "
                "start a new run from"
            )
        if "sharded_ranks" in state:  # every rank reads its own shards back (another rank count: resharded)
            frozen = {"ref": self.ref_model} if self.ref_model is not None else {}
            fsdp.load_sharded(d / SHARDED, self.model, self.optimizer, frozen)
        else:
            self._load_single_rank_layout(d, state)
        self.scheduler.load_state_dict(state["scheduler"])
        self.updates = int(state["updates"])
        self.version = int(state["version"])
        if self.engine is not None:
            self.engine.version = self.version
        set_rng_state(state["rng"])
        # checkpoints are taken at weight syncs: a sync window starts here
        serving = [self.serving] if self.sharded and self.serving is not None else []
        self._copy_weights(serving + ([self.prox_model] if self.prox_model is not None else []))
        if self.dp is not None and not self.sharded:  # every rank read the same files (any number of ranks wrote them)
            self.dp.check_replicas(self.model, f"{self.name}: resume from {d}")
        return self.version

    def _load_single_rank_layout(self, d: Path, state: dict[str, Any]) -> None:
        """A checkpoint of one rank or of DDP ranks (full tensors), into this trainer: each rank takes its slice
        where it is sharded (the fp32 masters, where saved, are then its weights)."""
        if self.lora is not None:
            load_adapter_state(self.model, d / "adapter")
        elif self.sharded:
            tensors = load_tensors(d / "model")
            fsdp.load_full(self.model, {k: v for k, v in tensors.items() if not _is_tied(self.model, k)}, str(d))
        else:
            missing, unexpected = self.model.load_state_dict(load_tensors(d / "model"), strict=False)
            missing = [m for m in missing if not _is_tied(self.model, m)]
            if missing or unexpected:
                raise RuntimeError(f"checkpoint {d}: missing weights {missing[:5]}, unexpected {unexpected[:5]}")
        if self.sharded:
            masters = state["optimizer"].get("master_weights")
            if masters is not None:
                names = [n for n, p in self.model.named_parameters() if p.requires_grad]
                fsdp.load_full(self.model, dict(zip(names, masters, strict=True)), str(d))
            state["optimizer"] = fsdp.sharded_optimizer_state(state["optimizer"], self.optimizer)
        self.optimizer.load_state_dict(state["optimizer"])
        if self.ref_model is not None:
            ref = torch.load(d / "ref_model.pt", weights_only=True, map_location="cpu")
            if self.sharded:
                fsdp.load_full(self.ref_model, {k: v for k, v in ref.items() if not _is_tied(self.model, k)}, str(d))
            else:
                self.ref_model.load_state_dict(ref)

    def export_model(self, directory: str) -> None:
        """The current policy as a plain HF directory (safetensors + config + tokenizer). A LoRA policy: base +
        adapter merged there, and the adapter alone (peft format) in ``directory/adapter``. Sharded with no full
        copy: gathered parameter by parameter (the other ranks follow)."""
        model = merged_copy(self.model) if self.lora is not None else self._full_on_host(None)
        model.save_pretrained(directory, safe_serialization=True)
        self.tokenizer.save_pretrained(directory)
        if self.lora is not None:
            save_adapter(self.model, Path(directory) / "adapter")

    def state_dict(self) -> dict[str, torch.Tensor]:
        return {k: v.detach().clone() for k, v in self._full_on_host(None).state_dict().items()}


def _is_tied(model: Any, name: str) -> bool:
    return name == "lm_head.weight" and bool(getattr(model.config, "tie_word_embeddings", False))
