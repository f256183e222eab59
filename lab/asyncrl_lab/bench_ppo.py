"""``asyncrl bench --modes ppo_colocated,ppo_split``: PPO with a critic, one pool vs split placement, same work.

Both runs are ``algorithm.name=ppo`` on ``trainer.schedule=sync`` with the same data, SFT-warmed model, seeds,
samples per step and total CPUs (2 by default); only the placement differs. colocated puts every role on one pool of
all the CPUs (the calls take turns, each using every core); split gives the actor (and the rollout in its worker)
half and the critic the other half, and runs ``update_actor`` and ``update_critic`` at once. Figures per placement
(the first step is left out: one-off costs):

- ``mean_step_s``: mean wall seconds per step; ``ratio_to_colocated``: colocated's mean step / this placement's;
- ``update_wall_s``: wall seconds of the update phase (both calls issued -> both joined);
- ``update_busy_s``: update_actor + update_critic seconds as measured on the workers;
- ``overlap_s`` = busy - wall, clipped at 0: worker-seconds the overlap hid (0 when the calls take turns);
- ``gen_s``, ``prepare_s``: generation and (old log-probs | values) seconds.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from asyncrl.config import load_config
from asyncrl_lab.bench_common import Workload, mean_of, rate, run_one, run_overrides, step_metrics, write_results

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
    _, body = step_metrics(run_dir)
    return {
        "placement": mode,
        "steps": len(body),
        "mean_step_s": mean_of(body, "timing_s/step"),
        "samples_per_s": rate(body, "perf/samples_per_s"),
        "gen_s": mean_of(body, "timing_s/gen"),
        "prepare_s": mean_of(body, "timing_s/prepare"),
        "update_actor_s": mean_of(body, "timing_s/update_actor"),
        "update_critic_s": mean_of(body, "timing_s/update_critic"),
        "update_wall_s": mean_of(body, "timing_s/train"),  # the driver's wait for both updates
        "update_busy_s": mean_of(body, "timing_s/update_actor") + mean_of(body, "timing_s/update_critic"),
        "overlap_s": mean_of(body, "perf/update_overlap_s"),
        "vf_explained_var": mean_of(body, "critic/vf_explained_var"),
    }


def run_ppo_bench(
    modes: list[str], wl: Workload, out_dir: Path, steps: int, total_cpus: int, extra: list[str]
) -> list[dict[str, Any]]:
    results = []
    for mode in modes:
        run_dir = out_dir / f"{wl.name}_{mode}"
        over = [
            *wl.data_overrides(),
            *run_overrides(run_dir, steps),
            *wl.train_overrides,
            "algorithm.name=ppo",
            "trainer.schedule=sync",
            *_placement(mode, total_cpus),
            *extra,
        ]
        run_one(load_config(PPO_MODES[mode], over))
        results.append(summarize_ppo(mode, run_dir))
    base = next((r for r in results if r["placement"] == "ppo_colocated"), results[0])
    for r in results:
        r["workload"] = wl.name
        r["ratio_to_colocated"] = base["mean_step_s"] / r["mean_step_s"]
    write_results(results, out_dir, "bench_ppo", COLUMNS)
    return results


COLUMNS = [
    ("placement", "{}"),
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
