"""Experiment trackers behind :class:`asyncrl.telemetry.metrics.MetricsLogger`: Weights & Biases and MLflow.

What each records, how a resumed run continues the same tracker run (``wandb_run.json``, ``mlflow_run.json``: a step
at or below the last one logged is not logged again) and the environment each follows: docs/metrics.md, "Loggers". A
package is imported only when its logger is chosen, and the config check names a missing one before a run starts
(``asyncrl.config.schema.TrainerConfig.check``).
"""

from __future__ import annotations

import importlib
import json
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType

from asyncrl.config.schema import TRACKER_PACKAGES

STATE_FILES = {"wandb": "wandb_run.json", "mlflow": "mlflow_run.json"}
MLFLOW_DIR = "mlruns"  # the default MLflow file store, in the run directory
_PARAM_KEY = re.compile(r"[^/\w.\- :]")  # the characters MLflow refuses in a param's name
_PARAM_KEY_MAX = 250  # MLflow's longest param name and value (characters)
_PARAM_VALUE_MAX = 6000


@dataclass
class RunInfo:
    """What a tracker records of a run: its ``project`` (W&B project, MLflow experiment) and ``name``; at its start
    its resolved ``config`` (the config tree as a dict), the ``command`` line that started it and its roles'
    ``placement`` (pools, roles, workers, rendezvous). ``resumed``: the run goes on from a checkpoint, so each
    tracker continues the run it logged before."""

    project: str
    name: str
    config: dict[str, object] = field(default_factory=dict)
    command: str = ""
    placement: dict[str, object] = field(default_factory=dict)
    resumed: bool = False

    def record(self) -> dict[str, object]:
        """The run as one dict: the config's sections, and ``run`` (its command line and placement)."""
        return {**self.config, "run": {"command": self.command, "placement": self.placement}}


def import_tracker(logger: str) -> ModuleType:
    """The tracker's package, or one error naming what to install (the config check catches a missing package
    first; this catches one that is there but does not import)."""
    module, install = TRACKER_PACKAGES[logger]
    try:
        return importlib.import_module(module)
    except ImportError as e:
        raise ImportError(
            f"trainer.logger lists {logger}, but the {module} package does not import ({e}): {install}"
        ) from e


class _Progress:
    """A tracker run's id and the last step it logged, in ``path`` (JSON, rewritten whole at each step). A run that
    does not resume starts from nothing: its tracker run is a new one."""

    def __init__(self, path: Path, resumed: bool):
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        self.state: dict[str, str | int] = {}  # run_id, where it runs (project, experiment), last_step
        if resumed and path.is_file():
            try:
                self.state = json.loads(path.read_text())
            except (OSError, json.JSONDecodeError) as e:
                raise ValueError(
                    f"{path}: not the JSON a tracker wrote ({e}); delete it to start a new tracker run"
                ) from e
        self.last_step = int(self.state.get("last_step", -1))

    @property
    def run_id(self) -> str | None:
        run_id = self.state.get("run_id")
        return run_id if isinstance(run_id, str) else None

    def start(self, run_id: str, **where: str) -> None:
        if run_id != self.run_id:  # a new tracker run has logged nothing yet
            self.last_step = -1
        self.state = {"run_id": run_id, **where, "last_step": self.last_step}
        self._write()

    def logged(self, step: int) -> None:
        self.last_step = self.state["last_step"] = step
        self._write()

    def _write(self) -> None:
        tmp = self.path.with_name(self.path.name + ".tmp")
        tmp.write_text(json.dumps(self.state) + "\n")
        tmp.replace(self.path)


class WandbBackend:
    """One W&B run per asyncrl run, its id kept in ``wandb_run.json``; the run's description is its config."""

    def __init__(self, run_dir: Path, info: RunInfo) -> None:
        wandb = import_tracker("wandb")
        self.progress = _Progress(run_dir / STATE_FILES["wandb"], info.resumed)
        wandb_dir = Path(os.environ.get("WANDB_DIR") or run_dir)
        wandb_dir.mkdir(parents=True, exist_ok=True)
        resume_id = self.progress.run_id
        self._run = wandb.init(
            project=info.project,
            name=info.name,
            id=resume_id,
            resume="allow" if resume_id else None,
            dir=str(wandb_dir),
            config=info.record(),
            allow_val_change=True,  # a resumed run may change a key (trainer.total_training_steps)
            reinit="create_new",  # leaves alone any W&B run this process already has
        )
        self.run_id: str = self._run.id
        self.progress.start(self.run_id, project=info.project)

    def log(self, step: int, metrics: dict[str, float], walltime_s: float) -> None:
        if step > self.progress.last_step:
            self._run.log(dict(metrics), step=step)
            self.progress.logged(step)

    def close(self, failed: bool = False) -> None:
        self._run.finish(exit_code=1 if failed else 0)


