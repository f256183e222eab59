"""Atomic save / resume of a whole run, and export to a plain Hugging Face model directory.

A checkpoint is ``<run>/checkpoints/step_<N>/`` holding ``model/`` (safetensors + config + tokenizer: already a plain
HF directory), each worker's optimizer / scheduler / RNG state, and ``driver_state.pt`` (step, data cursor, driver
RNG, counters). It is written into ``.tmp-step_<N>`` and renamed into place only when complete, and ``latest`` is
replaced atomically after that, so a run killed at any instant leaves either the previous or the new checkpoint,
never a torn one.
"""

from __future__ import annotations

import json
import logging
import os
import random
import shutil
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypedDict

import numpy as np
import torch

from asyncrl.errors import UserInputError

CKPT_DIR = "checkpoints"
DRIVER_STATE = "driver_state.pt"
MANIFEST = "MANIFEST.json"  # every file's size and crc32, written last: a checkpoint that fails it is not resumed

logger = logging.getLogger(__name__)


class CheckpointError(UserInputError, RuntimeError):
    """A checkpoint that cannot be written, read or exported; names it and why."""


def _crc32(path: Path) -> int:
    crc = 0
    with open(path, "rb") as f:
        while chunk := f.read(1 << 22):
            crc = zlib.crc32(chunk, crc)
    return crc


def write_manifest(ckpt: Path) -> None:
    files = sorted(p for p in ckpt.rglob("*") if p.is_file() and p.name != MANIFEST)
    entries = {str(p.relative_to(ckpt)): {"bytes": p.stat().st_size, "crc32": _crc32(p)} for p in files}
    atomic_write_bytes(ckpt / MANIFEST, json.dumps({"files": entries}, indent=1).encode() + b"\n")


