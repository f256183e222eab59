"""What the planner's prices rest on: the engine's measured decode steps and the fit over them, the engine's own
chunking in the simulator, the profiled run's prompts replayed in their order, the update's share of positions."""

from __future__ import annotations

import dataclasses

import pytest

from asyncrl.planning.clock import Clock
from asyncrl.planning.cost import decode_segments
from asyncrl.planning.decode import Row, decode
from asyncrl.planning.profile import _fit_decode, _keep
from asyncrl.planning.setting import Prices, Work
from asyncrl.planning.simulate import Cluster, Setting
from asyncrl.types import engine_chunks
from tests.test_perf import fixed_cost


def test_engine_chunks_group_rows_by_prefix_length_and_keep_adjacent_rows_together():
    assert engine_chunks([30, 10, 30, 10], 4) == [[0, 1, 2, 3]]  # one chunk: the input order
    assert engine_chunks([30, 30, 10, 10, 20], 2) == [[2, 3], [4, 0], [1]]


def test_the_simulated_decode_chunks_rows_as_the_engine_does():
    """Rows with prefixes [10, 50, 10] needing [100, 1, 100] tokens, 2 to a call: the engine decodes the two long
    rows together (101 steps in all); taken in input order they would cost 100 + 100."""
    cost = fixed_cost(0.01, 1.0, max_batch_size=2, device="cpu")
    prices = Prices(cost, Cluster.gpus(1), Setting("sync", trainer=1))
    clock = Clock(None)
    rows = [Row(100, 10, 0), Row(1, 50, 1), Row(100, 10, 2)]
    clock.spawn(decode(prices, rows))
    clock.run()
    assert clock.now == pytest.approx(101 * 0.01)


def test_the_decode_loop_reports_its_steps_by_batch_size(tiny_engine):
    """``decode_segments``-shaped measurements: the batch starts whole, only shrinks, the steps add up to the longest
    row, and the planner's slot rule reproduces them from the rows' lengths (whatever tokens the model draws)."""
    from asyncrl.rollout.sampling import SamplingParams
    from asyncrl.types import Prompt

    engine = tiny_engine
    prompts = [Prompt(index=i, prompt_ids=[5 + i, 6, 7], data_source="t", ground_truth="") for i in range(3)]
    samples = engine.generate(prompts, SamplingParams(n=4, max_new_tokens=12, temperature=1.0), seed=3)
    segs = engine.last_segments
    assert segs and segs[0][0] == 12
    assert all(b[0] < a[0] for a, b in zip(segs, segs[1:]))
    assert all(steps >= 1 and sec >= 0 for _, steps, sec in segs)
    assert sum(steps for _, steps, _ in segs) == max(len(s.response_ids) for s in samples)
    # the same shape the planner reconstructs from the row lengths alone
    assert [(s.live, s.tokens) for s in decode_segments([len(s.response_ids) for s in samples])] == [
        (live, steps) for live, steps, _ in segs
    ]


def test_measured_steps_price_a_step_and_a_row_that_the_generations_alone_cannot_separate():
    """Generations whose calls, steps and positions move together leave the split between them open; segments of
    varying batch size fix it. Built from known prices: step 4 ms, row 0.3 ms, call 50 ms, prefill 0.1 ms/token."""
    step, token, call, prefill = 0.004, 0.0003, 0.05, 0.0001
    segs = [(16, 20, 0.0), (8, 30, 0.0), (4, 40, 0.0), (2, 50, 0.0), (1, 60, 0.0)]
    segs = [(live, n, n * (step + token * live)) for live, n, _ in segs]
    X = [[2.0, 200.0 + 10 * k, 1800.0 + 160 * k, 400.0] for k in range(6)]
    y = [call * x[0] + step * x[1] + token * x[2] + prefill * x[3] for x in X]
    t = _fit_decode(X, y, prefill, segs)
    assert t.coef == pytest.approx((call, step, token, prefill), rel=1e-6)
    assert t.rel_err == pytest.approx(0.0, abs=1e-9)
    unprobed = _fit_decode(X, y, None, segs)  # a prefilled token priced as a decoded position
    assert unprobed.get("prefill_token") == pytest.approx(token)


def test_the_simulated_run_meets_the_profiled_prompts_in_their_order():
    groups = tuple((10 + k, (k + 1,) * 4) for k in range(5))
    work = Work(fixed_cost(0.1, 1.0, groups=groups), seed=0)
    asked = [work.group(0, i) for i in (40, 7, 40, 3, 99)]
    assert asked == [groups[0], groups[1], groups[0], groups[2], groups[3]]
    assert work.group(1, 0) == groups[4]
    assert all(work.group(2, i) in groups for i in range(20))  # past the profile: drawn from it


def test_the_update_share_counts_every_measured_step():
    """A step whose groups all had zero advantage trained nothing: it lowers the share (a mean of per-step ratios
    over the steps that trained would say 0.5)."""
    assert _keep([(0.0, 100), (50.0, 100)]) == pytest.approx(0.25)
    assert _keep([]) == 1.0


@pytest.fixture
def tiny_engine():
    import string

    from asyncrl.models.presets import build_model
    from asyncrl.models.tokenizer import build_char_tokenizer
    from asyncrl.rollout.engine import RolloutEngine

    tok = build_char_tokenizer([string.printable[:95]])
    return RolloutEngine(build_model("micro", tok, seed=0, initializer_range=0.3), tok, max_batch_size=64)


