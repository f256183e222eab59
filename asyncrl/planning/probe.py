"""``asyncrl profile RUN_DIR --probe``: what a run cannot show about the machine it ran on, measured on the run's
own model and prompts.

- Thread scaling: one step's generation (the run's prompts x n, its sampling) and one update on those samples, at 1
  thread and at the run's threads; Amdahl's serial fraction of each, so the model can price a phase on a thread
  count the run did not use (a one-thread rollout worker beside a two-thread trainer).
- Streaming (built-in engine): the run's prompts streamed through the engine's slots as ``fully_async``'s Rollouter
  admits them (a group whenever its rows fit), each step timed: a step's fixed part and its part per row, and what
  taking rows in costs (a prefill, and moving the slots' cache to make room) per admission and per prefilled token
  (``stream_prices``). Taken as measured: this process holds the engine alone, as the Rollouter's does.
- Prefill: the seconds per prompt token of a prefill forward against the decode's per-position price (a resumed
  partial row is prefilled again; a run whose prompts are all alike cannot separate the two).
- Weight sync: a broadcast of the model's bytes between two processes over gloo on 127.0.0.1, at two sizes: the
  fixed cost and the bandwidth; and the seconds the run's engine takes to load the weights (built-in or vLLM).

The engine is the run's: with ``rollout.engine=vllm`` generation and prefill are timed on a vLLM engine built as the
run configured it (the prefill as one-token generations of the prompts and of their first halves).

Medians of several timings after a warm-up. CPU only (a GPU probe is not written: on GPUs give the cluster's
interconnect to ``asyncrl plan``).
"""

from __future__ import annotations

import copy
import os
import socket
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path

import torch

from asyncrl.planning.corun import Job, corun_rates, loop_calls
from asyncrl.planning.cost import CostModel, Scaling
from asyncrl.planning.push_probe import probe_push, push_note
from asyncrl.planning.stream_prices import (
    STREAM_ROUNDS,
    STREAM_STEPS,
    TimedStep,
    amdahl_serial,
    process_ratio,
    stream_prices,
    stream_serial,
    stream_steps,
)


