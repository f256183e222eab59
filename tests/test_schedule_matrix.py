"""Every algorithm on every schedule, with in-process role clients: the same workers, schedules and algorithms as a
Ray run, in one process, so the whole 3 x 4 matrix runs in seconds per pair.

Each pair runs 2 steps of ``run_training`` on micro models (distill's teacher is a real ``asyncrl serve-teacher``
process on loopback, shared by the distill cases) and must write the usual run directory, log every step once,
train the expected number of samples and show the staleness its schedule promises, measured from the versions the
engine recorded on each sample.
"""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from asyncrl.algorithms import builtin_algorithms
from asyncrl.config import SCHEDULES, load_config
from asyncrl.schedules import run_training
from asyncrl.teacher.launch import start_teacher_server, stop_process
from asyncrl.telemetry.metrics import read_metrics
from tests.helpers import make_data, make_model, train_overrides

# staleness/max at steps 1 and 2: batch 1 always comes from the initial weights; one_step_off trains batch 2 one
# version late; two_step_off generated batches 1 and 2 before any update (2 becomes 2 late from batch 3 on)
EXPECTED_STALENESS = {"sync": [0, 0], "one_step_off": [0, 1], "two_step_off": [0, 1], "fully_async": None}
SCHEDULE_KEYS = {
    "sync": [],
    "one_step_off": ["rollout.num_workers=1", "rollout.cpus_per_worker=1"],
    "two_step_off": ["rollout.num_workers=2", "rollout.cpus_per_worker=1"],
    "fully_async": ["async_training.staleness_threshold=1.0"],
}


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("matrix")
    train, test = make_data(root, size=32, test_size=8)
    student = make_model(root, train, seed=0)
    teacher = make_model(root / "t", train, seed=7)  # same data -> same char tokenizer
    proc, url = start_teacher_server(str(teacher), root / "teacher.log", max_batch=16, threads=1, startup_timeout_s=120)
    yield root, student, train, test, url
    stop_process(proc)


def algorithm_keys(name: str, url: str) -> list[str]:
    if name == "ppo":
        return ["algorithm.name=ppo", "critic.optim.lr=1e-3"]
    if name == "distill":
        return ["algorithm.name=distill", f"teacher.url={url}", "teacher.top_k=4", "teacher.timeout_s=20"]
    if name == "dpo":
        return ["algorithm.name=dpo", "dpo.beta=0.5"]
    return ["algorithm.name=grpo"]


@pytest.mark.parametrize("schedule", SCHEDULES)
@pytest.mark.parametrize("algorithm", builtin_algorithms())
def test_every_algorithm_runs_on_every_schedule(setup, algorithm, schedule):
    root, model, train, test, url = setup
    run_dir = root / f"{algorithm}_{schedule}"
    over = train_overrides(model, train, test, run_dir, 2) + ["trainer.backend=in_process", "weight_sync.verify=true"]
    over += [f"trainer.schedule={schedule}", *SCHEDULE_KEYS[schedule], *algorithm_keys(algorithm, url)]
    summary = run_training(load_config(None, over))

    groups_per_step = 2 if schedule == "fully_async" else 4  # require_batches x ppo_mini_batch_size | train_batch_size
    assert summary["steps"] == 2 and summary["samples"] == 2 * groups_per_step * 4
    for name in ("config.yaml", "metrics.jsonl", "summary.json", "timeline.json", "final/config.json"):
        assert (run_dir / name).is_file(), name
    assert (run_dir / "checkpoints" / "step_2" / "model" / "config.json").is_file()
    metrics = {m["step"]: m for m in read_metrics(run_dir / "metrics.jsonl")}
    assert sorted(metrics) == [0, 1, 2]  # accuracy before training, then each step once
    assert metrics[2]["val/accuracy"] == summary["accuracy_after"] and metrics[2]["val/n"] > 0
    # the engine prefilled each group's prompt once (n = 4 rows: 3 of 4 copies saved), on every schedule's rollout;
    # the Rollouter's resumed partial rows are distinct prefixes, so there it saves at most that
    saving = metrics[1]["perf/rollout_prefill_saving"]
    assert (0 < saving <= 0.75) if schedule == "fully_async" else saving == pytest.approx(0.75), saving
    staleness = [metrics[s]["staleness/max"] for s in (1, 2)]
    if EXPECTED_STALENESS[schedule] is not None:
        assert staleness == EXPECTED_STALENESS[schedule]
    else:
        assert all(0 <= s <= 1 for s in staleness)  # the bound of staleness_threshold=1.0, one sync per step
        assert summary["ledger"]["lost"] == 0 and summary["ledger"]["duplicated"] == 0
    no_signal = metrics[2]["reward/group_spread_frac"] == 0  # every group tied: no advantage, no preference pair
    # PPO: no reward at all and a critic still at its zero-initialised value head: returns = values = 0, no advantage
    ppo_no_signal = metrics[2]["reward/max"] == 0 and metrics[2].get("critic/vf_loss") == 0
    if (algorithm in ("grpo", "dpo") and no_signal) or (algorithm == "ppo" and ppo_no_signal):
        assert metrics[2]["actor/grad_norm"] == 0  # GRPO/PPO have no gradient, DPO steps on a placeholder pair
    else:
        assert metrics[2]["actor/grad_norm"] > 0  # the actor learned at step 2
    if algorithm == "dpo":  # one pair per group whose rewards differ
        assert metrics[2]["dpo/pairs"] == pytest.approx(groups_per_step * (1 - metrics[2]["dpo/tie_rate"]))
    if algorithm == "ppo" and schedule == "sync":  # generated by the weights the update starts from: the engine's
        assert metrics[2]["rollout_corr/logprob_diff_max"] < 1e-4  # log-probs are the trainer's, to float precision
    if algorithm == "ppo":
        assert math.isfinite(metrics[2]["critic/vf_loss"]) and (ppo_no_signal or metrics[2]["critic/grad_norm"] > 0)
    if algorithm == "distill":
        assert metrics[2]["actor/kl_loss"] > 0 and metrics[2]["distill/teacher_token_logp_mean"] < 0
    if schedule != "sync":
        assert metrics[1]["weight_sync/bytes_per_s"] > 0  # (two_step_off has nothing left to sync for at its last step)
    trace = json.loads((run_dir / "timeline.json").read_text())
    names = {e["name"] for e in trace["traceEvents"] if e.get("ph") == "X"}
    assert {"generate", "update_actor", "train"} <= names, names
    logged = {k for m in read_metrics(run_dir / "metrics.jsonl") for k in m}
    assert not undocumented_metrics(logged), f"metrics missing from docs/metrics.md: {undocumented_metrics(logged)}"


