"""The trainer knows no algorithm: one written here, that no worker has ever seen (REINFORCE with a mean-reward
baseline, its objective and its loss in this file), runs on every schedule through the same trainer, because an
algorithm is a module that names its class ``ALGORITHM`` plus its loss. This file is that module:
``algorithm.name=tests.test_new_algorithm``, nothing registered, nothing patched."""

from __future__ import annotations

import math
from dataclasses import dataclass

import pytest
from torch import Tensor

from asyncrl import losses
from asyncrl.algorithms import Algorithm, Finish, Prepared
from asyncrl.config import SCHEDULES, AlgorithmConfig, Config, ConfigError, check, load_config
from asyncrl.config.rules import one_of
from asyncrl.data.collate import Objective, TrainBatch, collate, rewards_of
from asyncrl.schedules import run_training
from asyncrl.telemetry.metrics import read_metrics
from asyncrl.types import Sample
from tests.helpers import length_reward, make_data, make_model, train_overrides


@dataclass
class ReinforceTarget(Objective):
    """Per-token advantages; the loss is -A * log p (no ratio, no clip), aggregated as configured."""

    advantages_BT: Tensor

    @property
    def temperature(self) -> float:
        return 1.0

    def loss(self, logits_BTV: Tensor, logp_BT: Tensor, batch: TrainBatch, agg: str) -> tuple[Tensor, dict]:
        loss = losses.agg_loss(-self.advantages_BT * logp_BT, batch.response_mask_BT, agg)
        return loss, {"actor/pg_loss": float(loss.detach())}


@dataclass
class ReinforceConfig(AlgorithmConfig):
    """Its ``algorithm:`` section: the keys every algorithm reads, and its own, with its own rule."""

    baseline: str = "mean"  # mean: the batch's mean reward is subtracted | none: the raw reward is the advantage

    RULES = {"baseline": one_of(("mean", "none"))}


class Reinforce(Algorithm):
    name = "reinforce"
    section = ReinforceConfig  # the loader parses algorithm: as this class

    @classmethod
    def check_config(cls, cfg: Config) -> None:  # its own rule, checked before a run starts
        n = cfg.data.train_batch_size * cfg.rollout.n
        check(n >= 2, "rollout.n", cfg.rollout.n, ">= 2 or data.train_batch_size >= 2 (a baseline of one sample)")

    def prepare(self, samples: list[Sample], step: int) -> Finish:
        batch = collate(samples, self.tokenizer.pad_token_id)
        reward_B = rewards_of(samples)
        if self.options.baseline == "mean":  # type: ignore[attr-defined] - a ReinforceConfig (``section``)
            reward_B = reward_B - reward_B.mean()
        batch.policy = ReinforceTarget(losses.broadcast_advantages(reward_B, batch.response_mask_BT))
        prepared = Prepared(samples, batch)
        return lambda: prepared


ALGORITHM = Reinforce  # what algorithm.name=tests.test_new_algorithm imports


@pytest.mark.parametrize("schedule", SCHEDULES)
def test_an_algorithm_the_trainer_never_saw_trains_on_every_schedule(tmp_path, schedule):
    train, test = make_data(tmp_path)
    model = make_model(tmp_path, train)
    run_dir = tmp_path / "run"
    over = train_overrides(model, train, test, run_dir, 2) + ["trainer.backend=in_process", length_reward(tmp_path)]
    over += ["algorithm.name=tests.test_new_algorithm", "algorithm.baseline=mean", f"trainer.schedule={schedule}"]
    summary = run_training(load_config(None, over))
    assert summary["steps"] == 2
    steps = [m for m in read_metrics(run_dir / "metrics.jsonl") if m.get("step", 0) > 0]
    assert len(steps) == 2 and all(math.isfinite(m["actor/pg_loss"]) for m in steps)
    assert all(m["actor/grad_norm"] > 0 for m in steps)  # rewards differ within every group: a gradient each step


def test_the_algorithm_brings_its_own_keys_with_their_rules(tmp_path):
    """``algorithm:`` is parsed as the chosen algorithm's section class: its own key loads with its default or a
    value its rule allows, its rule names a bad value, and the key is unknown to an algorithm that does not read it."""
    train, test = make_data(tmp_path)
    over = train_overrides(make_model(tmp_path, train), train, test, tmp_path / "run", 2)
    mine = [*over, "algorithm.name=tests.test_new_algorithm"]
    assert load_config(None, mine).algorithm == ReinforceConfig(name="tests.test_new_algorithm")
    assert load_config(None, [*mine, "algorithm.baseline=none"]).algorithm.baseline == "none"
    with pytest.raises(ConfigError, match="algorithm.baseline must be one of"):
        load_config(None, [*mine, "algorithm.baseline=median"])
    with pytest.raises(ConfigError, match="unknown config key 'algorithm.baseline'"):
        load_config(None, [*over, "algorithm.baseline=none"])  # grpo's section has no such key


def test_a_module_without_an_algorithm_is_one_clear_error(tmp_path):
    """A dotted name must import and name an Algorithm subclass ALGORITHM; a plain name must be a built-in one."""
    from asyncrl.algorithms import algorithm_class

    train, test = make_data(tmp_path)
    over = train_overrides(make_model(tmp_path, train), train, test, tmp_path / "run", 2)
    for name, says in [
        ("tests.helpers", "must name its asyncrl.algorithms.Algorithm subclass ALGORITHM"),
        ("tests.no_such_module", "no module tests.no_such_module to import"),
    ]:
        with pytest.raises(ConfigError, match=says):
            algorithm_class(load_config(None, [*over, f"algorithm.name={name}"]))
    with pytest.raises(ConfigError, match=r"no module asyncrl.algorithms.reinforce to import \(built in: distill, dpo"):
        algorithm_class(load_config(None, [*over, "algorithm.name=reinforce"]))  # a plain name is a built-in one's
    with pytest.raises(ConfigError, match="the import path of a module of yours"):
        load_config(None, [*over, "algorithm.name=my-algo"])


def test_the_algorithm_checks_its_own_config_before_the_run_starts(tmp_path):
    """Its own rule and the sections it does not declare are errors from ``run_training``, before the run directory
    exists: nothing in asyncrl.config knows this algorithm."""
    train, test = make_data(tmp_path)
    run_dir = tmp_path / "run"
    over = train_overrides(make_model(tmp_path, train), train, test, run_dir, 2) + ["trainer.backend=in_process"]
    over += ["algorithm.name=tests.test_new_algorithm"]
    for extra, says in [
        (["rollout.n=1", "data.train_batch_size=1", "actor.ppo_mini_batch_size=1"], "rollout.n must be >= 2 or"),
        (["critic.optim.lr=1e-3"], "config section critic: set, but algorithm.name=tests.test_new_algorithm never"),
        (["algorithm.gamma=0.9"], "config key algorithm.gamma: set, but algorithm.name=tests.test_new_algorithm"),
    ]:
        with pytest.raises(ConfigError, match=says):
            run_training(load_config(None, over + extra))
    assert not run_dir.exists()
