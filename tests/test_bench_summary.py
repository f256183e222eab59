"""bench figures from a run directory, checked by hand on a synthetic run (no training involved)."""

from __future__ import annotations

import json
import os

import pytest

from asyncrl.telemetry.timeline import write_chrome_trace
from asyncrl_lab.bench import COLUMNS, summarize
from asyncrl_lab.bench_common import markdown_table


def _write_run(run_dir, step_s, gen_s, spans, samples=10, tokens=1000, sync=None):
    run_dir.mkdir(parents=True)
    lines = []
    for step in (1, 2, 3):
        m = {
            "step": step,
            "timing_s/step": step_s,
            "timing_s/gen": gen_s,
            "perf/samples_per_s": samples / step_s,
            "perf/throughput_tokens_per_s": tokens / step_s,
            "response_length/mean": 5.0,
            "staleness/mean": 0.0 if sync is None else 1.0,
        }
        if sync is not None:
            m.update({"weight_sync/seconds": sync, "weight_sync/bytes_per_s": 1e9})
        if step == 3:
            m["val/accuracy"] = 0.25
        lines.append(json.dumps(m))
    (run_dir / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    write_chrome_trace(run_dir / "timeline.json", spans)


def _span(name, worker, t0, t1, step):
    return {
        "name": name,
        "kind": "span",
        "worker": worker,
        "thread": "main",
        "start_s": t0,
        "end_s": t1,
        "step": step,
        "args": {},
    }


def test_overlap_limit_ratio_and_idle_fraction_by_hand(tmp_path):
    # sync: gen 1 s + train 3 s per step; steps 2 and 3 are measured (step 1 is warm-up)
    sync_spans = [_span("gen", "driver", 100 + 4 * i, 101 + 4 * i, i + 1) for i in range(3)]
    sync_spans += [_span("train", "driver", 101 + 4 * i, 104 + 4 * i, i + 1) for i in range(3)]
    sync_spans += [_span("generate", "trainer", 100 + 4 * i, 101 + 4 * i, i + 1) for i in range(3)]
    sync_spans += [_span("update_actor", "trainer", 101 + 4 * i, 104 + 4 * i, i + 1) for i in range(3)]
    _write_run(tmp_path / "sync", step_s=4.0, gen_s=1.0, spans=sync_spans)
    s = summarize("sync", "short", tmp_path / "sync", None)
    assert s["overlap_limit"] == pytest.approx(4 / 3)
    assert s["ratio_to_sync"] == pytest.approx(1.0)
    assert s["pipeline_efficiency"] == pytest.approx(3 / 4)
    assert s["samples_per_s"] == pytest.approx(10 / 4)
    assert s["trainer_idle_fraction"] == pytest.approx(0.0)  # the colocated worker is busy all the time
    assert s["accuracy"] == 0.25

    # one_step_off: 3.2 s per step, trainer busy 3 s of each (idle 0.2 s)
    osp = [_span("wait_prev_gen", "driver", 200 + 3.2 * i, 200.2 + 3.2 * i, i + 1) for i in range(3)]
    osp += [_span("train", "driver", 200.2 + 3.2 * i, 203.2 + 3.2 * i, i + 1) for i in range(3)]
    osp += [_span("update_actor", "trainer", 200.2 + 3.2 * i, 203.2 + 3.2 * i, i + 1) for i in range(3)]
    _write_run(tmp_path / "osp", step_s=3.2, gen_s=1.0, spans=osp, sync=0.01)
    o = summarize("one_step_off", "short", tmp_path / "osp", s)
    assert o["ratio_to_sync"] == pytest.approx(4.0 / 3.2)
    assert o["limit_fraction"] == pytest.approx((4.0 / 3.2) / (4 / 3))
    assert o["pipeline_efficiency"] == pytest.approx(3 / 3.2)
    # measured window: start of step 2 (203.2) to the end of the last update (209.6); busy 2 x 3 s of 6.4 s
    assert o["trainer_idle_fraction"] == pytest.approx(1 - 6.0 / 6.4)
    assert o["sync_s"] == pytest.approx(0.01)
    table = markdown_table([s, o], COLUMNS)
    assert "| short | one_step_off |" in table and "1.25x" in table


def _write_distill_run(run_dir, step_s, staleness):
    run_dir.mkdir(parents=True)
    lines = []
    for step in (1, 2, 3):
        m = {
            "step": step,
            "timing_s/step": step_s,
            "timing_s/gen": 1.0,
            "timing_s/get_teacher_knowledge": 1.0,
            "timing_s/update_actor": 2.0,
            "perf/samples_per_s": 8 / step_s,
            "perf/throughput_tokens_per_s": 800 / step_s,
            "staleness/mean": staleness,
            "actor/kl_loss": 0.5,
        }
        lines.append(json.dumps(m))
    (run_dir / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    spans = [_span("train", "driver", 100 + step_s * i, 102 + step_s * i, i + 1) for i in range(3)]
    spans += [_span("update_actor", "trainer", 100 + step_s * i, 102 + step_s * i, i + 1) for i in range(3)]
    write_chrome_trace(run_dir / "timeline.json", spans)


def test_distill_bench_limits_by_hand(tmp_path):
    from asyncrl_lab.bench_distill import COLUMNS as DISTILL_COLUMNS
    from asyncrl_lab.bench_distill import summarize_distill

    # sync: generate 1 s + teacher 1 s + update 2 s = 4 s per step
    _write_distill_run(tmp_path / "sync", 4.0, 0.0)
    _write_distill_run(tmp_path / "osp", 3.0, 1.0)
    _write_distill_run(tmp_path / "tsp", 2.0, 2.0)
    sync = summarize_distill("sync", tmp_path / "sync", None)
    assert sync["overlap_limit"] == pytest.approx(1.0) and sync["ratio_to_sync"] == pytest.approx(1.0)
    assert sync["samples_per_s"] == pytest.approx(2.0)
    # the update is 2 of every 4 s on the trainer, measured from step 2's first span to the last update's end
    assert sync["trainer_idle_fraction"] == pytest.approx(1 - 4 / 6)
    osp = summarize_distill("one_step_off", tmp_path / "osp", sync)
    assert osp["overlap_limit"] == pytest.approx(4 / 3)  # generation hidden behind teacher + update (3 s)
    assert osp["ratio_to_sync"] == pytest.approx(4 / 3) and osp["limit_fraction"] == pytest.approx(1.0)
    tsp = summarize_distill("two_step_off", tmp_path / "tsp", sync)
    assert tsp["overlap_limit"] == pytest.approx(2.0)  # all three at once: the update (2 s) is the bound
    assert tsp["ratio_to_sync"] == pytest.approx(2.0) and tsp["staleness_mean"] == pytest.approx(2.0)
    table = markdown_table([sync, osp, tsp], DISTILL_COLUMNS, first="schedule")
    assert table.splitlines()[0].startswith("| schedule | samples_per_s |")
    assert "| two_step_off | 4.0 |" in table


def test_cpu_utilization_core_limit_and_the_work_columns_by_hand(tmp_path, monkeypatch):
    monkeypatch.setattr(os, "cpu_count", lambda: 2)

    def run(name, busy_per_step, tokens, saving, rss):
        d = tmp_path / name
        d.mkdir()
        lines = []
        for step in (1, 2, 3):  # step 1 is warm-up: the window runs from its end to the end of step 3
            lines.append(
                json.dumps(
                    {
                        "step": step,
                        "timing_s/step": 2.0,
                        "timing_s/gen": 1.0,
                        "perf/samples_per_s": 5.0,
                        "perf/throughput_tokens_per_s": 100.0,
                        "staleness/mean": 0.0,
                        "perf/machine_busy_core_s": 1000.0 + busy_per_step * step,
                        "perf/monotonic_s": 50.0 + 2.0 * step,
                        "perf/actor_tokens": tokens,
                        "perf/actor_padding_frac": 0.1,
                        "perf/actor_prefix_saving": saving,
                        "perf/trainer_peak_rss_gb": rss * step,
                    }
                )  # fmt: skip
            )
        (d / "metrics.jsonl").write_text("\n".join(lines) + "\n")
        spans = [_span("update_actor", "trainer", 50 + 2 * s, 51 + 2 * s, s + 1) for s in range(3)]
        spans += [_span("train", "driver", 50 + 2 * s, 51 + 2 * s, s + 1) for s in range(3)]
        write_chrome_trace(d / "timeline.json", spans)
        return d

    s = summarize("sync", "demo", run(tmp_path / "sync", 3.2, 500.0, 0.7, 0.5), None)
    assert s["cpu_utilization"] == pytest.approx(3.2 / (2.0 * 2))  # 3.2 busy core-s per 2 s step on 2 cores
    assert s["core_limit"] == pytest.approx(4.0 / 3.2)
    assert s["update_tokens"] == 500.0 and s["prefix_saving"] == pytest.approx(0.7)
    assert s["trainer_peak_rss_gb"] == pytest.approx(1.5)  # the largest reading of the run
    assert s["prefill_saving"] is None  # not logged by this run: "-", not a measured 0
    o = summarize("one_step_off", "demo", run(tmp_path / "osp", 4.0, 400.0, 0.7, 0.4), s)
    assert o["cpu_utilization"] == pytest.approx(1.0)
    assert o["core_limit_fraction"] == pytest.approx(1.0 / (4.0 / 3.2))  # same samples/s as sync


def test_bench_modes_name_a_schedule_an_engine_and_a_core_split():
    from asyncrl.config import ConfigError, load_config
    from asyncrl_lab.bench import BASE_CONFIG, schedule_overrides

    cfg = load_config(BASE_CONFIG, schedule_overrides("one_step_off+vllm+split", 2))
    assert (cfg.trainer.schedule, cfg.rollout.engine) == ("one_step_off", "vllm")
    assert (cfg.trainer.cpus_per_worker, cfg.rollout.cpus_per_worker, cfg.ray.num_cpus) == (1, 1, 2)
    shared = load_config(BASE_CONFIG, schedule_overrides("one_step_off", 2))
    assert (shared.trainer.cpus_per_worker, shared.ray.num_cpus, shared.rollout.engine) == (2, 3, "builtin")
    lora = load_config(BASE_CONFIG, schedule_overrides("sync+lora", 2))
    assert (lora.trainer.schedule, lora.model.lora_rank, lora.model.lora_alpha) == ("sync", 16, 32)
    with pytest.raises(ConfigError, match="sync has one worker"):
        schedule_overrides("sync+split", 2)
    with pytest.raises(ConfigError, match="unknown modifier 'fast'"):
        schedule_overrides("fully_async+fast", 2)
