"""The trainer's state on disk: checkpoints (resume), exports (a plain HF directory) and the weights as a dict.

Under DDP (or one rank) rank 0 writes the full weights, in ``model.dtype``, and the optimizer state, the fp32 master
weights inside it (``MasterWeightsAdamW``). Under FSDP2 every rank is called: the optimizer state is gathered whole
(the single-rank layout, so a checkpoint of N ranks resumes on M), and where the compute dtype is not fp32 the fp32
shards, the masters, gathered whole too (``master_weights``, the key ``MasterWeightsAdamW`` writes, so a DDP run
resumes from them as well); a trainer with no full copy gathers its weights parameter by parameter
(``asyncrl.trainer.gathered``). Sharded checkpoints (``torch.distributed.checkpoint``, no gather) are not built.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from asyncrl.checkpoint import load_tensors, rng_state, set_rng_state
from asyncrl.models.lora import load_adapter_state, merged_copy, save_adapter
from asyncrl.trainer import fsdp, gathered


class ActorStateMixin:
    """Checkpoint, resume and export for ``ActorRolloutWorker`` (whose attributes it reads)."""

    def _full_on_host(self, masters: dict[str, torch.Tensor] | None) -> torch.nn.Module:
        """Rank 0's full weights in ``model.dtype`` on the host: the copy it serves from, or built from the gathered
        masters, or gathered now (the other ranks follow)."""
        if self.serving is not None:
            return self.serving
        if masters is not None:
            return gathered.fill(self.frame, lambda n, dtype: masters[n].to(dtype), self.model, torch.device("cpu"))
        with self.gathering() as session:
            return self.gathered_model(session, torch.device("cpu"))

    def save_checkpoint(self, directory: str) -> None:
        """Writes model (safetensors) + tokenizer, optimizer, scheduler and RNG states into ``directory``. FSDP2:
        every rank is called (the optimizer state, and the masters, are gathered whole), rank 0 writes them."""
        optimizer = fsdp.full_optimizer_state(self.optimizer) if self.sharded else self.optimizer.state_dict()
        # FSDP2: the fp32 shards gathered whole onto rank 0's host, where they are the masters (a compute dtype
        # other than fp32) or the only full weights (no copy kept)
        bf16 = self.sharded and self.compute_dtype != torch.float32
        gather = self.sharded and self.lora is None and (bf16 or self.serving is None)
        masters = fsdp.gather_to_host(self.model, keep=self.rank == 0) if gather else None
        ref = None
        if self.ref_model is not None:  # a sharded reference gathered whole (every rank takes part)
            ref = fsdp.full_state(self.ref_model) if self.sharded else self.ref_model.state_dict()
        if self.rank != 0:
            return
        d = Path(directory)
        d.mkdir(parents=True, exist_ok=True)
        if self.lora is not None:  # the adapter alone: the base is model.path, never changed
            save_adapter(self.model, d / "adapter")
        else:
            self._full_on_host(masters).save_pretrained(d / "model", safe_serialization=True)
            self.tokenizer.save_pretrained(d / "model")
        if masters is not None and bf16:
            names = [n for n, p in self.model.named_parameters() if p.requires_grad]
            optimizer["master_weights"] = [masters[n] for n in names]
        state = {
            "optimizer": optimizer,
            "scheduler": self.scheduler.state_dict(),
            "updates": self.updates,
            "version": self.version,
            "rng": rng_state(),
        }
        torch.save(state, d / self.state_file)
        if ref is not None:
            torch.save(ref, d / "ref_model.pt")

    def load_checkpoint(self, directory: str) -> int:
        d = Path(directory)
        if self.lora is not None:
            load_adapter_state(self.model, d / "adapter")
        else:
            self._load_full_weights(d)
        state = torch.load(d / self.state_file, weights_only=False, map_location="cpu")
        if self.sharded:  # this rank's slice of the whole state; the masters, where saved, are its weights
            masters = state["optimizer"].get("master_weights")
            if masters is not None:
                names = [n for n, p in self.model.named_parameters() if p.requires_grad]
                fsdp.load_full(self.model, dict(zip(names, masters, strict=True)), str(d))
            state["optimizer"] = fsdp.sharded_optimizer_state(state["optimizer"], self.optimizer)
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        self.updates = int(state["updates"])
        self.version = int(state["version"])
        if self.engine is not None:
            self.engine.version = self.version
        set_rng_state(state["rng"])
        if self.ref_model is not None:
            ref = torch.load(d / "ref_model.pt", weights_only=True, map_location="cpu")
            if self.sharded:
                fsdp.load_full(self.ref_model, {k: v for k, v in ref.items() if not _is_tied(self.model, k)}, str(d))
            else:  # a sharded run's reference holds a tied weight once
                missing, unexpected = self.ref_model.load_state_dict(ref, strict=False)
                if [m for m in missing if not _is_tied(self.model, m)] or unexpected:
                    raise RuntimeError(
                        f"checkpoint {d}: reference weights missing {missing[:5]}, unexpected {unexpected[:5]}"
                    )
        # checkpoints are taken at weight syncs: a sync window starts here
        serving = [self.serving] if self.sharded and self.serving is not None else []
        self._copy_weights(serving + ([self.prox_model] if self.prox_model is not None else []))
        if self.dp is not None and not self.sharded:  # every rank read the same files (any number of ranks wrote them)
            self.dp.check_replicas(self.model, f"{self.name}: resume from {d}")
        return self.version

    def _load_full_weights(self, d: Path) -> None:
        tensors = load_tensors(d / "model")
        if self.sharded:
            tensors = {k: v for k, v in tensors.items() if not _is_tied(self.model, k)}
            fsdp.load_full(self.model, tensors, str(d))
            return
        missing, unexpected = self.model.load_state_dict(tensors, strict=False)
        missing = [m for m in missing if not _is_tied(self.model, m)]
        if missing or unexpected:
            raise RuntimeError(f"checkpoint {d}: missing weights {missing[:5]}, unexpected {unexpected[:5]}")

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
