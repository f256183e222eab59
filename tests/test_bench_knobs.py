"""``asyncrl bench``'s latency knobs: the reward service on loopback (a real HTTP server, scored by the built-in
scorer, concurrent), the delayed ``calc`` (same answers, same name, importable by name in a fresh process), and the
flags turned into settings, overrides, run directories and rows, with training replaced by a synthetic run."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import pickle
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from asyncrl.config import ConfigError
from asyncrl.data.tasks import make_rows
from asyncrl.rewards.remote import RemoteReward, RewardServiceRejectedError, RewardServiceUnavailableError
from asyncrl.rewards.reward_fn import RewardFn
from asyncrl.rollout.agent.tools import CalcTool, ToolError, build_tools
from asyncrl.telemetry.timeline import write_chrome_trace
from asyncrl_lab import bench, bench_tools
from asyncrl_lab.bench_common import TOOL_TRAIN_OVERRIDES, Workload
from asyncrl_lab.bench_knobs import Latency, run_latencies
from asyncrl_lab.commands import add_bench, bench_latencies
from asyncrl_lab.reward_service import RewardService

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def row():
    return make_rows("chain_sum", 1, seed=5, split="train")[0]


def _body(row, answer: str) -> dict:
    return {
        "data_source": row["data_source"],
        "solution_str": answer,
        "ground_truth": row["reward_model"]["ground_truth"],
        "extra_info": row["extra_info"],
    }


def _client(url: str) -> RemoteReward:
    return RemoteReward(url, timeout_s=10.0, max_retries=0, backoff_s=0.0)


# ---- the reward service ------------------------------------------------------------------------------------------
def test_reward_service_answers_a_post_with_the_builtin_scorers_score_after_the_delay(row):
    truth = row["reward_model"]["ground_truth"]
    wrong = str(int(truth) + 1)
    expected = [RewardFn().score_one(**_body(row, a))[0] for a in (truth, wrong)]
    assert expected == [1.0, 0.0]
    with RewardService(100) as svc:
        assert svc.url.startswith("http://127.0.0.1:") and svc.url.endswith("/score")
        client = _client(svc.url)
        for answer, score in zip((truth, wrong), expected):
            t0 = time.perf_counter()
            reply = client.http.request("POST", "", _body(row, answer))  # the raw JSON reply
            assert time.perf_counter() - t0 >= 0.1
            assert reply == {"score": score}
        client.close()
        assert svc.requests == 2


def test_reward_service_serves_concurrent_requests_together(row):
    n, delay_s = 8, 0.2
    with RewardService(delay_s * 1000) as svc:
        client = _client(svc.url)  # one kept-alive connection per calling thread, as the reward loop's pool has
        start = threading.Barrier(n + 1)
        scores: list[float] = []

        def one() -> None:
            start.wait()
            scores.append(client.score_one(**_body(row, row["reward_model"]["ground_truth"]))[0])

        threads = [threading.Thread(target=one) for _ in range(n)]
        for t in threads:
            t.start()
        start.wait()
        t0 = time.perf_counter()
        for t in threads:
            t.join()
        elapsed = time.perf_counter() - t0
        client.close()
    assert scores == [1.0] * n
    assert svc.in_flight_max >= 2  # requests overlapped inside the service: it does not answer one at a time
    # one at a time takes n x the delay at the very least; together, about one delay (a connection beyond the listen
    # backlog alone added a second)
    assert elapsed < n * delay_s / 2


def test_remote_reward_scores_through_the_service_and_a_bad_request_fails_alone(row):
    truth = row["reward_model"]["ground_truth"]
    with RewardService(0) as svc:
        client = _client(svc.url)
        assert client.score_one(**_body(row, truth)) == (1.0, {})
        assert client.score_one(**_body(row, f"<answer>{int(truth) + 1}</answer>")) == (0.0, {})
        with pytest.raises(RewardServiceRejectedError, match="string fields") as e:
            client.http.request("POST", "", {"solution_str": truth})
        assert e.value.status == 400
        client.close()
        url = svc.url
    with pytest.raises(RewardServiceUnavailableError, match="127.0.0.1"):  # stopped with the block
        _client(url).score_one(**_body(row, truth))


def test_the_bench_runs_the_service_in_a_process_of_its_own(row):
    """``ServiceProcess`` (what ``asyncrl bench --reward-delay-ms`` starts): the same service, answering from another
    process (not on the trainer's interpreter lock), gone when the block ends."""
    from asyncrl_lab.reward_service import ServiceProcess

    truth = row["reward_model"]["ground_truth"]
    with ServiceProcess(0) as svc:
        client = _client(svc.url)
        assert client.score_one(**_body(row, truth)) == (1.0, {})
        [one, two] = client.score_many([tuple(_body(row, a).values()) for a in (truth, "no")])
        assert one == (1.0, {}) and two == (0.0, {})
        assert svc._proc is not None and svc._proc.pid != os.getpid() and svc._proc.poll() is None
        proc = svc._proc
        client.close()
    assert proc.poll() is not None
    with pytest.raises(RewardServiceUnavailableError, match="127.0.0.1"):
        _client(svc.url).score_one(**_body(row, truth))


# ---- the delayed tool ---------------------------------------------------------------------------------------------
def test_delayed_calc_answers_as_calc_under_calcs_name_after_the_delay():
    tools = build_tools([bench_tools.tool_spec(50)])
    assert list(tools) == ["calc"]
    tool = tools["calc"]
    assert type(tool) is bench_tools.calc_delay_50ms and tool.delay_s == 0.05
    assert tool.schema() == CalcTool().schema()  # the prompts render the same tool
    for expression in ("48213 + 9057", "7 / 4", "(3 - 10) * 2"):
        t0 = time.perf_counter()
        got = asyncio.run(tool.call({"expression": expression}))
        assert time.perf_counter() - t0 >= 0.05
        assert got == asyncio.run(CalcTool().call({"expression": expression}))
    with pytest.raises(ToolError, match="unsupported"):
        asyncio.run(tool.call({"expression": "x + 1"}))


def test_delayed_calc_classes_are_cached_and_found_by_name():
    assert bench_tools.tool_spec(0) == "calc"
    assert bench_tools.tool_spec(200) == "asyncrl_lab.bench_tools:calc_delay_200ms"
    cls = bench_tools.calc_delay_200ms
    assert cls is bench_tools.calc_delay_200ms and pickle.loads(pickle.dumps(cls)) is cls
    with pytest.raises(AttributeError, match="calc_delay_<ms>ms"):
        bench_tools.calc_delay_fast  # noqa: B018
    with pytest.raises(ValueError, match="cannot load"):
        build_tools(["asyncrl_lab.bench_tools:calc_slow"])


def test_delayed_calc_builds_by_name_in_a_fresh_process():
    # what a Ray rollout worker does with rollout.multi_turn.tools: import the module, look the name up
    code = (
        "from asyncrl.rollout.agent.tools import build_tools\n"
        "t = build_tools(['asyncrl_lab.bench_tools:calc_delay_30ms'])['calc']\n"
        "print(t.name, t.delay_s, type(t).__name__)\n"
    )
    path = [str(ROOT), str(ROOT / "lab"), *filter(None, [os.environ.get("PYTHONPATH")])]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(path)}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["calc", "0.03", "calc_delay_30ms"]


