"""``asyncrl bench`` with every overlapped schedule on one core each (trainer 1 thread, rollout 1 thread, Ray 2 CPUs)
instead of bench's default (trainer 2 threads + a 1-thread rollout worker sharing the cores); sync unchanged. Frozen
policy (lr 1e-12), demo workload, 20 steps. From the repo root:
``HF_HUB_OFFLINE=1 .venv/bin/python examples/bench/split_cores.py``
"""

from __future__ import annotations

import asyncrl.tools.bench as bench

default_overrides = bench.schedule_overrides


def one_core_each(schedule: str, total_cpus: int) -> list[str]:
    over = default_overrides(schedule, total_cpus)
    if schedule in ("sync", bench.UNSHARED):
        return over
    return [*over, "trainer.cpus_per_worker=1", "ray.num_cpus=2"]


if __name__ == "__main__":
    bench.schedule_overrides = one_core_each
    modes = ["sync", "one_step_off", "two_step_off", "fully_async"]
    bench.run_bench(modes, "demo", "runs/exp_split", 20, "runs/bench_work", 2, None, ["actor.optim.lr=1e-12"])
