"""Load any local Hugging Face causal-LM directory (ours from ``init_model_dir`` or a downloaded checkpoint).

Nothing is fetched from a hub: every call passes ``local_files_only=True``, and a path that is not a usable model
directory fails up front with a :class:`ModelLoadError` that names the path and what is missing, instead of a
transformers error about repository ids.
"""

from __future__ import annotations

import json
import os
import random
from collections.abc import Mapping

import numpy as np
import torch
from transformers import (
    AutoConfig,
    AutoModelForCausalLM,
    AutoTokenizer,
    GenerationConfig,
    PretrainedConfig,
    PreTrainedModel,
    PreTrainedTokenizerBase,
    PreTrainedTokenizerFast,
)
from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING

from asyncrl.models.errors import ModelLoadError
from asyncrl.models.overrides import apply_config_overrides, split_overrides

DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "fp32": torch.float32,
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
    "float16": torch.float16,
    "fp16": torch.float16,
}


def _check_model_dir(path: str) -> PretrainedConfig:
    """Validate ``path`` as a local causal-LM directory and return its config, or raise ModelLoadError."""
    if not os.path.exists(path):
        raise ModelLoadError(f"model.path {path}: does not exist (expected a local Hugging Face model directory)")
    if not os.path.isdir(path):
        raise ModelLoadError(f"model.path {path}: is a file, not a directory (expected a Hugging Face model directory)")
    config_file = os.path.join(path, "config.json")
    if not os.path.isfile(config_file):
        raise ModelLoadError(f"model.path {path}: no config.json (expected a Hugging Face model directory)")
    try:
        with open(config_file, encoding="utf-8") as f:
            raw: dict[str, object] = json.load(f)
    except (OSError, json.JSONDecodeError) as e:
        raise ModelLoadError(f"model.path {path}: config.json is not valid JSON ({e})") from e
    model_type = raw.get("model_type")
    if not model_type:
        raise ModelLoadError(f"model.path {path}: config.json has no model_type (cannot tell which architecture)")
    try:
        config = AutoConfig.from_pretrained(path, local_files_only=True)
    except (ValueError, KeyError) as e:
        raise ModelLoadError(
            f"model.path {path}: config.json model_type {model_type!r} is not an architecture this transformers "
            f"version knows ({type(e).__name__})"
        ) from e
    if type(config) not in MODEL_FOR_CAUSAL_LM_MAPPING:
        raise ModelLoadError(
            f"model.path {path}: model_type {model_type!r} is not a causal language model "
            "(AutoModelForCausalLM cannot load it)"
        )
    return config


WEIGHT_FILES = (
    "model.safetensors",
    "model.safetensors.index.json",
    "pytorch_model.bin",
    "pytorch_model.bin.index.json",
)


def check_model_dir(path: str) -> None:
    """What the driver checks of ``model.path`` before any worker starts (the workers load the weights): a causal-LM
    directory with a weights file, so a bad path is one error here rather than a worker dying in its constructor."""
    _check_model_dir(path)
    if not any(os.path.isfile(os.path.join(path, f)) for f in WEIGHT_FILES):
        raise ModelLoadError(
            f"model.path {path}: could not load the model weights (no {' or '.join(WEIGHT_FILES[::2])} in it)"
        )


GENERIC_TOKENIZER_CLASSES = ("TokenizersBackend", "PreTrainedTokenizerFast")


