"""The memory plan: the bytes one GPU of each role holds at its peak, from the config and the model's shape alone.

The trainer it describes, and its check against measured bytes: docs/gpu.md, "A 7B model on 2 x 8 GPUs". Each term
is a field with its ``doc`` (``term``). Null config keys resolve as on a GPU (this plan is for GPUs):
``actor.gradient_checkpointing`` on, ``rollout.dtype`` bf16, ``rollout.gpu_memory_utilization`` 0.8 on a rollout GPU
and 0.4 beside the trainer (sync).
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields

from asyncrl.config import Config
from asyncrl.config.rollout import engine_dtype, vllm_gpu_share
from asyncrl.sizing.shape import ModelShape

GB = 1e9  # what --gpu-mem and the messages count in (an "80 GB" GPU holds 80e9 bytes or more)
MIB = 2**20
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
RUNTIME_BYTES = 2**30  # CUDA context, cuBLAS workspace and NCCL communicators: not tensors, not measured here
VLLM_GRAPH_BYTES = 2**30  # vLLM's CUDA graphs (enforce_eager off): its logs report well under 1 GiB for 7B models
VLLM_DEFAULT_BATCHED_TOKENS = 8192  # vLLM's max_num_batched_tokens default with chunked prefill on a GPU


def term(doc: str) -> int:
    """A term of a plan: bytes, with the one line that says where they come from."""
    return field(default=0, metadata={"doc": doc})


class Terms:
    """A plan's terms: the dataclass fields with bytes, each with its ``doc``."""

    def terms(self) -> list[tuple[str, int, str]]:
        return [(f.name, getattr(self, f.name), f.metadata["doc"]) for f in fields(self) if "doc" in f.metadata]

    @property
    def total(self) -> int:
        return sum(b for _, b, _ in self.terms())

    def largest(self, k: int = 3) -> str:
        """The ``k`` largest terms, as an error message names them."""
        top = sorted((t for t in self.terms() if t[1] > 0), key=lambda t: -t[1])[:k]
        return ", ".join(f"{name.replace('_', ' ')} {b / GB:.1f} GB" for name, b, _ in top)


@dataclass
class TrainerMemory(Terms):
    """One trainer rank (one GPU) at its peak, the backward of one micro-batch of its update."""

    strategy: str = "ddp"
    ranks: int = 1
    tokens: int = 0  # tokens of one micro-batch
    params: int = term(
        "ddp: every weight in model.dtype; fsdp2: this rank's fp32 shard of every weight (they are the masters), "
        "0 with actor.fsdp_config.param_offload"
    )
    masters: int = term("ddp with model.dtype below fp32: an fp32 copy of every weight (MasterWeightsAdamW)")
    grads: int = term(
        "fp32 gradients at the optimizer step (ddp: the masters', the bf16 ones freed one by one as they are cast; "
        "fsdp2: reduce-scattered shards in fp32), 0 with param_offload (they follow the shards to the host)"
    )
    optimizer: int = term(
        "AdamW's exp_avg and exp_avg_sq, fp32, 8 B a parameter (fsdp2: sharded; 0 with optimizer_offload)"
    )
    gathered: int = term(
        "fsdp2: the root unit (embeddings, norm, head) gathered in the compute dtype for the whole pass, plus one "
        "decoder layer gathered and the next one prefetched"
    )
    ref: int = term(
        "the reference (actor.use_kl_loss or dpo): ddp a full copy in model.dtype, fsdp2 shards in model.dtype, 0 with "
        "ref.fsdp_config.param_offload"
    )
    prox: int = term(
        "the proximal copy (fully_async with compute_prox_log_prob): as the reference, offloaded with the actor's "
        "param_offload"
    )
    activations: int = term(
        "tensors autograd keeps for one micro-batch: every layer's (checkpointing off), or every layer's input plus "
        "one layer recomputed in the backward (on); attention linear in the tokens (flash/SDPA: q, k, v, out, lse)"
    )
    logits: int = term(
        "the micro-batch's logits, tokens x vocab: in the compute dtype, their fp32 upcast, and the fp32 "
        "temperature-scaled copy logsumexp keeps for the backward (whose fp32 gradient takes the upcast's place)"
    )
    sync_buffers: int = term(
        "the weight sync's sender side: 2 buckets of weight_sync.bucket_mb or the largest parameter (one filling, "
        "one in flight)"
    )
    engine: int = term(
        "sync only, the colocated engine: vLLM's gpu_memory_utilization share, or the built-in engine's KV cache "
        "(plus, under fsdp2, the unsharded serving copy in rollout.dtype it decodes from)"
    )
    runtime: int = term("CUDA context, cuBLAS workspace and NCCL communicators: 1 GiB, not a tensor (not measured)")

    @property
    def state(self) -> int:
        """The bytes measured against tensors after one update: weights, gradients, masters, optimizer, copies."""
        return self.params + self.masters + self.grads + self.optimizer + self.ref + self.prox


