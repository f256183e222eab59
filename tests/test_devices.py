"""Devices and mixed precision: each test runs on the CPU here and on CUDA where there is a GPU (``make test-gpu``
selects the CUDA cases with ``-m gpu``; without CUDA they skip, saying why).

What must hold on any device, in bf16 as in fp32: the trainer's fp32 master weights keep updates that bf16 weights
alone round away; the trainer's and the engine's log-probs of the same samples agree (the rollout's behaviour
log-probs are what the PPO ratio divides by); a weight update lands in the engine; fitting a fixed batch raises the
likelihood of its advantaged responses over the others; a short in-process run of sync and of one_step_off completes
with every role on the device. These need neither Ray, nor vLLM, nor omegaconf, nor reasoning-gym (a GPU box may have
none of them): the config is built from its dataclasses and the data is written here.
"""

from __future__ import annotations

import json
import math
import os
import random
import string
import time
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from asyncrl.config import (
    SCHEDULES,
    ActorConfig,
    Config,
    DataConfig,
    ModelConfig,
    RewardConfig,
    RolloutConfig,
    RolloutCorrectionConfig,
    TrainerConfig,
)
from asyncrl.config.checks import validate
from asyncrl.data.collate import collate
from asyncrl.models.device import to_device
from asyncrl.models.presets import build_model
from asyncrl.models.tokenizer import build_char_tokenizer
from asyncrl.rollout.engine import RolloutEngine
from asyncrl.rollout.sampling import SamplingParams
from asyncrl.trainer.forward import response_logprobs
from asyncrl.trainer.update import MasterWeightsAdamW, build_optimizer
from asyncrl.types import Prompt, Sample

CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device here: make test-gpu runs it on a GPU")
DEVICES = ["cpu", pytest.param("cuda", marks=[pytest.mark.gpu, CUDA])]
DTYPES = [torch.float32, torch.bfloat16]
# |trainer - engine| log-prob per response token, mean over tokens: the same weights, one forward over the whole
# sequence against an incremental decode with a KV cache. fp32: float rounding only; bf16: bf16 activations.
LOGPROB_TOLERANCE = {torch.float32: 1e-4, torch.bfloat16: 0.05}
TEXTS = ["1 + 2 =", "7 - 3 =", "4 + 4 =", "9 - 5 ="]
CORRECTION = RolloutCorrectionConfig()


@pytest.fixture(scope="module")
def tok():
    return build_char_tokenizer([string.printable[:95]])


def _model(tok, device: str, dtype: torch.dtype, preset: str = "micro"):
    return build_model(preset, tok, seed=0, initializer_range=0.3).to(device=device, dtype=dtype)


def _prompts(tok, texts=TEXTS) -> list[Prompt]:
    return [Prompt(index=i, prompt_ids=tok.encode(t), data_source="test", ground_truth="") for i, t in enumerate(texts)]


def _sampled(tok, device: str, dtype: torch.dtype, new_tokens: int, seed: int):
    """A micro model on ``device`` in ``dtype`` and a batch of its own samples (4 prompts x 4), as a trainer gets it."""
    model = _model(tok, device, dtype)
    params = SamplingParams(temperature=1.0, max_new_tokens=new_tokens, n=4)
    samples = RolloutEngine(model, tok).generate(_prompts(tok), params, seed=seed)
    return model, collate(samples, tok.pad_token_id)


