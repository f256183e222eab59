"""The reward loop: each sample is scored on its own, on a background asyncio loop, as its row ends, while the engine
goes on generating the others; every role that scores builds one (``build_scorer``). Behaviour: docs/rewards.md, "The
reward loop and a reward service"; metrics: docs/metrics.md, "Samples and rewards".

Two ways in: ``submit(sample, done)``, a row's completion (``fully_async``'s Rollouter; ``take_metrics`` closes the
books per step); or ``submit_all`` as the engine ends rows, then ``score(samples)``, which submits the rest (an engine
that hands over samples only at the end, interrupted rows) and waits for all (the other schedules). A scorer that
raises, times out (a plain function keeps running on its thread, its result ignored) or returns garbage fails its
sample only, as in ``RewardFn.score``; a reward service down after its retries raises
``RewardServiceUnavailableError`` from ``score`` (or ``check``, on the per-row path).
"""

from __future__ import annotations

import asyncio
import inspect
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import AbstractContextManager
from functools import partial
from typing import Protocol

from asyncrl.config import RewardConfig
from asyncrl.rewards.genrm import GenerativeReward
from asyncrl.rewards.overlong import OverlongShaping
from asyncrl.rewards.remote import Args, RemoteReward, RewardServiceError, RewardServiceUnavailableError
from asyncrl.rewards.reward_fn import RewardFn, build_reward_fn
from asyncrl.types import Generation, PrefillStats, Prompt, Sample, SamplingParams

# seconds the first sample of a batched request waits for more: a decode step's rows reach the loop within it
BATCH_WAIT_S = 0.002


