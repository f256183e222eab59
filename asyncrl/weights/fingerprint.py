"""What a worker holds of the weights a sync covers, as a crc32 per tensor: how ``asyncrl preflight`` checks that a
sync left every engine with the trainer's weights, beyond the per-bucket checksums of the transport.

The receiver's tensors are fingerprinted as it keeps them; the trainer's are cast first to each tensor's dtype on the
receiver (an fp32 trainer feeding a bf16 engine), the cast the engine's copy into its parameters makes.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import torch

from asyncrl.checkpoint import differing, fingerprint


@dataclass(frozen=True)
class WeightsFingerprint:
    """One worker's synced tensors: name -> crc32 of its bytes, and name -> its dtype (torch's name, e.g.
    ``torch.bfloat16``). ``held`` is False where the tensors are not in the worker's process (vLLM keeps them in its
    own: meta tensors here), and then ``crc`` is empty."""

    crc: dict[str, int]
    dtypes: dict[str, str]
    held: bool = True

    def differing(self, other: WeightsFingerprint) -> list[str]:
        """The tensor names whose bytes differ, or that one side lacks, in sorted order."""
        return differing(self.crc, other.crc)


def fingerprint_of(
    tensors: Iterable[tuple[str, torch.Tensor]], dtypes: dict[str, str] | None = None
) -> WeightsFingerprint:
    """The fingerprint of ``tensors`` (each cast to ``dtypes[name]`` first where given), read one tensor at a time so
    a gathered (FSDP2) model is never held whole."""
    crc: dict[str, int] = {}
    kinds: dict[str, str] = {}
    for name, t in tensors:
        if t.is_meta:
            return WeightsFingerprint({}, {}, held=False)
        want = dtypes.get(name) if dtypes else None
        if want is not None and str(t.dtype) != want:
            t = t.to(getattr(torch, want.removeprefix("torch.")))
        crc.update(fingerprint({name: t}))
        kinds[name] = str(t.dtype)
    return WeightsFingerprint(crc, kinds)