@pytest.mark.parametrize("device", DEVICES)
def test_fp32_master_weights_keep_updates_that_bf16_weights_round_away(device):
    def train(optimizer_cls) -> tuple[torch.nn.Linear, torch.optim.Optimizer]:
        layer = torch.nn.Linear(4, 4, bias=False).to(device=device, dtype=torch.bfloat16)
        torch.nn.init.ones_(layer.weight)
        opt = optimizer_cls(layer.parameters(), lr=1e-4)  # Adam's step ~ lr: far below bf16's 2^-8 at 1.0
        for _ in range(50):
            opt.zero_grad()
            layer.weight.grad = torch.ones_like(layer.weight)
            opt.step()
        return layer, opt

    plain, _ = train(torch.optim.AdamW)
    assert bool((plain.weight == 1).all())  # every step rounded away
    mixed, opt = train(MasterWeightsAdamW)
    assert mixed.weight.dtype == torch.bfloat16 and opt.masters[0].dtype == torch.float32
    assert all(v.dtype == torch.float32 for v in opt.state[opt.masters[0]].values() if v.dim())
    assert math.isclose(float(opt.masters[0].detach().mean()), 1 - 50e-4, rel_tol=1e-3)  # 50 steps of ~lr, kept in fp32
    assert bool((mixed.weight < 1).all())  # and the bf16 weights followed them
    # a resumed optimizer continues from the fp32 masters, not from their bf16 rounding
    state = opt.state_dict()
    again = torch.nn.Linear(4, 4, bias=False).to(device=device, dtype=torch.bfloat16)
    opt2 = MasterWeightsAdamW(again.parameters(), lr=1e-4)
    opt2.load_state_dict(state)
    assert torch.equal(opt2.masters[0], opt.masters[0]) and torch.equal(again.weight, mixed.weight)
    assert isinstance(build_optimizer(again.parameters(), ActorConfig().optim), MasterWeightsAdamW)
    assert type(build_optimizer(torch.nn.Linear(2, 2).parameters(), ActorConfig().optim)) is torch.optim.AdamW


@pytest.mark.parametrize("dtype", DTYPES, ids=["fp32", "bf16"])
@pytest.mark.parametrize("device", DEVICES)
def test_trainer_and_engine_logprobs_agree(tok, device, dtype):
    model, batch = _sampled(tok, device, dtype, new_tokens=12, seed=3)
    trainer_BT = response_logprobs(model, batch, temperature=1.0, how=8)
    mask = batch.response_mask_BT
    gap = float(((trainer_BT - batch.behav_logp_BT).abs() * mask).sum() / mask.sum())
    assert trainer_BT.device.type == "cpu" and trainer_BT.dtype == torch.float32  # fp32, back across the boundary
    assert gap < LOGPROB_TOLERANCE[dtype], f"mean |trainer - engine| log-prob {gap:.2e} on {device} in {dtype}"


@pytest.mark.parametrize("device", DEVICES)
def test_a_weight_update_lands_in_the_engine_on_its_device(tok, device):
    engine = RolloutEngine(_model(tok, device, torch.bfloat16), tok)
    trained = build_model("micro", tok, seed=7).to(torch.bfloat16)  # other weights, on the CPU as a sync sends them
    sent = {k: v for k, v in trained.state_dict().items() if k in engine.state_dict_for_sync()}
    engine.update_weights(sent, version=5)
    live = engine.state_dict_for_sync()
    assert engine.version == 5 and all(t.device.type == device for t in live.values())
    assert all(torch.equal(live[k].cpu(), v) for k, v in sent.items())


@pytest.mark.parametrize("dtype", DTYPES, ids=["fp32", "bf16"])
@pytest.mark.parametrize("device", DEVICES)
def test_fitting_a_fixed_batch_raises_the_advantaged_responses(tok, device, dtype):
    from tests.helpers import advantages, ppo_update

    model, batch = _sampled(tok, device, dtype, new_tokens=8, seed=5)
    sign_B = torch.tensor([1.0 if i % 2 == 0 else -1.0 for i in range(batch.size)])  # half the responses advantaged
    batch = replace(batch, policy=advantages(sign_B[:, None] * batch.response_mask_BT))
    actor = ActorConfig(ppo_mini_batch_size=batch.size, ppo_micro_batch_size=batch.size)
    optimizer = build_optimizer(model.parameters(), replace(actor.optim, lr=1e-3))
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda _: 1.0)

    def margin() -> float:
        logp = response_logprobs(model, batch, 1.0, batch.size).sum(dim=1) / batch.response_mask_BT.sum(dim=1)
        return float(logp[sign_B > 0].mean() - logp[sign_B < 0].mean())

    before = margin()
    for step in range(5):
        batch = replace(batch, old_logp_BT=response_logprobs(model, batch, 1.0, batch.size))
        res = ppo_update(model, optimizer, scheduler, batch, actor, CORRECTION, 1.0, 1, seed=step)
        assert math.isfinite(res.metrics["actor/grad_norm"])
    assert margin() > before + 0.05, (before, margin())


