"""End to end: sync GRPO and checkpoint/resume equivalence on a real local Ray cluster; the KL, crash-resume and
export checks with in-process roles (the same workers, without a cluster's start-up per run).

The model is the "micro" preset (81k parameters) built here, so every run takes seconds; what is checked is the
plumbing (every step logged once, weights identical after a resume), not learning.
"""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

from asyncrl.checkpoint import export_checkpoint
from asyncrl.config import load_config
from asyncrl.data.dataset import load_rows
from asyncrl.schedules import run_training
from asyncrl.telemetry.metrics import read_metrics
from tests.helpers import length_reward, make_data, make_model, train_overrides


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("sync")
    train, test = make_data(root)
    model = make_model(root, train)
    yield root, model, train, test


IN_PROCESS = "trainer.backend=in_process"


def _run(setup, name: str, steps: int, *extra: str) -> tuple[dict, list[dict]]:
    root, model, train, test = setup
    run_dir = root / name
    cfg = load_config(None, train_overrides(model, train, test, run_dir, steps) + list(extra))
    summary = run_training(cfg)
    return summary, read_metrics(run_dir / "metrics.jsonl")


def _final_weights(run_dir) -> dict[str, torch.Tensor]:
    return load_file(str(run_dir / "final" / "model.safetensors"))


@pytest.mark.ray
def test_two_sync_steps_write_the_whole_output_dir(setup):
    # a reward that differs within every group, so step 1 has a gradient whatever the model samples
    summary, metrics = _run(setup, "two", 2, length_reward(setup[0]))
    run_dir = setup[0] / "two"
    assert [m["step"] for m in metrics] == [0, 1, 2]
    m = metrics[1]
    assert m["reward/mean"] > 0 and m["reward/failed_count"] == 0
    assert 1 <= m["response_length/mean"] <= 6  # rollout.response_length=6
    assert m["actor/entropy"] > 0 and m["actor/grad_norm"] > 0 and m["actor/lr"] == pytest.approx(1e-3)
    assert m["actor/pg_loss"] == pytest.approx(m["actor/pg_loss"])  # finite
    for key in ("timing_s/gen", "timing_s/prepare", "timing_s/train", "timing_s/update_actor"):
        assert 0 < m[key] < m["timing_s/step"], key
    assert m["perf/throughput_tokens_per_s"] > 0
    n_val = len(load_rows([str(setup[3])]))
    assert metrics[0]["val/n"] == metrics[2]["val/n"] == n_val and "val/accuracy" in metrics[0]
    assert m["staleness/mean"] == 0.0 and metrics[2]["staleness/max"] == 0.0
    assert (run_dir / "checkpoints" / "step_2" / "model" / "config.json").is_file()
    assert (run_dir / "final" / "config.json").is_file()
    assert list((run_dir / "tensorboard").iterdir())
    trace = json.loads((run_dir / "timeline.json").read_text())
    names = {e["name"] for e in trace["traceEvents"] if e.get("ph") == "X"}
    assert {"generate", "update_actor", "gen", "reward"} <= names
    on_disk = json.loads((run_dir / "summary.json").read_text())
    assert on_disk["accuracy_before"] == metrics[0]["val/accuracy"]
    assert on_disk["accuracy_after"] == metrics[2]["val/accuracy"]
    assert on_disk["wall_s"] > 0
    assert on_disk["steps"] == 2 and on_disk["samples"] == 2 * 4 * 4 == summary["samples"]


def test_kl_loss_and_recomputed_old_logprobs_run(setup):
    _, metrics = _run(
        setup,
        "kl",
        1,
        "actor.use_kl_loss=true",
        "actor.use_rollout_log_probs=false",
        "algorithm.rollout_correction.rollout_is=token",
        "trainer.val_before_train=false",
        "trainer.backend=in_process",
        "actor.ppo_mini_batch_size=4",  # one mini-batch: every forward of the update sees the reference weights
    )
    step1 = metrics[-1]
    assert step1["step"] == 1
    assert step1["timing_s/ref"] > 0 and step1["timing_s/old_log_prob"] > 0  # measured inside the trainer's update
    # the update's one optimizer step comes after its forwards, which see the reference weights: the KL is 0 and the
    # IS weights (behaviour vs recomputed old log-probs) are 1, up to the engine's float gap
    assert step1["actor/kl_loss"] == pytest.approx(0.0, abs=1e-6)
    assert step1["rollout_corr/is_mean"] == pytest.approx(1.0, abs=1e-3)


def test_resume_equals_unbroken_run(setup, capsys):
    """In-process roles (three runs; the Ray backend's resume is the fault suite's and test_fsdp's)."""
    _, full = _run(setup, "full", 4, IN_PROCESS)
    _, part1 = _run(setup, "resumed", 2, IN_PROCESS)
    capsys.readouterr()
    _, resumed = _run(setup, "resumed", 4, "trainer.resume_mode=auto", IN_PROCESS)
    ckpt = setup[0] / "resumed" / "checkpoints" / "step_2"
    assert f"[resumed] resumed from {ckpt} (step 2, 32 samples trained); steps 3..4 to run" in capsys.readouterr().out
    assert [m["step"] for m in resumed] == [0, 1, 2, 3, 4]  # each step logged exactly once
    for a, b in zip(full, resumed, strict=True):
        for key in ("reward/mean", "actor/pg_loss", "actor/grad_norm", "response_length/mean"):
            if key in a:
                assert a[key] == pytest.approx(b[key], rel=1e-6, abs=1e-9), (a["step"], key)
    wa, wb = _final_weights(setup[0] / "full"), _final_weights(setup[0] / "resumed")
    assert wa.keys() == wb.keys()
    for k in wa:
        assert torch.equal(wa[k], wb[k]), k
    summary = json.loads((setup[0] / "resumed" / "summary.json").read_text())
    assert summary["steps"] == 4 and summary["samples"] == 4 * 4 * 4


def test_resume_after_a_crash_drops_steps_logged_past_the_checkpoint(setup):
    _run(setup, "crash", 2, "trainer.backend=in_process")
    run_dir = setup[0] / "crash"
    with open(run_dir / "metrics.jsonl", "a") as f:  # a step 3 logged by a run that died before its checkpoint
        f.write(json.dumps({"step": 3, "reward/mean": 123.0}) + "\n")
    _, metrics = _run(setup, "crash", 3, "trainer.resume_mode=auto", "trainer.backend=in_process")
    assert [m["step"] for m in metrics] == [0, 1, 2, 3]
    assert metrics[-1]["reward/mean"] != 123.0


def test_export_round_trip_loads_with_transformers(setup):
    _run(setup, "export", 1, "trainer.val_before_train=false", "trainer.backend=in_process")
    run_dir = setup[0] / "export"
    out = export_checkpoint(run_dir, setup[0] / "exported")
    model = AutoModelForCausalLM.from_pretrained(out, local_files_only=True)
    ckpt = load_file(str(run_dir / "checkpoints" / "step_1" / "model" / "model.safetensors"))
    state = model.state_dict()
    for k, v in ckpt.items():
        assert torch.equal(state[k], v), k
