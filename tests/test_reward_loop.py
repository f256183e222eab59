"""The reward loop (every role scores on it) and the HTTP reward service (``reward.remote_url``): concurrency limit,
timeouts, failures confined to their sample, a service that stays down named in one error, rows reported by the
engine as they finish, and 2-step runs with both. The reward service is a real HTTP server on loopback."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from asyncrl.comm.groups import find_free_port
from asyncrl.config import ConfigError, RewardConfig, load_config
from asyncrl.models.presets import build_model
from asyncrl.models.tokenizer import build_char_tokenizer
from asyncrl.rewards.loop import RewardLoop, build_reward_loop
from asyncrl.rewards.remote import RemoteReward, RewardServiceUnavailableError
from asyncrl.rewards.reward_fn import RewardFn
from asyncrl.rollout.engine import RolloutEngine
from asyncrl.rollout.sampling import RowStreams, SamplingParams
from asyncrl.schedules import run_training
from asyncrl.telemetry.metrics import merge_metrics, read_metrics
from asyncrl.types import Prompt, Sample
from tests.helpers import make_data, make_model, train_overrides

REWARDS_PY = """
import asyncio

state = {"in_flight": 0, "max": 0}


async def limited(data_source, solution_str, ground_truth, extra_info):
    state["in_flight"] += 1
    state["max"] = max(state["max"], state["in_flight"])
    await asyncio.sleep(0.05)
    state["in_flight"] -= 1
    return {"score": float(solution_str == ground_truth), "max_seen": float(state["max"])}


async def slow_or_bad(data_source, solution_str, ground_truth, extra_info):
    if solution_str == "slow":
        await asyncio.sleep(30)
    if solution_str == "bad":
        raise ValueError("cannot score this")
    return 1.0


def plain(data_source, solution_str, ground_truth, extra_info):
    return len(solution_str)


def plain_or_bad(data_source, solution_str, ground_truth, extra_info):
    if solution_str == "bad":
        raise ValueError("cannot score this")
    return len(solution_str)
