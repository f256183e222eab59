"""What the vLLM engine knows of a model directory without loading it in transformers: the parameters a sync must
carry (meta tensors), its eos ids, the CPU re-pack of tied vocabulary layers after a reload, and what a
tensor-parallel worker runs of a sync (``reload_and_fingerprint``, checked by ``check_shard_fingerprints``), and the
reload warnings a sync always causes."""

from __future__ import annotations

import logging
from typing import Any

import torch
from transformers import PreTrainedTokenizerBase

from asyncrl.checkpoint import differing, fingerprint
from asyncrl.models.loading import ModelLoadError, eos_token_ids_of


def expected_params(model_path: str) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """What a sync must carry: the HF model's parameters as shapes on the meta device (tied aliases included), and
    alias -> canonical name (``lm_head.weight`` -> ``model.embed_tokens.weight`` when tied)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(model_path, local_files_only=True)
    with torch.device("meta"):
        meta = AutoModelForCausalLM.from_config(config)
    params = dict(meta.named_parameters(remove_duplicate=False))
    first: dict[int, str] = {}  # a tensor's first name
    return params, {name: first.setdefault(id(p), name) for name, p in params.items()}


def refresh_tied_cpu_layers(model: torch.nn.Module) -> list[str]:
    """Re-pack every vocabulary layer's CPU GEMM from its current weight (run inside vLLM's worker after a reload)."""
    from vllm.model_executor.layers.utils import dispatch_cpu_unquantized_gemm
    from vllm.model_executor.layers.vocab_parallel_embedding import VocabParallelEmbedding

    done = []
    for name, module in model.named_modules():
        if isinstance(module, VocabParallelEmbedding) and hasattr(module, "cpu_linear"):
            dispatch_cpu_unquantized_gemm(module, remove_weight=False)
            done.append(name)
    return done


def eos_of(model_path: str, tokenizer: PreTrainedTokenizerBase) -> list[int]:
    """The tokenizer's eos plus the generation config's (as ``eos_token_ids`` does for a loaded model)."""
    from transformers import GenerationConfig

    try:
        gen = GenerationConfig.from_pretrained(model_path, local_files_only=True)
    except OSError:
        gen = None
    ids = eos_token_ids_of(gen, tokenizer)
    if not ids:
        raise ModelLoadError(f"model.path {model_path}: no eos token (generation could never stop)")
    return ids


def reload_and_fingerprint(worker: Any, weights: list[tuple[str, torch.Tensor]]) -> dict[str, int]:
    """Run in each tensor-parallel worker of a vLLM engine (``collective_rpc``): the crc32 of every tensor as it
    arrived there, then vLLM's in-place reload, which loads this worker's shard of each."""
    crc = fingerprint(dict(weights))
    worker.reload_weights(weights_iterator=iter(weights))
    return crc


def check_shard_fingerprints(sent: dict[str, int], received: list[dict[str, int]], where: str) -> None:
    """Every tensor-parallel worker received every tensor of the sync as sent; else ``ValueError`` naming the worker
    and the first tensors that differ or are missing."""
    for rank, got in enumerate(received):
        bad = differing(sent, got)
        if bad:
            raise ValueError(
                f"{where}: tensor-parallel worker {rank} received {len(bad)} tensor(s) other than sent "
                f"(crc32 differs or missing: {', '.join(bad[:3])}{', ...' if len(bad) > 3 else ''})"
            )


def expected_reload_warnings(record: logging.LogRecord) -> bool:
    """Drop vLLM's "Failed to load weights" for the layers a sync never carries: the rotary cache (no weights) and a
    tied lm_head (its weight is the embedding's; ``refresh_tied_cpu_layers`` re-packs it after every reload)."""
    return not (
        record.getMessage().endswith("Failed to load weights")
        and record.args
        and record.args[0] in ("RotaryEmbedding", "ParallelLMHead")
    )
