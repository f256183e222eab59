"""The console shows the run, not its libraries: a worker's library chatter (transformers' "Loading weights" and
"Writing model shards" progress bars, FutureWarnings) goes to its log file under ``RUN_DIR/logs``, while the driver's
step lines stay on the console. Checked on a real local Ray cluster (each worker a process, its output forwarded to
the driver by Ray) and with in-process roles (the driver's own process).
"""

from __future__ import annotations

import warnings

import pytest
from transformers.utils import logging as hf_logging

from asyncrl.config import load_config
from asyncrl.schedules import run_training
from tests.helpers import make_data, make_model, train_overrides

CHATTER = ("Loading weights", "Writing model shards")
POOLS = ["trainer.schedule=one_step_off", "rollout.num_workers=1", "rollout.cpus_per_worker=1"]


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("logs")
    train, test = make_data(root)
    model = make_model(root, train)
    yield root, model, train, test


def _run(setup, name: str, *extra: str):
    root, model, train, test = setup
    run_dir = root / name
    # save_freq=2 of 2 steps: the trainer writes a checkpoint and the final model, each with a "Writing model shards"
    over = train_overrides(model, train, test, run_dir, 2) + POOLS + ["trainer.logger=[console,jsonl]", *extra]
    run_training(load_config(None, over))
    return run_dir


@pytest.mark.ray
def test_ray_workers_chatter_goes_to_their_log_files_and_the_step_lines_to_the_console(setup, capfd):
    capfd.readouterr()  # what building the data and model printed here is not the run's
    run_dir = _run(setup, "ray_run")
    out, err = capfd.readouterr()
    console = out + err
    assert "[ray_run]  step 2/2" in console  # the driver's step lines
    for chatter in CHATTER:
        assert chatter not in console, chatter
    trainer, rollout = (run_dir / "logs" / f"{w}.log" for w in ("trainer", "rollout0"))
    assert trainer.read_text().startswith("--- trainer (pid ")
    assert "Loading weights" in trainer.read_text() and "Writing model shards" in trainer.read_text()
    assert "Loading weights" in rollout.read_text()


def test_in_process_roles_chatter_goes_to_the_run_log_and_is_put_back_after(setup, capfd):
    capfd.readouterr()
    shown = warnings.showwarning
    run_dir = _run(setup, "local_run", "trainer.backend=in_process")
    out, err = capfd.readouterr()
    console = out + err
    assert "[local_run]  step 2/2" in console
    for chatter in CHATTER:
        assert chatter not in console, chatter
    log = (run_dir / "logs" / "in_process.log").read_text()
    assert "Loading weights" in log and "Writing model shards" in log
    # after the run, this process's libraries talk where they did before it
    assert warnings.showwarning is shown
    bar = hf_logging.tqdm(range(1), desc="after the run")
    list(bar)
    bar.close()
    assert "after the run" in capfd.readouterr().err