"""


@pytest.fixture
def rewards_file(tmp_path):
    p = tmp_path / "rewards.py"
    p.write_text(REWARDS_PY)
    return p


def _samples(texts: list[str], truth: str = "7") -> list[Sample]:
    out = []
    for i, t in enumerate(texts):
        s = Sample(Prompt(i, [1, 2], "chain_sum", truth), [5], [-1.0], [0])
        s.response_text = t
        out.append(s)
    return out


def test_an_async_reward_function_runs_at_most_max_concurrency_at_once(rewards_file):
    loop = RewardLoop(RewardFn(f"{rewards_file}:limited"), max_concurrency=3, timeout_s=10)
    samples = _samples(["7", "8"] * 6)
    loop.submit_all(samples[:3])  # as an engine would, while the rest are still "decoding"
    loop.submit(samples[3])
    loop.submit_all(samples[3:5])  # one already submitted: scored once
    metrics = loop.score(samples)
    loop.close()
    assert [s.reward for s in samples] == [1.0, 0.0] * 6 and not any(s.reward_failed for s in samples)
    assert max(s.reward_extra["max_seen"] for s in samples) == 3.0  # the limit was reached, never passed
    assert metrics["reward/in_flight_max"] == 3.0 and metrics["reward/failed_count"] == 0
    assert metrics["reward/latency_max_s"] >= metrics["reward/latency_mean_s"] > 0


def test_a_slow_or_failing_reward_fails_only_its_sample(rewards_file):
    loop = RewardLoop(RewardFn(f"{rewards_file}:slow_or_bad"), max_concurrency=4, timeout_s=0.3)
    samples = _samples(["ok", "slow", "bad", "ok"])
    metrics = loop.score(samples)
    loop.close()
    assert [s.reward_failed for s in samples] == [False, True, True, False]
    assert [s.reward for s in samples] == [1.0, 0.0, 0.0, 1.0]
    assert metrics["reward/failed_count"] == 2 and metrics["reward/timeouts"] == 1
    assert any("reward.timeout_s=0.3" in e for e in loop.reward_fn.last_errors)
    assert any("cannot score this" in e for e in loop.reward_fn.last_errors)


def test_a_plain_function_on_the_loop_scores_as_reward_fn_does(rewards_file):
    a, b = _samples(["abc", "hello"]), _samples(["abc", "hello"])
    RewardFn(f"{rewards_file}:plain").score(a)
    loop = RewardLoop(RewardFn(f"{rewards_file}:plain"), max_concurrency=2, timeout_s=5)
    loop.score(b)
    loop.close()
    assert [s.reward for s in a] == [s.reward for s in b] == [3.0, 5.0]


def test_a_row_scored_on_its_own_comes_back_on_its_callback_and_failures_stay_its_own(rewards_file):
    """The per-row path (fully_async's completions): each sample's score is written into it and ``done`` is called
    on the loop's thread; a slow or failing reward fails its row only; ``take_metrics`` closes the books."""
    loop = RewardLoop(RewardFn(f"{rewards_file}:slow_or_bad"), max_concurrency=4, timeout_s=0.3)
    samples = _samples(["ok", "slow", "bad", "ok"])
    back: list[Sample] = []
    arrived = threading.Event()

    def done(s: Sample) -> None:
        back.append(s)
        if len(back) == len(samples):
            arrived.set()

    for s in samples:
        loop.submit(s, done)
    assert arrived.wait(10)
    loop.check()  # nothing stopped the path
    metrics = loop.take_metrics()
    loop.close()
    assert {id(s) for s in back} == {id(s) for s in samples}
    assert back[-1].response_text == "slow"  # the slow one last: the others did not wait for it
    assert [s.reward_failed for s in samples] == [False, True, True, False]
    assert metrics["reward/failed_count"] == 2 and metrics["reward/timeouts"] == 1


def test_a_callback_that_fails_is_raised_on_the_rollout_side(rewards_file):
    loop = RewardLoop(RewardFn(f"{rewards_file}:plain"), max_concurrency=2, timeout_s=5)
    failed = threading.Event()

    def done(_s: Sample) -> None:
        failed.set()
        raise RuntimeError("the books refused the row")

    loop.submit(_samples(["abc"])[0], done)
    assert failed.wait(10)
    for _ in range(100):
        if loop.error is not None:
            break
        threading.Event().wait(0.01)
    with pytest.raises(RuntimeError, match="the books refused the row"):
        loop.check()
    loop.close()


class _Service(BaseHTTPRequestHandler):
    """Scores chain_sum answers; ``fail_first`` 503s before answering; a solution "reject" gets a 400."""

    fail_first = 0
    short_batch = False  # a batch's reply one result short
    seen: list[dict | list] = []

    def do_POST(self):  # noqa: N802 - http.server's name
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        type(self).seen.append(body)
        if isinstance(body, list):
            scores = [{"score": float(b["solution_str"] == b["ground_truth"])} for b in body]
            return self._reply(200, scores[:-1] if type(self).short_batch else scores)
        if type(self).fail_first > 0:
            type(self).fail_first -= 1
            return self._reply(503, {"error": {"message": "warming up"}})
        if body["solution_str"] == "reject":
            return self._reply(400, {"error": {"message": "no answer in the response"}})
        return self._reply(200, {"score": float(body["solution_str"].strip() == body["ground_truth"]), "len": 1.0})

    def _reply(self, status, obj):
        data = json.dumps(obj).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass


@pytest.fixture
def service():
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Service)
    _Service.fail_first, _Service.seen, _Service.short_batch = 0, [], False
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}/score"
    server.shutdown()
    server.server_close()


