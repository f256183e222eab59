"""What an algorithm is: the roles it needs, how finished samples become a typed training batch, and which roles
learn from that batch. Schedules call only this interface; workers never see it.

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

from asyncrl.config import AlgorithmConfig, Config
from asyncrl.config.specs import TrainerNeeds
from asyncrl.data.collate import Prepared
from asyncrl.roles.team import Roles
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
    def section_of(cls, cfg: Config) -> AlgorithmConfig:
        """``cfg.algorithm`` as its ``section`` class: as loaded, or, for a config built in code with the shared
        keys only (``Config()``: no loader, as on a GPU box without omegaconf), those keys and its own defaults."""
        al = cfg.algorithm
        if isinstance(al, cls.section):
            return al
        return cls.section(**{f.name: getattr(al, f.name) for f in dataclasses.fields(AlgorithmConfig)})

    @classmethod
    def check_config(cls, cfg: Config) -> None:
        """Its own rules on ``cfg`` beyond what it declares, each a ``ConfigError`` naming the key; none by default."""
        del cfg

    def __init__(self, cfg: Config, tokenizer: object, roles: Roles, resources: object = None):
        self.cfg = cfg
        self.options = self.section_of(cfg)
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
