"""``asyncrl profile`` and ``asyncrl plan``: their argument parsers and what they do (the CLI module registers them)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any


def add_parsers(sub: Any) -> None:
    s = sub.add_parser("profile", help="fit a cost model (cost.json) from a finished run's timeline and metrics")
    s.add_argument("run_dir")
    s.add_argument("--probe", action="store_true", help="also measure thread scaling, prefill and weight-sync cost")
    s.add_argument("--out", default=None, help="where to write the cost model (default RUN_DIR/cost.json)")
    s.set_defaults(fn=profile_command)

    s = sub.add_parser("plan", help="search schedule, split, staleness and sync interval for a cluster on a profile")
    s.add_argument("--cost", required=True, help="a cost.json from asyncrl profile")
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
    from asyncrl.schedules.perf.profile import profile_run

    cost = profile_run(a.run_dir, probe=a.probe)
    out = Path(a.out) if a.out else Path(a.run_dir) / "cost.json"
    cost.save(out)
    print("\n".join(cost.describe()))
    print(f"wrote {out}")


def _cluster(a: argparse.Namespace):
    from asyncrl.config import ConfigError
    from asyncrl.schedules.perf.simulate import Cluster

    kw = {"device_speed": a.device_speed}
    if a.sync_gbps is not None:
        kw["sync_bytes_per_s"] = a.sync_gbps * 1e9
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
    from asyncrl.schedules.perf.cost import CostModel
    from asyncrl.schedules.perf.plan import draw, format_plan, make_plan, overrides
    from asyncrl.schedules.perf.simulate import SCHEDULES

    cost = CostModel.load(a.cost)
    schedules = tuple(x.strip() for x in a.schedules.split(",") if x.strip())
    bad = [x for x in schedules if x not in SCHEDULES]
    if bad or "sync" not in schedules:
        raise ConfigError(f"plan: --schedules {a.schedules!r}: each of {', '.join(SCHEDULES)}, sync included")
    plan = make_plan(cost, _cluster(a), schedules, steps=a.steps)
    print(format_plan(plan, a.top))
    if a.out:
        draw(plan, Path(a.out))
        print(f"wrote {a.out}")
    if a.json:
        rows = [{**p.row(plan.sync), "overrides": overrides(p.setting, plan.cluster)} for p in plan.ranked]
        Path(a.json).write_text(json.dumps(rows, indent=1) + "\n")
