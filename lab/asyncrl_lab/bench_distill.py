"""``asyncrl bench --distill``: distillation on every schedule it overlaps with, on the same work, in one invocation,
against ``sync``.

Same teacher and student (``configs/distill.yaml``'s, or the ``model.path`` / ``teacher.model_path`` overrides),
data, seeds, number of samples and total CPUs for every schedule; only the order of events differs. ``sync`` gives
all cores to one worker (generate, then teacher, then update); ``one_step_off`` and ``two_step_off`` give the trainer
all cores too and add one single-threaded rollout worker (one extra logical CPU in Ray's accounting), as
``asyncrl bench`` does for GRPO. The teacher server is the same separate process (``teacher.server_threads``) for all
three.

Per schedule: samples/s and tokens/s over the steps' wall seconds (the first step left out), the ratio to sync, mean
seconds per step of generation, teacher scoring and update (measured where they run, overlapped or not), the overlap
limit from sync's own timings (one_step_off hides generation behind teacher + update: (g + t + u) / max(g, t + u);
two_step_off runs the three at once: (g + t + u) / max(g, t, u)), the trainer's idle fraction, the staleness
(``staleness/mean``), the last step's distillation loss and the held-out accuracy after the last step.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from asyncrl.config import SCHEDULES as ALL_SCHEDULES
from asyncrl.config import ConfigError, load_config
from asyncrl.telemetry.timeline import read_chrome_trace
from asyncrl_lab.bench_common import (
    RATE_COLUMNS,
    mean_of,
    rate,
    run_one,
    run_overrides,
    set_ratios,
    step_metrics,
    trainer_idle_fraction,
    write_results,
)

SCHEDULES = tuple(s for s in ALL_SCHEDULES if s != "fully_async")  # distillation runs on the batch schedules
BASE_CONFIG = "configs/distill.yaml"


def schedule_overrides(schedule: str, total_cpus: int) -> list[str]:
    if schedule not in SCHEDULES:
        hint = " (serial is now called sync)" if schedule == "serial" else ""
        raise ConfigError(f"bench --distill: unknown schedule {schedule!r}{hint} (allowed: {', '.join(SCHEDULES)})")
    if schedule == "sync":
        return ["trainer.schedule=sync", f"trainer.cpus_per_worker={total_cpus}", f"ray.num_cpus={total_cpus}"]
    return [
        f"trainer.schedule={schedule}",
        f"trainer.cpus_per_worker={total_cpus}",
        "rollout.num_workers=1",
        "rollout.cpus_per_worker=1",
        f"ray.num_cpus={total_cpus + 1}",
    ]


def run_distill_bench(
    schedules: list[str], out: str, steps: int, total_cpus: int, extra: list[str]
) -> list[dict[str, Any]]:
    if "sync" not in schedules:
        schedules = ["sync", *schedules]  # every ratio is to sync measured in this same invocation
    for s in schedules:
        schedule_overrides(s, total_cpus)  # unknown schedules fail before any work starts
    out_dir = Path(out)
    out_dir.mkdir(parents=True, exist_ok=True)
    results: list[dict[str, Any]] = []
    ref = None
    for s in schedules:
        run_dir = out_dir / f"distill_{s}"
        over = [
            "algorithm.name=distill",
            *run_overrides(run_dir, steps),
            *extra,
            *schedule_overrides(s, total_cpus),
        ]
        cfg = load_config(BASE_CONFIG, over)
        models = [("model.path", cfg.model.path)] + (
            [] if cfg.teacher.url else [("teacher.model_path", cfg.teacher.model_path)]
        )
        for key, path in models:
            if not Path(str(path)).is_dir():
                raise ConfigError(
                    f"bench --distill: {key}={path} is not a model directory; build the example's teacher and "
                    "student first (`make distill`) or pass model.path=... teacher.model_path=..."
                )
        run_one(cfg)
        res = summarize_distill(s, run_dir, ref)
        ref = ref or res
        results.append(res)
    write_results(results, out_dir, "bench_distill", COLUMNS, first="schedule")
    return results


def summarize_distill(schedule: str, run_dir: Path, sync_ref: dict[str, Any] | None) -> dict[str, Any]:
    steps, body = step_metrics(run_dir)
    res: dict[str, Any] = {
        "schedule": schedule,
        "steps": len(body),
        "samples_per_s": rate(body, "perf/samples_per_s"),
        "tokens_per_s": rate(body, "perf/throughput_tokens_per_s"),
        "mean_step_s": mean_of(body, "timing_s/step"),
        "gen_s": mean_of(body, "timing_s/gen"),
        "teacher_s": mean_of(body, "timing_s/get_teacher_knowledge"),
        "update_s": mean_of(body, "timing_s/update_actor"),
        "wait_prev_gen_s": mean_of(body, "timing_s/wait_prev_gen"),
        "wait_prev_prepare_s": mean_of(body, "timing_s/wait_prev_prepare"),
        "trainer_idle_fraction": trainer_idle_fraction(read_chrome_trace(run_dir / "timeline.json"), body),
        "staleness_mean": mean_of(body, "staleness/mean"),
        "kl_loss_last": steps[-1].get("actor/kl_loss"),
        "accuracy": steps[-1].get("val/accuracy"),
    }
    ref = sync_ref or res
    g, t, u = ref["gen_s"], ref["teacher_s"], ref["update_s"]
    total = g + t + u
    stages = {"sync": (total,), "one_step_off": (g, t + u), "two_step_off": (g, t, u)}[schedule]
    set_ratios(res, ref, overlap_limit=total / max(stages))
    return res


COLUMNS = [
    *RATE_COLUMNS,
    ("mean_step_s", "{:.2f}"),
    ("gen_s", "{:.2f}"),
    ("teacher_s", "{:.2f}"),
    ("update_s", "{:.2f}"),
    ("wait_prev_gen_s", "{:.2f}"),
    ("wait_prev_prepare_s", "{:.2f}"),
    ("trainer_idle_fraction", "{:.2f}"),
    ("staleness_mean", "{:.2f}"),
    ("kl_loss_last", "{:.3f}"),
    ("accuracy", "{:.3f}"),
]
