"""The rollout trace (``rollout.trace``; docs/rollout_trace.md): a few of each step's samples, as the trainer
consumed them, in ``rollout_trace.jsonl`` of the run directory, read back by ``asyncrl trace RUN_DIR --step N``. A
sample's staleness is the trainer's version at the update that consumed it minus the version its generation started
with.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from asyncrl.errors import UserInputError
from asyncrl.types import Sample

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

TRACE_FILE = "rollout_trace.jsonl"
WORK_FILE = "work.jsonl"  # every step's work in lengths: what ``asyncrl profile`` fits the cost model on


class TraceNotFoundError(UserInputError, FileNotFoundError):
    """The run directory has no rollout trace."""


@dataclass
class TraceRecord:
    step: int
    uid: str
    data_source: str
    ground_truth: str
    prompt_text: str
    response_text: str
    prompt_ids: list[int]
    response_ids: list[int]
    response_tokens: list[str] | None  # each response token's text (``token2text``)
    reward: float
    reward_failed: bool
    stop_reason: str
    start_version: int
    versions: list[int]  # per response token
    staleness: int
    logprob_mean: float


def pick(samples: list[Sample], k: int) -> list[Sample]:
    """``k`` samples evenly spaced over ``samples`` (all of them when there are no more than ``k``)."""
    if len(samples) <= k:
        return list(samples)
    return [samples[i * len(samples) // k] for i in range(k)]


def records(
    step: int,
    samples: list[Sample],
    consumed_version: int,
    tokenizer: PreTrainedTokenizerBase,
    k: int,
    token2text: bool,
) -> list[TraceRecord]:
    out = []
    for s in pick(samples, k):
        ids = list(s.response_ids)
        out.append(
            TraceRecord(
                step=step,
                uid=s.uid,
                data_source=s.prompt.data_source,
                ground_truth=s.prompt.ground_truth,
                prompt_text=_decode(tokenizer, list(s.prompt.prompt_ids)),
                response_text=s.response_text if s.response_text is not None else _decode(tokenizer, ids),
                prompt_ids=list(s.prompt.prompt_ids),
                response_ids=ids,
                response_tokens=[_decode(tokenizer, [t]) for t in ids] if token2text else None,
                reward=float(s.reward),
                reward_failed=bool(s.reward_failed),
                stop_reason=s.stop_reason,
                start_version=int(s.start_version),
                versions=[int(v) for v in s.versions],
                staleness=consumed_version - int(s.start_version),
                logprob_mean=sum(s.logprobs) / len(s.logprobs) if s.logprobs else 0.0,
            )
        )
    return out


def _decode(tokenizer: PreTrainedTokenizerBase, ids: list[int]) -> str:
    """One sequence's text (a flat id list decodes to one string; transformers types ``decode`` as either)."""
    text = tokenizer.decode(ids)
    return text if isinstance(text, str) else "".join(text)


def append(path: Path, recs: Sequence[TraceRecord | WorkRecord]) -> None:
    """``recs`` as JSON lines at the end of ``path`` (the run directory's ``TRACE_FILE`` or ``WORK_FILE``)."""
    with open(path, "a", encoding="utf-8") as f:
        for r in recs:
            f.write(json.dumps(asdict(r)) + "\n")


def read(run_dir: str | Path, step: int | None = None) -> list[TraceRecord]:
    """The trace's records (of ``step`` only, when given); a missing trace is an error naming the file."""
    path = Path(run_dir) / TRACE_FILE
    if not path.is_file():
        raise TraceNotFoundError(f"{path}: no rollout trace (run with rollout.trace.enable=true)")
    recs = [TraceRecord(**json.loads(line)) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    return [r for r in recs if step is None or r.step == step]


def truncate(run_dir: Path, last_step: int) -> None:
    """Keep the trace's and the work record's lines of steps <= ``last_step`` (0: none)."""
    for path in (run_dir / TRACE_FILE, run_dir / WORK_FILE):
        if not path.exists():
            continue
        lines = path.read_text(encoding="utf-8").splitlines()
        keep = [line for line in lines if json.loads(line)["step"] <= last_step]
        path.write_text("".join(line + "\n" for line in keep), encoding="utf-8")


@dataclass(frozen=True)
class WorkRecord:
    """One step's work, every sample's lengths (``work.jsonl``, always written: a few bytes per sample).

    ``group[i]`` numbers sample i's prompt group within the step (0, 1, ...); ``prompt_len``/``response_len`` are its
    token counts; ``versions[i]`` how many weight versions wrote its response (2+: a partial rollout resumed it after a
    sync)."""

    step: int
    group: list[int]
    prompt_len: list[int]
    response_len: list[int]
    versions: list[int]  # distinct weight versions among each sample's tokens


def work_record(step: int, samples: list[Sample]) -> WorkRecord:
    ids: dict[str, int] = {}
    group = [ids.setdefault(s.prompt.uid, len(ids)) for s in samples]
    return WorkRecord(
        step=step,
        group=group,
        prompt_len=[len(s.prompt.prompt_ids) for s in samples],
        response_len=[len(s.response_ids) for s in samples],
        versions=[len(set(s.versions)) for s in samples],
    )


def format_step(recs: list[TraceRecord], width: int = 100) -> str:
    """A step's records as text: one block per sample, reward and versions first."""
    lines = []
    for r in recs:
        versions = sorted(set(r.versions))
        failed = " (reward failed)" if r.reward_failed else ""
        lines.append(
            f"step {r.step}  {r.uid}  reward {r.reward:g}{failed}  stop {r.stop_reason}  "
            f"versions {versions}  staleness {r.staleness}  mean logprob {r.logprob_mean:.3f}"
        )
        lines.append(f"  prompt:   {_clip(r.prompt_text, width)}")
        lines.append(f"  response: {_clip(r.response_text, width)}   (truth: {r.ground_truth})")
        if r.response_tokens is not None:
            lines.append(f"  tokens:   {_clip(' | '.join(repr(t)[1:-1] for t in r.response_tokens), width)}")
    return "\n".join(lines)


def _clip(text: str, width: int) -> str:
    text = text.replace("\n", "\\n")
    return text if len(text) <= width else text[: width - 3] + "..."
