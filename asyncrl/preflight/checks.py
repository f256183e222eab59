"""The parts ``asyncrl preflight`` checks (docs/gpu.md), one function each, every one on the run's own code path.
Each returns ``Check`` lines; none raises for a fault it finds."""

from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass

import torch

from asyncrl.algorithms import Algorithm
from asyncrl.calls import gather
from asyncrl.comm.transport import transport_of
from asyncrl.config import Config
from asyncrl.errors import one_line
from asyncrl.roles.clients import DataParallelRank, Roles, RolloutClient
from asyncrl.sizing.check import MemoryPlanError, check_plan, gpu_roles, local_device_bytes
from asyncrl.sizing.memory import GB, MemoryPlan, micro_batch_tokens, plan_memory
from asyncrl.sizing.shape import model_shape
from asyncrl.types import Prompt, Sample, SamplingParams
from asyncrl.weights.clients import SyncReceiver, SyncSender
from asyncrl.weights.fingerprint import WeightsFingerprint
from asyncrl.weights.group import rank_label
from asyncrl.weights.weight_sync import WeightSync

PROBE_MB = 64  # the most MiB one all-reduce / broadcast of the trainer group's check moves
DECODE_TOKENS = 16  # the most tokens of each engine's decode: short, it only shows the engine runs
MB = 1e6


@dataclass(frozen=True)
class Check:
    """One line of the report: the part checked (``memory plan``, ``decode rollout0``...), whether it passed, and
    the reason with its figures."""

    part: str
    ok: bool
    detail: str

    def line(self) -> str:
        return f"{'PASS' if self.ok else 'FAIL'}  {self.part}: {self.detail}"


def _rate(nbytes: float, seconds: float) -> str:
    return f"{nbytes / max(seconds, 1e-9) / GB:.2f} GB/s"


# ---- before any worker starts ----------------------------------------------------------------------------------------
def memory_plan(cfg: Config) -> tuple[Check, MemoryPlan | None]:
    """The run's memory plan (from the model's ``config.json`` alone) against the bytes one device of the run holds
    (``trainer.gpu_memory_gb``, else the GPU this process sees, else, a run on CPUs, this host's memory), with the
    check a run makes before its workers start (on every role where the run has no GPUs: they share the host)."""
    if cfg.trainer.gpu_memory_gb is not None:
        budget, source = int(cfg.trainer.gpu_memory_gb * 1e9), "trainer.gpu_memory_gb"
    elif (gpu := local_device_bytes()) is not None:
        budget, source = gpu, "this process's GPU"
    else:
        budget, source = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"), "host memory, no GPU seen"
    try:
        plan = plan_memory(cfg, model_shape(cfg.model.path), budget)
    except Exception as e:  # noqa: BLE001 - a model dir the plan cannot read is this line's failure
        return Check("memory plan", False, one_line(e)), None
    r = plan.rollout
    figures = f"trainer rank {plan.trainer.total / GB:.2f} GB" + (
        f", rollout rank {r.total / GB:.2f} GB" if r is not None else " (engine included: sync)"
    )
    where = f"of {budget / GB:.1f} GB ({source}); {plan.trainer.tokens} tokens a micro-batch"
    try:
        check_plan(plan, gpu_roles(cfg) or ("trainer", "rollout"))
    except MemoryPlanError as e:
        return Check(
            "memory plan", False, f"does not fit: {one_line(e).removeprefix('memory plan: ')} [{figures} {where}]"
        ), plan
    return Check("memory plan", True, f"fits: {figures} {where}"), plan


# ---- the started roles -----------------------------------------------------------------------------------------------
def placement(roles: Roles, timeout_s: float) -> list[Check]:
    """Where each worker runs (its node, its GPUs, its device): a worker Ray gave GPUs that computes on the CPU fails
    (its CUDA does not work there)."""
    out = []
    pools = {name: p.describe() for name, p in roles.placement.all_pools().items()}
    for w in roles.locations(timeout_s):
        gpus = ",".join(w.gpu_ids) or "none"
        detail = f"node {w.address} ({w.node_id[:12]}), device {w.device}, GPUs {gpus}, pid {w.pid}"
        ok = not (w.gpu_ids and not w.device.startswith("cuda"))
        out.append(Check(f"placement {w.name}", ok, detail if ok else f"{detail}: given GPUs but computes on the CPU"))
    out.append(Check("placement pools", True, "; ".join(f"{k}: {v}" for k, v in pools.items())))
    return out


