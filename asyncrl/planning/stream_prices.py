"""The streaming decoder's prices (fully_async's Rollouter) from timed steps: the probe (``probe``) streams the run's
prompts through the engine's slots as the Rollouter admits them and times every step; these functions turn those
timings into a step's fixed part and its part per row, what taking rows in costs, and how a step scales with
threads."""

from __future__ import annotations

import statistics
import time
from dataclasses import replace

from asyncrl.planning.cost import Term, fit_term, segments_term


def amdahl_serial(t1: float, tn: float, n: int) -> float:
    """The serial fraction s with t1 / tn = 1 / (s + (1 - s) / n), clamped to [0, 1]."""
    if n <= 1 or tn <= 0:
        return 0.0
    speedup = t1 / tn
    s = (n / speedup - 1.0) / (n - 1.0)
    return min(1.0, max(0.0, s))


STREAM_STEPS = 400  # streamed steps the probe times a round (a few seconds on a small model)
STREAM_ROUNDS = 3  # rounds of them at each thread count


def stream_steps(
    engine, prompts: list, params, n: int, seed: int, steps: int, limit: int
) -> list[tuple[int, int, float]]:
    """(rows in slots, tokens prefilled, seconds) of each of ``steps`` steps of ``engine`` streaming ``prompts``
    (cycled, a new epoch each pass): a group of ``n`` blank rows is submitted whenever it fits in ``limit`` rows, as
    the Rollouter admits. The rows still held at the end are interrupted."""
    from asyncrl.types import Sample

    out: list[tuple[int, int, float]] = []
    k = 0
    engine.take_prefill()
    while len(out) < steps:
        while min(limit, engine.capacity) - engine.live_rows() >= n:
            p = replace(prompts[k % len(prompts)], epoch=k // len(prompts))
            engine.submit([Sample(p, [], [], [], "interrupted", 0, row=j) for j in range(n)], params, seed)
            k += 1
        live = min(engine.live_rows(), engine.capacity)
        t0 = time.perf_counter()
        engine.step()
        out.append((live, engine.take_prefill().tokens, time.perf_counter() - t0))
    engine.interrupt()
    return out


def plain_step(steps: list[tuple[int, int, float]]) -> tuple[float, float] | None:
    """(fixed s, per row s) of the streamed steps that took no rows in (None: there were none)."""
    plain = [(live, sec) for live, tokens, sec in steps if tokens == 0]
    if not plain:
        return None
    a, b = fit_term(("step", "token"), [[1.0, live] for live, _ in plain], [sec for _, sec in plain]).coef
    return a, b


def stream_serial(
    rounds: list[tuple[list[tuple[int, int, float]], list[tuple[int, int, float]]]], n: int
) -> float | None:
    """Amdahl's serial fraction of a streamed step (a streamed step of a small model scales with threads unlike a
    whole batch generation), from rounds of the same steps timed on 1 thread and on ``n``: the median over rounds of
    their prices' ratio at the rounds' mean rows."""
    ratios = []
    for steps_1, steps_n in rounds:
        one, many = plain_step(steps_1), plain_step(steps_n)
        if one is None or many is None:
            continue
        rows = statistics.fmean(live for live, _, _ in steps_1 + steps_n)
        t1, tn = one[0] + one[1] * rows, many[0] + many[1] * rows
        if tn > 0:
            ratios.append(t1 / tn)
    return amdahl_serial(statistics.median(ratios), 1.0, n) if ratios else None


def stream_prices(steps: list[tuple[int, int, float]]) -> tuple[float, float, float, float] | None:
    """(step s, per row s, per admission s, per admitted token s) of the streaming decoder, from its timed ``steps``
    (a step that took rows in pays their admission on top of its decode). None when the steps cannot tell them apart
    (no step without an admission, or none with one).

    Taken as measured: the probe's process holds the engine alone, as the Rollouter's does. They are not moved by the
    sync run's own batch steps (``process_ratio``), which ran in the trainer's process beside its optimizer state
    (BENCHMARKS.md, issue 49, sixth session: moved by that ratio, 0.91-1.23, the predictions of eight bracketed
    invocations were off by -14..+17% of the measured ratio to sync; as measured, by -5..+9%)."""
    if all(tokens == 0 for _, tokens, _ in steps):
        return None
    fitted = plain_step(steps)
    if fitted is None:
        return None
    a, b = fitted
    taking = [(tokens, sec - a - b * live) for live, tokens, sec in steps if tokens > 0]
    admit = fit_term(("call", "token"), [[1.0, tokens] for tokens, _ in taking], [extra for _, extra in taking])
    return a, b, admit.get("call"), admit.get("token")


def process_ratio(batch: list[tuple[int, int, float]], run_decode: Term, rows: float) -> float | None:
    """The run's batch decode step (``run_decode``, fitted in its trainer's process) over this process's (``batch``:
    measured segments) at ``rows`` rows: how much slower the engine decoded beside the trainer (reported, not
    applied). None without a batch segment."""
    if not batch:
        return None
    here = segments_term(batch)
    mine = here.get("step") + here.get("token") * rows
    return (run_decode.get("step") + run_decode.get("token") * rows) / max(mine, 1e-12)
