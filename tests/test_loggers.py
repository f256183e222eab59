"""The W&B and MLflow loggers: a real run's every metric of every step is in each tracker's history once, equal to
``metrics.jsonl``, and a resumed run continues the same tracker runs; a missing package is one error at load.

W&B runs offline (``WANDB_MODE=offline``, its files in a temporary ``WANDB_DIR``) and its history is read back from
the offline runs' transaction logs by wandb's own reader, ``wandb leet inspect --json`` (wandb 0.31 has no Python
reader of them). MLflow logs to its default here, a file store in the run directory, read back with
``MlflowClient.get_metric_history``.
"""

from __future__ import annotations

import importlib.util
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from asyncrl.config import ConfigError, load_config
from asyncrl.telemetry.metrics import MetricsLogger, read_metrics
from asyncrl.telemetry.trackers import STATE_FILES, RunInfo
from tests.helpers import make_data, make_model, train_overrides

BASE = ["model.path=m", "data.train_files=[t.parquet]"]
HAVE_TRACKERS = all(importlib.util.find_spec(m) for m in ("wandb", "mlflow"))


def needs_trackers(test):
    """The tests that run W&B and MLflow (the test extra installs both; elsewhere they skip, saying why)."""
    reason = "needs the wandb and mlflow extras: pip install 'asyncrl[wandb,mlflow]'"
    return pytest.mark.optional(pytest.mark.skipif(not HAVE_TRACKERS, reason=reason)(test))


@pytest.fixture(autouse=True)
def _wandb_offline(tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path / "wandb_dir"))
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)


def wandb_logs(wandb_dir: Path, run_id: str) -> list[Path]:
    """The transaction logs of ``run_id``'s offline runs, one per start, in the order they started: W&B names each
    ``offline-run-<start time>-<id>``, with ``-1``, ``-2``... after it when two start in the same second."""

    def order(log: Path) -> tuple[str, int]:
        stamp, _, suffix = log.parent.name.partition(f"-{run_id}")
        return stamp, int(suffix.lstrip("-") or 0)

    return sorted(wandb_dir.glob(f"wandb/offline-run-*/run-{run_id}.wandb"), key=order)


def inspect(log: Path) -> list[dict]:
    """The records of a ``.wandb`` transaction log, read by wandb's own reader (``wandb leet inspect --json``)."""
    cmd = [sys.executable, "-m", "wandb", "leet", "inspect", "--json", str(log)]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True, timeout=120).stdout
    return [json.loads(line) for line in out.splitlines()]


def wandb_history(wandb_dir: Path, run_id: str) -> list[tuple[int, dict]]:
    """Every history row W&B wrote offline for ``run_id`` as (step, metrics), in the order written, over its offline
    runs (each start of the run writes one: ``offline-run-<time>-<id>/run-<id>.wandb``)."""
    rows = []
    for log in wandb_logs(wandb_dir, run_id):
        for record in inspect(log):
            if record["type"] == "history":
                item, step = record["history"]["item"], int(record["history"]["step"]["num"])
                rows.append((step, {k: _value(v) for k, v in item.items() if not k.startswith("_")}))
    return rows