def _write_rows(root: Path) -> tuple[Path, Path]:
    """A jsonl dataset in verl's schema, written here (no reasoning-gym)."""
    rows = [
        {
            "data_source": "device_test",
            "prompt": [{"role": "user", "content": f"{a} + {b} ="}],
            "reward_model": {"style": "rule", "ground_truth": str(a + b)},
            "extra_info": {"index": i},
        }
        for i, (a, b) in enumerate((a, b) for a in range(1, 5) for b in range(1, 5))
    ]
    (root / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (root / "test.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows[:4]))
    return root / "train.jsonl", root / "test.jsonl"


def _config(root: Path, model: Path, schedule: str, device: str, dtype: str, steps: int = 3) -> Config:
    train, test = _write_rows(root)
    reward = root / "length_reward.py"
    reward.write_text(
        "def length_reward(data_source, solution_str, ground_truth, extra_info):\n    return len(solution_str) / 1000\n"
    )
    cfg = Config(
        data=DataConfig(train_files=[str(train)], val_files=[str(test)], train_batch_size=4),
        model=ModelConfig(path=str(model), dtype=dtype),
        rollout=RolloutConfig(n=4, response_length=6),
        actor=ActorConfig(ppo_mini_batch_size=2, ppo_micro_batch_size=4),
        reward=RewardConfig(custom_function=f"{reward}:length_reward"),
        trainer=TrainerConfig(
            schedule=schedule,
            backend="in_process",
            device=device,
            total_training_steps=steps,
            default_local_dir=str(root / f"run_{schedule}_{dtype}"),
            logger=["jsonl"],
            save_freq=0,
            test_freq=0,
            cpus_per_worker=1,
        ),
    )
    cfg.actor.optim.lr = 1e-3
    validate(cfg)
    return cfg


@pytest.fixture(scope="module")
def micro_model(tmp_path_factory):
    from asyncrl.data.dataset import load_rows
    from asyncrl.finetune.sft import init_model_from_rows

    root = tmp_path_factory.mktemp("devices")
    train, _ = _write_rows(root)
    return root, Path(init_model_from_rows("micro", load_rows([str(train)]), str(root / "model"), 0))


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("schedule", SCHEDULES)
@pytest.mark.parametrize("device", DEVICES)
def test_a_short_in_process_run_completes_with_every_role_on_the_device(micro_model, schedule, device, dtype):
    from asyncrl.schedules import run_training
    from asyncrl.telemetry.metrics import read_metrics

    root, model = micro_model
    cfg = _config(root, model, schedule, device, dtype)
    summary = run_training(cfg)
    assert summary["steps"] == 3
    workers = summary["placement"]["workers"]
    assert workers and all(w["device"].split(":")[0] == device for w in workers), workers
    metrics = [m for m in read_metrics(Path(cfg.trainer.default_local_dir) / "metrics.jsonl") if m["step"] > 0]
    assert len(metrics) == 3 and all(math.isfinite(m["actor/grad_norm"]) for m in metrics)
    assert all(math.isfinite(m["actor/pg_loss"]) for m in metrics)


@pytest.mark.parametrize("algorithm", ["ppo", "dpo"])
@pytest.mark.parametrize("device", DEVICES)
def test_ppo_and_online_dpo_run_in_process_with_every_role_on_the_device(micro_model, algorithm, device):
    """The other roles' forwards on the device in bf16: PPO's critic (values, GAE) and online DPO's pairs."""
    from asyncrl.schedules import run_training

    root, model = micro_model
    cfg = _config(root, model, "sync", device, "bfloat16")
    cfg.algorithm.name = algorithm
    cfg.trainer.default_local_dir = str(root / f"run_{algorithm}_{device}")
    validate(cfg)
    summary = run_training(cfg)
    assert summary["steps"] == 3
    assert all(w["device"].split(":")[0] == device for w in summary["placement"]["workers"])


def _eos_model(tok, device: str, eos_bias: float):
    """A micro model on ``device`` (fp32) whose eos logit is shifted by ``eos_bias``: rows end at different steps."""
    model = _model(tok, device, torch.float32)
    eos = torch.tensor([tok.eos_token_id], device=device)
    model.lm_head.register_forward_hook(
        lambda m, i, out: out.index_add_(-1, eos, torch.full_like(out[..., :1], eos_bias))
    )
    return model


def _blanks(prompts: list[Prompt], n: int) -> list[Sample]:
    return [Sample.blank(p, 0, j) for p in prompts for j in range(n)]


@pytest.mark.parametrize("device", DEVICES)
def test_streamed_rows_draw_the_batch_decoders_tokens_on_the_device(tok, device):
    """Issue 49's streaming decoder on the device: rows submitted at random steps into 5 slots (fewer than the 24 rows,
    so slots are reused) draw the tokens the batch decoder draws for them, sampled on the device from each row's own
    noise; log-probs differ by float rounding only (other padding)."""
    model = _eos_model(tok, device, 3.0)
    params = SamplingParams(temperature=1.0, max_new_tokens=24, n=3)
    texts = [*TEXTS, "a", "The quick brown fox", "zz top 42", "What is 2+2?"]
    rows = _blanks(_prompts(tok, texts), params.n)
    reference = RolloutEngine(model, tok).resume(rows, params, seed=11)
    assert len({len(s.response_ids) for s in reference}) >= 4  # rows end at different steps
    engine = RolloutEngine(model, tok, max_batch_size=5)
    rng = random.Random(0)
    waiting, streamed = rows[::-1], []
    while waiting or engine.live_rows():
        if waiting and (rng.random() < 0.4 or not engine.live_rows()):
            k = rng.randint(1, 4)
            engine.submit(waiting[:k], params, 11)
            waiting = waiting[k:]
        streamed += engine.step()
    got = {(s.prompt.index, s.row): s for s in streamed}
    assert sorted(got) == sorted((s.prompt.index, s.row) for s in reference)
    worst = 0.0
    for ref in reference:
        s = got[ref.prompt.index, ref.row]
        assert (s.response_ids, s.stop_reason) == (ref.response_ids, ref.stop_reason), (ref.prompt.index, ref.row)
        worst = max([worst, *(abs(a - b) for a, b in zip(s.logprobs, ref.logprobs))])
    # Other padding moves fp32 logits by the kernels' blocking: 1.3e-5 on an H200, 7e-6 on 2 CPU threads. Bounded as
    # the trainer's and the engine's fp32 log-probs are (LOGPROB_TOLERANCE); the 1e-6 bound on one CPU thread is
    # tests/test_rollout_streaming.py's. The tokens stay exact.
    bound = LOGPROB_TOLERANCE[torch.float32]
    assert worst <= bound, f"streamed vs batched log-prob, worst {worst:.2e} on {device}"
    assert len({tuple(s.response_ids) for s in reference}) > len(reference) // 2  # rows differ: not a constant output


@pytest.mark.gpu
@CUDA
def test_bench_line_streaming_against_batch_calls_on_cuda(tok, capsys):
    """Not a target: one line for BENCHMARKS.md. 256 rows of long-tailed lengths (an eos bias: geometric, 1 to 256
    tokens) through 32 slots on CUDA, fp32: batch calls of 32 rows (each waits for its longest row) against the
    streaming decoder (a freed slot refilled at the next step); tokens/s and the mean share of slots in use."""
    model = _eos_model(tok, "cuda", 0.0)
    params = SamplingParams(temperature=1.0, max_new_tokens=256, n=8)
    texts = [f"{a} + {b} =" for a in range(8) for b in range(4)]
    rows = _blanks(_prompts(tok, texts), params.n)
    slots, line = 32, {}
    for _attempt in ("warm-up", "timed"):  # the first pass warms CUDA up
        sync("cuda")
        t0 = time.perf_counter()
        batched = [
            s
            for i in range(0, len(rows), slots)
            for s in RolloutEngine(model, tok).resume(rows[i : i + slots], params, seed=1)
        ]
        sync("cuda")
        batch_s = time.perf_counter() - t0
        engine = RolloutEngine(model, tok, max_batch_size=slots)
        t0, steps, live_sum, streamed = time.perf_counter(), 0, 0, []
        for i in range(0, len(rows), params.n):
            engine.submit(rows[i : i + params.n], params, 1)
        while engine.live_rows():
            live_sum += min(engine.live_rows(), slots)
            streamed += engine.step()
            steps += 1
        sync("cuda")
        stream_s = time.perf_counter() - t0
    tokens = sum(len(s.response_ids) for s in batched)
    lengths = sorted(len(s.response_ids) for s in batched)
    line = {
        "rows": len(rows),
        "slots": slots,
        "length_min_median_max": [lengths[0], lengths[len(lengths) // 2], lengths[-1]],
        "batch_calls_tok_s": round(tokens / batch_s, 1),
        "streaming_tok_s": round(sum(len(s.response_ids) for s in streamed) / stream_s, 1),
        "streaming_slot_occupancy": round(live_sum / (steps * slots), 3),
        "speedup": round(batch_s / stream_s, 2),
    }
    with capsys.disabled():
        print(f"\nbench (streaming vs batch calls, {torch.cuda.get_device_name()}, micro preset):", json.dumps(line))
    assert sorted((s.prompt.index, s.row) for s in streamed) == sorted((s.prompt.index, s.row) for s in batched)
    assert [s.response_ids for s in sorted(streamed, key=lambda s: (s.prompt.index, s.row))] == [
        s.response_ids for s in sorted(batched, key=lambda s: (s.prompt.index, s.row))
    ]


@pytest.mark.gpu
@CUDA
def test_bench_line_decode_and_update_on_cuda_beside_the_cpu(tok, capsys):
    """Not a target: one line of figures (decode tokens/s, update s/step) for BENCHMARKS.md, CUDA beside the CPU."""
    from tests.helpers import advantages, ppo_update

    line = {}
    for device in ("cpu", "cuda"):
        for dtype in DTYPES:
            model = _model(tok, device, dtype, preset="tiny")
            engine = RolloutEngine(model, tok)
            params = SamplingParams(temperature=1.0, max_new_tokens=64, n=16)
            engine.generate(_prompts(tok), params, seed=0)  # warm-up
            sync(device)
            t0 = time.perf_counter()
            samples = engine.generate(_prompts(tok), params, seed=1)
            sync(device)
            decode_s = time.perf_counter() - t0
            tokens = sum(len(s.response_ids) for s in samples)
            batch = collate(samples, tok.pad_token_id)
            batch = replace(batch, policy=advantages(torch.ones_like(batch.response_mask_BT)))
            batch = replace(batch, old_logp_BT=batch.behav_logp_BT)
            actor = ActorConfig(ppo_mini_batch_size=batch.size, ppo_micro_batch_size=16)
            opt = build_optimizer(model.parameters(), actor.optim)
            sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda _: 1.0)
            ppo_update(model, opt, sched, batch, actor, CORRECTION, 1.0, 1, seed=0)  # warm-up
            sync(device)
            t0 = time.perf_counter()
            for step in range(3):
                ppo_update(model, opt, sched, batch, actor, CORRECTION, 1.0, 1, seed=step)
            sync(device)
            name = f"{device}/{str(dtype).removeprefix('torch.')}"
            line[name] = {
                "decode_tok_s": round(tokens / decode_s, 1),
                "update_s": round((time.perf_counter() - t0) / 3, 4),
            }
    with capsys.disabled():
        print("\nbench (tiny preset, 64 prompts x 64 new tokens, update of 64 rows):", json.dumps(line))
    assert all(v["decode_tok_s"] > 0 and v["update_s"] > 0 for v in line.values())


@pytest.mark.gpu
@CUDA
def test_bench_line_every_schedule_in_process_on_cuda_in_bf16(tmp_path, capsys):
    """Not a target: one line for BENCHMARKS.md, each schedule's in-process run on one GPU (every role on it, bf16),
    tiny preset, 16 prompts x 8 samples x 32 tokens a step, 8 steps; wall seconds and the ratio to sync's."""
    line = schedule_bench(tmp_path, "cuda", steps=8)
    with capsys.disabled():
        print(f"\nbench (in-process, {torch.cuda.get_device_name()}, bf16, tiny preset):", json.dumps(line))
    assert all(v["wall_s"] > 0 for v in line.values())


def schedule_bench(
    root: Path, device: str, steps: int, preset: str = "tiny", prompts: int = 16, n: int = 8, tokens: int = 32
) -> dict[str, dict[str, float]]:
    """Every schedule in-process on ``device`` in bf16, ``prompts`` x ``n`` samples of up to ``tokens`` tokens a
    step, after an untimed warm-up run (CUDA's start, kernels)."""
    from asyncrl.data.dataset import load_rows
    from asyncrl.finetune.sft import init_model_from_rows
    from asyncrl.schedules import run_training
    from asyncrl.telemetry.metrics import read_metrics

    train, _ = _write_rows(root)
    model = Path(init_model_from_rows(preset, load_rows([str(train)]), str(root / preset), 0))
    line = {}
    for schedule in ["warm-up", *SCHEDULES]:
        (root / schedule).mkdir()
        cfg = _config(root / schedule, model, schedule.replace("warm-up", "sync"), device, "bfloat16", steps=steps)
        cfg.data.train_batch_size, cfg.rollout.n, cfg.rollout.response_length = prompts, n, tokens
        cfg.actor.ppo_mini_batch_size, cfg.actor.ppo_micro_batch_size = prompts, 128
        validate(cfg)
        t0 = time.perf_counter()
        summary = run_training(cfg)
        wall = time.perf_counter() - t0
        metrics = [m for m in read_metrics(Path(cfg.trainer.default_local_dir) / "metrics.jsonl") if m["step"] > 0]
        assert summary["steps"] == steps and len(metrics) == steps, (schedule, summary["steps"], len(metrics))
        line[schedule] = {"wall_s": round(wall, 2), "samples_per_s": round(steps * prompts * n / wall, 1)}
    del line["warm-up"]
    for v in line.values():
        v["speedup_over_sync"] = round(line["sync"]["wall_s"] / v["wall_s"], 2)
    return line


def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def test_to_device_moves_every_tensor_of_a_batch_and_copies_nothing_in_place(tok):
    samples = RolloutEngine(_model(tok, "cpu", torch.float32), tok).generate(
        _prompts(tok), SamplingParams(max_new_tokens=4), seed=0
    )
    from tests.helpers import advantages

    batch = collate(samples, tok.pad_token_id)
    batch = replace(batch, policy=advantages(torch.ones_like(batch.response_mask_BT)))
    assert to_device(batch, torch.device("cpu")) is batch  # nothing to move: the same object
    meta = to_device(batch, torch.device("meta"))  # a device every build has
    assert meta.input_ids_BL.device.type == "meta" and meta.policy.advantages_BT.device.type == "meta"
    assert batch.input_ids_BL.device.type == "cpu" and meta.prompt_width == batch.prompt_width


@pytest.mark.parametrize("share_prefix", [True, False])  # the shared-prefix mask, and rows of one sequence (no mask)
def test_the_packed_forward_makes_no_tensor_on_the_cpu_when_its_model_is_elsewhere(tok, share_prefix):
    """A CPU guard for CUDA: with the model and a packed micro-batch on the ``meta`` device, any tensor the forward
    makes on the CPU (a mask, an index) fails as it would beside a CUDA model (the packed mask did, on an H100). The
    padded layout cannot be checked so: transformers builds its mask from the 2D one with ``.item()``, which meta
    tensors cannot answer (``test_a_short_in_process_run...[cuda-...]`` covers it on a GPU)."""
    from asyncrl import losses
    from asyncrl.data.collate import Batching, micro_batches
    from asyncrl.trainer.forward import forward_logits

    model = _model(tok, "cpu", torch.float32)
    samples = RolloutEngine(model, tok).generate(_prompts(tok), SamplingParams(max_new_tokens=6, n=4), seed=0)
    batch = collate(samples, tok.pad_token_id)
    model.to("meta")
    how = Batching(16, share_prefix=share_prefix, max_tokens=4096, knob="actor.ppo_max_token_len_per_gpu")
    for _, mb in micro_batches(batch, how):
        assert mb.packed is not None and mb.packed.per_row != share_prefix
        mb = to_device(mb, torch.device("meta"))
        logp = losses.logprobs_from_logits(forward_logits(model, mb, 1.0), mb.response_ids_BT)
        assert logp.device.type == "meta" and logp.shape == mb.response_ids_BT.shape
        (logp * mb.response_mask_BT).sum().backward()
    assert all(p.grad is not None and p.grad.device.type == "meta" for p in model.parameters())


BLOCKED = ("ray", "vllm", "omegaconf", "reasoning_gym", "math_verify")
WITHOUT = (
    "import sys; [sys.modules.__setitem__(m, None) for m in {blocked}]; import pytest; "
    "sys.exit(pytest.main(['-q', '-p', 'no:cacheprovider', '-p', 'no:xdist', {path!r}, '-k', {select!r}]))"
)


def test_these_tests_run_without_ray_vllm_omegaconf_or_reasoning_gym():
    """As on a GPU box that lacks them: importing any of them fails, and the CPU cases still pass."""
    import subprocess
    import sys

    code = WITHOUT.format(
        blocked=BLOCKED, path=__file__, select="cpu and (logprobs or (short and sync and float32 and not async))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=600, cwd=Path(__file__).parents[1]
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-2000:]
    assert "3 passed" in out.stdout, out.stdout[-1000:]


def test_vllm_sizes_its_kv_cache_from_device_memory_on_a_gpu_and_from_ram_on_the_cpu():
    """What the engine passes to ``vllm.LLM`` (no vLLM needed to check it; the GPU side has not run on a GPU)."""
    from asyncrl.rollout.vllm_engine import VllmOptions, memory_options

    opts = VllmOptions(max_num_seqs=8, max_model_len=64, gpu_memory_utilization=0.5)
    gpu = {"gpu_memory_utilization": 0.5, "enable_chunked_prefill": True}
    assert memory_options(opts, on_gpu=True) == gpu  # vLLM's step size
    cpu = memory_options(opts, on_gpu=False)
    assert cpu["max_num_batched_tokens"] == 8 * 64 and "gpu_memory_utilization" not in cpu
    assert 0 < cpu["kv_cache_memory_bytes"] < os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    chosen = replace(opts, max_num_batched_tokens=4096)
    assert memory_options(chosen, on_gpu=True)["max_num_batched_tokens"] == 4096
    assert memory_options(chosen, on_gpu=False)["max_num_batched_tokens"] == 4096
