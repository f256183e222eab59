"""``asyncrl bench --decode`` on a small model: every engine row, its runs, and the ratios computed from them. vLLM is
not in make test's environment, so its row says why it is missing; where vLLM is installed (.venv-vllm) it is timed
too, on the mini preset (vLLM's CPU attention needs a head size of at least 32, which the micro preset lacks)."""

import importlib.util
import json

import pytest

from asyncrl_lab.bench_decode import _interleaved, run_decode_bench
from tests.helpers import make_data, make_model


def test_engines_take_turns_and_the_best_run_counts():
    order: list[str] = []
    ticks = {"a": iter([5, 1, 3]), "b": iter([7, 2, 9])}

    def engine(name):
        def fn():
            order.append(name)
            return next(ticks[name])

        return fn

    got = _interleaved({"a": engine("a"), "b": engine("b")}, repeats=2)
    assert order == ["a", "b", "a", "b", "a", "b"]  # a warm-up each, then rounds of one run each
    assert [got[k][1] for k in "ab"] == [3, 9]  # tokens of the last run
    assert all(len(got[k][2]) == 2 and got[k][0] == min(got[k][2]) for k in "ab")


def test_the_decode_bench_writes_every_engine_and_its_ratios(tmp_path):
    train, _ = make_data(tmp_path, size=16, test_size=4)
    has_vllm = importlib.util.find_spec("vllm") is not None
    model = make_model(tmp_path, train, preset="mini" if has_vllm else "micro")
    rows = run_decode_bench(str(model), str(tmp_path / "out"), batch=2, new_tokens=4, threads=1, repeats=2)
    by = {r["engine"]: r for r in rows}
    for name in ("builtin", "hf_generate"):
        assert by[name]["tokens"] == 2 * 4  # eos ignored: the full budget on every row
        assert len(by[name]["runs_s"]) == 2 and by[name]["seconds"] == pytest.approx(min(by[name]["runs_s"]), abs=0.01)
        assert by[name]["ratio_to_builtin"] == round(by[name]["tokens_per_s"] / by["builtin"]["tokens_per_s"], 2)
    if has_vllm:
        assert by["vllm"]["tokens_per_s"] > 0 and len(by["vllm"]["runs_s"]) == 2
    else:
        assert by["vllm"]["tokens_per_s"] is None and "vLLM is not installed" in by["vllm"]["note"]
    saved = json.loads((tmp_path / "out" / "decode.json").read_text())
    assert [r["engine"] for r in saved["rows"]] == [r["engine"] for r in rows]