def _broadcast_worker(rank: int, port: int, sizes: list[int], repeats: int, out: str) -> None:
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    torch.set_num_threads(1)
    res = []
    for n in sizes:
        t = torch.zeros(max(1, n // 4), dtype=torch.float32)
        dist.broadcast(t, 0)  # warm-up
        times = []
        for _ in range(repeats):
            dist.barrier()
            t0 = time.perf_counter()
            dist.broadcast(t, 0)
            dist.barrier()
            times.append(time.perf_counter() - t0)
        res.append(statistics.median(times))
    if rank == 0:
        Path(out).write_text(" ".join(f"{x:.9f}" for x in res))
    dist.destroy_process_group()


def probe_sync(weight_bytes: int, repeats: int = 5) -> tuple[float, float]:
    """(fixed seconds, bytes per second) of a gloo broadcast between two processes on loopback."""
    import tempfile

    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    small, big = 4096, max(weight_bytes, 1 << 20)
    with tempfile.TemporaryDirectory() as d:
        out = str(Path(d) / "sync.txt")
        mp.spawn(_broadcast_worker, args=(port, [small, big], repeats, out), nprocs=2, join=True)
        t_small, t_big = (float(x) for x in Path(out).read_text().split())
    bw = (big - small) / max(t_big - t_small, 1e-9)
    return max(0.0, t_small - small / bw), bw


@dataclass
class Workloads:
    """One step's generation, update and a prefill of the run, ready to time, each called with the round's seed
    (both thread counts of a round sample the same tokens: on a long tail, responses drawn afresh for each timing
    differ more in length than the thread counts differ in speed). ``prefill`` runs ``prefill_tokens`` tokens more
    than ``prefill_base`` (None: ``prefill`` alone is the prefill); ``apply``: the run's engine loading the model's
    weights, what a weight sync costs beyond the wire (measured in runs: ``weight_sync/apply_seconds``); ``stream``:
    the streaming decoder timed (built-in engine), ``stream_for``: its streamed steps' seconds over about that long,
    the run's prompts a group whenever it fits, as the Rollouter keeps it busy (``corun``)."""

    generate: Callable[[int], object]
    update: Callable[[int], object]
    prefill: Callable[[int], object]
    prefill_tokens: int
    prefill_base: Callable[[int], object] | None = None
    apply: Callable[[], object] | None = None
    stream: Callable[[], tuple[list[tuple[int, int, float]], list[TimedStep]]] | None = None
    stream_for: Callable[[float], list[float]] | None = None


def workloads(run_dir: str | Path, prompts_per_step: int, n: int) -> Workloads:
    from asyncrl.config import load_config
    from asyncrl.data.dataset import PromptDataset
    from asyncrl.data.rows import load_rows
    from asyncrl.models.loading import load_model
    from asyncrl.models.lora import synced_tensors
    from asyncrl.rollout.engine import RolloutEngine
    from asyncrl.rollout.sampling import SamplingParams

    run = Path(run_dir)
    cfg = load_config(str(run / "config.yaml"))
    model, tok = load_model(run / "final")
    all_rows = load_rows(cfg.data.train_files)
    rows = all_rows[:prompts_per_step]
    dataset = PromptDataset(rows, tok, cfg.data.max_prompt_length)
    prompts = [dataset[i] for i in range(len(dataset))]
    params = SamplingParams.from_config(cfg.rollout)
    if cfg.rollout.engine == "vllm":
        return _vllm_workloads(cfg, run / "final", model, tok, prompts, params, n)
    engine = RolloutEngine(model, tok, max_batch_size=cfg.rollout.max_batch_size)
    samples = engine.generate(prompts, params, seed=0)
    ids = torch.tensor([p.prompt_ids[:8] * 2 for p in prompts for _ in range(n)])  # prompts x n, 16 tokens each

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

    top = min(engine.capacity, max(n, len(prompts) * n))  # the most rows the run decoded at once
    streamed = PromptDataset(all_rows[:64], tok, cfg.data.max_prompt_length)  # enough groups to keep slots full
    stream_prompts = [streamed[i] for i in range(len(streamed))]
    tensors = {k: v.clone() for k, v in synced_tensors(model).items()}  # the engine's own would copy onto themselves
    versions = iter(range(1, 1 << 30))
    return Workloads(
        generate=lambda seed: engine.generate(prompts, params, seed=seed),
        update=_update_of(cfg, model, tok, samples),
        prefill=prefill,
        prefill_tokens=ids.numel(),
        apply=lambda: engine.update_weights(tensors, next(versions)),
        stream=stream,
        stream_for=stream_for,
    )


def corun_job(run_dir: str, prompts_per_step: int, n: int, rank: int) -> Job:
    """``corun``'s jobs on the run: rank 0 its update in a loop, rank 1 its streamed decode (built-in engine)."""
    w = workloads(run_dir, prompts_per_step, n)
    assert w.stream_for is not None
    return partial(loop_calls, w.update) if rank == 0 else w.stream_for


def _update_of(cfg, model, tok, samples) -> Callable[[], object]:
    """One update of ``model``'s copy on ``samples`` (GRPO advantages, the run's actor settings; lr 1e-12)."""
    from asyncrl import losses
    from asyncrl.algorithms.ppo_clip import PolicyTarget, PPOClip
    from asyncrl.data.collate import collate, group_ids, rewards_of
    from asyncrl.rewards.reward_fn import build_reward_fn
    from asyncrl.trainer.update import fit

    build_reward_fn(cfg.reward.custom_function, binarize=cfg.reward.binarize).score(samples)
    batch = collate(samples, tok.pad_token_id)
    adv = losses.compute_grpo_advantages(rewards_of(samples), group_ids(samples), norm_by_std=True)
    spec = PPOClip.of(cfg.actor, cfg.algorithm.rollout_correction)
    batch.policy = PolicyTarget(losses.broadcast_advantages(adv, batch.response_mask_BT), spec)
    batch.old_logp_BT = batch.behav_logp_BT.clone()
    trained = copy.deepcopy(model)
    opt = torch.optim.AdamW(trained.parameters(), lr=1e-12)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda _: 1.0)
    return lambda _seed: fit(trained, opt, sched, batch, cfg.actor, 1, 0)


def _vllm_workloads(cfg, model_dir: Path, model, tok, prompts, params, n: int) -> Workloads:
    """The run's vLLM engine (``rollout.*`` as configured) on its final weights: one step's generation; the
    prefill as one-token generations of the prompts and of their first halves (the difference is the second
    halves' prefill; both within the run's ``max_model_len``); loading the model's weights into it
    (``update_weights``, as a sync does)."""
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
        update=_update_of(cfg, model, tok, samples),
        prefill=lambda seed: engine.generate(prompts, one, seed=seed),
        prefill_tokens=n * sum(len(p.prompt_ids) - len(h.prompt_ids) for p, h in zip(prompts, halves)),
        prefill_base=lambda seed: engine.generate(halves, one, seed=seed),
        apply=lambda: engine.update_weights(tensors, next(versions)),
    )