def undocumented_metrics(keys: set[str]) -> list[str]:
    """Keys not in docs/metrics.md, which names each metric in backticks (a family as `prefix/*`)."""
    doc = (Path(__file__).resolve().parents[1] / "docs" / "metrics.md").read_text()
    names = set(re.findall(r"`([a-z_]+(?:/[A-Za-z0-9_*]+)*)`", doc))
    families = [n[:-1] for n in names if n.endswith("/*")]
    return sorted(k for k in keys if k not in names and not any(k.startswith(f) for f in families))


@pytest.mark.parametrize("algorithm", builtin_algorithms())
def test_fully_async_resume_loses_and_repeats_no_prompt_for_every_algorithm(setup, algorithm):
    """A fully_async run stopped at a checkpoint and resumed: the queue and in-flight rows it held come back, so
    over the whole run every prompt of a finished epoch is trained on exactly once, whatever the algorithm."""
    root, model, train, test, url = setup
    run_dir = root / f"resume_{algorithm}"
    over = train_overrides(model, train, test, run_dir, 4) + [
        "trainer.backend=in_process",
        "trainer.schedule=fully_async",
    ]
    over += ["async_training.staleness_threshold=1.0", "trainer.save_freq=2", "trainer.val_before_train=false"]
    over += ["trainer.test_freq=0", *algorithm_keys(algorithm, url)]
    run_training(load_config(None, over))  # 4 steps x 2 groups: epoch 0 of 32 prompts is not complete yet
    summary = run_training(load_config(None, over + ["trainer.total_training_steps=20", "trainer.resume_mode=auto"]))
    assert [m["step"] for m in read_metrics(run_dir / "metrics.jsonl")] == list(range(1, 21))
    assert summary["samples"] == 20 * 2 * 4 and summary["ledger"]["epochs_complete"] >= 1
    assert summary["ledger"]["lost"] == 0 and summary["ledger"]["duplicated"] == 0
    ledger = json.loads((run_dir / "ledger.json").read_text())
    assert ledger["epochs"]["0"]["complete"] and ledger["epochs"]["0"]["consumed_once"] == 32


def test_in_process_runs_without_loading_ray(setup):
    """``trainer.backend=in_process`` is a second backend, not a Ray cluster in disguise: a whole run (here PPO on
    one_step_off, with a weight-sync group) completes in a fresh interpreter that never imports ``ray``."""
    root, model, train, test, url = setup
    over = train_overrides(model, train, test, root / "no_ray", 1) + ["trainer.backend=in_process"]
    over += ["trainer.schedule=one_step_off", *SCHEDULE_KEYS["one_step_off"], *algorithm_keys("ppo", url)]
    code = (
        "import sys, json; from asyncrl.config import load_config; from asyncrl.schedules import run_training; "
        f"s = run_training(load_config(None, {over!r})); "
        "print(json.dumps({'steps': s['steps'], 'ray': sorted(m for m in sys.modules if m.split('.')[0] == 'ray')}))"
    )
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=env)
    assert out.returncode == 0, out.stderr[-3000:]
    assert json.loads(out.stdout.strip().splitlines()[-1]) == {"steps": 1, "ray": []}
