"""Typed data that crosses role boundaries.

One ``Sample`` carries everything a rollout produced for one response, from the engine through reward and the
trainer, so no role passes raw dicts with string keys. Token lists are plain Python lists (cheap to pickle across Ray);
the trainer turns a list of samples into padded tensors with ``asyncrl.data.collate``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import astuple, dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from torch import Tensor


@dataclass
class Prompt:
    """One dataset row, tokenised. ``index`` is the row's position in its file (stable across epochs and resume)."""

    index: int
    prompt_ids: list[int]
    data_source: str
    ground_truth: str
    extra_info: dict[str, Any] = field(default_factory=dict)
    epoch: int = 0
    agent_name: str = ""  # the row's ``agent_name`` column ("" = rollout.agent.default_agent_loop)

    @property
    def uid(self) -> str:
        """Identifies one (epoch, row) pair: the group of ``rollout.n`` responses generated from it shares this."""
        return f"{self.epoch}:{self.index}"


@dataclass
class Sample:
    """One response to one prompt.

    ``logprobs`` are the behaviour policy's per-token log-probabilities (of the temperature-scaled distribution, before
    top-p/top-k truncation), ``versions`` the weight version that produced each response token. ``start_version`` is
    the version in force when generation of this sample began (staleness is measured from it).
    """

    prompt: Prompt
    response_ids: list[int]
    logprobs: list[float]
    versions: list[int]
    stop_reason: str = "length"  # "eos" | "length" (hit rollout.response_length) | "interrupted" (paused mid-way)
    start_version: int = 0
    response_text: str = ""
    reward: float = 0.0
    reward_failed: bool = False
    reward_extra: dict[str, float] = field(default_factory=dict)
    # Multi-turn (asyncrl.rollout.agent): 1 per response token the model generated, 0 per token appended between
    # turns (a tool's output): those carry log-prob 0 and no gradient. None = every token is the model's (one turn).
    response_mask: list[int] | None = None
    turns: int = 1  # assistant turns begun
    tool_calls: int = 0
    tool_errors: int = 0  # tool calls that raised, timed out, named no known tool or did not parse
    row: int = 0  # its number in its group (0 .. n-1): with the prompt's epoch and index, what its noise is drawn from

    @classmethod
    def blank(cls, prompt: Prompt, version: int, row: int) -> Sample:
        """Row ``row`` of ``prompt``'s group, not started: an engine's ``submit``/``resume`` decodes it from the
        prompt."""
        return cls(prompt, [], [], [], stop_reason="interrupted", start_version=version, row=row)

    @property
    def uid(self) -> str:
        return self.prompt.uid

    @property
    def loss_mask(self) -> list[int]:
        """``response_mask``, with None spelled out (all ones)."""
        return self.response_mask if self.response_mask is not None else [1] * len(self.response_ids)

    @property
    def finished(self) -> bool:
        return self.stop_reason == "eos"

    @property
    def num_tokens(self) -> int:
        return len(self.prompt.prompt_ids) + len(self.response_ids)


# ---- what role calls return (dataclasses, since they cross a process boundary) ----------------------------------
@dataclass(frozen=True)
class PrefillStats:
    """Prefix tokens through a rollout engine's prefill (real tokens, not padding): ``tokens`` were actually run
    (identical prefixes once per chunk); ``unshared_tokens`` is what prefilling every row would have run; ``rows``
    the rows they were for. Adds up over chunks, calls and workers."""

    tokens: int = 0
    unshared_tokens: int = 0
    rows: int = 0

    def __add__(self, other: PrefillStats) -> PrefillStats:
        return PrefillStats(*(a + b for a, b in zip(astuple(self), astuple(other), strict=True)))

    @property
    def saved_tokens(self) -> int:
        return self.unshared_tokens - self.tokens

    def metrics(self) -> dict[str, float]:
        """``perf/rollout_prefill_saving`` (docs/metrics.md); none when nothing was prefilled."""
        return {"perf/rollout_prefill_saving": self.saved_tokens / self.unshared_tokens} if self.unshared_tokens else {}


