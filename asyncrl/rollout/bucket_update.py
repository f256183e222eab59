"""A weight update applied bucket by bucket, as a weight sync delivers it: what both engines share.

An engine checks each bucket's names and shapes (``validate_update``'s rules) before copying any of its tensors, and
lets the bucket go before asking for the next, so a sync never holds a second full copy of the weights; only after the
last bucket covered everything (``strict``) is the version set (docs/performance.md, "Weight sync"; FP8 pairs:
docs/fp8.md). An update that fails after applying some tensors has no rollback (it would need that copy): the gate is
torn (``EngineGate.partial``) and generate, resume and submit raise PartialWeightsError until the next complete update,
the version staying the last complete one. One that fails before applying anything leaves the engine as it was.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from types import TracebackType

import torch

from asyncrl.models.fp8 import FP8, SCALE_SUFFIX, dequantize_blockwise, dequantize_sync
from asyncrl.models.lora import require_adapter
from asyncrl.rollout.gate import EngineGate, check_covered, validate_update

Items = list[tuple[str, torch.Tensor]]
Named = Iterable[tuple[str, torch.Tensor]] | Mapping[str, torch.Tensor]  # what update_weights takes


def checked_whole(
    named_tensors: Named,
    known: Mapping[str, torch.Tensor],
    required: Mapping[str, torch.Tensor],
    strict: bool,
    where: str,
    fp8: bool,
    lora: bool,
) -> Items:
    """A whole update (``update_weights``) as (name, tensor) pairs, every one checked before any is applied: fp8
    pairs dequantized, a LoRA update's adapter present, names and shapes known, (``strict``) ``required`` covered."""
    items = list(named_tensors.items()) if isinstance(named_tensors, Mapping) else list(named_tensors)
    if fp8:  # values x block scales: the engine runs on the quantized weights
        items = dequantize_sync(items, where)
    if lora:
        require_adapter([name for name, _ in items], where)
    validate_update(items, known, required, strict)
    return items


def checked_buckets(
    buckets: Iterable[Iterable[tuple[str, torch.Tensor]]],
    known: Mapping[str, torch.Tensor],
    required: Mapping[str, torch.Tensor],
    strict: bool,
    where: str,
    fp8: bool = False,
) -> Iterator[Items]:
    """Each bucket's (name, tensor) pairs once they are checked against ``known`` (names, shapes); fp8 pairs
    dequantized. After the last bucket: WeightUpdateError for an fp8 half without its other half, and (``strict``)
    for a tensor of ``required`` that no name covered. Holds no reference to a bucket once the next is asked for."""
    covered: set[int] = set()
    waiting: dict[str, torch.Tensor] = {}  # fp8 values or scales whose other half has not arrived yet
    for bucket in buckets:
        items = _paired(list(bucket), waiting) if fp8 else list(bucket)
        del bucket
        validate_update(items, known, required, strict=False)
        covered.update(id(known[name]) for name, _ in items)
        yield items
        del items
    if waiting:
        dequantize_sync(list(waiting.items()), where)  # raises, naming the half that came alone
    if strict:
        check_covered(covered, required)


def _paired(items: Items, waiting: dict[str, torch.Tensor]) -> Items:
    """``items`` with every fp8 weight whose scales are here (or waiting) dequantized; unpaired halves wait."""
    out: Items = []
    for name, tensor in items:
        if name.endswith(SCALE_SUFFIX):
            weight = name[: -len(SCALE_SUFFIX)]
            if weight in waiting:
                out.append((weight, dequantize_blockwise(waiting.pop(weight), tensor)))
            else:
                waiting[name] = tensor
        elif tensor.dtype == FP8:
            scales = waiting.pop(name + SCALE_SUFFIX, None)
            if scales is not None:
                out.append((name, dequantize_blockwise(tensor, scales)))
            else:
                waiting[name] = tensor
        else:
            out.append((name, tensor))
    return out


def copy_into(params: Mapping[str, torch.Tensor], items: Items) -> int:
    """Copy every (name, tensor) into ``params[name]`` in place (casting to its dtype); returns how many. A function
    of its own so its loop variables (the bucket's last tensor) go with its frame, before the next bucket arrives."""
    with torch.no_grad():
        for name, tensor in items:
            params[name].copy_(tensor)
    return len(items)


class Applying:
    """Around an update's copies (inside ``gate.updating``): count the tensors applied; when the update fails after
    any was applied, tear the gate (the module docstring); when it completes, mend it."""

    def __init__(self, gate: EngineGate, where: str) -> None:
        self.gate, self.where, self.applied = gate, where, 0

    def __enter__(self) -> Applying:
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None, tb: TracebackType | None) -> None:
        if error is None:
            self.gate.partial = None  # the weights are one version again
        elif self.applied:
            text = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
            self.gate.partial = f"{self.where} failed after applying {self.applied} tensors: {text}"


class Pulled:
    """The (name, tensor) pairs of checked buckets one at a time, renamed, for a loader that pulls them itself
    (vLLM's ``reload_weights``), each counted as applied. A failure of the buckets (a check, a sync cut short) ends
    the iteration cleanly, so the loader finishes what it has; :meth:`raise_if_failed` raises it afterwards.
    A loader that still holds a tensor when it asks for the next one (a loop variable, vLLM's buffering of a layer's
    pieces) keeps that bucket's buffer: the receiver then allocates a fresh one rather than overwrite it, so such a
    loader may cost a third bucket (not measured: the two-bucket figure is the built-in engine's)."""

    def __init__(self, buckets: Iterator[Items], rename: Mapping[str, str], applying: Applying | None) -> None:
        self.buckets, self.rename, self.applying = buckets, rename, applying
        self.error: Exception | None = None

    def __iter__(self) -> Iterator[tuple[str, torch.Tensor]]:
        try:
            for items in self.buckets:
                yield from self._each(items)
                del items  # the bucket goes before the next is received
        except Exception as e:  # noqa: BLE001 - kept and raised by raise_if_failed, after the loader returned
            self.error = e

    def _each(self, items: Items) -> Iterator[tuple[str, torch.Tensor]]:
        """A generator of its own so its loop variables (the bucket's last tensor) end with it, before the next
        bucket is asked for."""
        for name, tensor in items:
            if self.applying is not None:
                self.applying.applied += 1
            yield self.rename[name], tensor

    def raise_if_failed(self) -> None:
        if self.error is not None:
            raise self.error
