"""What ``asyncrl probe`` times, built from the run's directory: one step's generation on the run's engine and final
weights, a prefill, the engine loading weights, the streaming decoder (built-in engine), and one training step of the
run's own algorithm on the run's own trainer.

The training step is the run's: the algorithm of ``algorithm.name`` (``asyncrl.algorithms.algorithm_class``) prepares
the batch from the generated samples and trains on it through the trainer worker the run's role specs build
(``asyncrl.schedules.specs_for``, ``asyncrl.workers.start.start_roles``, in this process as ``asyncrl replay`` starts
it). Its calls run on the probe's own thread (``_OnThisThread``), so the torch thread count the probe sets is the
one the update runs on: a worker's call thread keeps the count it started with.
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any

import torch

from asyncrl.config import Config
from asyncrl.roles.clients import RoleClient, Roles, RolloutSide
from asyncrl_lab.probe_corun import Job, loop_calls
from asyncrl_lab.probe_stream import STREAM_STEPS, TimedStep, stream_steps


@dataclass
class Workloads:
    """One step's generation, update and a prefill of the run, ready to time, each called with the round's seed
    (both thread counts of a round sample the same tokens: on a long tail, responses drawn afresh for each timing
    differ more in length than the thread counts differ in speed). ``prefill`` runs ``prefill_tokens`` tokens more
    than ``prefill_base`` (None: ``prefill`` alone is the prefill); ``apply``: the run's engine loading the model's
    weights, what a weight sync costs beyond the wire (measured in runs: ``weight_sync/apply_seconds``); ``stream``:
    the streaming decoder timed (built-in engine), ``stream_for``: its streamed steps' seconds over about that long,
    the run's prompts a group whenever it fits, as the Rollouter keeps it busy (``probe_corun``)."""

    generate: Callable[[int], object]
    update: Callable[[int], object]
    prefill: Callable[[int], object]
    prefill_tokens: int
    prefill_base: Callable[[int], object] | None = None
    apply: Callable[[], object] | None = None
    stream: Callable[[], tuple[list[tuple[int, int, float]], list[TimedStep]]] | None = None
    stream_for: Callable[[float], list[float]] | None = None


@contextmanager
def workloads(run_dir: str | Path, prompts_per_step: int, n: int) -> Iterator[Workloads]:
    """The run's workloads on its final weights, its trainer started for the update while the block runs."""
    from asyncrl.config import load_config
    from asyncrl.data.dataset import PromptDataset
    from asyncrl.data.rows import load_rows
    from asyncrl.models.loading import load_model
    from asyncrl.rewards.reward_fn import build_reward_fn
    from asyncrl.rollout.sampling import SamplingParams

    run = Path(run_dir)
    cfg = load_config(str(run / "config.yaml"))
    model, tok = load_model(run / "final")
    all_rows = load_rows(cfg.data.train_files)
    dataset = PromptDataset(all_rows[:prompts_per_step], tok, cfg.data.max_prompt_length)
    prompts = [dataset[i] for i in range(len(dataset))]
    params = SamplingParams.from_config(cfg.rollout)
    with ExitStack() as stack:

        def update_of(samples: list) -> Callable[[int], object]:
            build_reward_fn(cfg.reward.custom_function, binarize=cfg.reward.binarize).score(samples)
            return stack.enter_context(training_step(cfg, run / "final", tok, samples))

        if cfg.rollout.engine == "vllm":
            yield _vllm_workloads(cfg, run / "final", model, tok, prompts, params, n, update_of)
        else:
            yield _builtin_workloads(cfg, model, tok, prompts, params, n, all_rows, update_of)


UpdateOf = Callable[[list], Callable[[int], object]]  # one step's samples -> the run's training step on them


