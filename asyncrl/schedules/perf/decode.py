"""A decode call on the virtual clock, priced by the engine's own structure (``cost.decode_segments``): one step per
token of its longest row, each costing a fixed part plus a part per live row; rows split by group over the rollout
replicas, which step together, in chunks of ``max_batch_size`` rows. A pause (partial rollout) or a refill cut stops
it between pieces; the rows keep what they have and continue, re-prefilled, in a later call."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from asyncrl.schedules.fully_async.producer import split_by_group
from asyncrl.schedules.perf.clock import Compute
from asyncrl.schedules.perf.cost import Segment, decode_segments
from asyncrl.schedules.perf.setting import Prices

PIECES = 16  # a decode call is cut into at most this many pieces per segment: a pause lands within 1/16 of it


# ---- decode on the clock ---------------------------------------------------------------------------------------------
@dataclass
class Row:
    need: int  # tokens still to generate
    prefix: int  # tokens to prefill before it continues
    shared: int  # a blank row's group id (rows of one blank group share one prefill); -1 when resumed


@dataclass
class Decoded:
    tokens: list[int]  # tokens each row generated in this call
    finished: list[bool]


def decode(
    prices: Prices,
    rows: list[Row],
    stop: Callable[[], bool] = lambda: False,
    refill: Callable[[int, int], bool] | None = None,
):
    """A process fragment (``yield from``): one engine call over ``rows`` split over the replicas, in chunks of
    ``max_batch_size`` rows per replica. ``stop()`` (a pause) and ``refill(n_active, n_rows)`` are checked between
    pieces; both cut the call there. Returns ``Decoded``."""
    got = [0] * len(rows)
    # the Rollouter's own split: a blank group's rows stay together, a resumed row is a group of its own
    shares = split_by_group(rows, prices.replicas, key=lambda r: r.shared if r.shared >= 0 else id(r))
    mbs = prices.cost.max_batch_size
    # every replica's chunks run one after another; the replicas step together
    plans = []
    for share in shares:
        chunks = [share[i : i + mbs] for i in range(0, len(share), mbs)]
        plans.append(chunks)
    n_calls = max((len(chunks) for chunks in plans), default=0)
    cut = False
    for c in range(n_calls):
        chunk_rows = [chunks[c] if c < len(chunks) else [] for chunks in plans]
        prefill = max(_prefill_tokens([rows[i] for i in ch]) for ch in chunk_rows)
        yield Compute(prices.call_s(prefill), prices.gen_threads, prices.pool)
        per_rep = [decode_segments([rows[i].need for i in ch]) for ch in chunk_rows]
        # the union of every replica's segment boundaries: between two, each replica's live batch is constant
        bounds = sorted({0} | {b for segs in per_rep for b in _ends(segs)})
        n0 = len(chunk_rows[0])
        for a, b in zip(bounds, bounds[1:]):
            here = [seg for seg in (_seg_at(segs, a) for segs in per_rep) if seg is not None]  # constant up to b
            piece = max(1, (b - a) // PIECES)
            t = a
            while t < b:
                u = min(b, t + piece)
                cost = max((prices.segments_cost(seg, u - t) for seg in here), default=0.0)
                yield Compute(cost, prices.gen_threads, prices.pool)
                t = u
                if t < b and stop():
                    cut = True
                    break
            for ch in chunk_rows:
                for i in ch:
                    got[i] = min(rows[i].need, t)
            if cut:
                break
            active0 = sum(1 for i in chunk_rows[0] if rows[i].need > t)
            if stop() or (refill is not None and active0 and refill(active0, n0)):
                cut = any(rows[i].need > t for ch in chunk_rows for i in ch)
                if cut:
                    break
        if cut:
            break
    finished = [got[i] >= rows[i].need for i in range(len(rows))]
    return Decoded(got, finished)


def _prefill_tokens(rows: list[Row]) -> float:
    seen: set[int] = set()
    total = 0
    for r in rows:
        if r.shared >= 0:
            if r.shared in seen:
                continue
            seen.add(r.shared)
        total += r.prefix
    return float(total)


def _ends(segs: list[Segment]) -> list[int]:
    out, t = [], 0
    for s in segs:
        t += s.tokens
        out.append(t)
    return out


def _seg_at(segs: list[Segment], t: int) -> Segment | None:
    """The segment that decodes token ``t + 1``."""
    end = 0
    for s in segs:
        end += s.tokens
        if t < end:
            return s
    return None
