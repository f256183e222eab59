"""A fully_async weight push, timed on the run's own roles: what the sync run cannot show (it pushes no weights).

A push parks the Rollouter, sends the trainer's weights, loads them into the Rollouter's engine, and lets it go on with
its snapshot handed back (``StreamSupervisor.push``). Timed apart, the transfer and the load are a fraction of it: in a
run on two cores the calls around them cost about 10 ms a push, and the transfer inside the run is slower than between
two idle processes (BENCHMARKS.md, where a weight push's time goes). So the probe starts the run's model as a
fully_async run would (trainer and Rollouter on the run's backend, one Rollouter on one thread beside the trainer's
threads), lets the Rollouter stream the run's prompts, and, like the trainer's loop less its update, takes a batch and
pushes, ``PUSHES`` times. Each push's seconds beyond its park (which the simulated Rollouter reaches by itself) price
the simulated push."""

from __future__ import annotations

import statistics
import tempfile
import time
from pathlib import Path

PUSHES = 8


def push_overrides(train_threads: int, out: Path) -> list[str]:
    """The sync run's config as a fully_async run of it: one Rollouter on one thread beside the trainer's threads
    (as ``asyncrl bench`` runs fully_async), partial rollout, nothing evaluated, nothing saved; into ``out``."""
    return [
        "trainer.schedule=fully_async",
        f"trainer.cpus_per_worker={train_threads}",
        "rollout.num_workers=1",
        "rollout.cpus_per_worker=1",
        f"ray.num_cpus={train_threads + 1}",
        "async_training.staleness_threshold=1.0",
        "async_training.partial_rollout=true",
        "trainer.val_before_train=false",
        "trainer.test_freq=0",
        "trainer.save_freq=0",
        f"trainer.total_training_steps={PUSHES}",
        f"trainer.default_local_dir={out}",
        "trainer.resume_mode=disable",
    ]


def probe_push(run_dir: str | Path, train_threads: int, pushes: int = PUSHES) -> list[float]:
    """Seconds of each of ``pushes`` weight pushes beyond the park, on the run's model and backend (see the module
    docstring); before each, a trainer step's batch taken from the streaming Rollouter."""
    from asyncrl.config import load_config
    from asyncrl.schedules.fully_async import open_stream

    run = Path(run_dir)
    out: list[float] = []
    with tempfile.TemporaryDirectory() as d:
        cfg = load_config(str(run / "config.yaml"), push_overrides(train_threads, Path(d) / "push"))
        with open_stream(cfg) as (r, _):
            stream = r.stream
            stream.start(None)
            version, groups = r.version, stream.budget.groups_per_update
            for _ in range(pushes):
                stream.get_batch(groups, version)
                version += 1
                t0 = time.perf_counter()
                paused, stats, _snap = stream.push(version, cfg.async_training.partial_rollout, False)
                if stats is None:
                    raise RuntimeError(f"probe_push: the Rollouter died at push {version}: {stream.lost}")
                out.append(time.perf_counter() - t0 - paused)
    return out


def push_note(seconds: list[float]) -> str:
    return (
        f"a fully_async weight push {statistics.fmean(seconds) * 1e3:.1f} ms beyond its park "
        f"({min(seconds) * 1e3:.1f}-{max(seconds) * 1e3:.1f} over {len(seconds)})"
    )
