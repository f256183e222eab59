"""The ``fully_async`` Rollouter: streams prompt groups into the bounded queue on a background thread.

It is a rollout worker (own model copy, built-in engine, weights received over the sync group) that also owns the
plain-Python streaming core of ``asyncrl.streaming``: the prompt stream (an ``EpochSampler`` plus prompts to re-issue),
the ``StalenessController`` that admits new groups, the ``MessageQueue`` the trainer pulls from, and the
``PromptLedger`` that proves every prompt is trained on exactly once. One generation thread runs the loop below; the
driver calls in from Ray's actor threads (the actor is threaded), so everything shared is guarded.

Generation loop, top to bottom:

    park here while the driver holds us (weight sync, checkpoint)            rollouter/idle_ratio counts it
    admit new groups while the controller allows (up to max_inflight_groups)
    decode every unfinished row of every in-flight group in one batch:
        new groups start from the prompt, interrupted rows continue from where they stopped
    put finished groups into the queue, oldest first (blocking or dropping per drop_policy)

At a weight sync the driver calls ``pause``: with ``partial_rollout`` the running decode is interrupted at its next
step (the rows keep their tokens, log-probs and per-token versions and continue after the sync with the new weights);
without it the decode runs to the end first, so every response comes from one version. ``snapshot`` (only while
parked) captures the queue, the in-flight rows, the controller, the ledger and the prompt cursor together: restoring
it loses and repeats nothing.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from dataclasses import replace
from typing import Any

from asyncrl import seeds
from asyncrl.config import Config
from asyncrl.data.dataset import PromptDataset, load_rows
from asyncrl.data.sampler import EpochSampler
from asyncrl.rollout.agent.tools import tool_schemas
from asyncrl.rollout.sampling import SamplingParams
from asyncrl.streaming.ledger import PromptLedger
from asyncrl.streaming.queue import Group, MessageQueue, QueueClosed
from asyncrl.streaming.recovery import InFlightGroup, RollouterSnapshot, StreamBatch, Takeover, advance
from asyncrl.streaming.staleness import StalenessBudget, StalenessController
from asyncrl.types import PrefillStats, Prompt, Sample
from asyncrl.workers.rollout_worker import RolloutWorker

POLL_S = 0.02  # how often an idle generation thread re-checks admission and the queue, seconds
STOP_JOIN_S = 60.0  # how long ``stop`` waits for the generation thread to end (it stops at its next decode step)
# fully_async/count/<key>: every group admitted ends up consumed, dropped, queued or in flight; each is counted
COUNT_KEYS = (
    "started_groups",
    "queued_groups",
    "consumed_groups",
    "dropped_groups",
    "dropped_stale_samples",
    "interrupted_rows",
    "refills",
)


class RollouterError(RuntimeError):
    """The generation thread failed, or did not park in time; names what it was doing."""


def budget_of(cfg: Config) -> StalenessBudget:
    at = cfg.async_training
    return StalenessBudget(
        require_batches=at.require_batches,
        ppo_mini_batch_size=cfg.actor.ppo_mini_batch_size,
        trigger_parameter_sync_step=at.trigger_parameter_sync_step,
        staleness_threshold=at.staleness_threshold,
    )


class Rollouter(RolloutWorker):
    def __init__(self, cfg: Config, name: str = "rollouter", num_threads: int | None = None):
        super().__init__(cfg, name=name, num_threads=num_threads)
        at, d = cfg.async_training, cfg.data
        self.cfg = cfg
        self.params = SamplingParams.from_config(cfg.rollout)
        self.partial_rollout = at.partial_rollout
        self.budget = budget_of(cfg)
        self.controller = StalenessController(self.budget)
        capacity = at.max_queue_size or self.budget.groups_per_window_budget
        self.queue = MessageQueue(capacity, "block" if at.drop_policy == "backpressure" else "oldest")
        self.ledger = PromptLedger()
        self.dataset = PromptDataset(
            load_rows(d.train_files), self.engine.tokenizer, d.max_prompt_length, overlong=d.overlong_prompts,
            tools=tool_schemas(cfg.rollout.multi_turn.tools),
        )  # fmt: skip
        self.sampler = EpochSampler(len(self.dataset), 1, seed=cfg.trainer.seed, shuffle=d.shuffle)
        self.max_groups = at.max_inflight_groups or max(1, cfg.rollout.max_batch_size // cfg.rollout.n)
        self.inflight: dict[str, InFlightGroup] = {}  # insertion order = start order
        self.processing_s: dict[str, float] = {}  # queued group -> seconds from admission to the queue
        self.counts: Counter[str] = Counter(dict.fromkeys(COUNT_KEYS, 0))
        self.skip: set[tuple[int, int]] = set()  # prompts a dead predecessor issued and the trainer consumed
        self._books = threading.Lock()  # ledger, counts, processing_s, inflight (shared with the driver's calls)
        self._cv = threading.Condition()
        self._want_park = self._parked = self._stop = False
        self._error: BaseException | None = None
        self._thread: threading.Thread | None = None
        self._calls = 0
        self._busy_s, self._tokens = 0.0, 0  # seconds inside decode calls, tokens decoded, since ``take_metrics``
        self._prefill = PrefillStats()  # the engine's prefill counts since the last ``take_metrics``
        self._window_start = time.perf_counter()

    # ---- the generation thread -------------------------------------------------------------------------------------
    def start(self) -> None:
        if self._thread is not None:
            raise RollouterError("Rollouter.start: already started")
        self._window_start = time.perf_counter()
        self._thread = threading.Thread(target=self._run, name="rollouter-gen", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            while self._park_point():
                self._admit()
                rows = [s for g in self.inflight.values() for s in g.samples if s.stop_reason == "interrupted"]
                if rows:
                    self._decode()
                if not self._put_finished() and not rows:
                    self.controller.wait_for_admission(timeout=POLL_S)
        except QueueClosed:
            pass
        except BaseException as e:  # surfaced to the driver by the next call
            self._error = e
        finally:
            with self._cv:
                self._parked = True
                self._cv.notify_all()

    def _park_point(self) -> bool:
        """Wait here while the driver holds the thread; False when the thread should stop."""
        with self._cv:
            if self._want_park and not self._stop:
                self._parked = True
                self._cv.notify_all()
                self._cv.wait_for(lambda: not self._want_park or self._stop)
                self._parked = False
            return not self._stop

    def _admit(self) -> None:
        """Start new groups while the staleness controller admits them and the decode batch has room."""
        with self._books:
            while len(self.inflight) < self.max_groups and self.controller.can_start():
                reissue = self.ledger.to_reissue()
                epoch, index = reissue[0] if reissue else self._next_prompt()
                gid = self.ledger.issue(epoch, index)
                version = self.controller.on_start(gid)
                prompt = replace(self.dataset[index], epoch=epoch)
                blank = [_blank(prompt, version) for _ in range(self.params.n)]
                self.inflight[gid] = InFlightGroup(gid, epoch, index, version, time.time(), blank)
                self.counts["started_groups"] += 1

    def _next_prompt(self) -> tuple[int, int]:
        while True:
            epoch, index = self.sampler.next_batch()[0]
            if (epoch, index) not in self.skip:
                return epoch, index
            self.skip.discard((epoch, index))

    def _decode(self) -> None:
        """One batched decode over every unfinished row; returns early when the driver interrupts it."""
        groups = [g for g in self.inflight.values() if not g.finished]
        rows = [s for g in groups for s in g.samples]
        self._calls += 1
        seed = seeds.rollouter_decode(self.cfg.trainer.seed, self._calls)
        running = sum(s.stop_reason == "interrupted" for s in rows)
        t0 = time.perf_counter()
        with self.timeline.span("generate", worker=self.name, version=self.engine.version, rows=running):
            out = self.engine.resume(rows, self.params, seed=seed, refill=lambda n: self._should_refill(n, running))
        self._busy_s += time.perf_counter() - t0
        self._tokens += sum(len(b.response_ids) - len(a.response_ids) for a, b in zip(rows, out))
        self._prefill += self.engine.last_prefill
        with self._books:
            i = 0
            for g in groups:
                g.samples = out[i : i + len(g.samples)]
                i += len(g.samples)
            self.counts["interrupted_rows"] += sum(s.stop_reason == "interrupted" for s in out)
        finished = [g for g in groups if g.finished]
        with self.timeline.span("reward", worker=self.name):  # rule rewards as each group finishes, before the queue
            self.scorer.score([s for g in finished for s in g.samples])
        with self._books:
            for g in finished:
                self.ledger.generated(g.group_id)

    def _should_refill(self, n_active: int, n_rows: int) -> bool:
        """Cut a decode short when its long tail left at most half the rows running and a new group could start:
        the rows continue in the next call, batched with the new ones (same weights, so no version is mixed)."""
        if n_active > n_rows // 2 or len(self.inflight) >= self.max_groups or not self.controller.can_start():
            return False
        with self._books:
            self.counts["refills"] += 1
        return True

    def _put_finished(self) -> bool:
        """Queue finished groups in start order; False if none could be queued (queue full, or none finished)."""
        moved = False
        for gid in [g.group_id for g in self.inflight.values() if g.finished]:
            group = self.inflight[gid]
            while True:
                with self._books:  # the put and its bookkeeping are one step for the driver's calls
                    res = self.queue.put(
                        Group(gid, group.epoch, group.index, group.start_version, group.samples), timeout=POLL_S
                    )
                    if res.accepted:
                        self._queued(group, res.dropped)
                        break
                with self._cv:
                    if self._want_park or self._stop:
                        return moved  # stays in flight (finished); queued after the park
            moved = True
        return moved

    def _queued(self, group: InFlightGroup, dropped: tuple[str, ...]) -> None:
        gid = group.group_id
        self.controller.on_queued(gid)
        del self.inflight[gid]
        self.ledger.queued(gid)
        self.processing_s[gid] = time.time() - group.started_at
        self.counts["queued_groups"] += 1
        if dropped:
            self.controller.on_dropped(dropped)
            self.ledger.dropped(dropped)
            self.counts["dropped_groups"] += len(dropped)
            self.counts["dropped_stale_samples"] += len(dropped) * self.params.n
            for d in dropped:
                self.processing_s.pop(d, None)

    def _check_alive(self) -> None:
        if self._error is not None:
            raise RollouterError(f"the rollouter's generation thread failed: {self._error!r}") from self._error

    # ---- driver calls ----------------------------------------------------------------------------------------------
    def get_batch(self, n_groups: int, trainer_version: int) -> StreamBatch:
        """The oldest ``n_groups`` queued groups for one trainer step at ``trainer_version``, with their staleness.

        Blocks until they are there (the trainer's idle time); raises if the generation thread died or nothing arrived
        within ``async_training.get_batch_timeout_s``.
        """
        timeout_s = self.cfg.async_training.get_batch_timeout_s
        deadline = time.monotonic() + timeout_s
        while True:
            self._check_alive()
            groups = self.queue.get_batch(n_groups, timeout=0.5)
            if groups is not None:
                break
            if time.monotonic() > deadline:
                raise RollouterError(
                    f"get_batch: no {n_groups} groups within {timeout_s:g} s (queued {len(self.queue)}, "
                    f"in flight {len(self.inflight)}, admission headroom "
                    f"{self.controller.admission_limit() - self.controller.live_groups()})"
                )
        ids = [g.group_id for g in groups]
        staleness = self.controller.on_consumed(ids, trainer_version)
        with self._books:
            self.ledger.consumed(ids)
            proc = [self.processing_s.pop(g, 0.0) for g in ids]
            self.counts["consumed_groups"] += len(ids)
        return StreamBatch(groups, staleness, proc)

    def pause(self, interrupt: bool) -> float:
        """Hold the generation thread at its park point; ``interrupt`` stops a running decode at its next step.

        Returns the seconds it took to park (without ``interrupt``: the rest of the running decode); raises after
        ``async_training.pause_timeout_s``.
        """
        timeout_s = self.cfg.async_training.pause_timeout_s
        t0 = time.perf_counter()
        with self._cv:
            self._want_park = True
        if interrupt:
            self.engine.request_pause()
        with self._cv:
            ok = self._cv.wait_for(lambda: self._parked, timeout_s)
        self.engine.clear_pause()
        self._check_alive()
        if not ok:
            raise RollouterError(f"pause: the generation thread did not park within {timeout_s:g} s")
        return time.perf_counter() - t0

    def resume_generation(self, version: int) -> None:
        """Let the parked thread go on, generating with ``version`` (the weights just received)."""
        if self.engine.version != version:
            raise RollouterError(f"resume_generation({version}): the engine holds version {self.engine.version}")
        self.controller.on_sync(version)
        with self._cv:
            self._want_park = False
            self._cv.notify_all()

    def snapshot(self) -> RollouterSnapshot:
        """Everything a resumed run needs, taken while parked (or before ``start``): queue, in-flight rows,
        controller, ledger, cursor."""
        with self._cv:
            if self._thread is not None and not self._parked:
                raise RollouterError("snapshot: call pause() first (a snapshot of a running loop is inconsistent)")
        with self._books:
            return RollouterSnapshot(
                queue=self.queue.snapshot(),
                inflight=list(self.inflight.values()),
                controller=self.controller.state_dict(),
                ledger=self.ledger.state_dict(),
                sampler=self.sampler.state_dict(),
                processing_s=dict(self.processing_s),
                counts=dict(self.counts),
                calls=self._calls,
                engine_version=self.engine.version,
                skip=tuple(sorted(self.skip)),
            )

    def restore(self, state: RollouterSnapshot | Takeover) -> None:
        """Load a snapshot before ``start``; the engine must already hold the snapshot's weights version. A
        ``Takeover`` (a dead Rollouter's last snapshot and what the trainer consumed since) replays the consumption
        on top (``asyncrl.streaming.recovery``); the engine then holds the takeover's, newer, version."""
        if self._thread is not None:
            raise RollouterError("restore: only before start()")
        take = state if isinstance(state, Takeover) else Takeover(state, [], state.engine_version)
        if self.engine.version != take.version or take.version < take.snapshot.engine_version:
            raise RollouterError(
                f"restore: the snapshot was taken at version {take.snapshot.engine_version} (to continue at "
                f"{take.version}) but the engine holds {self.engine.version}; sync the checkpoint's weights first"
            )
        state = advance(take, self.budget) if take.consumed else take.snapshot
        self.controller.load_state_dict(state.controller)
        self.controller.on_sync(take.version)
        self.ledger.load_state_dict(state.ledger)
        self.skip = set(state.skip)
        self.queue.restore(state.queue)
        self.sampler.load_state_dict(state.sampler)
        self.inflight = {g.group_id: g for g in state.inflight}
        self.processing_s = dict(state.processing_s)
        self.counts = Counter(state.counts)
        self._calls = int(state.calls)

    def take_metrics(self) -> dict[str, float]:
        """Counters and the idle ratio since the previous call (``rollouter/idle_ratio``)."""
        now = time.perf_counter()
        window = max(now - self._window_start, 1e-9)
        idle = max(0.0, 1.0 - self._busy_s / window)
        tokens_per_s = self._tokens / self._busy_s if self._busy_s > 0 else 0.0
        self._busy_s, self._tokens, self._window_start = 0.0, 0, now
        with self._books:
            c = self.counts
            out = {f"fully_async/count/{k}": float(v) for k, v in sorted(c.items())}
            out["fully_async/count/queue_size"] = float(len(self.queue))
            out["fully_async/count/in_flight_groups"] = float(len(self.inflight))
        out["rollouter/idle_ratio"] = idle
        out["rollouter/busy_s"], out["perf/rollout_tokens_per_s"] = window * (1.0 - idle), tokens_per_s
        out.update(self._prefill.metrics())  # a group's blank rows share one prompt's prefill
        self._prefill = PrefillStats()
        out.update(self.controller.metrics())
        return out

    def ledger_state(self) -> dict[str, Any]:
        with self._books:
            return self.ledger.state_dict()

    def stop(self) -> None:
        with self._cv:
            self._stop = True
            self._cv.notify_all()
        self.engine.request_pause()
        self.queue.close()
        if self._thread is not None:
            self._thread.join(timeout=STOP_JOIN_S)
        self.engine.clear_pause()


def _blank(prompt: Prompt, version: int) -> Sample:
    """A row not started yet: the engine's ``resume`` continues it from the prompt."""
    return Sample(prompt, [], [], [], stop_reason="interrupted", start_version=version)
