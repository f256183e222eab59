"""The config tree: one typed dataclass per section, one default per knob.

Two choices shape a run: ``algorithm.name`` (what is learned from finished samples: grpo | ppo | distill) and
``trainer.schedule`` (when things happen: sync | one_step_off | two_step_off | fully_async). Every algorithm runs on
every schedule. Leaf names follow verl's where the concept is the same (``data.train_batch_size``, ``rollout.n``,
``actor.ppo_mini_batch_size``, ``algorithm.adv_estimator``, ...) without verl's ``actor_rollout_ref.`` nesting.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from omegaconf import MISSING

ALGORITHMS = ("grpo", "ppo", "distill", "dpo")
SCHEDULES = ("sync", "one_step_off", "two_step_off", "fully_async")
BACKENDS = ("ray", "in_process")


@dataclass
class DataConfig:
    train_files: list[str] = field(default_factory=list)  # parquet/jsonl in verl's schema
    val_files: list[str] = field(default_factory=list)  # held-out rows for val/accuracy (empty: no evaluation)
    train_batch_size: int = 16  # prompts per training step (each gets rollout.n responses)
    val_batch_size: int = 512  # prompts per eval generation call
    val_max_samples: int = -1  # evaluate on at most this many held-out prompts (-1 = all)
    max_prompt_length: int = 256  # tokens
    overlong_prompts: str = "error"  # error | filter
    shuffle: bool = True  # a new order of the training rows every epoch (seeded by trainer.seed)


@dataclass
class ModelConfig:
    path: str = MISSING  # a local Hugging Face causal-LM directory
    dtype: str = "float32"  # float32 | bfloat16 | float16: the trainer's and engines' weights
    lora_rank: int = 0  # > 0: the actor trains a LoRA adapter of this rank (peft); only it trains and syncs
    lora_alpha: float = 16.0  # LoRA scaling numerator (the adapter's output is scaled by alpha / rank)
    target_modules: Any = "all-linear"  # "all-linear" or a list of module names (q_proj, v_proj, ...)
    lora_adapter_path: str | None = None  # start from this peft adapter directory (its rank must be lora_rank)
    # config changes for the policy in trainer AND rollout: attn_implementation, rope_scaling, any config attribute
    override_config: dict[str, Any] = field(default_factory=dict)


@dataclass
class TraceConfig:
    """``rollout.trace``: a few samples of every step in the run directory (``asyncrl trace RUN_DIR --step N``)."""

    enable: bool = False
    max_samples_per_step: int = 8  # verl's max_samples_per_step_per_worker, per step of the trainer here
    token2text: bool = False  # also each response token's own text


@dataclass
class SkipConfig:
    """``rollout.skip``: dump each step's generated batch; a later run with the same generation setup reuses it."""

    enable: bool = False
    dump_dir: str = "runs/rollout_dump"
    action: str = "cache"  # cache (reuse a step's own dump, else generate and dump) | repeat (else the latest dump)


@dataclass
class AgentConfig:
    """``rollout.agent``: which agent loop rolls out a row whose ``agent_name`` column is empty or absent."""

    default_agent_loop: str = "single_turn_agent"  # single_turn_agent | tool_agent (asyncrl.rollout.agent.loop)


@dataclass
class MultiTurnConfig:
    """``rollout.multi_turn``: the tool agent's limits and tools (verl's names). The whole response, tool outputs
    included, stays within ``rollout.response_length`` tokens."""

    max_assistant_turns: int | None = None  # null: bounded only by rollout.response_length
    max_tool_response_length: int = 256  # characters of one tool output kept (cut per tool_response_truncate_side)
    tool_response_truncate_side: str = "middle"  # left (keep the start) | middle (both ends) | right (the end)
    tools: list[str] = field(default_factory=list)  # calc | python | package.module:ClassName (a Tool subclass)
    tool_timeout_s: float = 10.0  # wall-clock deadline of one tool call; past it the model gets an error message
    format: str = "hermes"  # tool calls as <tool_call>{"name": ..., "arguments": {...}}</tool_call>


