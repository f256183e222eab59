"""The ``fully_async`` Rollouter: the worker that runs the producer's loop (``loop.produce``) on a generation thread.

It has its own streaming engine (its own model copy, weights received over the sync group) and, with
``rollout.num_workers`` > 1, the other rollout ranks (``attach_ranks``, ``ranks.RemoteRank``); the books stay here, so
staleness, the ledger and recovery are one Rollouter's. The driver calls in from Ray's actor threads (the actor is
threaded); the books are guarded by the producer's lock. It parks while the driver holds it (a weight sync, a
checkpoint; ``rollouter/idle_ratio`` counts it).
"""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import replace
from typing import Any

from asyncrl import seeds
from asyncrl.calls import Handle
from asyncrl.config.specs import RollouterSpec
from asyncrl.data.dataset import EpochSampler, PromptDataset, load_rows
from asyncrl.rewards.filtering import keep_group
from asyncrl.rollout.agent.engine import AgentEngine
from asyncrl.rollout.agent.tools import tool_schemas
from asyncrl.rollout.sampling import SamplingParams
from asyncrl.schedules.fully_async.books import POLL_S
from asyncrl.schedules.fully_async.loop import Hold, produce
from asyncrl.schedules.fully_async.producer import Producer
from asyncrl.schedules.fully_async.queue import QueueClosed
from asyncrl.schedules.fully_async.ranks import OwnRank, RankPorts, RemoteRank
from asyncrl.schedules.fully_async.recovery import PackedSnapshot, RollouterSnapshot, StreamBatch, Takeover
from asyncrl.schedules.fully_async.slots import RankStream, budget_of, queue_for, stream_concurrency
from asyncrl.schedules.loops import clock_step, run_to_end
from asyncrl.types import PrefillStats, Sample
from asyncrl.workers.rollout import RolloutWorker
from asyncrl.workers.stream_loop import BusySpan

STOP_JOIN_S = 60.0  # how long ``stop`` waits for the generation thread to end (it stops at its next decode step)
# the longest the generation thread sleeps with nothing to do: every event that gives it work sets ``wake``, so this
# only bounds what an event missed would cost
IDLE_WAIT_S = 1.0


class RollouterError(RuntimeError):
    """The generation thread failed, or did not park in time; names what it was doing."""