@dataclass
class RolloutMemory(Terms):
    """One rollout worker (one GPU)."""

    engine: str = "vllm"
    budget: int = 0  # vLLM: gpu_memory_utilization x the device's bytes (weights + activations + graphs + KV)
    weights: int = term("every weight in rollout.dtype (null: bf16)")
    activations: int = term(
        "vLLM's profiled forward: max_num_batched_tokens tokens through one layer (hidden x 4 + intermediate x 3) "
        "plus max_num_seqs rows of fp32 logits; the built-in engine: max_batch_size rows of fp32 logits"
    )
    cuda_graphs: int = term("vLLM's captured CUDA graphs with enforce_eager off: 1 GiB (vLLM logs 0.3-1 GiB at 7B)")
    kv_cache: int = term(
        "vLLM: what remains of gpu_memory_utilization x device after the terms above; the built-in engine: "
        "max_batch_size rows of max_prompt_length + response_length tokens, K and V of every layer"
    )
    receiver: int = term(
        "the weight receiver: at most 2 buckets of weight_sync.bucket_mb or the largest parameter, each applied as it "
        "arrives (measured on the CPU: tests/test_weights_receiver_memory.py)"
    )
    runtime: int = term("CUDA context and NCCL communicators: 1 GiB, not a tensor (not measured)")


@dataclass
class MemoryPlan:
    """Every role's bytes per GPU for one layout, and the device they must fit."""

    trainer: TrainerMemory
    rollout: RolloutMemory | None  # None: sync (the engine is in the trainer's terms)
    device_bytes: int | None  # None: not known (the plan is then shown, not checked)
    kv_per_token: int = 0  # the rollout engine's KV bytes per token
    max_model_len: int = 0  # the longest sequence the rollout engine must hold

    def problems(self) -> list[str]:
        """One line per role that does not fit: ``trainer rank: 143.2 GB of 80 GB (fp32 masters 30.5 GB, ...)``."""
        d, t, r = self.device_bytes, self.trainer, self.rollout
        if d is None:
            return []
        out = [f"trainer rank: {t.total / GB:.1f} GB of {d / GB:.0f} GB ({t.largest()})"] if t.total > d else []
        if r is not None and r.engine == "vllm" and r.kv_cache < (need := self.max_model_len * self.kv_per_token):
            out.append(
                f"rollout rank: vLLM's KV cache gets {r.kv_cache / GB:.1f} GB of rollout.gpu_memory_utilization "
                f"x {d / GB:.0f} GB = {r.budget / GB:.1f} GB, less than one rollout.max_model_len "
                f"({self.max_model_len} tokens: {need / GB:.2f} GB) ({r.largest()})"
            )
        if r is not None and r.total > d:
            out.append(f"rollout rank: {r.total / GB:.1f} GB of {d / GB:.0f} GB ({r.largest()})")
        return out

    def fits(self) -> bool:
        return not self.problems()


def micro_batch_tokens(cfg: Config) -> int:
    """Tokens of one trainer micro-batch: ``actor.ppo_max_token_len_per_gpu`` with ``use_dynamic_bsz``, else
    ``ppo_micro_batch_size`` samples of prompt + response (an upper bound: a shared prefix is counted per sample)."""
    a = cfg.actor
    if a.use_dynamic_bsz:
        return a.ppo_max_token_len_per_gpu
    return a.ppo_micro_batch_size * (cfg.data.max_prompt_length + cfg.rollout.response_length)


