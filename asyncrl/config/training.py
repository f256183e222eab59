"""The config sections of the learning side: the optimiser, the actor, the algorithm and its corrections, and what
only one algorithm or schedule reads (``async_training``, ``teacher``, ``distill``, ``dpo``, ``critic``,
``reward_model``). Each checks its own fields (``asyncrl.config.rules``); the lists of choices are the losses' own."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from asyncrl.config.errors import check
from asyncrl.config.rules import (
    NON_NEGATIVE,
    POSITIVE,
    POSITIVE_INT,
    Checked,
    at_least,
    between,
    one_of,
    or_null,
    rule,
)
from asyncrl.losses.correction import IS_LEVELS
from asyncrl.losses.distill_loss import REVERSE_KL_ESTIMATORS, TAIL_MODES
from asyncrl.losses.dpo import DPO_LOSSES
from asyncrl.losses.kl import KL_KINDS
from asyncrl.losses.tokens import LOSS_AGG_MODES

if TYPE_CHECKING:
    import argparse

DISTILL_LOSSES = ("forward_kl", "jsd", "reverse_kl")
# fully_async's admission: exact (every group within the bound) | budget (verl's: the window's budget alone)
STALENESS_RULES = ("exact", "budget")
DROP_POLICIES = ("backpressure", "oldest")  # a full fully_async queue: the producer waits | the oldest is dropped
TOKENIZER_CHECKS = ("auto", "fingerprint", "probe")
REWARD_MANAGERS = ("naive", "dapo")  # verl's names; its prime and batch managers are not built
# the keys the actor and the critic both batch their passes by
BATCHING_RULES = {
    "ppo_epochs": POSITIVE_INT,
    "ppo_micro_batch_size": POSITIVE_INT,
    "ppo_max_token_len_per_gpu": POSITIVE_INT,
    "loss_agg_mode": one_of(LOSS_AGG_MODES),
}


@dataclass
class OptimConfig(Checked):
    lr: float = 1e-5  # peak learning rate (after lr_warmup_steps)
    weight_decay: float = 0.0  # AdamW decoupled weight decay
    betas: list[float] = field(default_factory=lambda: [0.9, 0.999])  # AdamW (beta1, beta2)
    lr_warmup_steps: int = 0  # linear warm-up, in optimizer steps
    grad_clip: float = 1.0  # max global grad norm (<= 0 disables)

    RULES = {
        "lr": POSITIVE,
        "weight_decay": NON_NEGATIVE,
        "betas": rule(lambda v: len(v) == 2 and all(0 <= b < 1 for b in v), "two numbers in [0, 1)"),
        "lr_warmup_steps": NON_NEGATIVE,
    }


@dataclass
class FsdpConfig(Checked):
    """``actor.fsdp_config`` (verl's keys): where FSDP2 keeps the actor's state (``trainer.strategy=fsdp2``)."""

    param_offload: bool = False  # the fp32 parameter shards (the masters) live on the host between passes
    optimizer_offload: bool = False  # AdamW's state shards live on the host; the step runs there
    fsdp_size: int = -1  # ranks one shard group spans: -1 = every trainer rank (hybrid sharding is not built)

    RULES = {
        "fsdp_size": rule(lambda v: v == -1 or v >= 1, "-1 (every trainer rank) or a rank count"),
    }


@dataclass
class RefFsdpConfig(Checked):
    param_offload: bool = False  # the reference model's shards live on the host, moved in for its pass (verl's)


@dataclass
class RefConfig(Checked):
    """``ref`` (verl's ``actor_rollout_ref.ref``): the frozen reference policy a KL loss or online DPO reads. Read only
    when there is one (``actor.use_kl_loss`` or ``algorithm.name=dpo``)."""

    fsdp_config: RefFsdpConfig = field(default_factory=RefFsdpConfig)
    # tokens per reference log-prob pass with actor.use_dynamic_bsz; null = actor.ppo_max_token_len_per_gpu
    log_prob_max_token_len_per_gpu: int | None = None
    ulysses_sequence_parallel_size: int = 1  # sequence parallelism is not built: 1 only

    RULES = {
        "log_prob_max_token_len_per_gpu": or_null(POSITIVE_INT),
        "ulysses_sequence_parallel_size": rule(lambda v: v == 1, "1 (Ulysses sequence parallelism is not built)"),
    }


@dataclass
class ActorConfig(Checked):
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
    use_dynamic_bsz: bool = True  # micro-batches by token budget (packed rows no wider) instead of by sample count
    ppo_max_token_len_per_gpu: int = 16384  # use_dynamic_bsz: real tokens per forward/backward (and log-prob pass)
    # recompute each decoder layer's activations in the backward (verl's model.enable_gradient_checkpointing); null =
    # on where the trainer runs on a GPU, off on the CPU
    gradient_checkpointing: bool | None = None
    fsdp_config: FsdpConfig = field(default_factory=FsdpConfig)
    ulysses_sequence_parallel_size: int = 1  # sequence parallelism is not built: 1 only

    RULES = {
        "ppo_mini_batch_size": POSITIVE_INT,
        **BATCHING_RULES,
        "clip_ratio": rule(lambda v: 0 <= v < 1, "in [0, 1)"),
        "clip_ratio_low": or_null(NON_NEGATIVE),
        "clip_ratio_high": or_null(NON_NEGATIVE),
        "clip_ratio_c": or_null(rule(lambda v: v > 1, "> 1")),
        "kl_loss_type": one_of(KL_KINDS),
        "kl_loss_coef": NON_NEGATIVE,
        "ulysses_sequence_parallel_size": rule(lambda v: v == 1, "1 (Ulysses sequence parallelism is not built)"),
    }


@dataclass
class RolloutCorrectionConfig(Checked):
    rollout_is: str | None = None  # null (off; token under rollout.quantization=fp8) | disabled | token | sequence
    rollout_is_threshold: float = 2.0  # importance weights are truncated at this

    RULES = {
        "rollout_is": one_of((None, "disabled", *IS_LEVELS)),
        "rollout_is_threshold": rule(lambda v: v >= 1, ">= 1"),
    }


@dataclass
class FilterGroupsConfig(Checked):
    """``algorithm.filter_groups``: DAPO's dynamic sampling, verl's keys (docs/rewards.md). A group whose ``metric``
    is equal across its samples has all-zero advantages: it is dropped (``asyncrl.rewards.filtering``) and more
    prompts are generated (``asyncrl.run.generation``)."""

    enable: bool = False
    # what must differ within a group: acc | score | seq_reward | seq_final_reward | any key the reward function
    # returns (asyncrl.rewards.filtering.metric_value; each in docs/config.md)
    metric: str = "acc"
    max_num_gen_batches: int = 0  # generation batches per step before the run stops with an error (0 = no limit)

    RULES = {
        "metric": rule(lambda v: bool(str(v).strip()), "a metric name: acc, score, seq_reward, seq_final_reward, ..."),
        "max_num_gen_batches": at_least(0, " (0 = no limit)"),
    }


@dataclass
class AlgorithmConfig(Checked):
    """The keys every algorithm reads; an algorithm's own are the fields of its subclass of this one
    (``Algorithm.section``: ``asyncrl.config.algorithm_section``)."""

    name: str = "grpo"  # grpo | ppo (critic + GAE) | distill (on-policy distillation from a teacher) | dpo (online)
    adv_estimator: str | None = None  # verl's name; null = the algorithm's own (grpo: grpo, ppo: gae)
    rollout_correction: RolloutCorrectionConfig = field(default_factory=RolloutCorrectionConfig)
    filter_groups: FilterGroupsConfig = field(default_factory=FilterGroupsConfig)


@dataclass
class AsyncTrainingConfig(Checked):
    """``fully_async`` only (verl's ``async_training`` section); the bound: schedules/fully_async/staleness.py."""

    staleness_threshold: float = 0.0  # extra groups in flight, as a fraction of one sync window
    # exact: no group trained staler than ceil(staleness_threshold) versions (earliest deadline first) | budget:
    # verl's, in the order groups finish (a slow group may end up staler: fully_async/max_seen_staleness)
    staleness_rule: str = "exact"
    trigger_parameter_sync_step: int = 1  # trainer steps per weight sync (= per version)
    require_batches: int = 1  # ppo_mini_batch_size groups per trainer step (one optimizer step each)
    drop_policy: str = "backpressure"  # queue full: backpressure (the rollouter waits) | oldest (drop, counted)
    max_queue_size: int | None = None  # groups; null = the staleness budget (never fills while synced)
    partial_rollout: bool = True  # at a sync, interrupt in-flight generations and resume them with the new weights
    compute_prox_log_prob: bool = False  # decoupled PPO: old = the weights at the start of the sync window
    max_inflight_groups: int | None = None  # groups in flight; null = one per slot of the rollout ranks
    get_batch_timeout_s: float = 600.0  # the trainer's longest wait for one step's groups before the run fails
    pause_timeout_s: float = 600.0  # the longest wait for the Rollouter to park for a weight sync

    RULES = {
        "staleness_threshold": NON_NEGATIVE,
        "staleness_rule": one_of(STALENESS_RULES),
        "trigger_parameter_sync_step": POSITIVE_INT,
        "require_batches": POSITIVE_INT,
        "drop_policy": one_of(DROP_POLICIES),
        "get_batch_timeout_s": POSITIVE,
        "pause_timeout_s": POSITIVE,
        "max_inflight_groups": or_null(POSITIVE_INT),
    }


@dataclass
class TeacherConfig(Checked):
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

    RULES = {
        "top_k": POSITIVE_INT,
        "max_in_flight": POSITIVE_INT,
        "timeout_s": POSITIVE,
        "max_retries": NON_NEGATIVE,
        "backoff_s": NON_NEGATIVE,
        "server_max_batch": POSITIVE_INT,
        "server_threads": POSITIVE_INT,
        "startup_timeout_s": POSITIVE,
        "max_restarts": NON_NEGATIVE,
        "check_tokenizer": one_of(TOKENIZER_CHECKS),
    }


def add_serve_teacher_arguments(p: argparse.ArgumentParser) -> None:
    """The ``asyncrl serve-teacher`` flags, declared here so that the command line has them without importing the
    server and its model stack (``asyncrl.teacher.server`` reads them)."""
    p.add_argument("--model", required=True, help="local Hugging Face causal-LM directory")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (no authentication: keep it loopback)")
    p.add_argument("--port", type=int, default=8000, help="0 picks a free port")
    p.add_argument(
        "--max-batch",
        type=int,
        default=TeacherConfig.server_max_batch,
        help="sequences per forward pass (default: teacher.server_max_batch's)",
    )
    p.add_argument("--max-wait-ms", type=float, default=5.0, help="how long a batch waits for more sequences")
    p.add_argument("--served-model-name", default=None, help="model id in replies (default: the --model path)")
    p.add_argument("--dtype", default="float32", help="float32 | bfloat16 | float16")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")


@dataclass
class DpoConfig(Checked):
    """``dpo`` only (online DPO): pairs from each prompt's samples ranked by reward, fitted against a reference."""

    beta: float = 0.1  # TRL/verl's beta: the strength of the implicit KL to the reference
    loss_type: str = "sigmoid"  # sigmoid (DPO) | ipo (on per-token mean log-ratios, as TRL's ipo)
    ref_update_freq: int = 0  # steps between copies of the actor into the reference (0: frozen for the run)

    RULES = {
        "beta": POSITIVE,
        "loss_type": one_of(DPO_LOSSES),
        "ref_update_freq": rule(lambda v: v >= 0, ">= 0 (0: the reference stays frozen)"),
    }


@dataclass
class DistillConfig(Checked):
    """``distill`` only: the loss between teacher p and student q on the student's responses (GKD)."""

    loss: str = "forward_kl"  # forward_kl (top-k KL(p||q)) | jsd (generalised JSD with beta) | reverse_kl (sampled)
    beta: float = 0.5  # jsd: weight of the teacher side (0 = forward KL, 1 = reverse KL)
    lmbda: float = 1.0  # fraction of steps trained on student-generated responses; the rest on the dataset's answers
    tail: str = "bucket"  # top-k losses: the teacher mass outside its top k as one bucket, or renorm over the top k
    reverse_kl_estimator: str = "k3"  # reverse_kl: k1 | k3 (score-function gradient either way)

    RULES = {
        "loss": one_of(DISTILL_LOSSES),
        "beta": between(0, 1),
        "lmbda": between(0, 1),
        "tail": one_of(TAIL_MODES),
        "reverse_kl_estimator": one_of(REVERSE_KL_ESTIMATORS),
    }


# ---- PPO's critic and reward model -------------------------------------------------------------------------------
@dataclass
class CriticModelConfig(Checked):
    path: str | None = None  # a causal-LM directory for the critic's body; null = the policy's model.path


@dataclass
class CriticConfig(Checked):
    model: CriticModelConfig = field(default_factory=CriticModelConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    cliprange_value: float = 0.5  # reward units: a value prediction may move at most this far from its old one
    ppo_epochs: int = 1  # passes over each batch
    ppo_micro_batch_size: int = 64  # samples per forward/backward; memory only
    loss_agg_mode: str = "token-mean"  # as actor.loss_agg_mode
    shared_prefix: bool = True  # as actor.shared_prefix, for the value passes
    use_dynamic_bsz: bool = False  # as actor.use_dynamic_bsz
    ppo_max_token_len_per_gpu: int = 16384  # as actor.ppo_max_token_len_per_gpu

    RULES = {"cliprange_value": NON_NEGATIVE, **BATCHING_RULES}


@dataclass
class OverlongBufferConfig(Checked):
    """``reward_model.reward_kwargs.overlong_buffer_cfg`` (verl's DAPO reward manager): a response that runs into the
    last ``len`` tokens before ``max_resp_len`` loses reward linearly, down to ``-penalty_factor`` at ``max_resp_len``
    (``asyncrl.rewards.overlong``)."""

    enable: bool = False
    len: int = 0  # tokens: the buffer before max_resp_len where the penalty grows (>= 1 when enabled)
    penalty_factor: float = 0.0  # reward units: the penalty at L = max_resp_len
    log: bool = False  # also record it per sample: reward_extra overlong_reward (and overlong: 1.0 when < 0)

    RULES = {"len": NON_NEGATIVE, "penalty_factor": NON_NEGATIVE}

    def check(self, key: str) -> None:
        super().check(key)
        check(not self.enable or self.len >= 1, f"{key}.len", self.len, ">= 1 when overlong_buffer_cfg.enable")


@dataclass
class RewardKwargsConfig(Checked):
    """``reward_model.reward_kwargs``: the reward manager's arguments, as verl passes them (only the DAPO manager's
    exist here)."""

    overlong_buffer_cfg: OverlongBufferConfig = field(default_factory=OverlongBufferConfig)
    max_resp_len: int | None = None  # tokens; null = rollout.response_length (verl's recipes pass max_response_length)

    RULES = {"max_resp_len": or_null(POSITIVE_INT)}

    def max_resp_len_for(self, response_length: int) -> int:
        """Tokens the overlong buffer ends at: ``max_resp_len``, else the run's ``rollout.response_length``."""
        return self.max_resp_len or response_length


@dataclass
class RewardModelConfig(Checked):
    """``reward_model``: PPO's reward model (``enable`` .. ``micro_batch_size``, read only by ppo) and, as in verl, the
    reward manager that turns every algorithm's rule scores into rewards (``reward_manager``, ``reward_kwargs``)."""

    enable: bool = False
    path: str | None = None  # a sequence-classification directory (e.g. from `asyncrl train-rm`)
    weight: float = 1.0  # reward = rule_weight * rule reward + weight * sigmoid(reward-model logit)
    rule_weight: float = 1.0  # weight of the rule reward added to the reward model's score
    micro_batch_size: int = 64  # samples per reward-model forward
    reward_manager: str = "naive"  # naive (the rule score is the reward) | dapo (+ overlong_buffer_cfg's penalty)
    reward_kwargs: RewardKwargsConfig = field(default_factory=RewardKwargsConfig)

    RULES = {"micro_batch_size": POSITIVE_INT, "reward_manager": one_of(REWARD_MANAGERS)}

    def check(self, key: str) -> None:
        super().check(key)
        check(
            not self.enable or bool(self.path), f"{key}.path", self.path, "a model directory when reward_model.enable"
        )
        enabled = self.reward_kwargs.overlong_buffer_cfg.enable
        check(
            not enabled or self.reward_manager == "dapo",
            f"{key}.reward_manager",
            self.reward_manager,
            f"dapo when {key}.reward_kwargs.overlong_buffer_cfg.enable is true (only the DAPO manager shapes rewards)",
        )

    @property
    def reward_model_part(self) -> tuple:
        """The fields of the reward *model* (ppo only), apart from the reward manager every algorithm reads."""
        return (self.enable, self.path, self.weight, self.rule_weight, self.micro_batch_size)
