"""Model and tokenizer construction and loading: tiny Qwen2 presets, char/BPE tokenizers, local HF directories."""

from asyncrl.models.loading import ModelLoadError, eos_token_ids, load_model, set_seed_all
from asyncrl.models.presets import PRESETS, build_model, count_parameters, init_model_dir
from asyncrl.models.tokenizer import build_bpe_tokenizer, build_char_tokenizer, load_tokenizer, save_tokenizer

__all__ = [
    "PRESETS",
    "ModelLoadError",
    "build_bpe_tokenizer",
    "build_char_tokenizer",
    "build_model",
    "count_parameters",
    "eos_token_ids",
    "init_model_dir",
    "load_model",
    "load_tokenizer",
    "save_tokenizer",
    "set_seed_all",
]
