"""LoRA (``model.lora_rank`` > 0): the actor trains a peft adapter, and only the adapter travels at a weight sync.

One wrapping for every holder of the policy: the trainer wraps its model with a trainable adapter, a rollout worker
wraps its own copy of the base model with an adapter of the same shape, so both sides name the adapter's tensors
identically (``...q_proj.lora_A.default.weight``) and the sync group's handshake compares them like any parameters.
``synced_tensors`` is what a sync carries: the adapter alone for a LoRA model, every parameter otherwise. A rollout
engine that owns its copy keeps the adapter merged into the base weights (decoding pays no extra matmuls) and
re-merges at every sync (``merged_update``). A sync whose plan has no adapter tensor is refused
(``require_adapter``; why: docs/lora.md).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Protocol

import torch

from asyncrl.errors import UserInputError
from asyncrl.models.loading import ModelLoadError

ADAPTER_MARKERS = (".lora_A.", ".lora_B.")


class LoraError(UserInputError, RuntimeError):
    """A LoRA setting, adapter directory or sync that cannot work; the message names which and why."""


class LoraSettings(Protocol):
    """The LoRA keys of the config's ``model`` section (``asyncrl.config.schema.ModelConfig``)."""

    @property
    def lora_rank(self) -> int: ...
    @property
    def lora_alpha(self) -> float: ...
    @property
    def target_modules(self) -> str | list[str]: ...
    @property
    def lora_adapter_path(self) -> str | None: ...


@dataclass(frozen=True)
class LoraSpec:
    """``model.lora_*`` of a config: rank, scaling numerator, the modules adapted, and an adapter to start from."""

    rank: int
    alpha: float
    target_modules: str | tuple[str, ...]  # "all-linear" or module names (q_proj, v_proj, ...)
    adapter_path: str | None = None

    @classmethod
    def of(cls, m: LoraSettings) -> LoraSpec | None:
        """From the ``model`` section; None when LoRA is off (``model.lora_rank: 0``)."""
        if not m.lora_rank:
            return None
        targets = m.target_modules if isinstance(m.target_modules, str) else tuple(m.target_modules)
        return cls(int(m.lora_rank), float(m.lora_alpha), targets, m.lora_adapter_path)


def _peft() -> ModuleType:
    try:
        import peft
    except ImportError as e:  # a regular dependency: only a broken install gets here
        raise LoraError(f"model.lora_rank > 0 needs peft (pip install peft): {e}") from e
    return peft


def apply_lora(model: torch.nn.Module, spec: LoraSpec, trainable: bool) -> torch.nn.Module:
    """``model`` wrapped with the adapter ``spec`` describes: a fresh one (B = 0: the base model's outputs, as peft
    initialises it) or the one in ``spec.adapter_path``. ``trainable``: only the adapter's tensors require grad;
    otherwise none do."""
    peft = _peft()
    if spec.adapter_path:
        path = spec.adapter_path
        if not os.path.isfile(os.path.join(path, "adapter_config.json")):
            raise ModelLoadError(f"model.lora_adapter_path {path}: no adapter_config.json (expected a peft adapter)")
        try:
            wrapped = peft.PeftModel.from_pretrained(model, path, is_trainable=trainable)
        except Exception as e:  # peft raises ValueError/KeyError/RuntimeError for a mismatched adapter
            raise ModelLoadError(f"model.lora_adapter_path {path}: {type(e).__name__}: {e}") from e
        rank = wrapped.peft_config["default"].r
        if rank != spec.rank:
            raise LoraError(f"model.lora_adapter_path {path} has rank {rank}, model.lora_rank is {spec.rank}")
    else:
        config = peft.LoraConfig(
            r=spec.rank,
            lora_alpha=spec.alpha,
            target_modules=list(spec.target_modules) if isinstance(spec.target_modules, tuple) else spec.target_modules,
            lora_dropout=0.0,
            bias="none",
            task_type="CAUSAL_LM",
        )
        try:
            wrapped = peft.get_peft_model(model, config)
        except ValueError as e:  # e.g. a target module the model does not have
            raise LoraError(f"model.target_modules {spec.target_modules!r}: {e}") from e
    if not trainable:
        wrapped.requires_grad_(False)
    return wrapped


def is_lora(model: torch.nn.Module) -> bool:
    return hasattr(model, "peft_config")


def adapter_tensors(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The adapter's tensors by their parameter names (detached, live)."""
    return {n: p.detach() for n, p in model.named_parameters() if any(m in n for m in ADAPTER_MARKERS)}


def synced_tensors(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """What a weight sync carries from / into ``model``: its adapter for a LoRA model, else every parameter (tied
    ones once)."""
    if is_lora(model):
        return adapter_tensors(model)
    return {name: p.detach() for name, p in model.named_parameters()}


def require_adapter(names: list[str], where: str) -> None:
    """A LoRA sync plan without an adapter tensor is an error, never a silent base-weights-only sync."""
    if not any(any(m in n for m in ADAPTER_MARKERS) for n in names):
        raise LoraError(
            f"{where}: the weight sync carries no LoRA adapter tensor ({len(names)} tensors, e.g. "
            f"{', '.join(names[:3]) or 'none'}): the rollout would keep sampling without the trained adapter"
        )


@contextmanager
def merged_update(model: torch.nn.Module) -> Iterator[None]:
    """Around copying new adapter tensors into ``model``: when the adapter is merged into the base weights (a rollout
    engine's own copy), take the old adapter out first and merge the new one in after; otherwise nothing (the
    trainer's model stays unmerged)."""
    merged = is_lora(model) and any(getattr(m, "merged", False) for m in model.modules())
    if merged:
        model.unmerge_adapter()
    try:
        yield
    finally:
        if merged:
            model.merge_adapter()


def reference_policy(model: torch.nn.Module):
    """A context in which a LoRA actor is its reference policy, the base model: the adapter switched off (verl's
    choice too; no second copy of the weights)."""
    return model.disable_adapter()


def save_adapter(model: torch.nn.Module, directory: str | Path) -> None:
    """The adapter alone in peft's format (adapter_config.json + adapter_model.safetensors)."""
    model.save_pretrained(str(directory), safe_serialization=True)


def load_adapter_state(model: torch.nn.Module, directory: str | Path) -> None:
    """Restore the adapter ``save_adapter`` wrote into ``directory`` (a checkpoint's), every tensor required."""
    from safetensors.torch import load_file

    peft = _peft()
    file = Path(directory) / "adapter_model.safetensors"
    if not file.is_file():
        raise FileNotFoundError(f"checkpoint {directory}: no adapter_model.safetensors (saved without LoRA?)")
    result = peft.set_peft_model_state_dict(model, load_file(str(file)))
    missing = [k for k in result.missing_keys if any(m in k for m in ADAPTER_MARKERS)]
    if missing or result.unexpected_keys:
        raise RuntimeError(
            f"checkpoint {directory}: adapter tensors missing {missing[:5]}, unexpected {result.unexpected_keys[:5]}"
        )


def merged_copy(model: torch.nn.Module) -> torch.nn.Module:
    """A plain transformers model equal to base + adapter (for export); ``model`` itself is untouched."""
    import copy

    return copy.deepcopy(model).merge_and_unload()
