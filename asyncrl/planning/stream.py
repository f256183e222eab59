"""``fully_async`` on the virtual clock, both its loops the run's own (``schedules.fully_async.loop``): the
Rollouter's (``loop.produce``) over ``SimRollouter``, the real ``Producer`` deciding what each rank decodes, and the
driver's (``loop.consume``) over ``StreamSimPorts``. A rank's streaming engine is priced per step and per admission,
never at the batch decoder's per-call cost (docs/performance.md, "The streaming decoder"); the clock jumps from one
row's end to the next, where the producer places the next group at once, as the real engines do. An ended row is
scored on the pool's cores beside the decode; its group completes when it is scored."""

from __future__ import annotations

import copy
from collections.abc import Callable

from asyncrl.data.dataset import EpochSampler
from asyncrl.planning.clock import Compute, Delay, Signal, Wait
from asyncrl.planning.cost import Segment, prefill_tokens
from asyncrl.planning.setting import Span
from asyncrl.planning.slots import SimRank, SimRow
from asyncrl.schedules.fully_async import loop
from asyncrl.schedules.fully_async.loop import Hold
from asyncrl.schedules.fully_async.producer import Producer
from asyncrl.schedules.fully_async.recovery import ConsumedBatch, Takeover
from asyncrl.schedules.fully_async.slots import queue_for, stream_concurrency
from asyncrl.schedules.loops import Steps
from asyncrl.types import Prompt, Sample

PIECE_STEPS = 16  # the clock jumps at most this many decode steps at a time, so a pause lands within them


