"""The streaming decoder's prices (fully_async's Rollouter) from timed steps: the probe (``probe``) streams the run's
prompts through the engine's slots as the Rollouter admits them and times every step; these functions turn those
timings into a step's fixed part and its part per row, what taking rows in costs, and how a step scales with
threads."""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, replace

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


@dataclass(frozen=True)
class TimedStep:
    """One timed step of the streaming decoder: ``live`` rows held, ``tokens`` prefilled for the ``rows`` it took in
    (0 and 0: a plain decode step)."""

    live: int
    tokens: int
    rows: int
    seconds: float


def stream_steps(
    engine, prompts: list, params, n: int, seed: int, steps: int, limit: int, burst: bool = False
) -> list[TimedStep]:
    """Each of ``steps`` steps of ``engine`` streaming ``prompts`` (cycled, a new epoch each pass), timed, in groups
    of ``n`` blank rows as the Rollouter submits them, held to ``limit`` rows.

    - ``burst=False``: a group whenever it fits, as a Rollouter bound by its slots admits (one group at a time).
    - ``burst=True``: once the engine is empty, as many groups as fit at once, as a Rollouter bound by staleness
      admits (a batch at a time); every other burst is interrupted after two steps and its rows submitted again with
      what they made, as a sync with partial rollout hands them back (rows prefilled one by one, prompt and response).

    The two tell a step's price from what taking rows in costs per admission, per prefilled token and per row. The
    rows still held at the end are interrupted."""
    from asyncrl.types import Sample

    def group(k: int) -> list[Sample]:
        p = replace(prompts[k % len(prompts)], epoch=k // len(prompts))
        return [Sample(p, [], [], [], "interrupted", 0, row=j) for j in range(n)]

    out: list[TimedStep] = []
    k = bursts = since = 0
    engine.take_prefill()
    while len(out) < steps:
        room = min(limit, engine.capacity) - engine.live_rows()
        if burst and engine.live_rows() == 0:
            groups = max(1, room // n)
            engine.submit([x for j in range(groups) for x in group(k + j)], params, seed)
            k, bursts, since = k + groups, bursts + 1, 0
        elif burst and bursts % 2 == 0 and since == 2:
            engine.submit(engine.interrupt(), params, seed)
        while not burst and room >= n:
            engine.submit(group(k), params, seed)
            k += 1
            room -= n
        live = min(engine.live_rows(), engine.capacity)
        t0 = time.perf_counter()
        engine.step()
        seconds = time.perf_counter() - t0
        took = engine.take_prefill()
        out.append(TimedStep(live, took.tokens, took.rows, seconds))
        since += 1
    engine.interrupt()
    return out


@dataclass(frozen=True)
class StreamPrices:
    """The streaming decoder's prices: a step = ``step_s`` + ``row_s`` per row held; taking rows in, on top =
    ``admit_s`` + ``admit_token_s`` per prefilled token + ``admit_row_s`` per row taken in (its cache written into a
    slot, the slots' cache moved to make room)."""

    step_s: float
    row_s: float
    admit_s: float
    admit_token_s: float
    admit_row_s: float

    def step(self, live: float) -> float:
        return self.step_s + self.row_s * live

    def admission(self, tokens: float, rows: float) -> float:
        return self.admit_s + self.admit_token_s * tokens + self.admit_row_s * rows


def stream_prices(steps: list[TimedStep]) -> StreamPrices | None:
    """The streaming decoder's prices from its timed ``steps``, fitted together (a step that took rows in pays
    their admission on top of its decode). None when the steps cannot tell them apart (no step without an
    admission, or none with one).

    Taken as measured: the probe's process holds the engine alone, as the Rollouter's does. They are not moved by the
    sync run's own batch steps (``process_ratio``), which ran in the trainer's process beside its optimizer state
    (BENCHMARKS.md: moved by that ratio, 0.91-1.23, the predictions of eight bracketed
    invocations were off by -14..+17% of the measured ratio to sync; as measured, by -5..+9%)."""
    if all(s.rows == 0 for s in steps) or all(s.rows > 0 for s in steps):
        return None
    names = ("step", "row", "admit", "admit_token", "admit_row")
    X = [[1.0, s.live, float(s.rows > 0), s.tokens, s.rows] for s in steps]
    fit = fit_term(names, X, [s.seconds for s in steps])
    return StreamPrices(*(fit.get(k) for k in names))


def _serial(pairs: list[tuple[float, float]], n: int) -> float | None:
    """Amdahl's serial fraction from (seconds on 1 thread, seconds on ``n``) of the same work in several rounds: the
    median of their ratios."""
    ratios = [t1 / tn for t1, tn in pairs if tn > 0]
    return amdahl_serial(statistics.median(ratios), 1.0, n) if ratios else None


def stream_serial(rounds: list[tuple[list[TimedStep], list[TimedStep]]], n: int) -> tuple[float | None, float | None]:
    """Amdahl's serial fractions of a streamed step and of taking rows in (a streamed step of a small model scales
    with threads unlike a whole batch generation, and a prefill unlike a step), from rounds of the same steps timed
    on 1 thread and on ``n``: the median over rounds of their prices' ratio at the rounds' mean step and mean
    admission."""
    steps, admits = [], []
    for one, many in rounds:
        p1, pn = stream_prices(one), stream_prices(many)
        if p1 is None or pn is None:
            continue
        both = one + many
        live = statistics.fmean(s.live for s in both)
        steps.append((p1.step(live), pn.step(live)))
        taking = [s for s in both if s.rows > 0]
        tokens, rows = statistics.fmean(s.tokens for s in taking), statistics.fmean(s.rows for s in taking)
        admits.append((p1.admission(tokens, rows), pn.admission(tokens, rows)))
    return _serial(steps, n), _serial(admits, n)


def process_ratio(batch: list[tuple[int, int, float]], run_decode: Term, rows: float) -> float | None:
    """The run's batch decode step (``run_decode``, fitted in its trainer's process) over this process's (``batch``:
    measured segments) at ``rows`` rows: how much slower the engine decoded beside the trainer (reported, not
    applied). None without a batch segment."""
    if not batch:
        return None
    here = segments_term(batch)
    mine = here.get("step") + here.get("token") * rows
    return (run_decode.get("step") + run_decode.get("token") * rows) / max(mine, 1e-12)
