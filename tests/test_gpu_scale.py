"""What one GPU can check of the 7B plan (``make test-gpu``, every case marked ``gpu``; without CUDA they skip, saying
why): the data-parallel collectives on NCCL (world size 1), the bytes a trainer holds per parameter against the
memory plan, what activation checkpointing saves at 4k and 8k tokens, sampling on the device against the host at
Qwen's vocabulary, and the trainer's tokens/s and MFU on a Qwen2.5-0.5B-shaped model in bf16 (random weights built
from ``tests/fixtures/models/qwen2.5-0.5b/config.json``; nothing is downloaded).

Each case prints one ``gpu:`` line of figures for BENCHMARKS.md. The assertions are properties that must hold on any
GPU (the plan within 10% of the bytes held, checkpointing saving memory, the collectives' results), never a speed.
Like tests/test_devices.py these need neither Ray, nor vLLM, nor omegaconf: a GPU box may have none of them.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import torch

CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device here: make test-gpu runs it on a GPU")
pytestmark = [pytest.mark.gpu, CUDA]
QWEN_05B = Path(__file__).parent / "fixtures" / "models" / "qwen2.5-0.5b"
# dense bf16 tensor-core peak, FLOP/s, of the cards this project is lent (their data sheets: SXM parts)
PEAK_BF16 = {"H100": 989e12, "H200": 989e12}


def _line(capsys, what: str, figures: dict) -> None:
    with capsys.disabled():
        print(f"\ngpu: {what} ({torch.cuda.get_device_name()}):", json.dumps(figures))


def _qwen(dtype: torch.dtype = torch.bfloat16, checkpointing: bool = False):
    """A Qwen2.5-0.5B-shaped model with random weights, on the GPU, in ``dtype``."""
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(str(QWEN_05B), local_files_only=True)
    config.attn_implementation = "sdpa"
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, torch_dtype=dtype).to("cuda")
    if checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.train()
    return model


def _token_loss(model, ids: torch.Tensor) -> torch.Tensor:
    """The trainer's kind of loss: fp32 log-probs of the next tokens, summed (``asyncrl.trainer.forward``)."""
    logits = model(input_ids=ids).logits
    logp = torch.log_softmax(logits[:, :-1].float(), dim=-1)
    return -logp.gather(-1, ids[:, 1:, None]).sum()


def _mib(b: float) -> float:
    return round(b / 2**20, 1)


def test_every_data_parallel_collective_runs_on_nccl_with_world_size_one(capsys):
    from asyncrl.comm.groups import find_free_port
    from asyncrl.models.presets import build_model
    from asyncrl.models.tokenizer import build_char_tokenizer
    from asyncrl.trainer.data_parallel import DataParallel

    dp = DataParallel.create(0, 1, "127.0.0.1", find_free_port(), 60.0, backend="nccl")
    try:
        tok = build_char_tokenizer(["0123456789+-= "])
        model = build_model("micro", tok, seed=0).to("cuda")
        assert dp.rounds(3) == 3
        assert dp.all_gather_object({"loss": 1.5}) == [{"loss": 1.5}]
        part = torch.randn(4, 3, device="cuda")
        assert torch.equal(dp.gather_rows(part, torch.arange(4)).to(part.device), part)
        model(input_ids=torch.ones((1, 4), dtype=torch.long, device="cuda")).logits.sum().backward()
        params = [p for p in model.parameters() if p.requires_grad]
        before = [p.grad.clone() for p in params]
        dp.all_reduce_grads(params)  # a sum over one rank: unchanged
        assert all(torch.equal(p.grad, g) for p, g in zip(params, before))
        dp.check_replicas(model, "nccl world size 1")
    finally:
        dp.close()
    _line(capsys, "data-parallel collectives on nccl, world size 1", {"passed": True})


