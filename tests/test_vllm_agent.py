"""The tool agent over the vLLM engine (``make test-vllm``): the same token-in/token-out loop, vLLM decoding.

The model is a mini Qwen2 (vLLM's CPU attention needs head size >= 32) fitted here to call ``calc``
(tests/agent_helpers.py); the loop, the tool and the chat template are the ones the built-in engine's tests use.
"""

from __future__ import annotations

import pytest

pytest.importorskip("vllm", reason="the vllm extra is not installed (pip install -e '.[vllm]', or make test-vllm)")

from asyncrl.config import load_config  # noqa: E402
from asyncrl.config.rollout import MultiTurnConfig  # noqa: E402
from asyncrl.data.dataset import PromptDataset  # noqa: E402
from asyncrl.models.loading import load_model  # noqa: E402
from asyncrl.rollout.agent.engine import AgentEngine  # noqa: E402
from asyncrl.rollout.sampling import SamplingParams  # noqa: E402
from asyncrl.rollout.vllm_engine import VllmEngine, VllmOptions  # noqa: E402
from asyncrl.run.step_log import agent_metrics  # noqa: E402
from asyncrl.schedules import run_training  # noqa: E402
from asyncrl.telemetry.metrics import read_metrics  # noqa: E402
from tests.agent_helpers import check_tool_turns, make_tool_model, rows, write_tool_data  # noqa: E402
from tests.helpers import train_overrides  # noqa: E402

pytestmark = pytest.mark.vllm


@pytest.fixture(scope="module")
def tool_model(tmp_path_factory):
    root = tmp_path_factory.mktemp("vllm_agent")
    return root, make_tool_model(root, steps=400, preset="mini", lr=3e-3)


def test_vllm_runs_the_tool_loop_token_in_token_out(tool_model):
    _, model_dir = tool_model
    _, tok = load_model(model_dir, for_training=False)
    inner = VllmEngine(
        str(model_dir), tok, VllmOptions(max_model_len=256, max_num_seqs=16, gpu_memory_utilization=0.01)
    )
    engine = AgentEngine(inner, MultiTurnConfig(tools=["calc"]), "tool_agent")
    ds = PromptDataset(rows(), tok, 64)
    out = engine.generate([ds[i] for i in range(len(ds))], SamplingParams(n=2, temperature=0.0, max_new_tokens=120), 0)
    # whatever calls the fitted model makes under vLLM's kernels: each tool turn is the template's turn for the
    # tool's output on the call the model wrote, with log-prob 0, and the counts agree
    check_tool_turns(tok, out)
    m = agent_metrics(out)
    assert m["agent/tool_calls_mean"] == sum(s.tool_calls for s in out) / len(out)


def test_two_steps_of_the_tool_agent_on_vllm_rollout_workers(tool_model):
    root, model_dir = tool_model
    data = write_tool_data(root)
    run_dir = root / "run"
    over = train_overrides(model_dir, data, data, run_dir, 2) + ["trainer.backend=in_process"]
    over += ["trainer.schedule=one_step_off", "rollout.num_workers=1", "rollout.cpus_per_worker=1"]
    over += ["rollout.engine=vllm", "rollout.gpu_memory_utilization=0.01", "rollout.response_length=120"]
    over += [
        "rollout.agent.default_agent_loop=tool_agent",
        "rollout.multi_turn.tools=[calc]",
        "data.max_prompt_length=64",
    ]
    run_training(load_config(None, over))
    metrics = {m["step"]: m for m in read_metrics(run_dir / "metrics.jsonl")}
    for m in (metrics[1], metrics[2]):  # the agent metrics agree with each other whatever the model called
        assert m["agent/turns_mean"] >= 1 and m["agent/tool_call_rate"] <= m["agent/tool_calls_mean"]
        assert (m["agent/tool_token_frac"] > 0) == (m["agent/tool_call_rate"] > 0)