def time_rounds(
    phases: dict[str, Callable[[int], object]], threads: int, rounds: int, budget_s: float
) -> dict[tuple[str, int], list[float]]:
    """Seconds of each phase at 1 thread and at ``threads``, keyed (phase, threads), one timing per round. The thread
    counts take turns within a round and are given the round's seed (the same work), so a round's two timings form a
    pair; the first round warms up and is not kept, and a slow workload gets fewer rounds (at least 3) so the whole
    stays within about ``budget_s``."""
    before = torch.get_num_threads()
    times: dict[tuple[str, int], list[float]] = {}
    try:
        r = 0
        while r <= rounds:
            t_round = time.perf_counter()
            for t in (1, threads):
                torch.set_num_threads(t)
                for name, fn in phases.items():
                    t0 = time.perf_counter()
                    fn(r + 1)
                    if r:
                        times.setdefault((name, t), []).append(time.perf_counter() - t0)
            if r == 0:
                rounds = max(3, min(rounds, int(budget_s / max(time.perf_counter() - t_round, 1e-9))))
            r += 1
    finally:
        torch.set_num_threads(before)
    return times


def paired_speedup(times: dict[tuple[str, int], list[float]], phase: str, threads: int) -> float:
    """The median over rounds of one round's 1-thread seconds over its ``threads`` seconds."""
    return statistics.median(a / b for a, b in zip(times[(phase, 1)], times[(phase, threads)]))


