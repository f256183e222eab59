"""Every schedule's order of events on a virtual clock, with each engine and trainer call replaced by its price in a
``CostModel``, on a described cluster.

``sync``, ``one_step_off`` and ``two_step_off`` are written here as their modules' docstrings give their order of
events (each step: what waits on what). ``fully_async`` runs the real producer: ``Producer.to_decode`` /
``finish_decode`` / ``put_finished`` / ``take`` with the real ``StalenessController``, ``MessageQueue``,
``PromptLedger``, ``should_refill`` rule and partial-rollout pause, the engine replaced by ``decode`` below; the
driver's side (take, prepare, train, park the Rollouter, sync, resume) is the loop of ``schedules.fully_async``.

A decode call is priced by the engine's own structure (``cost.decode_segments``): one step per token of its
longest row, each costing a fixed part plus a part per live row; rows split by group over the rollout replicas,
which step together. A pause (partial rollout) or a refill cut stops it between steps; the rows keep what they
have and continue, re-prefilled, in a later call.

Clusters: ``Cluster.cpu(cores)``: every role shares the machine's cores (a computation on t threads among others
moves at min(1, cores / all running threads) of its alone speed; its alone speed on t threads is Amdahl's law with
the profile's measured serial fraction). ``Cluster.gpus(nodes, per_node)``: each role on devices of its own; a
phase's seconds scale with the devices it has against those the profile ran on (generation: rows split over
replicas; training: tokens split over data-parallel ranks), times ``device_speed``.
"""

from __future__ import annotations

import copy
import random
import statistics
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

from asyncrl.data.sampler import EpochSampler
from asyncrl.perf.clock import Clock, Compute, Delay, Signal, Wait
from asyncrl.perf.cost import CostModel, Segment, decode_segments
from asyncrl.schedules.fully_async.producer import Producer
from asyncrl.schedules.fully_async.queue import MessageQueue
from asyncrl.schedules.fully_async.recovery import ConsumedBatch, Takeover
from asyncrl.schedules.fully_async.staleness import StalenessBudget
from asyncrl.types import Prompt, Sample

SCHEDULES = ("sync", "one_step_off", "two_step_off", "fully_async")
PIECES = 16  # a decode call is cut into at most this many pieces per segment: a pause lands within 1/16 of it


