"""``fully_async`` on the virtual clock: the real producer (``Producer.to_decode`` / ``finish_decode`` /
``put_finished`` / ``take`` with the real ``StalenessController``, ``MessageQueue``, ``PromptLedger``, refill rule and
partial-rollout pause), the engine replaced by the priced ``decode``; the driver's loop is
``schedules.fully_async``'s. ``StreamSim`` is the part of ``simulate.Sim`` that runs it."""

from __future__ import annotations

import copy

from asyncrl.data.sampler import EpochSampler
from asyncrl.schedules.fully_async.producer import Producer
from asyncrl.schedules.fully_async.queue import MessageQueue
from asyncrl.schedules.fully_async.recovery import ConsumedBatch, Takeover
from asyncrl.schedules.perf.clock import Clock, Compute, Delay, Signal, Wait
from asyncrl.schedules.perf.decode import Row, decode
from asyncrl.schedules.perf.setting import Span
from asyncrl.types import Prompt, Sample


class StreamSim:
    """The fully_async methods of ``simulate.Sim`` (which holds the clock, prices, work, budget and books)."""

    # fully_async: the real producer on the clock
    def new_producer(self) -> Producer:
        st, cost = self.setting, self.cost
        budget = self.budget
        queue = MessageQueue(st.max_queue_size or budget.groups_per_window_budget, st.drop_policy)
        sampler = EpochSampler(self.dataset_size, 1, seed=self.seed, shuffle=True)
        max_groups = st.max_inflight_groups or max(1, cost.max_batch_size * self.prices.replicas // cost.n)
        return Producer(budget, queue, sampler, _sim_prompt, cost.n, max_groups, clock=lambda: self.clock.now)

    def rollouter(self, producer: Producer, life: int):
        """The Rollouter's loop (``Rollouter._run``) on the clock; it ends when a fault replaced it (``life``)."""
        cost, s = self.cost, self.state
        while not s["stop"] and s["life"] == life:
            if s["park"]:
                self.clock.fire(self.parked)
                Clock.clear(self.resumed)
                yield Wait(self.resumed)
                continue
            groups, rows = producer.to_decode()
            if not groups:
                if producer.put_finished(0.0):
                    self.clock.fire(self.queued)
                    continue
                Clock.clear(self.admission)
                yield Wait(self.admission)
                continue
            plan: list[Row] = []
            live: list[int] = []
            for g in groups:
                p, rs = self.work.group(g.epoch, g.index)
                blank = all(len(x.response_ids) == 0 for x in g.samples)
                shared = next(self._keys) if blank else -1  # a blank group's rows share one prefill
                for k, x in enumerate(g.samples):
                    if x.stop_reason == "interrupted":
                        live.append(len(plan))
                        plan.append(Row(rs[k] - len(x.response_ids), p + len(x.response_ids), shared))
                    else:
                        plan.append(Row(0, 0, -1))
            t0 = self.clock.now
            version = s["version"]
            out = yield from decode(
                self.prices,
                [plan[i] for i in live],
                stop=lambda: s["park"] and s["interrupt"],
                refill=producer.should_refill,
            )
            if s["life"] != life:  # died during the decode: its work is lost
                return
            self.spans.append(Span("rollout", "generate", t0, self.clock.now, len(self.step_ends) + 1))
            made = dict(zip(live, out.tokens))
            done = dict(zip(live, out.finished))
            new_rows: list[Sample] = []
            for i, x in enumerate(rows):
                if i in made:
                    n = len(x.response_ids) + made[i]
                    vs = x.versions + [version] if made[i] else x.versions
                    x = Sample(x.prompt, range(n), x.logprobs, vs, "eos" if done[i] else "interrupted", x.start_version)
                new_rows.append(x)
            finished = producer.finish_decode(groups, new_rows, lambda _s: None)
            n_fin = sum(len(g.samples) for g in finished)
            if n_fin:
                yield from self.busy("rollout", "reward", len(self.step_ends) + 1,
                                     Compute(cost.reward(row=n_fin), 1.0, self.prices.pool))  # fmt: skip
                if s["life"] != life:
                    return
            if producer.put_finished(0.0):
                self.clock.fire(self.queued)

    def fully_async(self):
        """The driver's loop of ``schedules.fully_async``: take a batch, prepare, train; at the end of a sync window
        park the Rollouter (interrupting its decode with partial rollout), send the weights, resume it. A fault
        (``Fault``) kills the run and resumes it from its last checkpoint, or replaces the Rollouter mid-run, as
        ``recovery`` does."""
        st, p, fault = self.setting, self.prices, self.fault
        s = self.state = {"version": 0, "park": False, "interrupt": False, "stop": False, "life": 0}
        self.parked, self.resumed = Signal("parked"), Signal("resumed")
        self.queued, self.admission = Signal("queued"), Signal("admission")
        producer = self.producer = self.new_producer()
        self.clock.spawn(self.rollouter(producer, 0))
        version, B, W = 0, self.budget.groups_per_update, st.trigger_parameter_sync_step
        # the books a fault restores from (a Rollouter's snapshot at each sync): taken only when a fault is simulated
        base, since_base = (producer.snapshot(0) if fault else None), []
        checkpoint = None
        updates = 0
        step = 0
        while updates < self.steps:
            step += 1
            t0 = self.clock.now
            while (got := producer.take(B, version, 0.0)) is None:
                Clock.clear(self.queued)
                yield Wait(self.queued)
            if self.clock.now > t0:
                self.spans.append(Span("driver", "wait_batch", t0, self.clock.now, step))
            self.clock.fire(self.admission)
            yield from self.trainer_step_tail(step, [self.work.group(g.epoch, g.index) for g in got.groups])
            n = sum(len(g.samples) for g in got.groups)
            for g, counted in zip(got.groups, got.staleness):
                recorded = max(version - x.start_version for x in g.samples)
                self.consumed.append((g.group_id, counted, recorded))
                self.staleness[counted] += len(g.samples)
                self.partial += sum(len(set(x.versions)) > 1 for x in g.samples)
            since_base.append(ConsumedBatch(got.groups, version))
            updates += 1
            if updates % W == 0:  # the window ends: park, send, resume
                version += 1
                t1 = self.clock.now
                s["park"], s["interrupt"] = True, st.partial_rollout
                Clock.clear(self.parked)
                self.clock.fire(self.admission)  # an idle Rollouter reaches its park point (the real one polls)
                yield Wait(self.parked)
                yield Delay(p.sync_s)
                self.spans.append(Span("sync", "sync_weights", t1, self.clock.now, step))
                producer.controller.on_sync(version)
                base, since_base = (producer.snapshot(version) if fault else None), []
                if fault and fault.kind == "kill" and updates >= fault.after_update and checkpoint is None:
                    checkpoint = (copy.deepcopy(base), updates, version, len(self.consumed))
                s["version"], s["park"] = version, False
                self.clock.fire(self.resumed)
                self.clock.fire(self.admission)
            yield from self.end_step(step, n)
            if fault and fault.kind == "kill" and checkpoint and updates >= self.steps - 1 and not self.faulted:
                self.faulted = True  # kill -9 late in the run: all after the checkpoint is lost; resume from it
                snap, updates, version, n_consumed = checkpoint
                del self.consumed[n_consumed:]
                producer = self._replace_rollouter(Takeover(copy.deepcopy(snap), [], version), version)
                base, since_base = copy.deepcopy(snap), []
            elif fault and fault.kind == "takeover" and updates == fault.after_update and not self.faulted:
                self.faulted = True  # the Rollouter dies; a new one restores the last snapshot + what was consumed
                producer = self._replace_rollouter(Takeover(base, list(since_base), version), version)
        s["stop"] = True
        self.clock.fire(self.resumed)
        self.clock.fire(self.admission)

    def _replace_rollouter(self, take: Takeover, version: int) -> Producer:
        s = self.state
        s["life"] += 1
        s["version"], s["park"] = version, False
        producer = self.producer = self.new_producer()
        producer.restore(take)
        self.clock.spawn(self.rollouter(producer, s["life"]))
        self.clock.fire(self.admission)
        return producer


def _sim_prompt(epoch: int, index: int) -> Prompt:
    return Prompt(index, [0], "sim", "")