def verify_manifest(ckpt: Path) -> str | None:
    """None when every file the manifest lists is there with its size and checksum, else what is wrong. A
    checkpoint written before manifests existed (none there) passes."""
    path = ckpt / MANIFEST
    if not path.is_file():
        return None
    try:
        entries = json.loads(path.read_text())["files"]
    except (ValueError, KeyError) as e:
        return f"unreadable {MANIFEST} ({e})"
    for name, want in entries.items():
        f = ckpt / name
        if not f.is_file():
            return f"{name} is missing"
        if f.stat().st_size != want["bytes"]:
            return f"{name} has {f.stat().st_size} bytes, the manifest says {want['bytes']}"
        if _crc32(f) != want["crc32"]:
            return f"{name} fails its checksum"
    return None


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` through a temporary file and a rename: a crash never leaves a truncated file."""
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def load_tensors(directory: Path) -> dict[str, torch.Tensor]:
    """Every tensor of the ``*.safetensors`` files in ``directory`` (a saved model); none there is an error."""
    from safetensors.torch import load_file

    files = sorted(directory.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"{directory}: no *.safetensors")
    return {name: t for f in files for name, t in load_file(str(f)).items()}


class CheckpointManager:
    def __init__(self, run_dir: str | Path, max_to_keep: int = 2):
        self.root = Path(run_dir) / CKPT_DIR
        self.max_to_keep = max_to_keep

    def save(self, step: int, write_workers: Callable[[Path], None], driver_state: dict[str, Any]) -> Path:
        """``write_workers(tmp_dir)`` lets every worker write its part; then the driver's state; then rename."""
        self.root.mkdir(parents=True, exist_ok=True)
        final = self.root / f"step_{step}"
        tmp = self.root / f".tmp-step_{step}"
        if tmp.exists():
            shutil.rmtree(tmp)
        tmp.mkdir()
        try:
            write_workers(tmp)
            state = dict(driver_state, step=step, rng=rng_state())
            torch.save(state, tmp / DRIVER_STATE)
            write_manifest(tmp)
            _fsync_dir(tmp)
        except (OSError, RuntimeError) as e:  # a full disk, a file-size limit, a worker's failed write
            shutil.rmtree(tmp, ignore_errors=True)
            before = self.latest()
            kept = f"the previous checkpoint {before} is intact" if before else "no earlier checkpoint exists"
            raise CheckpointError(f"checkpoint step {step} could not be written to {self.root} ({e}); {kept}") from e
        if final.exists():  # a re-run of the same step after a resume: replace it
            shutil.rmtree(final)
        os.rename(tmp, final)
        _fsync_dir(self.root)
        atomic_write_bytes(self.root / "latest", f"{final.name}\n".encode())
        steps = self.list_steps()
        for s in steps[: max(0, len(steps) - self.max_to_keep)]:  # the oldest beyond max_to_keep
            shutil.rmtree(self.root / f"step_{s}", ignore_errors=True)
        return final

    def list_steps(self) -> list[int]:
        if not self.root.is_dir():
            return []
        names = [p.name for p in self.root.iterdir() if (p / DRIVER_STATE).is_file()]
        return sorted(int(n.removeprefix("step_")) for n in names if n.startswith("step_") and n[5:].isdecimal())

    def latest(self) -> Path | None:
        """The newest checkpoint that passes its manifest; a newer one that fails is skipped with a warning."""
        for step in reversed(self.list_steps()):
            ckpt = self.root / f"step_{step}"
            problem = verify_manifest(ckpt)
            if problem is None:
                return ckpt
            logger.warning("checkpoint %s is damaged (%s): skipped, trying the one before", ckpt, problem)
            print(f"[checkpoint] {ckpt} is damaged ({problem}): skipped, resuming from an earlier one")
        return None


def load_driver_state(ckpt_dir: str | Path) -> dict[str, Any]:
    p = Path(ckpt_dir) / DRIVER_STATE
    if not p.is_file():
        raise CheckpointError(f"checkpoint {ckpt_dir}: no {DRIVER_STATE} (not a complete asyncrl checkpoint)")
    try:
        return torch.load(p, weights_only=False)
    except Exception as e:  # a torn or foreign file: pickle, zip and torch raise a dozen different types
        raise CheckpointError(f"checkpoint {ckpt_dir}: {DRIVER_STATE} cannot be read ({type(e).__name__}: {e})") from e


class RngState(TypedDict):
    """A process's random number generators, as ``random``, NumPy and torch give them back."""

    python: tuple[object, ...]
    numpy: dict[str, object] | tuple[str, np.ndarray, int, int, float]
    torch: torch.Tensor


def rng_state() -> RngState:
    """This process's Python, NumPy and torch RNG states (the driver's and every worker's go into a checkpoint)."""
    return {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}


def set_rng_state(s: RngState) -> None:
    random.setstate(s["python"])
    np.random.set_state(s["numpy"])
    torch.set_rng_state(s["torch"])


def export_checkpoint(checkpoint: str | Path, out_dir: str | Path) -> Path:
    """Copy a checkpoint's model as a plain HF directory (loadable by ``AutoModelForCausalLM.from_pretrained``).

    ``checkpoint`` may be a ``step_<N>`` directory, a run's ``checkpoints/`` directory or a run directory (the latest
    checkpoint is taken).
    """
    src = Path(checkpoint)
    if not src.exists():
        raise CheckpointError(f"checkpoint {src}: no such directory")
    if (src / CKPT_DIR).is_dir():
        src = src / CKPT_DIR
    if not (src / "model").is_dir():
        latest = CheckpointManager(src.parent if src.name == CKPT_DIR else src).latest()
        if latest is None:
            raise CheckpointError(f"checkpoint {checkpoint}: no step_<N>/model inside")
        src = latest
    model_dir = src / "model"
    if not (model_dir / "config.json").is_file():
        raise CheckpointError(f"checkpoint {src}: model/config.json missing")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    for f in model_dir.iterdir():
        if f.is_file():
            shutil.copy2(f, out / f.name)
    return out


def fingerprint(state: dict[str, torch.Tensor]) -> dict[str, int]:
    """A crc32 of every tensor's bytes (``asyncrl replay`` names the first step and tensor where it departs)."""
    return {k: zlib.crc32(v.detach().contiguous().view(-1).view(torch.uint8).cpu().numpy()) for k, v in state.items()}


def differing(a: dict[str, int], b: dict[str, int]) -> list[str]:
    """The tensor names of two fingerprints whose crc32 differ, or that one side lacks, in sorted order."""
    return sorted(n for n in a.keys() | b.keys() if a.get(n) != b.get(n))
