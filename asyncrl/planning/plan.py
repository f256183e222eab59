"""``asyncrl plan --cost cost.json --gpus N [--nodes M]`` (or ``--cpus C``): search the schedules, the rollout /
trainer split, the staleness threshold and the sync interval on the simulator; print the best few with their
predicted speed-up over a colocated sync on the same devices and the config overrides that run them. Coarse then
fine: ``search_steps`` simulated steps of the pipelined schedules on every split and of fully_async's knobs on the
best ``SPLITS`` of those splits (on all when no pipelined schedule is asked for); the best ``refine`` again for
``steps``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from asyncrl.config.schema import SCHEDULES
from asyncrl.planning.cost import CostModel
from asyncrl.planning.simulate import Cluster, Prediction, Setting, simulate

STALENESS = (0.0, 0.5, 1.0)
PIPELINED = ("one_step_off", "two_step_off")
SPLITS = 3  # the splits whose fully_async knobs are searched
SYNC_EVERY = (1, 2, 4)


def splits(cluster: Cluster) -> list[tuple[int, int]]:
    """(rollout, trainer) device counts a placement can hold: on one node any split; on several, either whole nodes
    per role or the same share of every node (each pool is one bundle per node)."""
    if cluster.kind == "cpu":
        c = cluster.cores
        return sorted({(1, c), (1, max(1, c - 1))} | ({(c // 2, c - c // 2)} if c >= 4 else set()))
    g, m = cluster.gpus_per_node, cluster.nodes
    if m == 1:
        step = max(1, g // 8)
        return [(r, g - r) for r in range(step, g, step)]
    return sorted({(k * g, (m - k) * g) for k in range(1, m)} | {(a * m, (g - a) * m) for a in range(1, g)})


def candidates(cluster: Cluster, schedules: tuple[str, ...]) -> list[Setting]:
    out: list[Setting] = []
    if "sync" in schedules:
        out.append(Setting("sync", trainer=cluster.devices))
    for r, t in splits(cluster):
        out += [Setting(sched, trainer=t, rollout=r) for sched in PIPELINED if sched in schedules]
        if "fully_async" in schedules:
            for s in STALENESS:
                for k in SYNC_EVERY:
                    for partial in (False, True) if s > 0 else (False,):  # staleness 0: nothing runs at a sync
                        out.append(Setting("fully_async", t, r, s, k, 1, partial))
    return out


def overrides(setting: Setting, cluster: Cluster) -> list[str]:
    """The config overrides that run ``setting`` on ``cluster``."""
    s = setting
    over = [f"trainer.schedule={s.schedule}"]
    if cluster.kind == "cpu":
        over.append(f"trainer.cpus_per_worker={s.trainer}")
        if s.schedule == "sync":
            over.append(f"ray.num_cpus={cluster.cores}")
        else:
            over += ["rollout.num_workers=1", f"rollout.cpus_per_worker={s.rollout}"]
            over.append(f"ray.num_cpus={s.trainer + s.rollout}")
    elif s.schedule == "sync":
        over += [f"trainer.nnodes={cluster.nodes}", f"trainer.n_gpus_per_node={cluster.gpus_per_node}"]
    else:
        g, m = cluster.gpus_per_node, cluster.nodes
        if m == 1 or s.rollout % m == 0 and s.trainer % m == 0 and s.rollout // m < g:
            rn, tn, rg, tg = m, m, s.rollout // m, s.trainer // m
        else:  # whole nodes per role
            rn, tn, rg, tg = s.rollout // g, s.trainer // g, g, g
        over += [f"trainer.nnodes={tn}", f"trainer.n_gpus_per_node={tg}"]
        over += [f"rollout.nnodes={rn}", f"rollout.n_gpus_per_node={rg}"]
    if s.schedule == "fully_async":
        over += [
            f"async_training.staleness_threshold={s.staleness_threshold:g}",
            f"async_training.trigger_parameter_sync_step={s.trigger_parameter_sync_step}",
            f"async_training.require_batches={s.require_batches}",
            f"async_training.partial_rollout={'true' if s.partial_rollout else 'false'}",
        ]
    return over


@dataclass
class Plan:
    cluster: Cluster
    sync: Prediction
    ranked: list[Prediction]  # best first
    searched: int


def make_plan(
    cost: CostModel,
    cluster: Cluster,
    schedules: tuple[str, ...] = SCHEDULES,
    steps: int = 30,
    search_steps: int = 6,
    refine: int = 6,
) -> Plan:
    cands = candidates(cluster, schedules)
    piped = [(simulate(cost, cluster, c, search_steps), c) for c in cands if c.schedule in PIPELINED]
    best: dict[tuple[int, int], float] = {}
    for p, c in piped:
        best[c.rollout, c.trainer] = max(best.get((c.rollout, c.trainer), 0.0), p.samples_per_s)
    keep = set(sorted(best, key=lambda k: -best[k])[:SPLITS]) if best else None
    streams = [c for c in cands if c.schedule == "fully_async" and (keep is None or (c.rollout, c.trainer) in keep)]
    coarse = piped + [(simulate(cost, cluster, c, search_steps), c) for c in streams]
    coarse.sort(key=lambda pc: -pc[0].samples_per_s)
    fine = [simulate(cost, cluster, c, steps) for _, c in coarse[:refine]]
    sync = simulate(cost, cluster, Setting("sync", trainer=cluster.devices), steps)
    ranked = sorted([*fine, *([sync] if "sync" in schedules else [])], key=lambda p: -p.samples_per_s)
    return Plan(cluster, sync, ranked, len(piped) + len(streams) + 1)


def format_plan(plan: Plan, top: int) -> str:
    c = plan.cluster
    where = f"{c.cores} shared cores" if c.kind == "cpu" else f"{c.nodes} node(s) x {c.gpus_per_node} GPUs"
    lines = [
        f"plan for {where}: {plan.searched} settings searched; sync (colocated) predicted "
        f"{plan.sync.step_s:.3f} s per step, {plan.sync.samples_per_s:.1f} samples/s",
        "",
        "| rank | setting | step s | samples/s | vs sync | trainer idle | rollout idle | staleness mean/max "
        "| partial |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for i, p in enumerate(plan.ranked[:top], 1):
        r = p.row(plan.sync)
        lines.append(
            f"| {i} | {r['setting']} | {p.step_s:.3f} | {p.samples_per_s:.1f} | {r['ratio_to_sync']:.2f}x | "
            f"{p.trainer_idle:.0%} | {p.rollout_idle:.0%} | {r['staleness_mean']:.2f}/{r['staleness_max']} | "
            f"{p.partial_share:.0%} |"
        )
    lines.append("")
    for i, p in enumerate(plan.ranked[:top], 1):
        lines.append(f"{i}. asyncrl train --config YOUR.yaml " + " ".join(overrides(p.setting, c)))
    return "\n".join(lines)


def draw(plan: Plan, path: Path, window: int = 6) -> None:
    """The best plan's predicted timeline against sync's, ``window`` steps from the third on."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    best = plan.ranked[0]
    shown = [plan.sync] if best is plan.sync else [plan.sync, best]
    fig = Figure(figsize=(12, 2.2 * len(shown) + 0.6))
    FigureCanvasAgg(fig)
    colors = {
        "generate": "#4c78a8",
        "reward": "#72b7b2",
        "train": "#f58518",
        "prepare": "#54a24b",
        "sync_weights": "#e45756",
        "wait_batch": "#bab0ac",
        "step_other": "#d3d3d3",
    }
    axes = fig.subplots(len(shown), 1, squeeze=False)[:, 0]
    for ax, p in zip(axes, shown):
        ends = p.step_ends
        t0 = ends[1] if len(ends) > 2 else 0.0
        t1 = ends[min(len(ends) - 1, 1 + window)]
        workers = sorted({s.worker for s in p.spans})
        for y, w in enumerate(workers):
            for s in p.spans:
                if s.worker == w and s.end > t0 and s.start < t1:
                    ax.broken_barh(
                        [(s.start - t0, s.end - s.start)], (y - 0.4, 0.8), color=colors.get(s.name, "#999999")
                    )
        for e in ends:
            if t0 <= e <= t1:
                ax.axvline(e - t0, color="black", lw=0.5, ls=":")
        ax.set_yticks(range(len(workers)), workers)
        ax.set_xlim(0, t1 - t0)
        ax.set_title(f"{p.setting.label()}: {p.step_s:.3f} s/step predicted", fontsize=9)
    axes[-1].set_xlabel("seconds (virtual clock)")
    handles = [__import__("matplotlib.patches").patches.Patch(color=v, label=k) for k, v in colors.items()]
    fig.legend(handles=handles, loc="upper right", fontsize=7, ncol=len(colors))
    fig.tight_layout(rect=(0, 0, 1, 0.93))
    fig.savefig(path, dpi=110)