def test_a_probed_streaming_decoder_prices_the_simulated_rollouter():
    """fully_async's simulated engine steps at the probed streaming prices, not the batch decode's: a step costing
    twice as much halves the Rollouter's output where it is the bottleneck."""
    from asyncrl.planning.cost import Scaling
    from asyncrl.planning.simulate import simulate

    base = fixed_cost(0.01, 0.05, length=40, device="cpu", max_batch_size=16, ppo_mini_batch_size=8)
    setting = Setting("fully_async", trainer=1, rollout=1, staleness_threshold=1.0, partial_rollout=True)
    batch_priced = simulate(base, Cluster.cpu(4), setting, steps=12)
    probed = dataclasses.replace(
        base, scaling=Scaling(stream_step_s=0.01, stream_row_s=0.0, stream_admit_s=0.0, stream_admit_token_s=0.0)
    )
    twice = dataclasses.replace(
        base, scaling=Scaling(stream_step_s=0.02, stream_row_s=0.0, stream_admit_s=0.0, stream_admit_token_s=0.0)
    )
    same = simulate(probed, Cluster.cpu(4), setting, steps=12)
    slow = simulate(twice, Cluster.cpu(4), setting, steps=12)
    assert same.samples_per_s == pytest.approx(batch_priced.samples_per_s, rel=1e-6)
    assert slow.samples_per_s == pytest.approx(batch_priced.samples_per_s / 2, rel=0.1)


def test_a_probed_push_prices_the_simulated_fully_async_push():
    """fully_async's simulated push lasts what the probe timed on the run's roles (beyond the park), not the plain
    sync's fixed + bytes / bandwidth: on the CPU only (a GPU cluster's sync is its own), and not a sync schedule's."""
    from asyncrl.planning.cost import Scaling
    from asyncrl.planning.simulate import simulate

    base = fixed_cost(0.01, 0.05, length=40, device="cpu", max_batch_size=16, ppo_mini_batch_size=8)
    setting = Setting("fully_async", trainer=1, rollout=1, staleness_threshold=1.0, partial_rollout=True)
    plain = Scaling(stream_step_s=0.01, stream_row_s=0.0, stream_admit_s=0.0, stream_admit_token_s=0.0)
    pushed = dataclasses.replace(plain, stream_push_s=0.25)
    cpu = Prices(dataclasses.replace(base, scaling=pushed), Cluster.cpu(4), setting)
    assert cpu.stream_push_s == 0.25 and cpu.sync_s != 0.25
    assert Prices(dataclasses.replace(base, scaling=plain), Cluster.cpu(4), setting).stream_push_s == cpu.sync_s
    gpu = Prices(dataclasses.replace(base, scaling=pushed), Cluster.gpus(2), setting)
    assert gpu.stream_push_s == gpu.sync_s
    steps = 12
    fast = simulate(dataclasses.replace(base, scaling=plain), Cluster.cpu(4), setting, steps=steps)
    slow = simulate(dataclasses.replace(base, scaling=pushed), Cluster.cpu(4), setting, steps=steps)
    # every update is followed by a push the trainer waits for: each step is longer by about the difference
    assert slow.step_s - fast.step_s == pytest.approx(0.25 - cpu.sync_s, rel=0.2)
    sync = Setting("sync", trainer=1)
    assert simulate(dataclasses.replace(base, scaling=pushed), Cluster.cpu(4), sync, steps=steps).step_s == (
        pytest.approx(simulate(dataclasses.replace(base, scaling=plain), Cluster.cpu(4), sync, steps=steps).step_s)
    )


def test_the_measured_co_run_speeds_price_an_overlapped_trainer_and_leave_sync_alone():
    """fully_async with a 2-thread trainer beside a one-thread Rollouter on 2 cores, a batch's generation 0.5 s and its
    update 0.5 s, each alone: a fair share of the cores moves both at 2/3 (a step of 0.75 s); the probe's co-run
    speeds (the update at 0.25, the decode at 0.9) end the generation at 0.5 / 0.9 s with 0.25 x that of the update
    done, the rest alone: a step of 0.917 s. sync, which never overlaps them, is priced the same either way."""
    from asyncrl.planning.cost import Scaling
    from asyncrl.planning.simulate import simulate

    base = fixed_cost(0.05, 0.5, length=10, device="cpu", gen_threads=1, train_threads=2)
    measured = dataclasses.replace(base, scaling=Scaling(oversubscribed_parallel=0.25, oversubscribed_single=0.9))
    fa = Setting("fully_async", trainer=2, rollout=1, staleness_threshold=1.0)
    fair, corun = (simulate(c, Cluster.cpu(2), fa, steps=12).step_s for c in (base, measured))
    assert fair == pytest.approx(0.75)
    assert corun == pytest.approx(0.5 / 0.9 + (0.5 - 0.25 * 0.5 / 0.9))
    fair, corun = (simulate(c, Cluster.cpu(2), Setting("sync", trainer=2), steps=12).step_s for c in (base, measured))
    assert corun == pytest.approx(fair, rel=1e-12)
    # a run of several pools (its idle OpenMP threads sleeping) updating at half its priced speed alone: the update
    # left after the generation takes twice as long; sync, a lone worker, is priced as before
    slept = dataclasses.replace(measured, scaling=dataclasses.replace(measured.scaling, shared_train=0.5))
    assert simulate(slept, Cluster.cpu(2), fa, steps=12).step_s == pytest.approx(0.5 / 0.9 + (1.0 - 0.25 * 0.5 / 0.9))
    sync = Setting("sync", trainer=2)
    assert simulate(slept, Cluster.cpu(2), sync, steps=12).step_s == pytest.approx(
        simulate(measured, Cluster.cpu(2), sync, steps=12).step_s, rel=1e-12
    )
