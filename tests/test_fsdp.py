"""FSDP2 data-parallel trainer (``trainer.strategy: fsdp2``): sharded ranks step as one rank on the whole batch; a
sharded optimizer state is saved whole (the single-rank layout) and cut back exactly; a whole run on two sharded Ray
ranks matches two DDP ranks and its checkpoint resumes on one rank.

The ranks are real processes (FSDP2 needs each rank's default process group): spawned here with
``torch.multiprocessing`` for the update, Ray actors for the runs.
"""

from __future__ import annotations

import copy
import json
import time
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp

from asyncrl.comm.groups import LOOPBACK, find_free_port
from asyncrl.config import ActorConfig, ConfigError, RolloutCorrectionConfig, load_config
from asyncrl.models.presets import build_model
from asyncrl.models.tokenizer import build_char_tokenizer
from asyncrl.schedules import run_training
from asyncrl.trainer import fsdp
from asyncrl.trainer.data_parallel import DataParallel
from tests.helpers import make_data, make_model, policy_gap, ppo_update, train_overrides
from tests.test_data_parallel import _update
from tests.test_policy_update import CHARS, _batch

ADVS = [1.0, -1.0, 0.5, -0.5] + [0.0] * 4 + [1.5, -0.5, -0.5, -0.5] + [0.0] * 3 + [0.7, -0.7, 0.7, -0.7, 0.3]


def _cases() -> list[ActorConfig]:
    # uneven shares: by sample count, the ranks pack into different numbers of micro-batches (idle passes make them
    # up); then micro-batches by token budget (the default)
    return [
        ActorConfig(
            loss_agg_mode="token-mean", ppo_micro_batch_size=3, ppo_epochs=2, skip_zero_adv_rows=True,
            use_dynamic_bsz=False,
        ),
        ActorConfig(loss_agg_mode="seq-mean-token-mean", ppo_micro_batch_size=2, ppo_epochs=1),
    ]  # fmt: skip


def _sgd_update(model, batch, actor, dp):
    """``tests.test_data_parallel._update``'s step on ``model`` itself (a sharded module cannot be deep-copied)."""
    opt = torch.optim.SGD(model.parameters(), lr=0.5, weight_decay=0.01)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda _: 1.0)
    return model, ppo_update(model, opt, sched, batch, actor, RolloutCorrectionConfig(), 1.0, 2, seed=3, dp=dp)


def _store_port(rank: int, out: Path) -> int:
    """Rank 0 picks the store's port just before it binds it and hands it to rank 1 through a file: a port picked in
    the parent would stay unbound for the children's start-up (seconds), long enough for another process to take it."""
    path = out / "port"
    if rank == 0:
        port = find_free_port()
        (out / "port.tmp").write_text(str(port))
        (out / "port.tmp").rename(path)
        return port
    deadline = time.monotonic() + 120
    while not path.exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"rank 0 wrote no port to {path} in 120 s")
        time.sleep(0.05)
    return int(path.read_text())


def _rank_main(rank: int, out: str) -> None:
    torch.set_num_threads(1)
    tok = build_char_tokenizer([CHARS])
    start = build_model("micro", tok, seed=0)
    batch = _batch(tok, ADVS)
    dp = DataParallel.create(rank, 2, LOOPBACK, _store_port(rank, Path(out)), timeout_s=120)
    idle = [0]

    def counted(model):
        idle[0] += 1
        DataParallel.idle_pass(model)

    dp.idle_pass = counted  # type: ignore[method-assign]
    results = []
    try:
        for actor in _cases():
            model = copy.deepcopy(start)
            dp.shard_with_fsdp2(model)
            sharded, res = _sgd_update(model, batch, actor, dp)
            full = copy.deepcopy(start)
            fsdp.gather_into(sharded, [full])  # every rank gathers; each gets the whole weights
            local = sum(p.to_local().numel() for p in sharded.parameters())
            results.append((full.state_dict(), res.metrics, local, idle[0]))
            idle[0] = 0
        results.append(_resume_round_trip(dp, start, batch))
        results.append(_led_gather(dp, start))
        results.append(_sharded_checkpoint_resume(dp, start, batch, Path(out) / "ckpt"))
    finally:
        dp.close()
    torch.save(results, Path(out) / f"rank{rank}.pt")


def _adamw_step(model, batch, dp=None):
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda _: 1.0)
    ppo_update(model, opt, sched, batch, _cases()[1], RolloutCorrectionConfig(), 1.0, 1, seed=5, dp=dp)
    return opt, sched


