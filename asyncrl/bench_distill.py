"""``asyncrl bench --distill``: the distillation schedulers on the same work, in one invocation, against ``serial``.

Same teacher and student (``configs/distill.yaml``'s, or the ``model.path`` / ``teacher.model_path`` overrides),
data, seeds, number of samples and total CPUs for every scheduler; only the order of events differs. ``serial`` gives
all cores to one colocated worker (generate, then teacher, then update); ``one_step_off`` and ``two_step_off`` give
the trainer all cores too and add one single-threaded rollout worker (one extra logical CPU in Ray's accounting), as
``asyncrl bench`` does for the RL modes. The teacher server is the same separate process (``teacher.server_threads``)
for all three.

Per scheduler: samples/s and tokens/s over the steps' wall seconds (the first step left out), the ratio to serial,
mean seconds per step of generation, teacher scoring and update (measured where they run, overlapped or not), the
overlap limit from serial's own timings (one_step_off hides generation behind teacher + update: (g + t + u) /
max(g, t + u); two_step_off runs the three at once: (g + t + u) / max(g, t, u)), the trainer's idle fraction, the
staleness, the last step's distillation loss and the held-out accuracy after the last step.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from asyncrl.bench import markdown_table, run_overrides
from asyncrl.config import ConfigError, load_config
from asyncrl.telemetry.metrics import read_metrics
from asyncrl.telemetry.timeline import idle_fraction, read_chrome_trace

SCHEDULERS = ("serial", "one_step_off", "two_step_off")
BASE_CONFIG = "configs/distill.yaml"


def scheduler_overrides(scheduler: str, total_cpus: int) -> list[str]:
    if scheduler not in SCHEDULERS:
        raise ValueError(f"bench --distill: unknown scheduler {scheduler!r} (allowed: {', '.join(SCHEDULERS)})")
    if scheduler == "serial":
        return ["trainer.scheduler=serial", f"trainer.cpus_per_worker={total_cpus}", f"ray.num_cpus={total_cpus}"]
    return [
        f"trainer.scheduler={scheduler}",
        f"trainer.cpus_per_worker={total_cpus}",
        "rollout.num_workers=1",
        "rollout.cpus_per_worker=1",
        f"ray.num_cpus={total_cpus + 1}",
    ]


def run_distill_bench(
    schedulers: list[str], out: str, steps: int, total_cpus: int, extra: list[str]
) -> list[dict[str, Any]]:
    from asyncrl.pipelines import run_pipeline
    from asyncrl.workers.cluster import shutdown

    if "serial" not in schedulers:
        schedulers = ["serial", *schedulers]  # every ratio is to serial measured in this same invocation
    for s in schedulers:
        scheduler_overrides(s, total_cpus)
    out_dir = Path(out)
    out_dir.mkdir(parents=True, exist_ok=True)
    results: list[dict[str, Any]] = []
    ref = None
    for s in schedulers:
        run_dir = out_dir / f"distill_{s}"
        over = [
            *run_overrides(run_dir, steps),
            *extra,
            *scheduler_overrides(s, total_cpus),
        ]
        cfg = load_config(BASE_CONFIG, ["trainer.mode=distill", *over])
        models = [("model.path", cfg.model.path)] + (
            [] if cfg.teacher.url else [("teacher.model_path", cfg.teacher.model_path)]
        )
        for key, path in models:
            if not Path(str(path)).is_dir():
                raise ConfigError(
                    f"bench --distill: {key}={path} is not a model directory; build the example's teacher and "
                    "student first (README, 'Distillation') or pass model.path=... teacher.model_path=..."
                )
        run_pipeline(cfg)
        shutdown()
        res = summarize_distill(s, run_dir, ref)
        ref = ref or res
        results.append(res)
    load = os.getloadavg()
    for r in results:
        r["loadavg_1m"] = round(load[0], 2)
    (out_dir / "bench_distill.json").write_text(json.dumps(results, indent=2) + "\n")
    table = markdown_table(results, COLUMNS, first="scheduler")
    (out_dir / "bench_distill.md").write_text(table)
    print(table)
    return results


def summarize_distill(scheduler: str, run_dir: Path, serial: dict[str, Any] | None) -> dict[str, Any]:
    steps = [m for m in read_metrics(run_dir / "metrics.jsonl") if m["step"] >= 1 and "timing_s/step" in m]
    body = steps[1:] if len(steps) > 2 else steps
    step_s = sum(m["timing_s/step"] for m in body)

    def mean(key: str) -> float:
        return sum(m.get(key, 0.0) for m in body) / len(body)

    events = read_chrome_trace(run_dir / "timeline.json")
    trainer = "trainer"
    spans = [e for e in events if e["worker"] == "driver" and e["name"] == "update_actor"]
    t0 = min(e["start_s"] for e in events if e["worker"] == "driver" and e.get("step") == body[0]["step"])
    t1 = max(e["end_s"] for e in spans)
    res: dict[str, Any] = {
        "scheduler": scheduler,
        "steps": len(body),
        "samples_per_s": sum(m["perf/samples_per_s"] * m["timing_s/step"] for m in body) / step_s,
        "tokens_per_s": sum(m["perf/throughput_tokens_per_s"] * m["timing_s/step"] for m in body) / step_s,
        "mean_step_s": step_s / len(body),
        "gen_s": mean("timing_s/gen"),
        "teacher_s": mean("timing_s/get_teacher_knowledge"),
        "update_s": mean("timing_s/update_actor"),
        "wait_prev_gen_s": mean("timing_s/wait_prev_gen"),
        "wait_prev_teacher_s": mean("timing_s/wait_prev_teacher"),
        "trainer_idle_fraction": idle_fraction(events, trainer, t0, t1),
        "staleness_mean": mean("fully_async/staleness/mean"),
        "kl_loss_last": steps[-1].get("actor/kl_loss"),
        "accuracy": steps[-1].get("val/accuracy"),
    }
    ref = serial or res
    g, t, u = ref["gen_s"], ref["teacher_s"], ref["update_s"]
    total = g + t + u
    stages = {"serial": (total,), "one_step_off": (g, t + u), "two_step_off": (g, t, u)}[scheduler]
    res["overlap_limit"] = total / max(stages)
    res["ratio_to_serial"] = res["samples_per_s"] / ref["samples_per_s"]
    res["limit_fraction"] = res["ratio_to_serial"] / res["overlap_limit"]
    return res


COLUMNS = [
    ("samples_per_s", "{:.1f}"),
    ("tokens_per_s", "{:.0f}"),
    ("ratio_to_serial", "{:.2f}x"),
    ("overlap_limit", "{:.2f}x"),
    ("limit_fraction", "{:.2f}"),
    ("mean_step_s", "{:.2f}"),
    ("gen_s", "{:.2f}"),
    ("teacher_s", "{:.2f}"),
    ("update_s", "{:.2f}"),
    ("wait_prev_gen_s", "{:.2f}"),
    ("wait_prev_teacher_s", "{:.2f}"),
    ("trainer_idle_fraction", "{:.2f}"),
    ("staleness_mean", "{:.2f}"),
    ("kl_loss_last", "{:.3f}"),
    ("accuracy", "{:.3f}"),
]
