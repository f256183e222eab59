"""``asyncrl bench``: GRPO on every schedule, on the same work, in one invocation, against ``sync``.

Same data, seeds, number of samples, model and total CPUs for every schedule; only the order of events differs.
Figures per schedule (all ratios computed from runs in this one invocation, because the machine is shared and noisy):

- ``samples_per_s`` / ``tokens_per_s``: trained samples (tokens) / the sum of the steps' wall seconds;
- ``ratio_to_sync``: samples/s over sync's;
- ``overlap_limit`` = (gen + train) / max(gen, train) from the sync run's own mean per-step timings: the most any
  overlap of generation and training can win on this work; ``limit_fraction`` = ratio_to_sync / overlap_limit;
- ``pipeline_efficiency`` = max(gen, train) / this schedule's mean step seconds (1.0 = perfectly hidden);
- ``trainer_idle_fraction``: the share of the run's step time the training worker spent in no span;
- ``sync_s`` / ``sync_bytes_per_s``: mean weight-sync seconds and throughput (0 for sync: rollout shares the actor);
  ``sync_bytes``: the payload of one sync (a LoRA run's adapter alone); ``update_s``: the actor update's mean seconds;
- ``staleness_mean``: mean policy versions between generation and training (``staleness/mean``);
- ``accuracy``: held-out accuracy after the last step;
- ``cpu_utilization``: the share of the machine's cores busy over the measured steps; ``core_limit`` = 1 / sync's:
  the most any schedule doing sync's CPU work can gain on these cores (the overlap limit assumes generation and
  training do not share cores; here they do), ``core_limit_fraction`` = ratio_to_sync / core_limit;
- ``ratio_to_unshared``: samples/s over ``sync_unshared``'s (sync without prefix sharing or packing: the trainer
  before ``actor.shared_prefix``), when that mode runs;
- ``update_tokens``: positions the actor update processed per step (real + padding), ``padding_frac`` the share of
  them padding, ``prefix_saving`` the share of the samples' own prompt + response tokens a shared prompt saved,
  ``prefill_saving`` the share of prompt tokens the rollout engine did not prefill because an identical prompt was
  prefilled once; ``trainer_peak_rss_gb``: the training worker's peak resident memory.

Workloads (``bench_common.prepare_workload``): ``demo`` is the demo's RL work (32 prompts x 8), ``short`` the same task
at half the batch (short answers: update-heavy on a CPU);
``long`` is chain_sum with 2-24 terms answered step by step, a generation-heavy workload with a long tail of response
lengths; ``tail`` answers each prompt either step by step or at once, so lengths vary 10x within a group; ``tool``
hands sums to the ``calc`` tool through the tool agent. ``--modes ppo_colocated,ppo_split`` measures PPO's two
placements against each other instead (``bench_ppo``).

Latency knobs (``bench_knobs``): ``--reward-delay-ms 0,20,200`` runs every mode once per delay, the reward served by an
HTTP service on loopback that answers after d ms (0: in process); ``--tool-delay-ms 0,200`` (``--workload tool``) the
same with a ``calc`` that answers after d ms. Rows ``fully_async@reward20ms``; ``ratio_to_instant``: samples/s over
the same mode's delay-0 run. What a slow reward or tool costs each schedule, and how much of it the overlap hides.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from asyncrl.config import SCHEDULES, ConfigError, load_config
from asyncrl.telemetry.timeline import read_chrome_trace
from asyncrl_lab.bench_common import (
    RATE_COLUMNS,
    Workload,
    cpu_utilization,
    mean_of,
    prepare_workload,
    rate,
    run_one,
    run_overrides,
    set_ratios,
    step_metrics,
    trainer_idle_fraction,
    write_results,
)
from asyncrl_lab.bench_knobs import Latency, knob_columns, run_latencies
from asyncrl_lab.bench_ppo import PPO_MODES, run_ppo_bench

# today's sync before prefix sharing and packing: every other row is also measured against it
UNSHARED = "sync_unshared"
UNSHARED_OVERRIDES = [
    "actor.shared_prefix=false",
    "actor.use_dynamic_bsz=false",
    "rollout.enable_prefix_caching=false",
]
BASE_CONFIG = "configs/quickstart.yaml"


ENGINES = ("builtin", "vllm")


MODIFIERS = ("split", "lora", "dp2", "fsdp2")
LORA_OVERRIDES = ["model.lora_rank=16", "model.lora_alpha=32"]  # +lora: the actor trains a rank-16 adapter


def schedule_overrides(mode: str, total_cpus: int) -> list[str]:
    """A mode is a schedule, optionally followed by ``+engine`` and/or ``+split`` (``one_step_off+vllm+split``).

    The same cores for every schedule. sync gives them all to its one worker (rollout runs in the actor's). The
    overlapping schedules give the trainer all of them too and add one single-threaded rollout worker that shares
    them (one extra logical CPU in Ray's accounting). ``+split`` gives the trainer one core fewer instead, so trainer
    and rollout threads never outnumber the cores. With the old, heavier update, halving the trainer lost more than
    the overlap won; since prefix sharing neither placement wins in every schedule (both measured in BENCHMARKS.md).
    ``+vllm`` (or ``+builtin``) sets ``rollout.engine``; ``+lora`` trains a LoRA adapter (``LORA_OVERRIDES``) instead of
    every weight; ``+dp2`` trains on two data-parallel ranks that split the trainer's cores (``trainer.num_workers``),
    ``+fsdp2`` the same two ranks sharded (``trainer.strategy=fsdp2``); ``+key=value`` overrides that mode's run alone
    (``fully_async+async_training.staleness_threshold=2``).
    """
    if "=" in mode:  # ``fully_async+async_training.staleness_threshold=2``: overrides of this mode's run alone
        base, *parts = mode.split("+")
        keys = [p for p in parts if "=" in p]
        plain = "+".join([base, *(p for p in parts if "=" not in p)])
        return schedule_overrides(plain, total_cpus) + keys
    schedule, *mods = mode.split("+")
    for mod in mods:
        if mod not in ENGINES + MODIFIERS:
            raise ConfigError(
                f"bench: unknown modifier {mod!r} in mode {mode!r} (allowed: +{', +'.join(ENGINES + MODIFIERS)})"
            )
    if mods:
        over = schedule_overrides(schedule, total_cpus)
        if "split" in mods:
            if schedule in ("sync", UNSHARED):
                raise ConfigError(f"bench: mode {mode!r}: +split needs an overlapping schedule (sync has one worker)")
            over += [f"trainer.cpus_per_worker={max(1, total_cpus - 1)}", f"ray.num_cpus={total_cpus}"]
        over += LORA_OVERRIDES if "lora" in mods else []
        if "dp2" in mods or "fsdp2" in mods:  # the same cores, as two ranks of half the threads each
            over += ["trainer.num_workers=2", f"trainer.cpus_per_worker={max(1, total_cpus // 2)}"]
        over += ["trainer.strategy=fsdp2"] if "fsdp2" in mods else []
        return over + [f"rollout.engine={m}" for m in mods if m in ENGINES]
    if schedule in ("sync", UNSHARED):
        over = ["trainer.schedule=sync", f"trainer.cpus_per_worker={total_cpus}", f"ray.num_cpus={total_cpus}"]
        return over + (UNSHARED_OVERRIDES if schedule == UNSHARED else [])
    if schedule not in SCHEDULES:
        raise ConfigError(
            f"bench: unknown schedule {schedule!r} (allowed: {', '.join((UNSHARED, *SCHEDULES))}, each optionally "
            f"+{'|+'.join(ENGINES + MODIFIERS)}, or {', '.join(PPO_MODES)})"
        )
    over = [
        f"trainer.schedule={schedule}",
        f"trainer.cpus_per_worker={total_cpus}",
        "rollout.num_workers=1",
        "rollout.cpus_per_worker=1",
        f"ray.num_cpus={total_cpus + 1}",
    ]
    if schedule == "fully_async":
        # the Rollouter may run one sync window ahead (every sample <= 1 version stale), streaming the groups of two
        # trainer steps; with partial rollout a sync interrupts the live rows instead of waiting for them
        over += ["async_training.staleness_threshold=1.0", "async_training.partial_rollout=true"]
    return over


def schedule_config(
    schedule: str, wl: Workload, out: Path, steps: int, total_cpus: int, extra: list[str], tag: str = ""
):
    """``tag``: a latency setting's (``@reward20ms``), in the run directory's name."""
    run_dir = out / f"{wl.name}_{schedule}{tag}"
    over = [
        *wl.data_overrides(),
        *run_overrides(run_dir, steps),
        *wl.train_overrides,
        *schedule_overrides(schedule, total_cpus),
        *extra,
    ]
    return load_config(BASE_CONFIG, over)


def run_schedule(
    schedule: str, wl: Workload, out: Path, steps: int, total_cpus: int, extra: list[str], tag: str = ""
) -> Path:
    cfg = schedule_config(schedule, wl, out, steps, total_cpus, extra, tag)
    run_one(cfg)
    run_dir = Path(cfg.trainer.default_local_dir)
    # the machine's load as the run ends (1-minute mean): a figure taken beside another job is not a figure
    (run_dir / "load.json").write_text(json.dumps({"load_1m": os.getloadavg()[0]}) + "\n")
    return run_dir


def profile_sync(run_dir: Path, out_dir: Path) -> str:
    """``asyncrl probe RUN_DIR`` of the sync run, written to ``out_dir/cost.json``."""
    from asyncrl_lab.probe import probe_run

    cost = probe_run(run_dir)
    path = out_dir / "cost.json"
    cost.save(path)
    print("\n".join(f"[bench] profile: {line}" for line in cost.describe()))
    return str(path)


def predict_schedules(
    cost_path: str,
    schedules: list[str],
    wl: Workload,
    out: Path,
    steps: int,
    total_cpus: int,
    extra: list[str],
    ref: str = "sync",
) -> dict[str, dict[str, Any]]:
    """The performance model's prediction of every run, made before any of them starts (``predictions.json``);
    ratios to ``ref``. A mode's engine must be the profile's (``+vllm`` modes from a vLLM run's profile)."""
    import time

    from asyncrl.planning.cost import CostModel
    from asyncrl.planning.simulate import Cluster, Setting, simulate

    cost = CostModel.load(cost_path)
    preds: dict[str, dict[str, Any]] = {}
    for schedule in schedules:
        cfg = schedule_config(schedule, wl, out, steps, total_cpus, extra)
        if cfg.rollout.engine != cost.engine:
            raise ConfigError(
                f"bench --predict: mode {schedule!r} runs rollout.engine={cfg.rollout.engine} but {cost_path} profiles "
                f"a {cost.engine} run; give every mode the profile's engine (+{cost.engine})"
            )
        setting = Setting.from_config(cfg)
        p = simulate(cost, Cluster.cpu(total_cpus), setting, steps)
        preds[schedule] = {
            "setting": setting.label(),
            "samples_per_s": p.samples_per_s,
            "step_s": p.step_s,
            "trainer_idle": p.trainer_idle,
            "partial_share": p.partial_share,
        }
    sync = preds[ref]["samples_per_s"]
    for v in preds.values():
        v["ratio_to_sync"] = v["samples_per_s"] / sync
    stamp = {"cost": cost_path, "made_at": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())}
    (out / "predictions.json").write_text(json.dumps({**stamp, "schedules": preds}, indent=1) + "\n")
    for k, v in preds.items():
        print(f"[bench] predicted {k}: {v['samples_per_s']:.1f} samples/s ({v['ratio_to_sync']:.2f}x sync)")
    return preds


def summarize(schedule: str, workload: str, run_dir: Path, sync_ref: dict[str, float] | None) -> dict[str, Any]:
    steps, body = step_metrics(run_dir)
    mean_step = mean_of(body, "timing_s/step")
    gen = mean_of(body, "timing_s/gen")
    summary = {
        "schedule": schedule,
        "workload": workload,
        "steps": len(body),
        "samples_per_s": rate(body, "perf/samples_per_s"),
        "tokens_per_s": rate(body, "perf/throughput_tokens_per_s"),
        "mean_step_s": mean_step,
        "gen_s": gen,
        "train_s": mean_step - gen if schedule.split("+")[0] in ("sync", UNSHARED) else None,
        "update_s": mean_of(body, "timing_s/update_actor"),
        "sync_bytes": _summary(run_dir).get("sync_bytes"),
        "response_length_mean": mean_of(body, "response_length/mean"),
        "response_length_p95": mean_of(body, "response_length/p95"),
        "trainer_idle_fraction": trainer_idle_fraction(read_chrome_trace(run_dir / "timeline.json"), body),
        "sync_s": mean_of(body, "weight_sync/seconds"),
        "sync_bytes_per_s": mean_of(body, "weight_sync/bytes_per_s"),
        "staleness_mean": sum(m["staleness/mean"] for m in body) / len(body),
        "accuracy": steps[-1].get("val/accuracy"),
        # what the update processed: positions per step, the share of them padding, the share of the samples'
        # own tokens a shared prompt saved, and the rollout's prefill saving (identical prompts prefilled once)
        "update_tokens": mean_of(body, "perf/actor_tokens"),
        "padding_frac": mean_of(body, "perf/actor_padding_frac"),
        "prefix_saving": mean_of(body, "perf/actor_prefix_saving"),
        # None where the run logs no prefill counts (runs made before the Rollouter reported them)
        "prefill_saving": mean_of(body, "perf/rollout_prefill_saving")
        if any("perf/rollout_prefill_saving" in m for m in body)
        else None,
        "trainer_peak_rss_gb": max(m.get("perf/trainer_peak_rss_gb", 0.0) for m in steps),
        "cpu_utilization": cpu_utilization(steps, body),
        # fully_async: the Rollouter's slots decoding (rows on its engines over their slots, time-averaged)
        "slot_occupancy": mean_of(body, "fully_async/slot_occupancy")
        if any("fully_async/slot_occupancy" in m for m in body)
        else None,
        "load_1m": json.loads((run_dir / "load.json").read_text())["load_1m"]
        if (run_dir / "load.json").is_file()
        else None,
    }
    ref = sync_ref or summary
    g, tr = ref["gen_s"], ref["train_s"]
    set_ratios(summary, ref, overlap_limit=(g + tr) / max(g, tr))
    summary["pipeline_efficiency"] = max(g, tr) / mean_step
    if ref.get("cpu_utilization"):  # the most any overlap can gain on these cores (see cpu_utilization)
        summary["core_limit"] = 1.0 / ref["cpu_utilization"]
        summary["core_limit_fraction"] = summary["ratio_to_sync"] / summary["core_limit"]
    return summary


def run_bench(
    modes: list[str],
    workload: str,
    out: str,
    steps: int,
    work_dir: str,
    total_cpus: int,
    sft_seconds: float | None,
    extra: list[str],
    predict: str | None = None,
    latencies: list[Latency] | None = None,
) -> list[dict[str, Any]]:
    """``modes``: schedules (GRPO on each, against sync) or PPO placements (against each other), not both.
    ``predict``: a cost.json (``asyncrl profile``), every run predicted before the first starts; or "auto": the sync
    run (first) is probed (``asyncrl probe``) and the others are predicted from it before they start. The table gains
    the predicted samples/s, the error of each, and the predicted ratio to sync. ``latencies``: one latency knob's
    settings (``bench_knobs``, ascending from 0): every mode runs once under each."""
    out_dir = Path(out)
    if latencies and (predict or any(m in PPO_MODES for m in modes)):
        raise ConfigError(f"bench: latency knobs take schedules, not ppo modes or --predict (got {modes}, {predict})")
    if modes and all(m in PPO_MODES for m in modes):  # PPO placements are measured against each other
        out_dir.mkdir(parents=True, exist_ok=True)
        wl = prepare_workload(workload, Path(work_dir), sft_seconds)
        return run_ppo_bench(modes, wl, out_dir, steps, total_cpus, extra)
    if any(m in PPO_MODES for m in modes):
        raise ConfigError(f"bench: ppo modes ({', '.join(PPO_MODES)}) are compared with each other only (got {modes})")
    # every figure is a ratio to sync, measured here: the first sync mode given (sync+vllm for vLLM rows), else sync
    ref = next((m for m in modes if m.split("+")[0] == "sync"), "sync")
    schedules = modes if ref in modes else [ref, *modes]
    if UNSHARED in schedules:  # the baseline runs first, then sync (the reference of the ratios), then the rest
        schedules = [UNSHARED, ref, *(s for s in schedules if s not in (UNSHARED, ref))]
    for s in schedules:
        schedule_overrides(s, total_cpus)  # unknown schedules fail before any work starts
    out_dir.mkdir(parents=True, exist_ok=True)
    wl = prepare_workload(workload, Path(work_dir), sft_seconds)
    if not latencies:
        results, columns = run_modes(schedules, ref, wl, out_dir, steps, total_cpus, extra, predict)
    else:
        results = run_latencies(
            latencies,
            lambda over, tag: run_modes(schedules, ref, wl, out_dir, steps, total_cpus, [*extra, *over], None, tag)[0],
        )
        columns = [COLUMNS[0], *knob_columns(latencies[0].kind), *COLUMNS[1:]]
    write_results(results, out_dir, "bench", columns)
    return results


def run_modes(
    schedules: list[str],
    ref: str,
    wl: Workload,
    out_dir: Path,
    steps: int,
    total_cpus: int,
    extra: list[str],
    predict: str | None,
    tag: str = "",
) -> tuple[list[dict[str, Any]], list[tuple[str, str]]]:
    """Every schedule once, in order (``ref``, the sync mode, among them), with ``extra``; the rows (named
    schedule + ``tag``) with their ratios to ``ref``'s, and the table's columns."""
    results: list[dict[str, Any]] = []
    runs: dict[str, Path] = {}
    preds = None
    if predict and predict != "auto":
        preds = predict_schedules(predict, schedules, wl, out_dir, steps, total_cpus, extra, ref)
    for schedule in schedules:
        runs[schedule] = run_schedule(schedule, wl, out_dir, steps, total_cpus, extra, tag)
        if predict == "auto" and schedule == ref:  # profile this sync run, then predict the rest before they run
            preds = predict_schedules(
                profile_sync(runs[ref], out_dir), schedules, wl, out_dir, steps, total_cpus, extra, ref
            )
    sync_ref = summarize(ref, wl.name, runs[ref], None)
    for schedule in schedules:
        res = sync_ref if schedule == ref else summarize(schedule, wl.name, runs[schedule], sync_ref)
        results.append(res)
    if UNSHARED in runs:
        base = results[0]["samples_per_s"]
        for res in results:
            res["ratio_to_unshared"] = res["samples_per_s"] / base
    columns = COLUMNS
    if preds is not None:
        for res in results:
            p = preds[res["schedule"]]
            res["predicted_samples_per_s"] = p["samples_per_s"]
            res["predicted_ratio"] = p["ratio_to_sync"]
            res["prediction_error"] = (p["samples_per_s"] - res["samples_per_s"]) / res["samples_per_s"]
        columns = [*COLUMNS[:4], *PREDICTION_COLUMNS, *COLUMNS[4:]]
    for schedule, res in zip(schedules, results):
        res["schedule"], res["run_dir"] = schedule + tag, str(runs[schedule])
    return results, columns


PREDICTION_COLUMNS = [
    ("predicted_samples_per_s", "{:.1f}"),
    ("prediction_error", "{:+.1%}"),
    ("predicted_ratio", "{:.2f}x"),
]
COLUMNS = [
    ("schedule", "{}"),
    *RATE_COLUMNS,
    ("ratio_to_unshared", "{:.2f}x"),
    ("cpu_utilization", "{:.2f}"),
    ("slot_occupancy", "{:.2f}"),
    ("load_1m", "{:.2f}"),
    ("core_limit", "{:.2f}x"),
    ("core_limit_fraction", "{:.2f}"),
    ("update_tokens", "{:.0f}"),
    ("padding_frac", "{:.2f}"),
    ("prefix_saving", "{:.2f}"),
    ("prefill_saving", "{:.2f}"),
    ("trainer_peak_rss_gb", "{:.2f}"),
    ("update_s", "{:.3f}"),
    ("pipeline_efficiency", "{:.2f}"),
    ("trainer_idle_fraction", "{:.2f}"),
    ("sync_s", "{:.3f}"),
    ("sync_bytes", "{:.3g}"),
    ("sync_bytes_per_s", "{:.2e}"),
    ("response_length_mean", "{:.1f}"),
    ("response_length_p95", "{:.1f}"),
    ("accuracy", "{:.3f}"),
]


def _summary(run_dir: Path) -> dict[str, Any]:
    path = run_dir / "summary.json"
    return json.loads(path.read_text()) if path.exists() else {}