class Rollouter(RolloutWorker):
    def __init__(self, spec: RollouterSpec, name: str = "rollouter", num_threads: int | None = None):
        super().__init__(spec, name=name, num_threads=num_threads)
        at, d, r = spec.async_training, spec.data, spec.engine.rollout
        self.spec = spec
        self.params = SamplingParams.from_config(r)
        self.budget = budget_of(at, spec.ppo_mini_batch_size)
        self.queue = queue_for(at, self.budget)
        tools = tool_schemas(r.multi_turn.tools)
        rows, tokenizer = load_rows(d.train_files), self.engine.tokenizer
        self.dataset = PromptDataset(rows, tokenizer, d.max_prompt_length, overlong=d.overlong_prompts, tools=tools)
        self.sampler = EpochSampler(len(self.dataset), 1, seed=spec.engine.seed, shuffle=d.shuffle)
        self.books = self._books(1)
        self._cv = threading.Condition()
        self.held = Hold()  # the driver's hold on the generation thread, under ``_cv``
        self._error: BaseException | None = None
        self._thread: threading.Thread | None = None
        self._window_start = time.perf_counter()
        # an agent's turns (tool calls) run off the decode (``AgentEngine.start_turn``): how many run, the first error
        self.agent = self.engine if isinstance(self.engine, AgentEngine) else None
        self._turns = 0
        self._turn_error: BaseException | None = None
        seed = seeds.sampling(spec.engine.seed)  # each row keys its own noise: as sync's rows
        self.own = OwnRank(self.engine, self.params, seed, BusySpan(self.timeline, self.name))
        self.streams: list[RankStream] = [self.own]

    def _books(self, ranks: int) -> Producer:
        r = self.spec.engine.rollout
        capacities, max_groups = stream_concurrency(
            self.engine.capacity, r.n, ranks, self.spec.async_training.max_inflight_groups
        )
        prompt_of = lambda _epoch, index: self.dataset[index]  # noqa: E731
        fg = self.spec.filter_groups  # dynamic sampling: a group without a reward spread is dropped as it finishes
        keep = functools.partial(keep_group, metric=fg.metric) if fg.enable else None
        return Producer(
            self.budget,
            self.queue,
            self.sampler,
            prompt_of,
            r.n,
            capacities,
            max_groups,
            keep=keep,
            complete=self._complete,
            max_completing=self.spec.reward.max_concurrency,
        )

    def attach_ranks(self, ranks: list[Handle]) -> None:
        """Decode on these rollout workers too (``asyncrl.workers.rollout.RolloutWorker``: threaded, so a pause
        reaches a running decode), before ``start``."""
        if self._thread is not None:
            raise RollouterError("attach_ranks: only before start()")
        seed, timeout_s = self.own.seed, self.spec.async_training.pause_timeout_s
        self.books = self._books(len(ranks) + 1)  # before ``restore``: the books are still empty
        wake = self.books.wake
        self.streams = [self.own, *(RemoteRank(h, self.params, seed, timeout_s, wake) for h in ranks)]

    # ---- the generation thread -------------------------------------------------------------------------------------
    def start(self) -> None:
        if self._thread is not None:
            raise RollouterError("Rollouter.start: already started")
        self._window_start = time.perf_counter()
        self._thread = threading.Thread(target=self._run, name="rollouter-gen", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            run_to_end(produce(RollouterPorts(self)))
        except QueueClosed:
            pass
        except BaseException as e:  # surfaced to the driver by the next call
            self._error = e
        finally:
            with self._cv:
                self.held.parked = True
                self._cv.notify_all()

    def _leave_put(self) -> bool:
        """A full queue's put gives way to the driver (a park or a stop); the group stays in flight, finished."""
        with self._cv:
            return self.held.park or self.held.stop

    def _complete(self, sample: Sample, done: Callable[[Sample], None]) -> None:
        """A row that ended, off the decode: an agent's row that goes on starts its turn (its tool calls; ``_turn``
        hands it back to decode its next turn, its slot free meanwhile), any other is scored on the reward loop."""
        if self.agent is not None and self.agent.multi_turn_row(sample):
            with self._cv:
                self._turns += 1
            self.agent.start_turn(sample, self.params).add_done_callback(lambda turn: self._turn(turn, done))
        else:
            self.scorer.submit(sample, done)

    def _turn(self, turn: Future[Sample], done: Callable[[Sample], None]) -> None:
        try:
            row = turn.result()
            if row.stop_reason == "interrupted":
                done(row)  # its next turn: placed again at the generation thread's next turn
            else:
                self.scorer.submit(row, done)
        except BaseException as e:  # surfaced by the generation thread (``RollouterPorts.hold``)
            self._turn_error = self._turn_error or e
        finally:
            with self._cv:
                self._turns -= 1
            self.books.wake.set()

    def _check_alive(self) -> None:
        if self._error is not None:
            raise RollouterError(f"the rollouter's generation thread failed: {self._error!r}") from self._error

    # ---- driver calls ----------------------------------------------------------------------------------------------
    def get_batch(self, n_groups: int, trainer_version: int) -> StreamBatch:
        """The ``n_groups`` groups of one trainer step at ``trainer_version`` (``Producer.take``), with their
        staleness. Blocks until they are there (the trainer's idle time); raises if the generation thread died or
        nothing arrived within ``async_training.get_batch_timeout_s``."""
        timeout_s = self.spec.async_training.get_batch_timeout_s
        deadline = time.monotonic() + timeout_s
        while True:
            self._check_alive()
            got = self.books.take(n_groups, trainer_version, timeout_s=0.5)
            if got is not None:
                return got
            if time.monotonic() > deadline:
                b = self.books
                raise RollouterError(
                    f"get_batch: no {n_groups} groups within {timeout_s:g} s (queued {len(b.queue)}, "
                    f"in flight {len(b.inflight)}, admission headroom "
                    f"{b.controller.admission_limit() - b.controller.live_groups()})"
                )

    def pause(self, interrupt: bool) -> float:
        """Hold the generation thread at its park point; ``interrupt`` takes every row back from the engines at
        their next step (partial rollout), else the live rows run to their end first. Returns the seconds it took to
        park (without ``interrupt``: the rest of the running decode); raises after ``async_training.pause_timeout_s``.
        """
        timeout_s = self.spec.async_training.pause_timeout_s
        t0 = time.perf_counter()
        with self._cv:
            self.held.park, self.held.interrupt = True, interrupt
            self.books.wake.set()
        if interrupt:
            for rank in self.streams[1:]:  # the other ranks stop now, not when the generation thread gets there
                rank.stop_soon()  # type: ignore[attr-defined] - a RemoteRank
        with self._cv:
            ok = self._cv.wait_for(lambda: self.held.parked, timeout_s)
        self._check_alive()
        if not ok:
            raise RollouterError(f"pause: the generation thread did not park within {timeout_s:g} s")
        return time.perf_counter() - t0

    def resume_generation(self, version: int, snapshot: bool = False) -> PackedSnapshot | None:
        """Let the parked thread go on, generating with ``version`` (the weights just received); with ``snapshot``,
        first take the snapshot (``snapshot()``, packed while still parked) and return it: a weight push's last two
        steps in one call, one round trip less for the trainer to wait."""
        if self.engine.version != version:
            raise RollouterError(f"resume_generation({version}): the engine holds version {self.engine.version}")
        snap = PackedSnapshot.pack(self.snapshot()) if snapshot else None
        self.books.on_sync(version)
        with self._cv:
            self.held.park = False
            self._cv.notify_all()
        self.books.wake.set()
        return snap

    def snapshot(self) -> RollouterSnapshot:
        """Everything a resumed run needs, taken while parked (or before ``start``): queue, in-flight rows,
        controller, ledger, cursor."""
        with self._cv:
            if self._thread is not None and not self.held.parked:
                raise RollouterError("snapshot: call pause() first (a snapshot of a running loop is inconsistent)")
        return self.books.snapshot(self.engine.version)

    def restore(self, state: RollouterSnapshot | Takeover) -> None:
        """Load a snapshot before ``start``; the engine must already hold the snapshot's weights version. A
        ``Takeover`` (a dead Rollouter's last snapshot and what the trainer consumed since) replays the consumption
        on top (``recovery``); the engine then holds the takeover's, newer, version."""
        if self._thread is not None:
            raise RollouterError("restore: only before start()")
        take = state if isinstance(state, Takeover) else Takeover(state, [], state.engine_version)
        if self.engine.version != take.version or take.version < take.snapshot.engine_version:
            raise RollouterError(
                f"restore: the snapshot was taken at version {take.snapshot.engine_version} (to continue at "
                f"{take.version}) but the engine holds {self.engine.version}; sync the checkpoint's weights first"
            )
        self.books.restore(take)

    def take_metrics(self) -> dict[str, float]:
        """Counters and the idle ratio since the previous call (``rollouter/idle_ratio``)."""
        now = time.perf_counter()
        window = max(now - self._window_start, 1e-9)
        own = self.own
        idle = max(0.0, 1.0 - own.busy_s / window)
        tokens_per_s = own.tokens / own.busy_s if own.busy_s > 0 else 0.0
        own.busy_s, own.tokens, self._window_start = 0.0, 0, now
        out = self.books.count_metrics()
        out["rollouter/idle_ratio"] = idle
        out["rollouter/busy_s"], out["perf/rollout_tokens_per_s"] = window * (1.0 - idle), tokens_per_s
        scored = self.scorer.take_metrics()  # its failures are counted from the step's samples (reward/failed_count)
        out.update({k: v for k, v in scored.items() if k != "reward/failed_count"})
        prefill = sum((rank.take_prefill() for rank in self.streams), PrefillStats())
        out.update(prefill.metrics())  # a group's blank rows share one prompt's prefill
        return out

    def ledger_state(self) -> dict[str, Any]:
        with self.books.lock:
            return self.books.ledger.state_dict()

    def stop(self) -> None:
        with self._cv:
            self.held.stop = True
            self._cv.notify_all()
        self.books.wake.set()
        self.books.queue.close()
        if self._thread is not None:
            self._thread.join(timeout=STOP_JOIN_S)
        if not self._thread or not self._thread.is_alive():
            self.engine.interrupt()  # rows still live when it stopped: their groups are in no snapshot after this


class RollouterPorts(RankPorts):
    """``loop.produce``'s ports on the Rollouter's generation thread: its ranks (a full queue's put gives way to the
    driver), the driver's hold, its agent turns; an idle loop sleeps on the books' ``wake``."""

    def __init__(self, r: Rollouter):
        super().__init__(r.books, r.streams, POLL_S, r._leave_put)
        self.r = r

    def hold(self) -> Hold:
        self.books.wake.clear()
        with self.r._cv:
            held = replace(self.r.held)
        if not held.stop:  # a failed reward or agent turn stops the thread
            self.r.scorer.check()
            if (error := self.r._turn_error) is not None:
                raise RollouterError(f"an agent turn failed: {error!r}") from error
        return held

    def turns(self) -> int:
        return self.r._turns

    @clock_step
    def park(self) -> None:
        self.books.put_finished(0.0)
        r = self.r
        with r._cv:
            r.held.parked = True
            r._cv.notify_all()
            r._cv.wait_for(lambda: not r.held.park or r.held.stop)
            r.held.parked = False

    @clock_step
    def idle(self) -> None:
        self.books.wake.wait(IDLE_WAIT_S)
