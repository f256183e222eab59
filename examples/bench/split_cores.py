"""``asyncrl bench`` with every overlapped schedule on one core each (``+split``: trainer 1 thread, rollout 1 thread,
Ray 2 CPUs) instead of bench's default (trainer 2 threads + a 1-thread rollout worker sharing the cores); sync
unchanged. Frozen policy (lr 1e-12), demo workload, 20 steps. From the repo root:
``HF_HUB_OFFLINE=1 .venv/bin/python examples/bench/split_cores.py``, the same as
``asyncrl bench --modes sync,one_step_off+split,two_step_off+split,fully_async+split --workload demo --steps 20
--out runs/exp_split actor.optim.lr=1e-12``.
"""

from __future__ import annotations

from asyncrl_lab.bench import run_bench

if __name__ == "__main__":
    modes = ["sync", "one_step_off+split", "two_step_off+split", "fully_async+split"]
    run_bench(modes, "demo", "runs/exp_split", 20, "runs/bench_work", 2, None, ["actor.optim.lr=1e-12"])