@dataclass(frozen=True)
class Cluster:
    """Where the simulated run goes. ``kind`` "cpu": ``cores`` shared by every role; "gpu": ``nodes`` x
    ``gpus_per_node`` devices, each role on its own (a colocated sync uses all of them for both phases)."""

    kind: str = "cpu"
    cores: int = 2
    nodes: int = 1
    gpus_per_node: int = 8
    device_speed: float = 1.0  # each device's throughput against the profiled device's
    sync_bytes_per_s: float | None = None  # weight-sync bandwidth; None: the profile's probe (or 1 GB/s)
    sync_fixed_s: float | None = None

    @staticmethod
    def cpu(cores: int) -> Cluster:
        return Cluster("cpu", cores=cores)

    @staticmethod
    def gpus(total: int, nodes: int = 1, **kw) -> Cluster:
        if total % nodes:
            raise ValueError(f"--gpus {total} does not split evenly over --nodes {nodes}")
        return Cluster("gpu", nodes=nodes, gpus_per_node=total // nodes, **kw)

    @property
    def devices(self) -> int:
        return self.cores if self.kind == "cpu" else self.nodes * self.gpus_per_node


@dataclass(frozen=True)
class Setting:
    """One run: a schedule and its knobs. ``rollout``/``trainer``: threads (cpu) or devices (gpu) of each role (a
    sync run's generation runs on the trainer's)."""

    schedule: str
    trainer: int
    rollout: int = 0
    staleness_threshold: float = 0.0
    trigger_parameter_sync_step: int = 1
    require_batches: int = 1
    partial_rollout: bool = False
    max_inflight_groups: int = 0  # 0: rollout.max_batch_size // n, as the Rollouter does
    max_queue_size: int = 0  # 0: the staleness window's budget, as the Rollouter does
    drop_policy: str = "backpressure"

    @staticmethod
    def from_config(cfg) -> Setting:
        """The setting a config runs: its schedule, each role's threads (CPU) or GPUs, the fully_async knobs."""
        t, r, at = cfg.trainer, cfg.rollout, cfg.async_training
        on_gpu = t.n_gpus_per_node > 0
        trainer = t.nnodes * t.n_gpus_per_node if on_gpu else max(1, int(t.cpus_per_worker)) * t.num_workers
        if t.schedule == "sync":
            rollout = 0
        elif on_gpu:
            rollout = r.nnodes * r.n_gpus_per_node
        else:
            rollout = max(1, int(r.cpus_per_worker)) * r.num_workers
        return Setting(
            schedule=t.schedule,
            trainer=trainer,
            rollout=rollout,
            staleness_threshold=float(at.staleness_threshold),
            trigger_parameter_sync_step=int(at.trigger_parameter_sync_step),
            require_batches=int(at.require_batches),
            partial_rollout=bool(at.partial_rollout),
            max_inflight_groups=int(at.max_inflight_groups or 0),
            max_queue_size=int(at.max_queue_size or 0),
            drop_policy=str(at.drop_policy),
        )

    def label(self) -> str:
        if self.schedule == "sync":
            return f"sync ({self.trainer})"
        extra = ""
        if self.schedule == "fully_async":
            extra = (
                f", staleness {self.staleness_threshold:g}, sync every {self.trigger_parameter_sync_step}"
                f"{', partial' if self.partial_rollout else ''}"
            )
        return f"{self.schedule} ({self.rollout} gen / {self.trainer} train{extra})"


@dataclass
class Span:
    worker: str
    name: str
    start: float
    end: float
    step: int


@dataclass
class Prediction:
    setting: Setting
    steps: int
    step_s: float  # mean over the measured steps (the first left out, as the bench does)
    samples_per_s: float
    trainer_idle: float  # the share of the measured window the trainer computed nothing
    rollout_idle: float  # the same for the rollout side (0 for sync: it is the trainer)
    staleness: dict[int, int]  # staleness -> samples
    partial_share: float  # the share of trained samples written by more than one weight version
    spans: list[Span] = field(default_factory=list)
    step_ends: list[float] = field(default_factory=list)

    def row(self, sync: Prediction | None = None) -> dict[str, object]:
        out: dict[str, object] = {
            "setting": self.setting.label(),
            "step_s": round(self.step_s, 4),
            "samples_per_s": round(self.samples_per_s, 2),
            "trainer_idle": round(self.trainer_idle, 3),
            "rollout_idle": round(self.rollout_idle, 3),
            "staleness_mean": round(_mean_staleness(self.staleness), 3),
            "staleness_max": max(self.staleness) if self.staleness else 0,
            "partial_share": round(self.partial_share, 3),
        }
        if sync is not None:
            out["ratio_to_sync"] = round(self.samples_per_s / sync.samples_per_s, 3)
        return out


def _mean_staleness(st: dict[int, int]) -> float:
    n = sum(st.values())
    return sum(k * v for k, v in st.items()) / n if n else 0.0


class Prices:
    """The cost model's prices for one setting on one cluster."""

    def __init__(self, cost: CostModel, cluster: Cluster, setting: Setting):
        self.cost, self.cluster, self.setting = cost, cluster, setting
        sc = cost.scaling
        speed = max(cluster.device_speed, 1e-9)
        if cluster.kind == "cpu":
            gen_threads = setting.trainer if setting.schedule == "sync" else setting.rollout
            self.gen_factor = sc.speed("gen", cost.gen_threads) / sc.speed("gen", gen_threads)
            self.train_factor = sc.speed("train", cost.train_threads) / sc.speed("train", setting.trainer)
            self.replicas, self.gen_threads, self.train_threads = 1, float(gen_threads), float(setting.trainer)
            self.pool: str | None = "shared"
        else:
            # generation: one replica per device as profiled (rows split over them); training: tokens split
            rollout_devices = setting.trainer if setting.schedule == "sync" else setting.rollout
            self.replicas = max(1, rollout_devices // max(1, cost.gen_threads))
            self.gen_factor = 1.0 / speed
            self.train_factor = cost.train_threads / setting.trainer / speed
            self.gen_threads = self.train_threads = 0.0
            self.pool = None
        self.sync_fixed = cluster.sync_fixed_s if cluster.sync_fixed_s is not None else sc.sync_fixed_s
        bw = cluster.sync_bytes_per_s if cluster.sync_bytes_per_s is not None else sc.sync_bytes_per_s
        self.sync_s = self.sync_fixed + cost.weight_bytes / bw

    def segments_cost(self, seg: Segment, tokens: int) -> float:
        d = self.cost.decode
        return (d.get("step") + d.get("token") * seg.live) * tokens * self.gen_factor

    def call_s(self, prefill_tokens: float) -> float:
        d = self.cost.decode
        return (d.get("call") + d.get("prefill_token") * prefill_tokens) * self.gen_factor

    def train_s(self, tokens: float) -> float:
        c = self.cost
        return (c.update(call=1.0, token=tokens) + c.train_other(call=1.0, token=tokens)) * self.train_factor


# ---- the work: groups drawn from the profile -------------------------------------------------------------------------
class Work:
    """Prompt groups drawn (seeded, with replacement) from the profiled run's own groups."""

    def __init__(self, cost: CostModel, seed: int):
        self.cost, self.rng = cost, random.Random(seed)
        self.drawn: dict[tuple[int, int], tuple[int, tuple[int, ...]]] = {}

    def group(self, epoch: int, index: int) -> tuple[int, tuple[int, ...]]:
        key = (epoch, index)
        if key not in self.drawn:
            self.drawn[key] = self.cost.groups[self.rng.randrange(len(self.cost.groups))]
        return self.drawn[key]

    def update_tokens(self, groups: list[tuple[int, tuple[int, ...]]]) -> float:
        full = 0
        for p, rs in groups:
            full += (p + sum(rs)) if self.cost.shared_prefix else sum(p + r for r in rs)
        return full * self.cost.update_keep


# ---- decode on the clock ---------------------------------------------------------------------------------------------
@dataclass
class Row:
    need: int  # tokens still to generate
    prefix: int  # tokens to prefill before it continues
    shared: int  # a blank row's group id (rows of one blank group share one prefill); -1 when resumed


@dataclass
class Decoded:
    tokens: list[int]  # tokens each row generated in this call
    finished: list[bool]
    seconds: float


def split_rows(rows: list[Row], replicas: int) -> list[list[int]]:
    """Rows by group (``shared``) into ``replicas`` contiguous shares of about equal size, as ``split_by_group``."""
    if replicas <= 1:
        return [list(range(len(rows)))]
    out: list[list[int]] = [[] for _ in range(replicas)]
    target, k, i = len(rows) / replicas, 0, 0
    while i < len(rows):
        j = i + 1
        while j < len(rows) and rows[j].shared >= 0 and rows[j].shared == rows[i].shared:
            j += 1
        if k < replicas - 1 and out[k] and len(out[k]) + (j - i) / 2 > target:
            k += 1
        out[k].extend(range(i, j))
        i = j
    return out


def decode(
    clock: Clock,
    prices: Prices,
    rows: list[Row],
    stop: Callable[[], bool] = lambda: False,
    refill: Callable[[int, int], bool] | None = None,
):
    """A process fragment (``yield from``): one engine call over ``rows`` split over the replicas, in chunks of
    ``max_batch_size`` rows per replica. ``stop()`` (a pause) and ``refill(n_active, n_rows)`` are checked between
    pieces; both cut the call there. Returns ``Decoded``."""
    t0 = clock.now
    got = [0] * len(rows)
    shares = split_rows(rows, prices.replicas)
    mbs = prices.cost.max_batch_size
    # every replica's chunks run one after another; the replicas step together
    plans = []
    for share in shares:
        chunks = [share[i : i + mbs] for i in range(0, len(share), mbs)]
        plans.append(chunks)
    n_calls = max((len(chunks) for chunks in plans), default=0)
    cut = False
    for c in range(n_calls):
        chunk_rows = [chunks[c] if c < len(chunks) else [] for chunks in plans]
        prefill = max(_prefill_tokens([rows[i] for i in ch]) for ch in chunk_rows)
        yield Compute(prices.call_s(prefill), prices.gen_threads, prices.pool)
        per_rep = [decode_segments([rows[i].need for i in ch]) for ch in chunk_rows]
        order = [sorted(ch, key=lambda i: rows[i].need) for ch in chunk_rows]
        # the union of every replica's segment boundaries: between two, each replica's live batch is constant
        bounds = sorted({0} | {b for segs in per_rep for b in _ends(segs)})
        n0 = len(chunk_rows[0])
        for a, b in zip(bounds, bounds[1:]):
            piece = max(1, (b - a) // PIECES)
            t = a
            while t < b:
                u = min(b, t + piece)
                cost = max((prices.segments_cost(_seg_at(segs, t), u - t) for segs in per_rep if _seg_at(segs, t)),
                           default=0.0)  # fmt: skip
                yield Compute(cost, prices.gen_threads, prices.pool)
                t = u
                if t < b and stop():
                    cut = True
                    break
            for ch in chunk_rows:
                for i in ch:
                    got[i] = min(rows[i].need, t)
            if cut:
                break
            active0 = sum(1 for i in order[0] if rows[i].need > t)
            if stop() or (refill is not None and active0 and refill(active0, n0)):
                cut = any(rows[i].need > t for ch in chunk_rows for i in ch)
                if cut:
                    break
        if cut:
            break
    finished = [got[i] >= rows[i].need for i in range(len(rows))]
    return Decoded(got, finished, clock.now - t0)


def _prefill_tokens(rows: list[Row]) -> float:
    seen: set[int] = set()
    total = 0
    for r in rows:
        if r.shared >= 0:
            if r.shared in seen:
                continue
            seen.add(r.shared)
        total += r.prefix
    return float(total)


def _ends(segs: list[Segment]) -> list[int]:
    out, t = [], 0
    for s in segs:
        t += s.tokens
        out.append(t)
    return out


def _seg_at(segs: list[Segment], t: int) -> Segment | None:
    """The segment that decodes token ``t + 1``."""
    end = 0
    for s in segs:
        end += s.tokens
        if t < end:
            return s
    return None


# ---- the schedules ---------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Fault:
    """``kill``: the run is killed late and resumes from the checkpoint of the first sync at or after update
    ``after_update``; ``takeover``: the Rollouter dies right after update ``after_update`` and a new one takes over."""

    kind: str
    after_update: int


class Sim:
    """One simulated run. ``steps``: trainer updates; ``dataset_size``: prompts per epoch of the fully_async
    producer's sampler (shuffled with ``seed``; default: more than the run draws)."""

    def __init__(
        self,
        cost: CostModel,
        cluster: Cluster,
        setting: Setting,
        steps: int,
        seed: int = 0,
        dataset_size: int | None = None,
        fault: Fault | None = None,
    ):
        if setting.schedule not in SCHEDULES:
            raise ValueError(f"no schedule {setting.schedule!r} (known: {', '.join(SCHEDULES)})")
        self.cost, self.cluster, self.setting, self.steps = cost, cluster, setting, steps
        self.seed, self.fault, self.faulted = seed, fault, False
        self.consumed: list[tuple[str, int, int]] = []  # fully_async: (group, controller's staleness, rows' own)
        self._keys = 0
        self.budget = StalenessBudget(
            require_batches=setting.require_batches,
            ppo_mini_batch_size=cost.ppo_mini_batch_size,
            trigger_parameter_sync_step=setting.trigger_parameter_sync_step,
            staleness_threshold=setting.staleness_threshold,
        )
        # enough prompts that the run never wraps an epoch (a smaller set is shuffled faster than a large one)
        b = self.budget
        self.dataset_size = dataset_size or (steps + 2) * b.groups_per_update + 2 * b.groups_per_window_budget + 4096
        self.prices = Prices(cost, cluster, setting)
        self.clock = Clock(cluster.cores if cluster.kind == "cpu" else None)
        self.work = Work(cost, seed)
        self.spans: list[Span] = []
        self.step_ends: list[float] = []
        self.staleness: Counter[int] = Counter()
        self.partial = 0
        self.samples = 0

    # a timed span of a process
    def busy(self, worker: str, name: str, step: int, op):
        t0 = self.clock.now
        yield op
        self.spans.append(Span(worker, name, t0, self.clock.now, step))

    def draw_batch(self, b: int) -> list[tuple[int, tuple[int, ...]]]:
        return [self.work.group(0, b * 100_000 + i) for i in range(self.cost.prompts_per_step)]

    def generate(self, worker: str, step: int, groups: list[tuple[int, tuple[int, ...]]]):
        rows = [Row(r, p, g) for g, (p, rs) in enumerate(groups) for r in rs]
        t0 = self.clock.now
        yield from decode(self.clock, self.prices, rows)
        self.spans.append(Span(worker, "generate", t0, self.clock.now, step))
        n = len(rows)
        yield from self.busy(worker, "reward", step, Compute(self.cost.reward(row=n), 1.0, self.prices.pool))

    def trainer_step_tail(self, step: int, groups):
        p = self.prices
        yield from self.busy("driver", "prepare", step, Compute(self.cost.prepare(call=1.0), 1.0, p.pool))
        tokens = self.work.update_tokens(groups)
        yield from self.busy("trainer", "train", step, Compute(p.train_s(tokens), p.train_threads, p.pool))

    def end_step(self, step: int, n_samples: int):
        yield from self.busy("driver", "step_other", step, Compute(self.cost.step_other(call=1.0), 1.0,
                                                                      self.prices.pool))  # fmt: skip
        self.step_ends.append(self.clock.now)
        self.samples += n_samples

    # sync: generate (on the trainer), prepare, train
    def sync(self):
        for step in range(1, self.steps + 1):
            groups = self.draw_batch(step)
            yield from self.generate("trainer", step, groups)
            yield from self.trainer_step_tail(step, groups)
            self.staleness[0] += sum(len(rs) for _, rs in groups)
            yield from self.end_step(step, sum(len(rs) for _, rs in groups))

    def _rollout_worker(self, launch: list[Signal], done: list[Signal], batches: dict):
        for b in range(1, self.steps + 1):
            yield Wait(launch[b])
            yield from self.generate("rollout", b, batches[b])
            self.clock.fire(done[b])

    def _push(self, step: int):
        yield from self.busy("sync", "sync_weights", step, Delay(self.prices.sync_s))

    # one_step_off: wait for batch t, sync, launch t+1, prepare and train t
    def one_step_off(self):
        S = self.steps
        launch, done = [Signal(f"launch{b}") for b in range(S + 2)], [Signal(f"done{b}") for b in range(S + 2)]
        batches = {b: self.draw_batch(b) for b in range(1, S + 1)}
        self.clock.spawn(self._rollout_worker(launch, done, batches))
        self.clock.fire(launch[1])
        for step in range(1, S + 1):
            yield Wait(done[step])
            yield from self._push(step)
            if step < S:
                self.clock.fire(launch[step + 1])
            yield from self.trainer_step_tail(step, batches[step])
            n = sum(len(rs) for _, rs in batches[step])
            self.staleness[0 if step == 1 else 1] += n
            yield from self.end_step(step, n)

    # two_step_off: batch t+1 prepared (on a driver thread) while t trains, t+2 generated
    def two_step_off(self):
        S = self.steps
        launch, done = [Signal(f"launch{b}") for b in range(S + 3)], [Signal(f"done{b}") for b in range(S + 3)]
        prepared = [Signal(f"prepared{b}") for b in range(S + 3)]
        batches = {b: self.draw_batch(b) for b in range(1, S + 1)}
        self.clock.spawn(self._rollout_worker(launch, done, batches))

        def prepare(b: int):
            yield Wait(done[b])
            yield from self.busy("driver-prepare", "prepare", b, Compute(self.cost.prepare(call=1.0), 1.0,
                                                                          self.prices.pool))  # fmt: skip
            self.clock.fire(prepared[b])

        self.clock.fire(launch[1])
        self.clock.spawn(prepare(1))
        if S >= 2:
            self.clock.fire(launch[2])
        p = self.prices
        for step in range(1, S + 1):
            yield Wait(prepared[step])
            if step + 1 <= S:
                yield Wait(done[step + 1])
                yield from self._push(step)
                if step + 2 <= S:
                    self.clock.fire(launch[step + 2])
                self.clock.spawn(prepare(step + 1))
            tokens = self.work.update_tokens(batches[step])
            yield from self.busy("trainer", "train", step, Compute(p.train_s(tokens), p.train_threads, p.pool))
            n = sum(len(rs) for _, rs in batches[step])
            self.staleness[min(step - 1, 2)] += n
            yield from self.end_step(step, n)

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
                shared = self.next_group_key() if blank else -1  # a blank group's rows share one prefill
                for k, x in enumerate(g.samples):
                    if x.stop_reason == "interrupted":
                        live.append(len(plan))
                        plan.append(Row(rs[k] - len(x.response_ids), p + len(x.response_ids), shared))
                    else:
                        plan.append(Row(0, 0, -1))
            t0 = self.clock.now
            version = s["version"]
            out = yield from decode(
                self.clock,
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

    def next_group_key(self) -> int:
        self._keys += 1
        return self._keys

    def fully_async(self):
        """The driver's loop of ``schedules.fully_async``: take a batch, prepare, train; at the end of a sync window
        park the Rollouter (interrupting its decode with partial rollout), send the weights, resume it. A fault
        (``Fault``) kills the run and resumes it from its last checkpoint, or replaces the Rollouter mid-run, as
        ``recovery`` does."""
        st, cost, p, fault = self.setting, self.cost, self.prices, self.fault
        s = self.state = {"version": 0, "park": False, "interrupt": False, "stop": False, "life": 0}
        self.parked, self.resumed = Signal("parked"), Signal("resumed")
        self.queued, self.admission = Signal("queued"), Signal("admission")
        producer = self.producer = self.new_producer()
        self.clock.spawn(self.rollouter(producer, 0))
        version, B, W = 0, self.budget.groups_per_update, st.trigger_parameter_sync_step
        # the books a fault restores from (a Rollouter's snapshot at each sync): taken only when a fault is simulated
        base, since_base = (producer.snapshot(0, 0) if fault else None), []
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
            yield from self.busy("driver", "prepare", step, Compute(cost.prepare(call=1.0), 1.0, p.pool))
            groups = [self.work.group(g.epoch, g.index) for g in got.groups]
            train = Compute(p.train_s(self.work.update_tokens(groups)), p.train_threads, p.pool)
            yield from self.busy("trainer", "train", step, train)
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
                base, since_base = (producer.snapshot(0, version) if fault else None), []
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

    def run(self) -> Prediction:
        proc = getattr(self, self.setting.schedule)()
        done = {"trainer": False}

        def main():
            yield from proc
            done["trainer"] = True

        self.clock.spawn(main())
        self.clock.run(until=lambda: done["trainer"])
        if not done["trainer"]:
            books = self.producer.controller.metrics() if self.setting.schedule == "fully_async" else {}
            raise RuntimeError(
                f"simulation of {self.setting.label()} stalled after {len(self.step_ends)} steps {books}"
            )
        return self.prediction()

    def prediction(self) -> Prediction:
        ends = self.step_ends
        first = 1 if len(ends) > 2 else 0
        t0 = ends[first - 1] if first else 0.0
        measured = len(ends) - first
        window = ends[-1] - t0
        step_s = window / measured
        per_step = self.samples / len(ends)
        return Prediction(
            setting=self.setting,
            steps=len(ends),
            step_s=step_s,
            samples_per_s=per_step / step_s,
            trainer_idle=1.0 - _busy(self.spans, "trainer", t0, ends[-1]) / window,
            rollout_idle=0.0
            if self.setting.schedule == "sync"
            else 1.0 - _busy(self.spans, "rollout", t0, ends[-1]) / window,
            staleness=dict(sorted(self.staleness.items())),
            partial_share=self.partial / max(1, sum(self.staleness.values())),
            spans=self.spans,
            step_ends=ends,
        )


def _sim_prompt(epoch: int, index: int) -> Prompt:
    return Prompt(index, [0], "sim", "")


def _busy(spans: list[Span], worker: str, t0: float, t1: float) -> float:
    iv = sorted((max(s.start, t0), min(s.end, t1)) for s in spans if s.worker == worker and s.end > t0 and s.start < t1)
    total, cur_s, cur_e = 0.0, None, None
    for a, b in iv:
        if cur_e is None or a > cur_e:
            if cur_e is not None:
                total += cur_e - cur_s
            cur_s, cur_e = a, b
        else:
            cur_e = max(cur_e, b)
    if cur_e is not None:
        total += cur_e - cur_s
    return total


def simulate(cost: CostModel, cluster: Cluster, setting: Setting, steps: int = 30, seed: int = 0) -> Prediction:
    """One setting's run of ``steps`` steps on ``cluster``."""
    return Sim(cost, cluster, setting, steps, seed).run()


def median_step(pred: Prediction) -> float:
    ends = pred.step_ends
    return statistics.median(b - a for a, b in zip(ends, ends[1:])) if len(ends) > 1 else ends[0]
