"""``asyncrl profile`` and ``asyncrl plan``: their argument parsers and what they do (the CLI module registers them)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any


def add_parsers(sub: Any) -> None:
    s = sub.add_parser("profile", help="fit a cost model (cost.json) from a finished run's timeline and metrics")
    s.add_argument("run_dir")
    s.add_argument("--probe", action="store_true", help=argparse.SUPPRESS)  # says where the probe is
    s.add_argument("--out", default=None, help="where to write the cost model (default RUN_DIR/cost.json)")
    s.set_defaults(fn=profile_command)

    s = sub.add_parser(
        "plan",
        help="search schedule, split, staleness and sync interval for a cluster on a profile (--cost), and/or each "
        "role's memory per GPU from a model's config.json (--model)",
    )
    s.add_argument("--cost", default=None, help="a cost.json from asyncrl profile")
    s.add_argument("--model", default=None, help="a model directory (its config.json alone is read): memory plan")
    s.add_argument("--gpu-mem", type=float, default=None, help="--model: GB per GPU (default: this machine's GPU)")
    s.add_argument("--config", default=None, help="--model: a run's YAML (its trainer, actor, rollout and sync keys)")
    s.add_argument("overrides", nargs="*", help="--model: dotted key=value config overrides, as asyncrl train takes")
    s.add_argument("--gpus", type=int, default=None, help="GPUs in all")
    s.add_argument("--nodes", type=int, default=1, help="nodes the GPUs are on (evenly)")
    s.add_argument("--cpus", type=int, default=None, help="instead of GPUs: one machine whose cores every role shares")
    s.add_argument("--device-speed", type=float, default=1.0, help="each device's throughput against the profiled one")
    s.add_argument("--sync-gbps", type=float, default=None, help="weight-sync bandwidth, GB/s (default: the probe's)")
    s.add_argument("--schedules", default="sync,one_step_off,two_step_off,fully_async")
    s.add_argument("--steps", type=int, default=30, help="simulated steps per setting (the first is left out)")
    s.add_argument("--top", type=int, default=5)
    s.add_argument("--out", default=None, help="a picture: the best plan's predicted timeline against sync")
    s.add_argument("--json", default=None, help="every ranked setting with its overrides, as JSON")
    s.set_defaults(fn=plan_command)


def profile_command(a: argparse.Namespace) -> None:
    from asyncrl.planning.profile import ProfileError, profile_run

    if a.probe:  # the machine's measurement is the lab's command, which fits the profile too
        raise ProfileError(
            "profile --probe: this machine's thread scaling, prefill and weight-sync prices are measured by "
            "`asyncrl probe RUN_DIR`, a command of asyncrl's lab (lab/: `pip install -e lab`, or `make setup`); "
            "it writes the profile with them"
        )
    cost = profile_run(a.run_dir)
    out = Path(a.out) if a.out else Path(a.run_dir) / "cost.json"
    cost.save(out)
    print("\n".join(cost.describe()))
    print(f"wrote {out}")


def _cluster(a: argparse.Namespace):
    from asyncrl.config import ConfigError
    from asyncrl.planning.simulate import Cluster

    kw = {"device_speed": a.device_speed, "sync_bytes_per_s": None if a.sync_gbps is None else a.sync_gbps * 1e9}
    if (a.gpus is None) == (a.cpus is None):
        raise ConfigError("plan: give one of --gpus N (with --nodes M) or --cpus C")
    if a.cpus is not None:
        if a.cpus < 1:
            raise ConfigError(f"plan: --cpus must be >= 1, got {a.cpus}")
        return Cluster.cpu(a.cpus, **kw)
    if a.gpus < 2 or a.nodes < 1 or a.gpus % a.nodes:
        raise ConfigError(f"plan: --gpus {a.gpus} --nodes {a.nodes}: need >= 2 GPUs split evenly over the nodes")
    return Cluster.gpus(a.gpus, a.nodes, **kw)


def plan_command(a: argparse.Namespace) -> None:
    from asyncrl.config import ConfigError

    if a.cost is None and a.model is None:
        raise ConfigError("plan: give --cost COST_JSON (the time model), --model MODEL_DIR (the memory plan), or both")
    if a.model is not None and a.cpus is not None:
        raise ConfigError("plan --model: the memory plan is per GPU: give --gpus N (with --nodes M), not --cpus")
    if a.overrides and a.model is None:
        raise ConfigError(f"plan: config overrides ({' '.join(a.overrides)}) are read with --model only")
    ranked = _time_plan(a) if a.cost is not None else None
    if a.model is not None:
        _memory_plan(a, ranked)


def _time_plan(a: argparse.Namespace) -> list:
    """The time model's search; returns the settings it shows (best first)."""
    from asyncrl.config import ConfigError
    from asyncrl.planning.cost import CostModel
    from asyncrl.planning.plan import draw, format_plan, make_plan, overrides
    from asyncrl.planning.simulate import SCHEDULES

    cost = CostModel.load(a.cost)
    schedules = tuple(x.strip() for x in a.schedules.split(",") if x.strip())
    if not set(schedules) <= set(SCHEDULES) or "sync" not in schedules:
        raise ConfigError(f"plan: --schedules {a.schedules!r}: each of {', '.join(SCHEDULES)}, sync included")
    plan = make_plan(cost, _cluster(a), schedules, steps=a.steps)
    print(format_plan(plan, a.top))
    if a.out:
        draw(plan, Path(a.out))
        print(f"wrote {a.out}")
    if a.json:
        rows = [{**p.row(plan.sync), "overrides": overrides(p.setting, plan.cluster)} for p in plan.ranked]
        Path(a.json).write_text(json.dumps(rows, indent=1) + "\n")
    return [p.setting for p in plan.ranked[: a.top]]


