"""The config sections of the rollout side: ``rollout`` (with its ``trace``, ``skip``, ``agent`` and ``multi_turn``)
and ``reward`` (with its ``genrm``). Each checks its own fields (``asyncrl.config.rules``)."""

from __future__ import annotations

from dataclasses import dataclass, field

from asyncrl.config.errors import check
from asyncrl.config.rules import NON_NEGATIVE, POSITIVE, POSITIVE_INT, Checked, at_least, one_of, or_null, rule

ENGINES = ("builtin", "vllm")
DTYPES = ("float32", "bfloat16", "float16")
QUANTIZATIONS = (None, "fp8")
SKIP_ACTIONS = ("cache", "repeat")
TRUNCATE_SIDES = ("left", "middle", "right")  # what of a long tool output is kept (rollout.multi_turn)
TOOL_CALL_FORMATS = ("hermes",)


@dataclass
class TraceConfig(Checked):
    """``rollout.trace``: a few samples of every step in the run directory (``asyncrl trace RUN_DIR --step N``)."""

    enable: bool = False
    max_samples_per_step: int = 8  # verl's max_samples_per_step_per_worker, per step of the trainer here
    token2text: bool = False  # also each response token's own text

    RULES = {"max_samples_per_step": POSITIVE_INT}


@dataclass
class SkipConfig(Checked):
    """``rollout.skip``: dump each step's generated batch; a later run with the same generation setup reuses it."""

    enable: bool = False
    dump_dir: str = "runs/rollout_dump"
    action: str = "cache"  # cache (reuse a step's own dump, else generate and dump) | repeat (else the latest dump)

    RULES = {"action": one_of(SKIP_ACTIONS)}


@dataclass
class AgentConfig(Checked):
    """``rollout.agent``: which agent loop rolls out a row whose ``agent_name`` column is empty or absent (checked
    against the registered loops when a run starts: ``asyncrl.rollout.agent.loop.check_agent_loop``)."""

    default_agent_loop: str = "single_turn_agent"  # single_turn_agent | tool_agent | path/to/file.py:ClassName


@dataclass
class MultiTurnConfig(Checked):
    """``rollout.multi_turn``: the tool agent's limits and tools (verl's names). The whole response, tool outputs
    included, stays within ``rollout.response_length`` tokens."""

    max_assistant_turns: int | None = None  # null: bounded only by rollout.response_length
    max_tool_response_length: int = 256  # characters of one tool output kept (cut per tool_response_truncate_side)
    tool_response_truncate_side: str = "middle"  # left (keep the start) | middle (both ends) | right (the end)
    tools: list[str] = field(default_factory=list)  # calc | python | package.module:ClassName (a Tool subclass)
    tool_timeout_s: float = 10.0  # wall-clock deadline of one tool call; past it the model gets an error message
    max_concurrent_turns: int = 64  # conversations whose tool calls run at once, off the decode
    format: str = "hermes"  # tool calls as <tool_call>{"name": ..., "arguments": {...}}</tool_call>

    RULES = {
        "max_assistant_turns": or_null(POSITIVE_INT),
        "tool_response_truncate_side": one_of(TRUNCATE_SIDES),
        "format": one_of(TOOL_CALL_FORMATS),
        "tool_timeout_s": POSITIVE,
        "max_concurrent_turns": POSITIVE_INT,
    }


# How the rollout's device-dependent nulls resolve: one rule each, read by the engines where they start and by the
# memory plan (asyncrl.sizing), which resolves them as on a GPU.
GPU_SHARE = 0.8  # a GPU of its own: verl's recipes give vLLM 0.6-0.8 of a rollout-only GPU
# a GPU shared with the trainer (sync's colocated engine, which never sleeps): docs/config.md, gpu_memory_utilization
COLOCATED_SHARE = 0.4