@dataclass
class RolloutConfig:
    engine: str = "builtin"  # builtin (our decode loop) | vllm (vLLM in the rollout worker; the `vllm` extra)
    quantization: str | None = None  # null | fp8: weights synced as float8 e4m3 with 128x128 block scales
    trace: TraceConfig = field(default_factory=TraceConfig)
    skip: SkipConfig = field(default_factory=SkipConfig)
    agent: AgentConfig = field(default_factory=AgentConfig)
    multi_turn: MultiTurnConfig = field(default_factory=MultiTurnConfig)
    n: int = 8  # responses per prompt (the GRPO group size)
    temperature: float = 1.0  # sampling temperature of training rollouts (behaviour log-probs are of this)
    top_p: float = 1.0  # nucleus sampling (1.0 = off)
    top_k: int = 0  # 0 = off
    response_length: int = 32  # max new tokens per response
    max_batch_size: int = 256  # sequences decoded at once
    enable_prefix_caching: bool = True  # identical prompts (a group) prefilled once; vLLM: its prefix cache
    max_num_seqs: int = 256  # vllm: sequences scheduled at once
    max_model_len: int | None = None  # vllm: prompt + response tokens; null = data.max_prompt_length + response_length
    enforce_eager: bool = True  # vllm: no graph capture / compilation
    gpu_memory_utilization: float = 0.05  # vllm: the KV cache's share of device memory (on CPU: of the machine's RAM)
    val_temperature: float = 0.0  # 0 = greedy held-out evaluation
    num_workers: int = 1  # rollout workers in the rollout pool (modes with a separate rollout pool)
    cpus_per_worker: float = 1.0  # CPUs per rollout worker; its torch threads = this, rounded down
    generate_timeout_s: float = 1800.0  # a rollout worker's generate call past this is hung: replaced (Ray, a pool)


@dataclass
class OptimConfig:
    lr: float = 1e-5  # peak learning rate (after lr_warmup_steps)
    weight_decay: float = 0.0  # AdamW decoupled weight decay
    betas: list[float] = field(default_factory=lambda: [0.9, 0.999])  # AdamW (beta1, beta2)
    lr_warmup_steps: int = 0  # linear warm-up, in optimizer steps
    grad_clip: float = 1.0  # max global grad norm (<= 0 disables)


@dataclass
class ActorConfig:
    optim: OptimConfig = field(default_factory=OptimConfig)
    ppo_mini_batch_size: int = 16  # prompts per optimizer step (x rollout.n samples), as in verl
    ppo_micro_batch_size: int = 64  # samples per forward/backward (gradient accumulation); memory only
    ppo_epochs: int = 1  # passes over each batch
    clip_ratio: float = 0.2  # PPO ratio clip epsilon (both sides unless _low/_high are set)
    clip_ratio_low: float | None = None  # defaults to clip_ratio
    clip_ratio_high: float | None = None  # defaults to clip_ratio
    clip_ratio_c: float | None = None  # dual-clip bound for negative advantages (off when null)
    entropy_coeff: float = 0.0  # weight of the entropy bonus in the actor loss
    loss_agg_mode: str = "token-mean"  # token-mean | seq-mean-token-sum | seq-mean-token-mean
    use_kl_loss: bool = False  # a KL penalty to the reference policy in the actor loss (needs the ref pass)
    kl_loss_coef: float = 0.001  # weight of that KL term
    kl_loss_type: str = "low_var_kl"  # k1 | k2 | k3 | low_var_kl | kl | mse
    use_rollout_log_probs: bool = False  # true: the rollout's behaviour log-probs are the PPO old policy
    skip_zero_adv_rows: bool = True  # rows with all-zero advantages skip forward/backward (same gradient, less work)
    shared_prefix: bool = True  # a group's responses packed behind one copy of its prompt (same gradient, less work)
    use_dynamic_bsz: bool = False  # micro-batches by token budget (packed, no padding) instead of by sample count
    ppo_max_token_len_per_gpu: int = 16384  # use_dynamic_bsz: real tokens per forward/backward (and log-prob pass)


@dataclass
class RolloutCorrectionConfig:
    rollout_is: str | None = None  # null (off; token under rollout.quantization=fp8) | disabled | token | sequence
    rollout_is_threshold: float = 2.0  # importance weights are truncated at this


@dataclass
class AlgorithmConfig:
    name: str = "grpo"  # grpo | ppo (critic + GAE) | distill (on-policy distillation from a teacher) | dpo (online)
    adv_estimator: str | None = None  # verl's name; null = the algorithm's own (grpo: grpo, ppo: gae)
    norm_adv_by_std_in_grpo: bool = True  # GRPO: divide by the group's reward std (false: centre only, as Dr. GRPO)
    gamma: float = 1.0  # gae: discount per response token
    lam: float = 1.0  # gae: lambda (bias/variance trade-off of the advantage estimate)
    rollout_correction: RolloutCorrectionConfig = field(default_factory=RolloutCorrectionConfig)


@dataclass
class GenRMConfig:
    """``reward.genrm``: a judge LLM on an OpenAI-compatible completions server (asyncrl serve-teacher, vllm serve);
    the reward is its probability of ``positive`` over ``negative`` as the next token (asyncrl.rewards.genrm)."""

    url: str | None = None  # e.g. http://127.0.0.1:8000; implies the reward loop
    prompt_template: str = (
        "Question: {question}\nReference answer: {ground_truth}\nResponse: {solution_str}\n"
        "Is the response correct? Answer yes or no: "
    )
    positive: str = "yes"  # the verdict word whose probability is the reward
    negative: str = "no"  # the other verdict word
    top_logprobs: int = 20  # candidates of the verdict token the server returns


