"""The performance model's parts on inputs the tests control: the decode structure against a step-by-step replay of
the engine's batching rule, the fit on exact data, the virtual clock's sharing of cores, the schedules' overlap on
separate devices against their closed forms, ``asyncrl profile`` on a real run, ``asyncrl plan``'s output, and
one clear error per bad input."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from asyncrl.planning.clock import Clock, Compute, Delay, Signal, Wait
from asyncrl.planning.cost import (
    CostModel,
    CostModelError,
    Scaling,
    Term,
    continuous_schedule,
    decode_regressors,
    decode_segments,
    fit_term,
    from_dict,
)
from asyncrl.planning.plan import candidates, make_plan, overrides, splits
from asyncrl.planning.simulate import Cluster, Setting, median_step, simulate


# ---- the decode structure --------------------------------------------------------------------------------------------
def replay_engine(remaining: list[int], slots: int = 0) -> tuple[int, int]:
    """(steps, slot steps) of the built-in engine's rule, one step at a time (``rollout.continuous``): rows take the
    lowest free slot; a step runs every slot in use; then ended rows free theirs, trailing free slots go, and the
    live rows are packed once live + waiting <= half the slots in use."""
    waiting = [r for r in remaining if r > 0]
    slots = slots or len(waiting)
    used: list[int | None] = []  # tokens left per slot
    steps = slot_steps = 0
    while waiting or any(x is not None for x in used):
        for k in range(slots):
            if not waiting:
                break
            if k >= len(used):
                used.append(None)
            if used[k] is None:
                used[k] = waiting.pop(0)
        steps, slot_steps = steps + 1, slot_steps + len(used)
        used = [None if x is None or x == 1 else x - 1 for x in used]
        while used and used[-1] is None:
            used.pop()
        live = [x for x in used if x is not None]
        if len(live) + len(waiting) <= len(used) // 2:
            used = live
    return steps, slot_steps


@settings(max_examples=200, deadline=None, derandomize=True)
@given(st.lists(st.integers(0, 40), min_size=0, max_size=30), st.integers(0, 12))
def test_decode_segments_replay_the_engines_slots(remaining, slots):
    segs = decode_segments(remaining, slots=slots)
    steps, slot_steps = replay_engine(remaining, slots)
    if not slots:
        assert sum(s.tokens for s in segs) == steps == max([0, *remaining])
    assert sum(s.tokens for s in segs) == steps
    assert sum(s.tokens * s.live for s in segs) == slot_steps
    assert sum(s.finished for s in segs) == sum(r > 0 for r in remaining)
    reg = decode_regressors(remaining, prefill_tokens=7)
    assert reg["step"] == sum(s.tokens for s in decode_segments(remaining)) and reg["prefill_token"] == 7


def replay_continuous(remaining: list[int], slots: int) -> tuple[int, int, list[int]]:
    """(steps, live-row steps, start step of each row) of continuous batching, one step at a time: at most
    ``slots`` rows run; before each step the waiting rows, in order, take the slots finished rows left."""
    rem = [r for r in remaining if r > 0]
    slots = slots or len(rem)
    left, start, running, nxt, t, row_steps = {}, [0] * len(rem), [], 0, 0, 0
    while True:
        while len(running) < slots and nxt < len(rem):
            start[nxt], left[nxt] = t, rem[nxt]
            running.append(nxt)
            nxt += 1
        if not running:
            return t, row_steps, start
        t += 1
        row_steps += len(running)
        for i in running:
            left[i] -= 1
        running = [i for i in running if left[i] > 0]


@settings(max_examples=200, deadline=None, derandomize=True)
@given(st.lists(st.integers(0, 40), min_size=0, max_size=30), st.integers(0, 12))
def test_vllm_segments_replay_continuous_batching(remaining, slots):
    segs = decode_segments(remaining, "vllm", slots)
    steps, row_steps, start = replay_continuous(remaining, slots)
    assert sum(s.tokens for s in segs) == steps
    assert sum(s.tokens * s.live for s in segs) == row_steps
    assert sum(s.finished for s in segs) == sum(r > 0 for r in remaining)
    assert all(s.live <= (slots or len(remaining)) for s in segs)
    assert continuous_schedule([r for r in remaining if r > 0], slots)[1] == start
    # no slot limit: the same steps as the built-in engine, never more live-row steps (finished rows leave at once)
    if not slots:
        assert steps == max([0, *remaining]) and row_steps <= replay_engine(remaining)[1]


def test_fit_recovers_exact_coefficients_and_never_goes_negative():
    rows = [[1.0, float(x), float(x * x % 7)] for x in range(1, 12)]
    y = [0.5 + 0.25 * r[1] + 0.125 * r[2] for r in rows]
    term = fit_term(("call", "a", "b"), rows, y)
    assert term.coef == pytest.approx((0.5, 0.25, 0.125), rel=1e-9)
    assert term.rel_err < 1e-9 and term.n == 11
    # y falls with x: a free fit's slope is negative; the cost's is held at 0
    down = fit_term(("call", "x"), [[1.0, float(x)] for x in range(5)], [5.0 - x for x in range(5)])
    assert min(down.coef) >= 0.0


def test_fit_leaves_out_one_disturbed_observation():
    rows = [[1.0, float(x)] for x in range(1, 20)]
    y = [1.0 + 0.5 * x for x in range(1, 20)]
    y[7] *= 3.0  # one step slowed by another job
    term = fit_term(("call", "x"), rows, y)
    assert term.coef == pytest.approx((1.0, 0.5), rel=1e-9)
    assert term.rel_err > 0.1  # reported over every observation, the disturbed one included


# ---- the clock -------------------------------------------------------------------------------------------------------
def test_shared_cores_slow_every_computation_and_own_devices_do_not():
    def job(seconds, threads, pool, done, name):
        yield Compute(seconds, threads, pool)
        done[name] = clock.now

    for cores, pool, expect in ((2, "shared", (1.5, 1.5)), (2, None, (1.0, 1.0)), (4, "shared", (1.0, 1.0))):
        clock, done = Clock(cores), {}
        clock.spawn(job(1.0, 2, pool, done, "a"))
        clock.spawn(job(1.0, 1, pool, done, "b"))
        clock.run()
        assert (done["a"], done["b"]) == pytest.approx(expect)  # 3 threads on 2 cores: each at 2/3 of its speed


def test_oversubscribed_cores_move_a_parallel_job_and_a_one_thread_job_at_their_measured_speeds():
    """With the probe's co-run speeds (a 2-thread job at 0.25 of its speed beside a one-thread job at 0.9), a 1 s
    2-thread job beside a 0.45 s one-thread job: the one-thread job ends at 0.5 s, the parallel one has done 0.125 s
    of its work by then and ends at 1.375 s (a fair share: 0.675 s and 1.225 s). Three one-thread jobs on 2 cores
    keep their fair share: no parallel region waits on a barrier."""

    def job(clock, seconds, threads, done, name):
        yield Compute(seconds, threads)
        done[name] = clock.now

    for rates, expect in (((0.25, 0.9), (1.375, 0.5)), (None, (1.225, 0.675))):
        clock, done = Clock(2, oversubscribed=rates), {}
        clock.spawn(job(clock, 1.0, 2, done, "parallel"))
        clock.spawn(job(clock, 0.45, 1, done, "one"))
        clock.run()
        assert (done["parallel"], done["one"]) == pytest.approx(expect)
    clock, done = Clock(2, oversubscribed=(0.25, 0.9)), {}
    for name in "abc":
        clock.spawn(job(clock, 1.0, 1, done, name))
    clock.run()
    assert list(done.values()) == pytest.approx([1.5] * 3)


def test_signals_and_delays_order_processes():
    clock, log, sig = Clock(None), [], Signal("go")

    def waiter():
        yield Wait(sig)
        log.append(("woke", clock.now))

    def firer():
        yield Delay(2.0)
        clock.fire(sig)
        log.append(("fired", clock.now))

    clock.spawn(waiter())
    clock.spawn(firer())
    clock.run()
    assert log == [("fired", 2.0), ("woke", 2.0)]


# ---- the schedules, on inputs whose answer is known ------------------------------------------------------------------
def fixed_cost(gen_step_s: float, train_s: float, length: int = 10, n: int = 4, prompts: int = 8, **kw) -> CostModel:
    """Every response ``length`` tokens; a decode step costs ``gen_step_s``, an update ``train_s``, nothing else."""
    zero = Term(("call",), (0.0,))
    base = dict(
        source="test", schedule="sync", prompts_per_step=prompts, n=n, max_batch_size=1024, max_new_tokens=64,
        ppo_mini_batch_size=prompts, groups=((5, (length,) * n),), update_keep=1.0, shared_prefix=True,
        device="cuda", cores=2, gen_threads=1, train_threads=1, weight_bytes=0,
        decode=Term(("call", "step", "token", "prefill_token"), (0.0, gen_step_s, 0.0, 0.0)),
        update=Term(("call", "token"), (train_s, 0.0)), train_other=Term(("call", "token"), (0.0, 0.0)),
        prepare=zero, reward=Term(("row",), (0.0,)), step_other=zero,
    )  # fmt: skip
    base.update(kw)
    return CostModel(**base)


def test_sync_is_the_sum_of_its_phases():
    cost = fixed_cost(0.1, 2.0)  # generation 10 steps x 0.1 s = 1 s, update 2 s
    p = simulate(cost, Cluster.gpus(2), Setting("sync", trainer=1), steps=6)
    assert p.step_s == pytest.approx(3.0)
    assert p.samples_per_s == pytest.approx(32 / 3.0)
    assert p.staleness == {0: 6 * 32}


def test_prepare_is_priced_per_position_a_teacher_scores():
    """Distillation's prepare waits for the teacher's knowledge of every prompt and response token: with 0.01 s per
    position, 8 prompts x 4 rows of 5 + 10 positions add 4.8 s to a sync step."""
    prepare = Term(("call", "token"), (0.5, 0.01))
    cost = fixed_cost(0.1, 2.0, prepare=prepare)
    p = simulate(cost, Cluster.gpus(2), Setting("sync", trainer=1), steps=6)
    assert p.step_s == pytest.approx(1.0 + 0.5 + 0.01 * 8 * 4 * 15 + 2.0)
    old = fixed_cost(0.1, 2.0, prepare=Term(("call",), (0.5,)))  # a profile from before the token regressor
    assert simulate(old, Cluster.gpus(2), Setting("sync", trainer=1), steps=6).step_s == pytest.approx(3.5)


@pytest.mark.parametrize(("engine", "steps"), [("builtin", 80), ("vllm", 50)])
def test_a_decode_call_batches_as_its_engine(engine, steps):
    """Two groups of rows 10, 10, 40, 10 tokens, four rows at a time: the built-in engine runs two chunks of four to
    their longest rows (40 + 40 steps); vLLM starts a waiting row in each freed slot (50 steps: the replay above)."""
    cost = fixed_cost(0.1, 0.0, groups=((5, (10, 10, 40, 10)),), prompts=2, max_batch_size=4, engine=engine,
                      max_num_seqs=4)  # fmt: skip
    assert replay_continuous([10, 10, 40, 10] * 2, 4)[0] == 50
    p = simulate(cost, Cluster.gpus(1), Setting("sync", trainer=1), steps=4)
    assert p.step_s == pytest.approx(steps * 0.1)


@pytest.mark.parametrize("schedule", ["one_step_off", "two_step_off", "fully_async"])
@pytest.mark.parametrize(("gen", "train"), [(0.1, 2.0), (0.3, 1.0)])
def test_overlap_on_separate_devices_reaches_the_slower_phase(schedule, gen, train):
    """Generation (10 x gen s) and training (train s) on devices of their own: in the steady state a step takes the
    slower of the two, so the speed-up over sync is (gen + train) / max(gen, train)."""
    cost = fixed_cost(gen, train)
    setting = Setting(schedule, trainer=1, rollout=1, staleness_threshold=1.0)
    sync = simulate(cost, Cluster.gpus(2), Setting("sync", trainer=1), steps=20)
    p = simulate(cost, Cluster.gpus(2), setting, steps=20)
    g = 10 * gen
    assert median_step(p) == pytest.approx(max(g, train), rel=1e-6)  # the steady state (the run's ends differ)
    assert sync.step_s / median_step(p) == pytest.approx((g + train) / max(g, train), rel=1e-6)
    assert max(p.staleness) <= (2 if schedule == "two_step_off" else 1)


def test_the_simulated_rollouter_scores_rows_beside_its_decode():
    """fully_async's rewards run on the reward loop, not the generation thread: in the simulated Rollouter a row's
    reward (here 0.2 s a row, on a device of its own) overlaps the decode of the rows after it, so some "reward" span
    runs while a "generate" span does, and a step is shorter than decode + reward in series."""
    cost = fixed_cost(0.1, 0.5, reward=Term(("row",), (0.2,)))
    setting = Setting("fully_async", trainer=1, rollout=1, staleness_threshold=1.0)
    p = simulate(cost, Cluster.gpus(2), setting, steps=12)
    gen = [(x.start, x.end) for x in p.spans if x.name == "generate"]
    rew = [(x.start, x.end) for x in p.spans if x.name == "reward"]
    assert rew and any(a < d and c < b for a, b in gen for c, d in rew if b > a and d > c)
    serial = 10 * 0.1 + 32 * 0.2  # a step's decode and its rows' rewards one after the other
    assert median_step(p) < serial


def test_shared_cores_take_the_overlap_back():
    """On 2 shared cores a 2-thread trainer beside a 1-thread rollout is time-sliced: with perfect thread scaling
    the work is the same and one_step_off cannot beat sync."""
    cost = fixed_cost(0.1, 1.0, gen_threads=2, train_threads=2)
    sync = simulate(cost, Cluster.cpu(2), Setting("sync", trainer=2), steps=20)
    p = simulate(cost, Cluster.cpu(2), Setting("one_step_off", trainer=2, rollout=1), steps=20)
    assert p.samples_per_s <= sync.samples_per_s * 1.001
    # with a large serial fraction one thread is as fast as two, and the overlap wins back some of it
    serial = fixed_cost(0.1, 1.0, gen_threads=2, train_threads=2, scaling=Scaling(gen_serial=0.9, train_serial=0.9))
    sync2 = simulate(serial, Cluster.cpu(2), Setting("sync", trainer=2), steps=20)
    p2 = simulate(serial, Cluster.cpu(2), Setting("one_step_off", trainer=2, rollout=1), steps=20)
    assert p2.samples_per_s > sync2.samples_per_s


def test_partial_rollout_cuts_the_wait_for_the_long_tail_at_a_sync():
    """One group in eight is 20x longer and the Rollouter may run a window ahead: without partial rollout a sync
    waits for the running decode (the tail) to end; with it the decode is interrupted at once, and the cut rows
    finish under the next version."""
    groups = tuple([(5, (10,) * 4)] * 7 + [(5, (200,) * 4)])
    cost = fixed_cost(0.01, 0.5, groups=groups, prompts=4)
    common = dict(trainer=1, rollout=1, staleness_threshold=1.0, max_inflight_groups=8)
    off = simulate(cost, Cluster.gpus(2), Setting("fully_async", **common, partial_rollout=False), steps=30)
    on = simulate(cost, Cluster.gpus(2), Setting("fully_async", **common, partial_rollout=True), steps=30)

    def pause(p):  # the park wait + the transfer (0 bytes here), per sync
        return sum(s.end - s.start for s in p.spans if s.name == "sync_weights") / 30

    assert on.partial_share > 0 and off.partial_share == 0
    assert pause(on) < 0.05 < 0.3 < pause(off)  # a decode step is 0.01 s: the pause lands within pieces of it


# ---- plan ------------------------------------------------------------------------------------------------------------
def test_splits_hold_on_the_placement():
    assert splits(Cluster.gpus(8)) == [(r, 8 - r) for r in range(1, 8)]
    two = splits(Cluster.gpus(16, nodes=2))
    assert (8, 8) in two and (2, 14) in two and all(r + t == 16 for r, t in two)
    assert all(r % 2 == 0 and t % 2 == 0 for r, t in two)  # each pool is the same share of both nodes, or whole ones
    for s in candidates(Cluster.gpus(16, nodes=2), ("sync", "fully_async")):
        over = dict(o.split("=") for o in overrides(s, Cluster.gpus(16, nodes=2)))
        used = int(over["trainer.nnodes"]) * int(over["trainer.n_gpus_per_node"])
        if s.schedule != "sync":
            used += int(over["rollout.nnodes"]) * int(over["rollout.n_gpus_per_node"])
        assert used == 16


def test_plan_ranks_overlap_first_when_it_pays():
    cost = fixed_cost(0.1, 1.0)
    plan = make_plan(cost, Cluster.gpus(4), steps=12, search_steps=6, refine=4)
    assert plan.ranked[0].setting.schedule != "sync"
    assert plan.ranked[0].samples_per_s > plan.sync.samples_per_s
    assert [p.samples_per_s for p in plan.ranked] == sorted((p.samples_per_s for p in plan.ranked), reverse=True)


# ---- the cost file and the commands ----------------------------------------------------------------------------------
def test_cost_json_round_trips_and_bad_files_name_the_field(tmp_path):
    cost = fixed_cost(0.1, 1.0)
    path = tmp_path / "cost.json"
    cost.save(path)
    assert CostModel.load(path) == cost
    raw = json.loads(path.read_text())
    del raw["decode"]
    path.write_text(json.dumps(raw))
    with pytest.raises(CostModelError, match="missing field 'decode'"):
        CostModel.load(path)
    with pytest.raises(CostModelError, match="no such file"):
        CostModel.load(tmp_path / "nope.json")
    raw = json.loads(json.dumps(dataclasses.asdict(cost)))
    del raw["engine"], raw["max_num_seqs"]  # a profile written before the engine was recorded: the built-in one
    assert from_dict(raw, "old").engine == "builtin"
    with pytest.raises(CostModelError, match="engine 'sglang' is not one of builtin, vllm"):
        from_dict({**raw, "engine": "sglang"}, "x")
    # a profile whose probe still timed the one-thread decode's policy factor loads without it; others are refused
    old = {**raw, "scaling": {**raw["scaling"], "shared_train": 0.5, "shared_gen": 1.06}}
    assert from_dict(old, "old").scaling == dataclasses.replace(cost.scaling, shared_train=0.5)
    with pytest.raises(CostModelError, match=r"scaling has unknown keys \['shared_rollout'\]"):
        from_dict({**raw, "scaling": {**raw["scaling"], "shared_rollout": 1.0}}, "x")
    # a file of the wrong shape gets the field named, never a TypeError
    for bad, message in [
        ({"scaling": 3}, "scaling must be a JSON object, got 3"),
        ({"decode": {"names": 1, "coef": [1.0]}}, "decode: names must be a list of strings"),
        ({"decode": {"names": ["a"], "coef": ["x"]}}, "decode: names must be a list of strings, coef"),
        ({"decode": {"names": ["a", "b"], "coef": [1.0]}}, "decode: 2 names but 1 coefficients"),
        ({"update_keep": "x"}, "update_keep must be a positive number, got 'x'"),
    ]:
        with pytest.raises(CostModelError, match=re.escape(message)):
            from_dict({**raw, **bad}, "x")


def _cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    return subprocess.run([sys.executable, "-m", "asyncrl.cli", *args], capture_output=True, text=True, env=env,
                          cwd=cwd, timeout=300)  # fmt: skip


@pytest.fixture(scope="module")
def sync_run(tmp_path_factory):
    """A real 5-step sync run of the micro model, its roles in this process."""
    from asyncrl.config import load_config
    from asyncrl.schedules import run_training
    from tests.helpers import make_data, make_model, train_overrides

    root = tmp_path_factory.mktemp("perf")
    train, test = make_data(root)
    model = make_model(root, train)
    over = train_overrides(model, train, test, root / "run", 5) + ["trainer.backend=in_process", "trainer.test_freq=0"]
    run_training(load_config(None, over))
    return root / "run"


def test_profile_and_plan_on_a_real_run(sync_run, tmp_path):
    from asyncrl.planning.profile import profile_run

    cost = profile_run(sync_run)
    assert cost.schedule == "sync" and cost.prompts_per_step == 4 and cost.n == 4
    assert len(cost.groups) == 5 * 4 and all(len(rs) == 4 for _, rs in cost.groups)  # every step, 4 groups each
    assert cost.decode.n == 4 and all(c >= 0 for c in cost.decode.coef)
    assert 0 < cost.update_keep < 2 and cost.weight_bytes > 0
    res = _cli("profile", str(sync_run), cwd=Path.cwd())
    assert res.returncode == 0, res.stderr
    assert "decode s/call" in res.stdout and "fit error" in res.stdout
    # every setting listed (--top past the 35 searched): where sync ranks hangs on the fitted prices, i.e. on the CPU
    args = ("--cpus", "2", "--steps", "8", "--top", "100")
    res = _cli("plan", "--cost", str(sync_run / "cost.json"), *args, cwd=Path.cwd())
    assert res.returncode == 0, res.stderr
    assert "trainer.schedule=sync" in res.stdout


def test_a_step_slowed_by_something_outside_the_run_is_left_out_of_every_fit(sync_run, tmp_path, caplog):
    """A copy of the run whose step 3 took 20x its time (another job on the machine) fits the same cost as a copy
    without step 3 at all; the step is named in a warning."""
    import shutil

    from asyncrl.planning.profile import profile_run

    def copy(name: str, edit) -> Path:
        run = tmp_path / name
        shutil.copytree(sync_run, run)
        lines = (run / "metrics.jsonl").read_text().splitlines()
        out = [json.dumps(m) for m in (edit(json.loads(line)) for line in lines) if m is not None]
        (run / "metrics.jsonl").write_text("\n".join(out) + "\n")
        return run

    def slowed(m: dict) -> dict:
        if m.get("step") == 3 and "timing_s/step" in m:
            m = {**m, "timing_s/step": 20 * m["timing_s/step"], "timing_s/train": 20 * m["timing_s/train"]}
        return m

    without = profile_run(copy("without", lambda m: None if m.get("step") == 3 else m))
    with caplog.at_level("WARNING", logger="asyncrl.planning.profile"):
        disturbed = profile_run(copy("disturbed", slowed))
    for term in ("decode", "update", "train_other", "prepare", "reward", "step_other"):
        assert getattr(disturbed, term).coef == getattr(without, term).coef, term
    assert "steps 3 (" in caplog.text and "left out of the fits" in caplog.text


def test_plan_command_prints_ranked_overrides(tmp_path):
    path = tmp_path / "cost.json"
    fixed_cost(0.1, 1.0).save(path)
    res = _cli("plan", "--cost", str(path), "--gpus", "4", "--top", "3", "--out", str(tmp_path / "plan.png"),
               "--json", str(tmp_path / "plan.json"), cwd=Path.cwd())  # fmt: skip
    assert res.returncode == 0, res.stderr
    assert "| 1 |" in res.stdout and "trainer.schedule=" in res.stdout
    assert (tmp_path / "plan.png").stat().st_size > 0
    rows = json.loads((tmp_path / "plan.json").read_text())
    assert rows[0]["ratio_to_sync"] > 1.0 and any(
        o.startswith("rollout.n_gpus_per_node=") for o in rows[0]["overrides"]
    )


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["plan", "--cost", "missing.json", "--gpus", "4"], "no such file"),
        (["plan", "--cost", "COST", "--gpus", "3", "--nodes", "2"], "split evenly"),
        (["plan", "--cost", "COST"], "one of --gpus"),
        (["profile", "not_a_dir"], "is not a directory"),
    ],
)
def test_bad_input_is_one_line(args, message, tmp_path):
    path = tmp_path / "cost.json"
    fixed_cost(0.1, 1.0).save(path)
    res = _cli(*[str(path) if a == "COST" else a for a in args], cwd=tmp_path)
    assert res.returncode == 2, res.stderr
    assert message in res.stderr and "Traceback" not in res.stderr


def test_the_planner_runs_the_schedules_own_loop_and_follows_a_change_to_it(monkeypatch):
    """The simulator runs ``schedules.loops``, the loop the real run runs: a one_step_off whose next batch is launched
    only after the update (no overlap left) is predicted at sync's step, where the shipped loop reaches the slower
    phase; the shipped loop itself is the one the simulator picks up."""
    from asyncrl.schedules import loops

    cost = fixed_cost(0.2, 2.0)  # generation 10 x 0.2 s, training 2 s: overlapped, a step takes 2 s instead of 4
    setting = Setting("one_step_off", trainer=1, rollout=1)
    sync = simulate(cost, Cluster.gpus(2), Setting("sync", trainer=1), steps=12)
    shipped = simulate(cost, Cluster.gpus(2), setting, steps=12)
    assert median_step(shipped) == pytest.approx(2.0, rel=1e-6)

    def launch_after_the_update(p):
        launched = p.launch(p.start)
        for step in p.steps():
            generated = yield from p.generated(launched, step)
            yield from p.push(step)
            prepared = yield from p.prepare(generated, step)
            trained = yield from p.train(prepared, step)
            if step < p.total:
                launched = p.launch(step + 1)
            yield from p.end_step(step, generated, prepared, trained)

    monkeypatch.setitem(loops.LOOPS, "one_step_off", launch_after_the_update)
    changed = simulate(cost, Cluster.gpus(2), setting, steps=12)
    assert median_step(sync) == pytest.approx(4.0, rel=1e-6)
    assert median_step(changed) == pytest.approx(median_step(sync), rel=1e-6)


def test_the_planner_runs_fully_asyncs_own_consumer_loop_and_follows_a_change_to_it(monkeypatch):
    """fully_async's driver loop is ``schedules.fully_async.loop.consume`` for the run and for the planner alike:
    with the trainer the slower side (an update 2 s, its preparation 0.5 s), the shipped loop is predicted at 2.5 s a
    step; a loop that prepares every batch twice at 3.0 s."""
    from asyncrl.schedules.fully_async import loop

    cost = fixed_cost(0.001, 2.0, prepare=Term(("call",), (0.5,)))
    setting = Setting("fully_async", trainer=1, rollout=1, staleness_threshold=1.0)
    shipped = simulate(cost, Cluster.gpus(2), setting, steps=12)
    assert median_step(shipped) == pytest.approx(2.5, rel=1e-6)

    def prepare_twice(p):
        for step in p.steps():
            got = yield from p.take(step)
            yield from p.prepare(got, step)
            prepared = yield from p.prepare(got, step)
            trained = yield from p.train(prepared, step)
            if p.window_ended():
                yield from p.push(step)
            yield from p.end_step(step, got, prepared, trained)

    monkeypatch.setattr(loop, "consume", prepare_twice)
    changed = simulate(cost, Cluster.gpus(2), setting, steps=12)
    assert median_step(changed) == pytest.approx(3.0, rel=1e-6)
