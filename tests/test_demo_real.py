"""demo-real's bookkeeping, without training: an arm's run directory and overrides, and the per-schedule figures."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from asyncrl.config import load_config
from asyncrl_lab.demo_real import CONFIG, _by_schedule, main, question_kind, run_overrides


def test_an_arm_runs_in_its_own_directory_and_its_overrides_win(tmp_path):
    train = tmp_path / "train.parquet"
    plain_dir, plain = run_overrides(tmp_path, train, "fully_async", 2, ["rollout.n=4"])
    arm_dir, arm = run_overrides(
        tmp_path, train, "fully_async+async_training.partial_rollout=false", 2, ["rollout.n=4"]
    )
    assert plain_dir == tmp_path / "fully_async_seed2"
    assert arm_dir == tmp_path / "fully_async_seed2+async_training.partial_rollout=false"
    assert arm[: len(plain)] == [o.replace(str(plain_dir), str(arm_dir)) for o in plain]
    assert arm[-1] == "async_training.partial_rollout=false"
    cfgs = [load_config(CONFIG, o) for o in (plain, arm)]
    assert [c.async_training.partial_rollout for c in cfgs] == [True, False]  # the schedule's default is overridden
    assert {c.trainer.schedule for c in cfgs} == {"fully_async"} and {c.rollout.n for c in cfgs} == {4}
    assert {c.trainer.seed for c in cfgs} == {2}


def test_an_unknown_schedule_is_refused_with_its_name(tmp_path):
    with pytest.raises(ValueError, match="'fully_sync'.*allowed: sync, one_step_off, fully_async"):
        run_overrides(tmp_path, tmp_path / "t.parquet", "fully_sync+rollout.n=4", 1, [])


def test_the_command_line_refuses_an_unknown_arm_before_any_work(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["--out", str(tmp_path / "out"), "--schedules", "sync,bogus+rollout.n=4"])
    assert exit_.value.code == 2 and "unknown schedule 'bogus'" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()  # nothing prepared, nothing run


def test_each_arm_is_summarised_over_its_own_seeds():
    runs = [
        {"schedule": "sync", "accuracy": a, "reward_last_steps": r, "train_s": 10.0}
        for a, r in ((0.4, 0.3), (0.6, 0.5))
    ] + [{"schedule": "fully_async+x=1", "accuracy": 0.5, "reward_last_steps": 0.2, "train_s": 20.0}]
    g = _by_schedule(runs)
    assert list(g) == ["sync", "fully_async+x=1"]
    assert g["sync"]["seeds"] == 2 and g["sync"]["accuracy_mean"] == pytest.approx(0.5)
    assert g["sync"]["accuracy_std"] == pytest.approx(0.1414213, rel=1e-5)
    assert g["fully_async+x=1"]["seeds"] == 1 and g["fully_async+x=1"]["accuracy_std"] is None


@pytest.mark.parametrize(
    ("expression", "answer", "kind"),
    [
        ("12 + 40", "52", "sum"),
        ("40 - 12", "28", "difference >= 0"),
        ("3 - 3", "0", "difference >= 0"),
        ("4 - 90", "-86", "difference < 0"),
    ],
)
def test_questions_are_sorted_by_kind(expression, answer, kind):
    prompt = SimpleNamespace(extra_info={"metadata": json.dumps({"expression": expression})}, ground_truth=answer)
    assert question_kind(prompt) == kind
