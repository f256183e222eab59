"""The memory plan (asyncrl.sizing) against measured tensor bytes on the CPU, its arithmetic for a 7B model on
verl's 8 + 8 GPU layout, the check a run makes before any worker starts, and ``asyncrl plan --model``.

Measured: the bytes of every tensor a trainer rank holds after one update (parameters, gradients, fp32 masters,
AdamW state, the reference copy), built with the trainer's own ``build_optimizer`` / ``fsdp.shard``; and the bytes of
the tensors autograd saves in a forward (saved-tensor hooks, parameters left out), against the plan's terms.
"""

from __future__ import annotations

import copy
import shutil
from datetime import timedelta
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp
from transformers import AutoConfig, AutoModelForCausalLM

from asyncrl.cli import main
from asyncrl.config import OptimConfig, load_config
from asyncrl.config.resources import resolve_ranks
from asyncrl.losses import logprobs_from_logits
from asyncrl.models.presets import preset_config
from asyncrl.models.tokenizer import build_char_tokenizer
from asyncrl.sizing.check import MemoryPlanError, check_memory
from asyncrl.sizing.memory import GB, plan_memory, saved_activation_bytes, trainer_memory
from asyncrl.sizing.shape import model_shape, shape_of_config
from asyncrl.trainer.update import build_optimizer, grads_to_clip

FIXTURES = Path(__file__).parent / "fixtures" / "models"
QWEN7B = FIXTURES / "qwen2.5-7b"
SMOLLM2 = FIXTURES / "smollm2-135m"
TOK = build_char_tokenizer(["abcdefghijklmnopqrstuvwxyz0123456789 +-=*?."])
MODELS = ["tiny", "small", "smollm2-135m"]  # SmolLM2-135M: its published config.json, random weights (same bytes)
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def _hf_config(name: str):
    return AutoConfig.from_pretrained(str(SMOLLM2)) if name == "smollm2-135m" else preset_config(name, TOK)


def _model(hf, dtype: str) -> torch.nn.Module:
    """The real transformers model, its tensors allocated without the (slow) random initialisation: the bytes are
    what is measured, and they do not depend on the values (zeros everywhere, the rotary frequencies too)."""
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(hf)
    model = model.to_empty(device="cpu").to(DTYPES[dtype])
    model.tie_weights()  # to_empty gives the tied head a storage of its own
    with torch.no_grad():
        for t in [*model.parameters(), *model.buffers()]:
            t.zero_()
    return model


def _cfg(*overrides: str, model: Path = QWEN7B):
    """A config as ``asyncrl plan`` loads it: each section's own checks and the ranks (not today's cross-key refusal
    of FSDP2 with bf16)."""

    def checks(cfg) -> None:
        cfg.check_sections()
        resolve_ranks(cfg)

    return load_config(None, [f"model.path={model}", "data.train_files=[x.parquet]", *overrides], validate_fn=checks)


