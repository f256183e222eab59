"""Crash-safe JSON-lines metrics file: one ``{"step", "time", ...}`` object per line.

A run can be killed at any moment (OOM, pre-emption, Ctrl-C), so every line is flushed and ``os.fsync``'d before
``write`` returns: whatever step the trainer saw as logged is on disk. The only damage a kill can do is a *torn last
line* (a prefix of the final write). Readers ignore such a line, and :class:`JsonlWriter` cuts it off when it reopens
the file for append, so the file stays valid JSON lines across crash/resume cycles.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import BinaryIO

_BLOCK = 64 * 1024  # bytes read per step when scanning backwards for the last line


def _parse_line(raw: bytes) -> dict[str, float | None] | None:
    """The JSON object on one line, or None when the bytes are not a JSON object (torn, zero-filled, garbage)."""
    try:
        value = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError):
        return None
    return value if isinstance(value, dict) else None


def _last_line_offset(f: BinaryIO, size: int) -> int:
    """Byte offset at which the file's last line starts; its own terminating newline does not count as a break."""
    f.seek(size - 1)
    end = size - 1 if f.read(1) == b"\n" else size
    pos = end
    while pos > 0:
        start = max(0, pos - _BLOCK)
        f.seek(start)
        block = f.read(pos - start)
        i = block.rfind(b"\n")
        if i >= 0:
            return start + i + 1
        pos = start
    return 0


def repair_jsonl_tail(path: str | os.PathLike[str]) -> bool:
    """Make ``path`` valid JSON lines again after a crash; returns True when the file was changed.

    A last line that is not a JSON object is truncated away; a last line that is valid but lost its newline (the kill
    hit between the object and ``\\n``) gets the newline back. Missing or empty files are left alone.
    """
    p = Path(path)
    if not p.exists() or p.stat().st_size == 0:
        return False
    with open(p, "r+b") as f:
        size = f.seek(0, os.SEEK_END)
        offset = _last_line_offset(f, size)
        f.seek(offset)
        tail = f.read()
        if tail.strip() == b"":
            return False
        if _parse_line(tail) is None:
            f.truncate(offset)
        elif not tail.endswith(b"\n"):
            f.write(b"\n")
        else:
            return False
        f.flush()
        os.fsync(f.fileno())
    return True


class JsonlWriter:
    """Appends one JSON object per line to ``path``, durable line by line (flush + fsync).

    Opening repairs a torn tail left by a previous crash (see :func:`repair_jsonl_tail`). Not thread-safe on its own:
    :class:`asyncrl.telemetry.metrics.MetricsLogger` serialises calls.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        repair_jsonl_tail(self.path)
        self._file = open(self.path, "a", encoding="utf-8")  # closed in close()

    def write(self, record: Mapping[str, float | None]) -> None:
        """Append ``record`` as one line; NaN/inf must already be replaced (JSON has none), so they raise here."""
        if self._file.closed:
            raise RuntimeError(f"JsonlWriter({self.path}): write after close")
        line = json.dumps(record, allow_nan=False, separators=(", ", ": "))
        self._file.write(line + "\n")
        self._file.flush()
        os.fsync(self._file.fileno())

    def close(self) -> None:
        if not self._file.closed:
            self._file.close()


def read_metrics(path: str | os.PathLike[str]) -> list[dict[str, float | None]]:
    """All records of a metrics JSON-lines file, in file order.

    Blank lines are skipped and a final line that is not a JSON object (torn by a crash) is ignored. A bad line
    *before* the last one is real corruption, not a crash artefact, and raises ValueError naming the file and line.
    Non-finite values were written as ``null`` and come back as None.
    """
    p = Path(path)
    if not p.exists():
        raise FileNotFoundError(f"read_metrics: no metrics file at {p}")
    lines = p.read_bytes().split(b"\n")
    numbered = [(i + 1, raw) for i, raw in enumerate(lines) if raw.strip()]
    records: list[dict[str, float | None]] = []
    for k, (lineno, raw) in enumerate(numbered):
        record = _parse_line(raw)
        if record is None:
            if k == len(numbered) - 1:
                break  # torn last line from a crash
            raise ValueError(f"read_metrics: {p} line {lineno} is not a JSON object: {raw[:80]!r}")
        records.append(record)
    return records


def last_logged_step(path: str | os.PathLike[str]) -> int | None:
    """Step of the last complete record in ``path``, or None when the file is missing or holds no record.

    Used on resume to tell which steps already reached the log (a torn last line does not count).
    """
    p = Path(path)
    if not p.exists():
        return None
    for record in reversed(read_metrics(p)):
        step = record.get("step")
        if isinstance(step, int) and not isinstance(step, bool):
            return step
    return None