def trainer_group(roles: Roles, timeout_s: float) -> Check:
    """An all-reduce and a broadcast on the trainer's data-parallel group, every rank at once; a rank that fails,
    does not answer within ``timeout_s``, or gets a wrong sum back is named."""
    ranks = roles.trainer.ranks
    if len(ranks) == 1:
        return Check("trainer group", True, "1 rank: no data-parallel group (nothing to reduce)")
    nbytes = PROBE_MB * 2**20
    calls = []
    for rank in map(DataParallelRank, ranks):
        try:
            calls.append((rank.name, rank.probe_data_parallel(nbytes, timeout_s)))
        except Exception as e:  # noqa: BLE001 - a rank that takes no call (dead, stopped) is this line's finding
            return Check("trainer group", False, f"{rank.name} takes no call: {one_line(e)}")
    results, errors, unfinished = gather(calls, timeout_s + 10.0)
    if errors or unfinished:
        parts = [f"{name}: {text}" for name, text in errors]
        parts += [f"{name}: no answer in {timeout_s:g} s" for name in unfinished]
        return Check("trainer group", False, f"{len(ranks)} ranks: " + " | ".join(parts))
    lone = [name for name, _ in calls if results[name] is None]
    if lone:
        return Check("trainer group", False, f"{', '.join(lone)} joined no data-parallel group")
    probes = [results[name] for name, _ in calls]  # every rank's, none None (checked above)
    wrong = [name for (name, _), p in zip(calls, probes) if not p.correct]
    p = probes[0]
    slowest_ar = max(q.all_reduce_s for q in probes)
    slowest_bc = max(q.broadcast_s for q in probes)
    detail = (
        f"{p.world_size} ranks over {p.backend}, {p.nbytes / MB:.0f} MB: all-reduce {slowest_ar:.3f} s "
        f"({_rate(p.nbytes, slowest_ar)}), broadcast {slowest_bc:.3f} s ({_rate(p.nbytes, slowest_bc)})"
    )
    if wrong:
        return Check("trainer group", False, f"{detail}; wrong values came back on {', '.join(wrong)}")
    return Check("trainer group", True, detail)


def weight_sync(cfg: Config, roles: Roles, _corrupt_bucket: int | None = None) -> list[Check]:
    """The run's sync group set up and one push of the trainer's weights into every engine, timed; then each engine's
    weights fingerprinted against the trainer's. ``_corrupt_bucket``: ``WeightSync.push``'s test hook."""
    receivers = roles.receivers
    if not receivers:
        return [Check("weight sync", True, "none: the trainer's own engine generates from the weights it trains")]
    ready = cfg.trainer.role_start_timeout_s
    try:
        backend = transport_of([h.location(ready) for h in [roles.trainer.handle, *receivers]])
        ws = WeightSync(roles.trainer.handle, receivers, cfg.weight_sync, ready, backend=backend)
        t0 = time.perf_counter()
        plan = ws.setup()
        t1 = time.perf_counter()
        stats = ws.push(0, _corrupt_bucket)
        t2 = time.perf_counter()
    except Exception as e:  # noqa: BLE001 - the sync's error names the rank and the parameter
        return [Check("weight sync", False, one_line(e))]
    verified = "every bucket's CRC checked" if cfg.weight_sync.verify else "weight_sync.verify off: no CRC"
    detail = (
        f"{len(receivers)} engine(s) over {backend}, {plan.bytes / MB:.1f} MB in {plan.buckets} bucket(s): set-up "
        f"{t1 - t0:.2f} s, push {t2 - t1:.2f} s ({_rate(plan.bytes, stats.seconds)} on the wire, "
        f"{stats.apply_seconds:.2f} s applying); {verified}"
    )
    return [Check("weight sync", True, detail), *fingerprint_lines(cfg, roles)]