def layer_activation_bytes(s: ModelShape, b: int) -> int:
    """Bytes autograd keeps per token for one decoder layer (Qwen2/Llama in transformers, compute dtype of ``b``
    bytes; measured with saved-tensor hooks): each RMSNorm its fp32 input and its normalised output (4 + b per
    hidden unit); the input of q/k/v and of the MLP, q after RoPE and the attention's output, which is o_proj's input
    (b x hidden each); k and v (b x kv_dim each); the MLP's gate, SiLU(gate), up and their product (b x
    intermediate each); the attention's fp32 log-sum-exp per head."""
    h, i = s.hidden, s.intermediate
    return 2 * (4 + b) * h + b * (4 * h + 2 * s.kv_dim + 4 * i) + 4 * s.heads


def saved_activation_bytes(s: ModelShape, b: int, tokens: int, checkpointing: bool) -> int:
    """What a forward of ``tokens`` tokens leaves for the backward: every layer's tensors (or, with checkpointing,
    every layer's input, b x hidden), plus the final norm's and the head's input."""
    outside = (4 + b) * s.hidden + b * s.hidden
    per_layer = b * s.hidden if checkpointing else layer_activation_bytes(s, b)
    return tokens * (s.layers * per_layer + outside)


def activation_bytes(s: ModelShape, b: int, tokens: int, checkpointing: bool) -> int:
    """Autograd's tensors for ``tokens`` tokens at the backward's peak: what the forward saved, and with
    checkpointing one layer's full set while the backward recomputes it."""
    recompute = tokens * layer_activation_bytes(s, b) if checkpointing else 0
    return saved_activation_bytes(s, b, tokens, checkpointing) + recompute


def logits_bytes(s: ModelShape, b: int, tokens: int) -> int:
    """``tokens`` x vocab logits: compute dtype + fp32 upcast + fp32 scaled copy (in fp32 the upcast is the logits
    themselves, and the gradient adds one fp32 copy)."""
    return tokens * s.vocab * (b + 4 + 4)


def rollout_dtype_bytes(cfg: Config) -> int:
    return DTYPE_BYTES[engine_dtype(cfg.rollout.dtype, cfg.model.dtype, on_gpu=True)]


def _bucket_bytes(cfg: Config, s: ModelShape) -> int:
    """Two buckets (one filling or applied, one in flight), each of ``weight_sync.bucket_mb`` or the largest parameter
    in the dtype it is sent in (a parameter is never split across buckets: Qwen2.5-7B's embedding is 1.09 GB in
    bf16)."""
    return 2 * max(int(cfg.weight_sync.bucket_mb * MIB), s.largest * DTYPE_BYTES[cfg.model.dtype])


