"""``asyncrl preflight`` on this machine's CPU path: real roles (in-process, and Ray actors on a local cluster), the
real weight sync, decode and update, and faults that must each fail their own line and the exit status: an engine
whose weights differ from the trainer's after a sync, a trainer rank that does not take part in its group, a memory
plan that cannot fit."""

from __future__ import annotations

import pytest

from asyncrl.cli import main
from asyncrl.config import load_config
from asyncrl.preflight import checks, passed, preflight_config, run_preflight
from asyncrl.schedules import specs_for
from asyncrl.workers.start import start_roles
from tests.helpers import make_data, make_model, train_overrides

PARTS = ("memory plan", "placement", "trainer group", "weight sync", "fingerprint", "decode", "trainer micro-batch")


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("preflight")
    train, test = make_data(root, size=16, test_size=4)
    (root / "run.yaml").write_text("trainer:\n  backend: in_process\n")  # the rest as dotted overrides
    return root, make_model(root, train, seed=0), train, test


def _overrides(setup, name: str, *extra: str) -> list[str]:
    root, model, train, test = setup
    return train_overrides(model, train, test, root / name, 1) + list(extra)


FULLY_ASYNC_TWO_RANKS = (
    "trainer.backend=in_process",
    "trainer.schedule=fully_async",
    "trainer.num_workers=2",
    "rollout.num_workers=2",
    "async_training.staleness_threshold=1.0",
    "weight_sync.timeout_s=20",
)


def _by_part(lines: list[checks.Check]) -> dict[str, checks.Check]:
    return {c.part: c for c in lines}


def test_every_line_passes_on_a_fully_async_run_with_two_trainer_ranks_and_two_engines(setup, capsys):
    """Through the command line, as a user runs it: every part has its line, each passes with its figures, and the
    exit status is 0 (``main`` returns instead of exiting)."""
    config = str(setup[0] / "run.yaml")
    main(["preflight", "--config", config, *_overrides(setup, "ok", *FULLY_ASYNC_TWO_RANKS, "weight_sync.verify=true")])
    out = capsys.readouterr().out
    lines = [ln for ln in out.splitlines() if ln.startswith(("PASS", "FAIL"))]
    assert lines and all(ln.startswith("PASS") for ln in lines), out
    for part in PARTS:
        assert any(ln[len("PASS  ") :].startswith(part) for ln in lines), (part, out)
    assert "2 ranks over gloo" in out  # the data-parallel group's all-reduce and broadcast ran on both ranks
    assert sum(ln.startswith("PASS  decode ") for ln in lines) == 2  # the Rollouter and its other rank
    assert sum(ln.startswith("PASS  fingerprint ") for ln in lines) == 2
    assert "tensors equal to the trainer's" in out
    assert "all passed" in out.splitlines()[-1]


def test_an_engine_left_with_other_weights_fails_its_fingerprint_naming_it(setup):
    """The run's config does not verify checksums (weight_sync.verify=false), so a byte flipped in transit is applied
    silently; preflight's fingerprint names the engine and the tensor, and the run does not pass."""
    over = _overrides(setup, "corrupt", *FULLY_ASYNC_TWO_RANKS, "weight_sync.verify=false")
    printed: list[str] = []
    lines = run_preflight(load_config(None, over), printed.append, _corrupt_bucket=0)
    bad = [c for c in lines if not c.ok]
    assert bad and all(c.part.startswith("fingerprint ") for c in bad), printed
    assert {c.part.split()[1] for c in bad} == {"rollouter", "rollout1"}  # both engines received the bad bucket
    assert all("differ from the trainer's" in c.detail for c in bad)
    assert not passed(lines)
    assert "2 failed" in printed[-1]


def test_a_checksummed_sync_refuses_the_corrupt_bucket_naming_the_rank(setup):
    over = _overrides(setup, "corrupt_crc", *FULLY_ASYNC_TWO_RANKS, "weight_sync.verify=true")
    lines = _by_part(run_preflight(load_config(None, over), lambda _: None, _corrupt_bucket=0))
    sync = lines["weight sync"]
    assert not sync.ok and "rank" in sync.detail and "checksum" in sync.detail.lower(), sync


def test_a_trainer_rank_that_takes_no_part_fails_the_trainer_group_naming_it(setup):
    """Two data-parallel ranks started as a run starts them; rank 1 is stopped before the collectives, so the group
    cannot all-reduce: the line fails and names the rank (a healthy pair passes first, so the check can pass)."""
    cfg = preflight_config(load_config(None, _overrides(setup, "rank", *FULLY_ASYNC_TWO_RANKS)))
    from asyncrl.schedules.fully_async import rollout_side

    side, producer = rollout_side()
    with start_roles(cfg, side, specs_for(cfg), ["actor"], producer) as roles:
        healthy = checks.trainer_group(roles, timeout_s=10)
        assert healthy.ok and "2 ranks" in healthy.detail, healthy
        roles.trainer.ranks[1].kill()
        broken = checks.trainer_group(roles, timeout_s=3)
    assert not broken.ok and "trainer.rank1" in broken.detail, broken


def test_a_plan_that_cannot_fit_fails_before_anything_loads_and_exits_nonzero(setup, capsys):
    over = _overrides(setup, "tiny_gpu", "trainer.gpu_memory_gb=0.01")
    with pytest.raises(SystemExit) as exit_:
        main(["preflight", "--config", str(setup[0] / "run.yaml"), *over])
    assert exit_.value.code == 1
    out = capsys.readouterr().out
    assert "FAIL  memory plan: does not fit" in out and "trainer rank" in out, out
    assert "FAIL  roles: not run" in out and "PASS  placement" not in out  # no worker started, no model loaded


def test_every_line_passes_on_ray_actors_with_a_critic_and_a_rollout_pool(setup):
    """PPO on one_step_off, each role a Ray actor on a local cluster: every worker is placed on a Ray node, in a
    process of its own, and the critic's values take part in the micro-batch's preparation."""
    import os

    over = _overrides(setup, "ray", "trainer.schedule=one_step_off", "rollout.num_workers=1", "algorithm.name=ppo")
    printed: list[str] = []
    lines = run_preflight(load_config(None, over + ["critic.optim.lr=1e-3"]), printed.append)
    assert passed(lines), "\n".join(printed)
    placed = [c for c in lines if c.part.startswith("placement ") and c.part != "placement pools"]
    assert {c.part.split()[1] for c in placed} == {"trainer", "critic", "rollout0"}
    assert all(f"pid {os.getpid()}" not in c.detail and "(local)" not in c.detail for c in placed), printed
