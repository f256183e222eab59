"""Data-parallel trainer (``trainer.num_workers``): N ranks, each a share of every mini-batch, step as one rank on the
whole batch would; checkpoints written by N ranks resume with M.

Real gloo process groups on loopback: ranks are threads here (each its own group object, as the in-process backend
runs them) or Ray actors (the last test).
"""

from __future__ import annotations

import copy
import json
import threading
from pathlib import Path

import pytest
import torch

from asyncrl.comm.groups import LOOPBACK, find_free_port
from asyncrl.config import ActorConfig, ConfigError, RolloutCorrectionConfig, load_config
from asyncrl.models.presets import build_model
from asyncrl.models.tokenizer import build_char_tokenizer
from asyncrl.schedules import run_training
from asyncrl.trainer.data_parallel import DataParallel, DataParallelError, group_shares
from tests.helpers import make_data, make_model, policy_gap, ppo_update, train_overrides
from tests.test_policy_update import CHARS, _batch


def on_ranks(world: int, fn):
    """``fn(dp)`` on ``world`` threads joined in one data-parallel group; their results in rank order."""
    port = find_free_port()
    results: list = [None] * world
    errors: list = []

    def body(rank: int) -> None:
        try:
            dp = DataParallel.create(rank, world, LOOPBACK, port, timeout_s=60)
            try:
                results[rank] = fn(dp)
            finally:
                dp.close()
        except BaseException as e:  # noqa: BLE001 - re-raised on the test's thread
            errors.append(e)

    threads = [threading.Thread(target=body, args=(r,)) for r in range(world)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    if errors:
        raise errors[0]
    return results


def test_rows_split_every_row_once():
    class Fake(DataParallel):
        def __init__(self, rank, world):
            self.rank, self.world_size = rank, world

    for n, world in [(8, 2), (7, 2), (1, 3), (10, 3)]:
        got = torch.cat([Fake(r, world).rows(n) for r in range(world)])
        assert got.tolist() == list(range(n))


def test_group_shares_keep_groups_whole_and_balance_tokens():
    group = torch.tensor([3, 0, 1, 0, 3, 1, 2, 2, 0, 1])
    cost = torch.tensor([1.0, 2, 2, 2, 1, 2, 5, 5, 2, 2])  # group totals: 0 -> 6, 1 -> 6, 2 -> 10, 3 -> 2
    shares = group_shares(group, cost, 2)
    assert sorted(torch.cat(shares).tolist()) == list(range(10))
    for s in shares:  # no group is split between ranks
        assert not set(group[s].tolist()) & set(group[torch.cat([t for t in shares if t is not s])].tolist())
    assert [float(cost[s].sum()) for s in shares] == [12.0, 12.0]
    few = group_shares(torch.tensor([0, 0]), torch.tensor([1.0, 1.0]), 3)  # fewer groups than ranks
    assert sorted(torch.cat(few).tolist()) == [0, 1] and sum(len(s) == 0 for s in few) == 2


def test_gather_rows_and_objects_across_ranks():
    def fn(dp):
        rows = torch.tensor([[4, 0, 2], [1, 3]][dp.rank])  # any rows, any order
        part = (rows.float()[:, None] * torch.ones(1, 3)).clone()
        return dp.gather_rows(part, rows), dp.all_gather_object({"rank": dp.rank, "x": [dp.rank] * (dp.rank + 1)})

    (full0, objs0), (full1, _) = on_ranks(2, fn)
    expect = torch.arange(5).float()[:, None] * torch.ones(1, 3)
    assert torch.equal(full0, expect) and torch.equal(full1, expect)
    assert objs0 == [{"rank": 0, "x": [0]}, {"rank": 1, "x": [1, 1]}]


def _update(model, batch, actor, num_mini, dp=None, opt_name="sgd"):
    model = copy.deepcopy(model)
    if opt_name == "sgd":
        opt = torch.optim.SGD(model.parameters(), lr=0.5, weight_decay=0.01)
    else:
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda _: 1.0)
    res = ppo_update(model, opt, sched, batch, actor, RolloutCorrectionConfig(), 1.0, num_mini, seed=3, dp=dp)
    return model, res


