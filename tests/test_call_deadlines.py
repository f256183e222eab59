"""Every wait on a worker has a deadline: a call that sets none gets ``trainer.call_timeout_s``, and a worker that
hangs past it is an error naming the worker and the method, not a hung run (the Ray trial is in test_faults.py)."""

from __future__ import annotations

import threading
import time

import pytest

from asyncrl.calls import CallTimeoutError
from asyncrl.config import load_config
from asyncrl.schedules import run_training
from asyncrl.workers.backends import LocalHandle
from asyncrl.workers.trainer import TrainerWorker
from tests.helpers import make_data, make_model, train_overrides


class Slow:
    def __init__(self, release: threading.Event):
        self.release = release

    def wait(self) -> str:
        self.release.wait(30)
        return "answered"


def test_a_call_without_a_timeout_of_its_own_gets_the_deadline_and_names_the_worker():
    release = threading.Event()
    h = LocalHandle(Slow(release), "slowpoke", call_timeout_s=0.2)
    try:
        t0 = time.monotonic()
        with pytest.raises(CallTimeoutError, match=r"slowpoke\.wait: no answer within trainer\.call_timeout_s=0\.2 s"):
            h.call("wait").result()
        assert time.monotonic() - t0 < 5
        call = h.call("wait")
        with pytest.raises(TimeoutError) as e:  # a timeout of its own is the caller's, as before
            call.result(timeout=0.05)
        assert not isinstance(e.value, CallTimeoutError)
        release.set()
        assert call.result() == "answered"
    finally:
        release.set()
        h.kill()


def test_a_trainer_update_that_hangs_stops_the_run_with_an_error_naming_it(tmp_path, monkeypatch):
    train, test = make_data(tmp_path, size=16, test_size=4)
    model = make_model(tmp_path, train)
    over = train_overrides(model, train, test, tmp_path / "run", 3)
    over += ["trainer.backend=in_process", "trainer.test_freq=0", "trainer.val_before_train=false"]
    over += ["trainer.call_timeout_s=6", "trainer.save_freq=0"]  # 6 s: well above a step here, even under load
    release = threading.Event()
    update = TrainerWorker.update

    def hangs_at_step_2(self, batch, step, num_mini_batches=None):
        if step == 2:
            release.wait(60)  # a hung trainer (a deadlock, a stuck collective)
        return update(self, batch, step, num_mini_batches)

    monkeypatch.setattr(TrainerWorker, "update", hangs_at_step_2)
    t0 = time.monotonic()
    try:
        with pytest.raises(CallTimeoutError, match=r"trainer\.update: no answer within trainer\.call_timeout_s=6 s"):
            run_training(load_config(None, over))
        assert time.monotonic() - t0 < 60
    finally:
        release.set()
