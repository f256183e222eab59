"""The generative reward model (``reward.genrm``): a judge on a real ``asyncrl serve-teacher`` process on loopback."""

from __future__ import annotations

import pytest
import torch

from asyncrl.config import ConfigError, load_config
from asyncrl.config.rollout import GenRMConfig
from asyncrl.models.loading import load_model
from asyncrl.models.presets import init_model_dir
from asyncrl.models.tokenizer import build_char_tokenizer
from asyncrl.rewards.genrm import GenerativeReward, verdict_probability
from asyncrl.rewards.remote import RewardServiceUnavailableError
from asyncrl.schedules import run_training
from asyncrl.teacher.launch import start_teacher_server, stop_process
from asyncrl.telemetry.metrics import read_metrics
from tests.helpers import make_data, train_overrides

TEMPLATE = "{question} {ground_truth} {solution_str} yes or no: "


@pytest.fixture(scope="module")
def judge(tmp_path_factory):
    root = tmp_path_factory.mktemp("genrm")
    train, test = make_data(root, size=32, test_size=8)
    texts = ["0123456789+-= ", "abcdefghijklmnopqrstuvwxyz:"]
    model_dir = root / "judge"
    init_model_dir("micro", build_char_tokenizer(texts), model_dir, seed=3)
    proc, url = start_teacher_server(str(model_dir), root / "judge.log", max_batch=8, threads=1, startup_timeout_s=120)
    yield root, model_dir, url, train, test
    stop_process(proc)


def test_verdict_probability_sums_the_tokens_that_start_each_word():
    top = {" yes": -1.0, "Yes": -2.0, "no": -1.5, "n": -3.0, "maybe": -0.1, "": -4.0}
    p_yes, p_no = torch.tensor([-1.0, -2.0]).exp().sum(), torch.tensor([-1.5, -3.0]).exp().sum()
    assert verdict_probability(top, "yes", "no") == pytest.approx(float(p_yes / (p_yes + p_no)))
    with pytest.raises(ValueError, match="neither 'yes' nor 'no'"):
        verdict_probability({"maybe": -0.1}, "yes", "no")


def test_the_reward_is_the_judges_verdict_probability(judge):
    _, model_dir, url, _, _ = judge
    model, tok = load_model(model_dir, for_training=False)
    cfg = GenRMConfig(url=url, prompt_template=TEMPLATE, top_logprobs=len(tok))  # every token: the full softmax
    reward = GenerativeReward(cfg, timeout_s=30, max_retries=0, backoff_s=0)
    score, extra = reward.score_one("chain_sum", "12", "7", {"question": "3 + 4 ="})
    prompt = TEMPLATE.format(question="3 + 4 =", ground_truth="7", solution_str="12")
    with torch.no_grad():
        probs = model(torch.tensor([tok(prompt)["input_ids"]])).logits[0, -1].softmax(-1)
    p_yes = sum(float(probs[tok.convert_tokens_to_ids(t)]) for t in ("y",))
    p_no = sum(float(probs[tok.convert_tokens_to_ids(t)]) for t in ("n",))
    assert score == pytest.approx(p_yes / (p_yes + p_no), rel=1e-4) and extra["genrm_p_positive"] == score
    reward.close()


def test_a_judge_that_is_down_is_one_error_naming_its_url():
    cfg = GenRMConfig(url="http://127.0.0.1:9", prompt_template=TEMPLATE)
    with pytest.raises(RewardServiceUnavailableError, match="127.0.0.1:9"):
        GenerativeReward(cfg, timeout_s=2, max_retries=0, backoff_s=0).score_one("d", "1", "1", {"question": "q"})


def test_config_keeps_one_reward_source():
    with pytest.raises(ConfigError, match="reward.genrm.url"):
        load_config(
            None,
            ["model.path=x", "data.train_files=[x]", "reward.genrm.url=http://a:1", "reward.remote_url=http://b:2"],
        )


def test_a_run_scored_by_the_judge(judge):
    root, model_dir, url, train, test = judge
    run_dir = root / "run"
    over = train_overrides(model_dir, train, test, run_dir, 2) + ["trainer.backend=in_process", "trainer.test_freq=0"]
    over += [f"reward.genrm.url={url}", f"reward.genrm.prompt_template='{TEMPLATE}'"]
    _, tok = load_model(model_dir, for_training=False)  # an untrained judge: ask for every token's log-prob
    over += ["trainer.val_before_train=false", f"reward.genrm.top_logprobs={len(tok)}"]
    run_training(load_config(None, over))
    metrics = {m["step"]: m for m in read_metrics(run_dir / "metrics.jsonl")}
    for step in (1, 2):
        m = metrics[step]
        assert m["reward/failed_count"] == 0 and 0 < m["reward/min"] <= m["reward/max"] < 1  # probabilities, not 0/1
        assert m["reward/latency_max_s"] > 0
