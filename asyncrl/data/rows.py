"""Reading, validating and writing verl-schema rows (``.parquet``, ``.jsonl``, ``.json``).

A row is one prompt of a dataset in verl's layout::

    {"data_source": "chain_sum",
     "prompt": [{"role": "user", "content": "..."}],        # or a plain string: one user message
     "ability": "math",                                      # optional, kept as is
     "reward_model": {"style": "rule", "ground_truth": "42"},
     "extra_info": {"split": "train", "index": 0, ...}}      # optional dict

Every row is validated when it is read, so a bad row fails at start-up naming its file and row (0-based, as pandas
and pyarrow count; a JSON syntax error names the 1-based line instead, as an editor does).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from asyncrl.errors import UserInputError

ALLOWED_SUFFIXES = (".parquet", ".jsonl", ".json")


class DatasetError(UserInputError, ValueError):
    """A data file or row is unusable; the message starts with the file (and row) it concerns."""


class Rows(list):
    """A list of validated rows that remembers where each came from.

    ``origins[i]`` is ``(path, row_in_file)`` for ``self[i]``, so later stages (tokenisation) can still name the file
    and row when they reject one, even after several files were concatenated.
    """

    def __init__(self, rows: Sequence[dict[str, Any]] = (), origins: Sequence[tuple[str, int]] | None = None):
        super().__init__(rows)
        self.origins: list[tuple[str, int]] = (
            list(origins) if origins is not None else [("<rows>", i) for i in range(len(rows))]
        )
        if len(self.origins) != len(self):
            raise ValueError(f"Rows: {len(self)} rows but {len(self.origins)} origins")

    def where(self, i: int) -> str:
        """Human-readable location of row ``i``: ``"<path> row <n>"``."""
        path, row = self.origins[i]
        return f"{path} row {row}"


def _type_name(value: Any) -> str:
    return type(value).__name__


def _validate_messages(prompt: Any, where: str) -> list[dict[str, Any]]:
    """Return the prompt as a list of chat messages; a plain string becomes one user message (verl accepts both)."""
    if isinstance(prompt, str):
        if not prompt:
            raise DatasetError(f"{where}: 'prompt' is an empty string")
        return [{"role": "user", "content": prompt}]
    if not isinstance(prompt, list | tuple):
        raise DatasetError(f"{where}: 'prompt' must be a list of chat messages or a string (got {_type_name(prompt)})")
    if not prompt:
        raise DatasetError(f"{where}: 'prompt' is an empty list; expected [{{'role': 'user', 'content': ...}}, ...]")
    messages = []
    for j, message in enumerate(prompt):
        if not isinstance(message, dict):
            raise DatasetError(
                f"{where}: 'prompt[{j}]' must be a dict with 'role' and 'content' (got {_type_name(message)})"
            )
        for key in ("role", "content"):
            if key not in message or message[key] is None:
                raise DatasetError(f"{where}: 'prompt[{j}]' has no '{key}'")
        role, content = message["role"], message["content"]
        if not isinstance(role, str) or not role:
            raise DatasetError(f"{where}: 'prompt[{j}].role' must be a non-empty string (got {role!r})")
        if not isinstance(content, str):
            raise DatasetError(f"{where}: 'prompt[{j}].content' must be a string (got {_type_name(content)})")
        # Parquet gives every message every key seen in the column (absent ones as None); chat templates test keys
        # with `in`, so drop those placeholders rather than pass e.g. "name": None to the template.
        messages.append({k: v for k, v in message.items() if v is not None})
    return messages


def validate_row(row: Any, where: str) -> dict[str, Any]:
    """Check one row and return a normalised copy (prompt as a message list, ground truth as ``str``).

    ``where`` prefixes every error, e.g. ``"data/train.parquet row 17"``. Keys this function does not know are kept.
    """
    if not isinstance(row, dict):
        raise DatasetError(f"{where}: expected a JSON object / record (got {_type_name(row)})")
    out = dict(row)

    if row.get("prompt") is None:
        raise DatasetError(f"{where}: missing 'prompt'")
    out["prompt"] = _validate_messages(row["prompt"], where)

    source = row.get("data_source")
    if source is None:
        raise DatasetError(f"{where}: missing 'data_source'")
    if not isinstance(source, str) or not source:
        raise DatasetError(f"{where}: 'data_source' must be a non-empty string (got {source!r})")

    reward_model = row.get("reward_model")
    if reward_model is None:
        raise DatasetError(f"{where}: missing 'reward_model' (expected {{'style': 'rule', 'ground_truth': ...}})")
    if not isinstance(reward_model, dict):
        raise DatasetError(f"{where}: 'reward_model' must be a dict (got {_type_name(reward_model)})")
    truth = reward_model.get("ground_truth")
    if truth is None:
        raise DatasetError(f"{where}: missing 'reward_model.ground_truth'")
    if isinstance(truth, bool) or not isinstance(truth, str | int | float):
        raise DatasetError(f"{where}: 'reward_model.ground_truth' must be a string (got {_type_name(truth)})")
    out["reward_model"] = {**reward_model, "ground_truth": str(truth)}

    extra = row.get("extra_info")
    if extra is None:
        extra = {}
    if not isinstance(extra, dict):
        raise DatasetError(f"{where}: 'extra_info' must be a dict (got {_type_name(extra)})")
    out["extra_info"] = dict(extra)

    agent = row.get("agent_name")  # verl's column: which agent loop rolls this row out (None/"" = the default)
    if agent is not None and not isinstance(agent, str):
        raise DatasetError(f"{where}: 'agent_name' must be a string (got {_type_name(agent)})")
    return out


def _read_json_records(path: Path) -> list[Any]:
    """JSON lines (one object a line, blank lines skipped), or for ``.json`` also a single top-level array."""
    text = path.read_text(encoding="utf-8")
    if path.suffix == ".json" and text.lstrip().startswith("["):
        try:
            records = json.loads(text)
        except json.JSONDecodeError as e:
            raise DatasetError(f"{path} line {e.lineno}: invalid JSON ({e.msg})") from e
        return list(records)
    records = []
    for lineno, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError as e:
            raise DatasetError(f"{path} line {lineno}: invalid JSON ({e.msg})") from e
    return records


def _read_records(path: Path) -> list[Any]:
    if path.suffix not in ALLOWED_SUFFIXES:
        raise DatasetError(f"{path}: unsupported file type '{path.suffix}' (allowed: {', '.join(ALLOWED_SUFFIXES)})")
    if not path.exists():
        raise DatasetError(f"{path}: no such file")
    if not path.is_file():
        raise DatasetError(f"{path}: is not a file")
    if path.suffix != ".parquet":
        return _read_json_records(path)
    import pyarrow.parquet as pq

    try:
        return pq.read_table(path).to_pylist()
    except Exception as e:  # pyarrow raises several types (ArrowInvalid, OSError) for a corrupt file
        raise DatasetError(f"{path}: cannot read as parquet ({type(e).__name__}: {e})") from e


def load_rows(paths: str | Path | Sequence[str | Path]) -> Rows:
    """Read and validate one file or several (concatenated in the given order, as verl's ``data.train_files``).

    Raises ``DatasetError`` naming the file and row of the first bad row.
    """
    if isinstance(paths, str | Path):
        paths = [paths]
    if not paths:
        raise DatasetError("load_rows: no data files given")
    rows: list[dict[str, Any]] = []
    origins: list[tuple[str, int]] = []
    for p in paths:
        path = Path(p)
        for i, record in enumerate(_read_records(path)):
            rows.append(validate_row(record, f"{path} row {i}"))
            origins.append((str(path), i))
    return Rows(rows, origins)


def write_rows(path: str | Path, rows: Sequence[dict[str, Any]]) -> Path:
    """Write rows as ``.parquet`` or ``.jsonl``/``.json`` (JSON lines), chosen by the suffix; parent dirs are created.

    Parquet needs every value of a column to have one type, which is why task rows keep free-form metadata as JSON
    strings.
    """
    path = Path(path)
    if path.suffix not in ALLOWED_SUFFIXES:
        raise DatasetError(f"{path}: unsupported file type '{path.suffix}' (allowed: {', '.join(ALLOWED_SUFFIXES)})")
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.suffix == ".parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        try:
            table = pa.Table.from_pylist(list(rows))
        except (pa.ArrowInvalid, pa.ArrowTypeError) as e:
            raise DatasetError(f"{path}: rows cannot be stored as parquet ({e})") from e
        pq.write_table(table, path)
    else:
        with path.open("w", encoding="utf-8") as f:
            for row in rows:
                f.write(json.dumps(row, ensure_ascii=False) + "\n")
    return path
