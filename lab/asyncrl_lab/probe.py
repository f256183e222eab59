"""``asyncrl probe RUN_DIR``: the run's cost model (``asyncrl profile``) with what a run cannot show about the machine
it ran on, measured on the run's own model and prompts (``probe_workloads``), in the cost model's ``Scaling``.

- Thread scaling: one step's generation (the run's prompts x n, its sampling) and one training step of the run's
  algorithm on those samples, at 1 thread and at the run's threads; Amdahl's serial fraction of each, so the model
  can price a phase on a thread count the run did not use (a one-thread rollout worker beside a two-thread trainer).
- Streaming (built-in engine): the run's prompts streamed through the engine's slots as ``fully_async``'s Rollouter
  admits them (a group whenever its rows fit), each step timed: a step's fixed part and its part per row, and what
  taking rows in costs (a prefill, and moving the slots' cache to make room) per admission and per prefilled token
  (``probe_stream``). Taken as measured: this process holds the engine alone, as the Rollouter's does.
- Prefill: the seconds per prompt token of a prefill forward against the decode's per-position price (a resumed
  partial row is prefilled again; a run whose prompts are all alike cannot separate the two).
- Weight sync: a broadcast of the model's bytes between two processes over gloo on 127.0.0.1, at two sizes: the
  fixed cost and the bandwidth; and the seconds the run's engine takes to load the weights (built-in or vLLM).
- Sharing the cores (``probe_corun``) and a fully_async weight push on the run's roles (``probe_push``).

The engine is the run's: with ``rollout.engine=vllm`` generation and prefill are timed on a vLLM engine built as the
run configured it (the prefill as one-token generations of the prompts and of their first halves).

Medians of several timings after a warm-up. CPU only (a GPU probe is not written: on GPUs give the cluster's
interconnect to ``asyncrl plan``).
"""

from __future__ import annotations

import os
import socket
import statistics
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

import torch

from asyncrl.planning.cost import CostModel, Scaling
from asyncrl.planning.profile import profile_run
from asyncrl_lab.probe_corun import corun_rates
from asyncrl_lab.probe_push import probe_push, push_note
from asyncrl_lab.probe_stream import STREAM_ROUNDS, amdahl_serial, process_ratio, stream_prices, stream_serial
from asyncrl_lab.probe_workloads import Workloads, corun_job, workloads


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


def probe_run(run_dir: str | Path) -> CostModel:
    """``asyncrl probe RUN_DIR``: the run's cost model (``asyncrl profile``) with this machine's ``Scaling`` measured
    (``measure``), its decode refitted with the measured prefill price."""
    return profile_run(run_dir, probe=measure)


def measure(cost: CostModel, run_dir: str | Path, rounds: int = 7, budget_s: float = 240.0) -> Scaling:
    """This machine's ``Scaling`` for ``cost``, the run of ``run_dir`` (see the module docstring), the thread counts
    timed in pairs (``time_rounds``), medians."""
    with workloads(run_dir, cost.prompts_per_step, cost.n) as w:
        threads = max(cost.gen_threads, cost.train_threads, 2)
        phases = {"gen": w.generate, "upd": w.update, "prefill": w.prefill}
        if w.prefill_base is not None:
            phases["prefill_base"] = w.prefill_base
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
            applied = _apply_seconds(w.apply)
            fixed += applied
            apply_note = f"; the engine loads the weights in {applied:.3f} s (added to the fixed cost)"
        stream_kw, stream_note = _stream_scaling(w, cost, threads) if w.stream is not None else ({}, "")
    n = threads
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
    return Scaling(
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


def _apply_seconds(apply: Callable[[], object]) -> float:
    """The median seconds of the engine loading the weights, after one load that warms up."""
    apply()
    applied = []
    for _ in range(3):
        t0 = time.perf_counter()
        apply()
        applied.append(time.perf_counter() - t0)
    return statistics.median(applied)


def _stream_scaling(w: Workloads, cost: CostModel, n: int) -> tuple[dict[str, float], str]:
    """The streaming decoder's prices (``Scaling.stream_*``) and their note: timed at the run's generation threads
    (its decode prices' own) and at the other count of (1, ``n``), in turns on the same work."""
    assert w.stream is not None
    t = n if cost.gen_threads >= n else 1
    timed: dict[int, list[tuple[list, list]]] = {1: [], n: []}  # n >= 2 (``threads``)
    before = torch.get_num_threads()
    try:
        for _ in range(STREAM_ROUNDS):  # the thread counts take turns on the same work
            for k in (1, n):
                torch.set_num_threads(k)
                timed[k].append(w.stream())
    finally:
        torch.set_num_threads(before)
    batch = [seg for b, _ in timed[t] for seg in b]
    steps = [step for _, s in timed[t] for step in s]
    p = stream_prices(steps)
    serial, admit_serial = stream_serial([(a[1], b[1]) for a, b in zip(timed[1], timed[n])], n)
    if p is None:
        return {}, "; streamed steps not priced (they could not tell a step from taking rows in)"
    ratio = process_ratio(batch, cost.decode, statistics.fmean(s.live for s in steps))
    kw = dict(
        stream_step_s=p.step_s,
        stream_row_s=p.row_s,
        stream_admit_s=p.admit_s,
        stream_admit_token_s=p.admit_token_s,
        stream_admit_row_s=p.admit_row_s,
    )
    if serial is not None:
        kw["stream_serial"] = serial
    if admit_serial is not None:
        kw["stream_admit_serial"] = admit_serial
    note = (
        f"; streamed step {p.step_s * 1e3:.2f} ms + {p.row_s * 1e3:.3f} ms/row, taking rows in "
        f"{p.admit_s * 1e3:.2f} ms + {p.admit_token_s * 1e6:.1f} us/token + {p.admit_row_s * 1e3:.3f} ms/row "
        f"on {t}"
        + ("" if ratio is None else f" (the run's batch steps were x{ratio:.2f} this process's; not applied)")
        + ("" if serial is None else f", serial fraction {serial:.2f}")
        + ("" if admit_serial is None else f" ({admit_serial:.2f} taking rows in)")
    )
    return kw, note
