"""FP8 rollout (``rollout.quantization: fp8``; docs/fp8.md): at every sync the trainer quantizes each linear weight
of the transformer blocks to float8 e4m3 with one fp32 scale per 128 x 128 block; the values travel under the
weight's name, the scales under ``name + "_scale_inv"`` (vLLM's name), and the receiving engine runs on values times
scales. Activations stay unquantized (a GPU's W8A8 kernels, which would quantize them, are not run here).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import torch
import torch.nn.functional as F

from asyncrl.models.errors import WeightUpdateError

BLOCK = 128
FP8 = torch.float8_e4m3fn
FP8_MAX = float(torch.finfo(FP8).max)  # 448
SCALE_SUFFIX = "_scale_inv"


def quantizable(name: str, shape: Iterable[int]) -> bool:
    """A linear weight of a transformer block (``model.layers.N....weight``, 2-D)."""
    return len(tuple(shape)) == 2 and name.endswith(".weight") and ".layers." in name


def quantize_blockwise(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(fp8 values with ``weight``'s shape, fp32 scales [ceil(rows/128), ceil(cols/128)]): value x scale ~ weight,
    each block scaled so that its largest magnitude maps to fp8's largest (448)."""
    rows, cols = weight.shape
    rb, cb = -(-rows // BLOCK), -(-cols // BLOCK)
    padded = F.pad(weight.detach().float(), (0, cb * BLOCK - cols, 0, rb * BLOCK - rows))
    blocks = padded.view(rb, BLOCK, cb, BLOCK)
    scale = blocks.abs().amax(dim=(1, 3)).clamp(min=1e-12) / FP8_MAX
    values = (blocks / scale[:, None, :, None]).clamp(-FP8_MAX, FP8_MAX).to(FP8)
    return values.view(rb * BLOCK, cb * BLOCK)[:rows, :cols].contiguous(), scale


def dequantize_blockwise(values: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """fp32 ``values x scale`` (each scale spread over its 128 x 128 block)."""
    rows, cols = values.shape
    spread = scale.repeat_interleave(BLOCK, 0)[:rows].repeat_interleave(BLOCK, 1)[:, :cols]
    return values.float() * spread


def quantize_for_sync(tensors: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """What a sync carries in FP8 mode: quantizable weights as (fp8 values, scales), the rest unchanged."""
    out: dict[str, torch.Tensor] = {}
    for name, tensor in tensors.items():
        if quantizable(name, tensor.shape):
            out[name], out[name + SCALE_SUFFIX] = quantize_blockwise(tensor)
        else:
            out[name] = tensor
    return out


def sync_layout(tensors: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The names, shapes and dtypes (meta tensors) an FP8 sync of ``tensors`` carries: what a receiver checks the
    trainer's plan against (``quantize_for_sync`` on meta tensors computes no values)."""
    return quantize_for_sync({name: t.to("meta") for name, t in tensors.items()})


def dequantize_sync(items: list[tuple[str, torch.Tensor]], where: str) -> list[tuple[str, torch.Tensor]]:
    """An FP8 sync back to full-precision (name, tensor) pairs. Raises WeightUpdateError naming a quantized weight
    that came without its scales (or scales without their weight)."""
    tensors = dict(items)
    scales = {name[: -len(SCALE_SUFFIX)]: t for name, t in tensors.items() if name.endswith(SCALE_SUFFIX)}
    out = []
    for name, tensor in tensors.items():
        if name.endswith(SCALE_SUFFIX):
            if name[: -len(SCALE_SUFFIX)] not in tensors:
                raise WeightUpdateError(f"{where}: fp8 scales {name!r} came without their weight")
            continue
        if tensor.dtype == FP8:
            if name not in scales:
                raise WeightUpdateError(f"{where}: fp8 weight {name!r} came without its scales {name + SCALE_SUFFIX!r}")
            tensor = dequantize_blockwise(tensor, scales[name])
        out.append((name, tensor))
    return out
