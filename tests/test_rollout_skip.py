"""Rollout skip (``rollout.skip``): a run dumps its generated batches; a later run with the same generation setup
replays them instead of generating (and trains to the same weights); another setup is refused, naming the fields."""

from __future__ import annotations

import pytest
import torch

from asyncrl.config import ConfigError, load_config
from asyncrl.run.skip import RolloutSkipError
from asyncrl.schedules import run_training
from asyncrl.telemetry.metrics import read_metrics
from tests.helpers import make_data, make_model, train_overrides


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("skip")
    train, test = make_data(root, size=32, test_size=8)
    return root, make_model(root, train, seed=0), train, test


def _run(setup, name: str, steps: int, *extra: str) -> list[dict]:
    root, model, train, test = setup
    over = train_overrides(model, train, test, root / name, steps) + ["trainer.backend=in_process"]
    over += ["rollout.skip.enable=true", f"rollout.skip.dump_dir={root / 'dump'}", *extra]
    run_training(load_config(None, over))
    return [m for m in read_metrics(root / name / "metrics.jsonl") if "reward/mean" in m]


def _final(setup, name: str) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(str(setup[0] / name / "final" / "model.safetensors"))


def test_a_second_run_replays_the_dumped_batches_and_trains_the_same(setup):
    first = _run(setup, "first", 2)
    dump = setup[0] / "dump"
    assert (dump / "key.json").is_file() and (dump / "step_1.pkl").is_file() and (dump / "step_2.pkl").is_file()
    again = _run(setup, "again", 2)
    assert all(m["rollout/skipped"] == 1.0 for m in again) and not any("rollout/skipped" in m for m in first)
    for a, b in zip(first, again, strict=True):
        assert a["reward/mean"] == b["reward/mean"] and a["response_length/mean"] == b["response_length/mean"]
    wa, wb = _final(setup, "first"), _final(setup, "again")
    assert all(torch.equal(wa[k], wb[k]) for k in wa)

    # repeat: steps without a dump train on the latest dumped batch again
    repeated = _run(setup, "repeat", 4, "rollout.skip.action=repeat")
    assert [m["rollout/skipped"] for m in repeated] == [1.0] * 4
    assert repeated[2]["reward/mean"] == repeated[3]["reward/mean"] == first[1]["reward/mean"]

    with pytest.raises(RolloutSkipError, match=r"rollout.temperature \(dumped 1.0, this run 0.7\)"):
        _run(setup, "other", 1, "rollout.temperature=0.7")


def test_skip_keys_are_checked(setup, tmp_path):
    root, model, train, test = setup
    base = train_overrides(model, train, test, tmp_path, 1)
    with pytest.raises(ConfigError, match="rollout.skip.action"):
        load_config(None, [*base, "rollout.skip.action=reuse"])
    with pytest.raises(ConfigError, match="rollout.skip.enable"):
        load_config(None, [*base, "rollout.skip.enable=true", "trainer.schedule=fully_async"])


def test_a_dumped_batch_keeps_the_pool_that_replaces_a_dead_worker(tmp_path):
    """The dump wrapper once kept only the calls: a Ray run with rollout skip lost worker replacement on every step
    it dumped (a worker dying mid-generation stopped the run). Every field of the launched batch must survive."""
    from dataclasses import fields

    from asyncrl.run.generation import Launched
    from asyncrl.run.skip import _Dumping

    pool, redo = object(), (lambda worker: None)  # stand-ins: only their identity is checked
    launched = Launched(calls=[], pool=pool, workers=[1], again=[redo])  # type: ignore[arg-type]
    dumping = _Dumping(launched, tmp_path / "step_1.pkl")
    assert all(getattr(dumping, f.name) is getattr(launched, f.name) for f in fields(Launched))