def test_the_reward_service_scores_retries_and_rejects_per_sample(service):
    _Service.fail_first = 2  # two 503s: retried with back-off, then answered
    remote = RemoteReward(service, timeout_s=5, max_retries=3, backoff_s=0.01)
    loop = RewardLoop(RewardFn(), max_concurrency=2, timeout_s=10, remote=remote)
    samples = _samples(["7", "8", "reject"])
    metrics = loop.score(samples)
    loop.close()
    assert [s.reward for s in samples] == [1.0, 0.0, 0.0] and samples[0].reward_extra == {"len": 1.0}
    assert [s.reward_failed for s in samples] == [False, False, True] and metrics["reward/failed_count"] == 1
    assert "no answer in the response" in loop.reward_fn.last_errors[0]
    assert _Service.seen[-1]["data_source"] == "chain_sum" and _Service.seen[-1]["ground_truth"] == "7"


def test_a_reward_service_that_stays_down_is_one_error_naming_its_url():
    root = f"http://127.0.0.1:{find_free_port()}"  # nothing listens there
    cfg = RewardConfig(remote_url=root + "/score", remote_max_retries=1, remote_backoff_s=0.01)
    loop = build_reward_loop(cfg, RewardFn())
    with pytest.raises(
        RewardServiceUnavailableError, match=f"reward service at {root} unreachable after 1 retries: POST /score"
    ):
        loop.score(_samples(["7", "8"]))
    loop.close()


def test_a_batching_loop_sends_rows_that_arrive_together_in_one_request_and_fails_items_alone(rewards_file):
    """``reward.remote_batch_size``: the samples handed over together go in as few requests as the size allows, each
    sample gets its own result, and an item the service's scorer fails fails that sample only."""
    from asyncrl_lab.reward_service import RewardService

    with RewardService(0, RewardFn(f"{rewards_file}:plain_or_bad")) as svc:
        remote = RemoteReward(svc.url, timeout_s=5, max_retries=0, backoff_s=0.0)
        loop = RewardLoop(RewardFn(), max_concurrency=16, timeout_s=10, remote=remote, batch_size=4)
        samples = _samples(["a", "bb", "bad", "dddd", "eeeee", "ffffff"])
        metrics = loop.score(samples)
        assert svc.requests == 2  # 4 + 2
        assert [s.reward for s in samples] == [1.0, 2.0, 0.0, 4.0, 5.0, 6.0]
        assert [s.reward_failed for s in samples] == [False, False, True, False, False, False]
        assert "item 2 of a batch" in loop.reward_fn.last_errors[0] and "cannot score" in loop.reward_fn.last_errors[0]
        assert metrics["reward/samples_per_request"] == 3.0

        back: list[Sample] = []
        arrived = threading.Event()

        def done(s: Sample) -> None:  # the per-row path (fully_async): one callback a sample
            back.append(s)
            if len(back) == 5:
                arrived.set()

        for s in _samples(["a", "bb", "ccc", "dddd", "bad"]):
            loop.submit(s, done)
        assert arrived.wait(10)
        loop.check()
        assert sorted((s.reward, s.reward_failed) for s in back) == [
            (0.0, True), (1.0, False), (2.0, False), (3.0, False), (4.0, False)
        ]  # fmt: skip
        assert 3 <= svc.requests <= 2 + 5
        loop.close()


def test_a_batch_the_service_answers_wrongly_or_not_at_all_fails_its_samples(service):
    _Service.short_batch = True  # one result fewer than the batch
    loop = RewardLoop(RewardFn(), 8, 10, RemoteReward(service, 5, 0, 0.0), batch_size=8)
    samples = _samples(["7", "8", "7"])
    loop.score(samples)
    assert all(s.reward_failed for s in samples)
    assert "a batch of 3 needs a JSON array of 3" in loop.reward_fn.last_errors[0]
    assert isinstance(_Service.seen[-1], list) and len(_Service.seen[-1]) == 3
    _Service.short_batch = False
    loop.score(samples)
    assert [s.reward for s in samples] == [1.0, 0.0, 1.0] and not any(s.reward_failed for s in samples)
    loop.close()

    root = f"http://127.0.0.1:{find_free_port()}"  # nothing listens there
    loop = RewardLoop(RewardFn(), 8, 10, RemoteReward(root + "/score", 5, 1, 0.01), batch_size=8)
    with pytest.raises(RewardServiceUnavailableError, match=f"reward service at {root} unreachable after 1 retries"):
        loop.score(_samples(["7", "8"]))
    loop.close()