def wandb_run_record(wandb_dir: Path, run_id: str) -> dict:
    """The ``run`` record of the first offline run of ``run_id``: its project, name and config."""
    log = sorted(wandb_dir.glob(f"wandb/offline-run-*-{run_id}/run-{run_id}.wandb"))[0]
    out = subprocess.run(
        [sys.executable, "-m", "wandb", "leet", "inspect", "--json", str(log)],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return next(json.loads(line)["run"] for line in out.splitlines() if json.loads(line)["type"] == "run")


def mlflow_client(run_dir: Path):
    from mlflow.tracking import MlflowClient

    return MlflowClient(tracking_uri=(run_dir / "mlruns").resolve().as_uri())


def mlflow_history(run_dir: Path, run_id: str) -> list[tuple[int, dict]]:
    """Every (step, metrics) MLflow holds for ``run_id``, one entry per (metric, step) it recorded."""
    client = mlflow_client(run_dir)
    by_step: dict[int, dict] = {}
    rows = []
    for key in client.get_run(run_id).data.metrics:
        for m in client.get_metric_history(run_id, key):
            rows.append((m.step, key))
            by_step.setdefault(m.step, {})[key] = _value(m.value)
    assert len(rows) == len(set(rows)), "MLflow holds a metric twice at one step"
    return sorted(by_step.items())


def _value(v: float | str | None) -> float | None:
    """A logged value as ``metrics.jsonl`` writes it: non-finite ones (W&B: "NaN", "Infinity") as None."""
    v = float(v) if v is not None else None
    return v if v is not None and math.isfinite(v) else None


def jsonl_history(run_dir: Path) -> list[tuple[int, dict]]:
    return [
        (m["step"], {k: v for k, v in m.items() if k not in ("step", "time")})
        for m in read_metrics(run_dir / "metrics.jsonl")
    ]


def state(run_dir: Path, logger: str) -> dict:
    return json.loads((run_dir / STATE_FILES[logger]).read_text())


# ---- a real run, then its resumption ------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("loggers")
    train, test = make_data(root, size=32, test_size=4)
    return root, make_model(root, train), train, test


def _train(setup, run_dir: Path, steps: int, *extra: str) -> None:
    from asyncrl.schedules import run_training

    _, model, train, test = setup
    over = train_overrides(model, train, test, run_dir, steps) + [
        "trainer.backend=in_process",
        "trainer.logger=[console,jsonl,wandb,mlflow]",
        "trainer.project_name=asyncrl-tests",
        "trainer.experiment_name=six-steps",
        *extra,
    ]
    run_training(load_config(None, over))


@needs_trackers
def test_every_metric_of_every_step_reaches_wandb_and_mlflow_once_and_a_resume_continues_their_runs(setup, tmp_path):
    run_dir, wandb_dir = tmp_path / "run", tmp_path / "wandb_dir"
    _train(setup, run_dir, 6)
    jsonl = jsonl_history(run_dir)
    assert [s for s, _ in jsonl] == list(range(7)) and len(jsonl[1][1]) > 20  # step 0: the evaluation before
    wandb_id, mlflow_id = state(run_dir, "wandb")["run_id"], state(run_dir, "mlflow")["run_id"]
    assert wandb_history(wandb_dir, wandb_id) == jsonl
    assert mlflow_history(run_dir, mlflow_id) == jsonl

    # what the run is, recorded once at its start: config, command line, placement
    record = wandb_run_record(wandb_dir, wandb_id)
    assert (record["project"], record["display_name"]) == ("asyncrl-tests", "six-steps")
    config = record["config"]["update"]
    assert config["trainer"]["total_training_steps"] == 6 and config["run"]["command"]
    assert config["run"]["placement"]["workers"]
    client = mlflow_client(run_dir)
    run = client.get_run(mlflow_id)
    assert (run.info.run_name, run.info.status) == ("six-steps", "FINISHED")
    assert client.get_experiment(run.info.experiment_id).name == "asyncrl-tests"
    assert run.data.params["trainer.total_training_steps"] == "6" and run.data.params["run.command"]
    whole = json.loads(Path(client.download_artifacts(mlflow_id, "asyncrl/run.json", str(tmp_path))).read_text())
    assert whole["trainer"]["experiment_name"] == "six-steps" and whole["run"]["placement"]["workers"]

    _train(setup, run_dir, 9, "trainer.resume_mode=auto")
    jsonl = jsonl_history(run_dir)
    assert [s for s, _ in jsonl] == list(range(10))
    assert state(run_dir, "wandb")["run_id"] == wandb_id and state(run_dir, "mlflow")["run_id"] == mlflow_id
    assert len(wandb_logs(wandb_dir, wandb_id)) == 2  # one per start, of one W&B run
    assert wandb_history(wandb_dir, wandb_id) == jsonl  # each step once, in order, across both starts
    assert mlflow_history(run_dir, mlflow_id) == jsonl
    assert len(client.search_runs([run.info.experiment_id])) == 1
    artifacts = {a.path for a in client.list_artifacts(mlflow_id, "asyncrl")}
    assert artifacts == {"asyncrl/run.json", "asyncrl/resumed_after_step_6.json"}
    assert client.get_run(mlflow_id).info.status == "FINISHED"


# ---- the loggers on their own ---------------------------------------------------------------------------------------
def _log(run_dir: Path, steps: range, resumed: bool, offset: float) -> dict[str, str]:
    info = RunInfo("p", "n", {"trainer": {"seed": 1}}, "asyncrl train", {}, resumed=resumed)
    with MetricsLogger(run_dir, ["wandb", "mlflow"], run=info) as logger:
        for step in steps:
            logger.log(step, {"reward/mean": offset + step, "bad": math.nan})
        return {name: t.run_id for name, t in logger.trackers.items()}


@needs_trackers
def test_a_resume_skips_the_steps_its_trackers_already_logged(tmp_path):
    """Steps 3..4 logged by a run that died before checkpointing them come again after the resume: the trackers keep
    their first values, each step once."""
    run_dir = tmp_path / "run"
    first = _log(run_dir, range(1, 5), resumed=False, offset=0.0)
    again = _log(run_dir, range(3, 7), resumed=True, offset=100.0)
    assert again == first
    want = [(s, {"reward/mean": float(s if s <= 4 else 100 + s), "bad": None}) for s in range(1, 7)]
    assert wandb_history(tmp_path / "wandb_dir", first["wandb"]) == want
    assert mlflow_history(run_dir, first["mlflow"]) == want


@needs_trackers
def test_a_run_that_does_not_resume_starts_new_tracker_runs(tmp_path):
    run_dir = tmp_path / "run"
    first = _log(run_dir, range(1, 3), resumed=False, offset=0.0)
    fresh = _log(run_dir, range(1, 3), resumed=False, offset=0.0)
    assert first["wandb"] != fresh["wandb"] and first["mlflow"] != fresh["mlflow"]
    assert [s for s, _ in mlflow_history(run_dir, fresh["mlflow"])] == [1, 2]


@needs_trackers
def test_a_run_that_raises_marks_its_mlflow_run_failed(tmp_path):
    run_dir = tmp_path / "run"
    with pytest.raises(RuntimeError, match="boom"):
        with MetricsLogger(run_dir, ["mlflow"], run=RunInfo("p", "n")) as logger:
            logger.log(1, {"a": 1.0})
            raise RuntimeError("boom")
    client = mlflow_client(run_dir)
    assert client.get_run(state(run_dir, "mlflow")["run_id"]).info.status == "FAILED"


# ---- the config ---------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("logger, install", [("wandb", "pip install wandb"), ("mlflow", "pip install mlflow")])
def test_a_missing_tracker_package_is_one_error_at_load_naming_what_to_install(monkeypatch, logger, install):
    monkeypatch.setitem(sys.modules, logger, None)  # as if it were not installed: its import fails
    with pytest.raises(ConfigError) as e:
        load_config(None, [*BASE, f"trainer.logger=[console,{logger}]"])
    message = str(e.value)
    assert message.startswith(f"config key trainer.logger lists {logger}, but the {logger} package is not installed")
    assert install in message and f"pip install 'asyncrl[{logger}]'" in message


def test_verls_project_and_experiment_names_are_accepted():
    cfg = load_config(
        None, [*BASE, "trainer.project_name=verl_grpo_example_gsm8k", "trainer.experiment_name=qwen2_7b_function_rm"]
    )
    assert (cfg.trainer.project_name, cfg.trainer.experiment_name) == (
        "verl_grpo_example_gsm8k",
        "qwen2_7b_function_rm",
    )
    default = load_config(None, BASE)
    assert (default.trainer.project_name, default.trainer.experiment_name) == ("asyncrl", None)
    with pytest.raises(ConfigError, match="config key trainer.project_name must be a non-empty name"):
        load_config(None, [*BASE, "trainer.project_name=''"])