def engine_dtype(rollout_dtype: str | None, model_dtype: str, on_gpu: bool) -> str:
    """``rollout.dtype`` resolved: null means bfloat16 on a GPU (verl's rollout dtype; the trainer keeps
    ``model.dtype``) and ``model.dtype`` on the CPU (where bfloat16 matmuls are slower and the tests compare
    log-probs with the trainer's)."""
    if rollout_dtype is not None:
        return rollout_dtype
    return "bfloat16" if on_gpu else model_dtype


def vllm_gpu_share(gpu_memory_utilization: float | None, colocated: bool) -> float:
    """``rollout.gpu_memory_utilization`` on a GPU: the set value, else GPU_SHARE on a GPU of its own and
    COLOCATED_SHARE on one the trainer also uses."""
    if gpu_memory_utilization is not None:
        return gpu_memory_utilization
    return COLOCATED_SHARE if colocated else GPU_SHARE


@dataclass
class ValKwargsConfig(Checked):
    """``rollout.val_kwargs`` (verl's): how held-out prompts are sampled for ``val/accuracy``."""

    temperature: float = 0.0  # with do_sample
    top_p: float = 1.0  # with do_sample
    top_k: int = 0  # with do_sample; 0 or -1 = off
    do_sample: bool = False  # false: greedy (temperature, top_p and top_k unused)
    n: int = 1  # responses per held-out prompt; val/accuracy is their mean

    RULES = {  # training rollouts' sampling keys too
        "n": POSITIVE_INT,
        "temperature": NON_NEGATIVE,
        "top_p": rule(lambda v: 0 < v <= 1, "in (0, 1]"),
        "top_k": at_least(-1, " (0 or -1 = off)"),
    }


@dataclass
class RolloutConfig(Checked):
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
    # the engine's weights and activations: float32 | bfloat16 | float16; null = bfloat16 where the engine runs on a
    # GPU, model.dtype on the CPU (the trainer keeps model.dtype either way)
    dtype: str | None = None
    # vllm: no CUDA graphs / compilation; null = eager on the CPU, CUDA graphs on GPUs
    enforce_eager: bool | None = None
    # vllm, as vLLM defines it: the share of the GPU's memory the engine may take for weights, activations and KV
    # cache; null = 0.8 on a GPU of its own, 0.4 on one it shares with the trainer (sync); on the CPU: the KV
    # cache's share of the machine's RAM (null = 0.05)
    gpu_memory_utilization: float | None = None
    tensor_model_parallel_size: int = 1  # vllm: devices per engine (its tensor-parallel workers); builtin: 1
    enable_chunked_prefill: bool = True  # vllm on GPUs: long prefills split across steps (ignored on the CPU)
    # vllm: tokens scheduled per engine step; null = max_num_seqs x max_model_len on CPU (vLLM 0.32 there must not
    # split the prefill of a seeded request), vLLM's own default on a GPU
    max_num_batched_tokens: int | None = None
    val_kwargs: ValKwargsConfig = field(default_factory=ValKwargsConfig)  # held-out evaluation's sampling
    num_workers: int = 1  # rollout workers (engines) in the pool (with GPUs: nnodes x n_gpus_per_node / TP)
    nnodes: int = 1  # nodes the rollout workers spread over, num_workers / nnodes on each (verl's rollout.nnodes)
    n_gpus_per_node: int = 0  # GPUs per rollout node, TP per worker (verl's rollout.n_gpus_per_node); 0: CPU
    cpus_per_worker: float = 1.0  # CPUs per rollout worker; its torch threads = this, rounded down
    generate_timeout_s: float = 1800.0  # a rollout worker's generate call past this is hung: replaced (Ray, a pool)

    RULES = {
        "engine": one_of(ENGINES),
        "quantization": one_of(QUANTIZATIONS),
        **ValKwargsConfig.RULES,
        "response_length": POSITIVE_INT,
        "max_batch_size": POSITIVE_INT,
        "max_num_seqs": POSITIVE_INT,
        "max_model_len": or_null(at_least(2)),
        "dtype": or_null(one_of(DTYPES)),
        "gpu_memory_utilization": or_null(rule(lambda v: 0 < v < 1, "in (0, 1)")),
        "tensor_model_parallel_size": POSITIVE_INT,
        "max_num_batched_tokens": or_null(POSITIVE_INT),
        "num_workers": POSITIVE_INT,
        "nnodes": POSITIVE_INT,
        "n_gpus_per_node": NON_NEGATIVE,
        "cpus_per_worker": POSITIVE,
        "generate_timeout_s": POSITIVE,
    }

    def model_len(self, max_prompt_length: int) -> int:
        """Prompt + response tokens the engine must hold: ``max_model_len``, else prompt + response length."""
        return self.max_model_len or max_prompt_length + self.response_length

    def check(self, key: str) -> None:
        super().check(key)
        tp = self.tensor_model_parallel_size
        if tp > 1:
            check(
                self.engine == "vllm", f"{key}.tensor_model_parallel_size", tp, "1 with the builtin engine (vllm: any)"
            )
            if self.n_gpus_per_node:
                allowed = (
                    f"a divisor of {key}.n_gpus_per_node ({self.n_gpus_per_node}): an engine's devices on one node"
                )
                check(self.n_gpus_per_node % tp == 0, f"{key}.tensor_model_parallel_size", tp, allowed)
        if self.agent.default_agent_loop == "tool_agent":
            mt = self.multi_turn
            check(bool(mt.tools), f"{key}.multi_turn.tools", mt.tools, "a non-empty list with the tool agent")


