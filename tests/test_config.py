"""Config loading: every shipped config validates; bad keys, types and ranges fail at load naming the key."""

from pathlib import Path

import pytest

from asyncrl.algorithms import check_config
from asyncrl.config import Config, ConfigError, load_config
from asyncrl.finetune.sft import load_sft_config

CONFIGS = sorted(Path(__file__).resolve().parents[1].joinpath("configs").glob("*.yaml"))
BASE = ["model.path=m", "data.train_files=[t.parquet]"]


def test_configs_dir_is_not_empty():
    assert len(CONFIGS) >= 2


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
def test_every_shipped_config_loads_and_validates(path):
    if path.name.startswith("sft"):
        cfg = load_sft_config(str(path))
        assert cfg.data.train_files
    else:
        cfg = load_config(path)
        assert isinstance(cfg, Config)
        assert cfg.model.path


def test_dotted_overrides_apply_with_types():
    cfg = load_config(None, BASE + ["rollout.n=4", "actor.optim.lr=3e-4", "trainer.logger=[jsonl]"])
    assert cfg.rollout.n == 4
    assert cfg.actor.optim.lr == pytest.approx(3e-4)
    assert cfg.trainer.logger == ["jsonl"]


@pytest.mark.parametrize(
    "override, fragment",
    [
        ("rollout.nn=3", "unknown config key 'rollout.nn'"),
        ("nonsense=1", "unknown config key 'nonsense'"),
        ("rollout.n=abc", "config key rollout.n"),
        ("rollout.n=0", "config key rollout.n must be >= 1 (got 0)"),
        ("rollout.top_p=1.5", "config key rollout.top_p must be in (0, 1] (got 1.5)"),
        ("actor.loss_agg_mode=mean", "config key actor.loss_agg_mode must be one of token-mean"),
        ("actor.kl_loss_type=k9", "config key actor.kl_loss_type must be one of"),
        ("actor.ppo_mini_batch_size=5", "config key actor.ppo_mini_batch_size must be a divisor of"),
        ("trainer.logger=[neptune]", "config key trainer.logger must be one of console"),
        ("trainer.resume_mode=/no/such/dir", "config key trainer.resume_mode must be auto, disable"),
        ("algorithm.rollout_correction.rollout_is=tok", "algorithm.rollout_correction.rollout_is must be one of"),
        ("rollout.n", "expected key=value"),
        ("async_training.drop_policy=newest", "async_training.drop_policy must be one of backpressure, oldest"),
        ("async_training.staleness_threshold=-1", "async_training.staleness_threshold must be >= 0"),
        ("async_training.trigger_parameter_sync_step=0", "trigger_parameter_sync_step must be >= 1"),
        ("async_training.max_queue_size=0", "async_training.max_queue_size must be >= require_batches"),
    ],
)
def test_bad_config_value_names_the_key(override, fragment):
    with pytest.raises(ConfigError) as e:
        load_config(None, BASE + [override])
    assert fragment in str(e.value)


@pytest.mark.parametrize(
    "overrides, fragment",
    [
        (["async_training.trigger_parameter_sync_step=3"], "trainer.total_training_steps must be a multiple of"),
        (
            ["async_training.trigger_parameter_sync_step=2", "trainer.total_training_steps=4", "trainer.save_freq=3"],
            "trainer.save_freq must be a multiple of async_training.trigger_parameter_sync_step",
        ),
        (["async_training.compute_prox_log_prob=true"], "rollout_correction.rollout_is must be token or sequence"),
        (
            [
                "async_training.compute_prox_log_prob=true",
                "algorithm.rollout_correction.rollout_is=token",
                "actor.use_rollout_log_probs=true",
            ],
            "compute_prox_log_prob must be false when actor.use_rollout_log_probs is true",
        ),
    ],
)
def test_fully_async_consistency_errors_name_the_key(overrides, fragment):
    base = BASE + ["trainer.schedule=fully_async", "trainer.total_training_steps=10", "trainer.save_freq=0"]
    with pytest.raises(ConfigError) as e:
        load_config(None, base + overrides)
    assert fragment in str(e.value)