def _resume_round_trip(dp, start, batch):
    """A sharded AdamW state gathered whole (the checkpoint's single-rank layout), then cut back into a fresh
    sharded model and optimizer: both take the same next step."""
    model = copy.deepcopy(start)
    dp.shard_with_fsdp2(model)
    opt, _ = _adamw_step(model, batch, dp)
    saved_opt = fsdp.full_optimizer_state(opt)
    saved = copy.deepcopy(start)
    fsdp.gather_into(model, [saved])
    fresh = copy.deepcopy(start)
    dp.shard_with_fsdp2(fresh)
    fsdp.load_full(fresh, dict(saved.named_parameters()), "the gathered weights")
    fresh_opt = torch.optim.AdamW(fresh.parameters(), lr=1e-3)
    fresh_opt.load_state_dict(fsdp.sharded_optimizer_state(saved_opt, fresh_opt))
    after = []
    for m, o in ((model, opt), (fresh, fresh_opt)):
        sched = torch.optim.lr_scheduler.LambdaLR(o, lambda _: 1.0)
        ppo_update(m, o, sched, batch, _cases()[1], RolloutCorrectionConfig(), 1.0, 1, seed=6, dp=dp)
        full = copy.deepcopy(start)
        fsdp.gather_into(m, [full])
        after.append(full.state_dict())
    return saved_opt, after


def _led_gather(dp, start):
    """Rank 0 reads the full weights of a sharded model in an order of its own (each name twice, the way a sync
    checks then packs them), the other rank following; what rank 0 read, and how many gathers each rank ran."""
    from asyncrl.trainer.gathered import Gather

    model = copy.deepcopy(start)
    dp.shard_with_fsdp2(model)
    session = Gather(dp, model)
    if dp.rank != 0:
        session.follow()
        return None, session.gathered
    tensors = session.tensors(torch.bfloat16)
    names = list(reversed(list(tensors))) + list(tensors)
    read = {n: tensors[n] for n in names}
    session.stop()
    return read, session.gathered


def _sharded_checkpoint_resume(dp, start, batch, directory):
    """bf16 compute over fp32 shards: a step, a sharded checkpoint (each rank its shards), then the next step taken
    by the model that never stopped and by a fresh one loaded from the checkpoint: weights and losses of both."""

    def sharded():
        model = copy.deepcopy(start)
        dp.shard_with_fsdp2(model, torch.bfloat16)
        return model, torch.optim.AdamW(model.parameters(), lr=1e-3)

    def step(model, opt, seed):
        sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda _: 1.0)
        res = ppo_update(model, opt, sched, batch, _cases()[1], RolloutCorrectionConfig(), 1.0, 1, seed=seed, dp=dp)
        return res.metrics["actor/pg_loss"], {n: p.full_tensor() for n, p in model.named_parameters()}

    model, opt = sharded()
    step(model, opt, 5)
    fsdp.save_sharded(directory, model, opt, {})
    going = step(model, opt, 6)
    fresh, fresh_opt = sharded()
    fsdp.load_sharded(directory, fresh, fresh_opt, {})
    return going, step(fresh, fresh_opt, 6)


@pytest.fixture(scope="module")
def ranks(tmp_path_factory):
    """What each of two spawned FSDP2 ranks returned from ``_rank_main``, in rank order."""
    out = tmp_path_factory.mktemp("fsdp_ranks")
    mp.start_processes(_rank_main, args=(str(out),), nprocs=2, start_method="spawn")
    return [torch.load(out / f"rank{r}.pt", weights_only=False) for r in range(2)]


def test_two_sharded_ranks_on_half_batches_step_as_one_rank_on_the_whole(ranks):
    tok = build_char_tokenizer([CHARS])
    start = build_model("micro", tok, seed=0)
    batch = _batch(tok, ADVS)
    total = sum(p.numel() for p in start.parameters())
    for i, actor in enumerate(_cases()):
        one, res_one = _update(start, batch, actor, num_mini=2)
        moved = 0.0
        for name, a in one.state_dict().items():
            for r in range(2):
                assert torch.allclose(a, ranks[r][i][0][name], atol=1e-6), (i, r, name)
            moved = max(moved, float((a - start.state_dict()[name]).abs().max()))
        assert moved > 1e-3  # the update moved the weights: the equality is not two no-ops
        for r in range(2):
            metrics, local = ranks[r][i][1], ranks[r][i][2]
            assert metrics["actor/grad_norm"] == pytest.approx(res_one.metrics["actor/grad_norm"], rel=1e-5)
            assert metrics["actor/pg_loss"] == pytest.approx(res_one.metrics["actor/pg_loss"], rel=1e-5)
            assert local < 0.6 * total  # each rank holds about half of every parameter
    # the ranks' shares packed into different numbers of micro-batches in the first case: idle passes ran
    assert ranks[0][0][3] + ranks[1][0][3] > 0


def test_sharded_optimizer_state_saves_whole_and_resumes_on_any_rank_count(ranks):
    """What a checkpoint holds under FSDP2 is one rank's AdamW state (gathered whole, so it resumes on M ranks of
    either strategy), and cutting it back into a sharded optimizer resumes exactly (the N -> N and 1 -> N loads)."""
    saved, after = ranks[0][-3]
    tok = build_char_tokenizer([CHARS])
    one = build_model("micro", tok, seed=0)
    opt, _ = _adamw_step(one, _batch(tok, ADVS))
    plain = opt.state_dict()
    assert sorted(saved["state"]) == sorted(plain["state"]) and saved["param_groups"] == plain["param_groups"]
    for idx, st in plain["state"].items():
        for k, v in st.items():
            assert saved["state"][idx][k].shape == v.shape and torch.allclose(saved["state"][idx][k], v, atol=1e-7)
    for k in after[0]:  # the resumed shards step exactly as the ones that never stopped
        assert torch.equal(after[0][k], after[1][k]), k


