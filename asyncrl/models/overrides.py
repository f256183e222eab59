"""``model.override_config`` (verl's key): model-config changes applied wherever the policy is built.

The trainer's model, its reference and proximal copies, the built-in rollout engine's copy and vLLM all get the same
overrides, so trainer and rollout compute the same function (docs/model_overrides.md).

- ``attn_implementation``: the Hugging Face attention kernel (``eager``, ``sdpa``, or another the installed
  transformers offers); vLLM always uses its own attention, whose log-probs are compared with the trainer's every step.
- ``rope_scaling``: ``{rope_type (or type): linear | dynamic | yarn | ..., factor: ..., ...}``, merged into the
  config's ``rope_parameters`` (transformers 5's name; ``rope_theta`` kept); vLLM gets it through ``hf_overrides``.
- any other key: a config attribute the model's config already has (``max_position_embeddings``, ``sliding_window``,
  ...). An unknown one is an error naming it, never a silently ignored setting.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from asyncrl.models.errors import ModelLoadError

if TYPE_CHECKING:
    from transformers import PretrainedConfig


def attention_choices() -> tuple[str, ...]:
    """The attention implementations the installed transformers registers (plus ``eager``)."""
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    names = {"eager", *(k for k in ALL_ATTENTION_FUNCTIONS.keys() if "|" not in k)}
    return tuple(sorted(names))


def split_overrides(overrides: Mapping[str, object] | None) -> tuple[str | None, dict[str, object]]:
    """(``attn_implementation`` or None, every other override) of ``model.override_config``."""
    rest = dict(overrides or {})
    attn = rest.pop("attn_implementation", None)
    if attn is not None and (not isinstance(attn, str) or attn not in attention_choices()):
        raise ModelLoadError(
            f"model.override_config.attn_implementation {attn!r}: not offered by the installed transformers "
            f"(choices: {', '.join(attention_choices())})"
        )
    return attn, rest


def apply_config_overrides(config: PretrainedConfig, overrides: Mapping[str, object], path: str) -> dict[str, object]:
    """Set every override (``attn_implementation`` excluded) on ``config`` in place; returns them as set (the
    ``hf_overrides`` vLLM takes). Raises ModelLoadError naming a key the config does not have."""
    where = "model.override_config"
    applied: dict[str, object] = {}
    for key, value in overrides.items():
        if key == "rope_scaling":
            if not isinstance(value, Mapping):
                raise ModelLoadError(f"{where}.rope_scaling {value!r}: must be a mapping (rope_type, factor, ...)")
            scaling = dict(value)  # merged into the config's RoPE parameters, ``type`` accepted for ``rope_type``
            if "type" in scaling:
                scaling["rope_type"] = scaling.pop("type")
            if "rope_type" not in scaling:
                raise ModelLoadError(
                    f"{where}.rope_scaling {dict(value)}: needs rope_type (linear, dynamic, yarn, ...)"
                )
            applied["rope_parameters"] = {**dict(getattr(config, "rope_parameters", None) or {}), **scaling}
        elif not hasattr(config, key):
            raise ModelLoadError(
                f"{where}.{key}: the {getattr(config, 'model_type', '?')} config of {path} has no attribute {key!r}"
            )
        else:
            applied[key] = value
    for key, value in applied.items():
        setattr(config, key, value)
    if "rope_parameters" in applied and hasattr(config, "standardize_rope_params"):
        config.standardize_rope_params()
    return applied


def hf_overrides_for(path: str, overrides: Mapping[str, object] | None) -> dict[str, object]:
    """The config overrides (``attn_implementation`` excluded) as vLLM's ``hf_overrides`` for the model in ``path``."""
    from transformers import AutoConfig

    _, rest = split_overrides(overrides)
    if not rest:
        return {}
    return apply_config_overrides(AutoConfig.from_pretrained(path, local_files_only=True), rest, path)