class RewardLoop:
    def __init__(
        self,
        reward_fn: RewardFn,
        max_concurrency: int,
        timeout_s: float,
        remote: RemoteReward | GenerativeReward | None = None,
        batch_size: int = 1,
    ) -> None:
        """``max_concurrency``, ``timeout_s`` (seconds) and ``batch_size``: ``reward.*``'s, checked positive there."""
        self.reward_fn, self.remote = reward_fn, remote
        self.max_concurrency, self.timeout_s = max_concurrency, timeout_s
        # the reward service's samples a request (``reward.remote_batch_size``), and those waiting for the next one
        self.batch_size = batch_size if isinstance(remote, RemoteReward) else 1
        self._pending: list[tuple[Args, asyncio.Future[tuple[float, dict[str, float]]]]] = []
        self._timer: asyncio.TimerHandle | None = None
        self._pool = ThreadPoolExecutor(max_concurrency, thread_name_prefix="reward")
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="reward-loop", daemon=True)
        self._thread.start()
        self._sem = asyncio.Semaphore(max_concurrency)
        self._lock = threading.Lock()
        self.error: BaseException | None = None
        self._reset()

    def _reset(self) -> None:
        self._futures: dict[int, Future] = {}
        self._latencies: list[float] = []
        self._in_flight = self._in_flight_max = self._timeouts = self._requests = self._sent = 0

    # ---- the rollout side's calls ----------------------------------------------------------------------------------
    def submit(self, sample: Sample, done: Callable[[Sample], None] | None = None) -> None:
        """Start scoring ``sample``; returns at once. With ``done`` the score is written into the sample as it
        arrives and ``done(sample)`` is called on the loop's thread (a row's completion: ``take_metrics`` closes the
        books); without it ``score`` collects the batch."""
        if done is not None:
            self._loop.call_soon_threadsafe(self._start, [(sample, time.perf_counter(), done, None)])
        else:
            self.submit_all([sample])

    def submit_all(self, samples: list[Sample]) -> None:
        """Start scoring those of ``samples`` not submitted yet; returns at once (``score`` collects the batch). They
        reach the loop together (one wake-up; one request to a batching reward service)."""
        submitted = time.perf_counter()
        items: list[tuple[Sample, float, None, Future]] = []
        with self._lock:
            for s in samples:
                if id(s) not in self._futures:
                    self._futures[id(s)] = fut = Future()
                    items.append((s, submitted, None, fut))
        if items:
            self._loop.call_soon_threadsafe(self._start, items)

    def check(self) -> None:
        """Raise what stopped the per-row path: a reward service that stayed down, or a ``done`` that failed."""
        if self.error is not None:
            raise self.error

    def take_metrics(self) -> dict[str, float]:
        """The per-row path's metrics since the last call (the samples scored with a ``done``)."""
        with self._lock:
            metrics = self.reward_fn.finish_batch()
            self.reward_fn.last_errors = []
            metrics.update(self._loop_metrics())
            self._latencies, self._in_flight_max, self._timeouts = [], self._in_flight, 0
            self._requests = self._sent = 0
        return metrics

    def _loop_metrics(self) -> dict[str, float]:
        lat = self._latencies
        metrics = {"reward/in_flight_max": float(self._in_flight_max), "reward/timeouts": float(self._timeouts)}
        if lat:  # a step in which no score arrived has no latency (not one of 0 s)
            metrics.update({"reward/latency_mean_s": sum(lat) / len(lat), "reward/latency_max_s": max(lat)})
        if self.batch_size > 1 and self._requests:
            metrics["reward/samples_per_request"] = self._sent / self._requests
        return metrics

    def score(self, samples: list[Sample]) -> dict[str, float]:
        """Score every sample of a finished generation call (those not submitted yet are submitted now), wait for
        all, and return the batch's metrics; raises ``RewardServiceUnavailableError`` if the service stayed down."""
        with self._lock:
            early = sum(1 for s in samples if id(s) in self._futures and self._futures[id(s)].done())
        self.submit_all(samples)
        self.reward_fn.last_errors = []
        down: BaseException | None = None
        for s in samples:
            outcome = self._futures[id(s)].result()
            if isinstance(outcome, RewardServiceUnavailableError):
                down = down or outcome
                outcome = RuntimeError(str(outcome))
            self.reward_fn.record(s, outcome)
        metrics = self.reward_fn.finish_batch()
        if down is not None:
            self._reset()
            raise down
        metrics.update(self._loop_metrics())
        metrics["reward/scored_during_generation_frac"] = early / max(len(samples), 1)
        self._reset()
        return metrics

    def close(self) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=5)
        self._pool.shutdown(wait=False, cancel_futures=True)
        if self.remote is not None:
            self.remote.close()

    # ---- on the loop -------------------------------------------------------------------------------------------------
    def _start(self, items: list[tuple[Sample, float, Callable[[Sample], None] | None, Future | None]]) -> None:
        """A task per sample; its outcome, when it ends, into the sample's ``Future`` where ``score`` waits on one."""
        for sample, submitted, done, fut in items:
            task = self._loop.create_task(self._score(sample, submitted, done))
            if fut is not None:
                task.add_done_callback(partial(_settle, fut))

    async def _score(
        self, sample: Sample, submitted: float, done: Callable[[Sample], None] | None
    ) -> tuple[float, dict[str, float]] | BaseException:
        """The sample's ``(reward, extra)`` or the error that failed it (never raises); with ``done``, recorded into
        the sample and handed on."""
        outcome = await self._outcome(sample, submitted)
        if done is not None:
            try:
                with self._lock:
                    if isinstance(outcome, RewardServiceUnavailableError):
                        self.error = self.error or outcome
                        outcome = RuntimeError(str(outcome))
                    self.reward_fn.record(sample, outcome)
                done(sample)
            except Exception as e:  # noqa: BLE001 - surfaced by ``check`` on the rollout side
                self.error = self.error or e
        return outcome

    async def _outcome(self, sample: Sample, submitted: float) -> tuple[float, dict[str, float]] | BaseException:
        async with self._sem:
            self._in_flight += 1
            self._in_flight_max = max(self._in_flight_max, self._in_flight)
            try:
                return await asyncio.wait_for(self._call(sample), self.timeout_s)
            except TimeoutError:
                self._timeouts += 1
                return TimeoutError(f"reward not computed within reward.timeout_s={self.timeout_s:g} s")
            except Exception as e:  # noqa: BLE001 - confined to the sample (the caller records it)
                return e
            finally:
                self._in_flight -= 1
                self._latencies.append(time.perf_counter() - submitted)

    async def _call(self, sample: Sample) -> tuple[float, dict[str, float]]:
        p = sample.prompt
        args = (p.data_source, sample.response_text or "", p.ground_truth, p.extra_info)
        loop = asyncio.get_running_loop()
        if self.batch_size > 1:
            return await self._batched(args, loop)
        if self.remote is not None:
            return await loop.run_in_executor(self._pool, self.remote.score_one, *args)
        fn = self.reward_fn.scorer_for(p.data_source)
        if inspect.iscoroutinefunction(fn):
            return self.reward_fn.normalize(await self.reward_fn.call(*args), p.data_source)
        return await loop.run_in_executor(self._pool, self.reward_fn.score_one, *args)

    def _batched(self, args: Args, loop: asyncio.AbstractEventLoop) -> asyncio.Future[tuple[float, dict[str, float]]]:
        """A sample's place in the reward service's next request: samples that reach here in one turn of the loop (a
        decode step's rows) go together, ``batch_size`` at most a request."""
        waiter: asyncio.Future[tuple[float, dict[str, float]]] = loop.create_future()
        self._pending.append((args, waiter))
        if len(self._pending) >= self.batch_size:
            self._send(loop)
        elif len(self._pending) == 1:
            self._timer = loop.call_later(BATCH_WAIT_S, self._send, loop)
        return waiter

    def _send(self, loop: asyncio.AbstractEventLoop) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        batch, self._pending = self._pending, []
        if not batch:
            return
        assert isinstance(self.remote, RemoteReward)
        self._requests += 1
        self._sent += len(batch)
        request = loop.run_in_executor(self._pool, self.remote.score_many, [args for args, _ in batch])

        def hand_out(done: asyncio.Future[list[tuple[float, dict[str, float]] | RewardServiceError]]) -> None:
            if done.cancelled():  # the loop is closing
                for _, waiter in batch:
                    waiter.cancel()
                return
            error = done.exception()
            results = [error] * len(batch) if error is not None else done.result()
            for (_, waiter), result in zip(batch, results):
                if waiter.done():  # its sample timed out meanwhile
                    continue
                if isinstance(result, BaseException):
                    waiter.set_exception(result)
                else:
                    waiter.set_result(result)

        request.add_done_callback(hand_out)


