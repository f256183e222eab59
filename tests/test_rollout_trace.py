"""The rollout trace (``rollout.trace``): a few samples of every step, with token versions and staleness as consumed,
in ``rollout_trace.jsonl``; ``asyncrl trace`` prints a step; a resumed run logs each step's samples once."""

from __future__ import annotations

import pytest

from asyncrl.cli import main
from asyncrl.config import ConfigError, load_config
from asyncrl.schedules import run_training
from asyncrl.telemetry import trace
from asyncrl.telemetry.report import _last_traced, write_report
from asyncrl.types import Prompt, Sample
from tests.helpers import make_data, make_model, train_overrides


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("trace")
    train, test = make_data(root, size=32, test_size=8)
    return root, make_model(root, train, seed=0), train, test


def test_pick_spreads_over_the_batch():
    samples = [Sample(Prompt(i, [1], "chain_sum", "0"), [2], [-1.0], [0]) for i in range(16)]
    assert [s.prompt.index for s in trace.pick(samples, 4)] == [0, 4, 8, 12]
    assert trace.pick(samples[:3], 4) == samples[:3]


def test_one_step_off_trace_records_versions_staleness_and_resumes_once(setup, capsys):
    root, model, train, test = setup
    d = root / "osp"
    over = train_overrides(model, train, test, d, 2) + [
        "trainer.backend=in_process",
        "trainer.schedule=one_step_off",
        "rollout.trace.enable=true",
        "rollout.trace.max_samples_per_step=3",
        "rollout.trace.token2text=true",
    ]
    run_training(load_config(None, over))
    run_training(load_config(None, [*over, "trainer.total_training_steps=3"]))  # resumed from step 2
    recs = trace.read(d)
    assert [r.step for r in recs] == [1, 1, 1, 2, 2, 2, 3, 3, 3]  # each step once, across the resume
    by_step = {s: [r for r in recs if r.step == s] for s in (1, 2, 3)}
    assert all(r.staleness == 0 for r in by_step[1])  # batch 1: the initial weights, consumed at version 0
    assert all(r.staleness == 1 for r in by_step[2])  # one_step_off: batch 2 is one version old
    for r in recs:
        assert r.response_tokens is not None
        assert len(r.versions) == len(r.response_ids) == len(r.response_tokens)
        assert all(v == r.start_version for v in r.versions)  # no partial rollout here
        assert r.prompt_text and r.data_source == "chain_sum" and isinstance(r.reward, float)
    capsys.readouterr()
    main(["trace", str(d), "--step", "2", "--max", "2"])
    out = capsys.readouterr().out
    assert out.count("step 2  ") == 2 and "staleness 1" in out and "response:" in out
    with pytest.raises(SystemExit, match="no traced samples at step 9 \\(traced steps: 1..3\\)"):
        main(["trace", str(d), "--step", "9"])
    shown = _last_traced(d)  # what the report draws beside its curves
    assert [r.step for r in shown] == [3, 3, 3] and write_report(d).is_file()


def test_no_trace_is_a_clear_error_and_bad_keys_are_config_errors(setup, tmp_path):
    with pytest.raises(FileNotFoundError, match="rollout.trace.enable=true"):
        trace.read(tmp_path)
    root, model, train, test = setup
    with pytest.raises(ConfigError, match="rollout.trace.max_samples_per_step"):
        load_config(None, [*train_overrides(model, train, test, tmp_path, 1), "rollout.trace.max_samples_per_step=0"])
