"""Deterministic replay (``trainer.record_consumed`` + ``asyncrl replay``): a fully_async run's trainer side, fed the
samples it recorded, reproduces the run's weights after every step, its checkpoints and final weights bit for bit; a
changed record is caught at its own step, named with the first tensor that differs."""

from __future__ import annotations

import pickle
import re

import pytest
import yaml

from asyncrl.cli import main
from asyncrl.config import load_config, to_dict
from asyncrl.models.loading import load_model
from asyncrl.replay import ReplayError, replay
from asyncrl.schedules import run_training
from tests.helpers import make_data, make_model, train_overrides


def _recorded_run(model, train, test, d, *backend: str) -> None:
    """4 fully_async steps with partial rollouts, recording what the trainer consumed."""
    over = train_overrides(model, train, test, d, 4) + [
        *backend,
        "trainer.schedule=fully_async",
        "async_training.staleness_threshold=1.0",
        "async_training.partial_rollout=true",
        "trainer.record_consumed=true",
        "actor.optim.lr=1e-2",
    ]
    run_training(load_config(None, over))


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    root = tmp_path_factory.mktemp("replay")
    train, test = make_data(root, size=32, test_size=8)
    model = make_model(root, train, seed=0)
    _recorded_run(model, train, test, root / "fa", "trainer.backend=in_process")
    return root, root / "fa", (model, train, test)


def test_replay_reproduces_the_async_run_bit_for_bit(recorded, capsys):
    _, d, _ = recorded
    names = sorted(p.name for p in (d / "consumed").iterdir())
    assert names == sorted([f"step_{i}.pkl" for i in range(1, 5)] + [f"step_{i}.weights.json" for i in range(1, 5)])
    result = replay(d)
    assert result["identical"] and result["checkpoints_compared"] == [2, 4], result
    assert result["steps_fingerprinted"] == [1, 2, 3, 4]  # every step's weights compared, not only the saved ones
    main(["replay", str(d)])
    assert capsys.readouterr().out.strip().endswith("final weights identical to the run's, bit for bit")


def test_a_changed_record_is_named_by_step_and_tensor(recorded, tmp_path):
    _, d, _ = recorded
    import shutil

    copy = tmp_path / "fa"
    shutil.copytree(d, copy)
    path = copy / "consumed" / "step_3.pkl"
    samples = pickle.loads(path.read_bytes())
    for i, s in enumerate(samples):  # other rewards, differing within every group: the update of step 3 changes
        s.reward = float(i % 2) + 0.5 * s.reward
    path.write_bytes(pickle.dumps(samples))
    result = replay(copy)
    named = re.search(r"first difference at step 3: (\S+)", result["line"])
    assert not result["identical"] and named, result
    model, _, _ = recorded[2]
    assert named.group(1) in load_model(model)[0].state_dict(), named.group(1)  # a tensor of the model
    with pytest.raises(SystemExit) as e:
        main(["replay", str(copy)])
    assert e.value.code == 1


def test_what_cannot_be_replayed_is_a_clear_error(recorded, tmp_path):
    root, _, (model, train, test) = recorded
    with pytest.raises(ReplayError, match="nothing recorded"):
        d = tmp_path / "norec"
        run_training(load_config(None, train_overrides(model, train, test, d, 1) + ["trainer.backend=in_process"]))
        replay(d)
    ppo = tmp_path / "ppo"
    ppo.mkdir()
    cfg = load_config(None, train_overrides(model, train, test, ppo, 1) + ["algorithm.name=ppo"])
    (ppo / "config.yaml").write_text(yaml.safe_dump(to_dict(cfg)))
    with pytest.raises(ReplayError, match="algorithm.name=ppo is not replayable"):
        replay(ppo)


@pytest.mark.ray
def test_a_ray_run_replays_in_one_process_bit_for_bit(recorded):
    """The run's trainer was a Ray actor with its own thread count; replay runs in this process with that count."""
    root, _, (model, train, test) = recorded
    d = root / "fa_ray"
    _recorded_run(model, train, test, d, "trainer.backend=ray")
    result = replay(d)
    assert result["identical"] and result["steps_fingerprinted"] == [1, 2, 3, 4], result
