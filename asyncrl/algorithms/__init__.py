"""One module per algorithm (``algorithm.name``): the roles it needs, how finished samples become a typed training
batch, which pure losses from ``asyncrl.losses`` update which role, and its own config rules (``check_config``). Every
algorithm runs on every schedule; schedules call only the ``Algorithm`` interface, workers never see it.

A batch is prepared in two halves. ``prepare`` runs on the schedule's thread, in batch order: it draws anything
random and issues the calls to other roles (critic values, reward-model scores), so their order on each worker is
the batch order in every schedule. It returns ``finish``, which waits for those calls (and the teacher's replies)
and builds the batch; ``two_step_off`` runs ``finish`` on a thread while the previous batch trains, the other
schedules call it at once.
"""

from __future__ import annotations

import dataclasses
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import ClassVar

from asyncrl.config import AlgorithmConfig, Config, ConfigError, check
from asyncrl.config.algorithm_section import algorithm_module, builtin_classes
from asyncrl.config.schema import SECTION_DEFAULTS
from asyncrl.config.specs import TrainerNeeds
from asyncrl.data.collate import Prepared
from asyncrl.roles.clients import Roles
from asyncrl.types import Sample, Trained

Finish = Callable[[], Prepared]


class Algorithm(ABC):
    """What a run's algorithm declares before any worker starts (class methods: its training roles, what it needs
    of the trainer, the resources it holds for the run), and, bound to the started roles, how it prepares and
    trains each batch."""

    name: ClassVar[str]
    # its batch is a function of the samples alone (no other role's state: a critic's values, a teacher's answers),
    # so ``asyncrl replay`` can rebuild a run's updates from the batches it recorded
    replayable: ClassVar[bool] = False
    # its ``algorithm:`` section: the keys every algorithm reads, and its own as a subclass's fields (ppo: gamma,
    # lam), with their rules (``RULES``); the loader parses the section as this class (``config.algorithm_section``)
    section: ClassVar[type[AlgorithmConfig]] = AlgorithmConfig
    # what else it reads of the config besides the policy's sections, so that a section set for another algorithm
    # is an error and not silently ignored (``asyncrl.algorithms.check_config``): the sections only it reads (ppo:
    # critic, reward_model), the ``algorithm.adv_estimator`` values it fits (none: it fits no advantages), and
    # whether it learns from rewards (distillation learns from its teacher and only logs them)
    sections: ClassVar[tuple[str, ...]] = ()
    estimators: ClassVar[tuple[str, ...]] = ()
    learns_from_rewards: ClassVar[bool] = True

    @classmethod
    def check_config(cls, cfg: Config) -> None:
        """Its own rules on ``cfg`` beyond what it declares, each a ``ConfigError`` naming the key; none by default."""
        del cfg

    def __init__(self, cfg: Config, tokenizer: object, roles: Roles, resources: object = None):
        self.cfg = cfg
        # ``cfg.algorithm`` as its ``section`` class: as loaded, or, for a config built in code with the shared keys
        # only (``Config()``: no loader, as on a GPU box without omegaconf), those keys and its own defaults
        al = cfg.algorithm
        shared = {f.name: getattr(al, f.name) for f in dataclasses.fields(AlgorithmConfig)}
        self.options = al if isinstance(al, self.section) else self.section(**shared)
        self.tokenizer = tokenizer
        self.roles = roles
        self.summary: dict[str, object] = {}  # what the run's summary.json records about this algorithm's parts

    @classmethod
    def roles_needed(cls, cfg: Config) -> list[str]:
        """The training roles it runs on (placed by ``placement``): the actor, unless it says more."""
        return ["actor"]

    @classmethod
    def trainer_needs(cls, cfg: Config) -> TrainerNeeds:
        """What it needs of the trainer beyond its objective: a reference model (kept for a KL loss by default) and
        how often that catches up with the actor."""
        return TrainerNeeds(reference=cfg.actor.use_kl_loss)

    @classmethod
    @contextmanager
    def resources(cls, cfg: Config, tokenizer: object, run_dir: str) -> Iterator[object]:
        """What it holds for the whole run besides the roles (a teacher server), acquired before any worker
        starts and handed to the constructor; none by default."""
        yield None

    def on_resume(self, start_step: int) -> None:
        """Catch up anything drawn once per batch, so a resumed run continues the unbroken run's sequence (nothing,
        unless the algorithm draws per batch)."""
        del start_step

    @abstractmethod
    def prepare(self, samples: list[Sample], step: int) -> Finish:
        """Issue this batch's calls (in batch order) and return ``finish``, which builds the typed batch."""

    def train(self, prepared: Prepared, step: int) -> Trained:
        """Update the roles that learn from ``prepared``; the actor's result carries the new weight version. By
        default the actor alone learns: one optimizer step per ``num_mini_batches`` share of the batch."""
        res = self.roles.trainer.update(prepared.batch, step, self.num_mini_batches(prepared.samples)).result()
        return Trained(res, res.metrics)

    # ---- shared parts ----------------------------------------------------------------------------------------------
    def num_mini_batches(self, samples: list[Sample]) -> int:
        """Optimizer steps for a batch: its groups / actor.ppo_mini_batch_size (data.train_batch_size's worth in the
        batch schedules, async_training.require_batches in fully_async)."""
        groups = len({s.uid for s in samples})
        return max(1, groups // self.cfg.actor.ppo_mini_batch_size)


def algorithm_class(cfg: Config) -> type[Algorithm]:
    """The class of ``algorithm.name``: the module ``asyncrl.algorithms.<name>`` for a built-in name, or the module at
    a dotted import path of the user's (``my_pkg.my_algo``), names it ``ALGORITHM``. Nothing lists algorithms, and a
    module is imported on demand (distillation's teacher client is not loaded otherwise)."""
    name = cfg.algorithm.name
    module = algorithm_module(name)
    cls = getattr(module, "ALGORITHM", None)
    if not (isinstance(cls, type) and issubclass(cls, Algorithm)):
        raise ConfigError(
            f"config key algorithm.name={name!r}: module {module.__name__} must name its "
            f"asyncrl.algorithms.Algorithm subclass ALGORITHM (got {cls!r:.60})"
        )
    return cls


def builtin_algorithms() -> tuple[str, ...]:
    """The ``algorithm.name`` values built in: this package's modules that name an ``ALGORITHM``."""
    return tuple(builtin_classes())


def check_config(cfg: Config) -> None:
    """What holds for the chosen algorithm, from what it declares (``Algorithm.sections``, ``estimators``,
    ``learns_from_rewards``, ``trainer_needs``) and its own ``check_config``: run before anything of
    a run starts (``asyncrl.schedules.run_training``). A section set for another algorithm is an error naming it,
    checked after the ranges, so a bad value is named even in a section the run would not read (a key of
    ``algorithm:`` that another algorithm reads is named when the config is loaded: ``config.algorithm_section``)."""
    cls = algorithm_class(cfg)
    name = cfg.algorithm.name
    cls.check_config(cfg)
    if not cls.learns_from_rewards:  # dynamic sampling and the overlong penalty shape what it learns from rewards
        why = f"false when algorithm.name={name} (it does not learn from rewards; they are only logged)"
        check(not cfg.algorithm.filter_groups.enable, "algorithm.filter_groups.enable", True, why)
        ob = cfg.reward_model.reward_kwargs.overlong_buffer_cfg
        check(not ob.enable, "reward_model.reward_kwargs.overlong_buffer_cfg.enable", True, why)
    rm = cfg.reward_model
    if "reward_model" not in cls.sections and rm.reward_model_part != type(rm)().reward_model_part:
        raise ConfigError(
            f"config section reward_model: set, but algorithm.name={name} never reads it (only "
            f"{_readers('reward_model')} does; of it, every algorithm reads reward_model.reward_manager and "
            "reward_model.reward_kwargs); remove it or choose that algorithm"
        )
    for section, default in SECTION_DEFAULTS.items():
        if section not in cls.sections and getattr(cfg, section) != default():
            raise ConfigError(
                f"config section {section}: set, but algorithm.name={name} never reads it (only "
                f"{_readers(section)} does); remove it or choose that algorithm"
            )
    if not cls.trainer_needs(cfg).reference and cfg.ref != type(cfg.ref)():
        raise ConfigError(
            f"config section ref: set, but algorithm.name={name} with actor.use_kl_loss="
            f"{str(cfg.actor.use_kl_loss).lower()} keeps no reference model (only a KL loss or dpo reads it); remove "
            "it or set actor.use_kl_loss=true"
        )
    if cfg.trainer.critic_warmup and "critic" not in cls.sections:
        check(False, "trainer.critic_warmup", cfg.trainer.critic_warmup, f"0 when algorithm.name={name} (no critic)")
    est = cfg.algorithm.adv_estimator
    if est is not None and est not in cls.estimators:
        if not cls.estimators:
            allowed = f"null when algorithm.name={name} (it fits no advantages)"
        else:
            allowed = f"{cls.estimators[0]} or null when algorithm.name={name}"
            if est == "gae":
                allowed += " (gae needs a critic: set algorithm.name=ppo)"
        check(False, "algorithm.adv_estimator", est, allowed)


def _readers(section: str) -> str:
    """The built-in algorithms that read a config section."""
    names = [c.name for c in builtin_classes().values() if section in c.sections]
    return " | ".join(names) or "no built-in algorithm"


__all__ = ["Algorithm", "Finish", "Prepared", "Trained", "algorithm_class", "builtin_algorithms", "check_config"]