def probe(cost: CostModel, run_dir: str | Path, rounds: int = 7, budget_s: float = 240.0) -> CostModel:
    """``cost`` with its ``scaling`` measured on this machine (see the module docstring), the thread counts timed in
    pairs (``time_rounds``), medians."""
    w = workloads(run_dir, cost.prompts_per_step, cost.n)
    threads = max(cost.gen_threads, cost.train_threads, 2)
    phases = {"gen": w.generate, "upd": w.update, "prefill": w.prefill}
    if w.prefill_base is not None:
        phases["prefill_base"] = w.prefill_base
    before_threads = torch.get_num_threads()
    times = time_rounds(phases, threads, rounds, budget_s)
    rounds = len(times[("gen", 1)])
    gen = {t: statistics.median(times[("gen", t)]) for t in (1, threads)}
    upd = {t: statistics.median(times[("upd", t)]) for t in (1, threads)}
    speedup = {k: paired_speedup(times, k, threads) for k in ("gen", "upd")}
    prefill = {}
    for t in (1, threads):
        base = statistics.median(times[("prefill_base", t)]) if w.prefill_base is not None else 0.0
        prefill[t] = max(0.0, statistics.median(times[("prefill", t)]) - base) / w.prefill_tokens
    fixed, bw = probe_sync(cost.weight_bytes)
    apply_note = ""
    if w.apply is not None:  # the engine loads the weights after they arrive: a fixed cost of every sync
        w.apply()
        applied = []
        for _ in range(3):
            t0 = time.perf_counter()
            w.apply()
            applied.append(time.perf_counter() - t0)
        fixed += statistics.median(applied)
        apply_note = f"; the engine loads the weights in {statistics.median(applied):.3f} s (added to the fixed cost)"
    n = threads
    stream_kw: dict[str, float] = {}
    stream_note = ""
    if w.stream is not None:  # at the run's generation threads (its decode prices' own), and at the other count
        t = n if cost.gen_threads >= n else 1
        timed: dict[int, list[tuple[list, list]]] = {1: [], n: []}  # n >= 2 (``threads``)
        try:
            for _ in range(STREAM_ROUNDS):  # the thread counts take turns on the same work
                for k in (1, n):
                    torch.set_num_threads(k)
                    timed[k].append(w.stream())
        finally:
            torch.set_num_threads(before_threads)
        batch = [seg for b, _ in timed[t] for seg in b]
        steps = [step for _, s in timed[t] for step in s]
        p = stream_prices(steps)
        serial, admit_serial = stream_serial([(a[1], b[1]) for a, b in zip(timed[1], timed[n])], n)
        if p is None:
            stream_note = "; streamed steps not priced (they could not tell a step from taking rows in)"
        else:
            ratio = process_ratio(batch, cost.decode, statistics.fmean(s.live for s in steps))
            stream_kw = dict(
                stream_step_s=p.step_s,
                stream_row_s=p.row_s,
                stream_admit_s=p.admit_s,
                stream_admit_token_s=p.admit_token_s,
                stream_admit_row_s=p.admit_row_s,
            )
            if serial is not None:
                stream_kw["stream_serial"] = serial
            if admit_serial is not None:
                stream_kw["stream_admit_serial"] = admit_serial
            stream_note = (
                f"; streamed step {p.step_s * 1e3:.2f} ms + {p.row_s * 1e3:.3f} ms/row, taking rows in "
                f"{p.admit_s * 1e3:.2f} ms + {p.admit_token_s * 1e6:.1f} us/token + {p.admit_row_s * 1e3:.3f} ms/row "
                f"on {t}"
                + ("" if ratio is None else f" (the run's batch steps were x{ratio:.2f} this process's; not applied)")
                + ("" if serial is None else f", serial fraction {serial:.2f}")
                + ("" if admit_serial is None else f" ({admit_serial:.2f} taking rows in)")
            )
    corun_note = ""
    if w.stream_for is not None and cost.train_threads > 1:  # the trainer's update beside the Rollouter's decode
        co = corun_rates(partial(corun_job, str(run_dir), cost.prompts_per_step, cost.n), cost.train_threads)
        stream_kw.update(
            shared_train=co.shared_train,
            oversubscribed_parallel=co.oversubscribed_parallel,
            oversubscribed_single=co.oversubscribed_single,
        )
        corun_note = (
            f"; as a run of several pools runs them (idle OpenMP threads sleeping), the update on "
            f"{cost.train_threads} threads ran at {co.shared_train:.2f} of its priced speed; sharing the cores with "
            f"the streamed decode on 1, at {co.oversubscribed_parallel:.2f} and {co.oversubscribed_single:.2f} of that"
        )
    push_note_ = ""
    if w.stream is not None:  # the built-in engine: a fully_async run's push on the run's roles
        pushes = probe_push(run_dir, cost.train_threads)
        stream_kw["stream_push_s"] = statistics.fmean(pushes)
        push_note_ = "; " + push_note(pushes)
    scaling = Scaling(
        gen_serial=amdahl_serial(speedup["gen"], 1.0, n),
        train_serial=amdahl_serial(speedup["upd"], 1.0, n),
        sync_fixed_s=fixed,
        sync_bytes_per_s=bw,
        measured=True,
        notes=(
            f"generate {gen[1]:.3f} s on 1 thread, {gen[n]:.3f} s on {n} ({speedup['gen']:.2f}x paired); update "
            f"{upd[1]:.3f} s / {upd[n]:.3f} s ({speedup['upd']:.2f}x); "
            f"prefill {prefill[n] * 1e6:.1f} us/token on {n}{apply_note}{stream_note}{corun_note}{push_note_}; "
            f"{rounds} rounds"
        ),
        prefill_token_s=prefill[n] if cost.gen_threads >= n else prefill[1],
        **stream_kw,
    )
    return replace(cost, scaling=scaling)
