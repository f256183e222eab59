"""MetricsLogger backends, crash-safe jsonl, and the bundled Grafana dashboard."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np
import pytest
import torch
from prometheus_client.parser import text_string_to_metric_families

import asyncrl.telemetry.backends as jsonl_module
from asyncrl.telemetry.backends import GRAFANA_DASHBOARD, sanitize_metric_name
from asyncrl.telemetry.metrics import MetricsLogger, last_logged_step, read_metrics


def _scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
        return resp.read().decode()


# --- jsonl -------------------------------------------------------------------------------------------------------


def test_jsonl_each_logged_step_is_fsynced_and_readable_before_close(tmp_path: Path, monkeypatch) -> None:
    synced: list[int] = []
    real_fsync = jsonl_module.os.fsync
    monkeypatch.setattr(jsonl_module.os, "fsync", lambda fd: (synced.append(fd), real_fsync(fd)))
    logger = MetricsLogger(tmp_path, ["jsonl"])
    logger.log(1, {"reward/mean": 0.25, "timing_s/step": 1.5})
    logger.log(2, {"reward/mean": 0.5})

    assert len(synced) == 2
    records = read_metrics(tmp_path / "metrics.jsonl")  # logger still open: lines are already on disk
    assert [r["step"] for r in records] == [1, 2]
    assert records[0]["reward/mean"] == 0.25 and records[0]["timing_s/step"] == 1.5
    assert all(isinstance(r["time"], float) and r["time"] > 1e9 for r in records)
    logger.close()


def test_jsonl_writes_non_finite_values_as_null(tmp_path: Path) -> None:
    with MetricsLogger(tmp_path, ["jsonl"]) as logger:
        logger.log(0, {"loss": float("nan"), "grad_norm": float("inf"), "ok": 1.0})
    line = (tmp_path / "metrics.jsonl").read_text().strip()
    record = json.loads(line)  # strict JSON: NaN would not parse in most readers
    assert "NaN" not in line and "Infinity" not in line
    assert record["loss"] is None and record["grad_norm"] is None and record["ok"] == 1.0


def test_torn_last_line_is_ignored_by_readers_and_truncated_on_reopen(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    with MetricsLogger(tmp_path, ["jsonl"]) as logger:
        logger.log(1, {"reward/mean": 0.1})
        logger.log(2, {"reward/mean": 0.2})
    with open(path, "a") as f:
        f.write('{"step": 3, "time": 17000, "rew')  # a kill in the middle of a write

    assert [r["step"] for r in read_metrics(path)] == [1, 2]
    assert last_logged_step(path) == 2

    with MetricsLogger(tmp_path, ["jsonl"]) as logger:  # resume
        logger.log(3, {"reward/mean": 0.3})
    lines = path.read_text().splitlines()
    assert [json.loads(line)["step"] for line in lines] == [1, 2, 3]


def test_complete_last_line_missing_its_newline_is_kept_on_reopen(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 1, "time": 1.0, "x": 1.0}\n{"step": 2, "time": 2.0, "x": 2.0}')
    with MetricsLogger(tmp_path, ["jsonl"]) as logger:
        logger.log(3, {"x": 3.0})
    assert [json.loads(line)["step"] for line in path.read_text().splitlines()] == [1, 2, 3]


def test_corrupt_line_before_the_last_raises_naming_file_and_line(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 1}\nnot json\n{"step": 3}\n')
    with pytest.raises(ValueError, match=r"metrics\.jsonl line 2"):
        read_metrics(path)


def test_last_logged_step_is_none_without_a_file_or_records(tmp_path: Path) -> None:
    assert last_logged_step(tmp_path / "missing.jsonl") is None
    (tmp_path / "torn.jsonl").write_text('{"step": 1, "ti')
    assert last_logged_step(tmp_path / "torn.jsonl") is None


# --- validation --------------------------------------------------------------------------------------------------


def test_unknown_backend_error_lists_the_allowed_ones(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"neptune.*console.*jsonl.*tensorboard.*prometheus.*wandb.*mlflow"):
        MetricsLogger(tmp_path, ["jsonl", "neptune"])


def test_non_numeric_value_raises_naming_the_key(tmp_path: Path) -> None:
    with MetricsLogger(tmp_path, ["jsonl"]) as logger:
        with pytest.raises(ValueError, match=r"'reward/mean'.*str"):
            logger.log(0, {"reward/mean": "0.5"})
        with pytest.raises(ValueError, match=r"'loss'"):
            logger.log(0, {"loss": torch.ones(3)})
        with pytest.raises(ValueError, match=r"'step' is reserved"):
            logger.log(0, {"step": 1.0})
    assert not (tmp_path / "metrics.jsonl").read_text()  # nothing half-written


def test_numpy_and_zero_dim_tensor_values_are_logged_as_floats(tmp_path: Path) -> None:
    with MetricsLogger(tmp_path, ["jsonl"]) as logger:
        logger.log(0, {"a": np.float32(0.5), "b": torch.tensor(2.0), "c": np.int64(3), "d": True})
    (record,) = read_metrics(tmp_path / "metrics.jsonl")
    assert (record["a"], record["b"], record["c"], record["d"]) == (0.5, 2.0, 3.0, 1.0)


def test_log_after_close_raises(tmp_path: Path) -> None:
    logger = MetricsLogger(tmp_path, ["jsonl"])
    logger.close()
    logger.close()  # idempotent
    with pytest.raises(RuntimeError, match="after close"):
        logger.log(1, {"x": 1.0})


# --- tensorboard -------------------------------------------------------------------------------------------------


def test_tensorboard_scalars_readable_back_and_non_finite_skipped(tmp_path: Path) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    with MetricsLogger(tmp_path, ["tensorboard"]) as logger:
        logger.log(1, {"reward/mean": 0.25})
        logger.log(2, {"reward/mean": float("nan")})
        logger.log(3, {"reward/mean": 0.75})
    tb_dir = tmp_path / "tensorboard"
    assert list(tb_dir.glob("events.out.tfevents.*"))
    acc = EventAccumulator(str(tb_dir))
    acc.Reload()
    scalars = acc.Scalars("reward/mean")
    assert [(s.step, s.value) for s in scalars] == [(1, 0.25), (3, 0.75)]


# --- prometheus --------------------------------------------------------------------------------------------------


def test_prometheus_serves_sanitised_gauges_on_a_free_local_port(tmp_path: Path) -> None:
    logger = MetricsLogger(tmp_path, ["prometheus"], run_name="demo", prometheus_port=0)
    try:
        port = logger.prometheus_port
        assert isinstance(port, int) and port > 0
        logger.log(7, {"reward/mean": 0.5, "timing_s/generate": 2.0})
        logger.log(8, {"reward/mean": float("nan")})  # skipped: the gauge keeps 0.5
        text = _scrape(port)
    finally:
        logger.close()
    # parsed by prometheus_client's own parser: the values, not one version's way of printing them
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for f in text_string_to_metric_families(text)
        for s in f.samples
    }
    assert samples[("asyncrl_reward_mean", ())] == 0.5
    assert samples[("asyncrl_timing_s_generate", ())] == 2.0
    assert samples[("asyncrl_step", ())] == 8.0
    assert samples[("asyncrl_run_info", (("run", "demo"),))] == 1.0
    with pytest.raises(urllib.error.URLError):
        _scrape(port)  # close() released the port


def test_prometheus_rejects_two_keys_mapping_to_one_name(tmp_path: Path) -> None:
    with MetricsLogger(tmp_path, ["prometheus"], prometheus_port=0) as logger:
        logger.log(1, {"a/b": 1.0})
        with pytest.raises(ValueError, match=r"'a/b' and 'a\.b' both map to 'asyncrl_a_b'"):
            logger.log(2, {"a.b": 1.0})


# --- console -----------------------------------------------------------------------------------------------------


def test_console_prints_one_summary_line_per_step(tmp_path: Path, capsys) -> None:
    with MetricsLogger(tmp_path, ["console"], run_name="r1") as logger:
        logger.set_total(10)  # stdout is captured, not a TTY: no progress bar, just "k/total"
        logger.log(3, {"reward/mean": 0.5, "val/accuracy": 0.25, "timing_s/step": 1.234, "other": 9.0})
        logger.log(4, {"perf/throughput_tokens_per_s": 1234.0})
    lines = capsys.readouterr().out.splitlines()
    assert lines == ["[r1]  step 3/10  reward 0.5  val_acc 0.25  time 1.23s", "[r1]  step 4/10  1,234 tok/s"]


def test_console_flag_false_silences_the_console_backend(tmp_path: Path, capsys) -> None:
    with MetricsLogger(tmp_path, ["console", "jsonl"], console=False) as logger:
        logger.log(1, {"reward/mean": 0.5})
    assert capsys.readouterr().out == ""
    assert last_logged_step(tmp_path / "metrics.jsonl") == 1


# --- grafana -----------------------------------------------------------------------------------------------------


def test_grafana_dashboard_queries_asyncrl_metrics_via_a_prometheus_variable() -> None:
    dashboard = json.loads(GRAFANA_DASHBOARD.read_text())
    variables = dashboard["templating"]["list"]
    ds_vars = [v for v in variables if v["type"] == "datasource" and v["query"] == "prometheus"]
    assert len(ds_vars) == 1
    ds_ref = "${" + ds_vars[0]["name"] + "}"

    exprs: list[str] = []
    for panel in dashboard["panels"]:
        assert panel["datasource"]["uid"] == ds_ref, panel["title"]
        assert panel["targets"], panel["title"]
        for target in panel["targets"]:
            assert "asyncrl_" in target["expr"], (panel["title"], target["expr"])
            exprs.append(target["expr"])
    joined = "\n".join(exprs)
    for key in ("reward/mean", "val/accuracy", "perf/throughput_tokens_per_s", "staleness/mean"):
        assert sanitize_metric_name(key) in joined, key
    assert "asyncrl_timing_s_" in joined