def trainer_memory(cfg: Config, s: ModelShape, ranks: int, engine: int = 0) -> TrainerMemory:
    """A trainer rank of ``ranks`` data-parallel ranks under ``trainer.strategy`` (``engine``: the colocated
    engine's bytes, sync only)."""
    strategy = cfg.trainer.strategy if ranks > 1 else "ddp"  # one rank: nothing to shard (the trainer runs DDP's path)
    P, b = s.params, DTYPE_BYTES[cfg.model.dtype]
    fs = cfg.actor.fsdp_config
    ckpt = cfg.actor.gradient_checkpointing is not False  # null: on, as on a GPU
    uses_ref = cfg.actor.use_kl_loss or cfg.algorithm.name == "dpo"
    uses_prox = cfg.trainer.schedule == "fully_async" and cfg.async_training.compute_prox_log_prob
    tokens = micro_batch_tokens(cfg)
    m = TrainerMemory(strategy=strategy, ranks=ranks, tokens=tokens)
    if strategy == "ddp":
        m.params, m.masters, m.grads, m.optimizer = P * b, (P * 4 if b < 4 else 0), P * 4, P * 8
        m.ref = P * b if uses_ref else 0
        m.prox = P * b if uses_prox else 0
    else:
        shard = -(-P // ranks)
        m.params = 0 if fs.param_offload else shard * 4
        m.grads = 0 if fs.param_offload else shard * 4
        m.optimizer = 0 if fs.optimizer_offload else shard * 8
        m.gathered = b * (s.root_params + 2 * s.layer_params)
        m.ref = shard * b if uses_ref and not cfg.ref.fsdp_config.param_offload else 0
        m.prox = shard * b if uses_prox and not fs.param_offload else 0
    m.activations = activation_bytes(s, b, tokens, ckpt)
    m.logits = logits_bytes(s, b, tokens)
    m.sync_buffers = _bucket_bytes(cfg, s) if cfg.trainer.schedule != "sync" else 0
    m.engine = engine
    m.runtime = RUNTIME_BYTES
    return m


def rollout_memory(cfg: Config, s: ModelShape, device_bytes: int | None, shared: bool = False) -> RolloutMemory:
    """A rollout engine's GPU (``shared``: beside the trainer, sync). vLLM takes ``gpu_memory_utilization`` of the
    device for weights, activations, graphs and KV cache (its KV cache is what remains), each of its
    ``tensor_model_parallel_size`` GPUs a shard of the weights; the built-in engine allocates its KV for
    ``max_batch_size`` rows."""
    r, b = cfg.rollout, rollout_dtype_bytes(cfg)
    m = RolloutMemory(engine=r.engine)
    m.weights = s.params * b // r.tensor_model_parallel_size
    m.receiver = 0 if shared else _bucket_bytes(cfg, s)
    m.runtime = 0 if shared else RUNTIME_BYTES
    if r.engine == "vllm":
        tokens = r.max_num_batched_tokens or VLLM_DEFAULT_BATCHED_TOKENS
        m.activations = tokens * b * (4 * s.hidden + 3 * s.intermediate) + r.max_num_seqs * s.vocab * 4
        m.cuda_graphs = 0 if r.enforce_eager else VLLM_GRAPH_BYTES
        # rollout.gpu_memory_utilization, null resolved as on a GPU (of its own, or beside the trainer)
        share = vllm_gpu_share(r.gpu_memory_utilization, colocated=shared)
        if device_bytes is not None:  # else budget and KV cache stay 0: not known
            m.budget = int(share * device_bytes)
            m.kv_cache = max(0, m.budget - m.weights - m.activations - m.cuda_graphs)
    else:
        rows = r.max_batch_size
        m.activations = rows * s.vocab * 4
        m.kv_cache = rows * (cfg.data.max_prompt_length + r.response_length) * s.kv_bytes_per_token(b)
    return m


def plan_memory(
    cfg: Config,
    s: ModelShape,
    device_bytes: int | None,
    trainer_ranks: int | None = None,
) -> MemoryPlan:
    """Each role's bytes per GPU for ``cfg`` on ``trainer_ranks`` trainer GPUs (default ``trainer.num_workers``);
    the rollout pool (any schedule but sync) has one engine per ``rollout.tensor_model_parallel_size`` GPUs."""
    ranks = trainer_ranks or cfg.trainer.num_workers
    kv = s.kv_bytes_per_token(rollout_dtype_bytes(cfg))
    model_len = cfg.rollout.model_len(cfg.data.max_prompt_length)
    if cfg.trainer.schedule != "sync":
        rollout = rollout_memory(cfg, s, device_bytes)
        return MemoryPlan(trainer_memory(cfg, s, ranks), rollout, device_bytes, kv, model_len)
    eng = rollout_memory(cfg, s, device_bytes, shared=True)
    if cfg.rollout.engine == "vllm":
        extra = eng.budget
    else:
        serving = eng.weights if cfg.trainer.strategy == "fsdp2" and ranks > 1 else 0
        extra = serving + eng.kv_cache + eng.activations
    return MemoryPlan(trainer_memory(cfg, s, ranks, extra), None, device_bytes, kv, model_len)