def _bytes(tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def _state_bytes(model, optimizer, ref) -> int:
    """Every tensor a rank holds after its update: weights, gradients, masters and their gradients, AdamW state."""
    params = list(model.parameters())
    masters = list(getattr(optimizer, "masters", []))
    local = [p.to_local() if hasattr(p, "to_local") else p for p in params]
    grads = [g.to_local() if hasattr(g, "to_local") else g for g in (p.grad for p in params + masters) if g is not None]
    state = [v.to_local() if hasattr(v, "to_local") else v for s in optimizer.state.values() for v in s.values()]
    state = [v for v in state if torch.is_tensor(v) and v.dim() > 0]  # the step counts are scalars
    return _bytes(local) + _bytes(grads) + _bytes(masters) + _bytes(state) + _bytes(ref.parameters())


def _one_update(model, optimizer) -> None:
    """A forward, a backward and an AdamW step as the trainer takes them; the gradients kept for the count."""
    ids = torch.randint(0, model.config.vocab_size, (1, 8))
    logits = model(input_ids=ids, use_cache=False).logits.float()
    (-logprobs_from_logits(logits, ids).mean()).backward()
    grads_to_clip([p for p in model.parameters()], optimizer)  # the fp32 masters' gradients in mixed precision
    optimizer.step()


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("name", MODELS)
def test_ddp_rank_state_bytes_are_the_plans_within_10_percent(name, dtype):
    hf = _hf_config(name)
    model = _model(hf, dtype)
    ref = copy.deepcopy(model).requires_grad_(False)
    optimizer = build_optimizer(list(model.parameters()), OptimConfig())
    _one_update(model, optimizer)
    measured = _state_bytes(model, optimizer, ref)
    plan = trainer_memory(_cfg(f"model.dtype={dtype}", "actor.use_kl_loss=true"), shape_of_config(hf), ranks=1)
    assert plan.strategy == "ddp" and plan.ref > 0
    assert abs(measured / plan.state - 1) < 0.10, (measured, plan.state)


def _fsdp_rank(rank: int, store_path: str, names: list[str], dtype: str, out: dict) -> None:
    from asyncrl.trainer import fsdp

    torch.set_num_threads(1)
    store = torch.distributed.FileStore(store_path, 2)
    mesh = fsdp.init_mesh(store, rank, 2, timedelta(seconds=120).total_seconds(), "gloo", "127.0.0.1")
    try:
        for name in names:
            model = _model(_hf_config(name), "float32")  # as the trainer: fp32 shards (the masters), compute in dtype
            fsdp.shard(model, mesh, compute_dtype=getattr(torch, dtype))
            optimizer = build_optimizer(list(model.parameters()), OptimConfig())
            _one_update(model, optimizer)
            out[name, rank] = _state_bytes(model, optimizer, torch.nn.Module())  # today's reference is a full copy
    finally:
        fsdp.close_mesh()


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_fsdp2_two_rank_state_bytes_are_the_plans_within_10_percent(dtype, tmp_path):
    """The tiny and small presets on two gloo ranks (one spawn for both). The reference is left out: today's is a
    full copy, the plan's fp32 shards."""
    names = ["tiny", "small"]
    out = mp.Manager().dict()
    mp.spawn(_fsdp_rank, args=(str(tmp_path / "store"), names, dtype, out), nprocs=2, join=True)
    for name in names:
        shape = shape_of_config(_hf_config(name))
        plan = trainer_memory(_cfg(f"model.dtype={dtype}", "trainer.strategy=fsdp2"), shape, ranks=2)
        assert plan.strategy == "fsdp2" and plan.masters == 0
        for rank in (0, 1):
            assert abs(out[name, rank] / plan.state - 1) < 0.10, (name, rank, out[name, rank], plan.state)


@pytest.mark.parametrize("checkpointing", [False, True])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("name", MODELS)
def test_saved_activations_are_the_plans_within_10_percent(name, dtype, checkpointing):
    """The forward's saved tensors (not the parameters) against the plan's; the logits' saved fp32 copy against
    tokens x vocab x 4. (The plan's peak adds, with checkpointing, one layer recomputed in the backward, and for the
    logits the transient compute-dtype logits and fp32 upcast: arithmetic, not measured here.)"""
    hf = _hf_config(name)
    shape = shape_of_config(hf)
    model = _model(hf, dtype).train()
    if checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    tokens = 128
    ids = torch.randint(0, shape.vocab, (1, tokens))
    layers, logits = {}, {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        key = t.untyped_storage().data_ptr()
        if key not in params:
            (logits if t.shape[-1] == shape.vocab else layers)[key] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = model(input_ids=ids, use_cache=False)
        logprobs_from_logits(out.logits.float() / 1.0, ids)
    b = DTYPES[dtype].itemsize
    want = saved_activation_bytes(shape, b, tokens, checkpointing)
    assert abs(sum(layers.values()) / want - 1) < 0.10, (sum(layers.values()), want)
    assert sum(logits.values()) == tokens * shape.vocab * 4


# ---- Qwen2.5-7B on verl's dapo_7b_math_fsdp2_8_8 layout: the model's arithmetic on a fixed config ----------------
VERL_8_8 = [
    "trainer.schedule=fully_async",
    "trainer.nnodes=1",
    "trainer.n_gpus_per_node=8",
    "rollout.nnodes=1",
    "rollout.n_gpus_per_node=8",
    "rollout.engine=vllm",
    "rollout.n=16",
    "data.max_prompt_length=2048",
    "rollout.response_length=8192",
    "rollout.max_model_len=10240",
    "rollout.gpu_memory_utilization=0.8",
    "actor.use_dynamic_bsz=true",
    "actor.ppo_max_token_len_per_gpu=20480",
]
SHARDED_BF16 = ["trainer.strategy=fsdp2", "model.dtype=bfloat16", "actor.gradient_checkpointing=true"]
TODAY = ["trainer.strategy=ddp", "model.dtype=float32", "actor.gradient_checkpointing=false"]


def test_qwen7b_config_counts_its_published_parameters():
    s = model_shape(QWEN7B)
    assert s.params == 7_615_616_512 and s.layers == 28 and not s.tied


def test_qwen7b_fits_verls_8_plus_8_layout_sharded_in_bf16():
    plan = plan_memory(_cfg(*VERL_8_8, *SHARDED_BF16), model_shape(QWEN7B), int(80 * GB))
    t, r = plan.trainer, plan.rollout
    assert t.ranks == 8 and t.tokens == 20480
    assert t.total <= 70 * GB
    # pinned: 16 B/param / 8 ranks = 15.2 GB, logits 31.1, activations 9.3, sync buffers 2 x the 1.09 GB embedding
    assert round(t.total / GB, 1) == 62.1
    assert round((t.params + t.grads + t.optimizer) / GB, 1) == 15.2
    assert r.weights + r.activations + r.cuda_graphs + r.kv_cache <= r.budget == int(0.8 * 80 * GB)
    assert r.kv_cache >= 10240 * plan.kv_per_token and round(r.kv_cache / GB, 1) == 46.4
    assert r.total <= 80 * GB and plan.problems() == []


def test_qwen7b_is_refused_under_todays_defaults_in_one_line_naming_the_role():
    cfg = _cfg(*VERL_8_8, *TODAY)
    with pytest.raises(MemoryPlanError) as e:
        check_memory(cfg, device_bytes=int(80 * GB))
    msg = str(e.value)
    assert "\n" not in msg and "trainer rank: 407.5 GB of 80 GB (activations 242.9 GB, optimizer 60.9 GB" in msg


def test_the_check_runs_only_for_runs_with_gpus():
    cfg = _cfg("trainer.schedule=one_step_off", *TODAY)  # no n_gpus_per_node: CPU ranks, nothing to check
    assert check_memory(cfg, device_bytes=int(1 * GB)) is None
    small = _cfg(*VERL_8_8, *SHARDED_BF16, model=SMOLLM2)
    assert check_memory(small, device_bytes=int(80 * GB)).fits()


def test_a_rollout_gpu_too_small_for_the_weights_is_refused_naming_the_kv_cache():
    cfg = _cfg(*VERL_8_8, *SHARDED_BF16, "rollout.gpu_memory_utilization=0.2")
    with pytest.raises(MemoryPlanError, match=r"rollout rank: vLLM's KV cache gets 0.0 GB of .* 16.0 GB"):
        check_memory(cfg, device_bytes=int(80 * GB))


def test_plan_command_prints_each_layouts_memory_from_a_config_only_directory(tmp_path, capsys):
    model = tmp_path / "qwen7b"
    model.mkdir()
    shutil.copy(QWEN7B / "config.json", model / "config.json")
    main(["plan", "--model", str(model), "--gpus", "16", "--nodes", "2", "--gpu-mem", "80", *VERL_8_8, *SHARDED_BF16])
    out = capsys.readouterr().out
    assert "| fully_async (8 gen / 8 train) | 62.1 | 67.3 | 46.4 | yes |" in out
    assert "| sync (16) | 116.3 | - | - | NO: trainer rank: 116.3 GB of 80 GB" in out
    assert "logits           31.1 GB" in out


def test_plan_command_shows_the_memory_of_the_time_models_ranked_settings(tmp_path, capsys):
    from tests.test_perf import fixed_cost

    cost = tmp_path / "cost.json"
    fixed_cost(0.1, 1.0).save(cost)
    args = ["plan", "--cost", str(cost), "--gpus", "16", "--nodes", "2", "--top", "3", "--steps", "6"]
    main([*args, "--model", str(QWEN7B), "--gpu-mem", "80", *VERL_8_8, *SHARDED_BF16])
    out = capsys.readouterr().out
    ranked = out.split("memory per GPU")[0]
    memory = out.split("memory per GPU")[1]
    rows = [line for line in memory.splitlines() if line.startswith("| ")][2:]  # past the header and its rule
    assert "| 1 |" in ranked and len(rows) == 3 and rows[0].startswith("| 1. fully_async (")


@pytest.mark.parametrize(("config", "message"), [(None, "no config.json"), ("{not json", "does not load")])
def test_plan_command_names_a_model_directory_it_cannot_read_in_one_line(config, message, tmp_path, capsys):
    if config is not None:
        (tmp_path / "config.json").write_text(config)
    with pytest.raises(SystemExit) as e:
        main(["plan", "--model", str(tmp_path), "--gpus", "16", "--gpu-mem", "80"])
    err = capsys.readouterr().err
    assert e.value.code == 2 and message in err and str(tmp_path) in err and "Traceback" not in err


def test_a_run_that_cannot_fit_its_declared_gpus_stops_before_any_worker_starts(tmp_path):
    """Through ``run_training``: the GPUs' size from ``trainer.gpu_memory_gb`` (this machine has none); the one line
    comes before Ray or any role is started (the model directory holds only a config.json: loading it would fail)."""
    from asyncrl.config import load_config
    from asyncrl.schedules import run_training

    over = [f"model.path={QWEN7B}", "data.train_files=[t.parquet]", *VERL_8_8, *TODAY, "trainer.gpu_memory_gb=80"]
    over += [f"trainer.default_local_dir={tmp_path / 'run'}"]
    with pytest.raises(MemoryPlanError, match=r"^memory plan: trainer rank: 407.5 GB of 80 GB"):
        run_training(load_config(None, over))
    assert not (tmp_path / "run").exists()  # nothing was started, nothing written