def test_bytes_a_ddp_trainer_holds_per_parameter_match_the_memory_plan(capsys):
    """bf16 weights + fp32 masters + fp32 gradients + AdamW: the plan's 18 B/param, against what CUDA holds after
    one step (before the gradients are released)."""
    from asyncrl.config import Config, ModelConfig, TrainerConfig
    from asyncrl.sizing.memory import trainer_memory
    from asyncrl.sizing.shape import model_shape
    from asyncrl.trainer.update import build_optimizer

    torch.cuda.empty_cache()
    base = torch.cuda.memory_allocated()
    model = _qwen()
    opt = build_optimizer(model.parameters(), Config().actor.optim)
    ids = torch.randint(0, 151936, (1, 256), device="cuda")
    _token_loss(model, ids).backward()
    opt.step()
    held = torch.cuda.memory_allocated() - base
    shape = model_shape(QWEN_05B)
    cfg = Config(model=ModelConfig(path=str(QWEN_05B), dtype="bfloat16"), trainer=TrainerConfig(strategy="ddp"))
    m = trainer_memory(cfg, shape, ranks=1)
    planned = m.params + m.masters + m.grads + m.optimizer
    _line(
        capsys,
        "DDP bf16 + fp32 masters, Qwen2.5-0.5B shape",
        {"params": shape.params, "held_B_per_param": round(held / shape.params, 2), "plan_B_per_param": 18},
    )
    assert abs(held - planned) <= 0.10 * planned


@pytest.mark.parametrize("tokens", [4096, 8192])
def test_activation_checkpointing_saves_memory_at_4k_and_8k_tokens(tokens, capsys):
    """One forward and backward of ``tokens`` tokens, with and without checkpointing: the peak above the weights is
    the plan's activations + logits + the bf16 gradients (``sizing.memory``), within 10%."""
    from asyncrl.sizing.memory import activation_bytes, logits_bytes
    from asyncrl.sizing.shape import model_shape

    peaks = {}
    for checkpointing in (False, True):
        model = _qwen(checkpointing=checkpointing)
        ids = torch.randint(0, 151936, (1, tokens), device="cuda")
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        _token_loss(model, ids).backward()
        torch.cuda.synchronize()
        peaks[checkpointing] = torch.cuda.max_memory_allocated() - base
        del model, ids
    s = model_shape(QWEN_05B)
    grads = 2 * s.params
    plan = {c: activation_bytes(s, 2, tokens, c) + logits_bytes(s, 2, tokens) + grads for c in (False, True)}
    _line(
        capsys,
        f"activation checkpointing at {tokens} tokens, Qwen2.5-0.5B shape, bf16",
        {
            "peak_off_MiB": _mib(peaks[False]),
            "peak_on_MiB": _mib(peaks[True]),
            "saving": round(1 - peaks[True] / peaks[False], 3),
            "plan_activations_off_MiB": _mib(activation_bytes(s, 2, tokens, False)),
            "plan_activations_on_MiB": _mib(activation_bytes(s, 2, tokens, True)),
            "plan_logits_MiB": _mib(logits_bytes(s, 2, tokens)),
            "plan_peak_off_MiB": _mib(plan[False]),
            "plan_peak_on_MiB": _mib(plan[True]),
        },
    )
    assert peaks[True] < peaks[False]
    for c in (False, True):
        assert abs(peaks[c] - plan[c]) <= 0.10 * peaks[c], (c, _mib(peaks[c]), _mib(plan[c]))


def test_sampling_on_the_device_against_the_host_at_qwens_vocabulary(capsys):
    from asyncrl.rollout.sampling import SamplingParams, sample_rows

    rows, vocab = 64, 151936
    torch.manual_seed(0)
    logits = torch.randn(rows, vocab, device="cuda", dtype=torch.bfloat16).float()
    uniforms = torch.rand(rows, dtype=torch.float64)
    params = SamplingParams(temperature=1.0, top_p=0.95, max_new_tokens=1)
    timings = {}
    for where in ("cuda", "cpu"):
        for _ in range(2):  # the second is timed (the first warms the kernels)
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            tokens, logp = sample_rows(logits if where == "cuda" else logits.cpu(), params, uniforms)
            tokens.tolist()
            timings[where] = time.perf_counter() - t0
        assert tokens.shape == (rows,) and bool(((tokens >= 0) & (tokens < vocab)).all())
    _line(
        capsys,
        f"sampling {rows} rows x vocab {vocab} (top_p 0.95)",
        {
            "device_ms": round(1e3 * timings["cuda"], 2),
            "host_ms": round(1e3 * timings["cpu"], 2),
            "host_over_device": round(timings["cpu"] / timings["cuda"], 1),
        },
    )


