"""One module per algorithm (``algorithm.name``): the roles it needs, how finished samples become a typed training
batch, which pure losses from ``asyncrl.losses`` update which role, and what it reads of the config with its own
rules on it (``check_config``). Every algorithm runs on every schedule. Nothing lists them: the built-in ones are
this package's modules that name an ``ALGORITHM`` (``builtin_algorithms``), a user's is any module that does."""

from __future__ import annotations

from asyncrl.algorithms.base import Algorithm, Finish, Prepared, Trained
from asyncrl.config import Config, ConfigError, check
from asyncrl.config.algorithm_section import algorithm_module, builtin_classes
from asyncrl.config.schema import SECTION_DEFAULTS


def algorithm_class(cfg: Config) -> type[Algorithm]:
    """The class of ``algorithm.name``: the module ``asyncrl.algorithms.<name>`` for a built-in name, or the module at
    a dotted import path of the user's (``my_pkg.my_algo``), names it ``ALGORITHM`` (imported on demand:
    distillation's teacher client is not loaded otherwise). A new algorithm is such a module and its loss: nothing
    here lists it (``asyncrl.config.algorithm_section`` finds the module, for its ``algorithm:`` keys too)."""
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
    _check_rewards_used(cfg, cls)
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


def _check_rewards_used(cfg: Config, cls: type[Algorithm]) -> None:
    """Dynamic sampling and the overlong penalty shape what an algorithm learns from rewards."""
    if cls.learns_from_rewards:
        return
    why = f"false when algorithm.name={cfg.algorithm.name} (it does not learn from rewards; they are only logged)"
    check(not cfg.algorithm.filter_groups.enable, "algorithm.filter_groups.enable", True, why)
    ob = cfg.reward_model.reward_kwargs.overlong_buffer_cfg
    check(not ob.enable, "reward_model.reward_kwargs.overlong_buffer_cfg.enable", True, why)


def _readers(section: str) -> str:
    """The built-in algorithms that read a config section."""
    names = [c.name for c in builtin_classes().values() if section in c.sections]
    return " | ".join(names) or "no built-in algorithm"


__all__ = ["Algorithm", "Finish", "Prepared", "Trained", "algorithm_class", "builtin_algorithms", "check_config"]