def fingerprint_lines(cfg: Config, roles: Roles) -> list[Check]:
    """Each engine's weights against the trainer's, tensor by tensor (crc32), the trainer's cast to the engine's
    dtypes first."""
    timeout = cfg.weight_sync.timeout_s
    if cfg.rollout.quantization == "fp8":
        why = "not compared: an fp8 sync's engine holds the dequantized weights (the per-bucket CRC is the check)"
        return [Check("fingerprint", True, why)]
    out = []
    trainer_fps: dict[tuple, WeightsFingerprint] = {}
    for i, h in enumerate(roles.receivers):
        part = f"fingerprint {h.name} ({rank_label(i + 1)})"
        try:
            mine = SyncReceiver(h).weights_fingerprint().result(timeout=timeout)
            if not mine.held:
                out.append(Check(part, True, "not compared: the engine keeps its weights in its own process (vLLM)"))
                continue
            key = tuple(sorted(mine.dtypes.items()))
            if key not in trainer_fps:
                theirs = SyncSender(roles.trainer.handle).weights_fingerprint(mine.dtypes)
                trainer_fps[key] = theirs.result(timeout=timeout)
        except Exception as e:  # noqa: BLE001 - an engine that cannot say what it holds fails its line
            out.append(Check(part, False, one_line(e)))
            continue
        differ = trainer_fps[key].differing(mine)
        if differ:
            named = ", ".join(differ[:3]) + (f" and {len(differ) - 3} more" if len(differ) > 3 else "")
            why = f"{len(differ)} of {len(mine.crc)} tensors differ from the trainer's after the sync: {named}"
            out.append(Check(part, False, why))
        else:
            out.append(Check(part, True, f"{len(mine.crc)} tensors equal to the trainer's (crc32)"))
    return out


def decode(cfg: Config, roles: Roles, prompt: Prompt) -> list[Check]:
    """One short decode of ``prompt`` on every engine at once, with the run's sampling: tokens, seconds, and the
    weight version every token records."""
    r = cfg.rollout
    tokens = min(DECODE_TOKENS, r.response_length)
    params = SamplingParams(n=1, temperature=r.temperature, top_p=r.top_p, top_k=max(r.top_k, 0), max_new_tokens=tokens)
    out = []
    calls = []
    # every engine that generates in the run: the rollout pool, the Rollouter and its ranks, or the trainer's
    engines = [RolloutClient(h) for h in roles.receivers] if roles.rollouter is not None else roles.rollouts
    for e in engines:
        try:
            calls.append((e.name, e.generate([prompt], params, cfg.trainer.seed, 0)))
        except Exception as err:  # noqa: BLE001 - a worker that takes no call fails its line
            out.append(Check(f"decode {e.name}", False, one_line(err)))
    results, errors, unfinished = gather(calls, r.generate_timeout_s)
    for name, text in errors:
        out.append(Check(f"decode {name}", False, text))
    for name in unfinished:
        out.append(Check(f"decode {name}", False, f"no answer in rollout.generate_timeout_s={r.generate_timeout_s:g}"))
    for name, _ in calls:
        if name not in results:
            continue
        g = results[name]
        s = g.samples[0] if g.samples else None
        if s is None or not s.response_ids:
            out.append(Check(f"decode {name}", False, "no tokens came back"))
            continue
        finite = all(math.isfinite(x) for x in s.logprobs)
        detail = (
            f"{len(s.response_ids)} tokens in {g.seconds:.2f} s ({len(s.response_ids) / max(g.seconds, 1e-9):.0f} "
            f"tok/s), weight version {sorted(set(s.versions))}, reward {s.reward:g}"
        )
        out.append(Check(f"decode {name}", finite, detail if finite else f"{detail}: a log-prob is not finite"))
    return out