def engine_chunks(prefix_lengths: Sequence[int], size: int) -> list[list[int]]:
    """Rows with these prefix lengths in chunks of at most ``size``; with more rows than that, sorted by prefix length
    first (stable: a group's adjacent rows stay together) so rows entering the built-in engine's slots together pad
    and prefill less. The engine submits a call's rows in this order; the profile and the simulator price a call as
    these chunks one after another."""
    order = list(range(len(prefix_lengths)))
    if len(order) > size:
        order.sort(key=lambda i: prefix_lengths[i])
    return [order[i : i + size] for i in range(0, len(order), size)]


@dataclass
class Generation:
    """A rollout call's result: the samples (rewards already scored on the rollout side), the worker's seconds and
    the engine's prefill counts."""

    samples: list[Sample]
    seconds: float
    prefill: PrefillStats = PrefillStats()
    reward_metrics: dict[str, float] = field(default_factory=dict)  # the reward loop's (latency, in flight, ...)


@dataclass
class UpdateResult:
    """A trainer update's result: its metrics and the trainer's weight version after it (the one version counter
    of a run: every schedule reads it from here or from a checkpoint, none counts its own)."""

    metrics: dict[str, float]
    version: int
    fingerprint: dict[str, int] | None = None  # crc32 per weight tensor after the step (trainer.record_consumed)


@dataclass
class Trained:
    """What a step's updates returned: the actor's result (None when it did not update, e.g. a critic warm-up step)
    and the metrics of every role that learned."""

    actor: UpdateResult | None
    metrics: dict[str, float]


@dataclass
class Scored:
    """Per-sample numbers computed by a role (critic values [B, T], reward-model logits [B]) and its seconds."""

    values: Tensor
    seconds: float


class SamplingKnobs(Protocol):
    """The ``rollout`` config section's sampling settings (``asyncrl.config.RolloutConfig``, a floor above)."""

    n: int
    temperature: float
    top_p: float
    top_k: int
    response_length: int


@dataclass(frozen=True)
class SamplingParams:
    """How to sample responses. ``max_new_tokens`` is the response length limit in tokens (eos included).

    Frozen: ``greedy`` is worked out once here, and the decoder reads it every step."""

    n: int = 1  # responses per prompt (a GRPO group); ignored by RolloutEngine.resume
    temperature: float = 1.0  # 0.0 means greedy
    top_p: float = 1.0  # nucleus mass kept, in (0, 1]; 1.0 = off
    top_k: int = 0  # tokens kept; 0 = off
    max_new_tokens: int = 64  # response length limit, tokens
    greedy: bool = field(init=False, repr=False, compare=False)  # temperature 0: argmax, no noise drawn

    def __post_init__(self) -> None:
        object.__setattr__(self, "greedy", self.temperature == 0.0)
        for name, bad, allowed in (
            ("n", self.n < 1, ">= 1"),
            ("temperature", self.temperature < 0, ">= 0 (0 = greedy)"),
            ("top_p", not 0.0 < self.top_p <= 1.0, "in (0, 1]"),
            ("top_k", self.top_k < 0, ">= 0 (0 = off)"),
            ("max_new_tokens", self.max_new_tokens < 1, ">= 1"),
        ):
            if bad:
                raise ValueError(f"SamplingParams.{name} must be {allowed}, got {getattr(self, name)}")

    @classmethod
    def from_config(cls, rollout: SamplingKnobs) -> SamplingParams:
        """The training-time sampling of a run's ``rollout`` config section (one place, every schedule)."""
        r = rollout
        top_k = max(r.top_k, 0)  # verl's vLLM recipes write -1 for off
        return cls(n=r.n, temperature=r.temperature, top_p=r.top_p, top_k=top_k, max_new_tokens=r.response_length)