class SimRollouter:
    """``loop.produce``'s ports on the clock, priced as this module says: one Rollouter's life (a fault ends it:
    ``held.stop``), its books the real ``Producer`` (restored from ``take`` when it takes over). ``version``: the
    weights its engines hold. ``sim``: the ``simulate.Sim`` whose clock, prices, work and signals these use."""

    def __init__(self, sim: StreamSim, version: int, take: Takeover | None = None):
        st, cost, budget = sim.setting, sim.cost, sim.budget
        self.sim, self.version, self.held = sim, version, Hold()
        # rows one engine streams at once, its own ``capacity``: vLLM's max_num_seqs (when set), else max_batch_size
        rows = cost.max_num_seqs if cost.engine == "vllm" and cost.max_num_seqs else cost.max_batch_size
        capacities, max_groups = stream_concurrency(rows, cost.n, sim.prices.replicas, st.max_inflight_groups)
        self.ranks = [SimRank(c) for c in capacities]
        self.scoring: list[tuple[Sample, Callable[[Sample], None]]] = []
        sampler = EpochSampler(sim.dataset_size, 1, seed=sim.seed, shuffle=True)
        complete = lambda sample, done: self.scoring.append((sample, done))  # noqa: E731
        args = (budget, queue_for(st, budget), sampler, _sim_prompt, cost.n, capacities, max_groups)
        self.books = Producer(*args, clock=lambda: sim.clock.now, complete=complete)
        if take is not None:
            self.books.restore(take)

    def hold(self) -> Hold:
        return self.held

    def turns(self) -> int:
        return 0

    def interrupt(self) -> None:
        """Partial rollout: every rank's rows back to their groups, with what they have."""
        for k, rank in enumerate(self.ranks):
            back = []
            for r in [r for _, _, r in rank.live] + rank.waiting:
                made = min(r.need, rank.t - r.start) if r.start >= 0 else 0  # a waiting row made nothing
                back.append(_row(r, made, self.version, "eos" if made >= r.need else "interrupted"))
            rank.live, rank.waiting, rank.used, rank.debt, rank.carry = [], [], [], 0.0, 0.0
            self.books.returned(k, back)

    def submit(self, rank: int, rows: list[Sample]) -> None:
        """Rows enter rank ``rank`` (a slot at its next step, or wait for one): it owes their prefill (a blank group's
        rows share one) before that step."""
        prefixes, r = [], self.ranks[rank]
        for x in rows:
            p, lengths = self.sim.work.group(x.prompt.epoch, x.prompt.index)
            done = len(x.response_ids)
            r.waiting.append(SimRow(x, max(0, lengths[x.row] - done), -1))
            prefixes.append((x.prompt.uid if done == 0 else None, p + done))
        r.debt += self._admission_s(prefill_tokens(prefixes, self.sim.cost.engine), len(rows))
        r.fill()

    def advance(self) -> Steps[list[list[Sample]]]:
        """Every rank decodes (its prefill debt first) until the first row on any ends (at most ``PIECE_STEPS``
        steps: a pause lands within them); returns the rows that ended, per rank. A Rollouter that died meanwhile
        loses that work."""
        sim = self.sim
        if not self.books.rows_out():
            return [[] for _ in self.ranks]
        t0, version, dt = sim.clock.now, self.version, self._next_event()
        yield Compute(dt, sim.prices.gen_threads, sim.prices.pool)
        if self.held.stop:
            return [[] for _ in self.ranks]
        sim.spans.append(Span("rollout", "generate", t0, sim.clock.now, len(sim.step_ends) + 1))
        out: list[list[Sample]] = []
        for rank in self.ranks:
            pay = min(rank.debt, dt)
            rank.debt -= pay
            left = dt - pay
            ended: list[Sample] = []
            if rank.live and left > 0:
                steps = left / self._step_s(rank) + rank.carry
                whole = int(steps + 1e-6)
                rank.carry = max(0.0, steps - whole)
                ended = [_row(r, r.need, version, "eos") for r in rank.step_to(rank.t + whole)]
                if not rank.live:
                    rank.carry = 0.0
            out.append(ended)
        return out

    def decoding(self) -> bool:
        return any(rank.live for rank in self.ranks)

    def put(self) -> bool:
        """The rows that ended go to the reward loop (and rows a restore handed to their completion again); the
        finished groups to the queue: one of them may be the one the trainer waits for."""
        if self.scoring:
            batch, self.scoring = self.scoring, []
            self.sim.clock.spawn(self._scorer(batch, len(self.sim.step_ends) + 1))
        return self._put()

    def _put(self) -> bool:
        queued = self.books.put_finished(0.0)
        if queued:
            self.sim.clock.fire(self.sim.queued)
        return queued

    def park(self) -> Steps[None]:
        sim = self.sim
        self._put()
        sim.clock.fire(sim.parked)
        sim.resumed.fired = False
        yield Wait(sim.resumed)

    def idle(self) -> Steps[None]:
        self.sim.admission.fired = False
        yield Wait(self.sim.admission)

    def _scorer(self, batch: list[tuple[Sample, Callable[[Sample], None]]], step: int) -> Steps[None]:
        """The reward loop scoring the rows that ended at one decode step, on the pool's cores beside the decode
        (``Producer.complete``); their groups complete when it is done. Rows of a Rollouter that died meanwhile are
        the replacement's to score."""
        sim = self.sim
        yield from sim.busy("rollout", "reward", step, Compute(sim.cost.reward(row=len(batch)), 1.0, sim.prices.pool))
        if self.held.stop:
            return
        for sample, done in batch:
            done(sample)
        self._put()
        sim.clock.fire(sim.admission)

    def _step_s(self, rank: SimRank) -> float:
        """Seconds of one decode step of ``rank``: vLLM's runs its live rows, the built-in engine's every slot in use
        (free ones between live ones included)."""
        cost, prices = self.sim.cost, self.sim.prices
        rows = len(rank.live) if cost.engine == "vllm" else len(rank.used)
        sc = cost.scaling
        if sc.stream_step_s is not None and sc.stream_row_s is not None:  # probed: the streaming decoder's own
            return (sc.stream_step_s + sc.stream_row_s * rows) * prices.stream_factor
        return prices.segments_cost(Segment(1, rows, 0), 1)

    def _admission_s(self, tokens: int, rows: int) -> float:
        """Seconds a streaming engine spends taking ``rows`` in: their prefill (``tokens``, one forward) and their
        place in the slots. Not the batch decoder's per-call cost (``decode.call``: the setup of a whole ``generate``
        call, which a running stream never pays again). Probed: what taking rows in cost the streaming decoder
        (``asyncrl probe``), scaled to the Rollouter's threads as the probe timed it."""
        cost, prices = self.sim.cost, self.sim.prices
        sc = cost.scaling
        if sc.stream_admit_s is not None and sc.stream_admit_token_s is not None:
            seconds = sc.stream_admit_s + sc.stream_admit_token_s * tokens + sc.stream_admit_row_s * rows
            return seconds * prices.admit_factor
        return cost.decode.get("prefill_token") * tokens * prices.stream_factor

    def _next_event(self) -> float:
        """Seconds (at full speed) until the first row on any rank ends, at most PIECE_STEPS steps of that rank (a
        pause lands within them)."""
        best = float("inf")
        for rank in self.ranks:
            if rank.live:
                k = rank.live[0][0] - rank.t
                steps = max(0.0, min(k, PIECE_STEPS) - rank.carry)
                best = min(best, rank.debt + steps * self._step_s(rank))
        return best


def _row(r: SimRow, made: int, version: int, reason: str) -> Sample:
    x = r.sample
    n = len(x.response_ids) + made
    versions = x.versions + [version] if made else x.versions
    return Sample(x.prompt, range(n), [], versions, reason, x.start_version, row=x.row)


class StreamSim:
    """The fully_async methods of ``simulate.Sim`` (which holds the clock, prices, work, budget and spans)."""

    def fully_async(self) -> Steps[None]:
        """The driver's loop of ``schedules.fully_async`` (``loop.consume``) over ports on the clock, beside the
        Rollouter's (``loop.produce``)."""
        self.parked, self.resumed = Signal("parked"), Signal("resumed")
        self.queued, self.admission = Signal("queued"), Signal("admission")
        self._start_rollouter(0)
        yield from loop.consume(StreamSimPorts(self))  # looked up at run time: the loop the run runs today
        self.rollouter.held.stop = True
        self.clock.fire(self.resumed)
        self.clock.fire(self.admission)

    def _start_rollouter(self, version: int, take: Takeover | None = None) -> None:
        if take is not None:  # taking over from the last one, dead: what it decodes meanwhile is lost
            self.rollouter.held.stop = True
        self.rollouter = SimRollouter(self, version, take)
        self.producer = self.rollouter.books
        self.clock.spawn(loop.produce(self.rollouter))
        self.clock.fire(self.admission)


