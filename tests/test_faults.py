"""Fault injection (``make test-faults``): parts of a run die while the rest lives, on a real local Ray cluster.

- a rollout worker killed (SIGKILL) at a random moment is replaced and the run completes with every step once, every
  prompt's samples trained once, and the schedule's staleness bound; the same for the fully_async Rollouter, with
  the prompt ledger as the evidence, and again with rewards and an agent's tool calls in flight at the kill;
- past ``trainer.max_worker_restarts`` the run stops with one error naming the worker, after a checkpoint, and
  ``resume_mode=auto`` completes it;
- the trainer killed: the run stops with one error (no hang) and resumes;
- the driver killed at random moments (mid-checkpoint included): the resumed run logs each step once;
- the driver killed alone: no Ray process of that run is left behind.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from asyncrl.config import load_config
from asyncrl.run.supervision import WorkerLostError
from asyncrl.schedules import run_training
from asyncrl.telemetry.metrics import read_metrics
from tests.helpers import make_data, make_model, train_overrides

pytestmark = [pytest.mark.ray, pytest.mark.faults]
ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("faults")
    train, test = make_data(root, size=40, test_size=8)
    return root, make_model(root, train), train, test


def pids_of(title: str) -> list[int]:
    """Processes whose command line contains ``title`` (Ray names an actor's process ``ray::<Class>...``)."""
    out = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                if title in (d / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace"):
                    out.append(int(d.name))
            except OSError:
                pass
    return out


def kill_when(
    run_dir: Path, title: str, after_step: int, delay_s: float, killed: list[int], sig: int = signal.SIGKILL
) -> threading.Thread:
    """A thread that sends ``sig`` (SIGKILL: a death; SIGSTOP: a hang) to one process named ``title`` ``delay_s``
    after step ``after_step`` was logged."""

    def go() -> None:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            m = run_dir / "metrics.jsonl"
            if m.exists() and any(r["step"] >= after_step for r in read_metrics(m)):
                break
            time.sleep(0.05)
        time.sleep(delay_s)
        pids = pids_of(title)
        if pids:
            os.kill(pids[0], sig)
            killed.append(pids[0])

    t = threading.Thread(target=go, daemon=True)
    t.start()
    return t


def pool_overrides(model, train, test, run_dir, steps, schedule="one_step_off") -> list[str]:
    over = train_overrides(model, train, test, run_dir, steps) + [f"trainer.schedule={schedule}"]
    over += ["rollout.num_workers=2", "rollout.cpus_per_worker=1", "trainer.test_freq=0"]
    return over + ["trainer.val_before_train=false", "rollout.response_length=24"]


def check_complete(run_dir: Path, steps: int, bound: int, groups_per_step: int = 4) -> dict:
    metrics = read_metrics(run_dir / "metrics.jsonl")
    assert [m["step"] for m in metrics] == list(range(1, steps + 1))  # each step once
    assert all(m["staleness/max"] <= bound for m in metrics)
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["samples"] == steps * groups_per_step * 4  # every drawn prompt's group (of 4) trained, once
    return summary


@pytest.mark.parametrize("trial", range(3))
@pytest.mark.parametrize("schedule,bound", [("one_step_off", 1), ("two_step_off", 2)])
def test_a_rollout_worker_killed_at_a_random_moment_is_replaced(setup, schedule, bound, trial):
    root, model, train, test = setup
    run_dir = root / f"worker_{schedule}_{trial}"
    killed: list[int] = []
    rng = random.Random(trial)
    t = kill_when(
        run_dir, "ray::RolloutWorker", after_step=rng.randint(2, 6), delay_s=rng.uniform(0, 0.3), killed=killed
    )
    summary = run_training(load_config(None, pool_overrides(model, train, test, run_dir, 30, schedule)))
    t.join(timeout=5)
    assert killed, "the killer found no rollout worker"
    summary = check_complete(run_dir, 30, bound)
    assert len(summary["worker_restarts"]) == 1 and "rollout" in summary["worker_restarts"][0]


def test_a_rollout_worker_killed_while_rollout_skip_dumps_is_replaced(setup):
    """A run that dumps its batches (rollout skip) replaces a killed rollout worker as any other run does; where the
    death is found depends on the moment (at a weight sync here, as measured; mid-generation it is the pool the dump
    wrapper keeps: tests/test_rollout_skip.py checks that wrapper on its own)."""
    root, model, train, test = setup
    run_dir = root / "worker_skip"
    killed: list[int] = []
    t = kill_when(run_dir, "ray::RolloutWorker", after_step=3, delay_s=0.1, killed=killed)
    over = pool_overrides(model, train, test, run_dir, 30)
    over += ["rollout.skip.enable=true", f"rollout.skip.dump_dir={root / 'skip_dumps'}"]
    run_training(load_config(None, over))
    t.join(timeout=5)
    assert killed, "the killer found no rollout worker"
    summary = check_complete(run_dir, 30, 1)
    assert len(summary["worker_restarts"]) == 1 and "rollout" in summary["worker_restarts"][0]
    assert len(list((root / "skip_dumps").glob("step_*.pkl"))) == 30  # every step's batch was dumped


def stream_overrides(model, train, test, run_dir, steps) -> list[str]:
    over = train_overrides(model, train, test, run_dir, steps) + ["trainer.schedule=fully_async", "trainer.test_freq=0"]
    over += ["rollout.cpus_per_worker=1", "trainer.val_before_train=false", "weight_sync.timeout_s=30"]
    return over + ["async_training.staleness_threshold=1.0", "async_training.partial_rollout=true"]


def check_stream_complete(run_dir: Path, steps: int) -> dict:
    """``check_complete`` for fully_async, plus the prompt ledger: the first epoch consumed once, nothing lost,
    duplicated or dropped in any epoch (30 steps x 2 groups = 1.5 epochs of 40 prompts)."""
    summary = check_complete(run_dir, steps, 1, groups_per_step=2)
    epochs = json.loads((run_dir / "ledger.json").read_text())["epochs"]
    assert epochs["0"]["complete"] and epochs["0"]["consumed_once"] == 40
    for e in epochs.values():
        assert e["lost"] == [] and e["duplicated"] == [] and e["dropped"] == []
    return summary


@pytest.mark.parametrize("trial", range(3))
def test_the_fully_async_rollouter_killed_at_a_random_moment_is_replaced(setup, trial):
    """The Rollouter holds the queue, the in-flight groups and the prompt ledger: its replacement takes over from its
    last snapshot plus what the trainer consumed since, and the ledger at the end shows every prompt trained once."""
    root, model, train, test = setup
    run_dir = root / f"rollouter_{trial}"
    killed: list[int] = []
    rng = random.Random(200 + trial)
    t = kill_when(run_dir, "ray::Rollouter", after_step=rng.randint(2, 8), delay_s=rng.uniform(0, 0.5), killed=killed)
    run_training(load_config(None, stream_overrides(model, train, test, run_dir, 30)))
    t.join(timeout=5)
    assert killed, "the killer found no Rollouter"
    summary = check_stream_complete(run_dir, 30)
    assert len(summary["worker_restarts"]) == 1 and "rollouter" in summary["worker_restarts"][0]


SLOW_PARTS = """
import os, time, uuid
from asyncrl.rollout.agent.loop import AgentLoop, Continuation

def _mark(kind, phase, key):
    with open({log!r}, "a") as f:  # one short line a write: whole lines, whatever the threads
        f.write(f"{{os.getpid()}} {{kind}} {{phase}} {{key}}\\n")

def slow_reward(data_source, solution_str, ground_truth, extra_info=None):
    key = uuid.uuid4().hex
    _mark("reward", "start", key)
    time.sleep(0.15)
    _mark("reward", "end", key)
    return len(solution_str) / 1000

class SlowToolLoop(AgentLoop):
    \"\"\"Every first turn that ends calls a 'tool' that answers after 0.3 s; the second turn ends the rollout.\"\"\"

    def next_turns(self, samples, turn_texts):
        out = []
        for s in samples:
            if s.turns > 1:
                out.append(None)
                continue
            key = uuid.uuid4().hex
            _mark("tool", "start", key)
            time.sleep(0.3)
            _mark("tool", "end", key)
            out.append(Continuation(self.ctx.tokenizer.encode(" 1", add_special_tokens=False), tool_calls=1))
        return out
"""


def open_calls(log: Path, pid: int) -> dict[str, int]:
    """Calls (reward, tool) that process ``pid`` started and never ended, by kind."""
    started: dict[str, str] = {}
    for line in log.read_text().splitlines() if log.exists() else []:
        p, kind, phase, key = line.split()
        if int(p) == pid:
            if phase == "start":
                started[key] = kind
            else:
                started.pop(key, None)
    out = {"reward": 0, "tool": 0}
    for kind in started.values():
        out[kind] += 1
    return out


def test_the_rollouter_killed_with_rewards_and_tool_calls_in_flight_loses_no_prompt(setup, tmp_path):
    """Rows complete off the decode (a reward scored on the reward loop, an agent's tool call on the agent pool): the
    Rollouter is killed while both are running; its replacement sends the rows its snapshot marked as completing to
    their completion again, and the ledger at the end shows every prompt trained once."""
    root, model, train, test = setup
    run_dir = root / "rollouter_completing"
    log = tmp_path / "calls.log"
    parts = tmp_path / "slow_parts.py"
    parts.write_text(SLOW_PARTS.format(log=str(log)))
    over = stream_overrides(model, train, test, run_dir, 30) + ["rollout.response_length=16"]
    over += [f"reward.custom_function={parts}:slow_reward", f"rollout.agent.default_agent_loop={parts}:SlowToolLoop"]
    killed: list[int] = []

    def kill_mid_calls() -> None:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and not killed:
            m = run_dir / "metrics.jsonl"
            pids = pids_of("ray::Rollouter")
            if pids and m.exists() and any(r["step"] >= 3 for r in read_metrics(m)):
                if all(open_calls(log, pids[0]).values()):  # a reward and a tool call both running
                    os.kill(pids[0], signal.SIGKILL)
                    killed.append(pids[0])
                    return
            time.sleep(0.01)

    t = threading.Thread(target=kill_mid_calls, daemon=True)
    t.start()
    summary = run_training(load_config(None, over))
    t.join(timeout=5)
    assert killed, "no moment with a reward and a tool call both in flight in the Rollouter"
    found = open_calls(log, killed[0])  # the process is dead: what it started and never ended was in flight
    assert found["reward"] >= 1 and found["tool"] >= 1, found
    check_stream_complete(run_dir, 30)
    assert len(summary["worker_restarts"]) == 1 and "rollouter" in summary["worker_restarts"][0]
    metrics = read_metrics(run_dir / "metrics.jsonl")
    assert sum(m.get("agent/tool_calls_mean", 0) for m in metrics) > 0  # the tool's turns were trained on


def test_a_rollouter_lost_past_max_worker_restarts_is_checkpointed_and_the_resume_loses_no_prompt(setup):
    """No replacement may start: the run checkpoints the last finished step with the snapshot the dead Rollouter would
    have given (its last one plus what the trainer consumed since) and stops; the resumed run's ledger is exact."""
    root, model, train, test = setup
    run_dir = root / "rollouter_lost"
    over = stream_overrides(model, train, test, run_dir, 30) + [
        "trainer.max_worker_restarts=0",
        "trainer.save_freq=100",
    ]
    killed: list[int] = []
    kill_when(run_dir, "ray::Rollouter", after_step=4, delay_s=0.1, killed=killed)
    with pytest.raises(WorkerLostError, match=r"rollout worker rollouter failed: .*max_worker_restarts=0"):
        run_training(load_config(None, over))
    assert killed
    (ckpt,) = sorted((run_dir / "checkpoints").glob("step_*"))
    assert (ckpt / "rollouter_state.pt").exists()
    run_training(load_config(None, over))  # resume_mode=auto, no fault this time
    check_stream_complete(run_dir, 30)


def test_past_max_worker_restarts_the_run_stops_after_a_checkpoint_and_resumes(setup):
    root, model, train, test = setup
    run_dir = root / "no_restarts"
    over = pool_overrides(model, train, test, run_dir, 30) + ["trainer.max_worker_restarts=0", "trainer.save_freq=100"]
    killed: list[int] = []
    kill_when(run_dir, "ray::RolloutWorker", after_step=2, delay_s=0.0, killed=killed)
    with pytest.raises(WorkerLostError, match=r"rollout worker rollout\d failed: .*max_worker_restarts=0"):
        run_training(load_config(None, over))
    assert killed
    ckpts = sorted((run_dir / "checkpoints").glob("step_*"))
    assert ckpts, "no checkpoint written before stopping"
    run_training(load_config(None, over))  # resume_mode=auto, no fault this time
    check_complete(run_dir, 30, 1)


def test_a_killed_trainer_stops_the_run_with_one_error_and_resume_continues(setup):
    root, model, train, test = setup
    run_dir = root / "trainer_killed"
    over = pool_overrides(model, train, test, run_dir, 30) + ["trainer.save_freq=2", "weight_sync.timeout_s=20"]
    killed: list[int] = []
    kill_when(run_dir, "ray::TrainerWorker", after_step=3, delay_s=0.2, killed=killed)
    t0 = time.monotonic()
    with pytest.raises(Exception, match="TrainerWorker|trainer|died|rank 0") as e:
        run_training(load_config(None, over))
    assert killed and time.monotonic() - t0 < 200, e.value
    run_training(load_config(None, over))
    check_complete(run_dir, 30, 1)


def test_a_hung_rollout_worker_is_replaced(setup):
    """SIGSTOP: the worker's process lives but never answers; past rollout.generate_timeout_s (or at the weight sync,
    when a ping finds no answer) it is killed and replaced."""
    root, model, train, test = setup
    run_dir = root / "worker_hung"
    over = pool_overrides(model, train, test, run_dir, 12) + [
        "rollout.generate_timeout_s=15",
        "weight_sync.timeout_s=15",
    ]
    stopped: list[int] = []
    kill_when(run_dir, "ray::RolloutWorker", after_step=3, delay_s=0.1, killed=stopped, sig=signal.SIGSTOP)
    run_training(load_config(None, over))
    assert stopped
    summary = check_complete(run_dir, 12, 1)
    assert len(summary["worker_restarts"]) == 1
    assert "no answer" in summary["worker_restarts"][0], summary["worker_restarts"]


def test_a_hung_trainer_stops_the_run_with_an_error_naming_it_and_resume_continues(setup):
    """SIGSTOP on the trainer: the next wait on it hits its deadline (trainer.call_timeout_s, or weight_sync.timeout_s
    at a weight sync) and the run stops with an error naming it, instead of hanging."""
    root, model, train, test = setup
    run_dir = root / "trainer_hung"
    over = pool_overrides(model, train, test, run_dir, 12) + ["trainer.save_freq=2", "weight_sync.timeout_s=15"]
    stopped: list[int] = []
    kill_when(run_dir, "ray::TrainerWorker", after_step=3, delay_s=0.1, killed=stopped, sig=signal.SIGSTOP)
    t0 = time.monotonic()
    with pytest.raises(Exception, match=r"trainer\.\w+: no answer within trainer\.call_timeout_s|rank 0") as e:
        run_training(load_config(None, over + ["trainer.call_timeout_s=15"]))
    assert stopped and time.monotonic() - t0 < 200, e.value
    run_training(load_config(None, over))
    check_complete(run_dir, 12, 1)


def _train_cmd(overrides: list[str]) -> list[str]:
    return [
        sys.executable,
        "-m",
        "asyncrl.cli",
        "train",
        "--config",
        str(ROOT / "configs" / "quickstart.yaml"),
        *overrides,
    ]


@pytest.mark.parametrize("trial", range(4))
def test_the_driver_killed_at_random_moments_resumes_with_each_step_once(setup, trial):
    root, model, train, test = setup
    run_dir = root / f"driver_{trial}"
    over = pool_overrides(model, train, test, run_dir, 8) + ["trainer.save_freq=1", "trainer.logger=[jsonl]"]
    env = dict(os.environ, HF_HUB_OFFLINE="1", PYTHONPATH=str(ROOT))
    proc = subprocess.Popen(_train_cmd(over), env=env, start_new_session=True, stdout=subprocess.DEVNULL)
    rng = random.Random(100 + trial)
    wait_for = rng.randint(1, 5)  # steps logged before the kill (checkpoints are written every step)
    deadline = time.monotonic() + 240
    while proc.poll() is None and time.monotonic() < deadline:
        m = run_dir / "metrics.jsonl"
        if m.exists() and len(read_metrics(m)) >= wait_for:
            break
        time.sleep(0.02)
    time.sleep(rng.uniform(0, 0.5))  # a random moment of the step after: generating, training or checkpointing
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    done = subprocess.run(_train_cmd(over), env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    check_complete(run_dir, 8, 1)


def test_a_driver_killed_alone_leaves_no_process_of_its_run_behind(setup):
    """Only the driver gets SIGKILL (not its process group): its watchdog (asyncrl.workers.reaper) kills the
    rest."""
    from asyncrl.workers.reaper import descendants

    root, model, train, test = setup
    run_dir = root / "driver_alone"
    over = pool_overrides(model, train, test, run_dir, 200) + ["trainer.logger=[jsonl]"]
    env = dict(os.environ, HF_HUB_OFFLINE="1", PYTHONPATH=str(ROOT))
    proc = subprocess.Popen(_train_cmd(over), env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 240
    metrics = run_dir / "metrics.jsonl"
    while proc.poll() is None and time.monotonic() < deadline and not (metrics.exists() and read_metrics(metrics)):
        time.sleep(0.1)
    started = descendants([proc.pid])
    assert any("ray::RolloutWorker" in _cmdline(p) for p in started), [_cmdline(p) for p in started]
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and [p for p in started if Path(f"/proc/{p}").exists()]:
        time.sleep(0.2)
    left = [(p, _cmdline(p)) for p in started if Path(f"/proc/{p}").exists()]
    assert not left, f"processes of the killed run still alive 20 s later: {left}"


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return ""
