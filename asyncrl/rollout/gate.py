"""What both rollout engines share: the pause flag and busy/updating gate (``EngineGate``: no weight update ever runs
during a generate, or a token's recorded version would be a lie), the batched calls (``GatedEngine``) and the one check
of a weight update (``validate_update``: both engines reject the same bad updates with the same messages).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import TYPE_CHECKING

import torch

from asyncrl.models.errors import WeightUpdateError
from asyncrl.rollout.sampling import check_prompts, resumable
from asyncrl.types import PrefillStats, Prompt, Sample, SamplingParams

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase


class EngineBusyError(RuntimeError):
    """An operation that needs the engine idle (weight update, a second generate) was called during a generate."""


class PartialWeightsError(RuntimeError):
    """The engine's weights are a mix of two versions (a bucket-by-bucket update failed after applying some of it):
    it refuses to generate until a complete update succeeds."""


class EngineGate:
    """Pause flag plus a lock-guarded busy/updating state. ``owner`` names the engine in error messages."""

    def __init__(self, owner: str) -> None:
        self.owner = owner
        self.pause = threading.Event()  # set: a running (or the next) generate/resume returns at its next step
        self._lock = threading.Lock()
        self._busy = False
        self._updating = False
        self.held = 0  # streamed rows submitted and not yet reported (asyncrl.rollout.streaming); under the lock
        self.key: tuple[SamplingParams, int | None] | None = None  # the held rows' params and seed
        # why the weights are a mix of two versions, while they are (``bucket_update.Applying``): no token is ever
        # recorded under a version whose weights the engine does not hold
        self.partial: str | None = None

    @property
    def busy(self) -> bool:
        """A generate/resume is running, or the engine holds streamed rows."""
        return self._busy or self.held > 0

    def hold(self, rows: int, params: SamplingParams, seed: int | None) -> None:
        """Count ``rows`` more streamed rows as held; refuses during a generate/resume or an update, so a streamed
        row never decodes beside a batch call and every token's version is the weights that made it. All rows held
        at once share one ``params`` and ``seed`` (``key``; ValueError naming both otherwise)."""
        with self._lock:
            self._refuse("submit", f"{self.owner}.submit: cannot take streamed rows")
            if self.held and self.key != (params, seed):
                live_params, live_seed = self.key or (None, None)
                raise ValueError(
                    f"{self.owner}.submit: params {params} and seed {seed} differ from the live rows' params "
                    f"{live_params} and seed {live_seed} (interrupt() or drain() first)"
                )
            self.held += rows
            self.key = (params, seed)

    def release(self, rows: int) -> None:
        """``rows`` streamed rows were reported (ended, or interrupted)."""
        with self._lock:
            if rows > self.held:
                raise RuntimeError(f"{self.owner}: releasing {rows} streamed rows, only {self.held} held")
            self.held -= rows

    @contextmanager
    def running(self) -> Iterator[None]:
        """Mark the engine busy for a generate/resume (so an update can refuse)."""
        with self._lock:
            self._refuse("generate/resume", f"{self.owner}: cannot start a generate/resume")
            if self.held:
                raise EngineBusyError(
                    f"{self.owner}: cannot start a generate/resume while the engine holds {self.held} streamed rows "
                    "(interrupt() or drain() first)"
                )
            self._busy = True
        try:
            yield
        finally:
            with self._lock:
                self._busy = False

    @contextmanager
    def updating(self, version: int) -> Iterator[None]:
        """Mark the engine updating; refuses during a generate/resume or another update."""
        with self._lock:
            if self._busy:
                raise EngineBusyError(
                    f"{self.owner}.update_weights(version={version}) called while a generate/resume is running; "
                    "call request_pause() and wait for it to return first"
                )
            if self._updating:
                raise EngineBusyError(f"{self.owner}.update_weights(version={version}): another update is running")
            if self.held:
                raise EngineBusyError(
                    f"{self.owner}.update_weights(version={version}) called while the engine holds {self.held} "
                    "streamed rows; call interrupt() (or drain()) first"
                )
            self._updating = True
        try:
            yield
        finally:
            with self._lock:
                self._updating = False

    def _refuse(self, what: str, cannot: str) -> None:
        """Under the lock: PartialWeightsError for ``what`` while the weights are a mix of versions, EngineBusyError
        (``cannot``: its message's start) during a generate/resume or an update."""
        if self.partial is not None:
            raise PartialWeightsError(
                f"{self.owner}.{what}: its weights are a mix of two versions ({self.partial}); "
                "it generates again after the next complete weight update"
            )
        if self._busy or self._updating:
            running = "a generate/resume" if self._busy else "update_weights"
            raise EngineBusyError(f"{cannot} while {running} is running")


class GatedEngine:
    """What both rollout engines share over their ``EngineGate`` (set ``self._gate`` in ``__init__``): the batched
    calls, whose rows each engine decodes in its ``_continue``, and the pause/busy surface."""

    reports_finished_rows = True  # generate(on_samples=...) reports the rows that end at each step (the reward loop)
    _gate: EngineGate
    tokenizer: PreTrainedTokenizerBase
    version: int
    last_prefill: PrefillStats

    def generate(
        self,
        prompts: list[Prompt],
        params: SamplingParams,
        seed: int | None = None,
        on_samples: Callable[[list[Sample]], None] | None = None,
    ) -> list[Sample]:
        """``len(prompts) * params.n`` samples, prompt-major. Same ``seed`` and weights give identical samples, whatever
        else is in the call (``RowStreams``); ``seed=None`` draws fresh randomness. ``on_samples`` gets the samples
        whose rows ended in a decode step (the very objects returned) as that step ends, while the others decode on.
        """
        check_prompts(prompts, self._gate.owner)
        self._sync_from_source()
        with self._gate.running():  # before the rows take their start version: no update can come between
            rows = [Sample.blank(prompt, self.version, j) for prompt in prompts for j in range(params.n)]
            return self._continue(rows, params, seed, None, on_samples)

    def resume(
        self,
        samples: list[Sample],
        params: SamplingParams,
        seed: int | None = None,
        refill: Callable[[int], bool] | None = None,
    ) -> list[Sample]:
        """Continue "interrupted" samples with the current weights until eos or ``max_new_tokens`` in total.

        Returns new Sample objects in input order, the continuation's tokens at the current version, the original
        ``start_version`` kept; one continuation per sample (``params.n`` is ignored). Samples that are not
        "interrupted" come back unchanged; an interrupted one already at ``max_new_tokens`` becomes "length" without
        decoding. ``refill(n_active)`` (polled between decode steps; only tests use it) returning True stops the call,
        the unfinished rows "interrupted".
        """
        out, todo = resumable(samples, params, self.tokenizer)
        if not todo:
            self.last_prefill = PrefillStats()
            return out
        self._sync_from_source()
        with self._gate.running():
            for i, s in zip(todo, self._continue([samples[i] for i in todo], params, seed, refill)):
                out[i] = s
        return out

    def _continue(
        self,
        rows: list[Sample],
        params: SamplingParams,
        seed: int | None,
        refill: Callable[[int], bool] | None = None,
        on_samples: Callable[[list[Sample]], None] | None = None,
    ) -> list[Sample]:
        """``rows`` continued (``continuation``) under ``EngineGate.running``, one version (the current) per new token,
        in input order; ``on_samples``: the samples whose rows ended in a step (the very objects returned), as it
        ends; the unfinished rows "interrupted" when a pause (or ``refill``) stops the call."""
        raise NotImplementedError

    def _sync_from_source(self) -> None:
        """Before a call takes the gate: a colocated copy of the trainer's weights that went stale is refreshed
        (``VllmEngine``); nothing for an engine that decodes from the trainer's own modules."""

    def request_pause(self) -> None:
        """Make a running (or the next) generate/resume return at its next decode step. Safe from any thread."""
        self._gate.pause.set()

    def clear_pause(self) -> None:
        self._gate.pause.clear()

    @property
    def pause_requested(self) -> bool:
        return self._gate.pause.is_set()

    @property
    def busy(self) -> bool:
        """A generate/resume is running or streamed rows are held (safe to read from any thread)."""
        return self._gate.busy

    def live_rows(self) -> int:
        """Streamed rows submitted and not yet reported (waiting, decoding, or ended and not yet returned)."""
        return self._gate.held

    @property
    def partial_weights(self) -> str | None:
        """Why the weights are a mix of two versions (an update that failed after applying part of itself), while
        they are: generate, resume and submit refuse meanwhile (``asyncrl.rollout.bucket_update``)."""
        return self._gate.partial


def validate_update(
    items: list[tuple[str, torch.Tensor]],
    params: Mapping[str, torch.Tensor],
    required: Mapping[str, torch.Tensor],
    strict: bool,
) -> None:
    """Raise WeightUpdateError unless every name in ``items`` is a parameter of ``params`` (tied aliases included)
    with the same shape, and (``strict``) every tensor of ``required`` (tied ones once) is covered by some name."""
    covered: set[int] = set()
    for name, tensor in items:
        param = params.get(name)
        if param is None:
            known = ", ".join(list(params)[:3])
            raise WeightUpdateError(
                f"update_weights: unknown parameter {name!r} (the rollout model has no such parameter; "
                f"names look like {known}, ...)"
            )
        if tuple(tensor.shape) != tuple(param.shape):
            raise WeightUpdateError(
                f"update_weights: parameter {name!r} has shape {list(tensor.shape)}, "
                f"the rollout model expects {list(param.shape)}"
            )
        covered.add(id(param))
    if strict:
        check_covered(covered, required)


def check_covered(covered: set[int], required: Mapping[str, torch.Tensor]) -> None:
    """Raise WeightUpdateError unless every tensor of ``required`` is in ``covered`` (their ids): a strict update."""
    missing = [name for name, p in required.items() if id(p) not in covered]
    if missing:
        raise WeightUpdateError(
            f"update_weights: {len(missing)} parameter(s) missing from the update (strict), e.g. "
            f"{', '.join(missing[:5])}"
        )