def _memory_plan(a: argparse.Namespace, shown: list | None) -> None:
    """Each role's GB per GPU for the layouts shown: the time model's ranked settings, else sync on every GPU and
    the config's schedule (one_step_off for a sync config) on every split of the GPUs. When the config places roles
    on GPUs, its own layout is then checked as ``asyncrl train`` checks it: one that cannot fit exits with status 2
    and that one line."""
    from asyncrl.config import ConfigError, load_config
    from asyncrl.config.resources import resolve_ranks
    from asyncrl.planning.plan import splits
    from asyncrl.sizing.check import check_plan, gpu_roles, local_device_bytes
    from asyncrl.sizing.memory import plan_memory
    from asyncrl.sizing.shape import model_shape
    from asyncrl.sizing.table import format_memory

    def plan_checks(cfg) -> None:
        """Each section's own keys, and the ranks from the GPU keys. Not the cross-key checks of a run (those
        refuse what this machine's trainer cannot run; the plan is of the GPU trainer), and no dataset."""
        if not cfg.data.train_files:
            cfg.data.train_files = ["(not read by asyncrl plan)"]
        cfg.check_sections()
        resolve_ranks(cfg)

    cfg = load_config(a.config, [f"model.path={a.model}", *a.overrides], validate_fn=plan_checks)
    device = int(a.gpu_mem * 1e9) if a.gpu_mem is not None else local_device_bytes()
    if device is None:
        raise ConfigError("plan --model: this machine has no GPU to size the plan by: give --gpu-mem GB")
    if shown is not None:
        layouts = [(f"{i}. {s.label()}", s.schedule, s.trainer) for i, s in enumerate(shown, 1)]
    else:
        if a.gpus is None:
            raise ConfigError("plan --model: give --gpus N (with --nodes M)")
        sched = cfg.trainer.schedule if cfg.trainer.schedule != "sync" else "one_step_off"
        layouts = [(f"sync ({a.gpus})", "sync", a.gpus)]
        layouts += [(f"{sched} ({r} gen / {t} train)", sched, t) for r, t in splits(_cluster(a))]
    shape = model_shape(a.model)
    print()
    print(format_memory(cfg, shape, layouts, device))
    if gpu_roles(cfg):
        check_plan(plan_memory(cfg, shape, device), gpu_roles(cfg))
