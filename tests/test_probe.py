"""``asyncrl probe`` (asyncrl's lab): what a run cannot show about the machine it ran on, measured on the run's own
model, prompts, engine and trainer into the cost model's ``Scaling``. Its pieces on inputs the tests control (the
paired thread timings, the streaming decoder's prices, the co-run of two processes), and the command on a real run:
its update is the run's algorithm on the run's trainer, and its prices reach the simulated Rollouter."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
import torch

from asyncrl.planning.cost import CostModel, Scaling, Term
from asyncrl.planning.setting import Prices
from asyncrl.planning.simulate import Cluster, Setting, simulate
from asyncrl_lab.probe import paired_speedup, time_rounds
from asyncrl_lab.probe_corun import CorunRates, Job, corun_rates, loop_calls
from asyncrl_lab.probe_stream import TimedStep
from tests.test_perf import _cli, fixed_cost, sync_run  # noqa: F401 - sync_run is a fixture (a real run)


# ---- the probe on a real run ---------------------------------------------------------------------------------------
def test_asyncrl_probe_prices_the_streaming_decoder_of_a_real_run(sync_run, tmp_path):  # noqa: F811
    """``asyncrl probe`` on the built-in engine streams the run's prompts through the engine's slots and prices a
    step, a row and taking rows in; with a trainer on several threads it times the update and the streamed decode
    sharing the cores; the simulated fully_async Rollouter is priced by them."""
    out = tmp_path / "cost.json"
    res = _cli("probe", str(sync_run), "--out", str(out), cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    assert "device probe: serial fraction" in res.stdout and f"wrote {out}" in res.stdout
    cost = CostModel.load(out)
    sc = cost.scaling
    assert sc.measured and "streamed step" in sc.notes
    assert sc.prefill_token_s is not None and cost.decode.get("prefill_token") == pytest.approx(sc.prefill_token_s)
    assert sc.stream_step_s is not None and sc.stream_step_s > 0
    assert sc.stream_row_s is not None and sc.stream_admit_token_s is not None and sc.stream_admit_s is not None
    assert sc.stream_admit_row_s >= 0
    if cost.train_threads > 1:
        assert sc.oversubscribed_parallel is not None and 0 < sc.oversubscribed_parallel <= 1
        assert sc.oversubscribed_single is not None and 0 < sc.oversubscribed_single <= 1
        assert sc.shared_train is not None and sc.shared_train > 0
        assert "sharing the cores" in sc.notes and "several pools" in sc.notes
    else:  # a one-thread trainer and a one-thread Rollouter do not oversubscribe two cores
        assert sc.oversubscribed_parallel is None and sc.oversubscribed_single is None and sc.shared_train is None
    # a fully_async push timed on the run's roles (in this process: the run's backend)
    assert sc.stream_push_s is not None and sc.stream_push_s > 0 and "weight push" in sc.notes
    setting = Setting("fully_async", trainer=1, rollout=1, staleness_threshold=1.0, partial_rollout=True)
    assert simulate(cost, Cluster.cpu(2), setting, steps=6).samples_per_s > 0


def test_the_probes_update_is_the_runs_algorithm_on_its_trainer_at_the_probes_thread_count(sync_run):  # noqa: F811
    """The update the probe times is a training step of the run's own algorithm (GRPO's PPO-clip loss) through the
    run's trainer worker, on the probe's thread: the thread count the probe sets is the one the update runs on."""
    from asyncrl_lab.probe_workloads import workloads

    before = torch.get_num_threads()
    try:
        with workloads(sync_run, prompts_per_step=4, n=4) as w:
            for threads in (1, 2, 1):
                torch.set_num_threads(threads)
                trained = w.update(0)
                assert trained.actor.metrics["perf/trainer_threads"] == threads
                assert "actor/pg_loss" in trained.actor.metrics and "actor/grad_norm" in trained.actor.metrics
    finally:
        torch.set_num_threads(before)


def test_profile_probe_says_where_the_probe_is(sync_run, tmp_path):  # noqa: F811
    res = _cli("profile", str(sync_run), "--probe", cwd=tmp_path)
    assert res.returncode == 2 and "Traceback" not in res.stderr
    assert "asyncrl probe RUN_DIR" in res.stderr and len(res.stderr.strip().splitlines()) == 1


# ---- its pieces ------------------------------------------------------------------------------------------------------
def test_the_probe_times_both_thread_counts_on_the_same_work_each_round():
    """``asyncrl probe`` pairs its timings: within a round, 1 thread and N threads get the same seed (on a long tail,
    responses drawn afresh per timing differ more in length than the thread counts differ in speed), and the speed-up
    is the median of the rounds' own ratios."""
    calls: list[tuple[int, int]] = []  # (seed, threads) of each call
    phases = {"gen": lambda seed: calls.append((seed, torch.get_num_threads()))}
    times = time_rounds(phases, threads=2, rounds=4, budget_s=1e9)
    assert calls == [(r, t) for r in range(1, 6) for t in (1, 2)]  # round 1 warms up
    assert len(times[("gen", 1)]) == len(times[("gen", 2)]) == 4
    times = {("gen", 1): [2.0, 9.0, 4.0], ("gen", 2): [1.0, 9.0, 1.0]}  # pairs: 2x, 1x, 4x
    assert paired_speedup(times, "gen", 2) == 2.0