def test_rank_0_reads_whole_weights_one_at_a_time_with_every_rank_gathering(ranks):
    """A sharded trainer with no full copy (every schedule but sync) gathers a parameter whenever rank 0 reads one (a
    sync's packing, an export): the others gather the same ones in step, whatever rank 0's order."""
    (read, gathered0), (_, gathered1) = ranks[0][-2], ranks[1][-2]
    start = build_model("micro", build_char_tokenizer([CHARS]), seed=0)
    params = dict(start.named_parameters())
    assert read.keys() == params.keys() and gathered0 == gathered1 == 2 * len(params)
    for name, t in read.items():
        assert t.dtype == torch.bfloat16 and torch.equal(t, params[name].detach().to(torch.bfloat16)), name


def test_a_sharded_checkpoint_resumes_bit_for_bit(ranks):
    """Each rank's shards (fp32 masters under bf16 compute, AdamW's state) written and read back with
    torch.distributed.checkpoint: the resumed model takes exactly the step the uninterrupted one takes."""
    for r in range(2):
        (loss_a, after_a), (loss_b, after_b) = ranks[r][-1]
        assert loss_a == loss_b
        assert after_a.keys() == after_b.keys() and all(torch.equal(after_a[k], after_b[k]) for k in after_a)


# ---- whole runs -----------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("fsdp")
    train, test = make_data(root, size=32, test_size=8)
    return root, make_model(root, train, seed=0), train, test


def _cfg(setup, run_dir: Path, steps: int, *extra: str):
    root, model, train, test = setup
    over = train_overrides(model, train, test, run_dir, steps) + [
        "trainer.schedule=one_step_off", "actor.optim.lr=1e-2", *extra
    ]  # fmt: skip
    return load_config(None, over)


RAY2 = ("trainer.backend=ray", "trainer.num_workers=2", "trainer.strategy=fsdp2")


def _weights(run_dir: Path, step: int) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(str(run_dir / "checkpoints" / f"step_{step}" / "model" / "model.safetensors"))


def _ckpt(run_dir: Path, step: int) -> Path:
    return run_dir / "checkpoints" / f"step_{step}" / "model"


def _steps(run_dir: Path) -> list[dict]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [m for m in rows if "reward/mean" in m]


@pytest.mark.ray
def test_sharded_ray_ranks_train_as_ddp_and_resume_sharded(setup, tmp_path):
    """Two FSDP2 ranks (Ray actors) train as two DDP ranks do (one_step_off: the rollout pool makes the samples, so
    they are the same); their checkpoint is each rank's shards, which two sharded ranks resume and one rank refuses."""
    sharded, ddp = tmp_path / "fsdp2", tmp_path / "ddp"
    run_training(_cfg(setup, sharded, 2, *RAY2))
    run_training(_cfg(setup, ddp, 2, "trainer.backend=in_process", "trainer.num_workers=2"))
    assert policy_gap(_ckpt(sharded, 2), _ckpt(ddp, 2)) < 1e-3  # the same policy, up to float round-off
    assert [m["reward/mean"] for m in _steps(sharded)] == [m["reward/mean"] for m in _steps(ddp)]
    state = torch.load(sharded / "checkpoints" / "step_2" / "trainer_state.pt", weights_only=False)
    assert "optimizer" not in state and state["sharded_ranks"] == 2  # nothing gathered: each rank its shards
    assert (sharded / "checkpoints" / "step_2" / "sharded" / ".metadata").is_file()

    run_training(_cfg(setup, sharded, 3, *RAY2))
    run_training(_cfg(setup, ddp, 3, "trainer.backend=in_process", "trainer.num_workers=2"))
    assert [m["step"] for m in _steps(sharded)] == [m["step"] for m in _steps(ddp)] == [1, 2, 3]
    gap, moved = policy_gap(_ckpt(sharded, 3), _ckpt(ddp, 3)), policy_gap(_ckpt(ddp, 2), _ckpt(ddp, 3))
    assert gap < 1e-3 < moved / 10, (gap, moved)  # the same policy; step 3 did train
    with pytest.raises(Exception, match="written by 2 FSDP2 ranks.*trainer.strategy=fsdp2"):
        run_training(_cfg(setup, sharded, 4, "trainer.backend=in_process"))


def test_fsdp2_config_errors(setup, tmp_path):
    with pytest.raises(ConfigError, match="trainer.strategy.*processes"):
        _cfg(setup, tmp_path, 1, "trainer.backend=in_process", "trainer.num_workers=2", "trainer.strategy=fsdp2")
    with pytest.raises(ConfigError, match="trainer.strategy.*LoRA"):
        _cfg(setup, tmp_path, 1, *RAY2, "model.lora_rank=4")
    with pytest.raises(ConfigError, match="trainer.strategy"):
        _cfg(setup, tmp_path, 1, "trainer.strategy=fsdp")