def test_trainer_tokens_per_second_and_mfu_on_a_qwen2_5_0_5b_shape_in_bf16(capsys):
    """Forward, backward and an AdamW step over fp32 masters, 4 rows of 4096 tokens a step; MFU counts 6 FLOP per
    parameter per token (the attention's own FLOPs aside). Anchor: prime-rl reports 11.9k tokens/s for Qwen3-0.6B
    on one H100."""
    from asyncrl.config import Config
    from asyncrl.trainer.update import build_optimizer, grads_to_clip

    model = _qwen(checkpointing=True)
    opt = build_optimizer(model.parameters(), Config().actor.optim)
    params = sum(p.numel() for p in model.parameters())
    ids = torch.randint(0, 151936, (4, 4096), device="cuda")

    def step() -> None:
        for row in ids:  # one micro-batch per row, as the token budget packs them
            _token_loss(model, row[None]).backward()
        torch.nn.utils.clip_grad_norm_(grads_to_clip(list(model.parameters()), opt), 1.0)
        opt.step()
        opt.zero_grad()

    step()  # warm-up
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(3):
        step()
    torch.cuda.synchronize()
    tok_s = 3 * ids.numel() / (time.perf_counter() - t0)
    name = torch.cuda.get_device_name()
    peak = next((v for k, v in PEAK_BF16.items() if k in name), None)
    mfu = None if peak is None else round(6 * params * tok_s / peak, 3)
    _line(
        capsys,
        "trainer, Qwen2.5-0.5B shape, bf16, checkpointing, 4 x 4096 tokens",
        {"tokens_s": round(tok_s), "mfu": mfu},
    )
    assert tok_s > 0


def test_fsdp2_in_bf16_on_one_gpu_takes_two_steps_and_resumes_from_its_sharded_checkpoint(tmp_path, capsys):
    """World size 1 on NCCL: fp32 shards (the masters) under a bf16 ``MixedPrecisionPolicy``, two AdamW steps, a
    ``torch.distributed.checkpoint`` save, and a fresh model loaded from it takes the same third step. Also the bytes
    it holds per parameter against the plan's 16 (fp32 shard + fp32 gradient + AdamW) divided by the ranks."""
    from asyncrl.comm.groups import find_free_port
    from asyncrl.config import Config, ModelConfig, TrainerConfig
    from asyncrl.sizing.memory import trainer_memory
    from asyncrl.sizing.shape import model_shape
    from asyncrl.trainer import fsdp

    store = torch.distributed.TCPStore("127.0.0.1", find_free_port(), 1, is_master=True)
    mesh = fsdp.init_mesh(store, 0, 1, 120.0, "nccl", "127.0.0.1")
    try:
        ids = torch.randint(0, 151936, (1, 512), device="cuda")

        def built():
            torch.cuda.empty_cache()
            base = torch.cuda.memory_allocated()
            model = _qwen(dtype=torch.float32)
            fsdp.shard(model, mesh, compute_dtype=torch.bfloat16)
            return model, torch.optim.AdamW(model.parameters(), lr=1e-4), base

        def step(model, opt) -> float:
            loss = _token_loss(model, ids)
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=False)  # the gradients stay allocated: the plan's peak holds them
            return float(loss)

        model, opt, base = built()
        losses = [step(model, opt), step(model, opt)]
        held = torch.cuda.memory_allocated() - base
        fsdp.save_sharded(tmp_path / "ckpt", model, opt, {})
        third = step(model, opt)
        del model, opt
        again, opt2, _ = built()
        fsdp.load_sharded(tmp_path / "ckpt", again, opt2, {})
        resumed = step(again, opt2)
    finally:
        fsdp.close_mesh()
    shape = model_shape(QWEN_05B)
    cfg = Config(model=ModelConfig(path=str(QWEN_05B), dtype="bfloat16"), trainer=TrainerConfig(strategy="fsdp2"))
    m = trainer_memory(cfg, shape, ranks=2)  # the plan's fsdp2 terms at 2 ranks, doubled: one rank holds it all
    planned = 2 * (m.params + m.grads + m.optimizer)
    _line(
        capsys,
        "FSDP2 bf16 over fp32 shards, world size 1, Qwen2.5-0.5B shape",
        {"losses": losses + [third], "resumed_third": resumed, "held_B_per_param": round(held / shape.params, 2)},
    )
    assert losses[1] < losses[0] and resumed == third  # it learns; the resume takes the same step, bit for bit
    assert abs(held - planned) <= 0.10 * planned