def test_the_decoder_reports_each_row_the_moment_it_ends():
    tok = build_char_tokenizer(["0123456789 +-="])
    model = build_model("micro", tok, seed=0)
    prefix = tok("1 + 2 =")["input_ids"]
    # budgets 6, 1, 3 and an eos id no token has: row 1 ends first, then row 2, then row 0
    engine = RolloutEngine(model, tok, eos_token_ids=[-1])
    streams = RowStreams.of(0, [(0, 0, j) for j in range(3)], [0, 0, 0])
    seen: list[list[tuple[int, int]]] = []
    params = SamplingParams(n=1, temperature=1.0, max_new_tokens=6)

    def on_ended(ended):
        seen.append([(row.tag, len(row.tokens)) for row, _ in ended])

    result = engine._decode_all([prefix] * 3, [6, 1, 3], params, streams, on_ended=on_ended)
    assert seen == [[(1, 1)], [(2, 3)], [(0, 6)]]  # a list per step in which rows ended
    assert [len(t) for t in result.tokens] == [6, 1, 3] and result.stop_reasons == ["length"] * 3


def test_merged_metrics_sum_counts_and_take_maxima():
    parts = [
        {"reward/failed_count": 1.0, "reward/latency_max_s": 0.5, "reward/latency_mean_s": 0.2},
        {"reward/failed_count": 2.0, "reward/latency_max_s": 0.9, "reward/latency_mean_s": 0.4},
    ]
    merged = merge_metrics(parts)
    assert merged["reward/failed_count"] == 3.0 and merged["reward/latency_max_s"] == 0.9
    assert merged["reward/latency_mean_s"] == pytest.approx(0.3)


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("rl_loop")
    train, test = make_data(root, size=32, test_size=8)
    return root, make_model(root, train, seed=0), train, test


@pytest.mark.parametrize("schedule", ["sync", "one_step_off"])
def test_runs_score_on_the_loop_and_on_the_service(setup, service, schedule):
    root, model, train, test = setup
    batched = [f"reward.remote_url={service}", "reward.remote_batch_size=32"]
    for name, keys in [("loop", []), ("remote", [f"reward.remote_url={service}"]), ("batched", batched)]:
        d = root / f"{name}_{schedule}"
        over = train_overrides(model, train, test, d, 2) + [
            "trainer.backend=in_process",
            f"trainer.schedule={schedule}",
        ]
        run_training(load_config(None, over + keys))
        steps = [m for m in read_metrics(d / "metrics.jsonl") if "reward/mean" in m]
        assert len(steps) == 2 and all(m["reward/in_flight_max"] >= 1 for m in steps), name
        assert all(m["reward/failed_count"] == 0 for m in steps)
        if name == "batched":  # 16 rows a step end within 6 decode steps: some end together and share a request
            assert all(m["reward/samples_per_request"] > 1 for m in steps)
            assert any(isinstance(body, list) and len(body) > 1 for body in _Service.seen)
    assert len(_Service.seen) >= 2 * 4 * 4  # the service scored every training sample


def test_bad_reward_keys_are_config_errors(setup):
    root, model, train, test = setup
    base = train_overrides(model, train, test, root / "bad", 1)
    with pytest.raises(ConfigError, match="reward.max_concurrency"):
        load_config(None, [*base, "reward.max_concurrency=0"])
    with pytest.raises(ConfigError, match="reward.remote_batch_size"):
        load_config(None, [*base, "reward.remote_batch_size=0"])
    with pytest.raises(ConfigError, match="reward.remote_url"):
        load_config(None, [*base, "reward.remote_url=127.0.0.1:9/score"])
    with pytest.raises(ConfigError, match="reward.remote_url"):
        load_config(None, [*base, "reward.remote_url=http://127.0.0.1:9", "reward.custom_function=x.py:f"])