def _timed(live: int, tokens: int, rows: int, scale: float = 1.0) -> TimedStep:
    """A streamed step costing 5 ms + 0.3 ms a row held, and when it takes rows in, 2 ms + 0.1 ms a prefilled token
    + 0.4 ms a row taken in on top; ``scale`` times that."""
    admit = 0.002 + 0.0001 * tokens + 0.0004 * rows if rows else 0.0
    return TimedStep(live, tokens, rows, scale * (0.005 + 0.0003 * live + admit))


def test_stream_prices_are_read_from_timed_steps_and_the_process_ratio_is_reported_apart():
    """Streamed steps at 4, 8 and 16 rows, some taking in groups of 4 rows sharing a prompt and some rows resumed
    one by one (their prompt and response prefilled each): the fit gives back every price, the one per prefilled token
    apart from the one per row. This process's batch steps cost 4 ms + 0.2 ms a row where the run's cost 5 ms + 0.25
    ms: the ratio, 1.25, is reported apart and does not move them."""
    from asyncrl_lab.probe_stream import process_ratio, stream_prices

    steps = []
    for k, live in enumerate([4, 8, 16] * 20):
        if k % 3 == 0:  # 1 to 4 groups of 4 rows, a prompt of 10-13 tokens each
            groups = 1 + k % 4
            steps.append(_timed(live, groups * (10 + k % 4), groups * 4))
        elif k % 3 == 1 and k % 2:  # 3 resumed rows of 30 tokens each
            steps.append(_timed(live, 90, 3))
        else:
            steps.append(_timed(live, 0, 0))
    batch = [(live, n, n * (0.004 + 0.0002 * live)) for live, n in [(16, 10), (8, 20), (4, 30), (2, 40), (1, 50)]]
    run = Term(("call", "step", "token", "prefill_token"), (0.03, 0.005, 0.00025, 0.0001))
    p = stream_prices(steps)
    assert p is not None
    assert (p.step_s, p.row_s, p.admit_s, p.admit_token_s, p.admit_row_s) == pytest.approx(
        (0.005, 0.0003, 0.002, 0.0001, 0.0004)
    )
    assert p.step(10) + p.admission(40, 8) == pytest.approx(_timed(10, 40, 8).seconds)
    assert process_ratio(batch, run, rows=8.0) == pytest.approx(1.25)
    assert process_ratio([], run, rows=8.0) is None
    assert stream_prices([s for s in steps if s.rows == 0]) is None  # no admission timed: not priced
    assert stream_prices([s for s in steps if s.rows > 0]) is None  # no step without one: not priced


def test_a_streamed_step_scales_with_threads_as_the_probe_timed_it():
    """Rounds of the same streamed steps on 1 and 2 threads, the 2-thread ones 1.6x as fast in two rounds of three:
    the median says a serial fraction of 0.25 (1.6 = 1 / (0.25 + 0.75 / 2)), and the simulated one-thread Rollouter
    of a two-thread profile is priced 1.6x, whatever generation's own fraction says. Taking rows in (a prefill)
    scales on its own: 1.8x on 2 threads (serial fraction 1/9), and is priced so."""
    from asyncrl_lab.probe_stream import stream_serial

    def steps(scale: float, admit_scale: float) -> list[TimedStep]:
        out = []
        for k, live in enumerate((4, 8, 16) * 5):
            plain = _timed(live, 0, 0, scale)
            if k % 2:
                out.append(plain)
            else:
                extra = _timed(live, 12 * (1 + k % 3) + k % 5, 8 * (1 + k % 3)).seconds - _timed(live, 0, 0).seconds
                out.append(
                    TimedStep(live, 12 * (1 + k % 3) + k % 5, 8 * (1 + k % 3), plain.seconds + admit_scale * extra)
                )
        return out

    rounds = [
        (steps(1.6, 1.8), steps(1.0, 1.0)),
        (steps(1.6, 1.8), steps(1.0, 1.0)),
        (steps(1.1, 1.2), steps(1.0, 1.0)),
    ]
    serial, admit_serial = stream_serial(rounds, 2)
    assert serial == pytest.approx(0.25)
    assert admit_serial == pytest.approx(1 / 9)
    sc = Scaling(gen_serial=1.0, stream_serial=serial, stream_admit_serial=admit_serial)
    cost = fixed_cost(0.01, 1.0, device="cpu", gen_threads=2, scaling=sc)
    prices = Prices(cost, Cluster.cpu(2), Setting("fully_async", trainer=1, rollout=1))
    assert prices.gen_factor == pytest.approx(1.0)  # generation: no gain from a second thread
    assert prices.stream_factor == pytest.approx(1.6)
    assert prices.admit_factor == pytest.approx(1.8)


@contextmanager
def _corun_job(rank: int) -> Iterator[Job]:
    """Both co-run jobs: a matmul in a loop (the update's on two threads, the decode's on one)."""
    a = torch.ones(128, 128)
    yield lambda seconds: loop_calls(lambda _: a @ a, seconds)


def test_corun_prices_the_update_under_the_run_policy_and_both_jobs_together():
    """The probe's co-run in two spawned processes: the update's speed alone under the run's OpenMP policy over its
    priced speed, and each job's speed together over alone (at most 1). The one-thread decode's speed alone is not
    re-priced (no OpenMP region for the policy to act on), so the rates hold no factor for it."""
    rates = corun_rates(_corun_job, train_threads=2, seconds=0.3, rounds=1)
    assert rates.shared_train > 0
    assert 0 < rates.oversubscribed_parallel <= 1 and 0 < rates.oversubscribed_single <= 1
    assert [f.name for f in dataclasses.fields(CorunRates)] == [
        "shared_train",
        "oversubscribed_parallel",
        "oversubscribed_single",
    ]