def test_missing_model_path_is_named():
    with pytest.raises(ConfigError, match="config key model.path is required"):
        load_config(None, ["data.train_files=[t.parquet]"])


def test_unknown_key_in_yaml_file_names_file_and_key(tmp_path):
    p = tmp_path / "c.yaml"
    p.write_text("model:\n  path: m\ndata:\n  train_files: [a]\nrollout:\n  temprature: 0.5\n")
    with pytest.raises(ConfigError) as e:
        load_config(p)
    assert "rollout.temprature" in str(e.value) and str(p) in str(e.value)


def test_missing_config_file_is_named(tmp_path):
    with pytest.raises(ConfigError, match="no such file"):
        load_config(tmp_path / "nope.yaml")


def test_sft_config_range_error():
    with pytest.raises(ConfigError, match="config key optim.lr must be > 0"):
        load_sft_config(None, ["data.train_files=[a]", "optim.lr=0"])


def _leaf_keys(cls, prefix=""):
    import dataclasses

    for f in dataclasses.fields(cls):
        default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
        if dataclasses.is_dataclass(default):
            yield from _leaf_keys(type(default), prefix + f.name + ".")
        else:
            yield prefix + f.name


def test_every_config_key_is_documented():
    doc = (Path(__file__).resolve().parents[1] / "docs" / "config.md").read_text()
    missing = [k for k in _leaf_keys(Config) if f"`{k}`" not in doc]
    assert not missing, f"keys missing from docs/config.md: {missing}"


@pytest.mark.parametrize(
    "override, fragment",
    [
        ("trainer.mode=ppo", "trainer.mode was split into algorithm.name (grpo | ppo | distill) and trainer.schedule"),
        ("trainer.scheduler=serial", "trainer.scheduler was replaced by trainer.schedule (serial -> sync"),
        ("sync.timeout_s=30", "sync (the section of the trainer -> rollout weight sync) was renamed weight_sync"),
    ],
)
def test_a_replaced_key_fails_naming_its_replacement(override, fragment):
    with pytest.raises(ConfigError) as e:
        load_config(None, BASE + [override])
    assert fragment in str(e.value) and str(e.value).count("\n") == 0


def test_a_replaced_key_in_a_yaml_file_names_the_file(tmp_path):
    p = tmp_path / "old.yaml"
    p.write_text("model:\n  path: m\ndata:\n  train_files: [a]\ntrainer:\n  mode: fully_async\n")
    with pytest.raises(ConfigError, match=f"{p}: config key trainer.mode was split"):
        load_config(p)