# ---- flags, settings, overrides ----------------------------------------------------------------------------------
def _parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="asyncrl")
    add_bench(parser.add_subparsers(dest="command"))
    return parser.parse_args(["bench", *argv])


def test_the_flags_become_settings_with_the_instant_one_first():
    lats = bench_latencies(_parse("--modes", "sync,fully_async", "--reward-delay-ms", "200,20"))
    assert lats == [Latency("reward", 0), Latency("reward", 20), Latency("reward", 200)]
    assert [lat.tag for lat in lats] == ["", "@reward20ms", "@reward200ms"]
    lats = bench_latencies(_parse("--workload", "tool", "--tool-delay-ms", "0,200"))
    assert lats == [Latency("tool", 0), Latency("tool", 200)] and lats[1].column == "tool_delay_ms"
    assert bench_latencies(_parse("--modes", "sync")) == []


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--reward-delay-ms", "20,fast"], "--reward-delay-ms: 'fast' is not a whole number"),
        (["--reward-delay-ms", "-5"], "'-5' is not a whole number"),
        (["--tool-delay-ms", "200"], "needs --workload tool"),
        (["--workload", "tool", "--tool-delay-ms", "200", "--reward-delay-ms", "20"], "one per invocation"),
    ],
)
def test_bad_flags_fail_before_any_work_naming_the_flag(argv, message):
    with pytest.raises(ConfigError, match=message):
        bench_latencies(_parse(*argv))


def _workload(name: str, train_overrides: list[str]) -> Workload:
    data = ROOT / "data" / "chain_sum"
    files = {"train": [str(data / "train.parquet")], "val": [str(data / "test.parquet")]}
    return Workload(name, 0.0, [], [f"model.path={ROOT / 'runs' / 'tiny_init'}", *train_overrides], files)


def test_a_tool_delay_names_the_delayed_calc_in_that_runs_config(tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)  # the bench's base config, configs/quickstart.yaml
    wl = _workload("tool", TOOL_TRAIN_OVERRIDES)
    lat = Latency("tool", 200)
    with lat.serving() as over:
        cfg = bench.schedule_config("fully_async", wl, tmp_path, 3, 2, over, lat.tag)
    assert cfg.rollout.multi_turn.tools == ["asyncrl_lab.bench_tools:calc_delay_200ms"]
    assert cfg.rollout.agent.default_agent_loop == "tool_agent" and cfg.trainer.schedule == "fully_async"
    assert Path(cfg.trainer.default_local_dir) == tmp_path / "tool_fully_async@tool200ms"
    with Latency("tool", 0).serving() as over:
        assert bench.schedule_config("sync", wl, tmp_path, 3, 2, over).rollout.multi_turn.tools == ["calc"]