# ---- one micro-batch -------------------------------------------------------------------------------------------------
def planned_samples(cfg: Config, vocab: int, seed: int, ranks: int = 1) -> list[Sample]:
    """Samples of full length (``data.max_prompt_length`` + ``rollout.response_length`` tokens each, no prompt
    shared) that fill one micro-batch of the plan's token budget on each of ``ranks`` data-parallel ranks, in groups
    of two whose rewards differ (so every row has an advantage and takes part in the update)."""
    p_len, r_len = cfg.data.max_prompt_length, cfg.rollout.response_length
    rows = micro_batch_tokens(cfg) // (p_len + r_len)  # the plan's budget (ppo_micro_batch_size rows without packing)
    rows = max(2, rows - rows % 2) * ranks
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, vocab, (rows, p_len + r_len), generator=g).tolist()
    out = []
    for i, row in enumerate(ids):
        prompt = Prompt(index=i // 2, prompt_ids=row[:p_len], data_source="preflight", ground_truth="")
        s = Sample(prompt, row[p_len:], [-1.0] * r_len, [0] * r_len, reward=float(i % 2), row=i % 2)
        out.append(s)
    return out


def micro_batch(cfg: Config, algorithm: Algorithm, plan: MemoryPlan | None, vocab: int) -> Check:
    """The algorithm's own preparation and update on one micro-batch at the plan's token budget (one optimizer
    step), with the trainer's peak memory against the plan: on a GPU the tensors' peak (what the plan counts, less
    its CUDA runtime term) must not exceed the plan; on a CPU the process's peak resident memory is shown beside it
    (it also holds the interpreter and its libraries, which the plan does not count)."""
    ranks = len(algorithm.roles.trainer.ranks)
    samples = planned_samples(cfg, vocab, cfg.trainer.seed, ranks)
    tokens = sum(s.num_tokens for s in samples)
    t0 = time.perf_counter()
    try:
        prepared = algorithm.prepare(samples, 1)()
        trained = algorithm.train(prepared, 1)
    except Exception as e:  # noqa: BLE001 - a step that fails (out of memory, a rank gone) is this line's finding
        return Check("trainer micro-batch", False, f"{len(samples)} rows, {tokens} tokens: {one_line(e)}")
    seconds = time.perf_counter() - t0
    m = trained.metrics
    planned = plan.trainer.total if plan is not None else None
    head = f"{len(samples)} rows x {samples[0].num_tokens} = {tokens} tokens over {ranks} rank(s) in {seconds:.2f} s"
    bad = [k for k, v in m.items() if isinstance(v, float) and not math.isfinite(v) and not k.startswith("rollout")]
    if m.get("actor/nonfinite_skipped_steps", 0.0) > 0 or bad:
        return Check("trainer micro-batch", False, f"{head}: a loss or gradient is not finite ({', '.join(bad)})")
    if "perf/trainer_peak_cuda_gb" in m:
        peak = m["perf/trainer_peak_cuda_gb"] * 2**30
        tensors = planned - plan.trainer.runtime if plan is not None else None
        detail = f"{head}; peak {peak / GB:.2f} GB of tensors on the GPU"
        if tensors is None:
            return Check("trainer micro-batch", True, f"{detail} (no plan to compare)")
        ok = peak <= tensors
        return Check("trainer micro-batch", ok, f"{detail}, plan {tensors / GB:.2f} GB" + ("" if ok else ": OVER"))
    rss = m.get("perf/trainer_peak_rss_gb", 0.0) * 2**30
    vs = ""
    if plan is not None:
        vs = f", plan {planned / GB:.2f} GB a GPU rank ({plan.trainer.runtime / GB:.2f} GB of it CUDA's runtime)"
    return Check("trainer micro-batch", True, f"{head}; peak resident {rss / GB:.2f} GB (CPU process){vs}")


def skipped(part: str, why: str) -> Check:
    return Check(part, False, f"not run: {why}")


def failures(checks: list[Check]) -> list[Check]:
    return [c for c in checks if not c.ok]