@pytest.mark.parametrize(
    "overrides, fragment",
    [
        (["teacher.top_k=4"], "config section teacher: set, but algorithm.name=grpo never reads it (only distill"),
        (["distill.beta=0.1"], "config section distill: set, but algorithm.name=grpo never reads it"),
        (["critic.optim.lr=1e-3"], "config section critic: set, but algorithm.name=grpo never reads it (only ppo"),
        (
            ["algorithm.name=distill", "teacher.url=http://127.0.0.1:1", "critic.cliprange_value=1"],
            "config section critic: set, but algorithm.name=distill",
        ),
        (["reward_model.weight=2"], "config section reward_model: set, but algorithm.name=grpo never reads it"),
        (["async_training.staleness_threshold=1"], "config section async_training: set, but trainer.schedule=sync"),
        (["rollout.num_workers=2"], "rollout.num_workers / rollout.cpus_per_worker: set, but trainer.schedule=sync"),
        (["trainer.critic_warmup=2"], "config key trainer.critic_warmup must be 0 when algorithm.name=grpo"),
        (["algorithm.adv_estimator=gae"], "must be grpo or null when algorithm.name=grpo (gae needs a critic"),
        (["algorithm.name=ppo", "algorithm.adv_estimator=grpo"], "must be gae or null when algorithm.name=ppo"),
        (
            ["algorithm.name=kto"],
            "algorithm.name='kto': no module asyncrl.algorithms.kto to import (built in: distill, dpo",
        ),
        (
            ["algorithm.name=grpo", "algorithm.gamma=0.9"],
            "config key algorithm.gamma: set, but algorithm.name=grpo never",
        ),
        (["algorithm.name=ppo", "algorithm.norm_adv_by_std_in_grpo=false"], "only grpo does"),
        (["algorithm.name=kto!"], "config key algorithm.name must be a built-in algorithm's name"),
        (["dpo.beta=0.5"], "config section dpo: set, but algorithm.name=grpo never reads it"),
        (["ref.fsdp_config.param_offload=true"], "config section ref: set, but algorithm.name=grpo with actor.use_kl"),
        (["actor.fsdp_config.fsdp_size=2"], "actor.fsdp_config.fsdp_size must be -1 or trainer.num_workers (1)"),
        (["actor.ulysses_sequence_parallel_size=2"], "must be 1 (Ulysses sequence parallelism is not built)"),
        (["rollout.tensor_model_parallel_size=2"], "must be 1 with the builtin engine (vllm: any)"),
        (["rollout.dtype=int8"], "config key rollout.dtype must be"),
        (["rollout.top_k=-2"], "config key rollout.top_k must be >= -1 (0 or -1 = off)"),
        (["algorithm.name=dpo", "rollout.n=1"], "config key rollout.n must be >= 2 when algorithm.name=dpo"),
        (["algorithm.name=dpo", "dpo.loss_type=hinge"], "config key dpo.loss_type must be one of sigmoid, ipo"),
        (["algorithm.name=dpo", "actor.use_kl_loss=true"], "actor.use_kl_loss must be false when algorithm.name=dpo"),
        (["trainer.schedule=async"], "config key trainer.schedule must be one of sync, one_step_off, two_step_off"),
        (["trainer.backend=local"], "config key trainer.backend must be one of ray, in_process"),
        (
            ["algorithm.name=ppo", "trainer.schedule=fully_async", "trainer.critic_warmup=1"],
            "trainer.critic_warmup must be 0 when trainer.schedule=fully_async",
        ),
    ],
)
def test_a_section_or_key_the_choices_never_read_is_an_error(overrides, fragment):
    """At load (the config's own rules) or before the run starts (the algorithm's: ``check_config``)."""
    with pytest.raises(ConfigError) as e:
        check_config(load_config(None, BASE + overrides))
    assert fragment in str(e.value)


@pytest.mark.parametrize("algorithm", ["grpo", "ppo", "distill"])
@pytest.mark.parametrize("schedule", ["sync", "one_step_off", "two_step_off", "fully_async"])
def test_every_algorithm_and_schedule_pair_is_a_valid_config(algorithm, schedule):
    extra = ["teacher.url=http://127.0.0.1:1"] if algorithm == "distill" else []
    cfg = load_config(None, BASE + [f"algorithm.name={algorithm}", f"trainer.schedule={schedule}", *extra])
    check_config(cfg)
    assert (cfg.algorithm.name, cfg.trainer.schedule) == (algorithm, schedule)


@pytest.mark.parametrize(
    "path", sorted(p for p in (Path(__file__).resolve().parents[1] / "configs").glob("*.yaml") if p.stem != "sft_tiny")
)
def test_every_shipped_training_config_loads(path):
    """Every configs/*.yaml that `asyncrl train` reads passes the checks (sft_tiny.yaml is `asyncrl sft`'s)."""
    cfg = load_config(str(path), [])
    assert cfg.trainer.total_training_steps >= 1


def test_verls_off_values_and_a_read_ref_section_load():
    """verl's vLLM recipes write top_k=-1 for off; the ref section loads where a reference model is kept."""
    from asyncrl.types import SamplingParams

    cfg = load_config(None, BASE + ["rollout.top_k=-1", "actor.use_kl_loss=true", "ref.fsdp_config.param_offload=true"])
    assert SamplingParams.from_config(cfg.rollout).top_k == 0
    assert cfg.ref.fsdp_config.param_offload
