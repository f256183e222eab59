"""Checkpoint integrity: a manifest of sizes and checksums is written last; a damaged newest checkpoint is skipped
for the one before, with a warning naming it; a full disk while saving leaves the previous checkpoint intact and
stops with an error saying so (simulated with a file-size limit in a child process)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from asyncrl.checkpoint import MANIFEST, CheckpointManager, verify_manifest


def _writer(payload: bytes):
    def write(d: Path) -> None:
        (d / "model").mkdir()
        (d / "model" / "weights.bin").write_bytes(payload)

    return write


def test_a_damaged_newest_checkpoint_is_skipped_for_the_one_before(tmp_path, capsys):
    mgr = CheckpointManager(tmp_path, max_to_keep=3)
    first = mgr.save(1, _writer(b"a" * 1000), {"samples": 1})
    second = mgr.save(2, _writer(b"b" * 1000), {"samples": 2})
    listed = json.loads((second / MANIFEST).read_text())["files"]
    assert set(listed) == {"model/weights.bin", "driver_state.pt"} and verify_manifest(second) is None
    assert mgr.latest() == second
    data = bytearray((second / "model" / "weights.bin").read_bytes())
    data[10] ^= 1  # one flipped bit
    (second / "model" / "weights.bin").write_bytes(bytes(data))
    assert verify_manifest(second) == "model/weights.bin fails its checksum"
    assert mgr.latest() == first
    assert f"{second} is damaged (model/weights.bin fails its checksum)" in capsys.readouterr().out
    (first / "model" / "weights.bin").write_bytes(b"short")  # a torn file: the size already tells
    assert "has 5 bytes, the manifest says 1000" in verify_manifest(first)
    assert mgr.latest() is None


CHILD = r"""
import resource, signal, sys
from pathlib import Path
from asyncrl.checkpoint import CheckpointError, CheckpointManager
root = Path(sys.argv[1])
mgr = CheckpointManager(root, max_to_keep=3)
def writer(n):
    def write(d):
        (d / "model").mkdir()
        (d / "model" / "weights.bin").write_bytes(b"x" * n)
    return write
mgr.save(1, writer(10_000), {"samples": 1})
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # past the limit a write fails with EFBIG instead of killing us
resource.setrlimit(resource.RLIMIT_FSIZE, (200_000, 200_000))
try:
    mgr.save(2, writer(1_000_000), {"samples": 2})
except CheckpointError as e:
    print("ERROR:", e)
print("LATEST:", mgr.latest())
"""


def test_a_full_disk_keeps_the_previous_checkpoint_and_says_so(tmp_path):
    out = subprocess.run(
        [sys.executable, "-c", CHILD, str(tmp_path)], capture_output=True, text=True, timeout=120, cwd=Path.cwd()
    )
    assert out.returncode == 0, out.stderr[-2000:]
    lines = out.stdout.splitlines()
    error = next(line for line in lines if line.startswith("ERROR:"))
    assert "checkpoint step 2 could not be written" in error and "File too large" in error
    assert f"the previous checkpoint {tmp_path / 'checkpoints' / 'step_1'} is intact" in error
    assert lines[-1] == f"LATEST: {tmp_path / 'checkpoints' / 'step_1'}"
    assert not any(p.name.startswith(".tmp") for p in (tmp_path / "checkpoints").iterdir())
    assert verify_manifest(tmp_path / "checkpoints" / "step_1") is None


def test_checkpoints_without_a_manifest_still_resume(tmp_path):
    mgr = CheckpointManager(tmp_path)
    ckpt = mgr.save(1, _writer(b"z"), {})
    (ckpt / MANIFEST).unlink()  # written before manifests existed
    assert verify_manifest(ckpt) is None and mgr.latest() == ckpt