def _sim_prompt(epoch: int, index: int) -> Prompt:
    return Prompt(index, [0], "sim", "")


class StreamSimPorts:
    """``loop.consume``'s ports (``loop.StreamPorts``) on the clock. A fault (``Fault``) kills the run and resumes it
    from its last checkpoint, or replaces the Rollouter mid-run, as ``recovery`` does. ``sim``: the ``simulate.Sim``
    whose clock, prices, work, books and Rollouter these drive."""

    def __init__(self, sim: StreamSim):
        self.sim = sim
        self.version, self.updates = 0, 0
        self.W = sim.setting.trigger_parameter_sync_step
        # the books a fault restores from (a Rollouter's snapshot at each sync): taken only when a fault is simulated
        self.base = sim.producer.snapshot(0) if sim.fault else None
        self.since_base: list[ConsumedBatch] = []
        self.checkpoint: tuple | None = None

    def steps(self):
        step = 0
        while self.updates < self.sim.steps:  # a simulated kill rewinds ``updates`` to its checkpoint's
            step += 1
            yield step

    def take(self, step: int):
        sim, t0 = self.sim, self.sim.clock.now
        while (got := sim.producer.take(sim.budget.groups_per_update, self.version, 0.0)) is None:
            sim.queued.fired = False
            yield Wait(sim.queued)
        if sim.clock.now > t0:
            sim.spans.append(Span("driver", "wait_batch", t0, sim.clock.now, step))
        sim.clock.fire(sim.admission)
        return got

    def prepare(self, got, step: int):
        """The batch's work (its groups' lengths) prepared, with the batch it came from (``train`` books it)."""
        groups = [self.sim.work.group(g.epoch, g.index) for g in got.groups]
        yield from self.sim.prepare("driver", step, groups)
        return got, groups

    def train(self, prepared, step: int):
        """The update, then its books (before a push: a checkpoint taken there holds them)."""
        sim, (got, groups) = self.sim, prepared
        yield from sim.train(step, groups)
        for g, counted in zip(got.groups, got.staleness):
            recorded = max(self.version - x.start_version for x in g.samples)
            sim.consumed.append((g.group_id, counted, recorded))
            sim.staleness[counted] += len(g.samples)
            sim.partial += sum(len(set(x.versions)) > 1 for x in g.samples)
        self.since_base.append(ConsumedBatch(got.groups, self.version))
        self.updates += 1

    def window_ended(self) -> bool:
        return self.updates % self.W == 0

    def push(self, step: int):
        sim, held = self.sim, self.sim.rollouter.held
        self.version += 1
        t1 = sim.clock.now
        held.park, held.interrupt = True, sim.setting.partial_rollout
        sim.parked.fired = False
        sim.clock.fire(sim.admission)  # an idle Rollouter reaches its park point (the real one polls)
        yield Wait(sim.parked)
        yield Delay(sim.prices.stream_push_s)
        sim.spans.append(Span("sync", "sync_weights", t1, sim.clock.now, step))
        sim.producer.on_sync(self.version)
        self.base, self.since_base = (sim.producer.snapshot(self.version) if sim.fault else None), []
        fault = sim.fault
        if fault and fault.kind == "kill" and self.updates >= fault.after_update and self.checkpoint is None:
            self.checkpoint = (copy.deepcopy(self.base), self.updates, self.version, len(sim.consumed))
        sim.rollouter.version, held.park = self.version, False
        sim.clock.fire(sim.resumed)
        sim.clock.fire(sim.admission)

    def end_step(self, step: int, got, prepared, trained):
        sim = self.sim
        yield from sim.end_step(step, sum(len(g.samples) for g in got.groups))
        fault = sim.fault
        if fault and fault.kind == "kill" and self.checkpoint and self.updates >= sim.steps - 1 and not sim.faulted:
            sim.faulted = True  # kill -9 late in the run: all after the checkpoint is lost; resume from it
            snap, self.updates, self.version, n_consumed = self.checkpoint
            del sim.consumed[n_consumed:]
            sim._start_rollouter(self.version, Takeover(copy.deepcopy(snap), [], self.version))
            self.base, self.since_base = copy.deepcopy(snap), []
        elif fault and fault.kind == "takeover" and self.updates == fault.after_update and not sim.faulted:
            sim.faulted = True  # the Rollouter dies; a new one restores the last snapshot + what was consumed
            sim._start_rollouter(self.version, Takeover(self.base, list(self.since_base), self.version))