@dataclass
class RewardConfig:
    custom_function: str | None = None  # "path/to/file.py:fn" with verl's signature; null = built-in registry
    binarize: bool = False  # reward 1.0 only for a full score (reasoning-gym scorers give partial credit), else 0.0
    async_loop: bool = False  # score each sample on a background loop as it finishes, while generation goes on
    max_concurrency: int = 8  # samples scored at once by the loop
    timeout_s: float = 60.0  # per sample; a slower reward fails that sample
    remote_url: str | None = None  # a reward service (POST verl's fields as JSON, reply a score); implies the loop
    remote_max_retries: int = 3  # also the generative reward model's
    remote_backoff_s: float = 0.5  # first retry's wait, seconds; doubles each retry
    genrm: GenRMConfig = field(default_factory=GenRMConfig)


@dataclass
class TrainerConfig:
    schedule: str = "sync"  # sync | one_step_off | two_step_off | fully_async (asyncrl/schedules/)
    backend: str = "ray"  # ray (roles are Ray actors) | in_process (the same workers in this process, no Ray)
    total_training_steps: int = 10  # trainer steps (optimizer updates per step: ppo_epochs x mini-batches)
    default_local_dir: str = "runs/default"  # the run directory: metrics, checkpoints, final model
    save_freq: int = 5  # steps between checkpoints (<= 0: only the final one)
    test_freq: int = 5  # steps between held-out evaluations (<= 0: only before and after)
    val_before_train: bool = True  # evaluate before the first step (logged as step 0)
    resume_mode: str = "auto"  # auto | disable | a checkpoint directory
    max_checkpoints_to_keep: int = 2  # older checkpoints are deleted
    seed: int = 1  # data order, initialisation and every generation seed derive from it
    logger: list[str] = field(default_factory=lambda: ["console", "jsonl", "tensorboard"])  # + prometheus
    prometheus_port: int | None = None  # /metrics port with logger prometheus (null or 0: a free port)
    cpus_per_worker: float = 2.0  # CPUs of each trainer worker (rank); torch threads = this, rounded down
    num_workers: int = 1  # data-parallel trainer ranks (verl's trainer.n_gpus_per_node): each a share of the batch
    strategy: str = "ddp"  # with num_workers > 1: ddp (weights replicated) | fsdp2 (sharded; trainer.backend=ray)
    critic_warmup: int = 0  # ppo: steps that update only the critic before the actor starts learning
    record_consumed: bool = False  # each step's consumed samples in RUN_DIR/consumed/ (asyncrl replay RUN_DIR)
    role_start_timeout_s: float = 600.0  # how long a role may take to start (load its model) before the run fails
    call_timeout_s: float = 7200.0  # a call to a worker (update, log-probs, checkpoint...) past this: hung, an error
    max_worker_restarts: int = 3  # rollout workers / the Rollouter replaced after dying or hanging (Ray); then stop


@dataclass
class SyncConfig:
    bucket_mb: float = 64.0  # MiB per flat broadcast bucket
    verify: bool = False  # CRC32 per bucket, checked by every rollout worker
    timeout_s: float = 60.0  # a weight sync that takes longer raises, naming the step and the worker


@dataclass
class AsyncTrainingConfig:
    """``fully_async`` only (verl's ``async_training`` section); see asyncrl/streaming/staleness.py for the bound."""

    staleness_threshold: float = 0.0  # extra groups in flight, as a fraction of one sync window
    trigger_parameter_sync_step: int = 1  # trainer steps per weight sync (= per version)
    require_batches: int = 1  # ppo_mini_batch_size groups per trainer step (one optimizer step each)
    drop_policy: str = "backpressure"  # queue full: backpressure (the rollouter waits) | oldest (drop, counted)
    max_queue_size: int | None = None  # groups; null = the staleness budget (never fills while synced)
    partial_rollout: bool = True  # at a sync, interrupt in-flight generations and resume them with the new weights
    compute_prox_log_prob: bool = False  # decoupled PPO: old = the weights at the start of the sync window
    max_inflight_groups: int | None = None  # groups generated at once; null = rollout.max_batch_size // rollout.n
    get_batch_timeout_s: float = 600.0  # the trainer's longest wait for one step's groups before the run fails
    pause_timeout_s: float = 600.0  # the longest wait for the Rollouter to park for a weight sync