def _url(v: str | None) -> bool:
    return v is None or str(v).startswith(("http://", "https://"))


@dataclass
class GenRMConfig(Checked):
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

    RULES = {"url": rule(_url, "an http(s):// URL"), "top_logprobs": POSITIVE_INT}

    def check(self, key: str) -> None:
        super().check(key)
        ok = self.positive.strip() not in ("", self.negative.strip())
        check(ok, f"{key}.positive", self.positive, "not '' or negative")


@dataclass
class RewardConfig(Checked):
    custom_function: str | None = None  # "path/to/file.py:fn" with verl's signature; null = built-in registry
    binarize: bool = False  # reward 1.0 only for a full score (reasoning-gym scorers give partial credit), else 0.0
    max_concurrency: int = 256  # samples scored at once (each as its row ends); more rows waiting hold admission
    timeout_s: float = 60.0  # per sample; a slower reward fails that sample
    remote_url: str | None = None  # a reward service (POST verl's fields as JSON, reply a score); implies the loop
    remote_batch_size: int = 1  # samples a request to remote_url at most (>1: JSON arrays each way; docs/rewards.md)
    remote_max_retries: int = 3  # also the generative reward model's
    remote_backoff_s: float = 0.5  # first retry's wait, seconds; doubles each retry
    genrm: GenRMConfig = field(default_factory=GenRMConfig)

    RULES = {
        "max_concurrency": POSITIVE_INT,
        "remote_batch_size": POSITIVE_INT,
        "timeout_s": POSITIVE,
        "remote_max_retries": NON_NEGATIVE,
        "remote_backoff_s": NON_NEGATIVE,
        "remote_url": rule(_url, "an http(s):// URL"),
    }

    def check(self, key: str) -> None:
        """One reward source: a custom function, a reward service or a judge model."""
        super().check(key)
        one = "null when reward.custom_function is set (one reward source)"
        check(self.remote_url is None or not self.custom_function, f"{key}.remote_url", self.remote_url, one)
        for other, value in [(f"{key}.remote_url", self.remote_url), (f"{key}.custom_function", self.custom_function)]:
            g = self.genrm.url
            check(g is None or not value, f"{key}.genrm.url", g, f"null when {other} is set (one reward source)")