def load_tokenizer_from(path: str) -> PreTrainedTokenizerBase:
    """The tokenizer saved in ``path``; it must define an eos token. A missing pad token falls back to eos.

    A tokenizer saved as a plain ``tokenizers`` backend (our char/BPE tokenizers) is loaded as exactly that:
    ``AutoTokenizer`` would otherwise pick the model type's class (``Qwen2Tokenizer`` for a Qwen2 config), whose own
    pre-tokenizer silently drops spaces, newlines and unknown characters from a character-level vocabulary.
    """
    cls: type[AutoTokenizer] | type[PreTrainedTokenizerFast] = AutoTokenizer
    config_file = os.path.join(path, "tokenizer_config.json")
    if os.path.isfile(config_file):
        with open(config_file) as f:
            if json.load(f).get("tokenizer_class") in GENERIC_TOKENIZER_CLASSES:
                cls = PreTrainedTokenizerFast
    try:
        tokenizer = cls.from_pretrained(path, local_files_only=True)
    except Exception as e:  # transformers raises OSError / ValueError / TypeError depending on what is missing
        raise ModelLoadError(f"model.path {path}: could not load a tokenizer ({type(e).__name__}: {e})") from e
    if tokenizer.eos_token_id is None:
        raise ModelLoadError(f"model.path {path}: the tokenizer has no eos token (generation could never stop)")
    if tokenizer.pad_token_id is None:
        # Padding is always masked out, so any id works; eos is the usual choice and is always in the vocabulary.
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def load_model(
    path: str | os.PathLike[str],
    dtype: str | torch.dtype = "float32",
    for_training: bool = True,
    overrides: Mapping[str, object] | None = None,
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """``(model, tokenizer)`` from a local directory, built with ``overrides`` (``model.override_config``). With
    ``for_training=False`` the model is in eval mode with ``requires_grad`` off (rollout and reference models never
    need gradients, which saves memory)."""
    path = os.fspath(path)
    if isinstance(dtype, str) and dtype not in DTYPES:
        raise ModelLoadError(f"model.dtype {dtype!r} for {path}: unknown dtype (known: {', '.join(DTYPES)})")
    torch_dtype = DTYPES[dtype] if isinstance(dtype, str) else dtype
    config = _check_model_dir(path)
    attn, rest = split_overrides(overrides)
    apply_config_overrides(config, rest, path)
    extra = {"attn_implementation": attn} if attn else {}
    tokenizer = load_tokenizer_from(path)
    try:
        model = AutoModelForCausalLM.from_pretrained(
            path, config=config, dtype=torch_dtype, local_files_only=True, **extra
        )
    except Exception as e:  # missing/corrupt weights surface as OSError, RuntimeError or ValueError
        raise ModelLoadError(f"model.path {path}: could not load the model weights ({type(e).__name__}: {e})") from e
    model.train(for_training)
    if not for_training:
        model.requires_grad_(False)
    return model, tokenizer


def eos_token_ids(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase) -> list[int]:
    """Every token id that ends a response: the tokenizer's eos plus the generation config's eos (sorted, unique).

    Chat models often list more than one (e.g. ``<|im_end|>`` and ``<|endoftext|>``); stopping on only the tokenizer's
    would let responses run on to the length limit.
    """
    return eos_token_ids_of(getattr(model, "generation_config", None), tokenizer)


def eos_token_ids_of(gen_config: GenerationConfig | None, tokenizer: PreTrainedTokenizerBase) -> list[int]:
    """``eos_token_ids`` from a generation config (or None) instead of a loaded model: an engine that never loads the
    transformers model (vLLM) reads the directory's ``generation_config.json``."""
    gen_eos = getattr(gen_config, "eos_token_id", None)  # None, one id or a list of them
    ids = [tokenizer.eos_token_id, *([gen_eos] if gen_eos is None or isinstance(gen_eos, int) else gen_eos)]
    return sorted({int(i) for i in ids if i is not None})


def set_seed_all(seed: int) -> None:
    """Seed Python's ``random``, NumPy and torch (CPU and, if present, CUDA) global RNGs."""
    random.seed(seed)
    np.random.seed(seed % (2**32))
    torch.manual_seed(seed)


def decoder_layers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """A causal LM's decoder layers: the entries of its longest ``ModuleList`` (FSDP2 shards each as a unit of its
    own, ``asyncrl.trainer.fsdp``; the memory plan counts one as the unit gathered at a time, ``asyncrl.sizing``)."""
    lists = [m for m in model.modules() if isinstance(m, torch.nn.ModuleList)]
    return list(max(lists, key=len)) if lists else []
