"""What the vLLM engine knows of a model directory without loading it in transformers: the parameters a sync must
carry (meta tensors), its eos ids, and the CPU re-pack of tied vocabulary layers after a reload."""

from __future__ import annotations

import torch
from transformers import PreTrainedTokenizerBase

from asyncrl.models.loading import ModelLoadError, eos_token_ids_of


def expected_params(model_path: str) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """What a sync must carry: the HF model's parameters as shapes on the meta device (tied aliases included), and
    alias -> canonical name (``lm_head.weight`` -> ``model.embed_tokens.weight`` when tied)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(model_path, local_files_only=True)
    with torch.device("meta"):
        meta = AutoModelForCausalLM.from_config(config)
    params = dict(meta.named_parameters(remove_duplicate=False))
    first: dict[int, str] = {}
    canonical: dict[str, str] = {}
    for name, p in params.items():
        canonical[name] = first.setdefault(id(p), name)
    return params, canonical


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
