"""PPO with a critic on a real local Ray cluster: split placement overlaps update_actor and update_critic.

Micro model (built here in seconds); what is checked is the plumbing (critic metrics finite, both updates in the
timeline on their own workers, checkpoint written, resume equals the unbroken run), not learning. That calls to
different pools run at once is shown by cause in tests/test_pool_turns.py: on a micro model an update takes ~10 ms,
less than a busy 2-core machine may take to hand a call to a Ray worker, so wall-clock spans cannot show it here.
"""

from __future__ import annotations

import math

import pytest
import torch
from safetensors.torch import load_file

from asyncrl.config import load_config
from asyncrl.schedules import run_training
from asyncrl.telemetry.metrics import read_metrics
from asyncrl.telemetry.timeline import read_chrome_trace
from tests.helpers import make_data, make_model, train_overrides

PPO = [
    "algorithm.name=ppo",
    "algorithm.adv_estimator=gae",
    "critic.optim.lr=1e-3",
    "actor.use_rollout_log_probs=true",  # as the shipped PPO configs: the actor's call starts with its update
]
SPLIT_PLACEMENT = [
    "placement.pools.actor_pool.cpus=1",
    "placement.pools.critic_pool.cpus=1",
    "placement.roles.actor=actor_pool",
    "placement.roles.critic=critic_pool",
]


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("ppo")
    train, test = make_data(root)
    model = make_model(root, train)
    yield root, model, train, test


def _run(setup, name: str, steps: int, *extra: str) -> tuple[dict, list[dict]]:
    root, model, train, test = setup
    run_dir = root / name
    placement = [] if any(e.startswith("placement.") for e in extra) else SPLIT_PLACEMENT
    cfg = load_config(None, train_overrides(model, train, test, run_dir, steps) + PPO + placement + list(extra))
    summary = run_training(cfg)
    return summary, read_metrics(run_dir / "metrics.jsonl")


def _update_spans(run_dir) -> dict[tuple[str, int], tuple[float, float]]:
    """(update_actor | update_critic, step) -> (start_s, end_s), as the workers recorded them."""
    owners = {"update_actor": "trainer", "update_critic": "critic"}
    return {
        (e["name"], e["step"]): (e["start_s"], e["end_s"])
        for e in read_chrome_trace(run_dir / "timeline.json")
        if owners.get(e["name"]) == e["worker"]
    }


@pytest.mark.ray
def test_two_split_steps_update_actor_and_critic_on_their_own_pools(setup):
    summary, metrics = _run(setup, "split", 2, "actor.ppo_mini_batch_size=4")
    run_dir = setup[0] / "split"
    assert [m["step"] for m in metrics] == [0, 1, 2]
    for m in metrics[1:]:
        for key in ("critic/vf_loss", "critic/vpred_mean", "critic/vf_explained_var", "actor/pg_loss"):
            assert math.isfinite(m[key]), (m["step"], key)
        for key in ("timing_s/values", "timing_s/update_critic", "timing_s/update_actor"):
            assert 0 < m[key] < m["timing_s/train"] + m["timing_s/prepare"], (m["step"], key)
        # the seconds hidden by running at once: at most the shorter update (micro models: call overhead can exceed
        # what the overlap hides, so it may be 0)
        assert m["perf/update_overlap_s"] <= min(m["timing_s/update_critic"], m["timing_s/update_actor"]) + 1e-9
    assert summary["placement"]["roles"]["critic"] == "critic_pool"
    assert (run_dir / "checkpoints" / "step_2" / "critic_state.pt").is_file()
    assert (run_dir / "checkpoints" / "step_2" / "model" / "config.json").is_file()
    # each step's two updates ran on their own workers (the trainer and the critic), each recorded once
    assert sorted(_update_spans(run_dir)) == [
        (name, step) for name in ("update_actor", "update_critic") for step in (1, 2)
    ]


@pytest.mark.ray
def test_colocated_placement_runs_updates_one_after_another(setup):
    _, metrics = _run(
        setup,
        "colocated",
        1,
        "placement.pools={one: {cpus: 2}}",
        "placement.roles={actor: one, critic: one}",
        "trainer.val_before_train=false",
    )
    run_dir = setup[0] / "colocated"
    spans = _update_spans(run_dir)
    a0, a1 = spans[("update_actor", 1)]
    c0, c1 = spans[("update_critic", 1)]
    assert a0 >= c1 or c0 >= a1  # one pool: the calls take turns
    assert math.isfinite(metrics[-1]["critic/vf_loss"]) and metrics[-1]["perf/update_overlap_s"] == 0.0


def test_critic_warmup_leaves_the_policy_untouched(setup):
    _, metrics = _run(
        setup, "warmup", 1, "trainer.critic_warmup=1", "trainer.val_before_train=false", "trainer.backend=in_process"
    )
    assert math.isfinite(metrics[-1]["critic/vf_loss"]) and "actor/pg_loss" not in metrics[-1]
    assert metrics[-1]["staleness/mean"] == 0.0
    init = load_file(str(setup[1] / "model.safetensors"))
    final = load_file(str(setup[0] / "warmup" / "final" / "model.safetensors"))
    for k in final:
        assert torch.equal(init[k], final[k]), k


def test_resume_equals_unbroken_run(setup):
    over = ("trainer.val_before_train=false", "trainer.backend=in_process")
    _, full = _run(setup, "full", 4, *over)
    _run(setup, "resumed", 2, *over)
    _, resumed = _run(setup, "resumed", 4, "trainer.resume_mode=auto", *over)
    assert [m["step"] for m in resumed] == [1, 2, 3, 4]
    for a, b in zip(full, resumed, strict=True):
        for key in ("reward/mean", "actor/pg_loss", "critic/vf_loss", "critic/vpred_mean"):
            assert a[key] == pytest.approx(b[key], rel=1e-5, abs=1e-7), (a["step"], key)
    wa = load_file(str(setup[0] / "full" / "final" / "model.safetensors"))
    wb = load_file(str(setup[0] / "resumed" / "final" / "model.safetensors"))
    for k in wa:
        assert torch.equal(wa[k], wb[k]), k
    ca = torch.load(setup[0] / "full" / "checkpoints" / "step_4" / "critic_state.pt", weights_only=False)["model"]
    cb = torch.load(setup[0] / "resumed" / "checkpoints" / "step_4" / "critic_state.pt", weights_only=False)["model"]
    for k in ca:
        assert torch.equal(ca[k], cb[k]), k