def _settle(fut: Future, task: asyncio.Task) -> None:
    if task.cancelled():
        fut.cancel()
    else:
        fut.set_result(task.result())


def build_reward_loop(cfg: RewardConfig, reward_fn: RewardFn) -> RewardLoop:
    """The run's reward loop: ``reward_fn``, or the ``reward.remote_url`` service, or the ``reward.genrm.url`` judge.
    Also where ``reward_fn`` gets the overlong shaping a ``RewardSpec`` carries (every scoring role calls this once)."""
    shaping = OverlongShaping.of(cfg)
    if shaping is not None:
        reward_fn.overlong = shaping
    remote: RemoteReward | GenerativeReward | None = None
    if cfg.remote_url:
        remote = RemoteReward(cfg.remote_url, cfg.timeout_s, cfg.remote_max_retries, cfg.remote_backoff_s)
    elif cfg.genrm.url:
        remote = GenerativeReward(cfg.genrm, cfg.timeout_s, cfg.remote_max_retries, cfg.remote_backoff_s)
    return RewardLoop(reward_fn, cfg.max_concurrency, cfg.timeout_s, remote, cfg.remote_batch_size)


def build_scorer(cfg: RewardConfig) -> RewardLoop:
    """What scores a role's samples, from its reward spec alone: the reward function with the manager's shaping, on
    the reward loop (the one call a scoring role needs)."""
    return build_reward_loop(cfg, build_reward_fn(cfg.custom_function, binarize=cfg.binarize))


class GeneratingEngine(Protocol):
    """What ``generate_scored`` uses of an engine (the built-in one, vLLM's, an ``AgentEngine`` over either):
    ``on_samples`` is passed only where ``reports_finished_rows`` is true, ``last_segments`` read where it exists."""

    version: int
    last_prefill: PrefillStats

    def generate(
        self,
        prompts: list[Prompt],
        params: SamplingParams,
        seed: int | None = None,
        on_samples: Callable[[list[Sample]], None] | None = None,
    ) -> list[Sample]: ...


class Spans(Protocol):
    """What ``generate_scored`` records on a timeline (``asyncrl.telemetry.timeline.Timeline``, a floor above)."""

    def span(
        self, name: str, step: int | None = None, worker: str | None = None, **args: object
    ) -> AbstractContextManager[None]: ...

    def instant(self, name: str, step: int | None = None, worker: str | None = None, **args: object) -> None: ...


def generate_scored(
    engine: GeneratingEngine,
    scorer: RewardLoop,
    timeline: Spans,
    worker: str,
    prompts: list[Prompt],
    params: SamplingParams,
    seed: int,
    step: int,
    score: bool,
) -> Generation:
    """Generate, then (``score``) fill each sample's rule reward; the seconds are this worker's wall time. An engine
    that reports finished rows (both engines, and the agent loops over either) has them scored on the reward loop as
    their decode step ends, while the others decode; an engine that does not has them scored when the call returns."""
    t0 = time.perf_counter()
    streams = score and getattr(engine, "reports_finished_rows", False)
    with timeline.span("generate", step=step, worker=worker, version=engine.version):
        if streams:
            samples = engine.generate(prompts, params, seed=seed, on_samples=scorer.submit_all)
        else:
            samples = engine.generate(prompts, params, seed=seed)
        # this call's measurements, read at once: the built-in engine's decode steps by batch size (``asyncrl
        # profile`` fits them) and the prefill counts
        segments, prefill = [list(s) for s in getattr(engine, "last_segments", ())], engine.last_prefill
    if segments:
        timeline.instant("decode_segments", step=step, worker=worker, segments=segments)
    metrics: dict[str, float] = {}
    if score:
        with timeline.span("reward", step=step, worker=worker):
            metrics = scorer.score(samples)
    return Generation(samples, time.perf_counter() - t0, prefill, metrics)
