"""The Python API (``import asyncrl``): ``load_config`` from a dict, ``train`` with a callable reward and rows in
memory, in-process and on a real local Ray cluster; the examples use only public names."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

import asyncrl
from asyncrl.config.errors import ConfigError
from asyncrl.errors import UserInputError
from asyncrl.telemetry.trace import TRACE_FILE
from tests.helpers import make_data, make_model, train_overrides

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("api")
    train, test = make_data(root)
    return root, make_model(root, train), asyncrl.load_rows(train), asyncrl.load_rows(test)


def config_for(root: Path, model: Path, run: str, *extra: str) -> asyncrl.Config:
    over = train_overrides(model, Path("unused"), Path("unused"), root / run, 2)
    over = [o for o in over if not o.startswith(("data.train_files", "data.val_files"))]
    return asyncrl.load_config(None, [*over, "rollout.trace.enable=true", "trainer.test_freq=0", *extra])


def traced(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / TRACE_FILE).read_text().splitlines()]


@pytest.mark.parametrize(
    "schedule,backend",
    [
        ("sync", "in_process"),
        ("fully_async", "in_process"),
        pytest.param("sync", "ray", marks=pytest.mark.ray),
        pytest.param("fully_async", "ray", marks=pytest.mark.ray),
    ],
)
def test_train_with_a_lambda_reward_and_rows_in_memory(setup, schedule, backend):
    """The lambda scores every sample wherever the schedule scores it (the trainer's engine, the Rollouter; this
    process or a Ray worker): each traced sample's reward is the lambda's value of its own text."""
    root, model, train, test = setup
    cfg = config_for(root, model, f"{schedule}_{backend}", f"trainer.schedule={schedule}", f"trainer.backend={backend}")
    reward = lambda data_source, solution_str, ground_truth, extra_info=None: (len(solution_str) + 1) / 100  # noqa: E731
    result = asyncrl.train(cfg, reward=reward, train_data=list(train), val_data=list(test)[:4])
    assert result.metrics["step"] == 2 and result.summary["steps"] == 2
    assert (result.model_dir / "config.json").is_file() and result.run_dir == root / f"{schedule}_{backend}"
    records = traced(result.run_dir)
    assert records and all(r["reward"] == pytest.approx((len(r["response_text"]) + 1) / 100) for r in records)
    assert not cfg.data.train_files  # the caller's Config is not changed
    # what a resume reads again: the rows and the pickled function, in the run directory
    assert {p.name for p in (result.run_dir / "inputs").iterdir()} == {"train.jsonl", "val.jsonl", "reward_fn.pkl"}


def test_a_batch_reward_gets_each_sample_as_a_dict(setup):
    root, model, train, _ = setup
    cfg = config_for(root, model, "batch", "trainer.backend=in_process")

    def batch_reward(samples):
        # a failed assert fails the sample: reward 0, neither 0.5 nor 0.25
        assert set(samples[0]) == {"data_source", "solution_str", "ground_truth", "extra_info"}
        return [0.5 if s["ground_truth"] in s["solution_str"] else 0.25 for s in samples]

    result = asyncrl.train(cfg, reward=batch_reward, train_data=list(train))
    for r in traced(result.run_dir):
        assert r["reward"] == (0.5 if r["ground_truth"] in r["response_text"] else 0.25)
    assert result.metrics["step"] == 2


def test_bad_inputs_fail_before_any_worker_starts(setup):
    root, model, train, _ = setup
    cfg = config_for(root, model, "bad")
    lock = threading.Lock()
    with pytest.raises(UserInputError, match=r"reward 'locked' cannot be pickled to reach the workers: TypeError"):

        def locked(data_source, solution_str, ground_truth, extra_info=None):
            with lock:  # a lock cannot travel to another process
                return 0.0

        asyncrl.train(cfg, reward=locked, train_data=list(train))
    rows = list(train)
    rows[3] = {**rows[3], "reward_model": {}}
    with pytest.raises(UserInputError, match=r"train_data\[3\]"):
        asyncrl.train(cfg, reward=lambda *a: 0.0, train_data=rows)
    with pytest.raises(ConfigError, match="no training data"):
        asyncrl.train(cfg, reward=lambda *a: 0.0)
    with pytest.raises(ConfigError, match=r"config dict: unknown config key 'rollout.nn'"):
        asyncrl.load_config({"rollout": {"nn": 3}})
    assert not (root / "bad" / "metrics.jsonl").exists()


def test_load_config_takes_a_dict_and_overrides():
    cfg = asyncrl.load_config({"model": {"path": "m"}, "rollout": {"n": 3}}, ["trainer.schedule=fully_async"])
    assert isinstance(cfg, asyncrl.Config)
    assert (cfg.model.path, cfg.rollout.n, cfg.trainer.schedule) == ("m", 3, "fully_async")


def public_imports(path: Path) -> list[str]:
    """Every name ``path`` imports from ``asyncrl`` that is not public (``asyncrl.__all__``), as ``module:name``."""
    bad = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "asyncrl":
            bad += [
                f"{node.module}:{a.name}"
                for a in node.names
                if node.module != "asyncrl" or a.name not in asyncrl.__all__
            ]
        elif isinstance(node, ast.Import):
            bad += [a.name for a in node.names if a.name.startswith("asyncrl.")]
    return bad


@pytest.mark.parametrize("example", ["minimal_grpo.py", "train_from_python.py"])
def test_the_examples_import_only_public_names(example):
    assert public_imports(ROOT / "examples" / example) == []
    for name in asyncrl.__all__:
        assert getattr(asyncrl, name) is not None  # every public name resolves


def test_train_from_python_example_runs(setup, tmp_path):
    root, model, _, _ = setup
    over = [f"model.path={model}", "trainer.total_training_steps=2", f"trainer.default_local_dir={tmp_path / 'py'}"]
    over += ["trainer.backend=in_process", "data.train_batch_size=4", "rollout.n=4", "rollout.response_length=6"]
    over += ["actor.ppo_mini_batch_size=2", "actor.ppo_micro_batch_size=4", "trainer.test_freq=0"]
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    out = subprocess.run(
        [sys.executable, "examples/train_from_python.py", *over], cwd=ROOT, env=env, capture_output=True, text=True
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert "steps: 2" in out.stdout and (tmp_path / "py" / "inputs" / "reward_fn.pkl").is_file()
