"""Training from Python: ``load_config`` -> a typed ``Config``; ``train`` -> a ``TrainResult`` (docs/api.md).

``train`` is ``asyncrl train`` with what a notebook has and a YAML file has not: a ``reward`` callable, pickled by
value into ``RUN_DIR/inputs/reward_fn.pkl`` (which ``reward.custom_function`` then names, so every role that scores
and a resumed run load the same function), and ``train_data`` / ``val_data`` as rows, checked and written to
``RUN_DIR/inputs/``.
"""

from __future__ import annotations

import copy
import inspect
import sys
import sysconfig
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

from asyncrl.config.checks import validate
from asyncrl.config.errors import ConfigError
from asyncrl.config.loading import load_config as _load_config
from asyncrl.config.schema import Config
from asyncrl.data.rows import validate_row, write_rows
from asyncrl.errors import UserInputError

INPUTS_DIR = "inputs"  # RUN_DIR/inputs: what train() was handed in memory (rows, the reward function)
REWARD_PICKLE = "reward_fn.pkl"

Rows = Sequence[Mapping[str, object]]


@dataclass(frozen=True)
class TrainResult:
    """What a run left: its directory, the final model (a Hugging Face directory), the last step's metrics and the
    run's ``summary.json``."""

    run_dir: Path
    model_dir: Path
    metrics: dict[str, float | None]
    summary: dict[str, object]


@dataclass(frozen=True)
class PythonReward:
    """A callable reward as pickled for the workers: ``batch`` when it takes a list of samples."""

    fn: Callable[..., object]
    batch: bool

    def __call__(
        self, data_source: str, solution_str: str, ground_truth: str, extra_info: dict | None = None
    ) -> object:
        if not self.batch:
            return self.fn(data_source, solution_str, ground_truth, extra_info)
        row = {"data_source": data_source, "solution_str": solution_str, "ground_truth": ground_truth}
        out = self.fn([{**row, "extra_info": extra_info or {}}])
        if not isinstance(out, Sequence) or isinstance(out, str) or len(out) != 1:
            raise ValueError(f"a batch reward returned {out!r} for 1 sample, expected a list of 1 score")
        return out[0]


def load_config(source: str | Path | Mapping[str, object] | None = None, overrides: Sequence[str] = ()) -> Config:
    """A YAML file's path or a nested dict of the same keys, with dotted ``key=value`` overrides, merged onto the
    defaults and checked (``ConfigError`` naming the key); ``data.train_files`` may stay empty for ``train`` to get
    its rows as ``train_data``."""
    return _load_config(source, list(overrides), validate_fn=_check_but_train_files)


def _check_but_train_files(cfg: Config) -> None:
    probe = copy.deepcopy(cfg)
    probe.data.train_files = probe.data.train_files or ["train_data.jsonl"]  # train(train_data=...) sets it
    validate(probe)


def train(
    config: Config | str | Path | Mapping[str, object],
    reward: Callable[..., object] | str | None = None,
    train_data: Rows | str | Path | None = None,
    val_data: Rows | str | Path | None = None,
    overrides: Sequence[str] = (),
) -> TrainResult:
    """Train as ``asyncrl train`` does (in-process roles or Ray, as ``trainer.backend`` says) and return what the run
    left. ``reward``: a callable (module docstring) or a ``reward.custom_function`` spec; ``train_data`` /
    ``val_data``: rows or a file. ``overrides`` apply on top of a path or dict config."""
    from asyncrl.schedules import run_training  # the schedules import torch and the workers: only when training
    from asyncrl.telemetry.metrics import read_metrics

    if isinstance(config, Config):  # a copy to fill in: the caller's Config is not changed
        if overrides:
            raise ConfigError("train(): overrides apply to a config path or dict; set fields on a Config directly")
        cfg = copy.deepcopy(config)
    elif isinstance(config, str | Path | Mapping):  # checked below, once train_data may have set data.train_files
        cfg = _load_config(config, list(overrides), validate_fn=lambda cfg: None)
    else:
        raise ConfigError(f"train(): config must be a Config, a YAML path or a dict (got {type(config).__name__})")
    inputs = Path(cfg.trainer.default_local_dir) / INPUTS_DIR
    if train_data is not None:
        cfg.data.train_files = [_data_file(train_data, inputs / "train.jsonl", "train_data")]
    if val_data is not None:
        cfg.data.val_files = [_data_file(val_data, inputs / "val.jsonl", "val_data")]
    if reward is not None:
        cfg.reward.custom_function = reward if isinstance(reward, str) else _pickle_reward(reward, inputs)
    if not cfg.data.train_files:
        raise ConfigError("train(): no training data: pass train_data (rows or a file) or set data.train_files")
    validate(cfg)
    summary = run_training(cfg)
    run_dir = Path(cfg.trainer.default_local_dir)
    metrics = read_metrics(run_dir / "metrics.jsonl")
    last = max((m for m in metrics if (m.get("step") or 0) >= 1), key=lambda m: m.get("step") or 0, default={})
    return TrainResult(run_dir, Path(str(summary["final_model"])), dict(last), summary)


def _data_file(data: Rows | str | Path, path: Path, what: str) -> str:
    if isinstance(data, str | Path):
        return str(data)
    if isinstance(data, Mapping) or not isinstance(data, Sequence) or not data:
        raise UserInputError(f"train(): {what} must be a non-empty list of dict rows (verl's schema) or a file path")
    rows = [validate_row(dict(r) if isinstance(r, Mapping) else r, f"{what}[{i}]") for i, r in enumerate(data)]
    write_rows(path, rows)
    return str(path.resolve())


def _pickle_reward(fn: Callable[..., object], inputs: Path) -> str:
    """``fn`` pickled by value into ``inputs``; the spec that loads it (``asyncrl.rewards.custom``)."""
    import cloudpickle

    if not callable(fn):
        raise UserInputError(f"train(): reward must be a callable or a 'path/to/file.py:function' spec (got {fn!r})")
    wrapped = PythonReward(fn, _takes_one_argument(fn))
    module = sys.modules.get(getattr(fn, "__module__", None) or "")
    by_value = module is not None and _own_module(module)
    if by_value:
        cloudpickle.register_pickle_by_value(module)  # a worker may not import the user's module: send its code
    try:
        data = cloudpickle.dumps(wrapped)
    except Exception as e:
        raise UserInputError(
            f"train(): the reward {getattr(fn, '__name__', fn)!r} cannot be pickled to reach the workers: "
            f"{type(e).__name__}: {e}"
        ) from None
    finally:
        if by_value:
            cloudpickle.unregister_pickle_by_value(module)
    inputs.mkdir(parents=True, exist_ok=True)
    path = inputs / REWARD_PICKLE
    path.write_bytes(data)
    return str(path.resolve())


def _takes_one_argument(fn: Callable[..., object]) -> bool:
    """``fn(samples)`` (one required positional parameter) rather than verl's four."""
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return False
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    return sum(p.default is p.empty for p in positional) == 1 and len(positional) < 3


def _own_module(module: ModuleType) -> bool:
    """A module of the user's (not the standard library's, not an installed package's, not asyncrl's)."""
    name = module.__name__
    if name == "__main__" or name.split(".")[0] == "asyncrl":
        return False
    file = getattr(module, "__file__", None)
    if not file:
        return False
    installed = {sysconfig.get_paths()[k] for k in ("stdlib", "platstdlib", "purelib", "platlib")}
    return not any(str(Path(file).resolve()).startswith(str(Path(p).resolve())) for p in installed)
