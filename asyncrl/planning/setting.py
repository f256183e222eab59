"""What the simulator is told: the cluster (``Cluster``), one run's schedule and knobs (``Setting``), what it answers
(``Prediction``, ``Span``), the cost model's prices for one setting on one cluster (``Prices``) and the work, drawn
from the profiled run's own groups (``Work``)."""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from asyncrl.planning.cost import CostModel, Segment, update_positions


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
    def cpu(cores: int, **kw) -> Cluster:
        return Cluster("cpu", cores=cores, **kw)

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
    max_inflight_groups: int = 0  # 0: one per slot of the ranks (slots.stream_concurrency), as the Rollouter does
    max_queue_size: int = 0  # 0: the staleness window's budget, as the Rollouter does
    drop_policy: str = "backpressure"
    staleness_rule: str = "exact"  # exact | budget (verl's order): async_training.staleness_rule

    @staticmethod
    def from_config(cfg) -> Setting:
        """The setting a config runs: its schedule, each role's threads (CPU) or GPUs, the fully_async knobs."""
        t, r, at = cfg.trainer, cfg.rollout, cfg.async_training
        on_gpu = t.n_gpus_per_node > 0

        def units(role) -> int:
            return (
                role.nnodes * role.n_gpus_per_node if on_gpu else max(1, int(role.cpus_per_worker)) * role.num_workers
            )

        return Setting(
            schedule=t.schedule,
            trainer=units(t),
            rollout=0 if t.schedule == "sync" else units(r),
            staleness_threshold=float(at.staleness_threshold),
            staleness_rule=str(at.staleness_rule),
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
                f", staleness {self.staleness_threshold:g}"
                f"{' (budget rule)' if self.staleness_rule == 'budget' else ''}"
                f", sync every {self.trigger_parameter_sync_step}"
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
        st = self.staleness
        out: dict[str, object] = {
            "setting": self.setting.label(),
            "step_s": round(self.step_s, 4),
            "samples_per_s": round(self.samples_per_s, 2),
            "trainer_idle": round(self.trainer_idle, 3),
            "rollout_idle": round(self.rollout_idle, 3),
            "staleness_mean": round(sum(k * v for k, v in st.items()) / max(1.0, sum(st.values())), 3),
            "staleness_max": max(st, default=0),
            "partial_share": round(self.partial_share, 3),
        }
        if sync is not None:
            out["ratio_to_sync"] = round(self.samples_per_s / sync.samples_per_s, 3)
        return out


class Prices:
    """The cost model's prices for one setting on one cluster."""

    def __init__(self, cost: CostModel, cluster: Cluster, setting: Setting):
        self.cost, self.cluster, self.setting = cost, cluster, setting
        sc = cost.scaling
        speed = max(cluster.device_speed, 1e-9)
        gen_units = setting.trainer if setting.schedule == "sync" else setting.rollout  # threads (cpu) or devices (gpu)
        if cluster.kind == "cpu":
            self.gen_factor = sc.speed("gen", cost.gen_threads) / sc.speed("gen", gen_units)
            # a streaming engine's step scales with threads as the probe measured it (else as generation does)
            self.stream_factor = sc.speed("stream", cost.gen_threads) / sc.speed("stream", gen_units)
            self.admit_factor = sc.speed("admit", cost.gen_threads) / sc.speed("admit", gen_units)
            self.train_factor = sc.speed("train", cost.train_threads) / sc.speed("train", setting.trainer)
            if setting.schedule != "sync":  # several pools: their idle OpenMP threads sleep (the probe's shared_train)
                self.train_factor /= sc.shared_train or 1.0
            self.replicas, self.gen_threads, self.train_threads = 1, float(gen_units), float(setting.trainer)
            self.pool: str | None = "shared"
            par, one = sc.oversubscribed_parallel, sc.oversubscribed_single
            self.oversubscribed: tuple[float, float] | None = None if par is None or one is None else (par, one)
        else:
            # generation: one replica per device as profiled (rows split over them); training: tokens split
            self.replicas = max(1, gen_units // max(1, cost.gen_threads))
            self.gen_factor = self.stream_factor = self.admit_factor = 1.0 / speed
            self.train_factor = cost.train_threads / setting.trainer / speed
            self.gen_threads = self.train_threads = 0.0
            self.pool = None
            self.oversubscribed = None
        fixed = cluster.sync_fixed_s if cluster.sync_fixed_s is not None else sc.sync_fixed_s
        bw = cluster.sync_bytes_per_s if cluster.sync_bytes_per_s is not None else sc.sync_bytes_per_s
        self.sync_s = fixed + cost.weight_bytes / bw
        probed = cluster.kind == "cpu" and sc.stream_push_s is not None  # timed on this machine's roles
        self.stream_push_s = sc.stream_push_s if probed else self.sync_s  # fully_async's push, beyond the park

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
    """The profiled run's own groups: the k-th prompt the simulated run asks for is the profiled run's k-th, in its
    data order (a long tail's few long groups land where they landed); past the end of the profile, groups drawn
    (seeded, with replacement) from them."""

    def __init__(self, cost: CostModel, seed: int):
        self.cost, self.rng = cost, random.Random(seed)
        self.drawn: dict[tuple[int, int], tuple[int, tuple[int, ...]]] = {}

    def group(self, epoch: int, index: int) -> tuple[int, tuple[int, ...]]:
        key = (epoch, index)
        if key not in self.drawn:
            groups = self.cost.groups
            k = len(self.drawn)
            self.drawn[key] = groups[k] if k < len(groups) else groups[self.rng.randrange(len(groups))]
        return self.drawn[key]

    def update_tokens(self, groups: list[tuple[int, tuple[int, ...]]]) -> float:
        return update_positions(groups, self.cost.shared_prefix) * self.cost.update_keep
