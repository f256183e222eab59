"""A model's sizes from its ``config.json`` alone: the model is built on the meta device (no weights, no memory), so
a directory holding only a config is enough, and every architecture transformers knows is counted as it builds it."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from asyncrl.models.errors import ModelLoadError
from asyncrl.models.loading import decoder_layers


@dataclass(frozen=True)
class ModelShape:
    """Parameter counts (tied weights once) and the sizes the activation and KV terms read."""

    params: int  # every parameter
    layer_params: int  # the largest decoder layer: FSDP2's unit, gathered whole for its forward and backward
    root_params: int  # the parameters outside the decoder layers (embeddings, final norm, head): the root unit
    layers: int
    hidden: int
    intermediate: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    tied: bool
    largest: int = 0  # the largest single parameter (the embedding, in causal LMs): a sync bucket holds it whole

    @property
    def kv_dim(self) -> int:
        """Width of one of K or V per token per layer."""
        return self.kv_heads * self.head_dim

    def kv_bytes_per_token(self, dtype_bytes: int) -> int:
        """A KV cache's bytes per token: K and V of every layer."""
        return 2 * self.layers * self.kv_dim * dtype_bytes


def shape_of_config(config) -> ModelShape:
    """The shape of a transformers ``PretrainedConfig``, counted on a meta-device model."""
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    params = sum(p.numel() for p in model.parameters())
    layers = decoder_layers(model)
    per_layer = [sum(p.numel() for p in layer.parameters()) for layer in layers]
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    heads = text.num_attention_heads
    head_dim = getattr(text, "head_dim", None) or text.hidden_size // heads
    return ModelShape(
        params=params,
        layer_params=max(per_layer, default=0),
        root_params=params - sum(per_layer),
        layers=len(layers),
        hidden=text.hidden_size,
        intermediate=text.intermediate_size,
        heads=heads,
        kv_heads=getattr(text, "num_key_value_heads", None) or heads,
        head_dim=head_dim,
        vocab=text.vocab_size,
        tied=bool(getattr(text, "tie_word_embeddings", False)),
        largest=max((p.numel() for p in model.parameters()), default=0),
    )


def model_shape(model_dir: str | Path) -> ModelShape:
    """The shape of the model in ``model_dir`` (only its ``config.json`` is read)."""
    from transformers import AutoConfig

    path = Path(model_dir)
    if not (path / "config.json").is_file():
        raise ModelLoadError(f"model directory {path}: no config.json (the memory plan reads only that file)")
    try:
        config = AutoConfig.from_pretrained(str(path), local_files_only=True)
    except (ValueError, OSError) as e:  # an unknown model_type, a config that is not JSON
        raise ModelLoadError(f"model directory {path}: config.json does not load ({str(e).splitlines()[0]})") from None
    return shape_of_config(config)
