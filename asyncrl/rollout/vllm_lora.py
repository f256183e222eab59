"""LoRA on the vLLM engine: each sync's adapter becomes a versioned peft directory that vLLM loads, and every request
names the current one (vLLM applies it unmerged, with its punica kernels; on CPU their torch fallbacks).

The names and shapes a sync must carry come from the base model's config wrapped with the same adapter on the meta
device, so the handshake checks the trainer's adapter against the engine without loading any weights.
"""

from __future__ import annotations

import shutil
import tempfile
import weakref
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from asyncrl.models.lora import LoraError, LoraSpec, adapter_tensors, apply_lora

# vLLM 0.32's allowed ``max_lora_rank`` values (an adapter of any rank up to it loads)
VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)


def max_lora_rank(rank: int) -> int:
    """The smallest rank vLLM accepts as ``max_lora_rank`` that holds an adapter of ``rank``."""
    for allowed in VLLM_LORA_RANKS:
        if allowed >= rank:
            return allowed
    raise LoraError(f"model.lora_rank {rank}: vLLM serves adapters up to rank {VLLM_LORA_RANKS[-1]}")


def _saved_name(name: str) -> str:
    """A live peft parameter name as peft saves it (the adapter's name dropped): what vLLM reads."""
    return name.replace(".lora_A.default.", ".lora_A.").replace(".lora_B.default.", ".lora_B.")


class VllmAdapters:
    """The adapter a vLLM engine serves: what a sync must carry (``params``: meta tensors), and the current
    ``request`` (None = the base model; ``model.lora_adapter_path`` until the first sync)."""

    def __init__(self, model_path: str, spec: LoraSpec) -> None:
        from transformers import AutoConfig, AutoModelForCausalLM
        from vllm.lora.request import LoRARequest

        self._request_cls = LoRARequest
        self.spec = spec
        config = AutoConfig.from_pretrained(model_path, local_files_only=True)
        with torch.device("meta"):
            meta = apply_lora(AutoModelForCausalLM.from_config(config), replace(spec, adapter_path=None), False)
        self.params: dict[str, torch.Tensor] = adapter_tensors(meta)
        self._config = meta.peft_config["default"]  # target modules resolved ("all-linear" -> the layer names)
        self._config.base_model_name_or_path = model_path
        self._dir = Path(tempfile.mkdtemp(prefix="asyncrl-vllm-lora-"))
        weakref.finalize(self, shutil.rmtree, str(self._dir), True)  # the adapter files go with the engine
        self._next_id = 1
        self.request: Any = None
        if spec.adapter_path:
            self.request = self._new_request("start", spec.adapter_path)

    def _new_request(self, tag: str, path: str) -> Any:
        request = self._request_cls(f"asyncrl-{tag}", self._next_id, str(path))
        self._next_id += 1
        return request

    def activate(self, engine: Any, tensors: Mapping[str, torch.Tensor], version: int) -> None:
        """Write ``tensors`` as version ``version``'s adapter, load it into ``engine`` (vLLM's ``LLMEngine``) now, so a
        bad adapter fails at the sync and not at the next request, and drop the previous one."""
        from safetensors.torch import save_file

        path = self._dir / f"v{version}"
        path.mkdir(parents=True, exist_ok=True)
        save_file(
            {_saved_name(n): t.detach().to("cpu").contiguous() for n, t in tensors.items()},
            str(path / "adapter_model.safetensors"),
        )
        self._config.save_pretrained(str(path))
        request = self._new_request(f"v{version}", str(path))
        if not engine.add_lora(request):
            raise LoraError(f"vLLM did not load the adapter of weight version {version} from {path}")
        old, self.request = self.request, request
        if old is not None:
            engine.remove_lora(old.lora_int_id)
            if Path(old.lora_path).parent == self._dir:
                shutil.rmtree(old.lora_path, ignore_errors=True)