@dataclass
class TeacherConfig:
    """``distill`` only: the teacher server (vLLM's /v1/completions with prompt_logprobs)."""

    # a running server (ours, or `vllm serve`); null = start `asyncrl serve-teacher` on teacher.model_path
    url: str | None = None
    model_path: str | None = None  # the teacher's HF directory, for the server started here
    top_k: int = 16  # teacher log-probs per position
    max_in_flight: int = 16  # concurrent requests (one sequence each; the server batches them)
    timeout_s: float = 60.0  # per connect / per wait for reply bytes
    max_retries: int = 3  # retries of a failed request (connection errors, 5xx, 408, 429), with back-off
    backoff_s: float = 0.5  # first retry delay; doubles each retry
    server_max_batch: int = 64  # sequences per teacher forward pass (the server started here)
    server_threads: int = 1  # torch threads of the server started here
    startup_timeout_s: float = 120.0  # how long to wait for the started server to answer /health
    max_restarts: int = 3  # the server started here is restarted (same port) when it dies, this often; then stop
    check_tokenizer: str = "auto"  # auto | fingerprint | probe: how the shared vocabulary is checked at start


@dataclass
class DpoConfig:
    """``dpo`` only (online DPO): pairs from each prompt's samples ranked by reward, fitted against a reference."""

    beta: float = 0.1  # TRL/verl's beta: the strength of the implicit KL to the reference
    loss_type: str = "sigmoid"  # sigmoid (DPO) | ipo (on per-token mean log-ratios, as TRL's ipo)
    ref_update_freq: int = 0  # steps between copies of the actor into the reference (0: frozen for the run)


@dataclass
class DistillConfig:
    """``distill`` only: the loss between teacher p and student q on the student's responses (GKD)."""

    loss: str = "forward_kl"  # forward_kl (top-k KL(p||q)) | jsd (generalised JSD with beta) | reverse_kl (sampled)
    beta: float = 0.5  # jsd: weight of the teacher side (0 = forward KL, 1 = reverse KL)
    lmbda: float = 1.0  # fraction of steps trained on student-generated responses; the rest on the dataset's answers
    tail: str = "bucket"  # top-k losses: the teacher mass outside its top k as one bucket, or renorm over the top k
    reverse_kl_estimator: str = "k3"  # reverse_kl: k1 | k3 (score-function gradient either way)


@dataclass
class RayConfig:
    address: str | None = None  # connect to an existing cluster; null = start a local one on 127.0.0.1
    num_cpus: int | None = None  # CPUs of the local cluster (null = all of this machine's)


# ---- PPO's critic and reward model; role placement (every algorithm and schedule) --------------------------------
@dataclass
class CriticModelConfig:
    path: str | None = None  # a causal-LM directory for the critic's body; null = the policy's model.path


@dataclass
class CriticConfig:
    model: CriticModelConfig = field(default_factory=CriticModelConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    cliprange_value: float = 0.5  # reward units: a value prediction may move at most this far from its old one
    ppo_epochs: int = 1  # passes over each batch
    ppo_micro_batch_size: int = 64  # samples per forward/backward; memory only
    loss_agg_mode: str = "token-mean"  # as actor.loss_agg_mode
    shared_prefix: bool = True  # as actor.shared_prefix, for the value passes
    use_dynamic_bsz: bool = False  # as actor.use_dynamic_bsz
    ppo_max_token_len_per_gpu: int = 16384  # as actor.ppo_max_token_len_per_gpu


@dataclass
class RewardModelConfig:
    enable: bool = False
    path: str | None = None  # a sequence-classification directory (e.g. from `asyncrl train-rm`)
    weight: float = 1.0  # reward = rule_weight * rule reward + weight * sigmoid(reward-model logit)
    rule_weight: float = 1.0  # weight of the rule reward added to the reward model's score
    micro_batch_size: int = 64  # samples per reward-model forward


@dataclass
class PoolConfig:
    cpus: float = 1.0  # CPUs reserved for the pool; every role on it gets this many torch threads


@dataclass
class PlacementConfig:
    """Training roles -> named pools. Empty = every role on the trainer's pool (asyncrl/workers/placement.py)."""

    pools: dict[str, PoolConfig] = field(default_factory=dict)
    roles: dict[str, str] = field(default_factory=dict)  # actor | critic | reward_model -> pool


@dataclass
class Config:
    data: DataConfig = field(default_factory=DataConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    actor: ActorConfig = field(default_factory=ActorConfig)
    algorithm: AlgorithmConfig = field(default_factory=AlgorithmConfig)
    reward: RewardConfig = field(default_factory=RewardConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    sync: SyncConfig = field(default_factory=SyncConfig)
    async_training: AsyncTrainingConfig = field(default_factory=AsyncTrainingConfig)
    teacher: TeacherConfig = field(default_factory=TeacherConfig)
    distill: DistillConfig = field(default_factory=DistillConfig)
    dpo: DpoConfig = field(default_factory=DpoConfig)
    ray: RayConfig = field(default_factory=RayConfig)
    critic: CriticConfig = field(default_factory=CriticConfig)
    reward_model: RewardModelConfig = field(default_factory=RewardModelConfig)
    placement: PlacementConfig = field(default_factory=PlacementConfig)