@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-sum", "seq-mean-token-mean"])
@pytest.mark.parametrize("skip", [False, True])
def test_two_ranks_on_half_batches_step_as_one_rank_on_the_whole(agg, skip):
    torch.manual_seed(0)
    tok = build_char_tokenizer([CHARS])
    model = build_model("micro", tok, seed=0)
    advs = [1.0, -1.0, 0.5, -0.5] + [0.0] * 4 + [1.5, -0.5, -0.5, -0.5] + [0.0] * 3 + [0.7, -0.7, 0.7, -0.7, 0.3]
    batch = _batch(tok, advs)  # 21 rows: the ranks' shares differ by one
    actor = ActorConfig(loss_agg_mode=agg, ppo_micro_batch_size=3, ppo_epochs=2, skip_zero_adv_rows=skip)
    one, res_one = _update(model, batch, actor, num_mini=2)
    ranks = on_ranks(2, lambda dp: _update(model, batch, actor, num_mini=2, dp=dp))
    moved = 0.0
    for name, a in one.named_parameters():
        for m, _ in ranks:
            b = dict(m.named_parameters())[name]
            assert torch.allclose(a, b, atol=1e-6), name
        moved = max(moved, float((a - dict(model.named_parameters())[name]).detach().abs().max()))
    assert moved > 1e-3  # the update moved the weights: the equality is not two no-ops
    for _, res in ranks:  # the statistics are the whole mini-batch's, on every rank
        for k in ("actor/grad_norm", "actor/pg_loss", "actor/entropy"):
            assert res.metrics[k] == pytest.approx(res_one.metrics[k], rel=1e-5), k
        if skip:
            assert res.metrics["actor/skipped_rows_frac"] == pytest.approx(res_one.metrics["actor/skipped_rows_frac"])


def test_adamw_ranks_stay_bit_identical():
    """The replicas never drift: after several AdamW steps every rank holds exactly the same weights."""
    tok = build_char_tokenizer([CHARS])
    model = build_model("micro", tok, seed=0)
    batch = _batch(tok, [1.0, -1.0, 0.5, -0.5, 0.2, 0.1, -0.3])
    actor = ActorConfig(ppo_micro_batch_size=2, ppo_epochs=3)

    def fn(dp):
        m, _ = _update(model, batch, actor, num_mini=1, dp=dp, opt_name="adamw")
        dp.check_replicas(m, "after three steps")  # raises if any rank differs
        return m

    m0, m1 = on_ranks(2, fn)
    for a, b in zip(m0.parameters(), m1.parameters(), strict=True):
        assert torch.equal(a, b)


def test_diverged_replicas_are_an_error():
    tok = build_char_tokenizer([CHARS])

    def fn(dp):
        m = build_model("micro", tok, seed=dp.rank)  # different seeds: different weights
        dp.check_replicas(m, "start")

    with pytest.raises(DataParallelError, match="rank 1's weights differ from rank 0's"):
        on_ranks(2, fn)


# ---- whole runs -----------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("dp")
    train, test = make_data(root, size=32, test_size=8)
    return root, make_model(root, train, seed=0), train, test


def _cfg(setup, run_dir: Path, steps: int, *extra: str):
    root, model, train, test = setup
    over = train_overrides(model, train, test, run_dir, steps) + ["trainer.backend=in_process", *extra]
    return load_config(None, over)


def _ckpt(run_dir: Path, step: int) -> Path:
    return run_dir / "checkpoints" / f"step_{step}" / "model"


