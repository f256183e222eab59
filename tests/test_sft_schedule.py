"""The SFT learning-rate schedule: warm-up, constant, and a cosine that anneals over the step or time budget."""

import math

import pytest

from asyncrl.config import ConfigError
from asyncrl.finetune.sft import load_sft_config, lr_factor, sft_examples
from asyncrl.models.tokenizer import build_char_tokenizer


def test_warmup_is_linear_and_ignores_the_schedule():
    # step s of a 4-step warm-up uses (s + 1) / 4, for both schedules
    for sched in ("constant", "cosine"):
        assert [lr_factor(s, 0.0, 4, sched, 0.1) for s in range(4)] == [0.25, 0.5, 0.75, 1.0]


def test_constant_after_warmup():
    assert lr_factor(10, 0.9, 4, "constant", 0.1) == 1.0


def test_cosine_hand_values():
    # min + (1 - min) * (1 + cos(pi * p)) / 2 with min = 0.1
    assert lr_factor(10, 0.0, 4, "cosine", 0.1) == pytest.approx(1.0)
    assert lr_factor(10, 0.5, 4, "cosine", 0.1) == pytest.approx(0.55)
    assert lr_factor(10, 1.0, 4, "cosine", 0.1) == pytest.approx(0.1)
    assert lr_factor(10, 0.25, 0, "cosine", 0.0) == pytest.approx((1 + math.cos(math.pi / 4)) / 2)
    # progress past the budget (a time-limited run's last step) stays at the floor
    assert lr_factor(10, 1.7, 0, "cosine", 0.2) == pytest.approx(0.2)


def test_unknown_schedule_is_a_named_config_error():
    with pytest.raises(ConfigError, match="optim.lr_schedule"):
        load_sft_config(None, ["data.train_files=[a]", "optim.lr_schedule=linear"])
    with pytest.raises(ConfigError, match="optim.min_lr_ratio"):
        load_sft_config(None, ["data.train_files=[a]", "optim.min_lr_ratio=1.5"])


def test_the_target_is_the_reference_written_as_the_template_says():
    rows = [{"prompt": [{"role": "user", "content": "4 + 7"}], "reward_model": {"ground_truth": "11"}}]
    tok = build_char_tokenizer(["4 + 7 Answer: 11"])
    cfg = load_sft_config(None, ["data.train_files=[a]", "data.response_template='Answer: {response}'"])
    ((_, target),) = sft_examples(rows, tok, cfg.data)
    assert target[-1] == tok.eos_token_id and tok.decode(target[:-1]) == "Answer: 11"
    plain = load_sft_config(None, ["data.train_files=[a]"])
    assert tok.decode(sft_examples(rows, tok, plain.data)[0][1][:-1]) == "11"


@pytest.mark.parametrize("template", ["Answer:", "{answer} {response}", "{response"])
def test_a_template_without_the_response_is_a_named_config_error(template):
    with pytest.raises(ConfigError, match="data.response_template"):
        load_sft_config(None, ["data.train_files=[a]", f"data.response_template='{template}'"])


def test_an_override_that_is_not_yaml_names_itself():
    with pytest.raises(ConfigError, match=r"override 'data.response_template=\{response': the value is not valid YAML"):
        load_sft_config(None, ["data.train_files=[a]", "data.response_template={response"])
