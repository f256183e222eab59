"""``asyncrl bench``: every mode on the same work, in one invocation, against ``sync``.

Same data, seeds, number of samples, model and total CPUs for every mode; only the arrangement differs. Figures per
mode (all ratios computed from runs in this one invocation, because the machine is shared and noisy):

- ``samples_per_s`` / ``tokens_per_s``: trained samples (tokens) / the sum of the steps' wall seconds;
- ``ratio_to_sync``: samples/s over sync's;
- ``overlap_limit`` = (gen + train) / max(gen, train) from the sync run's own mean per-step timings: the most any
  overlap of generation and training can win on this work; ``limit_fraction`` = ratio_to_sync / overlap_limit;
- ``pipeline_efficiency`` = max(gen, train) / this mode's mean step seconds (1.0 = perfectly hidden);
- ``trainer_idle_fraction``: the share of the run's step time the training worker spent in no span;
- ``sync_s`` / ``sync_bytes_per_s``: mean weight-sync seconds and throughput (0 for colocated sync);
- ``accuracy``: held-out accuracy after the last step.

Workloads: ``short`` is the demo task (short answers: update-heavy on a CPU); ``long`` is chain_sum with 2–24 terms
answered step by step (running sums), a generation-heavy workload with a long tail of response lengths.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from asyncrl.config import load_config
from asyncrl.data.tasks import write_task_dataset
from asyncrl.telemetry.metrics import read_metrics
from asyncrl.telemetry.timeline import idle_fraction, read_chrome_trace

MODES = ("sync", "one_step_off", "fully_async")


@dataclass
class Workload:
    name: str
    sft_seconds: float
    sft_overrides: list[str]
    train_overrides: list[str]
    files: dict[str, list[str]]


def prepare_workload(name: str, work_dir: Path, sft_seconds: float | None) -> Workload:
    """Data and an SFT-warmed tiny model for ``name``, built once under ``work_dir`` and reused by later benches."""
    from asyncrl.sft import load_sft_config, run_sft

    wdir = work_dir / name
    if name == "short":
        train, test = write_task_dataset(
            "chain_sum",
            20000,
            0,
            wdir / "data",
            test_size=200,
            prompt_template="{expression} =",
            min_terms=2,
            max_terms=3,
            min_digits=1,
            max_digits=2,
        )
        files = {"train": [str(train)], "val": [str(test)]}
        sft_over = ["data.max_response_length=16"]
        train_over = ["rollout.response_length=16", "data.train_batch_size=16", "actor.ppo_mini_batch_size=16"]
        secs = 60.0 if sft_seconds is None else sft_seconds
    elif name == "long":
        # A long tail of response lengths: most problems have 2-6 terms, a quarter have 12-24.
        short_tr, short_te = write_task_dataset(
            "chain_sum",
            6000,
            0,
            wdir / "data_short",
            test_size=150,
            prompt_template="{expression} =",
            min_terms=2,
            max_terms=6,
            min_digits=1,
            max_digits=2,
        )
        long_tr, long_te = write_task_dataset(
            "chain_sum",
            2000,
            1,
            wdir / "data_long",
            test_size=50,
            prompt_template="{expression} =",
            min_terms=12,
            max_terms=24,
            min_digits=1,
            max_digits=2,
        )
        files = {"train": [str(short_tr), str(long_tr)], "val": [str(short_te), str(long_te)]}
        sft_over = ["data.response_key=solution", "data.max_response_length=256", "data.batch_size=16"]
        # 2 prompts x 4 samples per step: the arrangement where generation dominates the step on a 2-core CPU
        # (measured: 0.75 s generating vs 0.43 s training in sync); with 64 samples per step training dominates.
        train_over = [
            "rollout.response_length=256",
            "rollout.n=4",
            "data.train_batch_size=2",
            "actor.ppo_mini_batch_size=2",
            "actor.ppo_micro_batch_size=32",
            "data.max_prompt_length=192",
        ]
        secs = 180.0 if sft_seconds is None else sft_seconds
    else:
        raise ValueError(f"bench: unknown workload {name!r} (allowed: short, long)")
    model_dir = wdir / "sft"
    if not (model_dir / "config.json").is_file():
        print(f"[bench] preparing workload {name!r}: SFT warm start for {secs:.0f} s -> {model_dir}")
        run_sft(
            load_sft_config(
                "configs/sft_tiny.yaml",
                [
                    f"data.train_files=[{','.join(files['train'])}]",
                    f"data.val_files=[{','.join(files['val'])}]",
                    f"trainer.output_dir={model_dir}",
                    f"trainer.max_time_s={secs}",
                    "trainer.total_steps=1000000",
                    "data.val_max_samples=100",
                    *sft_over,
                ],
            )
        )
    return Workload(name, secs, sft_over, [f"model.path={model_dir}", *train_over], files)


def run_overrides(run_dir: Path, steps: int) -> list[str]:
    """What every benched run shares: a fresh run dir, ``steps`` steps, no evaluation, one checkpoint, jsonl metrics."""
    return [
        f"trainer.default_local_dir={run_dir}",
        f"trainer.total_training_steps={steps}",
        "trainer.resume_mode=disable",
        "trainer.val_before_train=false",
        "trainer.test_freq=0",
        f"trainer.save_freq={steps}",
        "trainer.logger=[console,jsonl]",
    ]


def mode_overrides(mode: str, total_cpus: int) -> list[str]:
    """The same cores for every mode. sync gives them all to its one colocated worker. The overlapping modes give
    the trainer all of them too and add one single-threaded rollout worker that shares them (one extra logical CPU
    in Ray's accounting): training scales ~1.9x from 1 to 2 threads here while decoding barely does, so halving the
    trainer to give the rollout a core of its own loses more than the overlap wins (measured in BENCHMARKS.md)."""
    if mode == "sync":
        return ["trainer.mode=sync", f"trainer.cpus_per_worker={total_cpus}", f"ray.num_cpus={total_cpus}"]
    shared = [
        f"trainer.cpus_per_worker={total_cpus}",
        "rollout.num_workers=1",
        "rollout.cpus_per_worker=1",
        f"ray.num_cpus={total_cpus + 1}",
    ]
    if mode == "one_step_off":
        return ["trainer.mode=one_step_off", *shared]
    if mode == "fully_async":
        return [
            "trainer.mode=fully_async",
            *shared,
            # the Rollouter may run one sync window ahead (every sample <= 1 version stale), decoding the groups
            # of two trainer steps in one batch; partial rollout + refill keep that batch full through the long tail
            "async_training.staleness_threshold=1.0",
            "async_training.partial_rollout=true",
        ]
    raise ValueError(f"bench: unknown mode {mode!r} (allowed: {', '.join(MODES)})")


def run_mode(mode: str, wl: Workload, out: Path, steps: int, total_cpus: int, extra: list[str]) -> Path:
    from asyncrl.pipelines import run_pipeline
    from asyncrl.workers.cluster import shutdown

    run_dir = out / f"{wl.name}_{mode}"
    over = [
        f"data.train_files=[{','.join(wl.files['train'])}]",
        f"data.val_files=[{','.join(wl.files['val'])}]",
        *run_overrides(run_dir, steps),
        *wl.train_overrides,
        *mode_overrides(mode, total_cpus),
        *extra,
    ]
    run_pipeline(load_config("configs/quickstart.yaml", over))
    shutdown()  # each mode gets a fresh cluster
    return run_dir


def summarize(mode: str, workload: str, run_dir: Path, sync_ref: dict[str, float] | None) -> dict[str, Any]:
    steps = [m for m in read_metrics(run_dir / "metrics.jsonl") if m["step"] >= 1 and "timing_s/step" in m]
    # the first step of every mode pays one-off costs (first generation, allocator warm-up): leave it out
    body = steps[1:] if len(steps) > 2 else steps
    step_s = sum(m["timing_s/step"] for m in body)
    samples = sum(m["perf/samples_per_s"] * m["timing_s/step"] for m in body)
    tokens = sum(m["perf/throughput_tokens_per_s"] * m["timing_s/step"] for m in body)
    gen = sum(m["timing_s/gen"] for m in body) / len(body)
    mean_step = step_s / len(body)
    events = read_chrome_trace(run_dir / "timeline.json")
    trainer = "actor_rollout" if mode == "sync" else "trainer"
    spans = [e for e in events if e["worker"] == "driver" and e["name"] == "update_actor"]
    t0 = min(e["start_s"] for e in events if e["worker"] == "driver" and e.get("step") == body[0]["step"])
    t1 = max(e["end_s"] for e in spans)
    summary = {
        "mode": mode,
        "workload": workload,
        "steps": len(body),
        "samples_per_s": samples / step_s,
        "tokens_per_s": tokens / step_s,
        "mean_step_s": mean_step,
        "gen_s": gen,
        "train_s": mean_step - gen if mode == "sync" else None,
        "response_length_mean": sum(m["response_length/mean"] for m in body) / len(body),
        "response_length_p95": sum(m.get("response_length/p95", 0.0) for m in body) / len(body),
        "trainer_idle_fraction": idle_fraction(events, trainer, t0, t1),
        "sync_s": sum(m.get("sync/seconds", 0.0) for m in body) / len(body),
        "sync_bytes_per_s": sum(m.get("sync/bytes_per_s", 0.0) for m in body) / len(body),
        "staleness_mean": sum(m["fully_async/staleness/mean"] for m in body) / len(body),
        "accuracy": steps[-1].get("val/accuracy"),
    }
    ref = sync_ref or summary
    g, tr = ref["gen_s"], ref["train_s"]
    summary["overlap_limit"] = (g + tr) / max(g, tr)
    summary["ratio_to_sync"] = summary["samples_per_s"] / ref["samples_per_s"]
    summary["limit_fraction"] = summary["ratio_to_sync"] / summary["overlap_limit"]
    summary["pipeline_efficiency"] = max(g, tr) / mean_step
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
) -> list[dict[str, Any]]:
    from asyncrl.bench_ppo import PPO_MODES, run_ppo_bench

    if modes and all(m in PPO_MODES for m in modes):  # PPO placements are measured against each other
        out_dir = Path(out)
        out_dir.mkdir(parents=True, exist_ok=True)
        wl = prepare_workload(workload, Path(work_dir), sft_seconds)
        return run_ppo_bench(modes, wl, out_dir, steps, total_cpus, extra)
    if any(m in PPO_MODES for m in modes):
        raise ValueError(f"bench: ppo modes ({', '.join(PPO_MODES)}) are compared with each other only (got {modes})")
    if "sync" not in modes:
        modes = ["sync", *modes]  # every figure is a ratio to sync measured in this same invocation
    for m in modes:
        mode_overrides(m, total_cpus)  # unknown modes fail before any work starts
    out_dir = Path(out)
    out_dir.mkdir(parents=True, exist_ok=True)
    wl = prepare_workload(workload, Path(work_dir), sft_seconds)
    results: list[dict[str, Any]] = []
    sync_ref = None
    for mode in modes:
        run_dir = run_mode(mode, wl, out_dir, steps, total_cpus, extra)
        res = summarize(mode, workload, run_dir, sync_ref)
        if mode == "sync":
            sync_ref = res
        results.append(res)
    load = os.getloadavg()
    for r in results:
        r["loadavg_1m"] = round(load[0], 2)
    (out_dir / "bench.json").write_text(json.dumps(results, indent=2) + "\n")
    (out_dir / "bench.md").write_text(markdown_table(results))
    print(markdown_table(results))
    return results


COLUMNS = [
    ("mode", "{}"),
    ("samples_per_s", "{:.1f}"),
    ("tokens_per_s", "{:.0f}"),
    ("ratio_to_sync", "{:.2f}x"),
    ("overlap_limit", "{:.2f}x"),
    ("limit_fraction", "{:.2f}"),
    ("pipeline_efficiency", "{:.2f}"),
    ("trainer_idle_fraction", "{:.2f}"),
    ("sync_s", "{:.3f}"),
    ("sync_bytes_per_s", "{:.2e}"),
    ("response_length_mean", "{:.1f}"),
    ("response_length_p95", "{:.1f}"),
    ("accuracy", "{:.3f}"),
]


def markdown_table(
    results: list[dict[str, Any]], columns: list[tuple[str, str]] | None = None, first: str = "workload"
) -> str:
    columns = columns or COLUMNS
    head = f"| {first} | " + " | ".join(c for c, _ in columns) + " |"
    sep = "|" + " --- |" * (len(columns) + 1)
    rows = []
    for r in results:
        cells = [str(r[first])] + [("-" if r.get(c) is None else f.format(r[c])) for c, f in columns]
        rows.append("| " + " | ".join(cells) + " |")
    return "\n".join([head, sep, *rows]) + "\n"
