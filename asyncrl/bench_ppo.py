"""``asyncrl bench --modes ppo_colocated,ppo_split``: PPO with a critic, one pool vs split placement, same work.

Both modes use the same data, SFT-warmed model, seeds, samples per step and total CPUs (2 by default): colocated puts
every role on one pool of all the CPUs (the calls take turns, each using every core); split gives actor+rollout+ref
half and the critic the other half, and runs ``update_actor`` and ``update_critic`` at once. Figures per mode (the
first step is left out: one-off costs):

- ``mean_step_s``: mean wall seconds per step; ``ratio_to_colocated``: colocated's mean step / this mode's;
- ``update_wall_s``: wall seconds of the update phase (both calls issued -> both joined);
- ``update_busy_s``: update_actor + update_critic seconds as measured on the workers;
- ``overlap_s`` = busy - wall, clipped at 0: worker-seconds the overlap hid (0 when the calls take turns);
- ``gen_s``, ``prepare_s``: generation and (old log-probs | values) seconds.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from asyncrl.bench import markdown_table, run_overrides
from asyncrl.config import load_config
from asyncrl.telemetry.metrics import read_metrics

PPO_MODES = {"ppo_colocated": "configs/ppo_colocated.yaml", "ppo_split": "configs/ppo_split.yaml"}


def _placement(mode: str, total_cpus: int) -> list[str]:
    if mode == "ppo_colocated":
        return [f"placement.pools.all.cpus={total_cpus}", f"ray.num_cpus={total_cpus}"]
    half = max(1, total_cpus // 2)
    return [
        f"placement.pools.actor_pool.cpus={half}",
        f"placement.pools.critic_pool.cpus={max(1, total_cpus - half)}",
        f"ray.num_cpus={total_cpus}",
    ]


def summarize_ppo(mode: str, run_dir: Path) -> dict[str, Any]:
    steps = [m for m in read_metrics(run_dir / "metrics.jsonl") if m["step"] >= 1 and "timing_s/step" in m]
    body = steps[1:] if len(steps) > 2 else steps

    def mean(key: str) -> float:
        return sum(m.get(key, 0.0) for m in body) / len(body)

    calls = ("timing_s/update_critic_call", "timing_s/update_actor_call", "timing_s/update_actor_critic")
    wall = sum(mean(k) for k in calls)
    return {
        "mode": mode,
        "steps": len(body),
        "mean_step_s": mean("timing_s/step"),
        "samples_per_s": sum(m["perf/samples_per_s"] * m["timing_s/step"] for m in body)
        / sum(m["timing_s/step"] for m in body),
        "gen_s": mean("timing_s/gen"),
        "prepare_s": mean("timing_s/prepare"),
        "update_actor_s": mean("timing_s/update_actor"),
        "update_critic_s": mean("timing_s/update_critic"),
        "update_wall_s": wall,
        "update_busy_s": mean("timing_s/update_actor") + mean("timing_s/update_critic"),
        "overlap_s": mean("perf/update_overlap_s"),
        "vf_explained_var": mean("critic/vf_explained_var"),
    }


def run_ppo_bench(
    modes: list[str], wl: Any, out_dir: Path, steps: int, total_cpus: int, extra: list[str]
) -> list[dict[str, Any]]:
    from asyncrl.pipelines import run_pipeline
    from asyncrl.workers.cluster import shutdown

    results = []
    for mode in modes:
        run_dir = out_dir / f"{wl.name}_{mode}"
        over = [
            f"data.train_files=[{','.join(wl.files['train'])}]",
            f"data.val_files=[{','.join(wl.files['val'])}]",
            *run_overrides(run_dir, steps),
            *wl.train_overrides,
            *_placement(mode, total_cpus),
            *extra,
        ]
        run_pipeline(load_config(PPO_MODES[mode], over))
        shutdown()
        results.append(summarize_ppo(mode, run_dir))
    base = next((r for r in results if r["mode"] == "ppo_colocated"), results[0])
    load = os.getloadavg()
    for r in results:
        r["workload"] = wl.name
        r["ratio_to_colocated"] = base["mean_step_s"] / r["mean_step_s"]
        r["loadavg_1m"] = round(load[0], 2)
    (out_dir / "bench_ppo.json").write_text(json.dumps(results, indent=2) + "\n")
    table = markdown_table(results, COLUMNS)
    (out_dir / "bench_ppo.md").write_text(table)
    print(table)
    return results


COLUMNS = [
    ("mode", "{}"),
    ("mean_step_s", "{:.2f}"),
    ("ratio_to_colocated", "{:.2f}x"),
    ("samples_per_s", "{:.1f}"),
    ("gen_s", "{:.2f}"),
    ("prepare_s", "{:.2f}"),
    ("update_actor_s", "{:.2f}"),
    ("update_critic_s", "{:.2f}"),
    ("update_wall_s", "{:.2f}"),
    ("overlap_s", "{:.2f}"),
]