def test_a_reward_delay_serves_during_its_runs_and_stops_even_when_one_fails(tmp_path, monkeypatch, row):
    monkeypatch.chdir(ROOT)
    lat = Latency("reward", 20)
    with pytest.raises(RuntimeError, match="a run failed"):
        with lat.serving() as over:
            cfg = bench.schedule_config("fully_async", _workload("demo", []), tmp_path, 3, 2, over, lat.tag)
            url = cfg.reward.remote_url
            assert over == [f"reward.remote_url={url}"] and url.startswith("http://127.0.0.1:")
            assert _client(url).score_one(**_body(row, row["reward_model"]["ground_truth"]))[0] == 1.0
            raise RuntimeError("a run failed")
    with pytest.raises(RewardServiceUnavailableError):
        _client(url).score_one(**_body(row, "1"))
    with Latency("reward", 0).serving() as over:
        assert over == []  # the instant setting is the in-process reward, as without the flag


def _synthetic_run(run_dir: Path, samples_per_s: float, extra: dict[str, float]) -> None:
    run_dir.mkdir(parents=True)
    steps = [
        {"step": s, "timing_s/step": 2.0, "timing_s/gen": 1.0, "perf/samples_per_s": samples_per_s}
        | {"perf/throughput_tokens_per_s": 100.0, "staleness/mean": 0.0, **extra}
        for s in (1, 2, 3)
    ]
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(m) + "\n" for m in steps))
    write_chrome_trace(run_dir / "timeline.json", [])


def test_every_mode_runs_under_every_setting_and_rows_carry_the_ratio_to_instant(tmp_path, monkeypatch, row):
    """run_bench end to end with training replaced: each 'run' checks its reward service answers, then writes a
    synthetic run whose samples/s depend on the setting (20 ms: two thirds of the instant rate)."""
    monkeypatch.chdir(ROOT)
    seen: list[tuple[str, str | None]] = []

    def fake_run_one(cfg):
        url = cfg.reward.remote_url
        if url:  # the service is up while this setting's runs go
            assert _client(url).score_one(**_body(row, row["reward_model"]["ground_truth"]))[0] == 1.0
        seen.append((Path(cfg.trainer.default_local_dir).name, url))
        rate = (6.0 if cfg.trainer.schedule == "sync" else 9.0) * (2 / 3 if url else 1.0)
        _synthetic_run(Path(cfg.trainer.default_local_dir), rate, {"reward/latency_mean_s": 0.02} if url else {})
        return {}

    monkeypatch.setattr(bench, "prepare_workload", lambda *a: _workload("demo", []))
    monkeypatch.setattr(bench, "run_one", fake_run_one)
    lats = bench_latencies(_parse("--reward-delay-ms", "20"))
    rows = bench.run_bench(["fully_async"], "demo", str(tmp_path), 3, "unused", 2, None, [], None, lats)
    assert [name for name, _ in seen] == [
        "demo_sync",
        "demo_fully_async",
        "demo_sync@reward20ms",
        "demo_fully_async@reward20ms",
    ]
    assert seen[0][1] is None and seen[2][1] == seen[3][1] is not None  # one service per setting, none at 0
    by_name = {r["schedule"]: r for r in rows}
    assert list(by_name) == ["sync", "fully_async", "sync@reward20ms", "fully_async@reward20ms"]
    assert [r["reward_delay_ms"] for r in rows] == [0, 0, 20, 20]
    assert by_name["fully_async@reward20ms"]["ratio_to_instant"] == pytest.approx(2 / 3)
    assert by_name["fully_async"]["ratio_to_instant"] == pytest.approx(1.0)
    assert by_name["fully_async@reward20ms"]["ratio_to_sync"] == pytest.approx(1.5)  # against sync at 20 ms
    assert by_name["sync@reward20ms"]["reward_latency_s"] == pytest.approx(0.02)
    assert by_name["sync"]["reward_latency_s"] is None
    table = (tmp_path / "bench.md").read_text()
    assert "| demo | fully_async@reward20ms | 20 | 0.67x | 0.020 |" in table


def test_run_latencies_passes_each_settings_overrides_and_tag(tmp_path):
    calls = []

    def run(over, tag):
        calls.append((over, tag))
        rows = []
        for mode, rate in (("sync", 4.0), ("fully_async", 8.0)):
            run_dir = tmp_path / f"{mode}{tag}"
            _synthetic_run(run_dir, rate / (2 if tag else 1), {"agent/tool_call_rate": 1.0})
            rows.append({"schedule": mode + tag, "samples_per_s": rate / (2 if tag else 1), "run_dir": str(run_dir)})
        return rows

    rows = run_latencies([Latency("tool", 0), Latency("tool", 200)], run)
    assert calls == [
        (["rollout.multi_turn.tools=[calc]"], ""),
        (["rollout.multi_turn.tools=[asyncrl_lab.bench_tools:calc_delay_200ms]"], "@tool200ms"),
    ]
    assert [(r["schedule"], r["tool_delay_ms"], r["ratio_to_instant"]) for r in rows] == [
        ("sync", 0, 1.0),
        ("fully_async", 0, 1.0),
        ("sync@tool200ms", 200, 0.5),
        ("fully_async@tool200ms", 200, 0.5),
    ]
    assert all(r["tool_call_rate"] == 1.0 for r in rows)