def _metrics(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_a_checkpoint_of_n_ranks_resumes_on_m(setup, tmp_path):
    """one_step_off (the rollout pool generates, so the number of trainer ranks changes no sample): a checkpoint
    written by N ranks, resumed on M, continues as it does resumed on N (same data, same samples; the ranks' update
    equals one rank's within float round-off). A split run is not compared with an unbroken one: one_step_off's
    batch after a checkpoint is generated after the resume, with newer weights, by design."""
    common = ("trainer.schedule=one_step_off", "actor.optim.lr=1e-2")
    for first in (2, 1):
        ends = {}
        for then in (1, 2):
            d = tmp_path / f"from{first}to{then}"
            run_training(_cfg(setup, d, 2, f"trainer.num_workers={first}", *common))
            run_training(_cfg(setup, d, 4, f"trainer.num_workers={then}", *common))
            assert [m["step"] for m in _metrics(d) if "reward/mean" in m] == [1, 2, 3, 4]
            ends[then] = _metrics(d)[-1], d
        (m1, _), (m2, _) = ends[1], ends[2]
        assert m1["reward/mean"] == m2["reward/mean"]  # the same samples after the resume
        assert m1["actor/grad_norm"] == pytest.approx(m2["actor/grad_norm"], rel=1e-4)
        one, two = (_ckpt(tmp_path / f"from{first}to{then}", 4) for then in (1, 2))
        moved = policy_gap(_ckpt(tmp_path / f"from{first}to1", 2), one)  # steps 3-4 did train
        assert policy_gap(one, two) < 1e-3 < moved / 10, (first, policy_gap(one, two), moved)


def test_sync_schedule_two_ranks_generate_and_train(setup, tmp_path):
    d = tmp_path / "sync2"
    summary = run_training(_cfg(setup, d, 2, "trainer.num_workers=2", "trainer.save_freq=0"))
    steps = [m for m in _metrics(d) if "reward/mean" in m]
    assert len(steps) == 2 and all(m["staleness/max"] == 0 for m in steps)
    assert "accuracy_after" in summary and (d / "final" / "model.safetensors").is_file()


def test_bad_num_workers_is_a_config_error(setup, tmp_path):
    with pytest.raises(ConfigError, match="trainer.num_workers"):
        _cfg(setup, tmp_path, 1, "trainer.num_workers=0")
    with pytest.raises(ConfigError, match="trainer.num_workers.*vllm"):
        _cfg(setup, tmp_path, 1, "trainer.num_workers=2", "rollout.engine=vllm")


def _spans_by_worker(run_dir: Path, name: str) -> dict[str, list[tuple[int, int]]]:
    trace = json.loads((run_dir / "timeline.json").read_text())["traceEvents"]
    names = {e["pid"]: e["args"]["name"] for e in trace if e["name"] == "process_name"}
    out: dict[str, list[tuple[int, int]]] = {}
    for e in trace:
        if e["name"] == name and e.get("ph") == "X":
            out.setdefault(names[e["pid"]], []).append((e["ts"], e["ts"] + e["dur"]))
    return out


@pytest.mark.ray
def test_ray_ranks_are_processes_that_generate_and_update_at_once(setup, tmp_path):
    """On Ray each rank is an actor with its share of the pool (1 CPU each here): both generate a share of the
    prompts and both take part in every update, at the same time. The ranks are sharded (FSDP2, which only Ray's
    process ranks can run): each decodes from its full copy of the weights (tests/test_fsdp.py has the rest)."""
    d = tmp_path / "ray2"
    over = ("trainer.num_workers=2", "trainer.backend=ray", "trainer.strategy=fsdp2", "trainer.save_freq=0")
    run_training(_cfg(setup, d, 2, *over))
    gens, ups = _spans_by_worker(d, "generate"), _spans_by_worker(d, "update_actor")
    assert len(gens["trainer.rank1"]) == 2 and len(gens["trainer"]) > 2  # rank 0 also evaluates
    assert len(ups["trainer"]) == len(ups["trainer.rank1"]) == 2
    overlap = [min(a[1], b[1]) - max(a[0], b[0]) for a, b in zip(ups["trainer"], ups["trainer.rank1"])]
    assert all(o > 0 for o in overlap)  # the ranks' updates ran at the same time