def _builtin_workloads(cfg, model, tok, prompts, params, n: int, all_rows, update_of: UpdateOf) -> Workloads:
    """The built-in engine on the run's final weights; the update on one step's samples of it."""
    from asyncrl.data.dataset import PromptDataset
    from asyncrl.models.lora import synced_tensors
    from asyncrl.rollout.engine import RolloutEngine

    engine = RolloutEngine(model, tok, max_batch_size=cfg.rollout.max_batch_size)
    samples = engine.generate(prompts, params, seed=0)
    ids = torch.tensor([p.prompt_ids[:8] * 2 for p in prompts for _ in range(n)])  # prompts x n, 16 tokens each
    top = min(engine.capacity, max(n, len(prompts) * n))  # the most rows the run decoded at once
    streamed = PromptDataset(all_rows[:64], tok, cfg.data.max_prompt_length)  # enough groups to keep slots full
    stream_prompts = [streamed[i] for i in range(len(streamed))]

    def prefill(_seed: int):
        with torch.no_grad():
            return model(input_ids=ids)

    def stream() -> tuple[list[tuple[int, int, float]], list[TimedStep]]:
        """(the batch decode's measured segments, the streamed steps) on this engine, on the current threads. The
        stream is held at a few numbers of rows, up to the most the run decoded at once (where its prices were
        measured): a group, twice that, ... (the fixed and the per-row part of a step are told apart)."""
        batch = []
        for seed in (101, 102):
            engine.generate(prompts, params, seed=seed)
            batch += engine.last_segments
        levels = sorted({min(top, n << k) for k in range(top.bit_length() + 1)})
        steps = []
        each = max(1, STREAM_STEPS // (2 * len(levels)))
        for i, limit in enumerate(levels):  # a group at a time, then a batch at a time
            for burst in (False, True):
                steps += stream_steps(engine, stream_prompts, params, n, 103 + i, each, limit, burst)
        return batch, steps

    def stream_for(seconds: float) -> list[float]:
        out: list[float] = []
        end = time.perf_counter() + seconds
        while not out or time.perf_counter() < end:
            out += [s.seconds for s in stream_steps(engine, stream_prompts, params, n, 199, 20, top)]
        return out

    tensors = {k: v.clone() for k, v in synced_tensors(model).items()}  # the engine's own would copy onto themselves
    versions = iter(range(1, 1 << 30))
    return Workloads(
        generate=lambda seed: engine.generate(prompts, params, seed=seed),
        update=update_of(samples),
        prefill=prefill,
        prefill_tokens=ids.numel(),
        apply=lambda: engine.update_weights(tensors, next(versions)),
        stream=stream,
        stream_for=stream_for,
    )


def _vllm_workloads(cfg, model_dir: Path, model, tok, prompts, params, n: int, update_of: UpdateOf) -> Workloads:
    """The run's vLLM engine (``rollout.*`` as configured) on its final weights: one step's generation; the
    prefill as one-token generations of the prompts and of their first halves (the difference is the second
    halves' prefill; both within the run's ``max_model_len``); loading the model's weights into it
    (``update_weights``, as a sync does); the update on one step's samples of it."""
    from asyncrl.config.specs import EngineSpec
    from asyncrl.models.lora import synced_tensors
    from asyncrl.rollout.vllm_engine import VllmEngine, VllmOptions

    spec = EngineSpec(
        replace(cfg.model, path=str(model_dir)), cfg.rollout, cfg.data.max_prompt_length, cfg.trainer.seed
    )
    engine = VllmEngine(str(model_dir), tok, VllmOptions.from_spec(spec))
    samples = engine.generate(prompts, params, seed=0)
    one = replace(params, n=n, max_new_tokens=1)
    halves = [replace(p, prompt_ids=p.prompt_ids[: max(1, len(p.prompt_ids) // 2)]) for p in prompts]
    tensors = synced_tensors(model)
    versions = iter(range(1, 1 << 30))
    return Workloads(
        generate=lambda seed: engine.generate(prompts, params, seed=seed),
        update=update_of(samples),
        prefill=lambda seed: engine.generate(prompts, one, seed=seed),
        prefill_tokens=n * sum(len(p.prompt_ids) - len(h.prompt_ids) for p, h in zip(prompts, halves)),
        prefill_base=lambda seed: engine.generate(halves, one, seed=seed),
        apply=lambda: engine.update_weights(tensors, next(versions)),
    )


@contextmanager
def training_step(cfg: Config, weights: Path, tokenizer: Any, samples: list) -> Iterator[Callable[[int], object]]:
    """One training step of the run on ``samples``, as its driver takes one: the run's algorithm prepares the batch
    (once) and trains its roles on it (``Algorithm.train``: the trainer's reference and old log-probs as the
    objective asks, then the update), each call another step on the same batch. The roles start from ``weights``
    (the run's final model), in this process, one trainer rank, and are called on the caller's thread."""
    from asyncrl.algorithms import algorithm_class
    from asyncrl.schedules import specs_for
    from asyncrl.workers.start import start_roles

    cls = algorithm_class(cfg)
    with tempfile.TemporaryDirectory() as d, ExitStack() as stack:
        trainer = replace(cfg.trainer, backend="in_process", num_workers=1, default_local_dir=d)
        # the trainer's own engine (sync's rollout) is never called here: the built-in one, not a second vLLM engine
        rollout = replace(cfg.rollout, engine="builtin")
        cfg = replace(cfg, model=replace(cfg.model, path=str(weights)), trainer=trainer, rollout=rollout)
        resources = stack.enter_context(cls.resources(cfg, tokenizer, d))
        roles = stack.enter_context(start_roles(cfg, RolloutSide.ACTOR, specs_for(cfg), cls.roles_needed(cfg)))
        algorithm = cls(cfg, tokenizer, _on_this_thread(roles), resources)
        prepared = algorithm.prepare(samples, 1)()
        yield lambda _seed: algorithm.train(prepared, 1)


def _on_this_thread(roles: Roles) -> Roles:
    """``roles`` with every training role's client calling its worker on the caller's thread."""
    swapped = {
        f.name: type(client)(_OnThisThread(client.handle))
        for f in fields(roles)
        if isinstance(client := getattr(roles, f.name), RoleClient)
    }
    return replace(roles, **swapped)


class _OnThisThread:
    """An in-process worker (``asyncrl.workers.backends.LocalHandle``) called on the caller's thread, not its own."""

    def __init__(self, handle: Any):
        self.handle, self.name = handle, handle.name

    def call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        from asyncrl.workers.backends import LocalPending

        done: Future = Future()
        done.set_result(getattr(self.handle.obj, method)(*args, **kwargs))
        return LocalPending(done)

    def kill(self) -> None:
        self.handle.kill()

    def location(self, timeout_s: float | None = None) -> Any:
        return self.handle.location(timeout_s)


@contextmanager
def corun_job(run_dir: str, prompts_per_step: int, n: int, rank: int) -> Iterator[Job]:
    """``probe_corun``'s jobs on the run: rank 0 its training step in a loop, rank 1 its streamed decode (built-in
    engine)."""
    with workloads(run_dir, prompts_per_step, n) as w:
        assert w.stream_for is not None
        yield (lambda seconds: loop_calls(w.update, seconds)) if rank == 0 else w.stream_for