class MlflowBackend:
    """One MLflow run per asyncrl run, in the experiment ``project``, its id kept in ``mlflow_run.json``. The run's
    description: every config key as a param (``trainer.seed``), the command line and placement too (``run.*``),
    and the whole of it as the artifact ``asyncrl/run.json`` (``asyncrl/resumed_after_step_N.json`` at a resume: a
    param cannot change, so a key a resume changes is only there)."""

    def __init__(self, run_dir: Path, info: RunInfo) -> None:
        import_tracker("mlflow")
        from mlflow.entities import Param
        from mlflow.tracking import MlflowClient

        self.tracking_uri = os.environ.get("MLFLOW_TRACKING_URI") or (run_dir / MLFLOW_DIR).resolve().as_uri()
        if self.tracking_uri.startswith("file:") or "://" not in self.tracking_uri:
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
        self._client = client = MlflowClient(tracking_uri=self.tracking_uri)
        self.progress = _Progress(run_dir / STATE_FILES["mlflow"], info.resumed)
        run_id = self.progress.run_id
        if run_id is not None and not self._continues(run_id):
            run_id = None
        params = flat_params(info.record())
        if run_id is None:
            experiment_id = self._experiment_id(info.project)
            run = client.create_run(experiment_id, run_name=info.name, tags={"asyncrl.run_dir": str(run_dir)})
            run_id, artifact = run.info.run_id, "asyncrl/run.json"
        else:
            logged = client.get_run(run_id).data.params
            params = {k: v for k, v in params.items() if k not in logged}
            artifact = f"asyncrl/resumed_after_step_{self.progress.last_step}.json"
        client.log_batch(run_id, params=[Param(k, v) for k, v in params.items()])
        client.log_dict(run_id, info.record(), artifact)
        self.run_id: str = run_id
        self.progress.start(run_id, tracking_uri=self.tracking_uri, experiment=info.project)

    def _continues(self, run_id: str) -> bool:
        """Whether the run a resumed asyncrl run logged to is in this tracking store (set running again), or gone
        (another ``MLFLOW_TRACKING_URI``, a deleted run): then a new one starts."""
        from mlflow.exceptions import MlflowException

        if self.progress.state.get("tracking_uri") != self.tracking_uri:
            return False
        try:
            if self._client.get_run(run_id).info.lifecycle_stage == "deleted":
                return False
        except MlflowException:
            return False
        self._client.update_run(run_id, status="RUNNING")
        return True

    def _experiment_id(self, name: str) -> str:
        from mlflow.exceptions import MlflowException

        found = self._client.get_experiment_by_name(name)
        if found is not None and found.lifecycle_stage == "deleted":
            raise ValueError(
                f"mlflow at {self.tracking_uri}: experiment {name!r} (trainer.project_name) is deleted; restore it "
                "or choose another trainer.project_name"
            )
        if found is not None:
            return found.experiment_id
        try:
            return self._client.create_experiment(name)
        except MlflowException:  # another run created it meanwhile
            found = self._client.get_experiment_by_name(name)
            if found is None:
                raise
            return found.experiment_id

    def log(self, step: int, metrics: dict[str, float], walltime_s: float) -> None:
        from mlflow.entities import Metric

        if step > self.progress.last_step:
            ms = int(walltime_s * 1000)
            self._client.log_batch(self.run_id, metrics=[Metric(k, v, ms, step) for k, v in metrics.items()])
            self.progress.logged(step)

    def close(self, failed: bool = False) -> None:
        self._client.set_terminated(self.run_id, "FAILED" if failed else "FINISHED")


def flat_params(record: Mapping[str, object], prefix: str = "") -> dict[str, str]:
    """``record`` as MLflow params: nested dicts as dotted names (``trainer.seed``), lists and other values as JSON
    text, strings as they are; characters MLflow refuses in a name become ``_``, and a value longer than MLflow takes
    is cut (the run's JSON artifact has it whole)."""
    out: dict[str, str] = {}
    for key, value in record.items():
        name = _PARAM_KEY.sub("_", f"{prefix}{key}")[:_PARAM_KEY_MAX]
        if isinstance(value, dict) and value:
            out.update(flat_params(value, name + "."))
            continue
        text = value if isinstance(value, str) else json.dumps(value, default=str)
        out[name] = text if len(text) <= _PARAM_VALUE_MAX else text[: _PARAM_VALUE_MAX - 3] + "..."
    return out
