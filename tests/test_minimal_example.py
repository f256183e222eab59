"""examples/minimal_grpo.py: the one-file GRPO loop runs end to end on a micro model, and its update moves the policy
toward the responses with a positive advantage."""

from __future__ import annotations

import importlib.util
import math
from pathlib import Path

import pytest
import torch

from asyncrl.data.collate import collate
from asyncrl.data.dataset import PromptDataset
from asyncrl.models.loading import load_model
from asyncrl.rollout.engine import RolloutEngine
from asyncrl.trainer.forward import response_logprobs
from asyncrl.types import SamplingParams
from tests.helpers import make_data, make_model

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "minimal_grpo.py"


def load_example():
    spec = importlib.util.spec_from_file_location("minimal_grpo", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("minimal_grpo")
    train, _ = make_data(root, size=64, test_size=16)
    return root, train.parent, make_model(root, train)


def test_main_runs_end_to_end_and_changes_the_weights(setup):
    root, data, model_dir = setup
    # A reward with spread whatever a random model writes: the share of the response's characters that are digits.
    reward = root / "digits.py"
    reward.write_text(
        "def digits(data_source, solution_str, ground_truth, extra_info):\n"
        "    return sum(c.isdigit() for c in solution_str) / max(len(solution_str), 1)\n"
    )
    out = root / "out"
    argv = ["--model", str(model_dir), "--data", str(data), "--steps", "2", "--prompts", "4", "--held-out", "8"]
    result = load_example().main(argv + ["--reward", f"{reward}:digits", "--out", str(out), "--seed", "3"])

    assert len(result["losses"]) == 2 and all(math.isfinite(x) for x in result["losses"])
    assert 0.0 <= result["accuracy_before"] <= 1.0 and 0.0 <= result["accuracy_after"] <= 1.0
    before, after = load_model(model_dir)[0].state_dict(), load_model(out)[0].state_dict()
    assert any(not torch.equal(before[name], after[name]) for name in before)


def test_grpo_step_raises_the_log_prob_of_positively_advantaged_responses(setup):
    _, data, model_dir = setup
    example = load_example()
    model, tok = load_model(model_dir)
    prompts = PromptDataset.from_files(data / "train.parquet", tok, max_prompt_length=128)
    engine = RolloutEngine(load_model(model_dir, for_training=False)[0], tok)
    samples = engine.generate([prompts[i] for i in range(4)], SamplingParams(n=4, max_new_tokens=6), seed=0)
    for s in samples:  # a fixed reward spread: in every group of 4, rows 0 and 2 are right, rows 1 and 3 wrong
        s.reward = 1.0 if s.row % 2 == 0 else 0.0
    batch = collate(samples, tok.pad_token_id)
    good = torch.tensor([s.reward == 1.0 for s in samples])

    def mean_logp(rows):
        logp_BT = response_logprobs(model, batch, example.TEMPERATURE, batch.size)
        return float((logp_BT.sum(1)[rows] / batch.response_mask_BT.sum(1)[rows]).mean())

    good_before, bad_before = mean_logp(good), mean_logp(~good)
    torch.manual_seed(0)  # the mini-batches' order
    loss = example.grpo_step(model, torch.optim.AdamW(model.parameters(), lr=1e-3), samples, tok.pad_token_id)

    assert math.isfinite(loss)
    assert mean_logp(good) > good_before
    assert mean_logp(~good) < bad_before
