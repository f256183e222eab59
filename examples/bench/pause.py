"""What a weight-sync pause costs with 1 rollout rank against 4, and what the Rollouter's threads burn while they wait.

One ``fully_async`` Rollouter (in-process, the real engines, the demo's tiny model and task) drives ``--ranks`` rollout
ranks (itself and ``ranks - 1`` ``RolloutWorker``s, each decoding on its own thread with one torch thread), as the
driver does: take a trainer step's groups, wait ``--train-s`` (the update; the ranks decode meanwhile), pause with
partial rollout (``Rollouter.pause(interrupt=True)``: every rank interrupted), push the same weights as a new version
to every rank, resume. Per rank count:

- ``pause_s``: the median seconds ``pause`` took (from the request to the thread parked, every rank's rows back);
- ``gen_cpu_per_decode``: the Rollouter's generation thread's CPU seconds over the seconds its own engine decoded
  (a loop that spins while only the other ranks hold rows burns CPU beyond its own decode: well above 1);
- ``step_s``: the median seconds one engine's decode step took, over every rank (a pause waits for the step each
  rank is in, so ``pause_s / step_s`` is the pause in decode steps);
- ``idle_cpu_frac``: the process's CPU seconds over ``--idle-s`` seconds of waiting with nothing to do (admission
  closed by the staleness budget, every row decoded, nothing consumed), as a share of one core.

    HF_HUB_OFFLINE=1 .venv/bin/python examples/bench/pause.py --ranks 1 4 --syncs 12

Run ``make setup`` first (the tiny model and the default task); run it with nothing else running.
"""

from __future__ import annotations

import argparse
import json
import statistics
import threading
import time

from asyncrl.config import load_config
from asyncrl.schedules import specs_for
from asyncrl.schedules.fully_async.rollouter import Rollouter
from asyncrl.workers.backends import LocalHandle
from asyncrl.workers.rollout import RolloutWorker

BASE = [
    "model.path=runs/tiny_init",
    "data.train_files=[data/chain_sum/train.parquet]",
    "data.val_files=[data/chain_sum/test.parquet]",
    "trainer.schedule=fully_async",
    "trainer.backend=in_process",
    "async_training.partial_rollout=true",
    "async_training.staleness_threshold=1.0",
    "actor.ppo_mini_batch_size=4",
    "rollout.n=4",
    "rollout.response_length=24",
    "rollout.max_batch_size=16",
]


def thread_cpu_s(thread: threading.Thread) -> float:
    return time.clock_gettime(time.pthread_getcpuclockid(thread.ident))  # type: ignore[arg-type]


def timed_steps(engine, out: list[float]) -> None:
    """Record how long each of ``engine``'s decode steps takes (the built-in engine under the agent wrapper)."""
    inner = getattr(engine, "engine", engine)
    step = inner.step

    def timed():
        t0 = time.perf_counter()
        try:
            return step()
        finally:
            out.append(time.perf_counter() - t0)

    inner.step = timed


def measure(ranks: int, syncs: int, idle_s: float, train_s: float, out_dir: str) -> dict[str, float]:
    cfg = load_config(None, [*BASE, f"rollout.num_workers={ranks}", f"trainer.default_local_dir={out_dir}"])
    specs = specs_for(cfg)
    ro = Rollouter(specs.rollouter, num_threads=1)
    others = [RolloutWorker(specs.rollout, name=f"rollout{i}", num_threads=1) for i in range(1, ranks)]
    handles = [LocalHandle(w, w.name, concurrency=4) for w in others]
    if handles:
        ro.attach_ranks(handles)
    steps: list[float] = []
    for engine in [ro.engine, *(w.engine for w in others)]:
        timed_steps(engine, steps)
    weights = ro.engine.state_dict_for_sync()
    groups = cfg.async_training.require_batches * cfg.actor.ppo_mini_batch_size
    ro.start()
    pauses: list[float] = []
    try:
        cpu0 = thread_cpu_s(ro._thread)  # noqa: SLF001 - the measured thread
        for version in range(syncs):
            ro.get_batch(groups, version)
            pauses.append(ro.pause(interrupt=True))
            for engine in [ro.engine, *(w.engine for w in others)]:
                engine.update_weights(weights, version=version + 1)
            ro.resume_generation(version + 1)
            time.sleep(train_s)  # the trainer's update: the ranks decode meanwhile, so each pause stops live decodes
        gen_cpu, decode = thread_cpu_s(ro._thread) - cpu0, ro.take_metrics()["rollouter/busy_s"]  # noqa: SLF001
        time.sleep(idle_s / 2)  # admission closes as the budget fills; the ranks finish their rows
        p0, t0 = time.process_time(), time.perf_counter()
        time.sleep(idle_s)
        idle = (time.process_time() - p0) / (time.perf_counter() - t0)
    finally:
        ro.stop()
        for h in handles:
            h.kill()
    return {
        "ranks": ranks,
        "pause_s": statistics.median(pauses[1:]),
        "pause_max_s": max(pauses[1:]),
        "step_s": statistics.median(steps),
        "gen_cpu_per_decode": gen_cpu / max(decode, 1e-9),
        "idle_cpu_frac": idle,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, nargs="+", default=[1, 4])
    ap.add_argument("--syncs", type=int, default=12)
    ap.add_argument("--idle-s", type=float, default=2.0)
    ap.add_argument("--train-s", type=float, default=0.1, help="seconds between a resume and the next batch")
    ap.add_argument("--repeats", type=int, default=2, help="rounds over --ranks, interleaved")
    ap.add_argument("--out", default="runs/bench_pause")
    args = ap.parse_args()
    rows = []
    for k in range(args.repeats):
        for r in args.ranks:
            row = measure(r, args.syncs, args.idle_s, args.train_s, f"{args.out}/r{r}_{k}")
            rows.append(row)
            print(json.dumps(row), flush=True)
    base = statistics.median(x["pause_s"] for x in rows if x["ranks"] == args.ranks[0])
    for r in args.ranks:
        mine = [x for x in rows if x["ranks"] == r]
        print(
            f"ranks {r}: pause median {statistics.median(x['pause_s'] for x in mine) * 1e3:.1f} ms "
            f"({statistics.median(x['pause_s'] for x in mine) / base:.2f}x of {args.ranks[0]} rank), "
            f"decode step median {statistics.median(x['step_s'] for x in mine) * 1e3:.1f} ms, "
            f"idle CPU {max(x['idle_cpu_frac'] for x in mine):.3f} of a core at most"
        )


if __name__ == "__main__":
    main()
