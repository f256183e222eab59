"""On-policy distillation end to end: a real teacher server process on loopback, real micro models sharing one char
tokenizer (both built from the same data, as the distillation example does). two_step_off and the CLI run on a real
local Ray cluster; the rest use in-process roles (the same workers and schedules, seconds faster per run)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from asyncrl.algorithms import check_config
from asyncrl.checkpoint import load_driver_state
from asyncrl.config import ConfigError, load_config
from asyncrl.data.rows import load_rows, write_rows
from asyncrl.schedules import run_training
from asyncrl.teacher.launch import TeacherStartError, start_teacher_server, stop_process
from asyncrl.teacher.protocol import TokenizerMismatchError
from asyncrl.telemetry.metrics import read_metrics
from asyncrl.telemetry.timeline import read_chrome_trace
from tests.helpers import make_data, make_model, train_overrides

TIMERS = ("timing_s/get_teacher_knowledge", "timing_s/update_actor", "actor/kl_loss")


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("distill")
    train, test = make_data(root)
    student = make_model(root, train, seed=0)
    teacher = make_model(root / "t", train, seed=7)  # same data -> same char tokenizer, different weights
    yield root, student, teacher, train, test


@pytest.fixture(scope="module")
def shared_teacher(setup):
    """One teacher server for the tests that are not about starting one (a start costs seconds of imports): a
    server the user started, given as ``teacher.url``, which a run uses and leaves running."""
    proc, url = start_teacher_server(
        str(setup[2]), setup[0] / "shared_teacher.log", max_batch=8, threads=1, startup_timeout_s=60
    )
    yield proc, url
    stop_process(proc)


def overrides(
    setup, run_dir, steps: int, schedule: str, teacher_url: str | None = None, backend: str = "in_process"
) -> list[str]:
    root, student, teacher, train, test = setup
    over = train_overrides(student, train, test, run_dir, steps)
    over += ["algorithm.name=distill", f"trainer.schedule={schedule}", f"trainer.backend={backend}"]
    if schedule != "sync":
        over += ["rollout.num_workers=1", "rollout.cpus_per_worker=0.5"]
    over += [
        "weight_sync.verify=true",
        "weight_sync.timeout_s=30",
        "teacher.top_k=4",
        "teacher.timeout_s=20",
        "teacher.max_retries=1",
    ]
    over.append(f"teacher.url={teacher_url}" if teacher_url else f"teacher.model_path={teacher}")
    return over


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.mark.parametrize(
    "schedule,staleness,backend",
    [
        ("sync", 0.0, "in_process"),
        ("one_step_off", 1.0, "in_process"),
        pytest.param("two_step_off", 2.0, "ray", marks=pytest.mark.ray),
    ],
)
def test_each_schedule_distills_with_its_staleness(setup, schedule, staleness, backend):
    root = setup[0]
    run_dir = root / f"run_{schedule}"
    summary = run_training(load_config(None, overrides(setup, run_dir, 3, schedule, backend=backend)))
    pid = summary["teacher"]["pid"]  # the server this run started, by the PID it reports
    assert isinstance(pid, int) and not _alive(pid), "the teacher server started for the run is stopped at its end"
    metrics = {m["step"]: m for m in read_metrics(run_dir / "metrics.jsonl")}
    assert sorted(metrics) == [0, 1, 2, 3]
    for step in (1, 2, 3):
        m = metrics[step]
        for key in TIMERS:
            assert m[key] > 0, (schedule, step, key)
        assert m["distill/on_policy"] == 1.0
    # staleness read from the versions the engine recorded: the pipeline fills up to its depth, then stays there
    assert metrics[3]["staleness/max"] == staleness
    assert metrics[1]["staleness/max"] == 0.0
    waits = {"sync": [], "one_step_off": ["wait_prev_gen"], "two_step_off": ["wait_prev_prepare", "wait_prev_gen"]}
    # at step 2 the schedule's own waits were timed (a driver span each), and the weights were sent
    assert {f"timing_s/{w}" for w in waits[schedule]} <= set(metrics[2])
    assert (metrics[2].get("weight_sync/seconds", 0) > 0) == (schedule != "sync")
    spans = {(e["name"], e["step"]) for e in read_chrome_trace(run_dir / "timeline.json")}
    assert {(w, 2) for w in waits[schedule]} <= spans
    assert summary["samples"] == 3 * 4 * 4
    assert summary["teacher"]["checked"] == ["fingerprint"]
    names = {e["name"] for e in read_chrome_trace(run_dir / "timeline.json")}
    assert {"teacher", "update_actor"} <= names


def test_distillation_moves_the_student_toward_the_teacher(setup, shared_teacher):
    """Full-batch steps of forward KL on fixed sequences (a two-row dataset and its answers, ``distill.lmbda=0``):
    one deterministic objective, so the student's loss against the teacher falls whatever the CPU's kernels."""
    root = setup[0]
    run_dir = root / "run_learn"
    two_rows = root / "two_rows.jsonl"
    write_rows(two_rows, load_rows([str(setup[3])])[:2])
    over = overrides(setup, run_dir, 12, "sync", teacher_url=shared_teacher[1]) + [
        "trainer.test_freq=0",
        "trainer.save_freq=0",
        "data.train_batch_size=2",
        "actor.ppo_mini_batch_size=2",  # one optimizer step per training step, on the whole batch
        "distill.lmbda=0",  # the dataset's answers every step: the same sequences, so the losses are comparable
        "data.shuffle=false",
        f"data.train_files=[{two_rows}]",
        "actor.optim.lr=3e-3",
    ]
    run_training(load_config(None, over))
    kl = [m["actor/kl_loss"] for m in read_metrics(run_dir / "metrics.jsonl") if "actor/kl_loss" in m]
    assert len(kl) == 12
    assert sum(kl[-3:]) / 3 < sum(kl[:3]) / 3


def test_resume_continues_the_schedule_without_losing_a_batch(setup, shared_teacher):
    root = setup[0]
    run_dir = root / "run_resume"
    base = overrides(setup, run_dir, 2, "two_step_off", teacher_url=shared_teacher[1]) + [
        "trainer.val_before_train=false",
        "trainer.save_freq=1",
    ]
    run_training(load_config(None, base))
    # the checkpoint of step 2 was written with batches 3 and 4 not yet trained: its cursor is after batch 2
    state = load_driver_state(run_dir / "checkpoints" / "step_2")
    assert (state["sampler"]["epoch"], state["sampler"]["position"]) == (0, 2 * 4)
    run_training(load_config(None, base + ["trainer.total_training_steps=4", "trainer.resume_mode=auto"]))
    metrics = read_metrics(run_dir / "metrics.jsonl")
    assert [m["step"] for m in metrics] == [1, 2, 3, 4]
    assert json.loads((run_dir / "summary.json").read_text())["samples"] == 4 * 4 * 4


def test_a_given_url_is_used_and_left_running(setup, shared_teacher):
    proc, url = shared_teacher
    run_dir = setup[0] / "run_url"
    summary = run_training(load_config(None, overrides(setup, run_dir, 1, "one_step_off", teacher_url=url)))
    assert summary["teacher"]["url"] == url
    assert proc.poll() is None, "a server the user started is theirs: the run does not stop it"


def test_a_teacher_with_another_vocabulary_is_refused_before_training(setup, tmp_path):
    root, student, teacher, train, test = setup
    from asyncrl.data.tasks import write_task_dataset
    from asyncrl.finetune.sft import init_model_from_data

    other_train, _ = write_task_dataset("basic_arithmetic", 32, 0, tmp_path / "other", test_size=4)
    other = tmp_path / "other_model"
    init_model_from_data("micro", [str(other_train)], str(other), 0)
    run_dir = tmp_path / "run_mismatch"
    over = overrides(setup, run_dir, 1, "sync")[:-1] + [f"teacher.model_path={other}"]
    with pytest.raises(TokenizerMismatchError, match="different vocabularies"):
        run_training(load_config(None, over))
    assert not (run_dir / "metrics.jsonl").exists() or read_metrics(run_dir / "metrics.jsonl") == []


def test_config_errors_name_the_key(setup, tmp_path):
    with pytest.raises(ConfigError, match="teacher.model_path"):
        check_config(load_config(None, overrides(setup, tmp_path, 1, "sync")[:-1]))
    with pytest.raises(ConfigError, match="config key trainer.schedule must be one of sync, one_step_off"):
        load_config(None, overrides(setup, tmp_path, 1, "three_step_off"))
    with pytest.raises(ConfigError, match="distill.loss"):
        load_config(None, overrides(setup, tmp_path, 1, "sync") + ["distill.loss=mse"])
    with pytest.raises(ConfigError, match="trainer.scheduler was replaced by trainer.schedule"):
        load_config(None, overrides(setup, tmp_path, 1, "sync") + ["trainer.scheduler=serial"])
    with pytest.raises(ConfigError, match="config section teacher: set, but algorithm.name=grpo never reads it"):
        check_config(load_config(None, overrides(setup, tmp_path, 1, "sync") + ["algorithm.name=grpo"]))


def test_a_teacher_that_cannot_start_is_a_clear_error(tmp_path):
    bad = tmp_path / "not_a_model"
    bad.mkdir()
    with pytest.raises(TeacherStartError, match="not_a_model"):
        start_teacher_server(str(bad), tmp_path / "err.log", max_batch=2, threads=1, startup_timeout_s=60)


def test_the_distill_command_runs_from_a_config_file(setup, shared_teacher, tmp_path):
    """``asyncrl distill --config``: the CLI path a user runs (a separate interpreter, as from a shell). In-process
    roles: the Ray backend's distillation is the schedule test's (two_step_off on Ray)."""
    run_dir = tmp_path / "cli"
    over = overrides(setup, run_dir, 1, "one_step_off", teacher_url=shared_teacher[1])
    over = [o for o in over if not o.startswith("algorithm.name")]
    out = subprocess.run(
        [sys.executable, "-m", "asyncrl.cli", "distill", "--config", "configs/distill.yaml", *over],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert json.loads(out.stdout.strip().splitlines()[-1])["steps"] == 1
    assert (run_dir / "final" / "config.json").exists()
